#!/bin/bash
# A/B of the spinning reader on one binary: --spin-us 0 (upstream fuser's workers: every one
# blocks in read(2)) vs 20 (the default), interleaved, 3 rounds. No disk model: the lower
# directory is on the root ext4, the region in /dev/shm; each run mounts a fresh pair.
# Usage (root): BIN=/path/to/nvstack bench/results/spin/ab.sh   (needs gcc, python3, postmark)
set -u
BIN=${BIN:?release build of nvstack}
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=$(mktemp -d /var/tmp/spin-ab.XXXXXX)
# The loops of the journal-mode probes (their scripts take extra mount options in $EXTRA),
# and the Maildir loop of this directory.
TOOLS="$HERE/../journal-sealed/tools"
cp "$TOOLS"/{run.sh,runsq.sh,runpm.sh,sq.py} "$HERE"/{runmd.sh,md.py} "$WORK"/ &&
    gcc -O2 -o "$WORK/app" "$TOOLS/app.c"
cd "$WORK"
for r in 1 2 3; do
  for s in 0 20; do
    echo "round $r spin $s append: $(EXTRA="--spin-us $s" ./run.sh "$BIN" undo 20000 | tr '\n' ' ')"
    echo "round $r spin $s sqlite-delete: $(EXTRA="--spin-us $s" ./runsq.sh "$BIN" undo 3000 | tr '\n' ' ')"
    echo "round $r spin $s maildir: $(EXTRA="--spin-us $s" ./runmd.sh "$BIN" undo 3000 | tr '\n' ' ')"
    echo "round $r spin $s postmark: $(EXTRA="--spin-us $s" ./runpm.sh "$BIN" undo | tr '\n' ' ')"
    echo "round $r spin $s append-journal: $(EXTRA="--spin-us $s" ./run.sh "$BIN" journal 20000 | tr '\n' ' ')"
  done
done
