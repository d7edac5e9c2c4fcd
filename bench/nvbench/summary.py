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

from . import durability, nvfat
from . import floor as floor_mod
from .parse import read_csv

BONNIE_METRICS = ["put_char_kBps", "put_block_kBps", "rewrite_kBps"]


def shown(workload: str, metric: str, a: dict) -> bool:
    """The metrics tables and figures show: the primary one, and Bonnie++'s three tests."""
    return a["primary"] or (workload == "bonnie" and metric in BONNIE_METRICS)


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
                   and shown(workload, m, a)]
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


def natural(v: str) -> list:
    """Sort key: files=2000 before files=10000."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", v)]


def _mib(nbytes) -> str:
    return f"{int(nbytes) / 2**20:g}"


def _nvram_text(rows: list[dict]) -> str:
    sizes = sorted({int(r["nvram_bytes"]) for r in rows if r.get("nvram_bytes")})
    if not sizes:
        return ""
    return ("; NVRAM region = " + " / ".join(f"{_mib(n)} MiB" for n in sizes) +
            " per nvstack run (inside M)")


# ----- TempFFS (issue 4: tempfiles on vs off) ------------------------------------------------
TEMPFFS_THESIS = [
    "Thesis (sec. 4.2, Figs 4.3-4.6; TempFFS paper Figs 3-6), for comparison: ext2 with and "
    "without TempFFS on a 1 GB machine, Maxtor 7200 rpm disk, Postmark 512 B-10 KB, 200k "
    "transactions, 5k-30k files. Throughput +34 % to +69 % with TempFFS; at least 44 % of the "
    "files deleted in TempFFS (all of them at 5k and 10k files, where TempFFS held the whole "
    "set); IO traffic eliminated: nearly 100 % at 5k and 10k files, about 31 % above; "
    "average file span 0 at 5k and 10k files and largely reduced above (Fig 4.6: span "
    "recorded at deletion, over all files).",
    "Here: *throughput on/off* = wall(tempfiles off) / wall(tempfiles on), same Postmark; "
    "*vs lower FS* = wall(ext2 alone) / wall(x); both are means of per-repetition pairs. "
    "*Eliminated* = 1 - on / off of the bytes written to the lower FS (`nvstack stat` "
    "`lower.bytes_written`: what nvstack wrote into ext2, transformations included) and of "
    "the bytes the lower FS wrote to its block device (loop device / modeled disk, timed "
    "command + sync). *Span* = first to last physical block of a transformed file (FIEMAP at "
    "transformation) in FS blocks; *all files* divides the span sum by all files created "
    "(a file deleted in NVRAM has span 0, the thesis' convention). Spans are not measured with "
    "tempfiles off (nvstack measures transformed files only), so Fig 4.6's ext2 bars have no "
    "counterpart.",
]


def _mean_sd(a: dict | None, spec: str, k: float = 1.0, sd: bool = True) -> str:
    if not a:
        return ""
    text = format(a["mean"] * k, spec)
    if sd and a["n"] > 1:
        text += " ± " + format(a["std"] * k, spec)
    return text


def _budget(rows: list[dict], fs: str) -> str:
    r = next((r for r in rows if r["fs"] == fs and r["status"] == "ok"), None) or \
        next((r for r in rows if r["fs"] == fs), None)
    if r is None:
        return ""
    text = f"M {_mib(r['memory_bytes'])}"
    if r.get("nvram_bytes"):
        text += f", NVRAM {_mib(r['nvram_bytes'])}"
    return text + " MiB"


def tempffs_tables(rows: list[dict], fs_order: list[str] | None = None) -> list[str]:
    """The TempFFS acceptance tables, for experiments with a tempfiles on/off pair
    (fs.tempfiles_pairs): per file-set size x configuration, throughput and bytes written to
    the lower FS (with the ratios to tempfiles off and to the lower FS alone), then the temp-file
    counters of the tempfiles-on runs. Every row states its budget (M, NVRAM)."""
    from . import fs as fs_mod
    present = _order(rows, "fs")
    pairs = fs_mod.tempfiles_pairs(present)
    if not pairs:
        return []
    shown = []
    for on, off in pairs.items():
        low = fs_mod.lower_kernel_config(on, present)
        shown += [f for f in (low, off, on) if f and f not in shown]
    order = [f for f in (fs_order or []) if f in shown] + \
        [f for f in shown if f not in (fs_order or [])]
    agg = aggregate(rows)
    groups = sorted({(r["workload"], r["config"], r["variant"]) for r in rows
                     if r["fs"] in shown and r["status"] == "ok" and r["metric"]},
                    key=lambda g: (g[0], g[1], natural(g[2])))
    if not groups:
        return []
    get = lambda g, f, m: agg.get((*g, f, m))                      # noqa: E731
    has = lambda m: any(k[4] == m for k in agg)                    # noqa: E731
    disk = [(m, label, elim) for m, label, elim in
            (("blk_write_bytes", "loop dev MiB written", "tempffs_blk_bytes_eliminated_pct"),
             ("dev_bytes_written", "modeled disk MiB written", "tempffs_dev_bytes_eliminated_pct"))
            if has(m)]
    head = ["workload", "fs", "tempfiles", "budget", "n", "wall s", "tx/s (wall)",
            "throughput vs lower FS", "throughput on/off", "lower FS MiB written",
            "lower bytes eliminated %"]
    for _m, label, _e in disk:
        head += [label, label.split(" MiB")[0] + " bytes eliminated %"]
    out = ["### TempFFS: throughput and bytes written to the lower FS (means ± std over "
           "repetitions; every row with its budget)", "",
           "| " + " | ".join(head) + " |", "|---|---|---|---|" + "---:|" * (len(head) - 4)]
    for g in groups:
        name = f"{g[0]} {g[1]}" + ("" if g[2] == "default" else f" {g[2]}")
        for f in order:
            wall = get(g, f, "wall_seconds")
            if not wall:
                continue
            cfg = fs_mod.CONFIGS.get(f)
            tf = (cfg.nvstack or {}).get("tempfiles", "") if cfg and cfg.nvstack else "-"
            vs = "1 (itself)" if cfg is not None and not cfg.stacked else \
                _mean_sd(get(g, f, "throughput_ratio_vs_lower_fs"), ".3f")
            cells = [name, f, tf, _budget(rows, f), str(wall["n"]), _mean_sd(wall, ".2f"),
                     _mean_sd(get(g, f, "pm_tx_per_wall_second"), ".0f", sd=False), vs,
                     _mean_sd(get(g, f, "tempffs_throughput_ratio_on_off"), ".3f"),
                     _mean_sd(get(g, f, "nv_lower.bytes_written"), ".1f", 2**-20, sd=False),
                     _mean_sd(get(g, f, "tempffs_lower_bytes_eliminated_pct"), ".1f")]
            for m, _label, elim in disk:
                cells += [_mean_sd(get(g, f, m), ".1f", 2**-20, sd=False),
                          _mean_sd(get(g, f, elim), ".1f")]
            out.append("| " + " | ".join(cells) + " |")
    out.append("")
    # the temp files themselves
    ons = [f for f in order if f in pairs]
    head = ["workload", "fs", "budget", "NVRAM frames", "n", "files created",
            "deleted in NVRAM", "deleted in NVRAM %", "transformed (by trigger)",
            "MiB transformed", "span avg blocks (transformed files)",
            "span avg blocks (all files)"]
    lines = []
    for g in groups:
        name = f"{g[0]} {g[1]}" + ("" if g[2] == "default" else f" {g[2]}")
        for f in ons:
            created = get(g, f, "nv_tempfiles.created")
            if not created:
                continue
            trig = {k[4].rsplit(".", 1)[1]: a["mean"] for k, a in agg.items()
                    if k[:4] == (*g, f) and k[4].startswith("nv_tempfiles.transformed.")}
            trig_text = ", ".join(f"{t} {v:.0f}" for t, v in
                                  sorted(trig.items(), key=lambda kv: -kv[1]) if v >= 0.5)
            total = _mean_sd(get(g, f, "nv_tempfiles.transformed_total"), ".0f", sd=False)
            span = _mean_sd(get(g, f, "nv_tempfiles.span_blocks_avg"), ".2f")
            nspan = get(g, f, "nv_tempfiles.span_files")
            if span and nspan:
                span += f" ({nspan['mean']:.0f} files)"
            lines.append("| " + " | ".join([
                name, f, _budget(rows, f),
                _mean_sd(get(g, f, "nv_nvram.frames_total"), ".0f", sd=False),
                str(created["n"]), _mean_sd(created, ".0f", sd=False),
                _mean_sd(get(g, f, "nv_tempfiles.deleted_in_nvram"), ".0f", sd=False),
                _mean_sd(get(g, f, "tempffs_deleted_in_nvram_pct"), ".1f"),
                total + (f" ({trig_text})" if trig_text else ""),
                _mean_sd(get(g, f, "nv_tempfiles.bytes_transformed"), ".1f", 2**-20, sd=False),
                span, _mean_sd(get(g, f, "tempffs_span_blocks_avg_all_files"), ".2f")]) + " |")
    if lines:
        out += ["### TempFFS: temp files of the tempfiles-on runs (`nvstack stat` deltas over "
                "the timed command; means ± std)", "",
                "| " + " | ".join(head) + " |", "|---|---|---|" + "---:|" * (len(head) - 3)]
        out += lines + [""]
    for t in TEMPFFS_THESIS:
        out += [t, ""]
    return out


# ----- write-back policies (issue 5: file / recency / location / relo) -------------------------
WRITEBACK_THESIS = [
    "Thesis (sec. 4.3, Figs 4.7, 4.10-4.12), for comparison: the four policies inside Linux "
    "2.6.12 on a 1 GB machine with a Maxtor 7200 rpm disk. Bonnie++ (Fig 4.7): recency, "
    "location and relo all faster than file, relo by 31-34 %. Postmark 512 B-10 KB, 200k "
    "transactions (Fig 4.10): no obvious difference at 5k and 10k files (the working set fit "
    "in memory, write-back seldom ran); from 15k files on recency, location and relo improve "
    "on file by about 62 %, 58 % and 67 %. Accumulated inter-request distance (Fig 4.11): "
    "least for the zone/segment-based policies. Repeated write-back blocks (Fig 4.12): fewer "
    "for recency and relo, which keep recently used pages.",
    "Here: *time / WB file* = wall(x) / wall(WB file) and *improvement* = 1 - that, means of "
    "per-repetition pairs (runs are interleaved); *pages written*, *repeated*, *requests*, "
    "*inter-request distance* (accumulated, and per request), *rounds*, *syncs* and *pages "
    "dropped* (of files deleted while dirty, never written) are `nvstack stat` deltas over "
    "the timed command and the sync after it (the distance counts requests to pages that "
    "have a physical block: Postmark's new files have none until written back); "
    "*dirty at end* = dirty pages still in NVRAM afterwards (durable; written back at "
    "unmount, after the measurement). *Disk* columns are the modeled disk's (`nvstack device "
    "stat`: busy time, MiB written, seek distance in 4 KiB blocks) or, on a plain loop "
    "device, the MiB the lower FS wrote to it; they include the kernel's own write-back.",
]


def _writeback_kind(name: str) -> str:
    from . import fs as fs_mod
    cfg = fs_mod.CONFIGS.get(name)
    if cfg is None:
        return ""
    if not cfg.stacked:
        return "- (kernel FS alone)"
    if not cfg.nvstack:
        return "-"
    if not cfg.cache_on:
        return "cache off"
    return f"cache on, {cfg.nvstack.get('writeback', 'relo')}"


def writeback_tables(rows: list[dict], fs_order: list[str] | None = None) -> list[str]:
    """The write-back policy tables (experiments with an nvstack configuration whose NVRAM page
    cache is on): one table per workload variant, one row per configuration: wall time, time
    and improvement vs its `file` twin (fs.writeback_file_twins), pages written, repeated
    pages, write requests, inter-request distance, rounds, syncs, pages dropped (deleted while
    dirty), dirty pages left, and the disk."""
    from . import fs as fs_mod
    present = _order(rows, "fs")
    if not any(f in fs_mod.CONFIGS and fs_mod.CONFIGS[f].cache_on for f in present):
        return []
    order = [f for f in (fs_order or []) if f in present] + \
        [f for f in present if f not in (fs_order or [])]
    agg = aggregate(rows)
    groups = sorted({(r["workload"], r["config"], r["variant"]) for r in rows
                     if r["status"] == "ok" and r["metric"]},
                    key=lambda g: (g[0], g[1], natural(g[2])))
    get = lambda g, f, m: agg.get((*g, f, m))                      # noqa: E731
    has = lambda m: any(k[4] == m for k in agg)                    # noqa: E731
    twins = fs_mod.writeback_file_twins(present)
    disk = [c for c in (("dev_busy_ms", "disk busy s", 1e-3, ".1f"),
                        ("dev_bytes_written", "disk MiB written", 2**-20, ".1f"),
                        ("dev_seek_distance_sectors", "disk seek distance (blocks)", 1 / 8,
                         ".0f"))
            if has(c[0])]
    if not disk and has("blk_write_bytes"):
        disk = [("blk_write_bytes", "loop dev MiB written", 2**-20, ".1f")]
    head = ["fs", "cache, policy", "n", "wall s", "time / WB file", "improvement over WB file %",
            "pages written", "repeated pages (%)", "write requests (pages / request)",
            "inter-request distance, accumulated blocks (per request)", "rounds", "syncs",
            "pages dropped", "dirty at end"] + [c[1] for c in disk]
    out = []
    for g in groups:
        lines = []
        for f in order:
            wall = get(g, f, "wall_seconds")
            if not wall:
                continue
            written = get(g, f, "nv_writeback.pages_written")
            rep = _mean_sd(get(g, f, "nv_writeback.repeated_pages"), ".0f", sd=False)
            pct = get(g, f, "wb_repeated_pct")
            if rep and pct:
                rep += f" ({pct['mean']:.1f} %)"
            req = _mean_sd(get(g, f, "nv_writeback.requests"), ".0f", sd=False)
            ppr = get(g, f, "wb_pages_per_request")
            if req and ppr:
                req += f" ({ppr['mean']:.2f})"
            dist = _mean_sd(get(g, f, "nv_writeback.inter_request_distance_blocks"), ".0f",
                            sd=False)
            dpr = get(g, f, "wb_inter_request_distance_per_request")
            if dist and dpr:
                dist += f" ({dpr['mean']:.4g})"
            rounds = {k[4].rsplit(".", 1)[1]: a["mean"] for k, a in agg.items()
                      if k[:4] == (*g, f) and k[4].startswith("nv_writeback.rounds.")}
            rounds_text = ", ".join(f"{t} {v:.0f}" for t, v in
                                    sorted(rounds.items(), key=lambda kv: -kv[1]) if v >= 0.5)
            twin = twins.get(f)
            cells = [f, _writeback_kind(f), str(wall["n"]), _mean_sd(wall, ".2f"),
                     "1 (itself)" if f in twins.values() else
                     _mean_sd(get(g, f, "wb_time_ratio_vs_file"), ".3f") if twin else "",
                     _signed(get(g, f, "wb_improvement_vs_file_pct")) if twin else "",
                     _mean_sd(written, ".0f"), rep, req, dist, rounds_text,
                     _mean_sd(get(g, f, "nv_writeback.syncs"), ".0f", sd=False),
                     _mean_sd(get(g, f, "nv_cache.pages_dropped"), ".0f", sd=False),
                     _mean_sd(get(g, f, "nv_writeback.pages_dirty"), ".0f", sd=False)]
            cells += [_mean_sd(get(g, f, m), spec, k, sd=False) for m, _h, k, spec in disk]
            lines.append("| " + " | ".join(cells) + " |")
        if not lines:
            continue
        name = f"{g[0]} {g[1]}" + ("" if g[2] == "default" else f" {g[2]}")
        budget = _writeback_budget(rows, agg, g, order)
        out += [f"### Write-back: {name} (means ± std over repetitions; {budget})", "",
                "| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (len(head) - 2)]
        out += lines + [""]
    if out:
        for t in WRITEBACK_THESIS:
            out += [t, ""]
    return out


def _signed(a: dict | None) -> str:
    """'+22.5 ± 3.5': a mean with its sign, the std without."""
    if not a:
        return ""
    return f"{a['mean']:+.1f}" + (f" ± {a['std']:.1f}" if a["n"] > 1 else "")


def _writeback_budget(rows: list[dict], agg, g: tuple, order: list[str]) -> str:
    """'M 64, NVRAM 32 MiB = 6237 frames, write-back above 4989 / down to 3742 dirty pages'
    from the first configuration with the page cache on that has the numbers."""
    from . import fs as fs_mod
    cached = [f for f in order if f in fs_mod.CONFIGS and fs_mod.CONFIGS[f].cache_on]
    text = _budget(rows, cached[0]) if cached else ""
    for f in cached:
        frames = agg.get((*g, f, "nv_nvram.frames_total"))
        high = agg.get((*g, f, "nv_writeback.high_pages"))
        low = agg.get((*g, f, "nv_writeback.low_pages"))
        if frames and high and low:
            return (f"{text} = {frames['mean']:.0f} frames, write-back above "
                    f"{high['mean']:.0f} / down to {low['mean']:.0f} dirty pages")
    return text


def markdown(result_dir: Path) -> str:
    parts = ["# nvbench summary", ""]
    if not list(result_dir.glob("*.csv")) and durability.load_powercut(result_dir):
        parts += durability.powercut_markdown(durability.load_powercut(result_dir))
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
        nvram = _nvram_text(rows)
        parts += [f"Device: `{m['device']}`; memory budget M = {int(m['memory_bytes']) >> 20} MiB "
                  f"(cgroup per run){nvram}; scale = {m['scale']}; baseline = `{baseline}`; "
                  f"CSV: `{csv_path.name}`; runs and repro.sh: `runs/{exp}/` (in git packed as "
                  f"`raw.tar.xz`; `bench/run parse` unpacks it).", ""]
        if floor_mod.text(meta):
            parts += [floor_mod.text(meta), ""]
        if durability.is_durability(rows):
            # two devices and two baselines in one CSV: its own tables, not the generic ones
            parts += durability.markdown(rows, result_dir)
        elif nvfat.is_nvfat(rows):
            # the paper's quantities per cache size and its goals
            parts += nvfat.markdown(rows, result_dir)
        else:
            parts += _generic_tables(rows, baseline, meta)
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


# Issue 17 section 2's goals: (who, baseline, the thesis' throughput ratio).
MATRIX_GOALS = [("nvstack-ext2-tempffs", "ext2", 1.34, "tempfiles on vs ext2 (thesis +34-69 %)")]
MATRIX_GOALS += [(n, "ext2", 1.76, "combination vs ext2 (thesis +76 %)") for n in (
    "nvstack-ext2-tempffs-wb", "nvstack-ext2-tempffs-trans", "nvstack-ext2-wb-trans",
    "nvstack-ext2-tempffs-wb-trans")]
MATRIX_GOALS += [(n, "ext4-journal", 1.94, "combination vs ext4 data=journal (thesis +94 %)")
                 for n in ("nvstack-ext2-tempffs-trans", "nvstack-ext2-wb-trans",
                           "nvstack-ext2-tempffs-wb-trans")]


def thesis_matrix_tables(rows: list[dict]) -> list[str]:
    """The Table 4.2 matrix (experiment thesis-matrix): per configuration and memory
    accounting, throughput, the paired ratios to ext2 and ext4 data=journal, what reached the
    modeled disk and nvstack's durability work; then the issue's goals, met or not, in each
    accounting."""
    from . import thesis_figures as tf
    table = tf.matrix_table(rows)
    if not table or rows[0]["experiment"] != "thesis-matrix":
        return []
    agg = aggregate(rows)
    w, c, v = rows[0]["workload"], rows[0]["config"], rows[0]["variant"]

    def m(fs, metric, k=1.0, spec=".1f"):
        a = agg.get((w, c, v, fs, metric))
        return format(a["mean"] * k, spec) if a else ""

    def ms(x, spec=".2f"):
        return "" if not x else f"{x[0]:{spec}} ± {x[1]:{spec}}"

    out = ["### Table 4.2 at the thesis' ratios (means ± std over repetitions; ratios paired "
           "by repetition, > 1 = faster)", "",
           "| group | configuration | fs | NVRAM | n | wall s | tx/s | x ext2 | x ext4 data=journal "
           "| disk busy s | MiB written | lower syncfs | checkpoints (s blocked in them) "
           "| transformed | deleted in NVRAM | pages written back | cgroup peak MiB |",
           "|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for t in table:
        f = t["fs"]
        ck = m(f, "nv_journal.checkpoints", spec=".0f")
        cks = m(f, "nv_journal.checkpoint_ms_total", 1e-3)
        out.append(
            f"| {t['group']} | {t['label']} | `{f}` | {t['accounting'] or '-'} | {t['n']} | "
            f"{ms(t['wall'], '.1f')} | {ms(t['tx'], '.0f')} | {ms(t['vs_ext2'])} | "
            f"{ms(t['vs_ext4_journal'])} | {m(f, 'dev_busy_ms', 1e-3)} | "
            f"{m(f, 'dev_bytes_written', 1 / (1 << 20))} | "
            f"{m(f, 'nv_fsync.lower_syncfs', spec='.0f')} | "
            f"{ck + (f' ({cks})' if ck else '')} | "
            f"{m(f, 'nv_tempfiles.transformed_total', spec='.0f')} | "
            f"{m(f, 'nv_tempfiles.deleted_in_nvram', spec='.0f')} | "
            f"{m(f, 'nv_writeback.pages_written', spec='.0f')} | "
            f"{m(f, 'cgroup_max_usage_in_bytes', 1 / (1 << 20), '.0f')} |")
    out += ["", "Group 1 gives no file-system consistency after a crash, group 2 does (the "
            "thesis' Figs 4.16-4.19). `charged`: the NVRAM region inside the budget M; "
            "`extra`: outside it.", "",
            "### Goals (issue 17 section 2)", "",
            "| configuration | against | goal | NVRAM charged | NVRAM extra | met |",
            "|---|---|---:|---:|---:|---|"]
    by = {t["fs"]: t for t in table}
    for name, base, goal, what in MATRIX_GOALS:
        key = "vs_ext2" if base == "ext2" else "vs_ext4_journal"
        got = {a: by.get(f"{name}-{a}", {}).get(key) for a in tf.ACCOUNTINGS}
        if not any(got.values()):
            continue
        met = [a for a, x in got.items() if x and x[0] >= goal]
        out.append(f"| {what}: `{name}` | {base} | {goal:.2f}x | {ms(got['charged'])} | "
                   f"{ms(got['extra'])} | {'yes (' + ', '.join(met) + ')' if met else 'no'} |")
    return out + [""]


def _generic_tables(rows: list[dict], baseline: str, meta: dict) -> list[str]:
    parts = []
    parts += thesis_matrix_tables(rows)
    parts += durability_markdown(rows, baseline, meta.get("fs"))
    parts += tempffs_tables(rows, meta.get("fs"))
    parts += writeback_tables(rows, meta.get("fs"))
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
    return parts


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


# ----- durability (the showcase: applications that wait for fsync) ---------------------------
DURABLE_WORKLOADS = ("sqlite", "maildir", "applog")


def durable_name(workload: str, variant: str) -> str:
    """A reader's name for a durable workload variant."""
    if workload == "sqlite":
        mode = variant.split("=", 1)[-1]
        return ("sqlite WAL" if mode == "wal" else
                "sqlite rollback journal" if mode == "delete" else f"sqlite {mode}")
    return {"maildir": "Maildir delivery", "applog": "log append+fdatasync"}.get(workload, workload)


