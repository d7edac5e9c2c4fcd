#!/bin/bash
BIN=$1; MODE=$2; N=$3; PERF=$4
rm -rf lower mnt; mkdir -p lower mnt; rm -f /dev/shm/s28-nv
$BIN mount --nvram /dev/shm/s28-nv --consistency $MODE $EXTRA lower mnt >/dev/null
PID=$(pgrep -f "s28-nv" | head -1)
python3 sq.py mnt/db 300 >/dev/null
if [ -n "$PERF" ]; then perf record -q -F 2000 -g -p $PID -o perf-sq-$MODE.data 2>/dev/null & PP=$!; sleep 0.5; fi
T0=$(awk '{print $14+$15}' /proc/$PID/stat)
python3 sq.py mnt/db $N
T1=$(awk '{print $14+$15}' /proc/$PID/stat)
echo "daemon CPU: $(( (T1-T0)*10000 / N )) us/tx"
if [ -n "$PERF" ]; then kill -INT $PP; wait $PP; fi
$BIN umount mnt; rm -f /dev/shm/s28-nv
