"""Memory budgets with the cgroup v1 memory controller.

One run = one child cgroup `nvbench-<pid>-<n>` under /sys/fs/cgroup/memory with
memory.limit_in_bytes = the run's budget M. The benchmark (and, for nvstack, the daemon, whose
NVRAM region pages are charged when it first touches them) start inside it through a wrapper:

    sh -c 'echo $$ > /sys/fs/cgroup/memory/nvbench-1-1/cgroup.procs && exec "$@"' sh CMD...

We only ever create and remove our own child cgroups.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from .shell import Shell

ROOT = Path("/sys/fs/cgroup/memory")
_seq = 0


def available(root: Path = ROOT) -> bool:
    return (root / "memory.limit_in_bytes").exists() and os.access(root, os.W_OK)


class MemoryCgroup:
    def __init__(self, shell: Shell, limit_bytes: int, root: Path = ROOT, name: str | None = None):
        global _seq
        _seq += 1
        self.shell = shell
        self.limit = limit_bytes
        self.path = root / (name or f"nvbench-{os.getpid()}-{_seq}")
        self.created = False

    def create(self) -> None:
        self.shell.run(["mkdir", str(self.path)])
        self.created = True
        self.shell.sh(f"echo {self.limit} > {self.path}/memory.limit_in_bytes")

    def wrap(self, argv: list[str]) -> list[str]:
        return ["sh", "-c", f'echo $$ > {self.path}/cgroup.procs && exec "$@"', "sh", *argv]

    def stats(self) -> dict:
        """Peak usage and limit hits after the run (empty in dry-run)."""
        out = {"path": str(self.path), "limit_bytes": self.limit}
        if self.shell.dry_run:
            return out
        for key in ("max_usage_in_bytes", "failcnt", "usage_in_bytes"):
            try:
                out[key] = int((self.path / f"memory.{key}").read_text().strip())
            except (OSError, ValueError):
                pass
        try:
            stat = (self.path / "memory.stat").read_text().split("\n")
            out["stat"] = {k: int(v) for k, v in (l.split() for l in stat if l.strip())}
        except (OSError, ValueError):
            pass
        return out

    def remove(self) -> None:
        """rmdir the cgroup; remaining page-cache charges move to the parent."""
        if not self.created:
            return
        if self.shell.dry_run:
            self.shell.run(["rmdir", str(self.path)], check=False)
            return
        for attempt in range(20):
            res = self.shell.run(["rmdir", str(self.path)], check=False, log=attempt == 0)
            if res.returncode == 0 or not self.path.exists():
                self.created = False
                return
            time.sleep(0.25)  # tasks of ours may still be exiting
