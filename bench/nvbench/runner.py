"""Running an experiment: one run = one directory with everything needed to trust and redo it.

OUT/experiment.json                                   matrix metadata, notes (device fallback...),
                                                      the FUSE round trip before and after (floor.py)
OUT/runs/<exp>/<workload>-<config>/<variant>/<fs>/rep<N>/
    spec.json      what was asked (fs, workload params, budget, device, scale)
    env.json       kernel, CPU, memory, tool versions, git commit, scale factors, budget, device
    cmd.txt        the exact timed command
    stdout.txt / stderr.txt   raw output of the timed command
    <inputs>       postmark.cfg, job.fio, ... (exactly what the tool read)
    result.json    status ok | failed | skipped, reason, wall_seconds (external clock), sync_seconds
    device_stat_before.json / device_stat_after.json   modeled disk counters (if any)
    blockdev_stat_before.txt / blockdev_stat_after.txt  /sys/block/<loop>/stat of the plain loop
                   device (--device none) holding the kernel FS / the lower FS
    nvstack_stat_before.json / nvstack_stat.json   nvstack request counters (parse: the delta)
    cgroup.json
    progress.tsv   what the run's processes waited on, every 10 s of the timed command (watch.py;
                   result.json's "watch": the longest span in which none of them used CPU)
    repro.sh       the same commands as a standalone script (cleanup on EXIT)
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import platform
import signal
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import cgroup as cgroup_mod
from . import floor as floor_mod
from . import fs as fs_mod
from . import nvstack, workloads
from . import watch as watch_mod
from .experiments import Experiment
from .shell import Shell
from .util import (REPO_DIR, BenchError, dpkg_version, first_line, fmt_size, parse_size,
                   process_cpu_seconds, slug, which)

THESIS_MEMORY = 1 << 30
THESIS_JOURNAL = 256 << 20


@dataclass
class RunSpec:
    experiment: str
    workload: str
    config: str
    variant: str
    params: dict
    fs: str
    rep: int
    device: str
    timing: str
    memory_bytes: int
    disk_bytes: int
    journal_bytes: int
    nvram_bytes: int
    scale: float
    device_in_path: bool = False    # an experiment on several devices: runs/<exp>/<device>/...
    sync_point: bool = False        # Experiment.sync_point
    kernel_dirty: tuple | None = None   # Experiment.kernel_dirty

    def reldir(self) -> Path:
        base = Path("runs") / self.experiment
        if self.device_in_path:
            base /= slug(self.device)
        return (base / f"{self.workload}-{self.config}" / slug(self.variant) / self.fs /
                f"rep{self.rep}")

    def run_id(self) -> str:
        """Names the run's work directory, NVRAM file and images: short, because workloads
        see paths under it (Postmark garbles a location past 80 characters)."""
        tag = hashlib.sha1(f"{self.fs}/{self.variant}/{self.workload}".encode()).hexdigest()[:6]
        return f"{os.getpid()}-{self.rep}-{tag}"


@dataclass
class Settings:
    out: Path
    device: str
    timing: str = "sleep"
    memory: int | None = None
    scale: float | None = None
    reps: int | None = None
    workdir: Path = Path("/var/tmp/nvbench-work")
    dry_run: bool = False
    echo: bool = False
    nvram: int | None = None
    overrides: dict = field(default_factory=dict)   # workload parameters set absolutely
                                                    # (e.g. {"transactions": 50000}), unscaled
    variants: list[str] | None = None               # only these variant names (e.g.
                                                    # ["files=2500"]); None: all
    floor: bool = True                              # measure the FUSE round trip before and
                                                    # after the runs (nvbench/floor.py)
    nvstack_args: list[str] = field(default_factory=list)  # appended to every nvstack mount of
                                                    # the run (an A/B of one mount option across
                                                    # a whole experiment); recorded per run


def _variants(mod, config: str, scale: float, memory: int):
    if mod.__name__.endswith("bonnie"):
        return mod.variants(config, scale, memory)
    return mod.variants(config, scale)


def matrix(exp: Experiment, st: Settings) -> list[RunSpec]:
    """The runs of an experiment, interleaved: rep-major, then device (st.device may name
    several, comma-separated), then workload variant, then fs."""
    memory = st.memory or parse_size(exp.memory)
    scale = st.scale if st.scale is not None else exp.scale
    reps = st.reps or exp.reps
    journal = max(16 << 20, THESIS_JOURNAL * memory // THESIS_MEMORY)
    journal -= journal % (1 << 20)
    nvram = st.nvram or (parse_size(exp.nvram) if exp.nvram else memory // 2)
    specs = []
    devices = [d for d in st.device.split(",") if d]
    overrides = {**exp.overrides, **st.overrides}
    _check_overrides(exp, st, scale, memory)
    if st.variants is not None:
        known = {v for w, c in exp.workloads for v, _p in _variants(workloads.get(w), c, scale,
                                                                    memory)}
        unknown = [v for v in st.variants if v not in known]
        if unknown:
            raise BenchError(f"--variants: {', '.join(unknown)} not among the variants of "
                             f"experiment {exp.name} ({', '.join(sorted(known))})")
    for rep in range(1, reps + 1):
        for device in devices:
            for wname, config in exp.workloads:
                mod = workloads.get(wname)
                for variant, params in _variants(mod, config, scale, memory):
                    if st.variants is not None and variant not in st.variants:
                        continue
                    params = _override(params, overrides)
                    for fsname in exp.fs_for(wname, config):
                        specs.append(RunSpec(exp.name, wname, config, variant, params, fsname,
                                             rep, device, st.timing, memory,
                                             parse_size(exp.disk), journal, nvram, scale,
                                             device_in_path=len(devices) > 1,
                                             sync_point=exp.sync_point,
                                             kernel_dirty=exp.kernel_dirty))
    return specs


def _override(params: dict, overrides: dict) -> dict:
    """Workload parameters with the absolute overrides that apply to this workload (its
    params have the key); the scaled value they replace stays as `<key>_scaled`."""
    hit = {k: v for k, v in overrides.items() if k in params}
    if not hit:
        return params
    return {**params, **{f"{k}_scaled": params[k] for k in hit}, **hit,
            "overridden": sorted(hit)}


def _check_overrides(exp: Experiment, st: Settings, scale: float, memory: int) -> None:
    for key in st.overrides:
        if not any(key in p for w, c in exp.workloads
                   for _v, p in _variants(workloads.get(w), c, scale, memory)):
            raise BenchError(f"experiment {exp.name} has no workload with parameter {key!r}")


# ----- environment --------------------------------------------------------------------------
_host_env: dict | None = None


def host_env() -> dict:
    global _host_env
    if _host_env is not None:
        return _host_env
    cpu = None
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem = next(int(l.split()[1]) * 1024 for l in open("/proc/meminfo") if l.startswith("MemTotal"))
    except (OSError, StopIteration):
        mem = None

    def git(*args):
        try:
            return subprocess.run(["git", "-C", str(REPO_DIR), *args], capture_output=True,
                                  text=True, timeout=10).stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            return None

    caps = nvstack.probe()
    try:
        import matplotlib
        mpl = matplotlib.__version__
    except ImportError:
        mpl = None
    _host_env = {
        "kernel": platform.release(), "uname": " ".join(platform.uname()),
        "cpu_model": cpu, "cpus": os.cpu_count(), "memory_total_bytes": mem,
        "python": sys.version.split()[0], "matplotlib": mpl,
        "tools": {"postmark": dpkg_version("postmark"), "fio": first_line(["fio", "--version"]),
                  "bonnie++": dpkg_version("bonnie++"), "e2fsprogs": dpkg_version("e2fsprogs"),
                  "dosfstools": dpkg_version("dosfstools"), "util-linux": dpkg_version("util-linux"),
                  "tar": first_line(["tar", "--version"])},
        "git_commit": git("rev-parse", "HEAD"),
        "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "nvstack": {"binary": caps.binary, "version": caps.version, "device": caps.device,
                    "mount": caps.mount},
        "fuse_daemons": {n: {"path": p, "realpath": os.path.realpath(p) if p else None}
                         for n, p in caps.tools.items()},
        "libfuse3": dpkg_version("libfuse3-3"),
        "cgroup_v1_memory": cgroup_mod.available(),
    }
    return _host_env


# ----- one run --------------------------------------------------------------------------------
def skip_reason(spec: RunSpec, inv, cfg: fs_mod.FsConfig, caps: nvstack.Capabilities,
                mod) -> str | None:
    for tool in inv.tools:
        if not which(tool):
            return f"tool `{tool}` not installed (bench/install.sh)"
    if spec.workload == "untar" and not spec.params.get("tarball"):
        return "no tarball /usr/src/linux-source-*.tar.* (bench/install.sh --with-linux-source)"
    for need in cfg.needs:
        why = caps.missing(need)
        if why:
            return why
    if spec.device != "none" and caps.missing("device"):
        return caps.missing("device")
    if cfg.mkfs == "vfat" and not which("mkfs.vfat"):
        return "mkfs.vfat not installed (dosfstools)"
    return None


# The kernel's write-back knobs (/proc/sys/vm) that kernel_dirty sets for a run and restores.
VM_DIRTY_KEYS = ("dirty_background_ratio", "dirty_ratio", "dirty_background_bytes",
                 "dirty_bytes", "dirty_expire_centisecs", "dirty_writeback_centisecs")


def kernel_dirty_settings(spec: RunSpec) -> dict | None:
    """The write-back of the machine the budget models (Experiment.kernel_dirty): Linux writes
    dirty pages in the background past `background` % of memory, throttles writers past
    `dirty` %, and writes what is dirty for 30 s every 5 s. The host has 24 GiB, so its own
    thresholds would never apply to a run of M; here they are set in bytes from M. Global
    (cgroup v1 has no per-cgroup dirty limits): set before the run, restored after it."""
    if not spec.kernel_dirty:
        return None
    background, dirty = spec.kernel_dirty
    return {"dirty_background_bytes": spec.memory_bytes * background // 100,
            "dirty_bytes": spec.memory_bytes * dirty // 100,
            "dirty_expire_centisecs": 3000, "dirty_writeback_centisecs": 500}


def set_vm(sh: Shell, values: dict) -> dict:
    """Sets /proc/sys/vm knobs and returns the previous values of VM_DIRTY_KEYS. A ratio and
    its bytes twin are one setting (writing either zeroes the other, and dirty_bytes refuses
    0), so zero values are not written."""
    # read in a dry run too (harmless), so that repro.sh restores what the host had
    before = {k: int(Path(f"/proc/sys/vm/{k}").read_text().split()[0]) for k in VM_DIRTY_KEYS}
    sh.run(["sysctl", "-q", "-w", *[f"vm.{k}={v}" for k, v in values.items() if v != 0]])
    return before


def with_nvstack_args(cfg: fs_mod.FsConfig, args: list[str]) -> fs_mod.FsConfig:
    """`cfg` with `args` after its own nvstack mount arguments. An option the configuration
    sets itself is refused: the run would no longer be the configuration it is named after."""
    own = {a.split("=", 1)[0] for a in cfg.nvstack.get("args", []) if a.startswith("--")}
    own |= {f"--{k}" for k in fs_mod.nvstack_flags(cfg.nvstack)} | {"--consistency"}
    twice = sorted(own & {a.split("=", 1)[0] for a in args if a.startswith("--")})
    if twice:
        raise BenchError(f"--nvstack-args: {', '.join(twice)} is set by configuration "
                         f"{cfg.name} itself")
    return fs_mod.FsConfig(**{**asdict(cfg), "nvstack": {
        **cfg.nvstack, "args": [*cfg.nvstack.get("args", []), *args]}})


def execute(spec: RunSpec, st: Settings, notes: list[str]) -> dict:
    """Run one spec; always returns result dict and leaves the run directory complete."""
    rundir = st.out / spec.reldir()
    rundir.mkdir(parents=True, exist_ok=True)
    caps = nvstack.probe()
    cfg = fs_mod.CONFIGS[spec.fs]
    mod = workloads.get(spec.workload)
    sh = Shell(dry_run=st.dry_run, echo=st.echo)
    sh.param(str(rundir), "RUN", "$(mktemp -d /tmp/nvbench-repro.XXXXXX)")
    layout = fs_mod.Layout(st.workdir / spec.run_id(), spec.run_id())
    target_path = layout.mnt
    inv = _invocation(mod, spec, target_path, rundir, st)
    if st.nvstack_args and cfg.nvstack:
        cfg = with_nvstack_args(cfg, st.nvstack_args)
    extra = getattr(mod, "mount_option", lambda p: None)(spec.params)
    if extra and not cfg.stacked:
        opts = ",".join(o for o in (cfg.mount_options, extra) if o)
        cfg = fs_mod.FsConfig(**{**asdict(cfg), "mount_options": opts})
    budget_enforced = cgroup_mod.available() or st.dry_run
    cg_limit = spec.memory_bytes - (spec.journal_bytes if cfg.journal == "ram" else 0)
    env = {**host_env(), "run": {
        "experiment": spec.experiment, "workload": spec.workload, "config": spec.config,
        "variant": spec.variant, "params": spec.params, "fs": asdict(cfg), "rep": spec.rep,
        "scale": spec.scale, "memory_budget_bytes": spec.memory_bytes,
        "memory_scale_vs_thesis": round(spec.memory_bytes / THESIS_MEMORY, 4),
        "cgroup_limit_bytes": cg_limit, "memory_budget_enforced": budget_enforced,
        "ram_journal_charged_by_lowering_limit": cfg.journal == "ram",
        "nvram_bytes": spec.nvram_bytes if cfg.nvstack else None,
        "journal_bytes": spec.journal_bytes if cfg.journal else None,
        "device_model": spec.device, "device_timing": spec.timing if spec.device != "none" else None,
        "disk_bytes": spec.disk_bytes, "workdir": str(layout.workdir), "dry_run": st.dry_run,
        "started": _dt.datetime.now().isoformat(timespec="seconds"),
        "loadavg_start": loadavg(), "notes": notes}}
    _write_json(rundir / "spec.json", {**asdict(spec)})
    _write_json(rundir / "env.json", env)
    result = {"status": "ok", "reason": "", "wall_seconds": None, "sync_seconds": None,
              "exit_code": None, "spec": asdict(spec)}
    why = skip_reason(spec, inv, cfg, caps, mod)
    if why:
        result.update(status="skipped", reason=why)
        _write_json(rundir / "result.json", result)
        return result

    dirty = kernel_dirty_settings(spec)
    if dirty:
        env["run"]["kernel_dirty"] = dirty
        _write_json(rundir / "env.json", env)
    cg = cgroup_mod.MemoryCgroup(sh, cg_limit) if budget_enforced else None
    saved_vm = set_vm(sh, dirty) if dirty else None
    wrap = cg.wrap if cg else (lambda argv: argv)
    target = fs_mod.Target(sh, cfg, spec.device, layout, spec.disk_bytes, spec.journal_bytes,
                           spec.nvram_bytes, spec.timing, caps, cg, rundir,
                           remount_options=extra if extra and cfg.stacked else "")
    try:
        if cg:
            cg.create()

        def before_stack(base: Path) -> None:
            for argv in inv.pre_lower(base):
                sh.run(wrap(argv), timeout=3600)
        target.setup(before_stack if inv.pre_lower else None)
        for name, text in inv.files.items():
            sh.write_file(rundir / name, text)
        for argv in inv.pre:
            sh.run(wrap(argv), timeout=3600)
        sh.sh("sync; echo 3 > /proc/sys/vm/drop_caches")
        target.device_stat(rundir / "device_stat_before.json")
        target.block_stat(rundir / "blockdev_stat_before.txt")
        target.nvstack_stat(rundir / "nvstack_stat_before.json")
        timed = wrap(inv.argv)
        (rundir / "cmd.txt").write_text(sh.render(timed) + "\n")
        sh.note("timed workload (wall clock measured outside the tool):")
        cpu0 = cpu_snapshot(target.fuse_pid())
        watch = None
        if not st.dry_run:
            watch = watch_mod.Watch(rundir / "progress.tsv", [str(layout.workdir), str(rundir)])
            watch.start()
        try:
            res = sh.run(timed, check=False, stdout=rundir / "stdout.txt",
                         stderr=rundir / "stderr.txt", timeout=6 * 3600, time_it=True)
        finally:
            if watch is not None:
                result["watch"] = watch.stop()
        if not st.dry_run:
            result["cpu"] = cpu_delta(cpu0, cpu_snapshot(target.fuse_pid()))
        result["wall_seconds"] = round(res.seconds, 4)
        result["exit_code"] = res.returncode
        syn = sh.sh("sync", check=False)
        result["sync_seconds"] = round(syn.seconds, 4)
        flush = target.flush_argv()
        if flush:
            fl = sh.run(flush, check=False, time_it=True)
            result["flush_seconds"] = round(fl.seconds, 4)
        if spec.sync_point:
            sp = sh.run(workloads.sync_point_argv(target.path), check=False, time_it=True)
            result["sync_point_seconds"] = round(sp.seconds, 4)
        target.device_stat(rundir / "device_stat_after.json")
        target.block_stat(rundir / "blockdev_stat_after.txt")
        target.nvstack_stat(rundir / "nvstack_stat.json")
        if st.dry_run:
            result.update(status="dry-run", reason="dry run: nothing was executed")
        elif res.returncode != 0:
            result.update(status="failed", reason=f"workload exit {res.returncode}: "
                          + _tail(rundir / "stderr.txt"))
        elif getattr(mod, "failure", None) and mod.failure(rundir):
            result.update(status="failed", reason=mod.failure(rundir))
    except BenchError as exc:
        result.update(status="failed", reason=str(exc)[:2000])
    except BaseException:
        result.update(status="failed", reason="interrupted (Ctrl-C or signal)")
        raise
    finally:
        sh.phase = "cleanup"
        result["loadavg_end"] = loadavg()
        if cg:
            _write_json(rundir / "cgroup.json", cg.stats())
        errs = target.teardown()
        if cg:
            cg.remove()
        if saved_vm:
            set_vm(sh, saved_vm)
        if errs:
            result["teardown_errors"] = errs
        _write_json(rundir / "result.json", result)
        header = (f"experiment {spec.experiment}, fs {spec.fs}, workload {spec.workload}/"
                  f"{spec.config} {spec.variant}, rep {spec.rep}\n"
                  f"git commit {env.get('git_commit')}; run as root; outputs go where the "
                  f"original run wrote them")
        repro = rundir / "repro.sh"
        repro.write_text(sh.repro_script(header))
        repro.chmod(0o755)
        if target.interrupted:
            raise target.interrupted
    return result


# a span this long in which none of a run's processes used CPU is named after its status
STILL_NOTE_S = 120


def cpu_snapshot(daemon_pid: int | None) -> dict:
    """CPU seconds so far: the whole machine (busy and total, /proc/stat), the FUSE daemon
    (/proc/PID/stat utime + stime) and the harness' finished children (the timed command)."""
    import resource
    tick = os.sysconf("SC_CLK_TCK")
    out: dict = {}
    try:
        f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        out["host_total_s"] = sum(f[:8]) / tick           # user .. steal
        out["host_busy_s"] = (sum(f[:8]) - f[3] - f[4]) / tick   # minus idle, iowait
    except (OSError, ValueError, IndexError):
        pass
    if daemon_pid:
        try:
            out["daemon_s"] = process_cpu_seconds(daemon_pid)
        except (OSError, ValueError, IndexError):
            pass
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    out["children_s"] = ru.ru_utime + ru.ru_stime
    return out


