#!/bin/bash
# Install the benchmark harness: apt tools (root) + bench/.venv with pinned Python packages.
# Idempotent and quiet. Usage: bench/install.sh [--with-linux-source] [--no-apt]
set -euo pipefail
BENCH="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
WITH_LINUX=0; APT=1
for a in "$@"; do
  case "$a" in
    --with-linux-source) WITH_LINUX=1 ;;
    --no-apt) APT=0 ;;
    -h|--help) sed -n 2,3p "$0"; exit 0 ;;
    *) echo "install.sh: unknown option $a" >&2; exit 2 ;;
  esac
done

pkgs=(postmark fio bonnie++ e2fsprogs dosfstools util-linux fuse3 xz-utils python3-venv)
[ "$WITH_LINUX" = 1 ] && pkgs+=(linux-source)
if [ "$APT" = 1 ]; then
  missing=()
  for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    if [ "$(id -u)" != 0 ]; then
      echo "install.sh: need root to apt-get install: ${missing[*]}" >&2; exit 1
    fi
    echo "install.sh: apt-get install ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
fi

if [ ! -x "$BENCH/.venv/bin/python" ]; then
  python3 -m venv "$BENCH/.venv"
fi
if ! cmp -s "$BENCH/requirements.txt" "$BENCH/.venv/.requirements.installed" 2>/dev/null; then
  "$BENCH/.venv/bin/pip" install -q --disable-pip-version-check -r "$BENCH/requirements.txt"
  cp "$BENCH/requirements.txt" "$BENCH/.venv/.requirements.installed"
fi
echo "install.sh: ok ($("$BENCH/.venv/bin/python" -c 'import matplotlib; print("matplotlib", matplotlib.__version__)'))"
