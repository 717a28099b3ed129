#!/usr/bin/env bash
# install-deps.sh PACKAGE...: installs the Debian / Ubuntu packages that are missing.
# Idempotent and quick when everything is there; `apt-get update` runs only when something is
# missing; sudo is used when not root.
set -euo pipefail

missing=()
for p in "$@"; do
    status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
    [[ "$status" == "install ok installed" ]] || missing+=("$p")
done

if [[ ${#missing[@]} -eq 0 ]]; then
    echo "deps: all ${#} packages are installed"
    exit 0
fi

sudo=""
if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || { echo "deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
    sudo="sudo"
fi
echo "deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
$sudo apt-get install -y --no-install-recommends "${missing[@]}"
