"""Raw run directories <-> one compressed archive per result directory.

A run directory is many small files (stdout, env.json, repro.sh, counters per run), which git
stores badly and every clone pays for; compressed, an experiment's runs take tens of KB. So
git keeps OUT/raw.tar.xz and ignores OUT/runs/ (bench/.gitignore):

    run    -> OUT/runs/**  then  pack(OUT)   -> OUT/raw.tar.xz    (runs/ exactly, sorted)
    parse  -> unpack(OUT) if OUT/runs/ is missing, then parse OUT/runs/**

The archive holds the paths `runs/...` relative to OUT, with owner, group and mtime
normalised, so packing the same runs twice gives the same bytes (no churn in git).
"""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

from .util import BenchError

ARCHIVE = "raw.tar.xz"
RUNS = "runs"
# The archive's fixed mtime (2020-01-01): run times are in each run's result.json/env.json.
_MTIME = 1577836800


def _normalise(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = _MTIME
    return info


def pack(out: Path, members: tuple[str, ...] = (RUNS,), name: str = ARCHIVE) -> Path | None:
    """OUT/runs/ (or the given directories of OUT) -> OUT/raw.tar.xz (or OUT/name), replacing
    it; None when none of them exists."""
    present = sorted(m for m in members if (out / m).is_dir())
    if not present:
        return None
    path = out / name
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz", preset=9) as tar:
        # tarfile.add walks directories in sorted order: the member order is deterministic.
        for m in present:
            tar.add(out / m, arcname=m, filter=_normalise)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(buf.getvalue())
    os.replace(tmp, path)
    return path


def unpack(out: Path, members: tuple[str, ...] = (RUNS,), name: str = ARCHIVE) -> bool:
    """OUT/raw.tar.xz (or OUT/name) -> OUT/runs/ (or the given directories) when none of them
    exists; True if it unpacked something. Only plain files and directories under those
    names are accepted."""
    path = out / name
    if any((out / m).exists() for m in members) or not path.is_file():
        return False

    def allowed(m: tarfile.TarInfo) -> bool:
        parts = Path(m.name).parts
        return bool(parts) and parts[0] in members and ".." not in parts and (m.isfile() or m.isdir())

    with tarfile.open(path, mode="r:xz") as tar:
        bad = [m.name for m in tar.getmembers() if not allowed(m)]
        if bad:
            raise BenchError(f"{path}: unexpected members {bad[:3]} (only {', '.join(members)})")
        tar.extractall(out, filter="data")
    return True
