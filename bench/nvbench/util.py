"""Small helpers shared by every stage: sizes, paths, tool look-up."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent.parent
REPO_DIR = BENCH_DIR.parent

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


class BenchError(Exception):
    """An error that ends one run (or the command) with a readable message."""


@contextlib.contextmanager
def failure_recorded(result: dict):
    """A run's body: a BenchError ends it as status `failed` with the message as reason;
    Ctrl-C or a signal marks it interrupted and goes on up (the caller's `finally` cleans)."""
    try:
        yield
    except BenchError as exc:
        result.update(status="failed", reason=str(exc)[:2000])
    except BaseException:
        result.update(status="failed", reason="interrupted (Ctrl-C or signal)")
        raise


def parse_size(text: str | int) -> int:
    """'256M' -> 268435456; plain integers are bytes. Binary units (K = 1024)."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", str(text), re.IGNORECASE)
    if not m:
        raise ValueError(f"not a size: {text!r} (use e.g. 512M, 2G, 4096)")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def fmt_size(nbytes: int) -> str:
    """268435456 -> '256M' (exact binary units where possible)."""
    for unit in ("T", "G", "M", "K"):
        if nbytes and nbytes % _UNITS[unit] == 0:
            return f"{nbytes // _UNITS[unit]}{unit}"
    return str(nbytes)


def which(tool: str) -> str | None:
    return shutil.which(tool, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")


def first_line(argv: list[str], timeout: float = 10) -> str | None:
    """First non-empty line of a command's stdout+stderr, or None if it cannot run."""
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    for line in (p.stdout + "\n" + p.stderr).splitlines():
        if line.strip():
            return line.strip()
    return None


def dpkg_version(package: str) -> str | None:
    if not which("dpkg-query"):
        return None
    try:
        p = subprocess.run(["dpkg-query", "-W", "-f=${Version}", package],
                           capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return p.stdout.strip() or None if p.returncode == 0 else None


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._=+-]+", "_", text).strip("_") or "x"


def process_cpu_seconds(pid: int) -> float:
    """CPU seconds process `pid` has used so far (utime + stime from /proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def unmount_bounded(mnt: Path, limit: float = 30) -> bool:
    """umount `mnt`, retrying for up to `limit` seconds (a FUSE daemon that just answered may
    still hold the mount); False if it is still mounted then."""
    deadline = time.monotonic() + limit
    while os.path.ismount(mnt):
        if subprocess.run(["umount", str(mnt)], capture_output=True).returncode == 0:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True
