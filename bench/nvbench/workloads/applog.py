"""An application log that must not lose a record it acknowledged: append one 512-byte record
(O_APPEND) and fdatasync, per transaction. The loop is durable.py; the (empty) log file is
created untimed.

Time-limited like sqlite.py (`seconds` x scale, or `bench/run --seconds N`).
"""

from __future__ import annotations

from pathlib import Path

from . import durable_invocation

CONFIGS: dict[str, dict] = {"showcase": {"seconds": 10.0}}

PRIMARY = ("tx_per_second", "tx/s", True)


def variants(config: str, scale: float) -> list[tuple[str, dict]]:
    c = CONFIGS[config]
    p = {"config": config, "scale": scale, "kind": "applog", "record_bytes": 512,
         "paper_seconds": c["seconds"], "seconds": round(c["seconds"] * scale, 3)}
    return [("append+fdatasync", p)]


def invocation(p: dict, target: Path, rundir: Path):
    return durable_invocation(p, target, [])
