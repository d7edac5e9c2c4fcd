#!/bin/bash
# After the passthrough fix (thesis configurations on the NVRAM path): A/B of
# --writeback-background where rounds now happen, then the affected thesis results again.
cd /var/tmp/bench36
export NVSTACK_BIN=/var/tmp/nvstack-s36
O=/var/tmp/bgwb36/fixed
ab() {  # name rep args...
  local name=$1 rep=$2; shift 2
  for arm in off on; do
    local extra=()
    [ $arm = on ] && extra=(--nvstack-args="--writeback-background on")
    echo "=== $(date +%T) $name rep$rep $arm"
    bench/run run "$@" --no-floor --no-plot "${extra[@]}" --out $O/$name/$arm-r$rep 2>&1 | grep -E "^\[|runs:"
  done
}
ab zipf 1 writeback-policies --reps 1 --workloads fio:wb-zipf-rewrite --fs nvstack-ext2-wb-file,nvstack-ext2-wb-recency,nvstack-ext2-wb-location,nvstack-ext2-wb-relo
ab pm2500 1 writeback-policies --reps 1 --workloads postmark:writeback --variants files=2500 --fs nvstack-ext2-wb-relo,nvstack-ext2-wb-file
echo "=== $(date +%T) thesis-matrix"
bench/run run thesis-matrix --reps 2 --no-plot --fs ext2,ext4-journal,nvstack-ext2-charged,nvstack-ext2-trans-charged,nvstack-ext2-trans-extra,nvstack-ext2-wb-charged,nvstack-ext2-wb-trans-charged,nvstack-ext2-wb-trans-extra --out $O/thesis-matrix 2>&1 | grep -E "^\[|runs:"
echo "=== $(date +%T) thesis-untar"
bench/run run thesis-untar --no-plot --out $O/thesis-untar 2>&1 | grep -E "^\[|runs:"
echo "=== $(date +%T) fig 4.19"
bench/run run thesis-postmark-2m --scale 0.005 --no-plot --out $O/fig419 2>&1 | grep -E "^\[|runs:"
echo "=== $(date +%T) done"
