#!/bin/bash
# usage: run.sh BIN MODE N [perf]
BIN=$1; MODE=$2; N=$3; PERF=$4
rm -rf lower mnt; mkdir -p lower mnt; rm -f /dev/shm/s28-nv
$BIN mount --nvram /dev/shm/s28-nv --consistency $MODE $EXTRA lower mnt >/dev/null
PID=$(pgrep -f "s28-nv" | head -1)
./app mnt/log 2000 >/dev/null
if [ -n "$PERF" ]; then perf record -q -F 2000 -g -p $PID -o perf-$MODE.data 2>/dev/null & PP=$!; sleep 0.5; fi
T0=$(awk '{print $14+$15}' /proc/$PID/stat)
./app mnt/log $N
T1=$(awk '{print $14+$15}' /proc/$PID/stat)
echo "daemon CPU ticks: $((T1-T0)) = $(( (T1-T0)*10000000 / N / 1000 )) us/op (x10ms ticks)"
if [ -n "$PERF" ]; then kill -INT $PP; wait $PP; fi
$BIN umount mnt
rm -f /dev/shm/s28-nv
