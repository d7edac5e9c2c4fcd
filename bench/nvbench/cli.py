"""Command line of the harness (bench/run)."""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import shlex
import sys
from pathlib import Path

from .util import BENCH_DIR, BenchError, parse_size

EPILOG = """\
stages (each reads only what the previous one wrote):
  run/smoke  -> OUT/runs/**/ (raw stdout/stderr, cmd.txt, env.json, repro.sh, result.json)
                and OUT/raw.tar.xz (the runs, packed: what git keeps; runs/ is gitignored)
  parse OUT  -> OUT/<experiment>.csv (unpacks OUT/raw.tar.xz first if OUT/runs/ is missing)
  plot OUT   -> OUT/*.png and OUT/summary.md (never runs a benchmark)

run, smoke, showcase (unless --no-plot) and plot need matplotlib: bench/install.sh puts it in
bench/.venv, which bench/run then uses by itself.

examples:
  bench/run list                                   experiments, file systems, capabilities
  bench/run smoke --out /tmp/smoke                 2 FS x small Postmark, minutes (root)
  bench/run smoke --out /tmp/smoke --device none   same on a plain loop device
  bench/run run thesis-postmark --dry-run          print the matrix, run nothing
  bench/run run thesis-postmark --out bench/results/tp --scale 0.1 --reps 2
  bench/run run tempffs-postmark --out bench/results/tempffs-postmark   (TempFFS acceptance)
  bench/run run writeback-policies --out bench/results/writeback-policies   (write-back policies)
  bench/run parse bench/results/tp && bench/run plot bench/results/tp

fairness: every run gets a memory budget M (a cgroup v1 memory limit holding the benchmark,
and for nvstack also the daemon and its NVRAM region); caches are dropped before each timed
workload; see bench/README.md.
"""


