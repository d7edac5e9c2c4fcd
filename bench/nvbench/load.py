"""The load test (issue 17, section 3; not in CI): `bench/run load --out DIR [--duration 600]`.

One nvstack mount with its defaults (undo transactions, TempFFS, the NVRAM page cache with
relo write-back) over ext4 on the modeled hdd-7200 with `account` timing (the disk's model
runs, nothing sleeps), a small region (32 MiB) and low dirty watermarks (50 % / 30 %), so
that pressure transforms of temp files and write-back of dirty pages run all the time, under:

  - N Postmark instances (default 8), each in its own directory, each a loop of Postmark runs
    (600 files of 512 B - 16 KiB in 4 subdirectories, 4000 transactions, a new seed per run)
    until the duration is over: the live set of all instances is several times the region;
  - M fsx processes (default 2) from xfstests (`--fsx PATH`, $FSX; built by
    `scripts/posix-suites build --xfstests SRC`), each `--duration` long on its own file:
    fsx-0 with every operation fsx finds supported (its fallocate probe moves the file to
    ext4 at once: the page cache), fsx-1 without fallocate-family, clone and copy-range
    calls and with a close/reopen 1 in 50 (the file starts as a temp file in NVRAM and is
    moved by size or pressure while fsx verifies it);
  - a sampler: the daemon's /proc/PID/status (VmRSS, VmHWM, RssAnon, RssShmem) every second,
    `nvstack stat --json` every 10 s (samples.jsonl).

At the end (every wait bounded), the checks (result.json `checks`, each with its values):

  exits            every Postmark run and both fsx exited 0; fsx printed "operations
                   completed A-OK" and nothing of a mismatch (`checks.fsx`)
  errors           `nvstack stat` before the flush: errors <= requests for every operation,
                   no error on the data path (read, fsync, flush, release), and every
                   aborted transaction is of a named kind, each counted (`ABORT_KINDS`,
                   `error_check`: a WRITE attempt retried after pressure relief, a create
                   sent to the lower directory, a journal record left out, an asynchronous
                   fetch that found NVRAM full); the check lists each kind with its count
                   and the aborts no kind accounts for; fsx verifies every byte it wrote
  pressure         temp files were transformed by NVRAM pressure (or the background
                   transformer, --tempfile-background) and dirty pages written
                   back by the watermarks during the run (the test did what it is for)
  tempfiles        created = deleted in NVRAM + transformed + resident (every temp file is
                   accounted for), transformed = the sum of its reasons
  flush            after `nvstack flush`: pages_dirty = 0, files_resident = 0,
                   pages_resident = 0, undo slots in use = 0, open handles = 0, frames used =
                   the route profile's (0 or 1: nothing else left in the region but its
                   metadata)
  memory           the daemon's anonymous memory (RssAnon: its heap, without the mapped
                   region) in the last third of the run is at most 1.25 x + 16 MiB its peak
                   in the first third (no growth with time); peak VmHWM reported
  umount, check    `nvstack umount` exits 0; the region is clean, frames used = the route
                   profile's (`nvstack inspect --json`) and `nvstack check` exits 0 after it;
                   e2fsck -fn of the lower ext4 after `device detach` exits 0
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

from . import fs as fs_mod
from . import nvstack
from .shell import Shell
from .util import BenchError, fmt_size, parse_size

FSX_OK = re.compile(r"operations completed A-OK")
FSX_BAD = re.compile(r"(?i)\b(mismatch|bad data|LOG DUMP|short read|read bad|\bBAD\b)")
DATA_PATH_OPS = ("read", "write", "fsync", "flush", "release")


def add_arguments(p) -> None:
    p.add_argument("--out", type=Path, required=True, help="result directory")
    p.add_argument("--duration", type=float, default=600.0, help="seconds (default 600)")
    p.add_argument("--postmarks", type=int, default=8, help="concurrent Postmark loops (8)")
    p.add_argument("--fsx-procs", type=int, default=2, help="concurrent fsx processes (2)")
    p.add_argument("--fsx", help="the xfstests fsx binary (default $FSX, then "
                   "$XFSTESTS/ltp/fsx, then fsx on PATH)")
    p.add_argument("--nvram", default="32M", help="NVRAM region (default 32M)")
    p.add_argument("--dirty-high", type=int, default=50, help="write-back starts (percent)")
    p.add_argument("--dirty-low", type=int, default=30, help="write-back stops (percent)")
    p.add_argument("--device", default="hdd-7200", help="disk model or `none` (plain loop)")
    p.add_argument("--timing", choices=["sleep", "account"], default="account")
    p.add_argument("--disk", default="4G", help="size of the lower ext4 image")
    p.add_argument("--workdir", type=Path, default=Path("/var/tmp/nvbench-work"))
    p.add_argument("--mount-args", default="",
                   help="more `nvstack mount` options, e.g. '--tempfile-background 50'")
    p.add_argument("--echo", action="store_true", help="print every command as it runs")


def find_fsx(explicit: str | None) -> str:
    cands = [explicit, os.environ.get("FSX"),
             str(Path(os.environ["XFSTESTS"]) / "ltp" / "fsx") if os.environ.get("XFSTESTS")
             else None, shutil.which("fsx")]
    for c in cands:
        if c and os.access(c, os.X_OK):
            return c
    raise BenchError("fsx not found: build xfstests from a checkout you cloned yourself "
                     "(`scripts/posix-suites build --xfstests SRC`, docs/testing.md section 3), "
                     "then pass --fsx SRC/ltp/fsx or set FSX")


# ----- measurements and checks (pure functions: tests feed them samples) ---------------------
def read_status(pid: int) -> dict | None:
    """VmRSS, VmHWM, RssAnon, RssFile, RssShmem of a process in bytes (None if it is gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    return parse_status(text)


def parse_status(text: str) -> dict:
    out = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem"):
            parts = rest.split()
            if parts and parts[0].isdigit():
                out[key] = int(parts[0]) * (1024 if parts[1:2] == ["kB"] else 1)
    return out


def memory_check(samples: list[dict], slack_bytes: int = 16 << 20,
                 factor: float = 1.25) -> dict:
    """Bounded memory: the peak RssAnon of the last third of the samples (by time) is at most
    factor x the peak of the first third + slack. Samples: {"t", "RssAnon", "VmHWM", ...}."""
    mem = [s for s in samples if "RssAnon" in s]
    if len(mem) < 3:
        return {"ok": False, "reason": f"only {len(mem)} memory samples"}
    t0, t1 = mem[0]["t"], mem[-1]["t"]
    third = (t1 - t0) / 3
    first = max(s["RssAnon"] for s in mem if s["t"] <= t0 + third)
    last = max(s["RssAnon"] for s in mem if s["t"] >= t1 - third)
    bound = int(first * factor + slack_bytes)
    return {"ok": last <= bound, "rss_anon_peak_first_third": first,
            "rss_anon_peak_last_third": last, "bound": bound,
            "rss_anon_peak": max(s["RssAnon"] for s in mem),
            "vm_hwm_peak": max(s.get("VmHWM", 0) for s in mem),
            "vm_rss_peak": max(s.get("VmRSS", 0) for s in mem),
            "rss_shmem_peak": max(s.get("RssShmem", 0) for s in mem), "samples": len(mem)}


@dataclasses.dataclass(frozen=True)
class AbortKind:
    """One way an NVRAM transaction is rolled back under load without an error the
    application sees, and the counter of `nvstack stat --json` that counts it."""
    name: str           # the key in the check's `aborts_by_kind`
    counter: tuple      # the path of its counter in the stat document
    where: str          # the engine's code that aborts (crates/core/src)


# Every kind of aborted transaction the load test accounts for (`error_check`). A kind that
# nvstack gains goes here, with its counter, and into the engine test that holds every abort
# to these kinds (crates/core/tests/tempfs_engine.rs, `every_aborted_transaction_is_...`).
ABORT_KINDS = (
    AbortKind("write_retries", ("retries", "write"),
              "ops/io.rs write_retrying: a write attempt found NVRAM full (or its undo slot "
              "too small); room is made and the write tried again"),
    AbortKind("creates_sent_down", ("tempfiles", "created_in_lower_nvram_full"),
              "tempfs/ops.rs temp_create: the record of a new temp file found no frame; the "
              "file is created in the lower directory"),
    AbortKind("records_not_journaled", ("journal", "not_journaled"),
              "journal/mod.rs journaled_removal: a metadata-journal record found no frame; the "
              "change is applied without one and its objects marked unsynced"),
    AbortKind("fetches_failed", ("nbw", "fetches_failed"),
              "cache/nbw.rs fetch_patches -> complete_patch: an asynchronous fetch (--nbw "
              "async-bg, the default since 2026-11-28, or async-fg) read a patched page but its "
              "merge found no frame; the patch stays"),
)

# Rollbacks no counter of `nvstack stat` counts yet (each says so on the daemon's stderr, or
# not at all). One of them under load shows here as `aborts_unaccounted`: no number is made
# up for them.
UNCOUNTED_ABORTS = (
    "engine/routing.rs learn_route: the route profile's record finds no frame (stderr 'the "
    "route profile could not learn a file')",
    "engine/records.rs release_slot / free_empty_slots: freeing an empty record frame (stderr "
    "'an empty record frame was not freed')",
    "tempfs/rename.rs rename: a temp file renamed into a directory whose pending times need a "
    "frame; rolled back, the file transformed and renamed in the lower directory (counted only "
    "among `tempfiles.transformed.nvram_full`, with the write path's transforms)",
    "tempfs/transform.rs back_to_live, mark, free_step: a transform's record update or its "
    "final free (back_to_live silent; the others fail the transform: stderr 'transform "
    "failed' from a pressure or background round, else the error of the operation)",
    "cache/writeback.rs commit_batch and cache/ops.rs drop_cached: a write-back batch's or a "
    "deleted file's frees (stderr 'write-back failed', 'freeing the cached pages')",
    "journal/checkpoint.rs free_batch, tempfs/overlay/pending.rs settle_dir_times: frees of "
    "checkpointed records and settled directory times (stderr)",
    "engine/mod.rs Engine::op: any other operation that fails after its transaction began "
    "(an error answer, counted only in `errors` with the operation's other errors)",
)


def _counter(stat: dict, path: tuple) -> int:
    v = stat
    for k in path:
        v = v.get(k, {}) if isinstance(v, dict) else {}
    return v if isinstance(v, int) else 0


def abort_kinds(stat: dict) -> dict[str, int]:
    """Aborted transactions by kind (`ABORT_KINDS`), from a stat document. A stat without
    `retries` (before 2026-11-28) counted the retried write attempts as write errors."""
    kinds = {k.name: _counter(stat, k.counter) for k in ABORT_KINDS}
    if "retries" not in stat:
        kinds["write_retries"] = stat.get("errors", {}).get("write", 0)
    return kinds


def error_check(stat: dict) -> dict:
    """errors <= requests per operation; no error on the data path (read, write, fsync,
    flush, release); and every aborted transaction (`nvram.transactions_aborted`) is one of
    `ABORT_KINDS`, each of which is answered without an error: a write that finds NVRAM full
    aborts its transaction, relieves the pressure and tries again (`retries.write`; before
    2026-11-28 counted as write errors, and a stat without `retries` is read that way), a
    create goes to the lower directory, a metadata-journal record is left out, an
    asynchronous fetch leaves its patch. The check lists each kind with its count and passes
    only when they add up to the aborted transactions exactly: more aborts than the kinds
    count are `aborts_unaccounted` (a path of `UNCOUNTED_ABORTS`, or a new one), fewer mean a
    kind's counter counted something that aborted nothing (`journal.not_journaled` also
    counts records too large to journal, `nbw.fetches_failed` fetches whose lower read failed;
    the engine test in crates/core/tests/tempfs_engine.rs holds the engine to the sum)."""
    req, err = stat.get("requests", {}), stat.get("errors", {})
    aborted = stat.get("nvram", {}).get("transactions_aborted", 0)
    over = {op: (n, req.get(op, 0)) for op, n in err.items() if n > req.get(op, 0)}
    legacy = "retries" not in stat         # write attempts were counted as write errors
    data = {op: err[op] for op in DATA_PATH_OPS if err.get(op) and not (legacy and op == "write")}
    kinds = abort_kinds(stat)
    accounted = sum(kinds.values())
    gap = aborted - accounted
    if gap > 0:
        why = (f"{gap:,} of {aborted:,} aborted transactions are of no counted kind (not "
               + " + ".join(f"{k} {v:,}" for k, v in kinds.items())
               + "): see load.UNCOUNTED_ABORTS and the daemon's stderr")
    elif gap < 0:
        why = (f"the kinds count {-gap:,} more than the {aborted:,} aborted transactions: a "
               "counter counted something that aborted nothing")
    else:
        why = ""
    return {"ok": not over and not data and gap == 0,
            "errors": err, "errors_over_requests": over, "data_path_errors": data,
            "aborts_by_kind": kinds, "transactions_aborted": aborted,
            "aborts_unaccounted": gap, **({"gap": why} if why else {}),
            "requests_total": sum(req.values()), "errors_total": sum(err.values())}


def tempfiles_check(stat: dict) -> dict:
    t = stat.get("tempfiles", {})
    reasons = t.get("transformed", {})
    created, deleted = t.get("created", 0), t.get("deleted_in_nvram", 0)
    total, resident = t.get("transformed_total", 0), t.get("files_resident", 0)
    ok = created == deleted + total + resident and total == sum(reasons.values())
    return {"ok": ok, "created": created, "deleted_in_nvram": deleted,
            "transformed_total": total, "files_resident": resident,
            "transformed_by_reason": reasons}


def pressure_check(before: dict, after: dict) -> dict:
    """Pressure transforms and watermark write-back happened during the run."""
    def get(d, *path):
        for k in path:
            d = d.get(k, {}) if isinstance(d, dict) else {}
        return d if isinstance(d, (int, float)) else 0
    pt = get(after, "tempfiles", "transformed", "pressure") - \
        get(before, "tempfiles", "transformed", "pressure")
    nf = get(after, "tempfiles", "transformed", "nvram_full") - \
        get(before, "tempfiles", "transformed", "nvram_full")
    bg = get(after, "tempfiles", "transformed", "background") - \
        get(before, "tempfiles", "transformed", "background")
    wr = get(after, "writeback", "rounds", "pressure") - get(before, "writeback", "rounds", "pressure")
    wf = get(after, "writeback", "rounds", "nvram_full") - \
        get(before, "writeback", "rounds", "nvram_full")
    # (watermark rounds run in the daemon's background writer by default since 2026-11-28,
    # in the writer's request with --writeback-background off)
    wb = get(after, "writeback", "rounds", "background") - \
        get(before, "writeback", "rounds", "background")
    pw = get(after, "writeback", "pages_written") - get(before, "writeback", "pages_written")
    return {"ok": pt + nf + bg > 0 and wr + wf + wb > 0, "pressure_transforms": pt,
            "nvram_full_transforms": nf, "background_transforms": bg,
            "writeback_pressure_rounds": wr, "writeback_background_rounds": wb,
            "writeback_nvram_full_rounds": wf, "pages_written_back": pw}


def profile_frames(stat: dict) -> int:
    """Frames that stay in use after a flush and an unmount: the route profile (at most one
    record, made when the first file is learned; its entries are only ever replaced, so it
    exists exactly when it names a file - design.md section 14)."""
    return 1 if stat.get("passthrough", {}).get("profile_files", 0) > 0 else 0


def flush_check(stat: dict) -> dict:
    n, t, w = stat.get("nvram", {}), stat.get("tempfiles", {}), stat.get("writeback", {})
    vals = {"pages_dirty": w.get("pages_dirty"), "files_resident": t.get("files_resident"),
            "pages_resident": t.get("pages_resident"),
            "undo_slots_in_use": n.get("undo_slots_in_use"),
            "open_handles": stat.get("open_handles"), "frames_used": n.get("frames_used"),
            "profile_frames": profile_frames(stat),
            "cache_files": stat.get("cache", {}).get("files")}
    ok = all(vals[k] == 0 for k in ("pages_dirty", "files_resident", "pages_resident",
                                    "undo_slots_in_use", "open_handles")) \
        and vals["frames_used"] == vals["profile_frames"]
    return {"ok": ok, **vals}


def fsx_check(outputs: list[dict]) -> dict:
    bad = []
    for o in outputs:
        text = o.get("output", "")
        if o.get("exit") != 0 or not FSX_OK.search(text) or FSX_BAD.search(text):
            bad.append({"name": o.get("name"), "exit": o.get("exit"), "tail": text[-400:]})
    return {"ok": not bad and bool(outputs), "processes": len(outputs), "failed": bad,
            "operations": [o.get("operations") for o in outputs]}


def fsx_operations(text: str) -> int | None:
    m = re.search(r"All (\d+) operations completed A-OK", text)
    return int(m.group(1)) if m else None


# ----- the run ---------------------------------------------------------------------------------
def postmark_config(location: Path, seed: int) -> str:
    return "\n".join([f"set location {location}", "set number 600", "set transactions 4000",
                      "set size 512 16384", "set subdirectories 4", f"set seed {seed}",
                      "set report terse", "run", "quit"]) + "\n"


def _postmark_loop(i: int, mnt: Path, out: Path, deadline: float, runs: list, stop) -> None:
    loc = mnt / f"pm-{i}"
    loc.mkdir(parents=True, exist_ok=True)
    k = 0
    while time.monotonic() < deadline and not stop.is_set():
        k += 1
        cfg = out / f"pm-{i}" / f"run{k}.cfg"
        cfg.parent.mkdir(parents=True, exist_ok=True)
        # inside its directory with a relative location: Postmark garbles a location past 80
        # characters (workloads/postmark.py), and reports failed operations only as "Error:"
        # lines with exit 0 - counted as a failed run here
        cfg.write_text(postmark_config(Path("."), 1000 * i + k))
        t0 = time.monotonic()
        try:
            p = subprocess.run(["postmark", str(cfg)], capture_output=True, text=True, cwd=loc,
                               timeout=max(60.0, deadline - time.monotonic()) + 900)
            rc, text = p.returncode, p.stdout + p.stderr
            if rc == 0 and any(ln.startswith("Error:") for ln in text.splitlines()):
                rc = 1
        except subprocess.TimeoutExpired as exc:
            rc, text = 124, f"timed out: {exc}"
        runs.append({"name": f"pm-{i}", "run": k, "exit": rc, "seconds": time.monotonic() - t0,
                     "tail": text[-300:] if rc else ""})
        if rc != 0:
            (out / f"pm-{i}" / f"run{k}.out").write_text(text)


def _fsx_proc(j: int, fsx: str, mnt: Path, out: Path, duration: float, results: list) -> None:
    d = mnt / f"fsx-{j}"
    d.mkdir(parents=True, exist_ok=True)
    logdir = out / f"fsx-{j}"
    logdir.mkdir(parents=True, exist_ok=True)
    flags = (["-S", "7"] if j % 2 == 0 else
             ["-S", str(9 + j), "-F", "-H", "-z", "-C", "-I", "-J", "-B", "-E", "-0", "-u",
              "-K", "-c", "50"])
    argv = [fsx, f"--duration={int(duration)}", "-q", "-P", str(logdir), *flags,
            str(d / "fsx.file")]
    (logdir / "cmd.txt").write_text(" ".join(argv) + "\n")
    t0 = time.monotonic()
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=duration + 900)
        rc, text = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as exc:
        rc, text = 124, f"timed out: {exc}"
    (logdir / "output.txt").write_text(text)
    results.append({"name": f"fsx-{j}", "exit": rc, "seconds": time.monotonic() - t0,
                    "output": text[-4000:], "operations": fsx_operations(text), "argv": argv})


