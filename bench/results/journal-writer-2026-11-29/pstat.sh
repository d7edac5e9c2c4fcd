#!/bin/bash
# pstat.sh BIN MODE W S NAME: perf stat (faults, context switches, task clock) of the daemon in a loop
BIN=$1; MODE=$2; W=$3; S=$4; N=$5
L=/dev/shm/p41-lower; M=/var/tmp/s41/mnt; R=/dev/shm/p41-region
rm -rf $L $R; mkdir -p $L $M
$BIN mount --foreground --nvram $R --size 256M --consistency $MODE $L $M 2>/var/tmp/s41/daemon.err &
DP=$!
for i in $(seq 100); do mountpoint -q $M && break; sleep 0.1; done
PY=/root/.pyenv/versions/3.11.7/bin/python3; D=/work/main/bench/nvbench/workloads/durable.py
mkdir -p $M/w/d
$PY $D $W --dir $M/w/d --init >/dev/null
perf stat -e minor-faults,major-faults,context-switches,task-clock,syscalls:sys_enter_pwrite64,syscalls:sys_enter_mprotect -p $DP -o /var/tmp/s41/pstat-$N.txt -- sleep $((S+1)) &
PP=$!
out=$($PY $D $W --dir $M/w/d --seconds $S | tail -1)
wait $PP
for i in $(seq 50); do umount $M 2>/dev/null && break; sleep 0.2; done
wait $DP
rm -rf $L $R
python3 - "$N" "$out" <<'PY'
import json,sys,re
n,out=sys.argv[1],json.loads(sys.argv[2]); t=out['transactions']
txt=open(f'/var/tmp/s41/pstat-{n}.txt').read()
vals={}
for line in txt.splitlines():
    m=re.match(r'\s*([\d,\.]+)\s+(msec\s+)?(\S+)',line)
    if m: vals[m.group(3)]=float(m.group(1).replace(',',''))
print(f"{n:10} {out['tx_per_second']:6.0f} tx/s " + " ".join(f"{k}={v/t:.2f}" for k,v in vals.items()))
PY
