"""CSV rows -> aggregates (mean, std, n) -> markdown summary with ratios to a named baseline.

Improvement follows the papers: for times (lower is better) improvement = (base - x) / base;
for throughputs (higher is better) improvement = (x - base) / base. ratio = x / base always.
"""

from __future__ import annotations

import json
import statistics
from collections import OrderedDict
from pathlib import Path

from .parse import read_csv

BONNIE_METRICS = ["put_char_kBps", "put_block_kBps", "rewrite_kBps"]


def aggregate(rows: list[dict]) -> "OrderedDict[tuple, dict]":
    """(workload, config, variant, fs, metric) -> {mean, std, n, unit, hib, label, primary}."""
    acc: "OrderedDict[tuple, dict]" = OrderedDict()
    for r in rows:
        if r["status"] != "ok" or not r["metric"]:
            continue
        key = (r["workload"], r["config"], r["variant"], r["fs"], r["metric"])
        a = acc.setdefault(key, {"values": [], "unit": r["unit"], "label": r["fs_label"],
                                 "hib": r["higher_is_better"], "primary": r["primary"] == "1"})
        a["values"].append(float(r["value"]))
    for a in acc.values():
        v = a["values"]
        a["n"] = len(v)
        a["mean"] = statistics.fmean(v)
        a["std"] = statistics.stdev(v) if len(v) > 1 else 0.0
    return acc


def improvement(x: float, base: float, higher_is_better: bool) -> float | None:
    if base == 0:
        return None
    return ((x - base) / base if higher_is_better else (base - x) / base) * 100.0


def _order(rows: list[dict], key: str) -> list[str]:
    seen: "OrderedDict[str, None]" = OrderedDict()
    for r in rows:
        seen.setdefault(r[key], None)
    return list(seen)


def tables(rows: list[dict], baseline: str) -> list[dict]:
    """One table per (workload, config, metric shown): rows for each variant x fs."""
    agg = aggregate(rows)
    fs_order = _order(rows, "fs")
    out = []
    groups = _order([{"g": f"{r['workload']}\t{r['config']}"} for r in rows], "g")
    for g in groups:
        workload, config = g.split("\t")
        metrics = [m for (w, c, _v, _f, m), a in agg.items() if w == workload and c == config
                   and (a["primary"] or (workload == "bonnie" and m in BONNIE_METRICS))]
        metrics = list(OrderedDict.fromkeys(metrics))
        # postmark's own figures are whole seconds: the external wall clock is its metric
        variants = _order([r for r in rows if r["workload"] == workload and r["config"] == config],
                          "variant")
        for metric in metrics:
            lines = []
            for variant in variants:
                base = agg.get((workload, config, variant, baseline, metric))
                for fs in fs_order:
                    a = agg.get((workload, config, variant, fs, metric))
                    if not a:
                        continue
                    hib = str(a["hib"]) == "1"
                    ratio = a["mean"] / base["mean"] if base and base["mean"] else None
                    imp = improvement(a["mean"], base["mean"], hib) if base else None
                    lines.append({"variant": variant, "fs": fs, "label": a["label"],
                                  "mean": a["mean"], "std": a["std"], "n": a["n"],
                                  "unit": a["unit"], "ratio": ratio, "improvement": imp,
                                  "hib": hib})
            if lines:
                out.append({"workload": workload, "config": config, "metric": metric,
                            "lines": lines})
    return out


def _fmt(x: float | None, spec: str = ".3g") -> str:
    return "" if x is None else format(x, spec)


def markdown(result_dir: Path) -> str:
    parts = ["# nvbench summary", ""]
    for csv_path in sorted(result_dir.glob("*.csv")):
        rows = read_csv(csv_path)
        if not rows:
            continue
        exp = rows[0]["experiment"]
        meta = _meta(result_dir, exp)
        baseline = meta.get("baseline") or rows[0]["fs"]
        parts += [f"## {exp}", ""]
        if meta.get("description"):
            parts += [meta["description"], ""]
        for note in meta.get("notes", []):
            parts += [f"> {note}", ""]
        m = rows[0]
        parts += [f"Device: `{m['device']}`; memory budget M = {int(m['memory_bytes']) >> 20} MiB "
                  f"(cgroup per run); scale = {m['scale']}; baseline = `{baseline}`; "
                  f"CSV: `{csv_path.name}`; runs and repro.sh: `runs/{exp}/`.", ""]
        for t in tables(rows, baseline):
            unit = t["lines"][0]["unit"]
            better = "higher is better" if t["lines"][0]["hib"] else "lower is better"
            parts += [f"### {t['workload']} `{t['config']}`: {t['metric']} ({unit}, {better})", "",
                      "| variant | fs | paper name | mean | std | n | ratio to baseline | improvement |",
                      "|---|---|---|---:|---:|---:|---:|---:|"]
            for ln in t["lines"]:
                imp = "" if ln["improvement"] is None else f"{ln['improvement']:+.1f}%"
                parts.append(f"| {ln['variant']} | {ln['fs']} | {ln['label']} | {_fmt(ln['mean'], '.4g')} "
                             f"| {_fmt(ln['std'], '.2g')} | {ln['n']} | {_fmt(ln['ratio'], '.3f')} | {imp} |")
            parts.append("")
        bad = [r for r in rows if r["status"] != "ok"]
        if bad:
            parts += ["### Skipped and failed runs", "", "| status | fs | workload | variant | rep | reason |",
                      "|---|---|---|---|---|---|"]
            seen = set()
            for r in bad:
                key = (r["status"], r["fs"], r["workload"], r["config"], r["variant"], r["reason"])
                if key in seen:
                    continue
                seen.add(key)
                reason = r["reason"].replace("|", "\\|").replace("\n", " ")[:300]
                parts.append(f"| {r['status']} | {r['fs']} | {r['workload']} {r['config']} | "
                             f"{r['variant']} | {r['rep']} | {reason} |")
            parts.append("")
        pngs = sorted(p.name for p in result_dir.glob(f"{exp}-*.png"))
        if pngs:
            parts += ["Figures: " + ", ".join(f"`{p}`" for p in pngs), ""]
    return "\n".join(parts) + "\n"


def _meta(result_dir: Path, exp: str) -> dict:
    for path in (result_dir / "experiment.json", result_dir / f"{exp}.experiment.json"):
        try:
            meta = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if meta.get("experiment") == exp:
            return meta
    from .experiments import EXPERIMENTS
    e = EXPERIMENTS.get(exp)
    return {"baseline": e.baseline, "description": e.description, "notes": e.notes} if e else {}


def write(result_dir: Path) -> Path:
    path = result_dir / "summary.md"
    path.write_text(markdown(result_dir))
    return path
