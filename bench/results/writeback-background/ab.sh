#!/bin/bash
# A/B of --writeback-background: each block runs the default (off) then on, same binary.
cd /var/tmp/bench36
export NVSTACK_BIN=/var/tmp/nvstack-s36
O=/var/tmp/bgwb36
ab() {  # name rep args...
  local name=$1 rep=$2; shift 2
  for arm in off on; do
    local extra=()
    [ $arm = on ] && extra=(--nvstack-args="--writeback-background on")
    echo "=== $(date +%T) $name rep$rep $arm"
    bench/run run "$@" --no-floor --no-plot "${extra[@]}" --out $O/$name/$arm-r$rep 2>&1 | grep -E "^\[|runs:"
  done
}
for rep in 1 2; do
  ab durability $rep durability --fs nvstack-ext4-defaults,nvstack-ext4-defaults-journal
  ab matrix $rep thesis-matrix --reps 1 --fs nvstack-ext2-wb-charged,nvstack-ext2-wb-trans-charged,nvstack-ext2-tempffs-wb-charged,nvstack-ext2-tempffs-wb-trans-charged
  ab zipf $rep writeback-policies --reps 1 --workloads fio:wb-zipf-rewrite --fs nvstack-ext2-wb-file,nvstack-ext2-wb-recency,nvstack-ext2-wb-location,nvstack-ext2-wb-relo
  [ $rep = 1 ] && ab pm2500 $rep writeback-policies --reps 1 --workloads postmark:writeback --variants files=2500 --fs nvstack-ext2-wb-relo,nvstack-ext2-wb-file
done
echo "=== $(date +%T) done"
