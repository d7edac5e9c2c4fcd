"""The NVFAT experiment's results (issue 15): CSV rows of `nvfat` plus each run's device
counters (OUT/runs/.../device_stat_{before,after}.json) -> one table per workload (Async- and
Sync-PostMark), the paper's goals met or missed, and the data of its Figures 4-8. Reads files
only.

Ratios are VFAT / NVFAT of the same workload in the same run set (higher is better for NVFAT):
  time      Postmark's wall-clock seconds (the paper's execution time)
  erases    mean and standard deviation of the erase count per physical block (wear levelling)
  energy    the flash chip's energy (reads, programs, erases; the paper's Figure 8 model)
Goals (issue 15, the paper at 128 KiB): Sync-PostMark time >= 13.6x, Async-PostMark time >=
1.33x, erase mean, erase deviation and energy >= 14x lower (Sync-PostMark, 114.2 J -> 7.9 J).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

EXPERIMENTS = ("nvfat",)
BASELINE = "vfat"
GOAL_FS = "nvfat-128k"
GOALS = [  # (workload config, quantity, goal ratio, the paper's figure)
    ("nvfat-sync", "time", 13.6, "Sync-PostMark 14,883 s -> 1,096 s"),
    ("nvfat-async", "time", 1.33, "Async-PostMark +32.5 %"),
    ("nvfat-sync", "erase_mean", 14.0, "erase mean (Fig 7)"),
    ("nvfat-sync", "erase_stddev", 14.0, "erase deviation (Fig 7)"),
    ("nvfat-sync", "energy", 14.0, "114.2 J -> 7.9 J (Fig 8)"),
]
WORKLOADS = {"nvfat-async": "Async-PostMark", "nvfat-sync": "Sync-PostMark (-o sync)"}


def is_nvfat(rows: list[dict]) -> bool:
    return bool(rows) and rows[0]["experiment"] in EXPERIMENTS


def cache_kib(fs: str) -> int:
    """NVRAM cache size of a configuration in KiB (0 for VFAT)."""
    m = re.fullmatch(r"nvfat-(\d+)k", fs)
    return int(m.group(1)) if m else 0


def _run_dir(result_dir: Path, row: dict) -> Path:
    """The run directory under result_dir (the CSV keeps the path of the original run)."""
    p = row.get("run_dir", "")
    i = p.find("runs/")
    return result_dir / p[i:] if i >= 0 else Path(p)


def _load(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def histogram_delta(before: dict, after: dict, key: str) -> dict | None:
    """The per-bucket sums of one of the device's histograms (`lbn_writes`, `page_writes`,
    `block_erase_counts`) over the run: after minus before."""
    a = (after.get("flash") or {}).get(key)
    if not isinstance(a, dict):
        return None
    b = (before.get("flash") or {}).get(key) or {}
    sums = list(a.get("sum", []))
    for i, v in enumerate(b.get("sum", [])[:len(sums)]):
        sums[i] -= v
    return {"item": a.get("item"), "items": a.get("items"), "per_bucket": a.get("per_bucket"),
            "sum": sums}


def lines(rows: list[dict], result_dir: Path | None = None) -> list[dict]:
    """One line per (workload config, fs) with the measured quantities (means over reps)."""
    acc: dict[tuple, dict] = {}
    for r in rows:
        if r["status"] != "ok" or not r["metric"]:
            continue
        key = (r["config"], r["fs"])
        d = acc.setdefault(key, {"config": r["config"], "fs": r["fs"], "reps": {}})
        d["reps"].setdefault(r["rep"], {})[r["metric"]] = float(r["value"])
        d.setdefault("run_dirs", {})[r["rep"]] = r
    out = []
    for (config, fs), d in acc.items():
        reps = list(d["reps"].values())

        def mean(metric: str, reps=reps) -> float | None:
            vals = [m[metric] for m in reps if metric in m]
            return sum(vals) / len(vals) if vals else None

        line = {"config": config, "fs": fs, "kib": cache_kib(fs), "n": len(reps),
                "time": mean("wall_seconds"), "durable": mean("durable_seconds"),
                "busy_s": (mean("dev_busy_ms") or 0.0) / 1000.0,
                "host_programs": mean("dev_flash.host_page_programs"),
                "programs": mean("dev_flash.page_programs"),
                "erases": mean("dev_flash.block_erases"),
                "merges_switch": mean("dev_flash.merges_switch"),
                "merges_partial": mean("dev_flash.merges_partial"),
                "merges_full": mean("dev_flash.merges_full"),
                "energy": (mean("dev_flash.energy_uj") or 0.0) / 1e6,
                "absorbed": mean("dev_nvcache.writes_absorbed"),
                "destaged": mean("dev_nvcache.destaged"),
                "erase_mean": None, "erase_stddev": None, "erase_max": None}
        if result_dir is not None:
            ms, ss, xs = [], [], []
            for r in d["run_dirs"].values():
                after = _load(_run_dir(result_dir, r) / "device_stat_after.json")
                fl = after.get("flash") or {}
                if "erase_count_mean" in fl:
                    ms.append(fl["erase_count_mean"])
                    ss.append(fl["erase_count_stddev"])
                    xs.append(fl["erase_count_max"])
            if ms:
                line.update(erase_mean=sum(ms) / len(ms), erase_stddev=sum(ss) / len(ss),
                            erase_max=max(xs))
        out.append(line)
    out.sort(key=lambda ln: (ln["config"], ln["kib"]))
    return out


def ratio(base: float | None, x: float | None) -> float | None:
    """base / x: how many times smaller x is (None when either is missing or x is 0)."""
    if base is None or x is None or x == 0:
        return None
    return base / x


def goals(ls: list[dict]) -> list[dict]:
    by = {(ln["config"], ln["fs"]): ln for ln in ls}
    out = []
    for config, q, goal, paper in GOALS:
        b, x = by.get((config, BASELINE)), by.get((config, GOAL_FS))
        got = ratio(b.get(q), x.get(q)) if b and x else None
        out.append({"config": config, "quantity": q, "goal": goal, "paper": paper,
                    "base": b.get(q) if b else None, "value": x.get(q) if x else None,
                    "ratio": got, "met": got is not None and got >= goal})
    return out


def _f(x, spec: str = ".3g", suffix: str = "") -> str:
    return "-" if x is None else f"{x:{spec}}{suffix}"


def markdown(rows: list[dict], result_dir: Path) -> list[str]:
    ls = lines(rows, result_dir)
    parts = []
    for config, title in WORKLOADS.items():
        sel = [ln for ln in ls if ln["config"] == config]
        if not sel:
            continue
        base = next((ln for ln in sel if ln["fs"] == BASELINE), None)
        parts += [f"### {title}", "",
                  "| fs | NVRAM | Postmark s | VFAT/x | until durable s | device busy s | "
                  "host page writes | merges switch/partial/full | erases | erase mean | "
                  "erase std | erase max | energy J | NVRAM absorbed | destaged |",
                  "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
        for ln in sel:
            r = ratio(base["time"], ln["time"]) if base else None
            merges = "/".join(_f(ln[k], ".0f") for k in ("merges_switch", "merges_partial",
                                                         "merges_full"))
            parts.append(
                f"| {ln['fs']} | {ln['kib'] or '-'} {'KiB' if ln['kib'] else ''} | "
                f"{_f(ln['time'], '.1f')} | {_f(r, '.2f', 'x')} | {_f(ln['durable'], '.1f')} | "
                f"{_f(ln['busy_s'], '.1f')} | {_f(ln['host_programs'], '.0f')} | {merges} | "
                f"{_f(ln['erases'], '.0f')} | {_f(ln['erase_mean'], '.2f')} | "
                f"{_f(ln['erase_stddev'], '.2f')} | {_f(ln['erase_max'], '.0f')} | "
                f"{_f(ln['energy'], '.2f')} | {_f(ln['absorbed'], '.0f')} | "
                f"{_f(ln['destaged'], '.0f')} |")
        parts.append("")
    gs = goals(ls)
    if any(g["ratio"] is not None for g in gs):
        parts += [f"### Goals (issue 15: {GOAL_FS} vs {BASELINE})", "",
                  "| workload | quantity | VFAT | NVFAT 128 KiB | ratio | goal | the paper | met |",
                  "|---|---|---:|---:|---:|---:|---|---|"]
        for g in gs:
            parts.append(f"| {WORKLOADS[g['config']]} | {g['quantity']} | {_f(g['base'], '.4g')} | "
                         f"{_f(g['value'], '.4g')} | {_f(g['ratio'], '.2f', 'x')} | "
                         f"{g['goal']}x | {g['paper']} | {'yes' if g['met'] else 'no'} |")
        parts.append("")
    return parts


def histograms(rows: list[dict], result_dir: Path, config: str, key: str) -> dict[str, dict]:
    """fs -> the histogram `key` over the run of workload `config` (first repetition)."""
    out = {}
    for r in rows:
        if r["status"] != "ok" or r["config"] != config or r["fs"] in out or r["rep"] != "1":
            continue
        d = _run_dir(result_dir, r)
        h = histogram_delta(_load(d / "device_stat_before.json"),
                            _load(d / "device_stat_after.json"), key)
        if h:
            out[r["fs"]] = h
    return out
