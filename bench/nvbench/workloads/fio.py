"""fio jobs reproducing the Filebench personalities of the papers (job files as data).

VMA journaling paper (sec. 5.1):
  seq_write    one empty file, 8 KB appends until 600 MB (then fsync)
  seq_write-150m  the same to 150 MB (the paper's size x 0.25; the durability experiment: the
               file fits the 256 MiB NVRAM region, as the paper's fit its domain's memory)
  rnd_write    4 KB random writes to a (pre-written) 512 MB file until 128 MB written (then fsync)
Non-blocking writes paper (sec. 5): 60 s on a 5 GB pre-allocated (pre-written) file, cold cache,
operation sizes below 4 KB (the fetch-before-write case); the file is laid out on the kernel FS
before nvstack mounts (prefill "lower"), so no page of it is in NVRAM:
  nbw-seq-write      sequential writes of IOSIZE
  nbw-random-write   random writes of IOSIZE
  nbw-random-readwrite  two threads on the same file: one random reader, one random writer
FUSE tax (not from a paper): one 1 GiB file, buffered IO (direct=0), psync, 4 KiB blocks:
  tax-seq-write     write the new file sequentially, end_fsync
  tax-seq-write-1m  the same with 1 MiB writes (shows what max_write buys)
  tax-seq-read      read it sequentially (cold cache; pre-written untimed)
  tax-rand-write    20 s of random 4 KiB overwrites of the pre-written file, end_fsync
  tax-rand-read     20 s of random 4 KiB reads of the pre-written file (cold cache at start)
Passthrough (issue 16; not from a paper): 15 s on one existing 1 GiB file laid out on the
kernel FS before nvstack mounts (prefill "lower": no page of it in NVRAM, so nvstack's routes
may serve it in kernel passthrough), buffered IO, psync, cold cache at start (the harness'
drop_caches), no fsync. No `invalidate` and no `fadvise_hint`: fio applies both to the file
it opens, and through FUSE passthrough posix_fadvise does not reach the lower file, so with
them ext4 alone dropped its cache at every pass and read without readahead while the lower
file under nvstack did not (the first run, bench/results/passthrough/experiment-fadvise/):
  pt-seq-read-4k, pt-rand-read-4k, pt-seq-write-4k, pt-rand-write-4k   4 KiB blocks
  pt-seq-read-1m, pt-seq-write-1m                                      1 MiB blocks
Write-back policies (thesis sec. 4.3; not a Filebench personality):
  wb-zipf-rewrite   102,400 random 4 KiB overwrites (400 MiB, io_size) of a pre-written 512 MiB
                    file, Zipf theta 1.1 (fio hashes the ranks over the file, so the hot pages
                    are scattered), psync, one job, end_fsync; the metric is the wall clock
Pre-written = an untimed fio layout pass (1 MiB writes + fsync) through the measured file
system, then caches are dropped. `prefill: "lower"`: the same pass on the kernel FS before a
stacked FS is mounted over it (Invocation.pre_lower), so nvstack starts without having seen
the file: its NVRAM page cache is clean and its write-back counters (repeated pages are
remembered per mount) see only the timed job; the layout is the same for every configuration.

`scale` multiplies file sizes, bytes written and run time. fio prints JSON
(--output-format=json); parse.py reads it.
"""

from __future__ import annotations

from pathlib import Path

from . import Invocation, scaled, target_subdir

TOOL = "fio"
MB = 1 << 20

