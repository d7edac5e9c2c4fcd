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
from . import durability  # noqa: E402
from . import nvfat  # noqa: E402
from . import fs as fs_mod  # noqa: E402
from .summary import (BONNIE_METRICS, DURABLE_WORKLOADS, _meta, _nvram_text,  # noqa: E402
                      aggregate, durability_rows, improvement, natural, tables)
from .util import slug  # noqa: E402


def grouped_bars(path: Path, title: str, groups: list[str], series: list[str],
                 labels: dict[str, str], mean: dict, std: dict, ylabel: str,
                 improvements: dict | None = None, baseline: str | None = None,
                 note: str | None = None) -> Path:
    """mean[(series, group)] -> bar height; improvements[(series, group)] -> percent; `note`
    is printed small under the axes (where the bars come from)."""
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 + 0.5 * len(groups) * len(series)), 4.2))
    width = 0.8 / max(1, len(series))
    # a color per configuration: tab10 repeats after ten, so the thesis' 11-12 take tab20
    ncolors = 10 if len(series) <= 10 else 20
    cmap = plt.get_cmap("tab10" if ncolors == 10 else "tab20")
    for i, s in enumerate(series):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        ys = [mean.get((s, grp), 0.0) for grp in groups]
        es = [std.get((s, grp), 0.0) for grp in groups]
        ax.bar(xs, ys, width, yerr=es, capsize=2, label=labels.get(s, s),
               color=cmap(i % ncolors), edgecolor="black", linewidth=0.4)
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
                # a black edge: a point that falls on its own bar stays visible
                ax2.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                         color=cmap(i % ncolors), markeredgecolor="black",
                         linestyle="-" if len(pts) > 1 else "none", linewidth=1)
        ax2.axhline(0, color="grey", linewidth=0.5, linestyle=":")
        ax2.set_ylabel(f"improvement over {labels.get(baseline, baseline)} (%)")
    ax.legend(handles, names, fontsize=7, loc="upper left", bbox_to_anchor=(1.2, 1.0))
    fig.tight_layout()
    if note:
        # under the axes (the tight bounding box below takes it in)
        fig.text(0.01, -0.01, note, fontsize=6, va="top", wrap=True)
    # the legend sits outside the axes: the saved area grows to hold it and the title
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def plot_experiment(csv_path: Path, out_dir: Path) -> list[Path]:
    rows = read_csv(csv_path)
    if not rows:
        return []
    exp = rows[0]["experiment"]
    if durability.is_durability(rows):
        fig = speedup_figure(rows, out_dir)
        return [fig] if fig else []
    if nvfat.is_nvfat(rows):
        return nvfat_figures(rows, out_dir)
    baseline = _meta(out_dir, exp).get("baseline") or rows[0]["fs"]
    agg = aggregate(rows)
    written = []
    df = durability_figure(rows, out_dir, baseline, _meta(out_dir, exp).get("fs"))
    if df:
        written.append(df)
    for t in tables(rows, baseline):
        if t["workload"] == "bonnie" and t["metric"] in BONNIE_METRICS[1:]:
            continue  # drawn together with put_char below
        if t["workload"] in DURABLE_WORKLOADS:
            continue  # the durability figure shows them, on a log scale
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
    tf = tempffs_figure(rows, out_dir)
    if tf:
        written.append(tf)
    wf = writeback_figure(rows, out_dir, _meta(out_dir, exp).get("fs"))
    if wf:
        written.append(wf)
    return written


def _bars(ax, groups: list[str], series: list[tuple[str, str]], agg: dict, scale: float = 1.0,
          colors: list[int] | None = None):
    """series = [(label, (fs, metric))...]: one bar per series per group, error bar = std;
    colors = a tab10 index per series (default: its position)."""
    width = 0.8 / max(1, len(series))
    cmap = plt.get_cmap("tab10")
    for i, (label, (fs, metric)) in enumerate(series):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        a = [agg.get((*grp, fs, metric)) for grp in groups]
        ax.bar(xs, [x["mean"] * scale if x else 0.0 for x in a], width,
               yerr=[x["std"] * scale if x else 0.0 for x in a], capsize=2, label=label,
               color=cmap((colors[i] if colors else i) % 10), edgecolor="black", linewidth=0.4)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([g[1] if g[2] == "default" else g[2] for g in groups], fontsize=7)
    ax.legend(fontsize=6)


