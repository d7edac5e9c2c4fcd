#!/bin/bash
# stop 37: the nbw rows with the background writer on by default (binary of ba4ad56)
cd /var/tmp/bench36
C="--scale 1 --memory 2G --nvram 512M --disk 8G"
export NVSTACK_BIN=/var/tmp/nvstack-s37
date
# s: ssd, random write and random read/write, 128 B - 2 KiB, ext4 and the three modes side by side
bench/run run nbw --out /var/tmp/nbw37-s $C --device ssd \
  --variants iosize=128,iosize=512,iosize=1024,iosize=2048 \
  --workloads fio:nbw-random-write,fio:nbw-random-readwrite \
  --fs ext4-ordered,nvstack-ext4-nbw-off,nvstack-ext4-nbw-lazy,nvstack-ext4-nbw-async-bg
date
# t: the whole-page rows not re-run with the background writer: ssd random read/write, hdd-7200 sequential write
bench/run run nbw --out /var/tmp/nbw37-t $C --device ssd --variants iosize=4096 \
  --workloads fio:nbw-random-readwrite --fs nvstack-ext4-nbw-off,nvstack-ext4-nbw-lazy
date
bench/run run nbw --out /var/tmp/nbw37-u $C --device hdd-7200 --variants iosize=4096 \
  --workloads fio:nbw-seq-write --fs nvstack-ext4-nbw-off,nvstack-ext4-nbw-lazy
date
echo done