def cpu_delta(before: dict, after: dict) -> dict:
    """CPU seconds spent during the timed command: host_busy_s of host_total_s (all cores),
    daemon_s (the FUSE daemon), app_s (the timed command and its children)."""
    out = {k: round(after[k] - before[k], 4) for k in ("host_total_s", "host_busy_s", "daemon_s")
           if k in before and k in after}
    out["app_s"] = round(after["children_s"] - before["children_s"], 4)
    out["cpus"] = os.cpu_count()
    return out


def loadavg() -> str | None:
    """/proc/loadavg as is (the machine is shared: other work shows here)."""
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return None


def _invocation(mod, spec, target_path, rundir, st):
    if spec.workload == "untar":
        return mod.invocation(spec.params, target_path, rundir, st.workdir / "cache")
    return mod.invocation(spec.params, target_path, rundir)


def _tail(path: Path, n: int = 400) -> str:
    try:
        return path.read_text()[-n:].strip()
    except OSError:
        return ""


def _write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


# ----- a whole experiment ---------------------------------------------------------------------
def choose_device(requested: str | None, exp: Experiment, notes: list[str]) -> str:
    dev = requested or exp.device
    if dev == "none":
        return dev
    caps = nvstack.probe()
    why = caps.missing("device")
    if why is None:
        return dev
    if requested:
        raise BenchError(f"--device {dev} requested but the modeled disk is not available: {why}")
    notes.append(f"**NOTE: the modeled disk (`{dev}`) is not available ({why}); this run fell "
                 f"back to a plain loop device over an image file (`--device none`). Timings "
                 f"are of this VM's disk and page cache, not of the {dev} model.**")
    return "none"


