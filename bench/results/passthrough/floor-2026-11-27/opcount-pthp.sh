#!/bin/bash
# The FUSE requests the kernel sends to libfuse's passthrough_hp-wt for the four tree steps
# (bench/tools/tree-steps' commands, caches dropped before each), counted in the kernel by
# bench/tools/fuse-opcount; over a directory of the VM's root ext4. Root. Writes one JSON file
# per step to OUT.
#   opcount-pthp.sh PASSTHROUGH_HP_WT TREE.tar OUT
set -euo pipefail
hp=$1 tar=$2 out=$3
here=$(cd "$(dirname "$0")/../../../tools" && pwd)
work=$(mktemp -d /var/tmp/opcount-pthp.XXXXXX)
mkdir -p "$work/l" "$work/m" "$out"
"$hp" --foreground "$work/l" "$work/m" & pid=$!
trap 'umount "$work/m" 2>/dev/null || true; wait $pid || true; rm -rf "$work"' EXIT
for _ in $(seq 100); do mountpoint -q "$work/m" && break; sleep 0.1; done
m=$work/m
declare -A steps=(
  [1-untar]="tar -xf $tar -C $m && sync"
  [2-read]="find $m -type f -print0 | xargs -0 cat > /dev/null"
  [3-stat]="find $m -printf '%s %T@\n' > /dev/null"
  [4-rm]="rm -rf $m/linux-source-6.1")
for s in $(printf '%s\n' "${!steps[@]}" | sort); do
  sync; echo 3 > /proc/sys/vm/drop_caches
  "$here/fuse-opcount" "$m" --json -- sh -c "${steps[$s]}" > "$out/$s.json"
done
