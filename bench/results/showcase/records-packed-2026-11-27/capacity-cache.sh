#!/bin/bash
# capcache.sh BIN N : N existing 8 KiB files in a tmpfs lower directory; through a mount with
# --tempfiles off and a 64 MiB region, 4 KiB written at offset 0 of each (closed after each);
# then the page cache's counters: files with a record, dirty pages, record frames, frames in
# use, pages written back by pressure (dirty-high: 80 % of the frames).
set -eu
BIN=$1; N=$2
W=/var/tmp/s31/capc; mkdir -p $W
umount -l $W/mnt 2>/dev/null || true; umount -l $W/low 2>/dev/null || true
rm -rf $W/low $W/mnt; mkdir -p $W/low $W/mnt
mount -t tmpfs -o size=2G tmpfs $W/low
python3 -c "
import sys
for i in range(int(sys.argv[2])):
    open(f'{sys.argv[1]}/f{i}', 'wb').write(b'l' * 8192)" $W/low $N
rm -f /dev/shm/s31capc.nv
$BIN mount $W/low $W/mnt --nvram /dev/shm/s31capc.nv --size 64M --tempfiles off --passthrough off --max-dirty-age 0 >/dev/null
python3 - "$W/mnt" "$N" <<'PY'
import os, sys
d, n = sys.argv[1], int(sys.argv[2])
buf = b"w" * 4096
for i in range(n):
    fd = os.open(f"{d}/f{i}", os.O_WRONLY)
    os.pwrite(fd, buf, 0)
    os.close(fd)
PY
$BIN stat $W/mnt --json | python3 -c '
import json,sys; v=json.load(sys.stdin); c=v["cache"]; w=v["writeback"]; n=v["nvram"]
print(json.dumps({"files": c["files"], "record_frames": c.get("record_frames"), "pages_dirty": w["pages_dirty"], "pages_written": w["pages_written"], "frames_used": n["frames_used"], "frames_total": n["frames_total"]}))'
$BIN umount $W/mnt >/dev/null; umount $W/low; rm -f /dev/shm/s31capc.nv