def tempffs_figure(rows: list[dict], out_dir: Path, only: str | None = None,
                   path: Path | None = None) -> Path | None:
    """TempFFS acceptance, thesis Figs 4.3-4.6 in one figure: throughput vs the lower FS,
    files deleted in NVRAM, bytes written to the lower FS, average file span; per file-set
    size, for every tempfiles on/off pair. The budget (M, NVRAM) is in the title. `only` =
    one of "4.3".."4.6": that panel alone (to `path`)."""
    present = list(dict.fromkeys(r["fs"] for r in rows))
    pairs = fs_mod.tempfiles_pairs(present)
    agg = aggregate(rows)
    if not pairs or not any(k[4] == "nv_tempfiles.created" for k in agg):
        return None
    groups = sorted({k[:3] for k in agg if k[3] in pairs}, key=lambda g: (g[0], g[1], natural(g[2])))
    exp, m = rows[0]["experiment"], rows[0]
    fig, (a, b, c, d) = _panels(only, ("4.3", "4.4", "4.5", "4.6"), (11, 7.5))
    both = [(f, f"tempfiles {fs_mod.CONFIGS[f].nvstack['tempfiles']}: {f}")
            for on, off in pairs.items() for f in (off, on)]
    _bars(a, groups, [(lab, (f, "throughput_ratio_vs_lower_fs")) for f, lab in both], agg)
    a.axhline(1.0, color="grey", linewidth=0.6, linestyle=":")
    a.set_ylabel("throughput / lower FS alone")
    a.set_title("Postmark throughput vs the lower FS (Fig 4.3)", fontsize=9)
    _bars(b, groups, [(on, (on, "tempffs_deleted_in_nvram_pct")) for on in pairs], agg)
    b.axhline(44.0, color="red", linewidth=0.8, linestyle="--", label="thesis: >= 44 %")
    b.set_ylim(0, 105)
    b.set_ylabel("files deleted in NVRAM (%)")
    b.set_title("Files deleted in NVRAM (Fig 4.4)", fontsize=9)
    b.legend(fontsize=6)
    disk = [(m, what) for m, what in (("blk_write_bytes", "loop device"),
                                      ("dev_bytes_written", "modeled disk"))
            if any(k[4] == m and k[3] in pairs for k in agg)]
    _bars(c, groups, [(f"{lab} (nvstack -> lower FS)", (f, "nv_lower.bytes_written"))
                      for f, lab in both] +
          [(f"{lab} ({what})", (f, m)) for m, what in disk for f, lab in both], agg, 2**-20)
    c.set_ylabel("MiB written")
    c.set_title("Bytes written to the lower FS (Fig 4.5)", fontsize=9)
    _bars(d, groups, [(f"{on} (transformed files)", (on, "nv_tempfiles.span_blocks_avg"))
                      for on in pairs] +
          [(f"{on} (all files)", (on, "tempffs_span_blocks_avg_all_files")) for on in pairs], agg)
    d.set_ylabel("average file span (FS blocks)")
    d.set_title("Average file span (Fig 4.6)", fontsize=9)
    fig.suptitle(f"{exp}: TempFFS, device {m['device']}, M = {int(m['memory_bytes']) >> 20} MiB"
                 f"{_nvram_text(rows)}", fontsize=9)
    fig.tight_layout()
    path = path or out_dir / f"{slug(exp)}-tempffs.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def writeback_figure(rows: list[dict], out_dir: Path, fs_order: list[str] | None = None,
                     only: str | None = None, path: Path | None = None) -> Path | None:
    """Write-back policies, thesis Figs 4.11-4.12 and what drives Fig 4.10 (the wall-time bars
    with the improvement over WB file are the experiment's generic figure): pages written back,
    repeated write-back pages, accumulated inter-request distance (nvstack's counters, page
    cache on only) and the disk's busy time (every configuration), per workload variant."""
    present = list(dict.fromkeys(r["fs"] for r in rows))
    present = [f for f in (fs_order or []) if f in present] + \
        [f for f in present if f not in (fs_order or [])]
    cached = [f for f in present if f in fs_mod.CONFIGS and fs_mod.CONFIGS[f].cache_on]
    agg = aggregate(rows)
    if not cached or not any(k[4] == "nv_writeback.pages_written" for k in agg):
        return None
    groups = sorted({k[:3] for k in agg if k[3] in present},
                    key=lambda g: (g[0], g[1], natural(g[2])))
    exp, m = rows[0]["experiment"], rows[0]
    label = lambda f: (fs_mod.CONFIGS[f].label if f in fs_mod.CONFIGS else f)  # noqa: E731
    fig, (a, b, c, d) = _panels(only, ("pages", "4.12", "4.11", "busy"), (12, 7.5))
    color = [present.index(f) for f in cached]          # one color per configuration
    _bars(a, groups, [(label(f), (f, "nv_writeback.pages_written")) for f in cached], agg,
          colors=color)
    a.set_ylabel("pages written back")
    a.set_title("Pages written back (4 KiB)", fontsize=9)
    _bars(b, groups, [(label(f), (f, "nv_writeback.repeated_pages")) for f in cached], agg,
          colors=color)
    b.set_ylabel("repeated write-back pages")
    b.set_title("Repeated write-back pages (Fig 4.12)", fontsize=9)
    _bars(c, groups, [(label(f), (f, "nv_writeback.inter_request_distance_blocks"))
                      for f in cached], agg, colors=color)
    c.set_ylabel("accumulated distance (blocks)")
    c.set_title("Accumulated inter-request distance (Fig 4.11; requests to pages with a "
                "block)", fontsize=9)
    if any(k[4] == "dev_busy_ms" for k in agg):
        _bars(d, groups, [(label(f), (f, "dev_busy_ms")) for f in present], agg, 1e-3)
        d.set_ylabel("modeled disk busy (s)")
        d.set_title("Disk busy time, timed command + sync", fontsize=9)
    else:
        _bars(d, groups, [(label(f), (f, "wall_seconds")) for f in present], agg)
        d.set_ylabel("wall time (s)")
        d.set_title("Wall time", fontsize=9)
    fig.suptitle(f"{exp}: write-back policies, device {m['device']}, M = "
                 f"{int(m['memory_bytes']) >> 20} MiB{_nvram_text(rows)}", fontsize=9)
    fig.tight_layout()
    path = path or out_dir / f"{slug(exp)}-writeback.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


