#!/bin/bash
# warm.sh: untar then read every file at once (caches warm), default vs --direct-io write-only
BIN=/var/tmp/nvstack-s42a; TAR=/var/tmp/nvbench-work/cache/linux-source-6.1-fs-net.tar
OUT=/var/tmp/s42/warm.txt; : > $OUT
for round in 1 2 3; do
 for cfg in never write-only; do
  L=/dev/shm/w42-lower; M=/var/tmp/s42/wmnt; R=/dev/shm/w42-region
  rm -rf $L $R; mkdir -p $L $M
  $BIN mount --foreground --nvram $R --size 512M --direct-io $cfg $L $M 2>/var/tmp/s42/wdaemon.err &
  DP=$!
  for i in $(seq 100); do mountpoint -q $M && break; sleep 0.1; done
  sync; echo 3 > /proc/sys/vm/drop_caches
  r0=$($BIN stat --json $M | python3 -c "import json,sys; print(sum(json.load(sys.stdin)['requests'].values()))")
  t0=$(date +%s.%N); tar -xf $TAR -C $M; t1=$(date +%s.%N)
  r1=$($BIN stat --json $M | python3 -c "import json,sys; print(sum(json.load(sys.stdin)['requests'].values()))")
  find $M -type f -print0 | xargs -0 cat > /dev/null; t2=$(date +%s.%N)
  r2=$($BIN stat --json $M | python3 -c "import json,sys; print(sum(json.load(sys.stdin)['requests'].values()))")
  echo "$round $cfg untar $(echo "$t1-$t0"|bc) s $((r1-r0)) req; warm read $(echo "$t2-$t1"|bc) s $((r2-r1)) req; $(grep -E '^(Cached|Shmem):' /proc/meminfo | tr -s ' ' | tr '\n' ' ')" >> $OUT
  for i in $(seq 50); do umount $M 2>/dev/null && break; sleep 0.2; done
  wait $DP
  rm -rf $L $R
 done
done
touch /var/tmp/s42/warm.done