def run_experiment(exp: Experiment, st: Settings, requested_device: str | None) -> list[dict]:
    notes = list(exp.notes)
    st.device = choose_device(requested_device, exp, notes)
    if not st.dry_run and not cgroup_mod.available():
        notes.append("**NOTE: cgroup v1 memory controller not writable: memory budget NOT "
                     "enforced.**")
    if not st.dry_run and os.geteuid() != 0:
        raise BenchError("running benchmarks needs root (mounts, loop devices, cgroups); "
                         "use --dry-run to see the matrix")
    for name in exp.fs:                 # refused before the first run, not in the middle
        if st.nvstack_args and fs_mod.CONFIGS[name].nvstack:
            with_nvstack_args(fs_mod.CONFIGS[name], st.nvstack_args)
    if st.nvstack_args:
        notes.append(f"every nvstack mount of this experiment adds `{' '.join(st.nvstack_args)}` "
                     f"(bench/run --nvstack-args)")
    _build_fuse_daemons(exp, st, notes)
    specs = matrix(exp, st)
    st.out.mkdir(parents=True, exist_ok=True)
    meta = {"experiment": exp.name, "description": exp.description, "baseline": exp.baseline,
            "fs": exp.fs, "workloads": exp.workloads, "device": st.device,
            "device_requested": requested_device or exp.device, "timing": st.timing,
            "memory_bytes": specs[0].memory_bytes if specs else None,
            "nvram_bytes": specs[0].nvram_bytes if specs and any(
                fs_mod.CONFIGS[f].nvstack for f in exp.fs) else None,
            "overrides": st.overrides, "nvstack_args": st.nvstack_args,
            "scale": specs[0].scale if specs else None, "reps": st.reps or exp.reps,
            "runs": len(specs), "notes": notes, "dry_run": st.dry_run,
            "command": " ".join(sys.argv),
            "started": _dt.datetime.now().isoformat(timespec="seconds")}
    floor_bin = _floor_binary(exp, st)
    if floor_bin:
        meta["fuse_floor"] = {"start": floor_mod.measure(floor_bin, st.workdir)}
    _write_json(st.out / "experiment.json", meta)
    _install_signal_handlers()
    results = []
    for i, spec in enumerate(specs, 1):
        print(f"[{i}/{len(specs)}] {spec.experiment} {spec.workload}/{spec.config} "
              f"{spec.variant} fs={spec.fs} rep={spec.rep} ...", end=" ", flush=True)
        r = execute(spec, st, notes)
        wall = f" {r['wall_seconds']:.2f}s" if r.get("wall_seconds") is not None else ""
        still = (r.get("watch") or {}).get("longest_still_s", 0)
        if still >= STILL_NOTE_S:   # said, not judged: a long sleep can be the workload's own
            wall += f" [still {still:.0f}s: see progress.tsv]"
        print(f"{r['status']}{wall}" + (f" ({r['reason'][:120]})" if r["reason"] else ""),
              flush=True)
        results.append(r)
    if floor_bin:
        meta["fuse_floor"]["end"] = floor_mod.measure(floor_bin, st.workdir)
    meta["finished"] = _dt.datetime.now().isoformat(timespec="seconds")
    meta["status_counts"] = {s: sum(r["status"] == s for r in results)
                             for s in ("ok", "failed", "skipped", "dry-run")}
    _write_json(st.out / "experiment.json", meta)
    return results


