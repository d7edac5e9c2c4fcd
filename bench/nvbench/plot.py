"""CSV -> PNG figures shaped like the papers'. Reads CSVs only; never runs a benchmark.

Figure shape (thesis Figs 4.3/4.10/4.18, TempFFS Fig 3): grouped bars, one group per workload
variant (number of files, I/O size, ...; for Bonnie++ one group per test), one bar per
configuration, error bars = standard deviation over repetitions, and on a second axis the
improvement over the baseline in percent (markers + lines), as the papers draw them.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .parse import read_csv  # noqa: E402
from .summary import BONNIE_METRICS, _meta, aggregate, improvement, tables  # noqa: E402
from .util import slug  # noqa: E402


def grouped_bars(path: Path, title: str, groups: list[str], series: list[str],
                 labels: dict[str, str], mean: dict, std: dict, ylabel: str,
                 improvements: dict | None = None, baseline: str | None = None) -> Path:
    """mean[(series, group)] -> bar height; improvements[(series, group)] -> percent."""
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 + 0.5 * len(groups) * len(series)), 4.2))
    width = 0.8 / max(1, len(series))
    cmap = plt.get_cmap("tab10")
    for i, s in enumerate(series):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        ys = [mean.get((s, grp), 0.0) for grp in groups]
        es = [std.get((s, grp), 0.0) for grp in groups]
        ax.bar(xs, ys, width, yerr=es, capsize=2, label=labels.get(s, s), color=cmap(i % 10),
               edgecolor="black", linewidth=0.4)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, rotation=0 if len(groups) < 6 else 30)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    handles, names = ax.get_legend_handles_labels()
    if improvements:
        ax2 = ax.twinx()
        for i, s in enumerate(series):
            if s == baseline:
                continue
            off = (i - (len(series) - 1) / 2) * width
            pts = [(g + off, improvements[(s, grp)]) for g, grp in enumerate(groups)
                   if improvements.get((s, grp)) is not None]
            if pts:
                ax2.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color=cmap(i % 10),
                         linestyle="-" if len(pts) > 1 else "none", linewidth=1)
        ax2.axhline(0, color="grey", linewidth=0.5, linestyle=":")
        ax2.set_ylabel(f"improvement over {labels.get(baseline, baseline)} (%)")
    ax.legend(handles, names, fontsize=7, loc="upper left", bbox_to_anchor=(1.12, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_experiment(csv_path: Path, out_dir: Path) -> list[Path]:
    rows = read_csv(csv_path)
    if not rows:
        return []
    exp = rows[0]["experiment"]
    baseline = _meta(out_dir, exp).get("baseline") or rows[0]["fs"]
    agg = aggregate(rows)
    written = []
    for t in tables(rows, baseline):
        if t["workload"] == "bonnie" and t["metric"] in BONNIE_METRICS[1:]:
            continue  # drawn together with put_char below
        lines = t["lines"]
        series = list(dict.fromkeys(ln["fs"] for ln in lines))
        labels = {ln["fs"]: f"{ln['fs']} ({ln['label']})" if ln["label"] != ln["fs"] else ln["fs"]
                  for ln in lines}
        if t["workload"] == "bonnie":
            groups = [m.replace("_kBps", "") for m in BONNIE_METRICS]
            mean, std, imp = {}, {}, {}
            for (w, c, v, f, m), a in agg.items():
                if w == "bonnie" and c == t["config"] and m in BONNIE_METRICS:
                    g = m.replace("_kBps", "")
                    mean[(f, g)], std[(f, g)] = a["mean"], a["std"]
                    b = agg.get((w, c, v, baseline, m))
                    imp[(f, g)] = improvement(a["mean"], b["mean"], True) if b else None
            metric, ylabel = "bonnie", "throughput (KiB/s)"
        else:
            groups = list(dict.fromkeys(ln["variant"] for ln in lines))
            mean = {(ln["fs"], ln["variant"]): ln["mean"] for ln in lines}
            std = {(ln["fs"], ln["variant"]): ln["std"] for ln in lines}
            imp = {(ln["fs"], ln["variant"]): ln["improvement"] for ln in lines}
            metric = t["metric"]
            ylabel = f"{metric} ({lines[0]['unit']})" if lines[0]["unit"] else metric
        name = out_dir / f"{slug(exp)}-{slug(t['workload'])}-{slug(t['config'])}-{slug(metric)}.png"
        title = f"{exp}: {t['workload']} {t['config']}, {metric} (device {rows[0]['device']})"
        written.append(grouped_bars(name, title, groups, series, labels, mean, std, ylabel,
                                    imp, baseline if baseline in series else None))
    return written


def plot_dir(result_dir: Path) -> list[Path]:
    out = []
    for csv_path in sorted(result_dir.glob("*.csv")):
        out += plot_experiment(csv_path, result_dir)
    return out
