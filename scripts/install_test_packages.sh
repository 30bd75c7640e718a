#!/usr/bin/env bash
# Debian packages the test suite uses beyond Python: FUSE for the SMB-like share in
# tests/test_storage.py. Needs root (CI runs as root); installs only what is missing.
set -euo pipefail
packages=(fuse3)
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" \
    || missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
