#!/bin/bash
BIN=$1; MODE=$2; N=$3
rm -rf lower mnt; mkdir -p lower mnt; rm -f /dev/shm/s28-nv
$BIN mount --nvram /dev/shm/s28-nv --consistency $MODE $EXTRA lower mnt >/dev/null
PID=$(pgrep -f "s28-nv" | head -1)
python3 md.py mnt/md 300 >/dev/null
T0=$(awk '{print $14+$15}' /proc/$PID/stat)
python3 md.py mnt/md $N | tr '\n' ' '
T1=$(awk '{print $14+$15}' /proc/$PID/stat)
echo "daemon CPU: $(( (T1-T0)*10000 / N )) us/op"
$BIN umount mnt; rm -f /dev/shm/s28-nv
