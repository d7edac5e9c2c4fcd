"""Postmark (Debian `postmark`, v1.51/1.53): the papers' configurations as data.

Each configuration keeps the paper's numbers unscaled; `command_file(config, scale, dir)`
multiplies the counts (files, transactions) by `scale` and keeps file sizes as in the paper.
Postmark prints whole seconds only, so the runner times it externally.

Sources:
  thesis     Chen 2008 thesis sec. 4.1: 200k transactions, 5k-30k files, 512 B - 10 KB,
             other parameters Postmark defaults (Figs 4.3, 4.10, 4.15, 4.18 at 25k files).
  thesis-matrix  the thesis' Fig 4.18 point alone (25k files, 200k transactions, 512 B -
             10 KB): the Table 4.2 matrix of issue 17 (experiment thesis-matrix).
  thesis-2m  thesis Fig 4.19: 25k files, 512 B - 2 MB (TempFFS size threshold is 1 MB).
  tempffs    TempFFS paper sec. 4 / thesis 4.2 (Figs 4.3-4.6), the TempFFS acceptance run of
             issue 4: 200k transactions, 512 B - 10 KB, no subdirectories, initial file sets
             5k, 10k, 20k, 30k: the thesis' own points on both sides of its TempFFS capacity
             (5k and 10k fit: every file dies in TempFFS; 20k and 30k do not: ~31 % of the IO
             saved). 15k and 25k are left out to keep the run short.
  vma        VMA journaling sec. 5.1: 10k files in 200 directories, default sizes
             (500 B - 9.77 KB), 25k transactions.
  nvfat      NVFAT sec. 4: 1000 files, 10 directories, 512 B - 16 KB, 10k transactions,
             no stdio buffering, 512 B reads/writes. Async = as is; Sync = every write
             synchronous (here: the measured file system mounted with `-o sync`).
  writeback  the write-back policies (thesis sec. 4.3, Fig 4.10; experiment writeback-policies):
             thesis-sized files (512 B - 10 KB), no subdirectories, 2500 / 5000 / 7500 files,
             20k transactions (at the experiment's scale 1). With a 32 MiB NVRAM region (~6.2k
             frames; a file takes a record frame plus 1-3 pages) the live set is ~1.2x / 2.3x /
             3.5x the region, so write-back runs at every point; 2500 is near the thesis' "no
             difference" case (working set about the cache size). 7500 at most because of
             RLIMIT_NOFILE (20000 here: with tempfiles off every live file holds an O_PATH
             descriptor in the daemon and every cached file up to two more) and so that one
             run on the modeled hdd-7200 stays near 2-3 minutes.
  sync       Sync-PostMark for the durability experiment (issue 13): NVFAT's file sizes (512 B -
             16 KB) in 10 directories, unbuffered, every write synchronous: the measured file
             system is mounted with `-o sync` (MS_SYNCHRONOUS: the kernel follows every write(2)
             with a data sync - on FUSE one FSYNC request per WRITE - and ext4 also commits every
             namespace change, dirsync); nvstack gets it by `mount -o remount,sync` of its FUSE
             mount, its lower ext4 stays as it is. Postmark's default 4 KiB read/write blocks
             (NVFAT's 512 B would make ~16 synchronous writes per file: hours on hdd-7200 for
             ext4) and 200 files / 400 transactions, so ext4 alone finishes in about a minute
             on hdd-7200.
  smoke      a small thesis-shaped run for the smoke matrix (seconds per run).
  showcase   the README demo (`bench/run showcase`, its async Postmark part): thesis-sized
             files (512 B - 10 KB) in 10 directories, 3000 files and 6000 transactions, sized so
             that the two runs take about a minute and a half on the modeled hdd-7200 with a
             small memory budget (dirty data must reach the disk). It was 6000 / 12,000 (85 s
             for ext2 alone) before the durability workloads joined the demo.
  fuse-tax   the FUSE-tax benchmark (not from a paper): thesis-sized files (512 B - 10 KB),
             10k files in 100 directories, 150k transactions: a few s on ext4, tens of s over
             FUSE on the 2-core VM. 10k (not more) files: both FUSE daemons hold a descriptor
             per live inode and RLIMIT_NOFILE is 20000 here.
"""

from __future__ import annotations

from pathlib import Path

from . import Invocation, scaled, target_subdir