DURABLE_COLUMNS = ("tx_per_second", "wall_seconds", "transactions", "dev_requests_per_tx",
                   "dev_writes_per_tx", "dev_flushes_per_tx", "dev_bytes_written_per_tx",
                   "dev_busy_ms_per_tx", "lat_p50_us", "lat_p99_us", "nv_writeback.pages_dirty")


def durability_rows(rows: list[dict], baseline: str,
                    fs_order: list[str] | None = None) -> list[dict]:
    """Per durable workload variant: {name, workload, config, variant, per_fs: {fs: {metric:
    mean}}, fs (ordered), ratio: {fs: tx/s(fs) / tx/s(baseline)}} (means over repetitions)."""
    acc: "OrderedDict[tuple, dict]" = OrderedDict()
    for r in rows:
        if r["status"] != "ok" or r["workload"] not in DURABLE_WORKLOADS \
                or r["metric"] not in DURABLE_COLUMNS:
            continue
        key = (r["workload"], r["config"], r["variant"])
        acc.setdefault(key, OrderedDict()).setdefault(r["fs"], {}).setdefault(
            r["metric"], []).append(float(r["value"]))
    present = _order(rows, "fs")
    order = [f for f in (fs_order or []) if f in present] + \
        [f for f in present if f not in (fs_order or [])]
    out = []
    rank = {"journal=wal": 0, "journal=delete": 1}
    for (w, c, v), per in sorted(acc.items(), key=lambda kv: (
            DURABLE_WORKLOADS.index(kv[0][0]), rank.get(kv[0][2], 2), natural(kv[0][2]))):
        means = {f: {m: statistics.fmean(x) for m, x in d.items()} for f, d in per.items()}
        base = means.get(baseline, {}).get("tx_per_second")
        fss = [f for f in order if f in means]
        out.append({"name": durable_name(w, v), "workload": w, "config": c, "variant": v,
                    "per_fs": means, "fs": fss,
                    "ratio": {f: means[f]["tx_per_second"] / base for f in fss
                              if base and "tx_per_second" in means[f]}})
    return out


