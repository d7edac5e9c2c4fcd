#!/bin/bash
BIN=$1; MODE=$2
rm -rf lower mnt; mkdir -p lower mnt; rm -f /dev/shm/s28-nv
$BIN mount --nvram /dev/shm/s28-nv --consistency $MODE $EXTRA lower mnt >/dev/null
PID=$(pgrep -f "s28-nv" | head -1)
T0=$(awk '{print $14+$15}' /proc/$PID/stat)
S=$(date +%s.%N)
printf "set location %s\nset number 5000\nset subdirectories 100\nset transactions 10000\nset size 500 9770\nrun\nquit\n" "$PWD/mnt" | postmark >/dev/null
E=$(date +%s.%N)
T1=$(awk '{print $14+$15}' /proc/$PID/stat)
echo "postmark $MODE: wall $(echo "$E - $S" | bc) s, daemon CPU $(( (T1-T0)*10 )) ms"
$BIN umount mnt; rm -f /dev/shm/s28-nv
