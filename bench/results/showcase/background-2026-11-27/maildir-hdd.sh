#!/bin/bash
# maildir-hdd.sh BIN SECONDS [extra mount args]: the showcase's Maildir row by hand - ext4 on a fresh 1 GiB
# hdd-7200 image (sleep timing), nvstack (defaults, 256 MiB region) over it, durable.py maildir.
BIN=$1; SECS=$2; shift 2
W=${WORK:-/var/tmp/maildir-hdd}; umount $W/mnt 2>/dev/null; $BIN device detach $W/ext4 2>/dev/null
rm -rf $W; mkdir -p $W/ext4 $W/mnt
$BIN device attach $W/img $W/ext4 --model hdd-7200 --timing sleep --size 1G --mkfs ext4 >/dev/null
mkdir -p $W/ext4/lower
rm -f /dev/shm/maildir-hdd
$BIN mount --nvram /dev/shm/maildir-hdd --size 256M "$@" $W/ext4/lower $W/mnt >/dev/null
D=$(cd "$(dirname "$0")/../../.." && pwd)/nvbench/workloads/durable.py
python3 $D maildir --dir $W/mnt --init >/dev/null
python3 $D maildir --dir $W/mnt --seconds $SECS | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); l=d['latency_us']; print('maildir', round(d['tx_per_second']), 'tx/s p50', round(l['p50']), 'p99', round(l['p99']), 'max', round(l['max']))"
$BIN stat --json $W/mnt > $W.stat.json
python3 -c "
import json; d=json.load(open('$W.stat.json')); t=d.get('tempfiles',d.get('temp',{})); print({k:v for k,v in t.items() if not isinstance(v,dict)}); print(d['tempfiles']['transformed'])"
$BIN umount $W/mnt; rm -f /dev/shm/maildir-hdd
$BIN device detach $W/ext4 >/dev/null
