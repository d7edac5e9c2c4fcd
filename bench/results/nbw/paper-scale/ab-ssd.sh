#!/bin/bash
# ssd, 128-byte random writes at scale 1: the runs of /var/tmp/nbw32-c repeated with the new
# binary, exactly as their repro.sh, with or without --writeback-background on
BIN=${BIN:-/var/tmp/nvstack-s32b}
SRC=/var/tmp/nbw32-c/runs/nbw/fio-nbw-random-write/iosize=128
OUT=/var/tmp/ab32; mkdir -p $OUT
run() { # name mode extra
  local name=$1 mode=$2 extra=$3
  sed -e "s#/var/tmp/nvstack-s32a#$BIN#g" -e "s#--nbw $mode --keep-dirty#--nbw $mode --keep-dirty $extra#" \
      $SRC/nvstack-ext4-nbw-$mode/rep1/repro.sh > $OUT/$name.sh
  chmod +x $OUT/$name.sh; rm -rf $OUT/$name
  echo "== $name $(date +%T)"; $OUT/$name.sh $OUT/$name > $OUT/$name.log 2>&1; echo "rc=$? $(date +%T)"
}
run async-bg async-bg ""
run async-bg-bgwb async-bg "--writeback-background on"
run off-bgwb off "--writeback-background on"
