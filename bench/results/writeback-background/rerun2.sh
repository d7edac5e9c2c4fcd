#!/bin/bash
cd /var/tmp/bench36
export NVSTACK_BIN=/var/tmp/nvstack-s36
O=/var/tmp/bgwb36/fixed
while pgrep -f rerun.sh >/dev/null; do sleep 5; done
echo "=== $(date +%T) showcase-postmark"
bench/run run showcase-postmark --reps 2 --no-plot --out $O/showcase-postmark 2>&1 | grep -E "^\[|runs:"
for arm in off on; do
  extra=(); [ $arm = on ] && extra=(--nvstack-args="--writeback-background on")
  echo "=== $(date +%T) pm2500 rep2 $arm"
  bench/run run writeback-policies --reps 1 --workloads postmark:writeback --variants files=2500 --fs nvstack-ext2-wb-relo,nvstack-ext2-wb-file --no-floor --no-plot "${extra[@]}" --out $O/pm2500/$arm-r2 2>&1 | grep -E "^\[|runs:"
done
echo "=== $(date +%T) done"
