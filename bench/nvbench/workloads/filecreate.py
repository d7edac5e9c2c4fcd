"""Many small files made durable one by one, fs_mark -S 1 style (`fs_mark -s 4096 -S 1`: create,
write 4 KiB, fsync before close): create files/N, write 4 KiB, fsync, close; the files stay,
all in one directory. The loop is durable.py (kind `files`); the directory is made untimed.

Time-limited like sqlite.py (`seconds` x scale, or `bench/run --seconds N`), with a cap on the
number of files (`count`): nvstack keeps new files in NVRAM (TempFFS), a file and its 4 KiB take
two frames, and the cap keeps the set inside the region of the durability experiment (10,000
files = 80 MiB of a 256 MiB region), so the loop measures the durability call and not NVRAM
pressure.
"""

from __future__ import annotations

from pathlib import Path

from . import durable_invocation

CONFIGS: dict[str, dict] = {"fsync": {"seconds": 10.0, "count": 10_000}}

PRIMARY = ("tx_per_second", "tx/s", True)


def variants(config: str, scale: float) -> list[tuple[str, dict]]:
    c = CONFIGS[config]
    p = {"config": config, "scale": scale, "kind": "files", "file_bytes": 4096,
         "paper_seconds": c["seconds"], "seconds": round(c["seconds"] * scale, 3),
         "count": c["count"]}
    return [("create+write+fsync", p)]


def invocation(p: dict, target: Path, rundir: Path):
    return durable_invocation(p, target, [])
