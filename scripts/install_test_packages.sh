#!/usr/bin/env bash
# Debian packages the test suite uses beyond Python, installed only where missing (as root,
# as CI runs):
#   fuse3     the SMB-like share of tests/test_storage.py
#   chromium  the status page test of tests/test_http.py (a real headless browser)
#   poppler-utils  pdftotext and pdftoppm: what a searchable PDF shows other readers
#   ghostscript    PDF/A-2b for archival searchable PDFs that pikepdf alone cannot make
#   systemd   253 or newer, for `systemd-analyze verify` of the unit's Type=notify-reload
#             (Debian 12 ships 252; its backports have 254)
set -euo pipefail

installed() {
  dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"
}

missing=()
for package in fuse3 chromium poppler-utils ghostscript; do
  installed "$package" || missing+=("$package")
done

systemd_version=$(systemd-analyze --version 2>/dev/null | awk 'NR == 1 {print $2}')
backports=()
if [ -z "$systemd_version" ] || [ "$systemd_version" -lt 253 ]; then
  codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
  if [ -n "$codename" ] && [ ! -e /etc/apt/sources.list.d/ocrd-backports.sources ]; then
    printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: %s-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
      "$codename" > /etc/apt/sources.list.d/ocrd-backports.sources
  fi
  backports=(-t "${codename}-backports" systemd)
fi

if [ ${#missing[@]} -gt 0 ] || [ ${#backports[@]} -gt 0 ]; then
  apt-get update -q
  export DEBIAN_FRONTEND=noninteractive
  if [ ${#missing[@]} -gt 0 ]; then
    apt-get install -y -q --no-install-recommends "${missing[@]}"
  fi
  if [ ${#backports[@]} -gt 0 ]; then
    apt-get install -y -q --no-install-recommends "${backports[@]}"
  fi
fi