# name -> (global options, [job sections]); sizes in bytes, times in seconds (unscaled)
JOBS: dict[str, dict] = {
    "seq_write": {"global": {"ioengine": "psync", "fallocate": "none", "end_fsync": 1},
                  "jobs": [{"name": "seq_write", "rw": "write", "bs": "8k", "size": 600 * MB,
                            "filename": "seq_write.dat"}],
                  "primary": ("runtime_s", "s", False)},
    "rnd_write": {"global": {"ioengine": "psync", "end_fsync": 1, "overwrite": 1},
                  "jobs": [{"name": "rnd_write", "rw": "randwrite", "bs": "4k", "size": 512 * MB,
                            "io_size": 128 * MB, "filename": "rnd_write.dat",
                            "randrepeat": 1}],
                  "primary": ("runtime_s", "s", False)},
    "nbw-seq-write": {"global": {"ioengine": "psync", "overwrite": 1, "time_based": 1,
                                 "runtime": 60, "invalidate": 1},
                      "jobs": [{"name": "seqwrite", "rw": "write", "bs": "{iosize}",
                                "size": 5120 * MB, "filename": "nbw.dat"}],
                      "prefill": "lower", "primary": ("write_iops", "ops/s", True)},
    "nbw-random-write": {"global": {"ioengine": "psync", "overwrite": 1, "time_based": 1,
                                    "runtime": 60, "invalidate": 1},
                         "jobs": [{"name": "randwrite", "rw": "randwrite", "bs": "{iosize}",
                                   "size": 5120 * MB, "filename": "nbw.dat"}],
                         "prefill": "lower", "primary": ("write_iops", "ops/s", True)},
    "nbw-random-readwrite": {"global": {"ioengine": "psync", "overwrite": 1, "time_based": 1,
                                        "runtime": 60, "invalidate": 1},
                             "jobs": [{"name": "randread", "rw": "randread", "bs": "{iosize}",
                                       "size": 5120 * MB, "filename": "nbw.dat"},
                                      {"name": "randwrite", "rw": "randwrite", "bs": "{iosize}",
                                       "size": 5120 * MB, "filename": "nbw.dat"}],
                             "prefill": "lower", "primary": ("total_iops", "ops/s", True)},
    "tax-seq-write": {"global": {"ioengine": "psync", "direct": 0, "end_fsync": 1},
                      "jobs": [{"name": "seqwrite", "rw": "write", "bs": "4k", "size": 1024 * MB,
                                "filename": "tax.dat"}],
                      "primary": ("write_kBps", "KiB/s", True)},
    "tax-seq-write-1m": {"global": {"ioengine": "psync", "direct": 0, "end_fsync": 1},
                         "jobs": [{"name": "seqwrite1m", "rw": "write", "bs": "1m",
                                   "size": 1024 * MB, "filename": "tax.dat"}],
                         "primary": ("write_kBps", "KiB/s", True)},
    "tax-seq-read": {"global": {"ioengine": "psync", "direct": 0},
                     "jobs": [{"name": "seqread", "rw": "read", "bs": "4k", "size": 1024 * MB,
                               "filename": "tax.dat"}],
                     "prefill": True, "primary": ("read_kBps", "KiB/s", True)},
    "tax-rand-write": {"global": {"ioengine": "psync", "direct": 0, "end_fsync": 1,
                                  "overwrite": 1, "time_based": 1, "runtime": 20,
                                  "randrepeat": 1},
                       "jobs": [{"name": "randwrite", "rw": "randwrite", "bs": "4k",
                                 "size": 1024 * MB, "filename": "tax.dat"}],
                       "prefill": True, "primary": ("write_iops", "ops/s", True)},
    "tax-rand-read": {"global": {"ioengine": "psync", "direct": 0, "time_based": 1,
                                 "runtime": 20, "randrepeat": 1},
                      "jobs": [{"name": "randread", "rw": "randread", "bs": "4k",
                                "size": 1024 * MB, "filename": "tax.dat"}],
                      "prefill": True, "primary": ("read_iops", "ops/s", True)},
    "wb-zipf-rewrite": {"global": {"ioengine": "psync", "direct": 0, "end_fsync": 1,
                                   "overwrite": 1, "fallocate": "none", "randrepeat": 1},
                        "jobs": [{"name": "zipfrewrite", "rw": "randwrite", "bs": "4k",
                                  "size": 512 * MB, "io_size": 400 * MB,
                                  "random_distribution": "zipf:1.1", "filename": "wb.dat"}],
                        "prefill": "lower", "primary": ("wall_seconds", "s", False)},
}