class _Unused:
    """An axes stand-in that ignores every call: the panels not drawn when a figure function
    draws one panel alone (`only`)."""

    def __getattr__(self, _name):
        return lambda *a, **k: None


def _panels(only: str | None, names: tuple, size: tuple):
    """(figure, four axes) for a 2 x 2 panel figure, or for panel `only` of `names` alone (the
    other three are _Unused)."""
    if only is None:
        fig, axes = plt.subplots(2, 2, figsize=size)
        return fig, [ax for row in axes for ax in row]
    if only not in names:
        raise ValueError(f"panel {only} not among {names}")
    fig, ax = plt.subplots(figsize=(9.0, size[1] / 1.7))
    return fig, [ax if n == only else _Unused() for n in names]


def durability_figure(rows: list[dict], out_dir: Path, baseline: str,
                      fs_order: list[str] | None = None) -> Path | None:
    """The showcase figure: transactions per second of each durable workload (sqlite WAL and
    rollback journal, Maildir delivery, log append + fdatasync) per configuration on a log
    scale, the ratio to the baseline written over each bar; beside it the modeled disk's
    requests per transaction (log scale; the reason for the ratio)."""
    lines = durability_rows(rows, baseline, fs_order)
    if not lines:
        return None
    fss = list(dict.fromkeys(f for ln in lines for f in ln["fs"]))
    label = lambda f: (f"{f} ({fs_mod.CONFIGS[f].label})"  # noqa: E731
                       if f in fs_mod.CONFIGS and fs_mod.CONFIGS[f].label != f else f)
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.8), gridspec_kw={"width_ratios": [3, 2]})
    width = 0.8 / max(1, len(fss))
    cmap = plt.get_cmap("tab10")
    groups = [ln["name"] for ln in lines]
    for i, f in enumerate(fss):
        xs = [g + (i - (len(fss) - 1) / 2) * width for g in range(len(lines))]
        ys = [ln["per_fs"].get(f, {}).get("tx_per_second", 0.0) for ln in lines]
        a.bar(xs, ys, width, label=label(f), color=cmap(i % 10), edgecolor="black",
              linewidth=0.4)
        for x, y, ln in zip(xs, ys, lines):
            if y <= 0:
                continue
            r = ln["ratio"].get(f)
            txt = f"{y:,.0f}" + (f"\n{r:,.0f}x" if r and f != baseline else "")
            a.annotate(txt, (x, y), ha="center", va="bottom", fontsize=7,
                       fontweight="bold" if f != baseline else "normal",
                       xytext=(0, 2), textcoords="offset points")
        rq = [ln["per_fs"].get(f, {}).get("dev_requests_per_tx") for ln in lines]
        b.bar(xs, [max(q, 1e-3) if q is not None else 0.0 for q in rq], width, label=label(f),
              color=cmap(i % 10), edgecolor="black", linewidth=0.4)
        for x, q in zip(xs, rq):
            if q is not None:
                b.annotate(f"{q:.2g}", (x, max(q, 1e-3)), ha="center", va="bottom", fontsize=7,
                           xytext=(0, 2), textcoords="offset points")
    for ax in (a, b):
        ax.set_yscale("log")
        ax.set_xticks(range(len(lines)))
        ax.set_xticklabels(groups, fontsize=8, rotation=12)
    top = max((ln["per_fs"].get(f, {}).get("tx_per_second", 0.0) for ln in lines for f in fss),
              default=1.0)
    a.set_ylim(top=top * 6)
    a.set_ylabel("acknowledged transactions per second (log)")
    a.set_title("Transactions per second (ratio to " + baseline + " over the bars)", fontsize=9)
    a.legend(fontsize=7, loc="upper left")
    b.set_ylabel("disk requests per transaction (log)")
    b.set_title("Modeled disk requests per transaction", fontsize=9)
    m = rows[0]
    return _save(fig, out_dir / f"{slug(m['experiment'])}-durability.png",
                 f"{m['experiment']}: applications that wait for durability, device "
                 f"{m['device']} (sleep timing){_nvram_text(rows)}")


