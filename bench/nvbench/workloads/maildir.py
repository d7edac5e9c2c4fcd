"""Mail delivery into a Maildir, as an MTA's local delivery agent does it: create tmp/N, write
a 4 KiB message, fsync it, rename tmp/N to new/N, fsync the directory new/ (only then is the
delivery durable and may the sender be told "250 OK"). The loop is durable.py; the Maildir's
tmp/, new/, cur/ are made untimed.

Time-limited like sqlite.py (`seconds` x scale, or `bench/run --seconds N`).
"""

from __future__ import annotations

from pathlib import Path

from . import durable_invocation

CONFIGS: dict[str, dict] = {"showcase": {"seconds": 10.0}}

PRIMARY = ("tx_per_second", "tx/s", True)


def variants(config: str, scale: float) -> list[tuple[str, dict]]:
    c = CONFIGS[config]
    p = {"config": config, "scale": scale, "kind": "maildir", "message_bytes": 4096,
         "paper_seconds": c["seconds"], "seconds": round(c["seconds"] * scale, 3)}
    return [("deliveries", p)]


def invocation(p: dict, target: Path, rundir: Path):
    return durable_invocation(p, target, [])