def _sampler(pid: int, nv: str, mnt: Path, out: Path, stop, samples: list, stats: list) -> None:
    t0 = time.monotonic()
    next_stat = t0
    with open(out / "samples.jsonl", "w") as f:
        while not stop.is_set():
            now = time.monotonic()
            st = read_status(pid)
            if st is not None:
                st["t"] = round(now - t0, 2)
                samples.append(st)
                f.write(json.dumps(st) + "\n")
            if now >= next_stat:
                next_stat = now + 10
                stat = _nv_stat(nv, mnt)
                if stat is not None:
                    rec = {"t": round(now - t0, 2), "frames_used": stat["nvram"]["frames_used"],
                           "pages_dirty": stat["writeback"]["pages_dirty"],
                           "files_resident": stat["tempfiles"]["files_resident"],
                           "transformed": stat["tempfiles"]["transformed_total"],
                           "pages_written": stat["writeback"]["pages_written"]}
                    stats.append(rec)
                    f.write(json.dumps({"stat": rec}) + "\n")
            f.flush()
            stop.wait(1.0)


def _nv_stat(nv: str, mnt: Path) -> dict | None:
    try:
        p = subprocess.run([nv, "stat", str(mnt), "--json"], capture_output=True, text=True,
                           timeout=60)
        return json.loads(p.stdout) if p.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def main(args) -> int:
    if os.geteuid() != 0:
        raise BenchError("the load test mounts file systems and attaches loop devices: run as root")
    fsx = find_fsx(args.fsx)
    if not shutil.which("postmark"):
        raise BenchError("postmark not installed (bench/install.sh)")
    caps = nvstack.probe()
    if caps.missing("mount") or (args.device != "none" and caps.missing("device")):
        raise BenchError(caps.missing("mount") or caps.missing("device"))
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    base = fs_mod.CONFIGS["nvstack-ext4-defaults"]
    cfg = dataclasses.replace(base, name="nvstack-ext4-load", nvstack={
        **base.nvstack, "args": ["--dirty-high", str(args.dirty_high),
                                 "--dirty-low", str(args.dirty_low), *args.mount_args.split()]})
    sh = Shell(echo=args.echo)
    sh.param(str(out), "RUN", "$(mktemp -d /tmp/nvbench-load.XXXXXX)")
    run_id = f"load-{os.getpid()}"
    lay = fs_mod.Layout(args.workdir.resolve() / run_id, run_id)
    nvram = parse_size(args.nvram)
    target = fs_mod.Target(sh, cfg, args.device, lay, parse_size(args.disk), 0, nvram,
                           args.timing, caps, None, out)
    result = {"duration_s": args.duration, "postmarks": args.postmarks,
              "fsx_processes": args.fsx_procs, "fsx": fsx, "nvram_bytes": nvram,
              "dirty_high": args.dirty_high, "dirty_low": args.dirty_low,
              "mount_args": args.mount_args,
              "device": args.device, "timing": args.timing, "disk": args.disk,
              "nvstack": caps.binary, "nvstack_version": caps.version, "status": "ok",
              "checks": {}}
    checks = result["checks"]
    print(f"load: nvstack (defaults, region {fmt_size(nvram)}, dirty {args.dirty_high}/"
          f"{args.dirty_low} %{', ' + args.mount_args if args.mount_args else ''}) over ext4 "
          f"on {args.device} ({args.timing}); "
          f"{args.postmarks} Postmark loops + {args.fsx_procs} fsx for {args.duration:g} s",
          flush=True)
    stop = threading.Event()
    threads: list[threading.Thread] = []
    try:
        mnt = target.setup()
        pid = target.fuse_pid()
        result["daemon_pid"] = pid
        stat_start = _nv_stat(caps.binary, mnt) or {}
        samples, stats, pm_runs, fsx_out = [], [], [], []
        sampler = threading.Thread(target=_sampler, args=(pid, caps.binary, mnt, out, stop,
                                                          samples, stats), daemon=True)
        sampler.start()
        t0 = time.monotonic()
        deadline = t0 + args.duration
        sh.note(f"{args.postmarks} Postmark loops (600 files, 4000 tx, seed 1000*i+k per run) "
                f"and {args.fsx_procs} x {fsx} --duration={int(args.duration)} on {mnt}: "
                f"run by bench/run load (nvbench/load.py)")
        for i in range(args.postmarks):
            threads.append(threading.Thread(target=_postmark_loop,
                                            args=(i, mnt, out, deadline, pm_runs, stop)))
        for j in range(args.fsx_procs):
            threads.append(threading.Thread(target=_fsx_proc,
                                            args=(j, fsx, mnt, out, args.duration, fsx_out)))
        for t in threads:
            t.start()
        last = 0.0
        while any(t.is_alive() for t in threads):
            time.sleep(1.0)
            el = time.monotonic() - t0
            if el - last >= 60:
                last = el
                mem = samples[-1] if samples else {}
                st = stats[-1] if stats else {}
                print(f"  {el:5.0f} s: {len(pm_runs)} Postmark runs done "
                      f"({sum(r['exit'] != 0 for r in pm_runs)} failed), daemon RSS "
                      f"{mem.get('VmRSS', 0) >> 20} MiB (anon {mem.get('RssAnon', 0) >> 20}), "
                      f"frames used {st.get('frames_used')}, dirty {st.get('pages_dirty')}, "
                      f"transformed {st.get('transformed')}", flush=True)
            if el > args.duration + 1800:
                raise BenchError("workers still running 30 min after the duration")
        result["wall_seconds"] = round(time.monotonic() - t0, 1)
        stop.set()
        sampler.join(timeout=30)
        # --- checks on the live mount
        stat_end = _nv_stat(caps.binary, mnt)
        if stat_end is None:
            raise BenchError("nvstack stat failed at the end of the run")
        (out / "nvstack_stat_end.json").write_text(json.dumps(stat_end, indent=2))
        failed_pm = [r for r in pm_runs if r["exit"] != 0]
        checks["exits"] = {"ok": not failed_pm and bool(pm_runs),
                           "postmark_runs": len(pm_runs), "postmark_failed": failed_pm[:10],
                           "postmark_runs_per_instance": {
                               f"pm-{i}": sum(r["name"] == f"pm-{i}" for r in pm_runs)
                               for i in range(args.postmarks)}}
        checks["fsx"] = fsx_check(fsx_out)
        checks["errors"] = error_check(stat_end)
        checks["pressure"] = pressure_check(stat_start, stat_end)
        checks["memory"] = memory_check(samples)
        fl = sh.run([caps.binary, "flush", str(mnt), "--quiet"], check=False, timeout=1800)
        result["flush_output"] = (fl.stdout + fl.stderr).strip()[-300:]
        stat_fl = _nv_stat(caps.binary, mnt) or {}
        (out / "nvstack_stat_flushed.json").write_text(json.dumps(stat_fl, indent=2))
        checks["tempfiles"] = tempfiles_check(stat_fl)
        checks["flush"] = {**flush_check(stat_fl), "exit": fl.returncode}
        checks["flush"]["ok"] = checks["flush"]["ok"] and fl.returncode == 0
        result["counters"] = {"requests_total": checks["errors"]["requests_total"],
                              "transactions_committed": stat_fl.get("nvram", {}).get(
                                  "transactions_committed"),
                              "transactions_aborted": stat_fl.get("nvram", {}).get(
                                  "transactions_aborted"),
                              "frames_total": stat_fl.get("nvram", {}).get("frames_total"),
                              "lower_bytes_written": stat_fl.get("lower", {}).get("bytes_written"),
                              "app_bytes_written": stat_fl.get("app", {}).get("bytes_written")}
        # --- unmount, then the offline checks
        um = sh.run([caps.binary, "umount", str(mnt)], check=False, timeout=1800)
        try:
            target.daemon.wait(timeout=120)
        except subprocess.TimeoutExpired:
            pass
        ins = sh.run([caps.binary, "inspect", "--nvram", str(lay.nvram), "--json"], check=False,
                     timeout=300)
        ck = sh.run([caps.binary, "check", "--nvram", str(lay.nvram)], check=False, timeout=600)
        try:
            insj = json.loads(ins.stdout)
        except ValueError:
            insj = {}
        checks["umount"] = {"ok": um.returncode == 0 and ck.returncode == 0
                            and insj.get("frames_used") == profile_frames(stat_fl)
                            and insj.get("state", {}).get("clean") is True,
                            "umount_exit": um.returncode, "check_exit": ck.returncode,
                            "check_output": (ck.stdout + ck.stderr).strip()[-300:],
                            "frames_used_after_umount": insj.get("frames_used"),
                            "profile_frames": profile_frames(stat_fl),
                            "region_clean": insj.get("state", {}).get("clean")}
        if args.device != "none" and target.device_mnt is not None:
            sh.run([caps.binary, "device", "stat", str(target.device_mnt), "--json"],
                   stdout=out / "device_stat_end.json", check=False)
            sh.run([caps.binary, "device", "detach", str(target.device_mnt)], check=False,
                   timeout=900)
            fsck = sh.run(["e2fsck", "-fn", str(lay.image)], check=False, timeout=900)
            (out / "e2fsck.txt").write_text(fsck.stdout + fsck.stderr)
            checks["e2fsck"] = {"ok": fsck.returncode == 0, "exit": fsck.returncode}
    except BenchError as exc:
        result.update(status="failed", reason=str(exc)[:2000])
    except BaseException:
        result.update(status="failed", reason="interrupted (Ctrl-C or signal)")
        raise
    finally:
        stop.set()
        sh.phase = "cleanup"
        errs = target.teardown()
        if errs:
            result["teardown_errors"] = errs
        bad = [k for k, c in checks.items() if not c.get("ok")]
        if bad and result["status"] == "ok":
            result.update(status="failed", reason="checks failed: " + ", ".join(bad))
        (out / "result.json").write_text(json.dumps(result, indent=2, sort_keys=True,
                                                    default=str) + "\n")
        (out / "summary.md").write_text(summary_text(result) + "\n")
        repro = out / "repro.sh"
        repro.write_text(sh.repro_script("load test: setup and checks (the workers are run by "
                                         "bench/run load itself)"))
        repro.chmod(0o755)
        if target.interrupted:
            raise target.interrupted
    print(summary_text(result))
    return 0 if result["status"] == "ok" else 1


