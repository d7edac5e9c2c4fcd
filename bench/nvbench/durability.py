"""The durability experiment's results (issue 13): CSV rows of `durability` /
`durability-quick`, the recovery runs (OUT/runs/recovery/*/result.json) and the power cuts
(OUT/powercut.json) -> tables per device, the goals met or missed, text and markdown. Reads
files only.

Speed-up of a configuration x over the row's baseline b (same device, same run):
  fsync-bound rows   ops_per_second(x) / ops_per_second(b)   (Sync-PostMark: Postmark
                     transactions per wall-clock second, i.e. wall(b) / wall(x))
  the paper's rows   durable_seconds(b) / durable_seconds(x): the time until everything the
                     workload did is durable (command + sync + sync point); the command alone
                     (wall) is reported beside it
Goals (issue 13): every fsync-bound row >= 100x ext4 on hdd-7200 and >= 10x on ssd, for each
nvstack consistency mode; journal mode >= 1.5x ext4 data=journal on the paper's workloads;
nvstack's recovery mount with a full 32 MiB metadata journal <= 0.5x ext4 data=journal's
journal replay on the same device.
"""

from __future__ import annotations

import json
import statistics
from collections import OrderedDict
from pathlib import Path

from .experiments import DURABILITY_FSYNC, DURABILITY_NV, DURABILITY_PAPER

EXPERIMENTS = ("durability", "durability-quick")
FSYNC = {f"{w}:{c}" for w, c in DURABILITY_FSYNC}
PAPER_WORKLOADS = {"fio", "untar"} | {f"{w}:{c}" for w, c in DURABILITY_PAPER}
FSYNC_GOAL = {"hdd-7200": 100.0, "ssd": 10.0}
PAPER_GOAL = 1.5                  # journal mode vs ext4 data=journal
RECOVERY_GOAL = 0.5               # nvstack recovery mount / ext4 data=journal replay
JOURNAL_FS = "nvstack-ext4-defaults-journal"

NAMES = {"sqlite:wal": "sqlite WAL, synchronous=FULL",
         "sqlite:delete": "sqlite rollback journal (DELETE), synchronous=FULL",
         "applog:showcase": "512 B append + fdatasync",
         "maildir:showcase": "Maildir delivery (write, fsync, rename, fsync new/)",
         "filecreate:fsync": "create + write 4 KiB + fsync + close (fs_mark -S 1)",
         "postmark:sync": "Sync-PostMark (-o sync: fsync after every write)",
         "fio:seq_write-150m": "8 KiB appends to 150 MB + fsync (seq_write)",
         "postmark:vma": "Postmark (10k files, 200 dirs, 25k tx)",
         "untar:linux-fs-net": "untar Linux 6.1 fs/ + net/ (3,965 files)",
         "untar:linux-kernel": "untar Linux 6.1 kernel/"}
COLUMNS = ("ops_per_second", "ops_per_durable_second", "wall_seconds", "durable_seconds",
           "ops", "dev_requests_per_op", "dev_flushes_per_op", "dev_bytes_written_per_op",
           "dev_busy_ms_per_op", "nv_fsync_calls_per_op", "nv_fsync_waited_on_lower_per_op",
           "nv_requests_per_op", "cpu_daemon_us_per_op", "cpu_app_us_per_op",
           "host_cpu_busy_pct", "lat_p50_us", "lat_p99_us")


def is_durability(rows: list[dict]) -> bool:
    return bool(rows) and rows[0]["experiment"] in EXPERIMENTS


def group_of(workload: str, config: str) -> str:
    """'fsync' (an application waits for each durability point) or 'paper' (VMA's own)."""
    key = f"{workload}:{config}"
    return "fsync" if key in FSYNC else "paper" if key in PAPER_WORKLOADS or \
        workload in PAPER_WORKLOADS else "fsync"


def baseline_of(group: str) -> str:
    return "ext4-ordered" if group == "fsync" else "ext4-journal"


def speedup(group: str, x: dict, b: dict) -> float | None:
    """x over b (metric means of one configuration each); None without both numbers."""
    if group == "fsync":
        xv, bv = x.get("ops_per_second"), b.get("ops_per_second")
        return xv / bv if xv and bv else None
    xv, bv = x.get("durable_seconds"), b.get("durable_seconds")
    return bv / xv if xv and bv else None


