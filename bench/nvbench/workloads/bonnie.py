"""Bonnie++ (Debian `bonnie++` 2.00a): the thesis' char write, block write and rewrite.

Thesis sec. 4.1: a 2 GB file on a 1 GB machine (file = 2 x memory, Bonnie++'s own rule).
Here the file is 2 x the run's memory budget M (told to Bonnie++ with -r), so `scale` is
M / 1 GiB. -n 0 skips the small-file tests; -q prints the CSV line on stdout.

The seek phase (random reads by several processes after the sequential phases) is in none of
the thesis' figures, and Bonnie++'s default of 8192 seeks by 5 processes takes ~3 minutes a
run on the modeled hdd-7200: the thesis configuration asks for 16 seeks by 1 process
(`-s SIZE:CHUNK:SEEKS:SEEKERS`), so its `seeks_per_s` is reported but measures little.
"""

from __future__ import annotations

from pathlib import Path

from . import Invocation, target_subdir

TOOL = "bonnie++"
PRIMARY = ("put_block_kBps", "KiB/s", True)
CONFIGS = {"thesis": {"paper_file_mb": 2048, "paper_memory_mb": 1024, "chunk": 8192,
                      "seeks": 16, "seekers": 1}}


def variants(config: str, scale: float, memory_bytes: int) -> list[tuple[str, dict]]:
    c = CONFIGS[config]
    ram_mb = max(16, memory_bytes >> 20)
    p = {"config": config, "scale": round(ram_mb / c["paper_memory_mb"], 4),
         "file_mb": 2 * ram_mb, "ram_mb": ram_mb, "chunk": c["chunk"],
         "paper_file_mb": c["paper_file_mb"], "seeks": c["seeks"], "seekers": c["seekers"]}
    return [(f"file={p['file_mb']}M", p)]


def invocation(p: dict, target: Path, rundir: Path) -> Invocation:
    d = target_subdir(target, "bonnie")
    size = f"{p['file_mb']}M:{p['chunk']}:{p['seeks']}:{p['seekers']}"
    argv = ["bonnie++", "-d", str(d), "-s", size, "-r", str(p["ram_mb"]),
            "-n", "0", "-u", "root", "-q", "-x", "1", "-m", "nvbench"]
    return Invocation(argv=argv, pre=[["mkdir", "-p", str(d)]], tools=[TOOL])