def summary_text(r: dict) -> str:
    c = r.get("checks", {})
    mem = c.get("memory", {})
    lines = [f"# Load test: {r['status'].upper()}" + (f" ({r.get('reason')})" if r.get("reason") else ""),
             "",
             f"nvstack defaults over ext4 on {r['device']} ({r['timing']} timing), region "
             f"{fmt_size(r['nvram_bytes'])}, dirty watermarks {r['dirty_high']} / "
             f"{r['dirty_low']} %"
             + (f", `{r['mount_args']}`" if r.get("mount_args") else "")
             + f"; {r['postmarks']} Postmark loops + {r['fsx_processes']} fsx, "
             f"{r['duration_s']:g} s (wall {r.get('wall_seconds', '?')} s).", "",
             "| check | ok | values |", "|---|---|---|"]
    for name, chk in c.items():
        vals = {k: v for k, v in chk.items() if k != "ok" and not isinstance(v, (list, dict))
                or k in ("transformed_by_reason", "data_path_errors", "errors",
                         "aborts_by_kind")}
        text = ", ".join(f"{k} {_human(k, v)}" for k, v in vals.items())
        lines.append(f"| {name} | {'yes' if chk.get('ok') else '**NO**'} | {text} |")
    if mem.get("vm_hwm_peak"):
        lines += ["", f"Daemon memory: peak VmHWM {mem['vm_hwm_peak'] / 2**20:.1f} MiB (the "
                  f"{fmt_size(r['nvram_bytes'])} region mapping counts as RssShmem, peak "
                  f"{mem['rss_shmem_peak'] / 2**20:.1f} MiB), peak RssAnon "
                  f"{mem['rss_anon_peak'] / 2**20:.1f} MiB (first third "
                  f"{mem['rss_anon_peak_first_third'] / 2**20:.1f}, last third "
                  f"{mem['rss_anon_peak_last_third'] / 2**20:.1f})."]
    counters = r.get("counters")
    if counters:
        lines += ["", "Counters after the flush: " + ", ".join(f"{k} {v:,}" if isinstance(v, int)
                                                              else f"{k} {v}"
                                                              for k, v in counters.items())]
    return "\n".join(lines)


def _human(key: str, v) -> str:
    if isinstance(v, int) and ("rss" in key or "hwm" in key or key == "bound"):
        return f"{v / 2**20:.1f} MiB"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)
