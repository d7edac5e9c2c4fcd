#!/bin/bash
# w: ext4 for run v's rows (ssd sequential write, 128 B - 2 KiB), right after it
while ! grep -q '^done' /var/tmp/nbw37/run-v.log; do sleep 5; done
cd /var/tmp/bench36
export NVSTACK_BIN=/var/tmp/nvstack-s37b
date
bench/run run nbw --out /var/tmp/nbw37-w --scale 1 --memory 2G --nvram 512M --disk 8G --device ssd \
  --variants iosize=128,iosize=512,iosize=1024,iosize=2048 --workloads fio:nbw-seq-write \
  --fs ext4-ordered
date
echo done