def table_rows(rows: list[dict]) -> list[dict]:
    """One entry per (device, workload variant): {device, key, name, group, baseline, fs
    (ordered), per_fs {fs: {metric: mean}}, speedup {fs: x}, speedup_wall {fs: x}}."""
    acc: "OrderedDict[tuple, dict]" = OrderedDict()
    for r in rows:
        if r["status"] != "ok" or r["metric"] not in COLUMNS:
            continue
        key = (r["device"], r["workload"], r["config"], r["variant"])
        acc.setdefault(key, OrderedDict()).setdefault(r["fs"], {}).setdefault(
            r["metric"], []).append(float(r["value"]))
    fs_order = ["ext4-ordered", "ext4-journal", "nvstack-ext4-defaults", JOURNAL_FS,
                "nvstack-ext4-defaults-none"]
    devices = list(dict.fromkeys(r["device"] for r in rows))
    wl_order = [f"{w}:{c}" for w, c in DURABILITY_FSYNC + DURABILITY_PAPER]
    out = []
    for (dev, w, c, v), per in sorted(acc.items(), key=lambda kv: (
            devices.index(kv[0][0]), wl_order.index(f"{kv[0][1]}:{kv[0][2]}")
            if f"{kv[0][1]}:{kv[0][2]}" in wl_order else 99, kv[0][3])):
        means = {f: {m: statistics.fmean(x) for m, x in d.items()} for f, d in per.items()}
        group = group_of(w, c)
        base = baseline_of(group)
        b = means.get(base, {})
        fss = [f for f in fs_order if f in means] + [f for f in means if f not in fs_order]
        wall = {f: b["wall_seconds"] / means[f]["wall_seconds"] for f in fss
                if group == "paper" and b.get("wall_seconds") and means[f].get("wall_seconds")}
        out.append({"device": dev, "key": f"{w}:{c}", "variant": v,
                    "name": NAMES.get(f"{w}:{c}", f"{w} {c} {v}"), "group": group,
                    "baseline": base, "fs": fss, "per_fs": means,
                    "speedup": {f: s for f in fss if (s := speedup(group, means[f], b))},
                    "speedup_wall": wall})
    return out


def goals(lines: list[dict], recovery: list[dict]) -> list[dict]:
    """Every goal of issue 13 with its measured value: {goal, device, row, fs, value, target,
    met}."""
    out = []
    for ln in lines:
        for f in ln["fs"]:
            if f not in DURABILITY_NV or f not in ln["speedup"]:
                continue
            if ln["group"] == "fsync" and ln["device"] in FSYNC_GOAL:
                t = FSYNC_GOAL[ln["device"]]
                out.append({"goal": f">= {t:g}x ext4 (fsync-bound)", "device": ln["device"],
                            "row": ln["name"], "fs": f, "value": ln["speedup"][f], "target": t,
                            "met": ln["speedup"][f] >= t})
            elif ln["group"] == "paper" and f == JOURNAL_FS:
                out.append({"goal": f">= {PAPER_GOAL:g}x ext4 data=journal (paper)",
                            "device": ln["device"], "row": ln["name"], "fs": f,
                            "value": ln["speedup"][f], "target": PAPER_GOAL,
                            "met": ln["speedup"][f] >= PAPER_GOAL})
    for rr in recovery_rows(recovery):
        if rr["fs"].startswith("nvstack") and rr["status"] != "ok":
            out.append({"goal": f"recovery <= {RECOVERY_GOAL:g}x ext4 data=journal replay",
                        "device": rr["device"], "fs": rr["fs"], "value": None,
                        "target": RECOVERY_GOAL, "met": False,
                        "row": "recovery, full journal: FAILED (" + rr["reason"][:80] + ")"})
        elif rr["ratio"] is not None:
            out.append({"goal": f"recovery <= {RECOVERY_GOAL:g}x ext4 data=journal replay",
                        "device": rr["device"], "fs": rr["fs"],
                        "row": "recovery, full journal" + (", lower ext4 commit=600"
                                                           if rr.get("lower_lost") else "")
                        + (", directory in the journal" if rr.get("tree_in_journal") else ""),
                        "value": rr["ratio"], "target": RECOVERY_GOAL,
                        "met": rr["ratio"] <= RECOVERY_GOAL})
    return out


