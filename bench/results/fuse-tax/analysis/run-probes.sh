#!/bin/bash
# The fuse-tax gap analysis (docs/benchmarks.md "FUSE tax"): probes with per-opcode request
# counts and daemon CPU (bench/tools/fuse-tax-probe). Root; ~10 min. Writes next to itself.
# Usage: bench/results/fuse-tax/analysis/run-probes.sh [REPS]
# The probe directories are gitignored and kept in git packed as probes.tar.xz: they are unpacked
# first (new probes join the old ones) and packed again at the end.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
TOOLS=$(cd "$HERE/../../../tools" && pwd)
REPS=${1:-2}
PROBE=$TOOLS/fuse-tax-probe
PM_CFG='printf "set location $MNT/pm\nset number 2000\nset transactions 30000\nset size 512 10240\nset subdirectories 100\nset seed 42\nset report terse\nrun\nquit\n" > /tmp/pm.$$.cfg; mkdir -p $MNT/pm; postmark /tmp/pm.$$.cfg; rm -f /tmp/pm.$$.cfg'
PREFILL='fio --name=prefill --directory=$MNT --filename=f.dat --rw=write --bs=1m --size=256m --end_fsync=1 --output-format=terse'
RANDW='fio --name=rw --directory=$MNT --filename=f.dat --rw=randwrite --bs=4k --size=256m --time_based=1 --runtime=10 --end_fsync=1 --randrepeat=1 --output-format=json'
SEQW='fio --name=sw --directory=$MNT --filename=g.dat --rw=write --bs=4k --size=256m --end_fsync=1 --output-format=json'
SEQR='fio --name=sr --directory=$MNT --filename=f.dat --rw=read --bs=4k --size=256m --output-format=json'
RANDR='fio --name=rr --directory=$MNT --filename=f.dat --rw=randread --bs=4k --size=256m --time_based=1 --runtime=10 --randrepeat=1 --output-format=json'
configs=("passthrough_hp" "passthrough_hp-wt" "nvstack-none")
[ -n "${CONFIGS:-}" ] && IFS=, read -r -a configs <<<"$CONFIGS"
# CONFIGS="a,b" and WORKLOADS="postmark randwrite ..." narrow the matrix (the threads/knobs
# sweep: CONFIGS="nvstack-none --threads 1,nvstack-none --threads 2,..." WORKLOADS="postmark randwrite seqwrite")
WORKLOADS=${WORKLOADS:-postmark randwrite seqwrite seqread randread}
"$HERE/summarize.py" --unpack
for rep in $(seq "$REPS"); do
  for cfg in "${configs[@]}"; do
    tag=${cfg// /_}
    for wl in $WORKLOADS; do
      case $wl in
        postmark)  "$PROBE" "$cfg" "$HERE/postmark/$tag/rep$rep" -- "$PM_CFG" ;;
        randwrite) PREP="$PREFILL" "$PROBE" "$cfg" "$HERE/randwrite/$tag/rep$rep" -- "$RANDW" ;;
        seqwrite)  "$PROBE" "$cfg" "$HERE/seqwrite/$tag/rep$rep" -- "$SEQW" ;;
        seqread)   PREP="$PREFILL" "$PROBE" "$cfg" "$HERE/seqread/$tag/rep$rep" -- "$SEQR" ;;
        randread)  PREP="$PREFILL" "$PROBE" "$cfg" "$HERE/randread/$tag/rep$rep" -- "$RANDR" ;;
      esac
    done
  done
done
"$HERE/summarize.py" --pack
