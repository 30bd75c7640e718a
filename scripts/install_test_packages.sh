#!/usr/bin/env bash
# Debian packages the test suite uses beyond Python, installed only where missing (as root,
# as CI runs), all from the distribution itself (Debian 12: systemd 252):
#   fuse3                the SMB-like share of tests/test_storage.py
#   chromium             the status page test of tests/test_http.py (a real headless browser)
#   acl                  getfacl: the inbox's default ACLs in tests/test_systemd.py
#   poppler-utils        pdftotext and pdftoppm: what a searchable PDF shows other readers
#   ghostscript          PDF/A-2b for archival searchable PDFs that pikepdf alone cannot make
#   systemd              systemd-analyze (verify, security), systemd-sysusers and -tmpfiles
#                        for tests/test_systemd.py; the unit needs 249 or newer
#   systemd-container    systemd-nspawn, which boots a real systemd for tests/test_systemd_boot.py
#   debootstrap          the Debian root file systems that container boots
#   qpdf                 qpdf --check: every output PDF opens cleanly in another reader
#   curl                 the README's upload example, as tests/test_uploads.py runs it
#   libtcmalloc-minimal4 tcmalloc, which vLLM's CPU worker wants preloaded (0.18 refuses to
#                        start without it; tests/tiny_model.py, cpu_preload)
# Never libnss-mymachines (a recommendation of systemd-container): it rewrites the host's
# name-service configuration.
set -euo pipefail

installed() {
  dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"
}

missing=()
for package in fuse3 chromium acl poppler-utils ghostscript qpdf systemd systemd-container \
    debootstrap curl libtcmalloc-minimal4; do
  installed "$package" || missing+=("$package")
done

if [ ${#missing[@]} -gt 0 ]; then
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
