#!/bin/bash
# v: ssd sequential write, 128 B - 2 KiB, async-bg and lazy side by side (binary of the bell
# branch: the fetcher sleeps on its bell; async-bg is the default there)
cd /var/tmp/bench36
export NVSTACK_BIN=/var/tmp/nvstack-s37b
date
bench/run run nbw --out /var/tmp/nbw37-v --scale 1 --memory 2G --nvram 512M --disk 8G --device ssd \
  --variants iosize=128,iosize=512,iosize=1024,iosize=2048 --workloads fio:nbw-seq-write \
  --fs nvstack-ext4-nbw-lazy,nvstack-ext4-nbw-async-bg
date
echo done
