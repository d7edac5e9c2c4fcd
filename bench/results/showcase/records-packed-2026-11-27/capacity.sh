#!/bin/bash
# cap.sh BIN SIZE_BYTES N : mount BIN over a tmpfs directory with a 64 MiB region, write N
# files of SIZE bytes each (no fsync needed: every write is durable in NVRAM), then print the
# tempfiles counters: how many files were still in NVRAM and how many were transformed by
# pressure (the share is 90 % of the region's frames).
set -eu
BIN=$1; SIZE=$2; N=$3
W=/var/tmp/s31/cap; mkdir -p $W
umount -l $W/mnt 2>/dev/null || true; umount -l $W/low 2>/dev/null || true
rm -rf $W/low $W/mnt; mkdir -p $W/low $W/mnt
mount -t tmpfs -o size=2G tmpfs $W/low
rm -f /dev/shm/s31cap.nv
$BIN mount $W/low $W/mnt --nvram /dev/shm/s31cap.nv --size 64M >/dev/null
python3 - "$W/mnt" "$SIZE" "$N" <<'PY'
import os, sys
d, size, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
buf = b"m" * size
for i in range(n):
    fd = os.open(f"{d}/f{i}", os.O_CREAT | os.O_WRONLY, 0o644)
    os.write(fd, buf)
    os.close(fd)
PY
$BIN stat $W/mnt --json | python3 -c '
import json,sys; v=json.load(sys.stdin); t=v["tempfiles"]; n=v["nvram"]
print(json.dumps({k: t.get(k) for k in ("created","files_resident","pages_resident","record_frames","transformed_total")} | {"frames_used": n["frames_used"], "frames_total": n["frames_total"]}))'
$BIN umount $W/mnt >/dev/null; umount $W/low; rm -f /dev/shm/s31cap.nv
