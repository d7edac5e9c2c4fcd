"""What a run's processes wait on while it runs: a sampler beside the timed command.

A run that stops making progress (2026-11-28: FUSE-Ext2 in Fig 4.19 made none for 14 minutes
and did not do it again in three attempts) leaves only its end counters, which cannot say who
was waiting on what. `Watch` samples, every `interval` seconds until stopped, the kernel's
dirty and write-back page counts and every process whose command line names the run's work
directory or run directory (the device daemon serving the image, nvstack's daemon over the
lower directory, the workload reading its inputs): its CPU ticks and the kernel functions its
threads sleep in (/proc/PID/task/TID/wchan). One line a sample into `progress.tsv`; `stop()`
returns the longest span in which none of those processes used CPU (`longest_still_s`) and
what they slept in at its end: a stall reads as a long still span with its wchans.

Read-only and cheap (a scan of /proc's command lines per sample); never fails the run: a
process that exits between two reads is skipped.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from pathlib import Path

# at most this many samples are written (a 6 h run at 10 s is 2,160); later ones are dropped
MAX_SAMPLES = 4000


def _meminfo() -> dict[str, int]:
    out = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("Dirty", "Writeback"):
                out[key] = int(rest.split()[0])
    except (OSError, ValueError, IndexError):
        pass
    return out


def _process(pid: str) -> tuple[str, int, Counter] | None:
    """(comm, utime + stime in ticks, wchans of its threads) of a live process, or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        ticks = int(fields[11]) + int(fields[12])
        waits: Counter = Counter()
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                # "0" (or nothing): not sleeping in the kernel - running or runnable
                wchan = (task / "wchan").read_text().strip()
                waits["running" if wchan in ("", "0") else wchan] += 1
            except OSError:
                continue
        return comm, ticks, waits
    except (OSError, ValueError, IndexError):
        return None


def processes(needles: list[str]) -> dict[int, tuple[str, int, Counter]]:
    """Every process (not this one) whose command line contains one of `needles`."""
    me = os.getpid()
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(n in cmdline for n in needles):
            p = _process(entry.name)
            if p is not None:
                found[int(entry.name)] = p
    return found


class Watch:
    """Samples in a daemon thread from start() to stop(); see the module's docstring."""

    def __init__(self, dest: Path, needles: list[str], interval: float = 10.0):
        self.dest, self.needles, self.interval = dest, [n for n in needles if n], interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nvbench-watch", daemon=True)
        self._t0 = 0.0
        self.samples = 0
        # the current still span: since when no watched process used CPU, what they waited on
        self._still_since: float | None = None
        self._last_ticks: dict[int, int] = {}
        self._last_t = 0.0
        self.longest_still_s = 0.0
        self.still_waits: dict[str, int] = {}

    def start(self) -> None:
        self._t0 = time.monotonic()
        with open(self.dest, "w") as f:
            f.write("t_s\tdirty_kB\twriteback_kB\tprocesses (pid:comm:cpu_ticks:wchan*threads,...)\n")
        self._thread.start()

    def _run(self) -> None:
        while True:
            self.sample()
            if self._stop.wait(self.interval):
                return

    def sample(self) -> None:
        if self.samples >= MAX_SAMPLES:
            return
        now = time.monotonic() - self._t0
        mem = _meminfo()
        procs = processes(self.needles)
        ticks = {pid: p[1] for pid, p in procs.items()}
        # still: something is watched and none of it used CPU since the last sample
        moved = any(ticks[pid] != self._last_ticks.get(pid) for pid in ticks)
        if procs and not moved and self._last_ticks:
            if self._still_since is None:
                self._still_since = self._last_t
            span = now - self._still_since
            if span > self.longest_still_s:
                self.longest_still_s = span
                waits: Counter = Counter()
                for _, _, w in procs.values():
                    waits.update(w)
                self.still_waits = dict(waits.most_common(12))
        else:
            self._still_since = None
        self._last_ticks, self._last_t = ticks, now
        cells = ",".join(
            f"{pid}:{comm}:{t}:" + "+".join(f"{w}*{n}" for w, n in sorted(waits.items()))
            for pid, (comm, t, waits) in sorted(procs.items()))
        with open(self.dest, "a") as f:
            f.write(f"{now:.1f}\t{mem.get('Dirty', '')}\t{mem.get('Writeback', '')}\t{cells}\n")
        self.samples += 1

    def stop(self) -> dict:
        """Stops sampling; what result.json keeps of it."""
        self._stop.set()
        self._thread.join(timeout=self.interval + 30)
        return {"samples": self.samples, "interval_s": self.interval,
                "longest_still_s": round(self.longest_still_s, 1),
                "still_waits": self.still_waits}
