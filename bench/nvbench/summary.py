"""CSV rows -> aggregates (mean, std, n) -> markdown summary with ratios to a named baseline.

Improvement follows the papers: for times (lower is better) improvement = (base - x) / base;
for throughputs (higher is better) improvement = (x - base) / base. ratio = x / base always.
"""

from __future__ import annotations

import json
import re
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
        parts += ratio_table(rows, baseline, meta.get("fs"))
        parts += device_table(rows, baseline, meta.get("fs"))
        parts += nvstack_request_table(rows)
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


def paired_ratios(rows: list[dict], baseline: str) -> "OrderedDict[tuple, dict]":
    """(workload, config, variant, fs) -> per-repetition ratios x_rep / baseline_rep of the
    primary metric (runs are interleaved rep by rep, so pairing cancels slow drift)."""
    prim = {}
    for r in rows:
        if r["status"] == "ok" and r["primary"] == "1":
            prim[(r["workload"], r["config"], r["variant"], r["fs"], r["rep"])] = (
                float(r["value"]), r["metric"], r["unit"], r["higher_is_better"] == "1")
    out: "OrderedDict[tuple, dict]" = OrderedDict()
    for (w, c, v, f, rep), (x, metric, unit, hib) in prim.items():
        base = prim.get((w, c, v, baseline, rep))
        a = out.setdefault((w, c, v, f), {"ratios": [], "values": [], "metric": metric,
                                          "unit": unit, "hib": hib})
        a["values"].append(x)
        if base and base[0]:
            a["ratios"].append(x / base[0])
    return out


def ratio_table(rows: list[dict], baseline: str, fs_order: list[str] | None = None) -> list[str]:
    """One row per workload (primary metric), one column per configuration: the mean of the
    per-repetition ratios to the baseline, with their range. Empty if only one workload."""
    pr = paired_ratios(rows, baseline)
    groups = list(OrderedDict.fromkeys((w, c, v) for (w, c, v, _f) in pr))
    if len(groups) < 2:
        return []
    present = _order(rows, "fs")
    fs_order = [f for f in (fs_order or []) if f in present] + \
        [f for f in present if f not in (fs_order or [])]
    fs_order = [f for f in fs_order if f != baseline]
    out = [f"### Ratios to `{baseline}` (primary metric; mean of per-repetition ratios, "
           f"[min-max]; throughput: > 1 is faster, time: < 1 is faster)", "",
           f"| workload | metric | {baseline} mean ± std | " + " | ".join(fs_order) + " |",
           "|---|---|---:|" + "---:|" * len(fs_order)]
    for w, c, v in groups:
        b = pr.get((w, c, v, baseline))
        if not b:
            continue
        sd = statistics.stdev(b["values"]) if len(b["values"]) > 1 else 0.0
        name = c + ("" if v == "default" else f" {v}")
        cells = []
        for f in fs_order:
            a = pr.get((w, c, v, f))
            if not a or not a["ratios"]:
                cells.append("")
                continue
            r = a["ratios"]
            cells.append(f"{statistics.fmean(r):.3f} [{min(r):.3f}-{max(r):.3f}]")
        out.append(f"| {w} {name} | {b['metric']} ({b['unit']}, "
                   f"{'higher' if b['hib'] else 'lower'} is better) | "
                   f"{statistics.fmean(b['values']):.4g} ± {sd:.2g} | " + " | ".join(cells) + " |")
    return out + [""]


DEVICE_COLUMNS = [("wall_seconds", "wall time (s)", 1.0, ".1f"),
                  ("sync_seconds", "sync after (s)", 1.0, ".1f"),
                  ("dev_busy_ms", "disk busy (s)", 1e-3, ".1f"),
                  ("dev_bytes_written", "written to disk (MiB)", 1 / 2**20, ".1f"),
                  ("dev_requests", "disk requests", 1.0, ".0f")]


def device_rows(rows: list[dict], baseline: str, fs_order: list[str] | None = None) -> list[dict]:
    """Per (workload, config, variant, fs): mean wall time and modeled-disk counters over the
    timed command and the following sync (`nvstack device stat` deltas), with the wall-time
    ratio to the baseline. Empty when no run had a modeled disk."""
    acc: "OrderedDict[tuple, dict]" = OrderedDict()
    for r in rows:
        if r["status"] != "ok" or r["metric"] not in dict((c[0], 1) for c in DEVICE_COLUMNS):
            continue
        key = (r["workload"], r["config"], r["variant"], r["fs"])
        acc.setdefault(key, {}).setdefault(r["metric"], []).append(float(r["value"]))
    if not any("dev_busy_ms" in d for d in acc.values()):
        return []
    present = _order(rows, "fs")
    order = [f for f in (fs_order or []) if f in present] + \
        [f for f in present if f not in (fs_order or [])]
    def natural(v: str) -> list:          # files=2000 before files=10000
        return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", v)]
    out = []
    for (w, c, v, f) in sorted(acc, key=lambda k: (k[0], k[1], natural(k[2]),
                                                   order.index(k[3]))):
        d = acc[(w, c, v, f)]
        means = {m: statistics.fmean(x) for m, x in d.items()}
        base = acc.get((w, c, v, baseline), {}).get("wall_seconds")
        ratio = means["wall_seconds"] / statistics.fmean(base) if base and "wall_seconds" in means \
            and statistics.fmean(base) else None
        out.append({"workload": w, "config": c, "variant": v, "fs": f, "means": means,
                    "n": len(d.get("wall_seconds", [])), "ratio": ratio})
    return out


