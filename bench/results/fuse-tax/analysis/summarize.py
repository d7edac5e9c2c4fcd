#!/usr/bin/env python3
"""run-probes.sh outputs -> probes.md: per workload and configuration, wall time, FUSE
requests per opcode (kernel tracepoint), daemon CPU (perf stat task-clock) and CPU per request.
Mean over repetitions, [min-max] for wall and CPU.

The probe directories (postmark/, randwrite/, ...) are kept in git packed as probes.tar.xz
(bench/README.md, "Results in git"); this script unpacks them first when they are missing. `--unpack` only unpacks; `--pack` packs
the probe directories present into probes.tar.xz (run-probes.sh does both)."""
import json
import re
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKLOADS = ("postmark", "randwrite", "seqwrite", "seqread", "randread")
sys.path.insert(0, str(HERE.parents[2]))  # bench/, for nvbench.archive
from nvbench import archive  # noqa: E402


def load(rep: Path):
    out = {}
    try:
        out["wall"] = float((rep / "wall.txt").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    try:
        out["req"] = json.loads((rep / "opcount.json").read_text())["requests"]
    except (OSError, ValueError, KeyError):
        out["req"] = {}
    try:
        out["cpu_s"] = float((rep / "cpu.txt").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        out["cpu_s"] = None
    text = (rep / "perf-stat.txt").read_text() if (rep / "perf-stat.txt").exists() else ""
    m = re.search(r"([\d.,]+)\s+msec task-clock", text)
    out["cpu_ms"] = float(m.group(1).replace(",", "")) if m else None
    m = re.search(r"([\d,]+)\s+context-switches", text)
    out["cs"] = int(m.group(1).replace(",", "")) if m else None
    return out


def fmt(xs, spec=".2f"):
    xs = [x for x in xs if x is not None]
    if not xs:
        return ""
    if len(xs) == 1:
        return format(xs[0], spec)
    return f"{format(statistics.fmean(xs), spec)} [{format(min(xs), spec)}-{format(max(xs), spec)}]"


def main():
    if sys.argv[1:] == ["--pack"]:
        print(archive.pack(HERE, members=WORKLOADS, name="probes.tar.xz"))
        return 0
    if archive.unpack(HERE, members=WORKLOADS, name="probes.tar.xz"):
        print(f"unpacked {HERE / 'probes.tar.xz'}")
    if sys.argv[1:] == ["--unpack"]:
        return 0
    lines = ["# fuse-tax probes (bench/results/fuse-tax/analysis/run-probes.sh)", "",
             "Daemon CPU = utime+stime of the daemon process (/proc/PID/stat, all threads) over "
             "the command; context switches from `perf stat -p` (threads present at start); requests = "
             "kernel tracepoint fuse:fuse_request_send counted per opcode (bench/tools/"
             "fuse-opcount). Mean [min-max] over repetitions.", ""]
    for wl in sorted(p for p in HERE.iterdir() if p.is_dir()):
        lines += [f"## {wl.name}", "", "| config | n | wall s | daemon CPU s | requests | "
                  "CPU µs/request | ctx switches/request | requests per opcode (mean) |",
                  "|---|---:|---:|---:|---:|---:|---:|---|"]
        for cfg in sorted(p for p in wl.iterdir() if p.is_dir()):
            reps = [r for r in (load(x) for x in sorted(cfg.glob("rep*"))) if r]
            if not reps:
                continue
            tot = [sum(c["count"] for c in r["req"].values()) for r in reps]
            per = [r["cpu_s"] * 1e6 / t if r["cpu_s"] and t else None for r, t in zip(reps, tot)]
            csr = [r["cs"] / t if r["cs"] and t else None for r, t in zip(reps, tot)]
            ops = {}
            for r in reps:
                for op, c in r["req"].items():
                    ops.setdefault(op, []).append(c["count"])
            optext = ", ".join(f"{op} {statistics.fmean(v):.0f}" for op, v in
                               sorted(ops.items(), key=lambda kv: -statistics.fmean(kv[1])))
            lines.append(f"| {cfg.name} | {len(reps)} | {fmt([r['wall'] for r in reps])} | "
                         f"{fmt([r['cpu_s'] for r in reps])} | "
                         f"{statistics.fmean(tot):.0f} | {fmt(per, '.1f')} | {fmt(csr, '.2f')} | "
                         f"{optext} |")
        lines.append("")
    (HERE / "probes.md").write_text("\n".join(lines) + "\n")
    print(HERE / "probes.md")


if __name__ == "__main__":
    sys.exit(main())
