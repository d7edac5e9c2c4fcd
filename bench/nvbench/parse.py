"""Raw run directories -> rows -> one CSV per experiment. Reads files only; runs nothing.

Row columns (long format, one row per run x metric): see COLUMNS. A skipped or failed run
gives one row with an empty metric and its reason, so the summary can list it.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

from . import fs as fs_mod
from . import workloads

COLUMNS = ["experiment", "workload", "config", "variant", "fs", "fs_label", "device", "rep",
           "metric", "value", "unit", "higher_is_better", "primary", "status", "reason",
           "memory_bytes", "nvram_bytes", "scale", "run_dir"]

# ----- tool parsers ----------------------------------------------------------------------------
_PM_UNITS = {"bytes": 1, "kilobytes": 1024, "megabytes": 1 << 20, "gigabytes": 1 << 30}


def parse_postmark(text: str) -> dict[str, float]:
    """Postmark 1.5x verbose or terse report -> metrics. Times are whole seconds (as printed)."""
    out: dict[str, float] = {}
    m = re.search(r"^\s*(\d+) seconds total", text, re.M)
    if m:
        out["pm_total_seconds"] = float(m.group(1))
        t = re.search(r"^\s*(\d+) seconds of transactions \((\d+(?:\.\d+)?) per second\)", text, re.M)
        if t:
            out["pm_transaction_seconds"] = float(t.group(1))
            out["pm_transactions_per_second"] = float(t.group(2))
        for key, pat in (("created", r"(\d+) created"), ("read", r"(\d+) read \("),
                         ("appended", r"(\d+) appended"), ("deleted", r"(\d+) deleted")):
            f = re.search(r"^\s*" + pat, text, re.M)
            if f:
                out[f"pm_files_{key}"] = float(f.group(1))
        for key in ("read", "written"):
            d = re.search(r"^\s*([\d.]+) (bytes|kilobytes|megabytes|gigabytes) " + key, text, re.M)
            if d:
                out[f"pm_bytes_{key}"] = float(d.group(1)) * _PM_UNITS[d.group(2)]
        return out
    # terse: one line of 13 numbers
    for line in text.splitlines():
        nums = line.split()
        if len(nums) == 13 and all(re.fullmatch(r"[\d.]+", n) for n in nums):
            v = [float(n) for n in nums]
            out.update(pm_total_seconds=v[0], pm_transaction_seconds=v[1],
                       pm_transactions_per_second=v[2], pm_read_bytes_per_second=v[11],
                       pm_write_bytes_per_second=v[12])
            return out
    raise ValueError("no postmark report found")


# bonnie++ 1.97+ CSV (format 1.98): index -> metric
_BONNIE_FIELDS = {9: "put_char_kBps", 10: "put_char_cpu", 11: "put_block_kBps",
                  12: "put_block_cpu", 13: "rewrite_kBps", 14: "rewrite_cpu",
                  15: "get_char_kBps", 16: "get_char_cpu", 17: "get_block_kBps",
                  18: "get_block_cpu", 19: "seeks_per_s", 20: "seeks_cpu"}
_BONNIE_LAT = {38: "put_char_latency_us", 39: "put_block_latency_us", 40: "rewrite_latency_us",
               41: "get_char_latency_us", 42: "get_block_latency_us", 43: "seeks_latency_us"}


def _latency_us(text: str) -> float | None:
    m = re.fullmatch(r"([\d.]+)(us|ms|s)", text.strip())
    if not m:
        return None
    return float(m.group(1)) * {"us": 1, "ms": 1e3, "s": 1e6}[m.group(2)]


def parse_bonnie(text: str) -> dict[str, float]:
    """The CSV line of `bonnie++ -q` -> metrics; '+++++' (too fast to measure) is omitted."""
    for line in text.splitlines():
        f = line.strip().split(",")
        if len(f) >= 44 and f[0].startswith("1.9"):
            out = {}
            for i, name in _BONNIE_FIELDS.items():
                if re.fullmatch(r"\d+(?:\.\d+)?", f[i]):
                    out[name] = float(f[i])
            for i, name in _BONNIE_LAT.items():
                v = _latency_us(f[i])
                if v is not None:
                    out[name] = v
            out["bonnie_file_size"] = f[5]  # kept as text: dropped by rows()
            return out
    raise ValueError("no bonnie++ CSV line found")


def parse_fio(text: str) -> dict[str, float]:
    """fio --output-format=json -> totals over all jobs (bandwidth KiB/s, IOPS, runtime s)."""
    start = text.find("{")
    if start < 0:
        raise ValueError("no fio JSON found")
    data = json.loads(text[start:])
    jobs = data.get("jobs", [])
    if not jobs:
        raise ValueError("fio JSON has no jobs")
    out = {"read_kBps": 0.0, "write_kBps": 0.0, "read_iops": 0.0, "write_iops": 0.0,
           "read_bytes": 0.0, "write_bytes": 0.0}
    runtime_ms = 0.0
    lat_sum = {"read": 0.0, "write": 0.0}
    for job in jobs:
        if job.get("error"):
            raise ValueError(f"fio job {job.get('jobname')} error {job['error']}")
        for d in ("read", "write"):
            s = job.get(d, {})
            out[f"{d}_kBps"] += float(s.get("bw", 0))
            out[f"{d}_iops"] += float(s.get("iops", 0))
            out[f"{d}_bytes"] += float(s.get("io_bytes", 0))
            lat_sum[d] += float(s.get("clat_ns", {}).get("mean", 0)) * float(s.get("total_ios", 0))
        runtime_ms = max(runtime_ms, float(job.get("job_runtime", 0)))
    out["total_iops"] = out["read_iops"] + out["write_iops"]
    out["runtime_s"] = runtime_ms / 1000.0
    for d in ("read", "write"):
        ios = sum(float(j.get(d, {}).get("total_ios", 0)) for j in jobs)
        out[f"{d}_ios"] = ios
        if ios:
            out[f"{d}_clat_mean_us"] = lat_sum[d] / ios / 1000.0
    return out


def parse_untar(text: str) -> dict[str, float]:
    """`tar -xvf` lists every member it extracts, one per line -> untar_members."""
    return {"untar_members": float(sum(1 for line in text.splitlines() if line.strip()))}


def parse_durable(text: str) -> dict[str, float]:
    """The JSON line durable.py prints (sqlite, maildir, applog) -> metrics: tx_per_second
    (acknowledged transactions per second of the loop), transactions, loop_seconds and the
    latency of one transaction (lat_{mean,p50,p99,max}_us). A run whose loop reported an error
    raises ValueError with it."""
    doc = None
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                doc = json.loads(line)
            except ValueError:
                continue
    if doc is None:
        raise ValueError("no durable.py result line found")
    if doc.get("error"):
        raise ValueError(f"durable.py {doc.get('kind')}: {doc['error']} after "
                         f"{doc.get('transactions')} transactions")
    if doc.get("init"):
        raise ValueError("durable.py printed only its --init line")
    out = {"tx_per_second": float(doc["tx_per_second"]),
           "transactions": float(doc["transactions"]), "loop_seconds": float(doc["seconds"])}
    for k, v in (doc.get("latency_us") or {}).items():
        out[f"lat_{k}_us"] = float(v)
    return out


# the modeled disk's counters reported per transaction of a durable workload (their deltas
# over the timed command and the sync after it / acknowledged transactions)
PER_TX = ("requests", "writes", "flushes", "bytes_written", "busy_ms")


def ops_metrics(workload: str, params: dict, metrics: dict[str, float]) -> dict[str, float]:
    """What one *operation* of a workload is, and the counters per operation (the durability
    experiment's tables): a durable loop's acknowledged transaction; a Postmark transaction;
    one write(2) of fio (an 8 KiB append of seq_write); one member tar extracted. Metrics:
      ops                         the count
      ops_per_second              ops / wall clock of the timed command (a loop: its tx/s)
      ops_per_durable_second      ops / (wall + sync + sync point): until all is durable
      dev_<c>_per_op              modeled-disk counter deltas (timed command + sync) per op
      nv_fsync_calls_per_op, nv_fsync_waited_on_lower_per_op   nvstack's durability calls
                                  per op, and those that waited for the lower FS
      nv_requests_per_op          FUSE requests nvstack served per op
      cpu_daemon_us_per_op, cpu_app_us_per_op   CPU of the FUSE daemon and of the timed
                                  command (with its children) per op"""
    if workload in ("sqlite", "maildir", "applog", "filecreate"):
        ops = metrics.get("transactions")
    elif workload == "postmark":
        ops = float(params["transactions"]) if params.get("transactions") else None
    elif workload == "fio":
        ops = (metrics.get("write_ios") or 0.0) + (metrics.get("read_ios") or 0.0)
    elif workload == "untar":
        ops = metrics.get("untar_members")
    else:
        ops = None
    if not ops:
        return {}
    out = {"ops": ops}
    wall, durable = metrics.get("wall_seconds"), metrics.get("durable_seconds")
    out["ops_per_second"] = metrics["tx_per_second"] if "tx_per_second" in metrics else \
        (ops / wall if wall else None)
    if durable:
        out["ops_per_durable_second"] = ops / durable
    for k in PER_TX:
        if f"dev_{k}" in metrics:
            out[f"dev_{k}_per_op"] = metrics[f"dev_{k}"] / ops
    for k in ("calls", "waited_on_lower"):
        if f"nv_fsync.{k}" in metrics:
            out[f"nv_fsync_{k}_per_op"] = metrics[f"nv_fsync.{k}"] / ops
    requests = [v for k, v in metrics.items() if k.startswith("nv_requests.")]
    if requests:
        out["nv_requests_per_op"] = sum(requests) / ops
    for k in ("daemon_s", "app_s"):
        if f"cpu_{k}" in metrics:
            out[f"cpu_{k[:-2]}_us_per_op"] = 1e6 * metrics[f"cpu_{k}"] / ops
    return {k: v for k, v in out.items() if v is not None}


def per_tx_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """dev_<counter>_per_tx for the PER_TX counters (nothing without transactions or a
    modeled disk)."""
    n = metrics.get("transactions")
    if not n or n <= 0:
        return {}
    return {f"dev_{k}_per_tx": metrics[f"dev_{k}"] / n for k in PER_TX if f"dev_{k}" in metrics}


_DEV_KEYS = ("requests", "bytes_written", "bytes_read", "busy_ms", "seek_distance_sectors")


def parse_device_stat(before: dict | None, after: dict) -> dict[str, float]:
    """`nvstack device stat --json` before/after the timed workload -> deltas (dev_*)."""
    out = {}
    for key, val in _flatten(after).items():
        if isinstance(val, (int, float)) and not isinstance(val, bool):
            base = _flatten(before or {}).get(key, 0)
            out[f"dev_{key}"] = float(val) - float(base if isinstance(base, (int, float)) else 0)
    return out


# counters (not gauges) of `nvstack stat --json`: reported as the delta over the timed workload
_NV_COUNTERS = ("requests.", "errors.", "app.", "lower.", "nvram.transactions_", "tempfiles.",
                "cache.", "writeback.", "fsync.", "journal.")
# ... except these gauges and settings, reported as read after the workload (span_blocks_avg is
# recomputed from the span_* deltas)
_NV_GAUGES = ("tempfiles.pages_resident", "tempfiles.files_resident", "tempfiles.record_frames",
              "tempfiles.span_blocks_avg", "tempfiles.max_size",
              "cache.files", "cache.record_frames", "writeback.pages_dirty", "writeback.pages_inactive_dirty",
              "writeback.high_pages", "writeback.low_pages", "writeback.zone_blocks",
              "fsync.unsynced_objects", "journal.records", "journal.bytes", "journal.size_max",
              "journal.interval_secs", "journal.replayed_at_mount", "journal.group.generation",
              "journal.group.log_capacity", "journal.group.log_entries",
              "journal.group.credit_pages", "journal.group.group_bytes",
              "journal.group.group_operations", "journal.group.group_pages",
              "journal.group.fresh_pages")


def parse_nvstack_stat(stat: dict, before: dict | None = None) -> dict[str, float]:
    """`nvstack stat --json` after the workload -> nv_* metrics. With the stat taken right
    before the timed command, counters become deltas (the timed workload alone).

    TempFFS (`tempfiles` object): counters become deltas too; the resident pages/files stay
    absolute; span_blocks_avg is recomputed as the delta of span_blocks_sum over the delta of
    span_files (the spans of the files transformed during the timed workload; 0 if none).

    Page cache (`cache`, `writeback` objects): hits, fetches, pages_dropped, write_through,
    pages_written, batches, requests, repeated_pages, inter_request_distance_blocks, syncs and
    rounds.<reason> become deltas; cache.files, writeback.pages_dirty, pages_inactive_dirty
    and the settings high_pages, low_pages, zone_blocks stay as read after (`enabled` and
    `policy` are not numbers and are left out)."""
    base = _flatten(before or {})
    out = {}
    for k, v in _flatten(stat).items():
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            continue
        if before is not None and k.startswith(_NV_COUNTERS) and k not in _NV_GAUGES:
            b = base.get(k, 0)
            v = float(v) - float(b if isinstance(b, (int, float)) else 0)
        out[f"nv_{k}"] = float(v)
    files, blocks = out.get("nv_tempfiles.span_files"), out.get("nv_tempfiles.span_blocks_sum")
    if before is not None and files is not None and blocks is not None:
        out["nv_tempfiles.span_blocks_avg"] = blocks / files if files > 0 else 0.0
    return out


def tempffs_metrics(nv: dict[str, float]) -> dict[str, float]:
    """Derived TempFFS metrics of one run from its nv_* metrics (nothing if it created no
    temp file, e.g. tempfiles off):
      tempffs_deleted_in_nvram_pct       deleted_in_nvram / created (thesis Fig 4.4: >= 44 %)
      tempffs_transformed_pct            transformed_total / created
      tempffs_span_blocks_avg_all_files  span_blocks_sum / created: the thesis' Fig 4.6 average
                                         over all files, a file deleted in NVRAM having span 0
    """
    created = nv.get("nv_tempfiles.created")
    if not created or created <= 0:
        return {}
    out = {}
    for key, name in (("deleted_in_nvram", "tempffs_deleted_in_nvram_pct"),
                      ("transformed_total", "tempffs_transformed_pct")):
        if f"nv_tempfiles.{key}" in nv:
            out[name] = 100.0 * nv[f"nv_tempfiles.{key}"] / created
    if "nv_tempfiles.span_blocks_sum" in nv:
        out["tempffs_span_blocks_avg_all_files"] = nv["nv_tempfiles.span_blocks_sum"] / created
    return out


def writeback_metrics(nv: dict[str, float]) -> dict[str, float]:
    """Derived write-back metrics of one run from its nv_* metrics (nothing if no page was
    written back, e.g. the page cache off):
      wb_repeated_pct                        100 x repeated_pages / pages_written (Fig 4.12)
      wb_pages_per_request                   pages_written / requests (run length on disk)
      wb_inter_request_distance_per_request  inter_request_distance_blocks / requests: the
                                             accumulated distance (Fig 4.11) per request
                                             (requests without a physical block add none)
    """
    written = nv.get("nv_writeback.pages_written")
    if not written or written <= 0:
        return {}
    out = {}
    if "nv_writeback.repeated_pages" in nv:
        out["wb_repeated_pct"] = 100.0 * nv["nv_writeback.repeated_pages"] / written
    requests = nv.get("nv_writeback.requests")
    if requests and requests > 0:
        out["wb_pages_per_request"] = written / requests
        if "nv_writeback.inter_request_distance_blocks" in nv:
            out["wb_inter_request_distance_per_request"] = \
                nv["nv_writeback.inter_request_distance_blocks"] / requests
    return out


# /sys/block/<dev>/stat (Documentation/block/stat.rst): field index -> metric; sectors are
# always 512 bytes there, whatever the device's sector size
_BLK_FIELDS = {0: ("blk_read_ios", 1), 2: ("blk_read_bytes", 512), 4: ("blk_write_ios", 1),
               6: ("blk_write_bytes", 512), 9: ("blk_io_ticks_ms", 1),
               13: ("blk_discard_bytes", 512), 15: ("blk_flush_ios", 1)}


def parse_block_stat(before: str | None, after: str) -> dict[str, float]:
    """The block device's stat line before and after (timed command + sync) -> blk_* deltas."""
    def fields(text):
        vals = (text or "").split()
        if vals and not all(v.isdigit() for v in vals):
            raise ValueError(f"not a /sys/block/*/stat line: {text[:80]!r}")
        return [int(v) for v in vals]
    a, b = fields(after), fields(before)
    if len(a) < 11:
        raise ValueError("block stat has fewer than 11 fields")
    out = {}
    for i, (name, mult) in _BLK_FIELDS.items():
        if i < len(a):
            out[name] = float((a[i] - (b[i] if i < len(b) else 0)) * mult)
    return out


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


TOOL_PARSERS = {"postmark": parse_postmark, "bonnie": parse_bonnie, "fio": parse_fio,
                "untar": parse_untar, "sqlite": parse_durable, "maildir": parse_durable,
                "applog": parse_durable, "filecreate": parse_durable}

# metric -> (unit, higher_is_better) for the metrics that get plotted/summarised
UNITS = {"wall_seconds": ("s", False), "sync_seconds": ("s", False),
         "flush_seconds": ("s", False),
         "pm_transactions_per_second": ("tx/s", True), "pm_total_seconds": ("s", False),
         "put_char_kBps": ("KiB/s", True), "put_block_kBps": ("KiB/s", True),
         "rewrite_kBps": ("KiB/s", True), "get_block_kBps": ("KiB/s", True),
         "write_kBps": ("KiB/s", True), "read_kBps": ("KiB/s", True),
         "write_iops": ("ops/s", True), "read_iops": ("ops/s", True),
         "total_iops": ("ops/s", True), "runtime_s": ("s", False),
         "dev_busy_ms": ("ms", False), "dev_bytes_written": ("B", False),
         "dev_requests": ("", False), "dev_seek_distance_sectors": ("sectors", False),
         "pm_tx_per_wall_second": ("tx/s", True),
         "tx_per_second": ("tx/s", True), "transactions": ("tx", True),
         "loop_seconds": ("s", ""), "lat_mean_us": ("us", False), "lat_p50_us": ("us", False),
         "lat_p99_us": ("us", False), "lat_max_us": ("us", False),
         "dev_requests_per_tx": ("", False), "dev_writes_per_tx": ("", False),
         "dev_flushes_per_tx": ("", False), "dev_bytes_written_per_tx": ("B", False),
         "dev_busy_ms_per_tx": ("ms", False), "dev_flushes": ("", False),
         "dev_writes": ("", False),
         "blk_write_bytes": ("B", False), "blk_read_bytes": ("B", False),
         "blk_write_ios": ("", False), "blk_read_ios": ("", False),
         "blk_io_ticks_ms": ("ms", False),
         "nv_lower.bytes_written": ("B", False), "nv_lower.bytes_read": ("B", False),
         "nv_app.bytes_written": ("B", False),
         "nv_tempfiles.created": ("files", ""), "nv_tempfiles.deleted_in_nvram": ("files", True),
         "nv_tempfiles.transformed_total": ("files", False),
         "nv_tempfiles.bytes_written_by_apps": ("B", ""),
         "nv_tempfiles.bytes_transformed": ("B", False),
         "nv_tempfiles.span_blocks_avg": ("blocks", False),
         "tempffs_deleted_in_nvram_pct": ("%", True), "tempffs_transformed_pct": ("%", False),
         "tempffs_span_blocks_avg_all_files": ("blocks", False),
         # the NVRAM page cache and write-back (deltas; pages_dirty as read after)
         "nv_writeback.pages_written": ("pages", False), "nv_writeback.batches": ("", ""),
         "nv_writeback.requests": ("", False), "nv_writeback.repeated_pages": ("pages", False),
         "nv_writeback.inter_request_distance_blocks": ("blocks", False),
         "nv_writeback.syncs": ("", False), "nv_writeback.pages_dirty": ("pages", ""),
         "nv_cache.hits": ("", ""), "nv_cache.fetches": ("pages", False),
         "nv_cache.pages_dropped": ("pages", ""), "nv_cache.write_through": ("", False),
         "wb_repeated_pct": ("%", False), "wb_pages_per_request": ("pages", True),
         "wb_inter_request_distance_per_request": ("blocks", False),
         "wb_time_ratio_vs_file": ("x", False), "wb_improvement_vs_file_pct": ("%", True),
         # paired with the tempfiles-off twin / the lower FS alone, same repetition
         "tempffs_throughput_ratio_on_off": ("x", True),
         "tempffs_lower_bytes_eliminated_pct": ("%", True),
         "tempffs_blk_bytes_eliminated_pct": ("%", True),
         "tempffs_dev_bytes_eliminated_pct": ("%", True),
         "throughput_ratio_vs_lower_fs": ("x", True),
         # the durability experiment: until everything is durable, and per operation
         "sync_point_seconds": ("s", False), "durable_seconds": ("s", False),
         "ops": ("", ""), "ops_per_second": ("ops/s", True),
         "ops_per_durable_second": ("ops/s", True), "untar_members": ("", ""),
         "dev_requests_per_op": ("", False), "dev_writes_per_op": ("", False),
         "dev_flushes_per_op": ("", False), "dev_bytes_written_per_op": ("B", False),
         "dev_busy_ms_per_op": ("ms", False), "nv_fsync_calls_per_op": ("", ""),
         "nv_fsync_waited_on_lower_per_op": ("", False),
         "nv_fsync.calls": ("", ""), "nv_fsync.waited_on_lower": ("", False),
         "nv_requests_per_op": ("", False), "host_cpu_busy_pct": ("%", ""),
         "cpu_daemon_s": ("s", False), "cpu_app_s": ("s", False), "still_seconds": ("s", ""),
         "cpu_daemon_us_per_op": ("us", False), "cpu_app_us_per_op": ("us", False)}


def primary_metric(workload: str, config: str) -> tuple[str, str, bool]:
    mod = workloads.get(workload)
    if hasattr(mod, "primary"):
        return mod.primary(config)
    return mod.PRIMARY


# ----- run directories -> rows -------------------------------------------------------------------
def _load(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def parse_run(rundir: Path) -> list[dict]:
    result = _load(rundir / "result.json")
    spec = _load(rundir / "spec.json")
    env = _load(rundir / "env.json") or {}
    if not result or not spec:
        return []
    run_env = env.get("run") or {}
    label = (run_env.get("fs") or {}).get("label", spec["fs"])
    if "nvram_bytes" in run_env:          # None for configurations without NVRAM
        nvram = run_env["nvram_bytes"]
    else:
        cfg = fs_mod.CONFIGS.get(spec["fs"])
        nvram = spec.get("nvram_bytes") if cfg is not None and cfg.nvstack else None
    base = {"experiment": spec["experiment"], "workload": spec["workload"],
            "config": spec["config"], "variant": spec["variant"], "fs": spec["fs"],
            "fs_label": label, "device": spec["device"], "rep": spec["rep"],
            "status": result["status"], "reason": result.get("reason", ""),
            "memory_bytes": spec["memory_bytes"], "nvram_bytes": "" if nvram is None else nvram,
            "scale": spec["scale"], "run_dir": str(rundir)}
    if result["status"] != "ok":
        return [{**base, "metric": "", "value": "", "unit": "", "higher_is_better": "",
                 "primary": ""}]
    metrics: dict[str, float] = {}
    for key in ("wall_seconds", "sync_seconds", "flush_seconds", "sync_point_seconds"):
        if result.get(key) is not None:
            metrics[key] = float(result[key])
    watch = result.get("watch") or {}
    if watch.get("longest_still_s") is not None:   # watch.py: no watched process used CPU
        metrics["still_seconds"] = float(watch["longest_still_s"])
    cpu = result.get("cpu") or {}
    if cpu.get("host_total_s"):
        metrics["host_cpu_busy_pct"] = 100.0 * cpu.get("host_busy_s", 0.0) / cpu["host_total_s"]
    for key in ("daemon_s", "app_s"):
        if cpu.get(key) is not None:
            metrics[f"cpu_{key}"] = float(cpu[key])
    if "sync_point_seconds" in metrics or "flush_seconds" in metrics:
        # the experiment ends at a durability point (a sync point; for FAT the write-back of
        # what the file system still held, `device flush`)
        metrics["durable_seconds"] = sum(metrics.get(k, 0.0) for k in (
            "wall_seconds", "sync_seconds", "flush_seconds", "sync_point_seconds"))
    parser = TOOL_PARSERS.get(spec["workload"])
    if parser:
        try:
            metrics.update(parser((rundir / "stdout.txt").read_text()))
        except (OSError, ValueError) as exc:
            return [{**base, "status": "failed", "reason": f"parse error: {exc}", "metric": "",
                     "value": "", "unit": "", "higher_is_better": "", "primary": ""}]
    tx = (spec.get("params") or {}).get("transactions")
    if spec["workload"] == "postmark" and tx and metrics.get("wall_seconds"):
        # Postmark's own tx/s divides by whole seconds of the transaction phase only
        metrics["pm_tx_per_wall_second"] = float(tx) / metrics["wall_seconds"]
    after = _load(rundir / "device_stat_after.json")
    if isinstance(after, dict):
        metrics.update(parse_device_stat(_load(rundir / "device_stat_before.json"), after))
    blk_after = _read(rundir / "blockdev_stat_after.txt")
    if blk_after:
        try:
            metrics.update(parse_block_stat(_read(rundir / "blockdev_stat_before.txt"),
                                            blk_after))
        except ValueError:
            pass                          # a garbled stat file loses these metrics only
    metrics.update(per_tx_metrics(metrics))
    nv = _load(rundir / "nvstack_stat.json")
    if isinstance(nv, dict):
        nv_before = _load(rundir / "nvstack_stat_before.json")
        nvm = parse_nvstack_stat(nv, nv_before if isinstance(nv_before, dict) else None)
        metrics.update(nvm)
        metrics.update(tempffs_metrics(nvm))
        metrics.update(writeback_metrics(nvm))
    metrics.update(ops_metrics(spec["workload"], spec.get("params") or {}, metrics))
    cg = _load(rundir / "cgroup.json")
    if isinstance(cg, dict):
        for k in ("max_usage_in_bytes", "failcnt"):
            if k in cg:
                metrics[f"cgroup_{k}"] = float(cg[k])
    pmetric = primary_metric(spec["workload"], spec["config"])[0]
    rows = []
    for name, value in sorted(metrics.items()):
        if not isinstance(value, (int, float)):
            continue
        unit, hib = UNITS.get(name, ("", ""))
        if name == pmetric:
            unit, hib = primary_metric(spec["workload"], spec["config"])[1:]
        rows.append({**base, "metric": name, "value": repr(float(value)), "unit": unit,
                     "higher_is_better": "" if hib == "" else int(bool(hib)),
                     "primary": int(name == pmetric)})
    return rows


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


# (metric of both runs, paired metric = 100 x (1 - on / off)) for the bytes TempFFS saves
_ELIMINATED = (("nv_lower.bytes_written", "tempffs_lower_bytes_eliminated_pct"),
               ("blk_write_bytes", "tempffs_blk_bytes_eliminated_pct"),
               ("dev_bytes_written", "tempffs_dev_bytes_eliminated_pct"))


def paired_rows(rows: list[dict]) -> list[dict]:
    """Metrics of a run relative to another run of the same repetition and workload variant
    (runs are interleaved rep by rep, so the pair ran back to back):

    on the tempfiles-on configuration, paired with its tempfiles-off twin (fs.tempfiles_pairs):
      tempffs_throughput_ratio_on_off      wall(off) / wall(on): throughput on / off, same work
      tempffs_lower_bytes_eliminated_pct   100 x (1 - on / off) of nv_lower.bytes_written
      tempffs_blk_bytes_eliminated_pct     ... of blk_write_bytes (the lower FS's loop device)
      tempffs_dev_bytes_eliminated_pct     ... of dev_bytes_written (modeled disk)
    on every nvstack configuration, paired with its lower FS alone (fs.lower_kernel_config):
      throughput_ratio_vs_lower_fs         wall(lower FS) / wall(x), e.g. vs ext2; for the
                                           time-limited durable workloads (tx_per_second)
                                           tx/s(x) / tx/s(lower FS)
    on every configuration with a `file` twin (fs.writeback_file_twins: the page cache on
    with the file policy over the same lower FS; the thesis' reference for write-back):
      wb_time_ratio_vs_file                wall(x) / wall(file): < 1 is faster than file
      wb_improvement_vs_file_pct           100 x (wall(file) - wall(x)) / wall(file)
    """
    names = list(dict.fromkeys(r["fs"] for r in rows))
    pairs = fs_mod.tempfiles_pairs(names)
    wb_twins = fs_mod.writeback_file_twins(names)
    value: dict[tuple, float] = {}
    first: dict[tuple, dict] = {}
    for r in rows:
        if r["status"] != "ok" or not r["metric"]:
            continue
        run = (r["device"], r["workload"], r["config"], r["variant"], str(r["rep"]), r["fs"])
        value[run + (r["metric"],)] = float(r["value"])
        first.setdefault(run, r)
    out = []
    for run, row in first.items():
        fs = run[-1]
        derived = {}
        off = pairs.get(fs)
        if off and run[:-1] + (off,) in first:
            on_v = lambda m: value.get(run + (m,))                     # noqa: E731
            off_v = lambda m: value.get(run[:-1] + (off, m))           # noqa: E731
            if on_v("wall_seconds") and off_v("wall_seconds"):
                derived["tempffs_throughput_ratio_on_off"] = \
                    off_v("wall_seconds") / on_v("wall_seconds")
            for src, name in _ELIMINATED:
                if on_v(src) is not None and off_v(src):
                    derived[name] = 100.0 * (1.0 - on_v(src) / off_v(src))
        lower = fs_mod.lower_kernel_config(fs, names)
        cfg = fs_mod.CONFIGS.get(fs)
        if lower and cfg is not None and cfg.nvstack:
            t_x, t_l = value.get(run + ("tx_per_second",)), \
                value.get(run[:-1] + (lower, "tx_per_second"))
            w_x, w_l = value.get(run + ("wall_seconds",)), \
                value.get(run[:-1] + (lower, "wall_seconds"))
            if t_x is not None and t_l:       # time-limited loops: throughput, not wall time
                derived["throughput_ratio_vs_lower_fs"] = t_x / t_l
            elif t_x is None and w_x and w_l:
                derived["throughput_ratio_vs_lower_fs"] = w_l / w_x
        twin = wb_twins.get(fs)
        if twin:
            w_x, w_f = value.get(run + ("wall_seconds",)), \
                value.get(run[:-1] + (twin, "wall_seconds"))
            if w_x and w_f:
                derived["wb_time_ratio_vs_file"] = w_x / w_f
                derived["wb_improvement_vs_file_pct"] = 100.0 * (w_f - w_x) / w_f
        for name, v in derived.items():
            unit, hib = UNITS[name]
            out.append({**row, "metric": name, "value": repr(float(v)), "unit": unit,
                        "higher_is_better": int(bool(hib)), "primary": 0})
    return out


def parse_tree(out: Path) -> dict[str, Path]:
    """All runs under out/runs -> out/<experiment>.csv; returns {experiment: csv path}."""
    by_exp: dict[str, list[dict]] = {}
    for result in sorted((out / "runs").rglob("result.json")):
        for row in parse_run(result.parent):
            by_exp.setdefault(row["experiment"], []).append(row)
    for exp, rows in by_exp.items():
        rows += paired_rows(rows)
    written = {}
    for exp, rows in by_exp.items():
        path = out / f"{exp}.csv"
        write_csv(path, rows)
        written[exp] = path
    return written


def write_csv(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(r)


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))