def device_table(rows: list[dict], baseline: str, fs_order: list[str] | None = None) -> list[str]:
    lines = device_rows(rows, baseline, fs_order)
    if not lines:
        return []
    out = ["### Wall time and the modeled disk (means; disk counters cover the timed command "
           "and the sync after it)", "",
           "| workload | fs | n | " + " | ".join(c[1] for c in DEVICE_COLUMNS) +
           f" | wall time / {baseline} |", "|---|---|---:|" + "---:|" * (len(DEVICE_COLUMNS) + 1)]
    for ln in lines:
        cells = [format(ln["means"][m] * k, spec) if m in ln["means"] else ""
                 for m, _h, k, spec in DEVICE_COLUMNS]
        name = ln["config"] + ("" if ln["variant"] == "default" else f" {ln['variant']}")
        out.append(f"| {ln['workload']} {name} | {ln['fs']} | {ln['n']} | " + " | ".join(cells) +
                   f" | {_fmt(ln['ratio'], '.2f')} |")
    return out + [""]


def showcase_text(result_dir: Path) -> str:
    """The comparison table `bench/run showcase` prints at the end (plain text)."""
    csvs = sorted(result_dir.glob("*.csv"))
    rows = read_csv(csvs[0]) if csvs else []
    if not rows:
        return "no results"
    meta = _meta(result_dir, rows[0]["experiment"])
    baseline = meta.get("baseline") or rows[0]["fs"]
    lines = device_rows(rows, baseline, meta.get("fs"))
    bad = [r for r in rows if r["status"] != "ok"]
    m = rows[0]
    head = (f"Postmark {m['variant']} ({m['config']}), device {m['device']}, memory budget "
            f"{int(m['memory_bytes']) >> 20} MiB per run")
    cols = ["file system", "wall time s", "sync after s", "disk busy s", "disk MiB written", "disk requests",
            f"time vs {baseline}"]
    table = [cols]
    for ln in lines:
        mm = ln["means"]
        table.append([ln["fs"], f"{mm.get('wall_seconds', 0):.1f}",
                      f"{mm.get('sync_seconds', 0):.1f}",
                      f"{mm.get('dev_busy_ms', 0) / 1e3:.1f}",
                      f"{mm.get('dev_bytes_written', 0) / 2**20:.1f}",
                      f"{mm.get('dev_requests', 0):.0f}", f"{ln['ratio']:.2f}x" if ln["ratio"] else ""])
    if not lines:
        table.append(["(no modeled-disk runs)"] + [""] * (len(cols) - 1))
    widths = [max(len(r[i]) for r in table) for i in range(len(cols))]
    text = [head, ""]
    for i, r in enumerate(table):
        text.append("  ".join(c.ljust(widths[j]) if j == 0 else c.rjust(widths[j])
                              for j, c in enumerate(r)))
        if i == 0:
            text.append("  ".join("-" * w for w in widths))
    for r in bad:
        text.append(f"{r['fs']}: {r['status']}: {r['reason'][:200]}")
    text.append("")
    text.append("wall time = the timed Postmark; disk counters are of the modeled disk "
                "(nvstack device stat) over the timed Postmark and the sync after it.")
    text.append("nvstack today passes every operation through to ext2 inside an undo-log "
                "transaction (TempFFS and the NVRAM page cache are not built yet), so it "
                "writes the same data plus FUSE and transaction costs.")
    return "\n".join(text)


def nvstack_request_table(rows: list[dict]) -> list[str]:
    """FUSE requests nvstack served during the timed workload (delta of `nvstack stat`), mean
    per run, per workload and nvstack configuration; errors in parentheses."""
    acc: "OrderedDict[tuple, dict]" = OrderedDict()
    for r in rows:
        m = r["metric"]
        if r["status"] != "ok" or not (m.startswith("nv_requests.") or m.startswith("nv_errors.")):
            continue
        key = (r["workload"], r["config"], r["variant"], r["fs"])
        kind, op = m[3:].split(".", 1)
        acc.setdefault(key, {}).setdefault((kind, op), []).append(float(r["value"]))
    if not acc:
        return []
    out = ["### nvstack: FUSE requests during the timed workload (mean per run; errors in "
           "parentheses)", "", "| workload | fs | requests |", "|---|---|---|"]
    for (w, c, v, f), d in acc.items():
        req = {op: statistics.fmean(x) for (k, op), x in d.items() if k == "requests"}
        err = {op: statistics.fmean(x) for (k, op), x in d.items() if k == "errors"}
        text = ", ".join(f"{op} {req[op]:.0f}" + (f" ({err[op]:.0f})" if err.get(op) else "")
                         for op in sorted(req, key=lambda o: -req[o]) if req[op] >= 0.5)
        name = c + ("" if v == "default" else f" {v}")
        out.append(f"| {w} {name} | {f} | {text} |")
    return out + [""]


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