def _passthrough_job(rw: str, bs: str, primary: tuple) -> dict:
    """One job of the passthrough experiment (see the module docs)."""
    return {"global": {"ioengine": "psync", "direct": 0, "overwrite": 1, "time_based": 1,
                       "runtime": 15, "randrepeat": 1, "invalidate": 0, "fadvise_hint": 0},
            "jobs": [{"name": rw, "rw": rw, "bs": bs, "size": 1024 * MB,
                      "filename": "pt.dat"}],
            "prefill": "lower", "primary": primary}


JOBS.update({
    "pt-seq-read-4k": _passthrough_job("read", "4k", ("read_kBps", "KiB/s", True)),
    "pt-rand-read-4k": _passthrough_job("randread", "4k", ("read_iops", "ops/s", True)),
    "pt-seq-write-4k": _passthrough_job("write", "4k", ("write_kBps", "KiB/s", True)),
    "pt-rand-write-4k": _passthrough_job("randwrite", "4k", ("write_iops", "ops/s", True)),
    "pt-seq-read-1m": _passthrough_job("read", "1m", ("read_kBps", "KiB/s", True)),
    "pt-seq-write-1m": _passthrough_job("write", "1m", ("write_kBps", "KiB/s", True)),
})
JOBS["seq_write-150m"] = {**JOBS["seq_write"],
                          "jobs": [{**JOBS["seq_write"]["jobs"][0], "size": 150 * MB}]}
NBW_IOSIZES = [128, 512, 1024, 2048, 4096]
_SCALED = ("size", "io_size", "runtime")


def primary(config: str) -> tuple[str, str, bool]:
    return JOBS[config]["primary"]


def variants(config: str, scale: float) -> list[tuple[str, dict]]:
    if config.startswith("nbw-"):
        return [(f"iosize={s}", {"config": config, "scale": scale, "iosize": s})
                for s in NBW_IOSIZES]
    return [("default", {"config": config, "scale": scale})]


def job_file(p: dict, directory: Path) -> str:
    """Render the fio job file for params p (scale applied to sizes, bytes and run time)."""
    spec = JOBS[p["config"]]
    scale = p["scale"]

    def val(k, v):
        if k in _SCALED and isinstance(v, int):
            v = scaled(v, scale, 1)
            if k != "runtime":
                v = max(4096, v - v % 4096)
        return str(v).format(iosize=p.get("iosize", 4096))

    out = [f"# nvbench fio job {p['config']} scale {scale}", "[global]",
           f"directory={directory}"]
    out += [f"{k}={val(k, v)}" for k, v in spec["global"].items()]
    for job in spec["jobs"]:
        out.append(f"\n[{job['name']}]")
        out += [f"{k}={val(k, v)}" for k, v in job.items() if k != "name"]
    return "\n".join(out) + "\n"


def prefill_argv(p: dict, directory: Path) -> list[str]:
    """Untimed layout of the job's file: sequential 1 MiB writes + fsync (same size/name; the
    job's `fallocate` setting too, if it has one)."""
    spec = JOBS[p["config"]]
    job = spec["jobs"][0]
    size = max(4096, scaled(job["size"], p["scale"], 1) // 4096 * 4096)
    extra = [f"--fallocate={spec['global']['fallocate']}"] if "fallocate" in spec["global"] else []
    return ["fio", "--name=prefill", f"--directory={directory}", f"--filename={job['filename']}",
            "--rw=write", "--bs=1m", f"--size={size}", "--ioengine=psync", "--end_fsync=1",
            *extra, "--output-format=terse"]


def invocation(p: dict, target: Path, rundir: Path) -> Invocation:
    d = target_subdir(target, "fio")
    pre = [["mkdir", "-p", str(d)]]
    pre_lower = None
    prefill = JOBS[p["config"]].get("prefill")
    if prefill == "lower":
        def pre_lower(base: Path) -> list[list[str]]:
            ld = target_subdir(base, "fio")
            return [["mkdir", "-p", str(ld)], prefill_argv(p, ld)]
    elif prefill:
        pre.append(prefill_argv(p, d))
    return Invocation(argv=["fio", "--output-format=json", str(rundir / "job.fio")],
                      files={"job.fio": job_file(p, d)}, pre=pre, pre_lower=pre_lower,
                      tools=[TOOL])
