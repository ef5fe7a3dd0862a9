#!/usr/bin/env bash
# Installs those of the named Debian packages that are not installed yet (apt-get update first,
# through sudo when not root), for the project's set-up and packaging scripts.
#
#   tools/apt_install.sh PACKAGE...
set -euo pipefail

missing=()
for p in "$@"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "Debian packages present" >&2
  exit 0
fi
echo "installing Debian packages: ${missing[*]}" >&2
sudo_cmd=()
[ "$(id -u)" = 0 ] || sudo_cmd=(sudo)
"${sudo_cmd[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends \
  "${missing[@]}" >/dev/null
