#!/bin/bash
# ssd at scale 1: the lazy and off runs of nbw34-i (random write 2 KiB) and nbw34-j (random
# read/write 1 KiB) repeated exactly as their repro.sh with --writeback-background on
OUT=${OUT:-/var/tmp/ab34}; mkdir -p $OUT
run() { # name src mode
  local name=$1 src=$2 mode=$3
  sed -e "s#--nbw $mode --keep-dirty#--nbw $mode --keep-dirty --writeback-background on#" \
      $src/nvstack-ext4-nbw-$mode/rep1/repro.sh > $OUT/$name.sh
  grep -q -- "--writeback-background on" $OUT/$name.sh || { echo "no flag in $name"; return; }
  chmod +x $OUT/$name.sh; rm -rf $OUT/$name
  echo "== $name $(date +%T)"; $OUT/$name.sh $OUT/$name > $OUT/$name.log 2>&1; echo "rc=$? $(date +%T)"
}
I=/var/tmp/nbw34-i/runs/nbw/fio-nbw-random-write/iosize=2048
J=/var/tmp/nbw34-j/runs/nbw/fio-nbw-random-readwrite/iosize=1024
run rw2k-off-bgwb $I off
run rw2k-lazy-bgwb $I lazy
run rr1k-off-bgwb $J off
run rr1k-lazy-bgwb $J lazy