def _common(p: argparse.ArgumentParser, default_out: str | None) -> None:
    p.add_argument("--out", type=Path, default=default_out,
                   help="result directory (runs/, CSV, PNG, summary.md)"
                        + ("" if default_out else "; default bench/results/<experiment>-<time>"))
    p.add_argument("--device", help="disk model for `nvstack device attach` (hdd-7200, hdd-15k, "
                   "hdd-7200-500g, ssd) or `none` for a plain loop device; default: the "
                   "experiment's model, falling back to `none` (noted loudly) if unavailable")
    p.add_argument("--timing", choices=["sleep", "account"], default="sleep",
                   help="modeled disk: really sleep for modeled service time, or only account it")
    p.add_argument("--memory", help="memory budget M per run, e.g. 256M (default: experiment's)")
    p.add_argument("--nvram", help="NVRAM region size for nvstack runs (default M/2, inside M)")
    p.add_argument("--scale", type=float, help="multiply the papers' counts (default: experiment's)")
    p.add_argument("--disk", help="size of the disk image the file systems are made on, e.g. 8G "
                   "(default: the experiment's; a larger --scale may need more, e.g. nbw at "
                   "scale 1 lays out a 5 GiB file)")
    p.add_argument("--reps", type=int, help="repetitions per configuration")
    p.add_argument("--transactions", type=int, help="Postmark transactions per run, absolute "
                   "(not multiplied by --scale); default: the paper's count x scale")
    p.add_argument("--seconds", type=float, help="run time of the time-limited workloads "
                   "(sqlite, maildir, applog), absolute; default: theirs (10 s) x scale")
    p.add_argument("--workdir", type=Path, default=Path("/var/tmp/nvbench-work"),
                   help="where disk images and mount points live (removed after each run)")
    p.add_argument("--no-floor", action="store_true",
                   help="do not measure the FUSE round trip before and after the runs "
                   "(bench/tools/fuse-floor, ~10 s each; kept in experiment.json and printed "
                   "in the summaries)")
    p.add_argument("--dry-run", action="store_true",
                   help="execute nothing: write the run directories (inputs, repro.sh) and "
                        "print the matrix")
    p.add_argument("--echo", action="store_true", help="print every command as it runs")
    p.add_argument("--no-plot", action="store_true", help="stop after the runs (no parse/plot)")
    p.add_argument("--fs", help="comma-separated subset of the experiment's file-system "
                   "configurations (default: all of them)")
    p.add_argument("--workloads", help="comma-separated subset of the experiment's workloads "
                   "as module:config, e.g. fio:wb-zipf-rewrite (default: all of them)")
    p.add_argument("--nvstack-args", default="", metavar="'ARGS'",
                   help="mount options appended to every nvstack mount of the run, e.g. "
                   "--nvstack-args='--writeback-background on' (write it with `=`: the value "
                   "starts with --); an option a configuration sets itself is refused; "
                   "recorded in experiment.json and every run's env.json")
    p.add_argument("--variants", help="comma-separated subset of the workloads' variants by "
                   "name, e.g. files=2500 for one Postmark file count (names as in the run "
                   "directories; default: all of them)")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="bench/run", description="nvstack benchmark harness: "
                                 "run experiments, parse raw outputs to CSV, plot figures.",
                                 epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    p = sub.add_parser("smoke", help="run the smoke matrix (ext2, ext4-ordered x small "
                       "Postmark), then parse and plot", formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(p, None)
    p = sub.add_parser("showcase", help="the README demo: applications that wait for "
                       "durability on ext4 vs nvstack over ext4 (modeled hdd-7200), a power "
                       "cut in the middle of sqlite, the async Postmark comparison; prints the "
                       "tables, writes OUT/showcase.txt and OUT/showcase.png")
    _common(p, None)
    p.add_argument("--parts", default="durability,powercut,postmark",
                   help="comma-separated subset of durability, powercut, postmark")
    p.add_argument("--cut-after", type=float, default=8.0,
                   help="seconds of sqlite commits before the power cut (default 8)")
    p = sub.add_parser("durability", help="issue 13's benchmark: the experiment `durability` "
                       "(ext4 vs nvstack undo/journal on hdd-7200 and ssd in one run) and the "
                       "recovery times after a crash with a full journal; CSV, summary.md with "
                       "the goals, PNG")
    _common(p, None)
    p.add_argument("--quick", action="store_true", help="the experiment durability-quick "
                   "(1 s loops, counts x 0.1: ~5 min) and a recovery fill of 900 operations")
    p.add_argument("--parts", default="matrix,recovery",
                   help="comma-separated subset of matrix, recovery")
    p = sub.add_parser("powercut", help="whole-stack power cuts with real applications "
                       "(sqlite WAL and DELETE, Maildir delivery, editor save): SIGKILL of the "
                       "daemon + `nvstack device cut`, recovery, every acknowledged commit "
                       "checked; results in OUT/runs/powercut/, OUT/powercut.json")
    p.add_argument("--out", type=Path, required=True, help="result directory")
    p.add_argument("--fs", default=",".join(POWERCUT_FS),
                   help=f"configurations (default {','.join(POWERCUT_FS)})")
    p.add_argument("--apps", default=",".join(POWERCUT_APPS), help="applications among "
                   "sqlite-wal, sqlite-delete, maildir, editor, editor-dirsync (default: "
                   f"{','.join(POWERCUT_APPS)}; `editor` = the editor's save acknowledged at "
                   "the rename - where a configuration promises only an fsync'ed directory "
                   "(ext4, nvstack journal mode) it runs as editor-dirsync)")
    p.add_argument("--seeds", default="1,2,3", help="device cut seeds, one cut each")
    p.add_argument("--cut-after", type=float, default=4.0, help="seconds of transactions "
                   "before the cut (default 4)")
    p.add_argument("--device", default="hdd-7200")
    p.add_argument("--timing", choices=["sleep", "account"], default="account")
    p.add_argument("--nvram", default="256M")
    p.add_argument("--flush-after-init", action="store_true", help="nvstack: `nvstack flush` "
                   "after the application's files are made (their creation is then in the "
                   "lower FS before the cut: a diagnostic variant, named ...-flushed)")
    p.add_argument("--workdir", type=Path, default=Path("/var/tmp/nvbench-work"))
    p.add_argument("--echo", action="store_true")
    p = sub.add_parser("load", help="the load test (not in CI): 8 Postmark instances and 2 fsx "
                       "on one nvstack mount with a small region for --duration seconds; "
                       "checks exits, fsx, the daemon's memory, counters, nvstack check")
    from . import load as load_mod
    load_mod.add_arguments(p)
    p = sub.add_parser("run", help="run one experiment (see `list`), then parse and plot")
    p.add_argument("experiment")
    _common(p, None)
    p = sub.add_parser("figure", help="draw one of the thesis' chapter-4 figures (4.1-4.19) "
                       "from a result directory (--from), or run its experiment first",
                       description="Draws thesis figure N as OUT/thesis-fig-N.png. With --from "
                       "DIR it draws from DIR (an experiment's result directory; its CSV is "
                       "parsed first when missing) and runs nothing. Without --from it runs the "
                       "figure's experiment, restricted to the figure's configurations, into "
                       "OUT/<experiment>/ with the run options below, then draws. With --from, "
                       "--fs names the configurations drawn (e.g. to leave out rows measured "
                       "under conditions since found wrong); the others still pair ratios.")
    p.add_argument("number", help="figure number, e.g. 4.18 (`bench/run figure list` lists "
                   "them with their experiments)")
    p.add_argument("--from", dest="source", type=Path, action="append",
                   help="result directory to draw from; the matrix figures (4.15, 4.18) and "
                   "the bar figures (Bonnie++, untar, Postmark 512 B-2 MB) take several "
                   "(--from A --from B): each configuration from the last directory that has "
                   "it, its ratios paired with that directory's baselines")
    _common(p, "docs/figures")
    p = sub.add_parser("parse", help="raw run directories -> OUT/<experiment>.csv (unpacks "
                       "OUT/raw.tar.xz first when OUT/runs/ is missing)")
    p.add_argument("rundir", type=Path)
    p = sub.add_parser("pack", help="OUT/runs/ -> OUT/raw.tar.xz, the form git keeps (run "
                       "does this itself; for runs that were interrupted or edited)")
    p.add_argument("resultdir", type=Path)
    p = sub.add_parser("plot", help="CSVs -> PNG figures + summary.md (never runs benchmarks)")
    p.add_argument("resultdir", type=Path)
    sub.add_parser("list", help="experiments, file-system configurations, workloads, and which "
                   "tools are available here")
    return ap


def cmd_list() -> int:
    from . import cgroup, nvstack
    from .experiments import EXPERIMENTS
    from .fs import CONFIGS
    from .util import which
    caps = nvstack.probe()
    print("experiments:")
    for e in EXPERIMENTS.values():
        optional = f" (with --fs also: {', '.join(e.optional_fs)})" if e.optional_fs else ""
        print(f"  {e.name:20s} {e.description}\n  {'':20s} fs: {', '.join(e.fs)}{optional}\n"
              f"  {'':20s} M={e.memory} NVRAM={e.nvram or 'M/2'} scale={e.scale} reps={e.reps} "
              f"device={e.device}; {e.estimate}")
    print("\nfile-system configurations:")
    for c in CONFIGS.values():
        print(f"  {c.name:30s} {c.label:22s} {c.description}")
    print("\navailable here:")
    for tool in ("postmark", "fio", "bonnie++", "losetup", "mke2fs", "mkfs.vfat", "tar", "xz"):
        print(f"  {tool:12s} {which(tool) or 'MISSING'}")
    print(f"  nvstack      {caps.binary or 'MISSING'}; device: "
          f"{'yes' if caps.device else 'no (' + caps.reasons.get('device', '') + ')'}; mount: "
          f"{'yes' if caps.mount else 'no (' + caps.reasons.get('mount', '') + ')'}")
    print(f"  cgroup v1 memory controller writable: {cgroup.available()}")
    return 0


def require_plotting() -> None:
    """Fails with one line saying what to install when the plotting modules are missing
    (checked before an experiment starts, not after hours of runs)."""
    try:
        import matplotlib  # noqa: F401
        import numpy  # noqa: F401
    except ImportError as exc:
        venv = BENCH_DIR / ".venv"
        where = (f"from {venv}" if Path(sys.prefix).resolve() == venv.resolve()
                 else f"for {sys.executable} (no {venv})" if not venv.exists()
                 else f"for {sys.executable}")
        raise BenchError(f"Python module {exc.name or 'matplotlib'} is missing {where}: run "
                         f"bench/install.sh (root; --no-apt installs only the Python packages), "
                         f"then bench/run again") from None


def cmd_run(name: str, args, out: Path | None = None) -> int:
    from . import archive, parse, runner, summary
    from .experiments import EXPERIMENTS
    if not args.no_plot:
        require_plotting()
    if name not in EXPERIMENTS:
        raise BenchError(f"unknown experiment {name!r}; `bench/run list` shows them")
    exp = EXPERIMENTS[name]
    if getattr(args, "disk", None):
        try:
            parse_size(args.disk)   # a bad size fails here, before any run
        except ValueError as e:
            raise BenchError(f"--disk: {e}") from None
        exp = dataclasses.replace(exp, disk=args.disk)
    if args.fs:
        wanted = [f.strip() for f in args.fs.split(",") if f.strip()]
        unknown = [f for f in wanted if f not in exp.fs + exp.optional_fs]
        if unknown:
            raise BenchError(f"--fs: {', '.join(unknown)} not in experiment {name} "
                             f"({', '.join(exp.fs + exp.optional_fs)})")
        exp = dataclasses.replace(exp, fs=wanted)
    if args.workloads:
        wanted = [w.strip() for w in args.workloads.split(",") if w.strip()]
        known = {f"{m}:{c}": (m, c) for m, c in exp.workloads}
        unknown = [w for w in wanted if w not in known]
        if unknown:
            raise BenchError(f"--workloads: {', '.join(unknown)} not in experiment {name} "
                             f"({', '.join(known)})")
        exp = dataclasses.replace(exp, workloads=[known[w] for w in wanted])
    out = out or args.out or BENCH_DIR / "results" / f"{name}-{_dt.datetime.now():%Y%m%d-%H%M%S}"
    st = runner.Settings(out=out.resolve(), device=args.device or exp.device, timing=args.timing,
                         memory=parse_size(args.memory) if args.memory else None,
                         scale=args.scale, reps=args.reps, workdir=args.workdir.resolve(),
                         dry_run=args.dry_run, echo=args.echo,
                         nvram=parse_size(args.nvram) if args.nvram else None,
                         overrides={k: v for k, v in (("transactions", args.transactions),
                                                      ("seconds", args.seconds)) if v},
                         variants=[v.strip() for v in args.variants.split(",") if v.strip()]
                         if args.variants else None,
                         floor=not getattr(args, "no_floor", False),
                         nvstack_args=shlex.split(getattr(args, "nvstack_args", "")))
    if archive.unpack(st.out):
        print(f"unpacked {st.out / archive.ARCHIVE} (earlier runs; the new ones join them)")
    results = runner.run_experiment(exp, st, args.device)
    if not args.dry_run:
        archive.pack(st.out)
    counts = {s: sum(r["status"] == s for r in results)
              for s in ("ok", "failed", "skipped", "dry-run")}
    print(f"{len(results)} runs: {counts['ok']} ok, {counts['failed']} failed, "
          f"{counts['skipped']} skipped, {counts['dry-run']} dry-run -> {out}")
    if args.no_plot:
        return 0
    from . import plot
    parse.parse_tree(st.out)
    pngs = plot.plot_dir(st.out)
    path = summary.write(st.out)
    print(f"wrote {len(list(st.out.glob('*.csv')))} CSV, {len(pngs)} PNG, {path}")
    return 1 if counts["failed"] else 0


def cmd_figure(args) -> int:
    """`bench/run figure N`: see its --help."""
    from . import thesis_figures as tf
    if args.number == "list":
        for f in tf.FIGURES.values():
            print(f"  {f.number:5s} {f.experiment:20s} {f.title}")
        return 0
    if args.number not in tf.FIGURES:
        raise BenchError(f"figure {args.number}: not one the harness draws "
                         f"({', '.join(tf.FIGURES)}; 4.9 has no experiment)")
    require_plotting()
    fig = tf.FIGURES[args.number]
    out = (args.out or BENCH_DIR.parent / "docs" / "figures").resolve()
    sources = args.source
    if sources is None:
        source = out / fig.experiment
        if fig.fs and not args.fs:
            args.fs = ",".join(fig.fs)
        args.no_plot = True
        rc = cmd_run(fig.experiment, args, out=source)
        if rc or args.dry_run:
            return rc
        sources = [source]
    only = args.fs.split(",") if args.fs and args.source is not None else None
    path = tf.draw(args.number, [s.resolve() for s in sources], out, only)
    print(path)
    return 0


SHOWCASE_PARTS = ("durability", "powercut", "postmark")
DURABILITY_PARTS = ("matrix", "recovery")
POWERCUT_FS = ("ext4-ordered", "nvstack-ext4-defaults", "nvstack-ext4-defaults-journal")
POWERCUT_APPS = ("sqlite-wal", "sqlite-delete", "maildir", "editor")
# configurations whose contract makes a rename durable only with the directory's fsync
RENAME_NEEDS_DIRSYNC = ("ext4-ordered", "ext4-journal", "nvstack-ext4-defaults-journal")


def cmd_durability(args) -> int:
    """Issue 13's benchmark in one directory: the experiment `durability` (or
    `durability-quick`) -> OUT/runs/<exp>/, CSV, PNG; the recovery times ->
    OUT/runs/recovery/<device>-<fs>/; then summary.md (tables, goals, recovery)."""
    from . import archive, experiments, recovery, summary
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = [p for p in parts if p not in DURABILITY_PARTS]
    if unknown:
        raise BenchError(f"--parts: {', '.join(unknown)} not among {', '.join(DURABILITY_PARTS)}")
    name = "durability-quick" if args.quick else "durability"
    exp = experiments.EXPERIMENTS[name]
    out = (args.out or BENCH_DIR / "results" /
           f"{name}-{_dt.datetime.now():%Y%m%d-%H%M%S}").resolve()
    if not args.no_plot and not args.dry_run:
        require_plotting()
    rc = 0
    if "matrix" in parts:
        args.no_plot, plot_later = True, not args.no_plot
        rc |= cmd_run(name, args, out)
        args.no_plot = not plot_later
    if "recovery" in parts and not args.dry_run:
        archive.unpack(out)
        devices = [args.device] if args.device else exp.devices
        fill = 900 if args.quick else recovery.FILL_OPS
        memory = parse_size(args.memory or exp.memory)
        journal = max(16 << 20, (256 << 20) * memory // (1 << 30))
        # (configuration, lower_lost, tree_in_journal)
        runs = [("ext4-journal", False, False), ("ext4-ordered", False, False)] + \
            [(f, lost, False) for f in experiments.DURABILITY_NV for lost in (True, False)] + \
            [(f, True, True) for f in experiments.DURABILITY_NV]
        for dev in devices:
            for fs_name, lost, tree in runs:
                print(f"recovery: {fs_name}{' (lower lost)' if lost else ''}"
                      f"{' (tree in journal)' if tree else ''} on {dev} ...", end=" ", flush=True)
                r = recovery.run(out / "runs" / "recovery", fs_name, device=dev,
                                 timing=args.timing, workdir=args.workdir.resolve(),
                                 nvram_bytes=parse_size(args.nvram or exp.nvram),
                                 disk_bytes=parse_size(exp.disk),
                                 journal_bytes=journal - journal % (1 << 20),
                                 fill_ops=fill, lower_lost=lost, tree_in_journal=tree,
                                 echo=args.echo)
                print(f"{r['status']} {r.get('recovery_seconds', '')} s "
                      f"{r['reason'][:200]}", flush=True)
                rc |= r["status"] != "ok"
        archive.pack(out)
    if not args.no_plot and not args.dry_run:
        from . import parse, plot
        parse.parse_tree(out)
        plot.plot_dir(out)
        print(f"summary: {summary.write(out)}")
    return 1 if rc else 0


def cmd_powercut(args) -> int:
    """Power cuts with real applications, every (configuration, application, seed) once."""
    import json
    from . import archive, powercut, summary
    from .fs import CONFIGS
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    archive.unpack(out)
    fss = [f.strip() for f in args.fs.split(",") if f.strip()]
    apps = [a.strip() for a in args.apps.split(",") if a.strip()]
    bad = [a for a in apps if a not in powercut.APPS] + [f for f in fss if f not in CONFIGS]
    if bad:
        raise BenchError(f"unknown application or configuration: {', '.join(bad)}")
    seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
    results = []
    for fs_name in fss:
        for app in apps:
            run_app = ("editor-dirsync" if app == "editor" and fs_name in RENAME_NEEDS_DIRSYNC
                       else app)
            for seed in seeds:
                print(f"power cut: {fs_name} {run_app} seed {seed} ...", end=" ", flush=True)
                r = powercut.run(out / "runs" / "powercut", fs_name, app=run_app,
                                 device=args.device, timing=args.timing,
                                 workdir=args.workdir.resolve(),
                                 nvram_bytes=parse_size(args.nvram), cut_after=args.cut_after,
                                 seed=seed, name=f"{fs_name}-{run_app}-seed{seed}"
                                 + ("-flushed" if args.flush_after_init else ""),
                                 flush_after_init=args.flush_after_init, echo=args.echo)
                print(powercut.text([r]), flush=True)
                results.append(r)
    archive.pack(out)
    try:
        doc = json.loads((out / "powercut.json").read_text())
    except (OSError, ValueError):
        doc = {}
    doc = powercut.merge(doc, results, " ".join(sys.argv))
    (out / "powercut.json").write_text(json.dumps(doc, indent=2, sort_keys=True,
                                                  default=str) + "\n")
    print(summary.powercut_text(doc["results"]))
    summary.write(out)
    return 1 if any(r["status"] != "ok" for r in results) else 0  # this invocation's cuts


def cmd_showcase(args) -> int:
    """The README demo in three parts, each in its own directory under OUT: durability/ (the
    experiment `showcase`), powercut/ (nvbench.powercut for ext4 alone and nvstack over
    ext4), postmark/ (the experiment `showcase-postmark`); then OUT/showcase.txt (everything
    printed) and OUT/showcase.png (the durability figure)."""
    import shutil
    import time as _time
    from . import powercut, summary
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = [p for p in parts if p not in SHOWCASE_PARTS]
    if unknown:
        raise BenchError(f"--parts: {', '.join(unknown)} not among {', '.join(SHOWCASE_PARTS)}")
    if args.dry_run:
        raise BenchError("showcase has no --dry-run; `bench/run run showcase --dry-run` shows "
                         "its durability matrix")
    if not args.no_plot:
        require_plotting()
    out = (args.out or BENCH_DIR / "results" /
           f"showcase-{_dt.datetime.now():%Y%m%d-%H%M%S}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    texts, rc, timings = [], 0, {}
    if "durability" in parts:
        print("== 1. applications that wait for durability: ext4 vs nvstack over ext4 "
              "(hdd-7200, sleep timing)", flush=True)
        t0 = _time.monotonic()
        rc |= cmd_run("showcase", args, out / "durability")
        timings["durability"] = _time.monotonic() - t0
        texts.append("== 1. Applications that wait for durability\n\n"
                     + summary.durability_text(out / "durability"))
        print("\n" + texts[-1] + "\n", flush=True)
    if "powercut" in parts:
        print(f"== 2. power cut in the middle of sqlite (WAL, synchronous=FULL) after "
              f"{args.cut_after:g} s", flush=True)
        t0 = _time.monotonic()
        from . import experiments
        exp = experiments.EXPERIMENTS["showcase"]
        res = []
        for fs_name in exp.fs:
            r = powercut.run(out / "powercut", fs_name, device=args.device or exp.device,
                             timing=args.timing, workdir=args.workdir.resolve(),
                             nvram_bytes=parse_size(args.nvram or exp.nvram),
                             disk_bytes=parse_size(exp.disk), cut_after=args.cut_after,
                             echo=args.echo)
            res.append(r)
            print(powercut.text([r]), flush=True)
            rc |= r["status"] != "ok"
        timings["powercut"] = _time.monotonic() - t0
        texts.append("== 2. Power cut in the middle of the sqlite run\n\n" + powercut.text(res)
                     + "\n\nThe power cut: the nvstack daemon and sqlite are SIGKILLed, `nvstack "
                     "device cut` drops the disk's volatile cache, the image is re-attached (ext4 "
                     "replays its journal) and `nvstack mount` recovers the region; acknowledged "
                     "= COMMIT returned (ids kept outside the disk, in /dev/shm).")
        print()
    if "postmark" in parts:
        print("== 3. what nvstack is not for: asynchronous Postmark, ext2 vs nvstack over ext2",
              flush=True)
        t0 = _time.monotonic()
        rc |= cmd_run("showcase-postmark", args, out / "postmark")
        timings["postmark"] = _time.monotonic() - t0
        texts.append("== 3. What nvstack is not for: asynchronous Postmark (no fsync)\n\n"
                     + summary.showcase_text(out / "postmark"))
        print("\n" + texts[-1] + "\n", flush=True)
    texts.append("showcase parts took " + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items()))
    (out / "showcase.txt").write_text("\n\n".join(texts) + "\n")
    fig = out / "durability" / "showcase-durability.png"
    if fig.exists():
        shutil.copyfile(fig, out / "showcase.png")
    print("\n".join(["", "=" * 78, *texts, "=" * 78]))
    print(f"text: {out / 'showcase.txt'}")
    if fig.exists():
        print(f"figure: {out / 'showcase.png'}")
    print(f"runs, repro.sh per run, CSV and summary.md: {out}/{{durability,powercut,postmark}}")
    return 1 if rc else 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.cmd == "list":
            return cmd_list()
        if args.cmd == "smoke":
            return cmd_run(args.cmd, args)
        if args.cmd == "showcase":
            return cmd_showcase(args)
        if args.cmd == "durability":
            return cmd_durability(args)
        if args.cmd == "powercut":
            return cmd_powercut(args)
        if args.cmd == "load":
            from . import load
            return load.main(args)
        if args.cmd == "run" and args.experiment == "load":
            raise BenchError("the load test has its own command and options: bench/run load "
                             "--help")
        if args.cmd == "run":
            return cmd_run(args.experiment, args)
        if args.cmd == "figure":
            return cmd_figure(args)
        if args.cmd == "parse":
            from . import archive, parse
            if archive.unpack(args.rundir):
                print(f"unpacked {args.rundir / archive.ARCHIVE} into {args.rundir / archive.RUNS}")
            written = parse.parse_tree(args.rundir)
            for exp, path in written.items():
                print(f"{exp}: {path}")
            if not written:
                print(f"no runs found under {args.rundir}/runs (nor {archive.ARCHIVE})",
                      file=sys.stderr)
                return 1
            return 0
        if args.cmd == "pack":
            from . import archive
            path = archive.pack(args.resultdir)
            if path is None:
                raise BenchError(f"no {args.resultdir / archive.RUNS} to pack")
            print(f"{path} ({path.stat().st_size} bytes)")
            return 0
        if args.cmd == "plot":
            require_plotting()
            from . import plot, summary
            pngs = plot.plot_dir(args.resultdir)
            path = summary.write(args.resultdir)
            for p in pngs:
                print(p)
            print(path)
            return 0
    except BenchError as exc:
        print(f"bench/run: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nbench/run: interrupted; mounts, loop devices and cgroups were cleaned up",
              file=sys.stderr)
        return 130
    return 2