def recovery_rows(results: list[dict]) -> list[dict]:
    """Per recovery run: {device, fs, seconds (nvstack: its recovery mount; ext4: the journal
    replay = attach after the cut - a clean attach), ratio (nvstack: seconds / ext4-journal's
    replay on the device), ...the result}."""
    ext4j = {r["device"]: r.get("ext4_replay_seconds") for r in results
             if r["fs"] == "ext4-journal" and r["status"] == "ok"}
    out = []
    for r in results:
        secs = r.get("recovery_seconds") if r["status"] == "ok" else None
        ref = ext4j.get(r["device"])
        ratio = secs / ref if secs is not None and ref and r["fs"].startswith("nvstack") \
            else None
        out.append({**r, "seconds": secs, "ratio": ratio})
    return out


def load_recovery(result_dir: Path) -> list[dict]:
    from . import recovery
    return recovery.load(result_dir / "runs" / "recovery")


def load_powercut(result_dir: Path) -> list[dict]:
    try:
        return json.loads((result_dir / "powercut.json").read_text())["results"]
    except (OSError, ValueError, KeyError):
        return []


# the per-operation columns after "KiB written/op" is inserted at index 2 (metric, format)
PER_OP_CELLS = (("dev_requests_per_op", ".3f"), ("dev_flushes_per_op", ".3f"),
                ("dev_busy_ms_per_op", ".3f"), ("nv_fsync_calls_per_op", ".2f"),
                ("nv_fsync_waited_on_lower_per_op", ".3f"), ("nv_requests_per_op", ".1f"),
                ("cpu_daemon_us_per_op", ",.0f"), ("cpu_app_us_per_op", ",.0f"),
                ("host_cpu_busy_pct", ".0f"))


def _f(x, spec: str, suffix: str = "") -> str:
    return "" if x is None else format(x, spec) + suffix


def markdown(rows: list[dict], result_dir: Path) -> list[str]:
    lines = table_rows(rows)
    rec = load_recovery(result_dir)
    out = []
    for dev in dict.fromkeys(ln["device"] for ln in lines):
        out += [f"### {dev}: operations per second and what each operation cost "
                f"(ratio = speed-up over the row's baseline, same run)", "",
                "| workload | fs | ops/s | ratio | wall s | until durable s | ratio (wall) | "
                "disk req/op | flushes/op | KiB written/op | disk busy ms/op | fsync/op | "
                "fsync waited on lower/op | FUSE req/op | daemon CPU us/op | app CPU us/op | "
                "host CPU busy % |",
                "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
                "---:|---:|"]
        for ln in (x for x in lines if x["device"] == dev):
            for f in ln["fs"]:
                g = ln["per_fs"][f].get
                base = " (baseline)" if f == ln["baseline"] else ""
                kib = g("dev_bytes_written_per_op")
                cells = [_f(g("ops_per_second"), ",.0f"), _f(ln["speedup"].get(f), ",.1f", "x"),
                         _f(g("wall_seconds"), ".2f"), _f(g("durable_seconds"), ".2f"),
                         _f(ln["speedup_wall"].get(f), ",.2f", "x")]
                cells += [_f(g(m), spec) for m, spec in PER_OP_CELLS[:2]]
                cells.append(_f(kib / 1024 if kib is not None else None, ".2f"))
                cells += [_f(g(m), spec) for m, spec in PER_OP_CELLS[2:]]
                out.append(f"| {ln['name']} | {f}{base} | " + " | ".join(cells) + " |")
        out.append("")
    if rec:
        out += recovery_markdown(rec)
    gl = goals(lines, rec)
    if gl:
        met = sum(g["met"] for g in gl)
        out += [f"### Goals (issue 13): {met} of {len(gl)} met", "",
                "| goal | device | row | fs | measured | target | met |",
                "|---|---|---|---|---:|---:|---|"]
        for g in gl:
            out.append(f"| {g['goal']} | {g['device']} | {g['row']} | {g['fs']} | "
                       f"{_f(g['value'], ',.2f', 'x') or 'failed'} | {g['target']:g}x | "
                       f"{'yes' if g['met'] else '**no**'} |")
        out.append("")
    pc = load_powercut(result_dir)
    if pc:
        out += powercut_markdown(pc)
    return out


