"""Recovery time after a crash with a full journal (the durability experiment, issue 13 goal:
nvstack's recovery at most 0.5x ext4's journal replay on the same device; the VMA paper's
Table III measured its VMA mode at -45.6 % against ext3's journal mode).

One run per (configuration, device), on the modeled disk with sleep timing (powercut.Stack):

  ext4 alone   a fresh image; a fill that leaves ext4's journal full of committed
               transactions, made durable by `sync`; the power cut (`device cut`); the image
               attached again - its mount replays the journal - timed; then detached and
               attached once more with nothing to replay, timed: replay = the difference.
               ext4-journal (data=journal, 256 MiB journal): FILL_JOURNAL_FRACTION of the
               journal written as file data in 1 MiB writes (every block passes the journal);
               ext4-ordered: the same metadata operations as nvstack's fill below.
               `debugfs -R logdump` before power on counts the journal blocks to replay.
  nvstack      (undo and journal mode) over ext4 data=ordered with
               `--checkpoint-interval 3600` (no checkpoint by time, so the records pile up)
               and the default `--journal-size 32M`: FILL_OPS journaled metadata operations
               (mkdir, chmod, rename of directories: one 256-byte record slot each, packed
               16 to a 4 KiB frame: 24 MiB of the 32 MiB), an fsync (the durability point; the group commit in journal mode;
               no sync: what the lower ext4 has is what its own commits gave it), `nvstack
               stat` (journal.records), then SIGKILL of the daemon and the power cut;
               power on: the lower ext4 attached again (its own replay, timed), `nvstack
               mount` timed until the mount is there: the region's recovery, the replay of
               every record past the marker and the checkpoint that follows
               (`journal.replayed_at_mount`). The tree is checked afterwards. Twice: with
               the lower ext4 as it is (it commits every 5 s: replay redoes what it lost) and
               `lower_lost` (the lower ext4 mounted with commit=600: the cut finds none of the
               fill in it and every record is replayed, the worst case).

Each run writes OUT/<name>/result.json and repro.sh.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from .powercut import Stack, _write
from .util import BenchError, failure_recorded, slug

# Three quarters of the 32 MiB journal (as FILL_JOURNAL_FRACTION of ext4's): the fill's records
# take one 256-byte slot each (mkdir, chmod, rename with ext4's 16-byte handles: 16 a frame,
# measured: 8,100 of them took 507 frames), so 8,192 frames x 16 x 0.75 = 98,304 -> 98,100
# operations (a multiple of 3). Until 2026-11-27 this was 8,100: a full journal when a record
# took a frame, a twelfth of one since records are packed (8f352a1).
FILL_OPS = 98100
FILL_JOURNAL_FRACTION = 0.75       # ext4 data=journal: data written, as a share of its journal
NVSTACK_ARGS = ["--checkpoint-interval", "3600", "--journal-size", "32M"]

# the fill of the metadata journal: FILL_OPS // 3 directories, each made, chmod'ed and renamed
# (python, so repro.sh runs it too); ends with an fsync of a file in the tree
_META_FILL = """
import os, sys
d, n = sys.argv[1], int(sys.argv[2])
os.makedirs(d, exist_ok=True)
for i in range(n // 3):
    a, b = os.path.join(d, "a%05d" % i), os.path.join(d, "b%05d" % i)
    os.mkdir(a)
    os.chmod(a, 0o750)
    os.rename(a, b)
fd = os.open(os.path.join(d, "sync-point"), os.O_WRONLY | os.O_CREAT, 0o644)
os.fsync(fd)
os.close(fd)
print(n // 3)
"""
_DATA_FILL = """
import os, sys
path, mib = sys.argv[1], int(sys.argv[2])
buf = os.urandom(1 << 20)
with open(path, "wb") as f:
    for _ in range(mib):
        f.write(buf)
print(mib)
"""
_CHECK_TREE = """
import os, stat, sys
d, n = sys.argv[1], int(sys.argv[2])
names = set(os.listdir(d))
want = {"b%05d" % i for i in range(n // 3)}
mode = lambda x: stat.S_IMODE(os.stat(os.path.join(d, x)).st_mode)
bad = [x for x in want if x not in names or mode(x) != 0o750]
left = [x for x in names if x.startswith("a")]
print(len(want) - len(bad), len(bad), len(left))
"""


def logdump_blocks(text: str) -> int | None:
    """Journal blocks between the start `debugfs -R logdump` names and the end it found: what
    the mount will read and replay (None when the log wraps around or is not there)."""
    start = re.search(r"^Journal starts at block (\d+)", text, re.M)
    end = re.search(r"^No magic number at block (\d+): end of journal", text, re.M)
    if not start or not end or int(end.group(1)) < int(start.group(1)):
        return None
    return int(end.group(1)) - int(start.group(1))


def run(out: Path, fs_name: str, *, device: str, timing: str = "sleep",
        workdir: Path = Path("/var/tmp/nvbench-work"), nvram_bytes: int = 256 << 20,
        disk_bytes: int = 2 << 30, journal_bytes: int = 256 << 20, seed: int = 1,
        fill_ops: int = FILL_OPS, lower_lost: bool = False, tree_in_journal: bool = False,
        echo: bool = False) -> dict:
    """One recovery run. nvstack only: `lower_lost` = the lower ext4 is mounted with
    `commit=600`, so that ext4 does not commit by time and the crash finds as few of the fill's
    changes as ext4 allows (a fill of 8,100 operations: none; of 98,100: jbd2 commits when a
    transaction outgrows its share of ext4's journal, and ~8,800 are lost) - otherwise ext4
    commits every 5 s as usual and replay redoes only what it lost; `tree_in_journal` = the directory that holds the fill is made after the
    checkpoint that precedes the fill, so its record is in the journal too and every later
    record names it: replaying its creation re-keys all of them in one transaction (M4)."""
    name = (f"{slug(device)}-{slug(fs_name)}" + ("-lower-lost" if lower_lost else "") +
            ("-tree-in-journal" if tree_in_journal else ""))
    rundir = out / name
    rundir.mkdir(parents=True, exist_ok=True)
    why = Stack.missing(fs_name)
    stack = None if why else Stack(
        rundir, fs_name, device=device, timing=timing, workdir=workdir,
        nvram_bytes=nvram_bytes, disk_bytes=disk_bytes, journal_bytes=journal_bytes,
        nvstack_args=NVSTACK_ARGS, lower_options="commit=600" if lower_lost else "", echo=echo)
    cfg = stack.cfg if stack else None
    result = {"fs": fs_name, "device": device, "timing": timing, "seed": seed,
              "lower_lost": lower_lost, "tree_in_journal": tree_in_journal,
              "consistency": (cfg.nvstack or {}).get("consistency") if cfg else None,
              "status": "ok", "reason": ""}
    if why:
        result.update(status="skipped", reason=why)
        _write(rundir / "result.json", result)
        return result
    sh, py = stack.sh, sys.executable
    tree = stack.target / "nvbench-recovery"
    data_journal = "data=journal" in cfg.mount_options.split(",")
    try:
        with failure_recorded(result):
            stack.create()
            if data_journal:
                mib = int(journal_bytes * FILL_JOURNAL_FRACTION) >> 20
                sh.note(f"fill: {mib} MiB of file data through the journal, then sync")
                sh.run(["mkdir", "-p", str(tree)])
                sh.run([py, "-c", _DATA_FILL, str(tree / "fill.dat"), str(mib)], timeout=1200)
                result.update(fill="data", fill_mib=mib)
            else:
                if cfg.nvstack:
                    # start from an empty journal: a checkpoint (which also starts the
                    # --checkpoint-interval clock: before the first one a record is checkpointed
                    # at the next tick) with the fill's directory in it unless tree_in_journal
                    if not tree_in_journal:
                        sh.run(["mkdir", "-p", str(tree)])
                    sh.run([stack.nv, "flush", str(stack.mnt)], timeout=600)
                sh.note(f"fill: {fill_ops} journaled metadata operations, then fsync")
                res = sh.run([py, "-c", _META_FILL, str(tree), str(fill_ops)], timeout=1200,
                             time_it=True)
                result.update(fill="metadata", fill_ops=fill_ops // 3 * 3,
                              fill_seconds=round(res.seconds, 2))
            if not cfg.nvstack:
                sh.run(["sync"])          # ext4's journal: full of committed transactions
            else:
                st = stack.stat()
                jr = st.get("journal") or {}
                result.update(journal_records_before_cut=jr.get("records"),
                              journal_bytes_before_cut=jr.get("bytes"),
                              journal_checkpoints_before_cut=jr.get("checkpoints"))
            result.update(stack.cut(seed))
            dump = sh.run(["debugfs", "-R", "logdump", str(stack.lay.image)], check=False,
                          timeout=300)
            (rundir / "logdump.txt").write_text("\n".join(
                (dump.stdout + dump.stderr).splitlines()[-40:]) + "\n")
            result["ext4_journal_blocks_to_replay"] = logdump_blocks(dump.stdout)
            sh.note("power on: the image attached again (ext4 replays its journal)")
            result["reattach_seconds"] = round(stack.reattach(), 3)
            result["device_after_attach"] = stack.device_stat()
            if cfg.nvstack:
                sh.note("nvstack mount: region recovery, metadata journal replay, checkpoint")
                result["recovery_mount_seconds"] = round(stack.mount_nvstack("recovery"), 3)
                result["device_after_recovery"] = stack.device_stat()
                jr = stack.stat().get("journal") or {}
                result.update(replayed_at_mount=jr.get("replayed_at_mount"),
                              journal_records_after_mount=jr.get("records"),
                              checkpoint_ms_total=jr.get("checkpoint_ms_total"))
            if not data_journal:
                chk = sh.run([py, "-c", _CHECK_TREE, str(tree), str(fill_ops)], check=False)
                good, bad, left = (int(x) for x in chk.stdout.split())
                result.update(tree_dirs_ok=good, tree_dirs_wrong=bad, tree_dirs_unrenamed=left)
                if bad or left:
                    raise BenchError(f"after recovery {bad} directories wrong, {left} not renamed")
            result.update(stack.shutdown_checks())
            sh.note("the same image attached once more, nothing to replay: the baseline")
            result["clean_attach_seconds"] = round(stack.reattach(), 3)
            stack.detach()
            result["ext4_replay_seconds"] = round(result["reattach_seconds"] -
                                                  result["clean_attach_seconds"], 3)
            result["recovery_seconds"] = result.get("recovery_mount_seconds",
                                                    result["ext4_replay_seconds"])
            if result.get("e2fsck_exit") != 0 or result.get("nvstack_check_exit", 0) != 0:
                result.update(status="failed", reason=f"e2fsck -fn exit {result.get('e2fsck_exit')}"
                              f", nvstack check exit {result.get('nvstack_check_exit')}")
    finally:
        stack.teardown()
        _write(rundir / "result.json", result)
        stack.write_repro(f"recovery time of {fs_name} on {device} after a crash with a full "
                          f"journal; run as root")
    return result


def load(out: Path) -> list[dict]:
    """Every recovery result.json under OUT (sorted by path)."""
    res = []
    for p in sorted(out.glob("*/result.json")):
        try:
            res.append(json.loads(p.read_text()))
        except (OSError, ValueError):
            continue
    return res