def speedup_figure(rows: list[dict], out_dir: Path) -> Path | None:
    """The durability experiment: one panel per device, the speed-up of each nvstack mode over
    the row's baseline (ext4 data=ordered for the fsync-bound rows, ext4 data=journal for the
    paper's), log scale, the goals drawn as dashed lines over their rows."""
    lines = durability.table_rows(rows)
    if not lines:
        return None
    devices = list(dict.fromkeys(ln["device"] for ln in lines))
    series = [f for f in (*durability.DURABILITY_NV, "nvstack-ext4-defaults-none")
              if any(f in ln["speedup"] for ln in lines)]
    fig, axes = plt.subplots(1, len(devices), figsize=(7.5 * len(devices), 5.2), squeeze=False)
    cmap = plt.get_cmap("tab10")
    width = 0.8 / max(1, len(series))
    for ax, dev in zip(axes[0], devices):
        dl = [ln for ln in lines if ln["device"] == dev]
        for i, f in enumerate(series):
            xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(dl))]
            ys = [ln["speedup"].get(f, 0.0) for ln in dl]
            ax.bar(xs, ys, width, label=fs_mod.CONFIGS[f].label, color=cmap(i % 10),
                   edgecolor="black", linewidth=0.4)
            for x, y in zip(xs, ys):
                if y > 0:
                    ax.annotate(f"{y:,.1f}" if y < 10 else f"{y:,.0f}", (x, y), ha="center",
                                va="bottom", fontsize=6, xytext=(0, 1),
                                textcoords="offset points")
        for g, ln in enumerate(dl):
            goal = (durability.FSYNC_GOAL.get(dev) if ln["group"] == "fsync"
                    else durability.PAPER_GOAL)
            if goal:
                ax.hlines(goal, g - 0.45, g + 0.45, colors="red", linestyles="dashed",
                          linewidth=1)
        ax.axhline(1.0, color="grey", linewidth=0.6, linestyle=":")
        ax.set_yscale("log")
        ax.set_xticks(range(len(dl)))
        ax.set_xticklabels([ln["name"].split(" (")[0].replace(", synchronous=FULL", "")
                            for ln in dl], fontsize=7, rotation=35, ha="right")
        ax.set_ylabel("speed-up over ext4 (log): ordered | data=journal for the paper's rows")
        ax.set_title(f"{dev} (sleep timing): red dashes = issue 13's goal", fontsize=9)
        ax.legend(fontsize=7, loc="upper right")
    m = rows[0]
    return _save(fig, out_dir / f"{slug(m['experiment'])}-speedup.png",
                 f"{m['experiment']}: nvstack over ext4 vs ext4 alone, same device, same "
                 f"durability{_nvram_text(rows)}")