def _floor_binary(exp: Experiment, st: Settings) -> str | None:
    """The nvstack binary to measure the FUSE floor with (nvbench/floor.py), or None: a dry
    run, `--no-floor`, no nvstack configuration, or no binary that mounts."""
    if st.dry_run or not st.floor or not any(fs_mod.CONFIGS[f].nvstack for f in exp.fs):
        return None
    caps = nvstack.probe()
    return caps.binary if caps.mount else None


def _build_fuse_daemons(exp: Experiment, st: Settings, notes: list[str]) -> None:
    """Configurations with libfuse's passthrough_hp: build it once (bench/tools/...) if missing."""
    caps = nvstack.probe()
    wanted = {n for f in exp.fs for n in fs_mod.CONFIGS[f].needs if n in nvstack.FUSE_DAEMONS}
    if st.dry_run or not wanted or all(caps.tools.get(n) for n in wanted):
        return
    print(f"building {', '.join(sorted(wanted))}: {nvstack.BUILD_PASSTHROUGH_HP}", flush=True)
    p = subprocess.run([str(nvstack.BUILD_PASSTHROUGH_HP)], capture_output=True, text=True)
    if p.returncode != 0:
        notes.append(f"**NOTE: bench/tools/build-passthrough-hp failed (exit {p.returncode}): "
                     f"{(p.stderr or p.stdout).strip()[-300:]}; passthrough_hp runs skipped.**")
    nvstack.probe(refresh=True)


def _install_signal_handlers() -> None:
    """SIGTERM/SIGHUP behave like Ctrl-C so every `finally` (teardown) runs."""
    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    for s in (signal.SIGTERM, signal.SIGHUP):
        try:
            signal.signal(s, handler)
        except (ValueError, OSError):
            pass
    try:  # a background start may inherit SIGINT ignored: Ctrl-C/kill -INT must still clean up
        signal.signal(signal.SIGINT, signal.default_int_handler)
    except (ValueError, OSError):
        pass


def describe(specs: list[RunSpec]) -> str:
    lines = []
    for s in specs:
        lines.append(f"{s.reldir()}  M={fmt_size(s.memory_bytes)} scale={s.scale} "
                     f"device={s.device} params={json.dumps(s.params, sort_keys=True)}")
    return "\n".join(lines)
