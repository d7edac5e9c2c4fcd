"""The thesis' chapter-4 figures, regenerated from the harness' results: one command each.

    bench/run figure 4.18 --from bench/results/thesis-matrix --out docs/figures
    bench/run figure 4.18 --out /tmp/fig418          # runs its experiment first (see FIGURES)

A figure is data: the experiment that measures it, the configurations it draws and how. With
`--from DIR` the command only draws (unpacking and parsing DIR's raw runs when its CSV is
missing); without it, it runs the experiment restricted to the figure's configurations into
OUT/<experiment>/ and draws from that. Figures 4.3-4.6 and 4.11-4.12 are single panels of the experiments' own
four-panel figures (plot.tempffs_figure, plot.writeback_figure).

The matrix figures (4.15, 4.18) may draw from several result directories of one experiment
(`--from A --from B`): a configuration is drawn from the last directory that has it, and its
ratios are paired with the baselines (ext2, ext4 data=journal) of that same directory - a
ratio is only ever measured side by side, never across runs of different days. The figure
names each directory and what it supplied.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from .util import BenchError


@dataclass(frozen=True)
class Figure:
    number: str
    title: str                  # the thesis' caption
    experiment: str
    fs: tuple[str, ...] | None  # configurations drawn (None: all of the experiment's)
    kind: str                   # "matrix" | "tempffs" | "writeback" | "bars"
    base: str | None = None     # "bars": the configuration improvements are relative to


# Table 4.2 in the thesis' order: (name without accounting suffix, the thesis' label, group).
# Group 1 gives no consistency after a crash, group 2 does (Figs 4.16-4.19 draw them apart).
MATRIX_ROWS = [
    ("ext2", "Ext2", 1), ("nvstack-ext2", "FUSE-Ext2 (all off)", 1),
    ("nvstack-ext2-tempffs", "TempFFS", 1), ("nvstack-ext2-wb", "WB", 1),
    ("nvstack-ext2-tempffs-wb", "TempFFS_WB", 1),
    ("ext4-ordered", "Ext4 ordered", 2), ("ext4-journal", "Ext3 (ext4 data=journal)", 2),
    ("ext4-journal-ram", "Mext3 (journal in RAM)", 2), ("nvstack-ext2-trans", "Ext2_Trans", 2),
    ("nvstack-ext2-tempffs-trans", "TempFFS_Trans", 2), ("nvstack-ext2-wb-trans", "WB_Trans", 2),
    ("nvstack-ext2-tempffs-wb-trans", "TempFFS_WB_Trans", 2),
]
TRANS_ROWS = ("ext4-journal", "ext4-journal-ram", "nvstack-ext2-trans")
# Bonnie++'s metrics by the thesis' names for its tests
BONNIE_TESTS = {"put_char_kBps": "char write", "put_block_kBps": "block write",
                "rewrite_kBps": "rewrite"}
ACCOUNTINGS = ("charged", "extra")

FIGURES = {f.number: f for f in [
    Figure("4.1", "Performance Improvements of TempFFS (Bonnie++)", "thesis-bonnie",
           ("ext2", "nvstack-ext2-tempffs"), "bars"),
    Figure("4.2", "Performance Improvements of TempFFS (Untar and Compile Linux Kernel)",
           "thesis-untar", ("ext2", "nvstack-ext2-tempffs"), "bars"),
    Figure("4.3", "Performance Improvements of TempFFS (Postmark)", "tempffs-postmark", None,
           "tempffs"),
    Figure("4.4", "Percentages of Files Deleted in TempFFS (Postmark)", "tempffs-postmark",
           None, "tempffs"),
    Figure("4.5", "Reduction of IO Traffic with TempFFS", "tempffs-postmark", None, "tempffs"),
    Figure("4.6", "Average File Span (Postmark)", "tempffs-postmark", None, "tempffs"),
    Figure("4.7", "Performance Comparison of the Write Back Policies (Bonnie++)",
           "thesis-bonnie", ("ext2", "nvstack-ext2-wb"), "bars"),
    Figure("4.8", "Performance Comparison of the Write Back Policies (Untar and Compile)",
           "thesis-untar", ("ext2", "nvstack-ext2-wb"), "bars"),
    Figure("4.10", "Performance Comparison of the Write Back Policies (Postmark)",
           "writeback-policies", ("nvstack-ext2-wb-file", "nvstack-ext2-wb-recency",
                                  "nvstack-ext2-wb-location", "nvstack-ext2-wb-relo"), "bars",
           "nvstack-ext2-wb-file"),
    Figure("4.11", "Accumulate Inter-requests Distance (Postmark)", "writeback-policies", None,
           "writeback"),
    Figure("4.12", "Repeated Write Back Blocks (Postmark)", "writeback-policies", None,
           "writeback"),
    Figure("4.13", "Performance of the Transactions Support Mechanism (Bonnie++)",
           "thesis-bonnie", ("ext4-journal", "ext4-journal-ram", "nvstack-ext2-trans"), "bars"),
    Figure("4.14", "Performance of the Transactions Support Mechanism (Untar and Compile)",
           "thesis-untar", ("ext4-journal", "ext4-journal-ram", "nvstack-ext2-trans"), "bars"),
    Figure("4.15", "Performance of the Transactions Support Mechanism (Postmark)",
           "thesis-matrix", tuple(f"{n}-{a}" if n.startswith("nvstack") else n
                                  for n in TRANS_ROWS for a in ACCOUNTINGS), "matrix"),
    Figure("4.16", "Performance Results of Different Combinations (Bonnie++)", "thesis-bonnie",
           None, "bars"),
    Figure("4.17", "Performance Results of Different Combinations (Untar and Compilation)",
           "thesis-untar", None, "bars"),
    Figure("4.18", "Performance Results of Different Combinations (Postmark, 512-10K bytes)",
           "thesis-matrix", None, "matrix"),
    Figure("4.19", "Performance Results of Different Combinations (Postmark, 512-2M bytes)",
           "thesis-postmark-2m", None, "bars"),
]}
# Fig 4.9 (zone, segment and zone/segment locative policies) has no experiment: nvstack builds
# only relo's zone/segment ordering, not the two halves on their own.


def _paired_ratios(rows: list[dict], base: str, fs: str) -> list[float]:
    """wall(base) / wall(fs) for each repetition both have in the same result directory
    (the rows' `source`, "" for one directory): throughput relative to base."""
    wall = {}
    for r in rows:
        if r["status"] == "ok" and r["metric"] == "wall_seconds" and r["value"]:
            wall[(r["fs"], r.get("source", ""), r["rep"])] = float(r["value"])
    return [wall[(base, src, rep)] / wall[(fs, src, rep)] for (f, src, rep) in wall
            if f == fs and (base, src, rep) in wall and wall[(fs, src, rep)] > 0]


def merge_sources(sources: list[tuple[str, list[dict]]]) -> list[dict]:
    """Rows of several result directories of one experiment, (name, rows) in order, as one
    list: each configuration keeps the rows of the last directory that has it, and each
    directory's baselines stay (tagged, not drawn) so that its configurations' ratios pair
    with them. Every row gets `source` (the directory's name) and `drawn` (whether it is the
    configuration's chosen directory). Directories measured on different devices, scales or
    budgets are refused: their bars would not compare."""
    keys = {}
    for name, rows in sources:
        for r in rows:
            if r["status"] == "ok":
                keys.setdefault((r["device"], r["scale"], r["memory_bytes"]), set()).add(name)
    if len(keys) > 1:
        raise BenchError("result directories of different runs' shapes cannot share a "
                         "figure: " + "; ".join(f"{', '.join(sorted(v))}: device {k[0]}, "
                                                f"scale {k[1]}, memory {k[2]} B"
                                                for k, v in keys.items()))
    chosen = {}
    for name, rows in sources:
        for r in rows:
            if r["status"] == "ok":
                chosen[r["fs"]] = name
    return [dict(r, source=name, drawn=chosen.get(r["fs"]) == name)
            for name, rows in sources for r in rows]


def _mean_std(xs: list[float]) -> tuple[float, float] | None:
    if not xs:
        return None
    return statistics.fmean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0


def matrix_table(rows: list[dict], names: list[str] | None = None) -> list[dict]:
    """One row per Table 4.2 configuration and accounting present in `rows`: throughput
    (transactions per wall second) mean/std, and the paired ratios to ext2 and to ext4
    data=journal (mean/std over repetitions)."""
    # rows of merge_sources: only a configuration's chosen directory is drawn and paired
    drawn = [r for r in rows if r.get("drawn", True)]
    present = {r["fs"] for r in drawn if r["status"] == "ok"}
    source = {r["fs"]: r.get("source", "") for r in drawn}
    tx = {}
    for r in drawn:
        if r["status"] == "ok" and r["metric"] == "pm_tx_per_wall_second":
            tx.setdefault(r["fs"], []).append(float(r["value"]))
    wall = {}
    for r in drawn:
        if r["status"] == "ok" and r["metric"] == "wall_seconds":
            wall.setdefault(r["fs"], []).append(float(r["value"]))
    # the baselines' rows of the directory each configuration is drawn from
    def pairing(fs: str) -> list[dict]:
        return [r for r in rows if r.get("source", "") == source[fs]]
    out = []
    for base_name, label, group in MATRIX_ROWS:
        variants = ([(base_name, "")] if not base_name.startswith("nvstack")
                    else [(f"{base_name}-{a}", a) for a in ACCOUNTINGS])
        for fs, acct in variants:
            if fs not in present or (names is not None and fs not in names):
                continue
            out.append({"fs": fs, "label": label, "group": group, "accounting": acct,
                        "tx": _mean_std(tx.get(fs, [])), "wall": _mean_std(wall.get(fs, [])),
                        "n": len(wall.get(fs, [])),
                        "source": source[fs],
                        "vs_ext2": _mean_std(_paired_ratios(pairing(fs), "ext2", fs)),
                        "vs_ext4_journal": _mean_std(_paired_ratios(pairing(fs),
                                                                    "ext4-journal", fs))})
    return out


def matrix_figure(rows: list[dict], path: Path, title: str, names: list[str] | None) -> Path:
    """Fig 4.15/4.18 shape: throughput bars (std as error bars), group 1 (no consistency) left,
    group 2 right, each nvstack configuration as two bars (NVRAM charged / extra), the ratio
    to ext2 (group 1) or to ext4 data=journal (group 2) printed above each bar."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    table = matrix_table(rows, names)
    if not table:
        raise BenchError(f"no Table 4.2 configurations in the results for {path.name}")
    fig, ax = plt.subplots(figsize=(max(7.0, 0.55 * len(table) + 2), 4.8))
    colors = {"": "#888888", "charged": "#1f77b4", "extra": "#ff7f0e"}
    xs, x, last_group = [], 0.0, None
    for t in table:
        if last_group is not None and t["group"] != last_group:
            x += 0.8
        xs.append(x)
        last_group = t["group"]
        x += 1.0 if t["accounting"] != "charged" else 0.85
    for t, xpos in zip(table, xs):
        mean, std = t["tx"] or (0.0, 0.0)
        ax.bar(xpos, mean, 0.8, yerr=std, capsize=2, color=colors[t["accounting"]],
               edgecolor="black", linewidth=0.4)
        ratio = t["vs_ext2"] if t["group"] == 1 else t["vs_ext4_journal"]
        if ratio:
            ax.annotate(f"{ratio[0]:.2f}x", (xpos, mean + std), ha="center", va="bottom",
                        fontsize=6, xytext=(0, 2), textcoords="offset points")
    ax.set_xticks(xs)
    ax.set_xticklabels([t["label"] + (f"\n{t['accounting']}" if t["accounting"] else "")
                        for t in table], rotation=60, ha="right", fontsize=6)
    ax.set_ylabel("Postmark transactions / wall second (mean, std)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colors[k]) for k in ("", "charged", "extra")]
    ax.legend(handles, ["kernel file system (budget M)", "nvstack, NVRAM charged to M",
                        "nvstack, NVRAM extra (outside M)"], fontsize=6, loc="upper center")
    first = rows[0]
    ax.set_title(f"{title}\nratios above bars: left group (no crash consistency) to ext2, "
                 f"right group to ext4 data=journal (paired by repetition)\n"
                 f"device {first['device']}, scale {first['scale']}, "
                 f"M {int(first['memory_bytes']) >> 20} MiB", fontsize=7)
    sources = list(dict.fromkeys(t["source"] for t in table))
    if len(sources) > 1:
        # which run each bar comes from: bars of different runs compare only roughly (the
        # machine's speed moves between days); each ratio is paired within its own run
        lines = [f"{s}: " + ", ".join(t["label"] + (f" {t['accounting']}" if t["accounting"]
                                                    else "")
                                      for t in table if t["source"] == s) for s in sources]
        fig.text(0.01, 0.005, "bars from several runs, each ratio paired within its run - "
                 + " | ".join(lines), fontsize=4.5, wrap=True)
    fig.tight_layout(rect=(0, 0.04 if len(sources) > 1 else 0, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def bars_figure(rows: list[dict], path: Path, title: str, base: str | None = None) -> Path:
    """The primary metric of every workload variant (Bonnie++: the thesis' three tests, char
    write, block write and rewrite), one bar per configuration (mean, std), the improvement
    over `base` (default: the first configuration) printed on each bar. Rows of several runs
    (merge_sources): each configuration's bar is its chosen run's, and its improvement is over
    `base` in that same run (none when that run has no `base`)."""
    from . import plot
    from .summary import aggregate, improvement, shown
    sources = list(dict.fromkeys(r.get("source", "") for r in rows))
    per_source = {s: aggregate([r for r in rows if r.get("source", "") == s]) for s in sources}
    chosen = {r["fs"]: r.get("source", "") for r in rows if r.get("drawn", True)}
    agg = {k: a for s in sources for k, a in per_source[s].items() if chosen.get(k[3]) == s}
    drawn = [(k, a) for k, a in agg.items() if shown(k[0], k[4], a)]
    if not drawn:
        raise BenchError(f"no measured runs for {path.name}")
    series = list(dict.fromkeys(k[3] for k, _a in drawn))
    if base is None and len(sources) > 1:
        # the first configuration of the newest run (its baseline), not of whichever run
        # happens to come first
        base = next(r["fs"] for r in rows if r.get("source", "") == sources[-1])
    if base in series:
        series.remove(base)
        series.insert(0, base)
    # a group per (workload variant, metric), named by what differs between the groups
    one_run = len({(k[0], k[1], k[2]) for k, _a in drawn}) == 1
    one_metric = len({k[4] for k, _a in drawn}) == 1

    def group(w, v, m):
        m = BONNIE_TESTS.get(m, m)
        return m if one_run else v if one_metric else f"{w} {v} {m}"
    groups = list(dict.fromkeys(group(k[0], k[2], k[4]) for k, _a in drawn))
    units = {a["unit"] for _k, a in drawn}
    what = drawn[0][0][4] if one_metric else "the test's result"
    ylabel = f"{what} ({units.pop()}; mean, std)" if len(units) == 1 else "mean (std)"
    mean, std, imp = {}, {}, {}
    for (w, c, v, f, m), a in drawn:
        g = group(w, v, m)
        mean[(f, g)], std[(f, g)] = a["mean"], a["std"]
        ref = per_source[chosen[f]].get((w, c, v, series[0], m))
        imp[(f, g)] = (improvement(a["mean"], ref["mean"], str(a["hib"]) == "1")
                       if ref else None)
    labels = {f: next(a["label"] for k, a in drawn if k[3] == f) for f in series}
    extra = {}
    used = list(dict.fromkeys(chosen[f] for f in series))
    if len(used) > 1:
        # which run each bar comes from: bars of different runs compare only roughly (the
        # machine's speed moves between days); each improvement is within its own run
        extra["note"] = ("bars from several runs, each improvement over "
                         f"{labels.get(series[0], series[0])} of its own run - " + " | ".join(
                             f"{s}: " + ", ".join(labels[f] for f in series if chosen[f] == s)
                             for s in used))
    return plot.grouped_bars(path, title, groups, series, labels, mean, std, ylabel,
                             imp, series[0], **extra)


def _rows_of(result_dir: Path, fig: Figure, number: str) -> list[dict]:
    from . import archive, parse
    from .summary import read_csv
    csv = result_dir / f"{fig.experiment}.csv"
    if not csv.exists():
        archive.unpack(result_dir)      # raw runs as git keeps them (no-op when unpacked)
        parse.parse_tree(result_dir)
    if not csv.exists():
        raise BenchError(f"{result_dir} has no results of experiment {fig.experiment} "
                         f"(figure {number} is drawn from it)")
    return read_csv(csv)


def draw(number: str, result_dirs: Path | list[Path], out_dir: Path,
         only: list[str] | None = None) -> Path:
    """Draws figure `number` from `result_dirs` (one experiment's result directory, or for the
    matrix and bar figures several, merged by merge_sources) into out_dir/thesis-fig-<number>.png;
    `only`: the configurations drawn (of the figure's), the others' rows still pair ratios."""
    from . import plot
    fig = FIGURES[number]
    dirs = [result_dirs] if isinstance(result_dirs, Path) else list(result_dirs)
    if len(dirs) > 1 and fig.kind not in ("matrix", "bars"):
        raise BenchError(f"figure {number} draws from one result directory (only the matrix "
                         f"and bar figures merge several)")
    if len(dirs) == 1:
        rows = _rows_of(dirs[0], fig, number)
    else:
        names = [d.name for d in dirs]
        if len(set(names)) < len(names):
            names = [str(d) for d in dirs]
        rows = merge_sources([(n, _rows_of(d, fig, number)) for n, d in zip(names, dirs)])
    names = list(fig.fs) if fig.fs else None
    if only is not None:
        names = [f for f in only if names is None or f in names]
    if fig.kind != "matrix" and names is not None:
        rows = [r for r in rows if r["fs"] in names]
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"thesis-fig-{number}.png"
    title = f"Thesis Fig {number}:\n{fig.title}"
    if fig.kind == "matrix":
        return matrix_figure(rows, target, title, names)
    if fig.kind == "bars":
        return bars_figure(rows, target, title, fig.base)
    made = {"tempffs": lambda: plot.tempffs_figure(rows, out_dir, number, target),
            "writeback": lambda: plot.writeback_figure(rows, out_dir, None, number, target)
            }[fig.kind]()
    if not made:
        raise BenchError(f"figure {number}: nothing to draw from {dirs[0]}")
    return made