def nvfat_figures(rows: list[dict], out_dir: Path) -> list[Path]:
    """The NVFAT paper's Figures 4-8: execution time against the NVRAM cache size (Async- and
    Sync-PostMark, VFAT as a dashed line), write requests per LBN from the file system to the
    FTL and programs per physical page from the FTL to the chip (Sync-PostMark, VFAT vs NVFAT
    128 KiB), erase count mean and deviation, and energy against the cache size."""
    ls = nvfat.lines(rows, out_dir)
    if not ls:
        return []
    exp, written = rows[0]["experiment"], []
    sizes = sorted({ln["kib"] for ln in ls if ln["kib"]})

    def series(config: str, q: str) -> tuple[list[int], list[float], float | None]:
        sel = {ln["kib"]: ln.get(q) for ln in ls if ln["config"] == config}
        xs = [k for k in sizes if sel.get(k) is not None]
        return xs, [sel[k] for k in xs], sel.get(0)

    def against_vfat(ax, config: str, q: str, label: str, base_label: str) -> float | None:
        """NVFAT's `q` over the cache sizes, VFAT's as a dashed line of the same colour."""
        xs, ys, base = series(config, q)
        line = ax.plot(xs, ys, marker="o", label=label)[0]
        if base is not None:
            ax.axhline(base, color=line.get_color(), linestyle="dashed",
                       label=base_label.format(base))
        return base

    # Figure 4: execution time.
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, (config, title) in zip(axes, nvfat.WORKLOADS.items()):
        against_vfat(ax, config, "time", "NVFAT", "VFAT ({:.0f} s)")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes)
        ax.set_xticklabels([str(k) for k in sizes])
        ax.set_xlabel("NVRAM write cache (KiB)")
        ax.set_ylabel("Postmark execution time (s)")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=8)
    written.append(_save(fig, out_dir / f"{slug(exp)}-fig4-time.png",
                         f"{exp}: execution time as the NVRAM write cache grows (flash model, "
                         f"sleep timing)"))
    # Figures 5 and 6: per-LBN requests and per-page programs, Sync-PostMark.
    for key, fname, what in (("lbn_writes", "fig5-lbn-writes", "write requests from the file "
                              "system to the FTL per logical block"),
                             ("page_writes", "fig6-page-writes", "programs from the FTL to the "
                              "flash per physical page")):
        hs = nvfat.histograms(rows, out_dir, "nvfat-sync", key)
        pick = [f for f in (nvfat.BASELINE, nvfat.GOAL_FS) if f in hs]
        if not pick:
            continue
        fig, axes = plt.subplots(len(pick), 1, figsize=(9, 2.6 * len(pick)), squeeze=False)
        for ax, f in zip(axes[:, 0], pick):
            h = hs[f]
            per = h["per_bucket"] or 1
            ax.bar([i * per for i in range(len(h["sum"]))], h["sum"], width=per,
                   color="tab:blue" if f == nvfat.BASELINE else "tab:green")
            ax.set_yscale("symlog")
            ax.set_ylabel(f"{fs_mod.CONFIGS[f].label}\nper {per} {h['item']}s")
            ax.set_xlabel(f"{h['item']} number")
        written.append(_save(fig, out_dir / f"{slug(exp)}-{fname}.png",
                             f"{exp}: Sync-PostMark, {what}"))
    # Figure 7: erase count mean and deviation; Figure 8: energy.
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for q, label in (("erase_mean", "mean"), ("erase_stddev", "standard deviation")):
        against_vfat(axes[0], "nvfat-sync", q, f"NVFAT {label}", f"VFAT {label} ({{:.1f}})")
    axes[0].set_ylabel("erases per physical block")
    axes[0].set_title("Figure 7: erase counts, Sync-PostMark", fontsize=9)
    for config, title in nvfat.WORKLOADS.items():
        against_vfat(axes[1], config, "energy", f"NVFAT, {title}", f"VFAT, {title} ({{:.1f}} J)")
    axes[1].set_ylabel("flash energy (J)")
    axes[1].set_title("Figure 8: energy", fontsize=9)
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes)
        ax.set_xticklabels([str(k) for k in sizes])
        ax.set_xlabel("NVRAM write cache (KiB)")
        ax.legend(fontsize=7)
    written.append(_save(fig, out_dir / f"{slug(exp)}-fig7-8-erases-energy.png",
                         f"{exp}: wear and energy as the NVRAM write cache grows"))
    return written


def _save(fig, path: Path, title: str) -> Path:
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_dir(result_dir: Path) -> list[Path]:
    out = []
    for csv_path in sorted(result_dir.glob("*.csv")):
        out += plot_experiment(csv_path, result_dir)
    return out
