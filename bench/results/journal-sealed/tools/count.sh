#!/bin/bash
BIN=$1; MODE=$2; N=$3
rm -rf lower mnt; mkdir -p lower mnt; rm -f /dev/shm/s28-nv
$BIN mount --nvram /dev/shm/s28-nv --consistency $MODE lower mnt >/dev/null
PID=$(pgrep -f "s28-nv" | head -1)
./app mnt/log 2000 >/dev/null
perf stat -e 'syscalls:sys_enter_mprotect,syscalls:sys_enter_msync,syscalls:sys_enter_pwrite64,syscalls:sys_enter_fdatasync,syscalls:sys_enter_fsync' -p $PID -o stat-$MODE.txt &
PP=$!; sleep 0.3
./app mnt/log $N
kill -INT $PP; wait $PP
grep -E "syscalls" stat-$MODE.txt
$BIN umount mnt
rm -f /dev/shm/s28-nv