def _kib(x: float | None) -> str:
    return "" if x is None else f"{x / 1024:.1f}"


def durability_markdown(rows: list[dict], baseline: str,
                        fs_order: list[str] | None = None) -> list[str]:
    lines = durability_rows(rows, baseline, fs_order)
    if not lines:
        return []
    out = ["### Durable transactions: ext4 alone vs nvstack (disk counters per transaction: "
           "`nvstack device stat` deltas over the loop and the sync after it)", "",
           "| workload | fs | tx/s | ratio | wall s | transactions | disk requests/tx | "
           "writes/tx | flushes/tx | KiB written/tx | disk busy ms/tx | latency p50 / p99 us |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for ln in lines:
        for f in ln["fs"]:
            m = ln["per_fs"][f]
            g = m.get
            out.append(f"| {ln['name']} | {f} | {_fmt(g('tx_per_second'), ',.0f')} | "
                       f"{_fmt(ln['ratio'].get(f), '.1f')}x | {_fmt(g('wall_seconds'), '.1f')} | "
                       f"{_fmt(g('transactions'), ',.0f')} | {_fmt(g('dev_requests_per_tx'), '.2f')} | "
                       f"{_fmt(g('dev_writes_per_tx'), '.2f')} | {_fmt(g('dev_flushes_per_tx'), '.2f')} | "
                       f"{_kib(g('dev_bytes_written_per_tx'))} | {_fmt(g('dev_busy_ms_per_tx'), '.2f')} | "
                       f"{_fmt(g('lat_p50_us'), '.0f')} / {_fmt(g('lat_p99_us'), '.0f')} |")
    return out + [""]


def durability_text(result_dir: Path) -> str:
    """The durability table `bench/run showcase` prints (plain text)."""
    csv = result_dir / "showcase.csv"
    rows = read_csv(csv) if csv.exists() else []
    if not rows:
        return "durability: no results"
    meta = _meta(result_dir, rows[0]["experiment"])
    baseline = meta.get("baseline") or rows[0]["fs"]
    lines = durability_rows(rows, baseline, meta.get("fs"))
    cols = ["workload", "file system", "tx/s", "vs ext4", "wall s", "disk req/tx",
            "flushes/tx", "KiB written/tx", "p99 latency ms"]
    table = [cols]
    for ln in lines:
        for i, f in enumerate(ln["fs"]):
            m = ln["per_fs"][f]
            g = m.get
            table.append([ln["name"] if i == 0 else "", f, _fmt(g("tx_per_second"), ",.0f"),
                          _fmt(ln["ratio"].get(f), ",.1f") + "x",
                          _fmt(g("wall_seconds"), ".1f"), _fmt(g("dev_requests_per_tx"), ".2f"),
                          _fmt(g("dev_flushes_per_tx"), ".2f"),
                          _kib(g("dev_bytes_written_per_tx")),
                          _fmt(g("lat_p99_us") / 1000 if g("lat_p99_us") is not None else None,
                               ".2f")])
    m = rows[0]
    secs = sorted({round(float(r["value"])) for r in rows if r["metric"] == "loop_seconds"})
    nvram = sorted({int(r["nvram_bytes"]) >> 20 for r in rows if r.get("nvram_bytes")})
    head = (f"Durable transactions, {'/'.join(map(str, secs)) or '?'} s each, device "
            f"{m['device']}, fresh ext4 per run; nvstack: its defaults, NVRAM region "
            f"{'/'.join(map(str, nvram)) or '-'} MiB in /dev/shm")
    text = [head, ""] + _columns(table)
    if floor_mod.text(meta):
        text += ["", floor_mod.text(meta)]
    for r in rows:
        if r["status"] != "ok":
            text.append(f"{r['fs']} {r['workload']} {r['variant']}: {r['status']}: "
                        f"{r['reason'][:200]}")
    text += ["",
             "Same disk, same durability: every transaction is acknowledged only once it "
             "survives a power cut.",
             "ext4 alone: its fsync writes the data and a journal commit and flushes the "
             "disk's cache, on every transaction.",
             "nvstack: a write, create or rename returns once it is durable in its NVRAM "
             "region; the data reaches ext4 later (write-back).",
             "  A rename or unlink of a file ext4 holds is applied to ext4 at once and made "
             "durable by a redo record in NVRAM",
             "  (the metadata journal), so fsync of a file or a directory waits for the disk "
             "only when something it covers",
             "  went to ext4 directly (nvstack stat: fsync.waited_on_lower); ext4 gets its "
             "journal commit at the checkpoint (every 5 s).",
             "Disk counters: the modeled disk over the loop and the sync after it, per "
             "transaction; dirty pages left in NVRAM are written back later."]
    return "\n".join(text)


def _columns(table: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    out = []
    for i, r in enumerate(table):
        out.append("  ".join(c.ljust(widths[j]) if j < 2 else c.rjust(widths[j])
                             for j, c in enumerate(r)).rstrip())
        if i == 0:
            out.append("  ".join("-" * w for w in widths))
    return out


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
    text.append("Why nvstack is slower here: Postmark never fsyncs, so ext2 keeps its short-lived "
                "files in volatile memory until it deletes them (and would lose them in a crash), "
                "while nvstack makes every operation durable in an 18 MiB region that cannot hold "
                "the file set, and a pressure transform must be durable on disk before its NVRAM "
                "is freed.")
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


def powercut_text(results: list[dict]) -> str:
    """The power-cut totals (plain text): cuts, passed, acknowledged commits, lost."""
    acked = sum(r.get("acknowledged", 0) for r in results)
    ok = sum(r["status"] == "ok" for r in results)
    return (f"{len(results)} power cuts, {ok} passed; {acked:,} acknowledged commits, "
            f"{sum(r.get('lost', 0) for r in results)} lost")
