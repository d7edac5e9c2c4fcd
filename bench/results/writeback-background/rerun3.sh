#!/bin/bash
cd /var/tmp/bench36
export NVSTACK_BIN=/var/tmp/nvstack-s36
O=/var/tmp/bgwb36/dur3
while pgrep -f "rerun2?.sh" >/dev/null; do sleep 5; done
for rep in 1 2 3; do
  for arm in off on; do
    extra=(); [ $arm = on ] && extra=(--nvstack-args="--writeback-background on")
    echo "=== $(date +%T) durability rep$rep $arm"
    bench/run run durability --device hdd-7200 --workloads maildir:showcase,sqlite:delete,sqlite:wal,applog:showcase --fs nvstack-ext4-defaults,nvstack-ext4-defaults-journal --no-floor --no-plot "${extra[@]}" --out $O/$arm-r$rep 2>&1 | grep -E "runs:"
  done
done
echo "=== $(date +%T) done"