CONFIGS: dict[str, dict] = {
    "thesis": {"files": [5000, 10000, 15000, 20000, 25000, 30000], "transactions": 200_000,
               "size": (512, 10 * 1024), "subdirectories": 0},
    "thesis-matrix": {"files": [25000], "transactions": 200_000, "size": (512, 10 * 1024),
                      "subdirectories": 0},
    "thesis-2m": {"files": [25000], "transactions": 200_000, "size": (512, 2 * 1024 * 1024),
                  "subdirectories": 0},
    "tempffs": {"files": [5000, 10000, 20000, 30000], "transactions": 200_000,
                "size": (512, 10 * 1024), "subdirectories": 0},
    "vma": {"files": [10000], "transactions": 25_000, "size": (500, 10000),
            "subdirectories": 200},
    "nvfat-async": {"files": [1000], "transactions": 10_000, "size": (512, 16 * 1024),
                    "subdirectories": 10, "buffering": False, "read": 512, "write": 512},
    "nvfat-sync": {"files": [1000], "transactions": 10_000, "size": (512, 16 * 1024),
                   "subdirectories": 10, "buffering": False, "read": 512, "write": 512,
                   "sync": True},
    "fuse-tax": {"files": [10000], "transactions": 150_000, "size": (512, 10 * 1024),
                 "subdirectories": 100},
    "writeback": {"files": [2500, 5000, 7500], "transactions": 20_000,
                  "size": (512, 10 * 1024), "subdirectories": 0},
    "sync": {"files": [200], "transactions": 400, "size": (512, 16 * 1024),
             "subdirectories": 10, "buffering": False, "read": 4096, "write": 4096, "sync": True},
    "smoke": {"files": [4000], "transactions": 100_000, "size": (512, 10 * 1024),
              "subdirectories": 0},
    "showcase": {"files": [3000], "transactions": 6_000, "size": (512, 10 * 1024),
                 "subdirectories": 10},
}

TOOL = "postmark"
PRIMARY = ("wall_seconds", "s", False)


def variants(config: str, scale: float) -> list[tuple[str, dict]]:
    """[(variant name, params)] for one paper configuration: one variant per file count."""
    c = CONFIGS[config]
    out = []
    for files in c["files"]:
        p = {"config": config, "scale": scale,
             "paper_files": files, "paper_transactions": c["transactions"],
             "files": scaled(files, scale), "transactions": scaled(c["transactions"], scale),
             "size_min": c["size"][0], "size_max": c["size"][1],
             "subdirectories": scaled(c["subdirectories"], scale, 0) if c["subdirectories"] else 0,
             "buffering": c.get("buffering"), "read": c.get("read"), "write": c.get("write"),
             "sync": bool(c.get("sync")), "seed": 42}
        out.append((f"files={p['files']}", p))
    return out


def command_file(p: dict, location: Path) -> str:
    """The postmark command file for params p (from variants())."""
    lines = [f"# nvbench postmark config {p['config']} scale {p['scale']}: paper "
             f"{p['paper_files']} files / {p['paper_transactions']} transactions"
             + (" (transactions set absolutely: --transactions)"
                if "transactions" in p.get("overridden", ()) else ""),
             f"set location {location}",
             f"set number {p['files']}",
             f"set transactions {p['transactions']}",
             f"set size {p['size_min']} {p['size_max']}"]
    if p["subdirectories"]:
        lines.append(f"set subdirectories {p['subdirectories']}")
    if p.get("read"):
        lines.append(f"set read {p['read']}")
    if p.get("write"):
        lines.append(f"set write {p['write']}")
    if p.get("buffering") is not None:
        lines.append(f"set buffering {'true' if p['buffering'] else 'false'}")
    lines += [f"set seed {p['seed']}", "set report verbose", "show", "run", "quit"]
    return "\n".join(lines) + "\n"


# Postmark 1.5x keeps `location` in a fixed buffer: with a location longer than 80 characters
# it builds garbled file names (measured with the Debian binary: 80 works, 81 fails), reports
# "Error: cannot open ... for writing" for some and creates others relative to its working
# directory - the run does less work than asked and litters the caller's directory. So Postmark
# runs inside its directory (`env -C`) with `set location .`, whatever the work directory's
# length, and `failure` turns any "Error:" it prints into a failed run.


def invocation(p: dict, target: Path, rundir: Path) -> Invocation:
    loc = target_subdir(target, "postmark")
    return Invocation(argv=["env", "-C", str(loc), "postmark", str(rundir / "postmark.cfg")],
                      files={"postmark.cfg": command_file(p, Path("."))},
                      pre=[["mkdir", "-p", str(loc)]], tools=[TOOL])


def failure(rundir: Path) -> str | None:
    """Why a Postmark run that exited 0 is still not a measurement: Postmark reports failed
    file operations on stderr ("Error: ...") and carries on with less work."""
    errors = []
    for name in ("stderr.txt", "stdout.txt"):
        path = rundir / name
        if path.exists():
            errors += [ln for ln in path.read_text(errors="replace").splitlines()
                       if ln.startswith("Error:")]
    if not errors:
        return None
    return f"Postmark reported {len(errors)} failed file operations (first: {errors[0][:200]})"


def mount_option(p: dict) -> str | None:
    """Extra mount option of the measured FS this variant needs (Sync-PostMark)."""
    return "sync" if p.get("sync") else None
