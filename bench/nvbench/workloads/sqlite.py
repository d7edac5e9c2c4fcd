"""sqlite3 with PRAGMA synchronous=FULL: single-row INSERT transactions, one COMMIT each, in
WAL mode and in rollback-journal (DELETE) mode. The transaction loop is durable.py (standard
library only; Python's sqlite3 module); this module is its configuration.

  wal     journal_mode=WAL: a commit appends the page to bench.db-wal and fsyncs it (sqlite's
          fsync is fdatasync on Linux); every 1000 WAL pages a checkpoint writes and fsyncs
          the database.
  delete  journal_mode=DELETE (sqlite's default): a commit creates bench.db-journal, writes
          and fsyncs it, fsyncs the directory, writes and fsyncs bench.db, deletes the journal.

Time-limited (`seconds`, multiplied by scale; `bench/run --seconds N` sets it absolutely): the
modeled 7200 rpm disk gives ext4 tens of commits per second, so a count small enough for
ext4 would be over in a fraction of a second on nvstack. The metric is acknowledged commits
per second of the loop (`tx_per_second`); the database and its table are made untimed
(`--init`, before the caches are dropped).
"""

from __future__ import annotations

from pathlib import Path

from . import durable_invocation

CONFIGS: dict[str, dict] = {
    "wal": {"journal_mode": "wal", "seconds": 10.0},
    "delete": {"journal_mode": "delete", "seconds": 10.0},
}

PRIMARY = ("tx_per_second", "tx/s", True)


def variants(config: str, scale: float) -> list[tuple[str, dict]]:
    c = CONFIGS[config]
    p = {"config": config, "scale": scale, "kind": "sqlite", "journal_mode": c["journal_mode"],
         "synchronous": "FULL", "paper_seconds": c["seconds"],
         "seconds": round(c["seconds"] * scale, 3)}
    return [(f"journal={c['journal_mode']}", p)]


def invocation(p: dict, target: Path, rundir: Path):
    return durable_invocation(p, target, ["--journal-mode", p["journal_mode"]])
