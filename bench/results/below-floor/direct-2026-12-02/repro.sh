#!/bin/bash
cd "$(dirname "$0")/../../../.."
for w in applog sqlite-wal sqlite-delete maildir files; do
  bench/tools/fuse-floor --nvstack target/release/nvstack --only-nvstack --workload $w --seconds 4 --rounds 3 \
    --workdir /dev/shm/ff --also spare='--fsync-requests spare' --library lib='' --library lib-spare='--fsync-requests spare' \
    --out bench/results/below-floor/direct-2026-12-02/$w > bench/results/below-floor/direct-2026-12-02/$w.log 2>&1
done
echo DONE > bench/results/below-floor/direct-2026-12-02/done
