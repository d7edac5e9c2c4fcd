"""The FUSE round trip of the machine a run set runs on.

Every ratio of nvstack to a kernel file system moves with what one FUSE request costs the
application on the machine (docs/benchmarks.md "The FUSE floor": 9.1 us on the VM of one
session, 32-45 us on another the same day, same kernel and code). `run_experiment` measures
it with bench/tools/fuse-floor before and after the runs of every experiment with an nvstack
configuration and keeps it in experiment.json (`fuse_floor`: `start`, `end`); the summaries
print it next to the device, so that a result set says which machine it had. `--no-floor`
skips it.
"""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[1] / "tools" / "fuse-floor"
CALLS = 20_000  # about a second a configuration at 30 us; three configurations and mounts


def parse(csv_path: Path) -> dict:
    """fuse-floor's floor.csv (one round) -> the round trips, in microseconds."""
    with open(csv_path, newline="") as f:
        us = {r["config"]: float(r["us_per_call"]) for r in csv.DictReader(f)}
    lower = us["lower"]
    return {"round_trip_us": round(us["nvstack"] - lower, 2),
            "round_trip_spin0_us": round(us["nvstack-spin0"] - lower, 2),
            "lower_us": round(lower, 2), "calls": CALLS}


def measure(binary: str, workdir: Path) -> dict:
    """One round of bench/tools/fuse-floor with `binary`; {"error": why} when it fails (the
    run set goes on: the floor describes the machine, it is not a result)."""
    out = workdir / f"fuse-floor-{os.getpid()}"
    argv = [sys.executable, str(TOOL), "--nvstack", binary, "--rounds", "1", "--calls",
            str(CALLS), "--out", str(out), "--workdir", str(out / "work")]
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            return {"error": ((p.stderr or p.stdout).strip().splitlines() or ["?"])[-1][:200]}
        return parse(out / "floor.csv")
    except (OSError, subprocess.SubprocessError, KeyError, ValueError) as exc:
        return {"error": str(exc)[:200]}
    finally:
        shutil.rmtree(out, ignore_errors=True)


def text(meta: dict) -> str:
    """One sentence for the summaries; "" when the run set has no measurement."""
    f = meta.get("fuse_floor") or {}
    parts = []
    for when in ("start", "end"):
        m = f.get(when)
        if not m:
            continue
        if "error" in m:
            parts.append(f"not measured at the {when} ({m['error']})")
        else:
            parts.append(f"{m['round_trip_us']:.1f} us at the {when} "
                         f"({m['round_trip_spin0_us']:.1f} without the spinning reader)")
    if not parts:
        return ""
    return ("FUSE round trip on this machine (`bench/tools/fuse-floor`: one STATFS request, "
            "minus the same call on the lower directory): " + ", ".join(parts)
            + ". nvstack's ratios to kernel file systems move with it.")