def recovery_markdown(results: list[dict]) -> list[str]:
    out = ["### Recovery after a crash with a full journal (sleep timing; power cut = "
           "SIGKILL + `device cut`)", "",
           "| device | fs | fill | journal before the cut | ext4 journal blocks to replay | "
           "attach after the cut s | clean attach s | ext4 replay s | nvstack recovery mount s "
           "| records replayed | recovery s | vs ext4 data=journal replay | disk requests / busy s "
           "at power on | status |",
           "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in recovery_rows(results):
        fill = (f"{r.get('fill_mib')} MiB data" if r.get("fill") == "data" else
                f"{r.get('fill_ops', '')} metadata ops")
        if r.get("lower_lost"):
            # commit=600 keeps ext4 from committing by time; jbd2 still commits when a
            # transaction outgrows its share of ext4's journal, so what it lost shows in
            # "records replayed" (all of a small fill, the last ~9k of 98k)
            fill += ", lower ext4 commit=600"
        if r.get("tree_in_journal"):
            fill += ", their directory made in the same journal"
        jb = (f"{r['journal_records_before_cut']:,} records, "
              f"{(r.get('journal_bytes_before_cut') or 0) / 2**20:.1f} MiB"
              if r.get("journal_records_before_cut") is not None else "")
        out.append(f"| {r['device']} | {r['fs']} | {fill} | {jb} | "
                   f"{_f(r.get('ext4_journal_blocks_to_replay'), ',')} | "
                   f"{_f(r.get('reattach_seconds'), '.2f')} | "
                   f"{_f(r.get('clean_attach_seconds'), '.2f')} | "
                   f"{_f(r.get('ext4_replay_seconds'), '.2f')} | "
                   f"{_f(r.get('recovery_mount_seconds'), '.2f')} | "
                   f"{_f(r.get('replayed_at_mount'), ',')} | {_f(r['seconds'], '.2f')} | "
                   f"{_f(r['ratio'], '.2f', 'x')} | {_disk(r)} | "
                   f"{r['status']} {r['reason'][:300]} |")
    return out + [""]


def _disk(r: dict) -> str:
    """The modeled disk's requests and busy seconds from power on to the end of recovery (the
    attach, ext4's replay and, for nvstack, its recovery mount)."""
    d = r.get("device_after_recovery") or r.get("device_after_attach") or {}
    if "requests" not in d:
        return ""
    return f"{d['requests']:,} / {d.get('busy_ms', 0) / 1000:.2f}"


def powercut_markdown(results: list[dict]) -> list[str]:
    ok = [r for r in results if r["status"] == "ok"]
    acked = sum(r.get("acknowledged", 0) for r in results)
    out = [f"### Power cuts with real applications: {len(results)} cuts, {len(ok)} passed, "
           f"{acked:,} acknowledged commits, "
           f"{sum(r.get('lost', 0) for r in results)} lost", "",
           "| fs | application | seed | killed first | cut mode | acknowledged | survived | lost "
           "| in flight found | data whole | recovery mount s | nvstack check | e2fsck | status |",
           "|---|---|---:|---|---|---:|---:|---:|---:|---|---:|---:|---:|---|"]
    for r in results:
        first = (r.get("kill_order") or "daemon, application").split(",")[0]
        app = r.get("app", "sqlite-wal") + (" (flushed)" if r.get("flush_after_init") else "")
        out.append(f"| {r['fs']} | {app} | {r.get('seed')} | {first} | "
                   f"{r.get('cut_mode', '')} | {_f(r.get('acknowledged'), ',')} | "
                   f"{_f(r.get('survived'), ',')} | {_f(r.get('lost'), ',')} | "
                   f"{_f(r.get('extra'), ',')} | "
                   f"{'' if 'integrity_ok' not in r else 'yes' if r['integrity_ok'] else 'NO'} | "
                   f"{_f(r.get('recovery_mount_seconds'), '.2f')} | "
                   f"{_f(r.get('nvstack_check_exit'), 'd')} | {_f(r.get('e2fsck_exit'), 'd')} | "
                   f"{r['status']} {r['reason'][:160]} |")
    return out + [""]


def text(rows: list[dict], result_dir: Path) -> str:
    """The headline table (plain text): per device and row, ops/s of each configuration and
    the speed-up of each nvstack mode, then the goals."""
    lines = table_rows(rows)
    out = []
    for ln in lines:
        cells = [f"{f.replace('nvstack-ext4-defaults', 'nv')}: "
                 f"{_f(ln['per_fs'][f].get('ops_per_second'), ',.0f')}/s"
                 + (f" ({ln['speedup'][f]:,.1f}x)" if f in ln["speedup"] and f != ln["baseline"]
                    else "") for f in ln["fs"]]
        out.append(f"{ln['device']:8s} {ln['name'][:48]:48s} " + "; ".join(cells))
    gl = goals(lines, load_recovery(result_dir))
    out.append(f"goals met: {sum(g['met'] for g in gl)} of {len(gl)}")
    return "\n".join(out)
