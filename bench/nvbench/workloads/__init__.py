"""Workloads: each turns (parameters, target directory) into input files + a timed command,
and knows which tool it needs. Parsing of the tools' outputs lives in nvbench/parse.py.

A workload's parameters are a dict; `scale` multiplies the counts the papers used (files,
transactions, bytes written); every scaled value and the factor itself are written into the
run's env.json.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable


@dataclass
class Invocation:
    argv: list[str]                                     # the timed command
    files: dict[str, str] = field(default_factory=dict)  # rundir-relative name -> content
    pre: list[list[str]] = field(default_factory=list)   # untimed, in the cgroup, before drop caches
    # untimed, in the cgroup, on the kernel FS before a stacked FS is mounted over it: called
    # with the directory the target will show (<kernel FS>/data, or the kernel FS itself for a
    # kernel configuration); returns the commands (e.g. a file laid out that nvstack never saw)
    pre_lower: Callable[[Path], list[list[str]]] | None = None
    tools: list[str] = field(default_factory=list)       # executables that must exist
    note: str = ""


def scaled(value: float, scale: float, minimum: int = 1) -> int:
    return max(minimum, int(round(value * scale)))


def get(name: str):
    from . import applog, bonnie, filecreate, filedelete, fio, maildir, postmark, sqlite, untar
    table = {"postmark": postmark, "bonnie": bonnie, "fio": fio, "untar": untar,
             "filedelete": filedelete, "sqlite": sqlite, "maildir": maildir, "applog": applog,
             "filecreate": filecreate}
    if name not in table:
        raise KeyError(f"unknown workload {name!r}; known: {', '.join(sorted(table))}")
    return table[name]


def target_subdir(target: Path, name: str) -> Path:
    return target / f"nvbench-{name}"


# durable.py: the transaction loops of sqlite, maildir, applog and filecreate (standard
# library only)
DURABLE_DRIVER = Path(__file__).resolve().parent / "durable.py"


def durable_invocation(p: dict, target: Path, extra: list[str]) -> Invocation:
    """The timed durable.py loop of one of the workloads sqlite, maildir, applog, filecreate:
    its directory is made and prepared (`--init`) untimed, through the measured file system.
    The loop ends after p["seconds"], or after p["count"] transactions if that comes first."""
    loc = target_subdir(target, p["kind"])
    base = [sys.executable, str(DURABLE_DRIVER), p["kind"], "--dir", str(loc), *extra]
    limit = ["--seconds", str(p["seconds"])] + (["--count", str(p["count"])]
                                                  if p.get("count") else [])
    return Invocation(argv=[*base, *limit], pre=[["mkdir", "-p", str(loc)], [*base, "--init"]],
                      tools=[sys.executable])


def sync_point_argv(target: Path) -> list[str]:
    """durable.py sync-point on the measured FS (see durable.py): the group commit of nvstack's
    journal mode after a benchmark that ends at a durability point."""
    return [sys.executable, str(DURABLE_DRIVER), "sync-point", "--dir", str(target)]
