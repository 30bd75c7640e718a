#!/usr/bin/env bash
# Debian packages the test suite uses beyond Python, installed only where missing (as root,
# as CI runs):
#   fuse3              the SMB-like share of tests/test_storage.py
#   chromium           the status page test of tests/test_http.py (a real headless browser)
#   acl                getfacl: the inbox's default ACLs in tests/test_systemd.py
#   poppler-utils      pdftotext and pdftoppm: what a searchable PDF shows other readers
#   ghostscript        PDF/A-2b for archival searchable PDFs that pikepdf alone cannot make
#   qpdf               qpdf --check: every output PDF opens cleanly in another reader
#   systemd            253 or newer, for `systemd-analyze verify` of the unit's Type=notify-reload
#                      (Debian 12 ships 252; its backports have 254)
#   systemd-container  systemd-nspawn, which boots a real systemd for tests/test_systemd_boot.py
#   debootstrap        the Debian root file system that container boots
#   curl               the README's upload example, as tests/test_uploads.py runs it
# systemd-container must match the installed systemd, so where systemd comes from the
# backports it does too (and debootstrap with it). Never libnss-mymachines (a recommendation
# of systemd-container): it rewrites the host's name-service configuration.
set -euo pipefail

installed() {
  dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"
}

codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
systemd_version=$(systemd-analyze --version 2>/dev/null | awk 'NR == 1 {print $2}')

use_backports=no
backported=()
if [ -z "$systemd_version" ] || [ "$systemd_version" -lt 253 ]; then
  use_backports=yes
  backported+=(systemd)
elif dpkg-query -W -f='${Version}' systemd 2>/dev/null | grep -q '~bpo'; then
  use_backports=yes
fi

missing=()
for package in fuse3 chromium acl poppler-utils ghostscript qpdf curl; do
  installed "$package" || missing+=("$package")
done
for package in systemd-container debootstrap; do
  installed "$package" && continue
  if [ "$use_backports" = yes ]; then
    backported+=("$package")
  else
    missing+=("$package")
  fi
done

if [ ${#backported[@]} -gt 0 ] && [ -n "$codename" ] \
    && [ ! -e /etc/apt/sources.list.d/ocrd-backports.sources ]; then
  printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: %s-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
    "$codename" > /etc/apt/sources.list.d/ocrd-backports.sources
fi

if [ ${#missing[@]} -gt 0 ] || [ ${#backported[@]} -gt 0 ]; then
  apt-get update -q
  export DEBIAN_FRONTEND=noninteractive
  if [ ${#missing[@]} -gt 0 ]; then
    apt-get install -y -q --no-install-recommends "${missing[@]}"
  fi
  if [ ${#backported[@]} -gt 0 ]; then
    apt-get install -y -q --no-install-recommends -t "${codename}-backports" "${backported[@]}"
  fi
fi
