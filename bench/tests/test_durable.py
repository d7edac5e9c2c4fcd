"""The durability workloads (durable.py: sqlite, maildir, applog), their parsing, the
power-cut accounting, the showcase's durability table and figure. No root, no mounts: the
transaction loops run on pytest's tmp_path."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nvbench import experiments, fs, parse, plot, powercut, runner, summary, workloads
from nvbench.workloads import applog, durable, maildir, sqlite

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
DRIVER = workloads.DURABLE_DRIVER


def drive(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(DRIVER), *map(str, args)], capture_output=True,
                          text=True, timeout=120)


# ----- the driver, for real on tmp_path ------------------------------------------------------
@pytest.mark.parametrize("mode", ["wal", "delete"])
def test_sqlite_loop_acks_and_check(tmp_path, mode):
    assert drive("sqlite", "--dir", tmp_path, "--journal-mode", mode, "--init").returncode == 0
    acks = tmp_path / "acks"
    p = drive("sqlite", "--dir", tmp_path, "--journal-mode", mode, "--count", 25, "--acks", acks)
    assert p.returncode == 0, p.stderr
    m = parse.parse_durable(p.stdout)
    assert m["transactions"] == 25 and m["tx_per_second"] > 0 and m["lat_p99_us"] >= m["lat_p50_us"]
    assert durable.read_acks(str(acks)) == list(range(1, 26))
    doc = json.loads(p.stdout)
    assert doc["params"]["journal_mode"] == mode and doc["params"]["synchronous"] == "FULL"
    # a second run continues the ids
    p = drive("sqlite", "--dir", tmp_path, "--journal-mode", mode, "--count", 5, "--acks", acks)
    assert json.loads(p.stdout)["first_id"] == 26
    chk = drive("sqlite-check", "--dir", tmp_path, "--acks", acks)
    res = json.loads(chk.stdout)
    assert chk.returncode == 0 and res["ok"] and res["integrity_ok"]
    assert res["acknowledged"] == res["survived"] == 30 and res["lost"] == 0
    # an acknowledged commit that is gone is a loss: check fails
    import sqlite3
    con = sqlite3.connect(tmp_path / "bench.db", isolation_level=None)
    con.execute("DELETE FROM t WHERE id IN (3, 7)")
    con.close()
    chk = drive("sqlite-check", "--dir", tmp_path, "--acks", acks)
    res = json.loads(chk.stdout)
    assert chk.returncode == 1 and res["lost"] == 2 and res["lost_ids"] == [3, 7]


def test_maildir_and_applog_loops(tmp_path):
    for kind in ("maildir", "applog"):
        d = tmp_path / kind
        d.mkdir()
        assert drive(kind, "--dir", d, "--init").returncode == 0
        p = drive(kind, "--dir", d, "--count", 7, "--acks", d / "acks")
        assert p.returncode == 0, p.stderr
        assert parse.parse_durable(p.stdout)["transactions"] == 7
    assert sorted((tmp_path / "maildir" / "new").iterdir()) and \
        not list((tmp_path / "maildir" / "tmp").iterdir())
    names = sorted(int(p.name) for p in (tmp_path / "maildir" / "new").iterdir())
    assert names == list(range(1, 8))
    assert all(p.stat().st_size == durable.MESSAGE_BYTES
               for p in (tmp_path / "maildir" / "new").iterdir())
    assert (tmp_path / "applog" / "app.log").stat().st_size == 7 * durable.RECORD_BYTES


def test_driver_needs_a_limit(tmp_path):
    p = drive("applog", "--dir", tmp_path)
    assert p.returncode == 2 and "--seconds or --count" in p.stderr


# ----- accounting after a crash ----------------------------------------------------------------
def test_account_all_survived_with_one_in_flight():
    r = durable.account([1, 2, 3, 4], [1, 2, 3, 4, 5])
    assert r["ok"] and r["survived"] == 4 and r["lost"] == 0 and r["extra"] == 1
    assert r["unexpected"] == 0 and r["max_acknowledged"] == 4


def test_account_lost_unexpected_and_duplicates():
    r = durable.account([1, 2, 3, 4], [1, 2, 4])
    assert not r["ok"] and r["lost"] == 1 and r["lost_ids"] == [3]
    r = durable.account([1, 2], [1, 2, 3, 9])       # 3 may be in flight, 9 was never issued
    assert not r["ok"] and r["extra"] == 2 and r["unexpected"] == 1
    r = durable.account([1, 1, 2], [1, 2])
    assert not r["ok"] and r["duplicates_in_acks"] == 1
    r = durable.account([], [])
    assert r["ok"] and r["acknowledged"] == 0


def test_read_acks_ignores_a_torn_last_line(tmp_path):
    f = tmp_path / "acks"
    f.write_bytes(b"1\n2\n3\n4")                     # the writer died inside write(2)
    assert durable.read_acks(str(f)) == [1, 2, 3]
    f.write_bytes(b"")
    assert durable.read_acks(str(f)) == []


def test_percentile_nearest_rank():
    v = [float(x) for x in range(1, 101)]
    assert durable.percentile(v, 50) == 50.0 and durable.percentile(v, 99) == 99.0
    assert durable.percentile(v, 100) == 100.0 and durable.percentile([], 50) == 0.0
    assert durable.percentile([7.0], 99) == 7.0


# ----- parsing ---------------------------------------------------------------------------------
def test_parse_durable_sample(samples):
    m = parse.parse_durable((samples / "durable_sqlite_wal.txt").read_text())
    assert m["transactions"] == 200.0 and m["tx_per_second"] == pytest.approx(8274.796046898362)
    assert set(m) >= {"loop_seconds", "lat_mean_us", "lat_p50_us", "lat_p99_us", "lat_max_us"}


def test_parse_durable_errors():
    with pytest.raises(ValueError, match="OSError: \\[Errno 5\\]"):
        parse.parse_durable('{"kind": "applog", "error": "OSError: [Errno 5] Input/output '
                            'error", "transactions": 12, "last_id": 12}\n')
    with pytest.raises(ValueError, match="no durable.py result"):
        parse.parse_durable("Traceback (most recent call last):\n")
    with pytest.raises(ValueError, match="--init"):
        parse.parse_durable('{"kind": "sqlite", "init": true}')


def test_per_tx_metrics():
    m = {"transactions": 100.0, "dev_requests": 250.0, "dev_flushes": 100.0,
         "dev_bytes_written": 409600.0, "dev_busy_ms": 900.0}
    per = parse.per_tx_metrics(m)
    assert per == {"dev_requests_per_tx": 2.5, "dev_flushes_per_tx": 1.0,
                   "dev_bytes_written_per_tx": 4096.0, "dev_busy_ms_per_tx": 9.0}
    assert parse.per_tx_metrics({"transactions": 0.0, "dev_requests": 3.0}) == {}
    assert parse.per_tx_metrics({"dev_requests": 3.0}) == {}


# ----- the experiment as data --------------------------------------------------------------------
def test_showcase_matrix_and_seconds(tmp_path):
    exp = experiments.EXPERIMENTS["showcase"]
    assert exp.fs == ["ext4-ordered", "nvstack-ext4-defaults"] and exp.baseline == "ext4-ordered"
    st = runner.Settings(out=tmp_path, device="hdd-7200", dry_run=True)
    specs = runner.matrix(exp, st)
    assert len(specs) == 8
    assert [(s.workload, s.variant) for s in specs[::2]] == [
        ("sqlite", "journal=wal"), ("sqlite", "journal=delete"), ("maildir", "deliveries"),
        ("applog", "append+fdatasync")]
    assert all(s.params["seconds"] == 10.0 for s in specs)
    st = runner.Settings(out=tmp_path, device="hdd-7200", dry_run=True,
                         overrides={"seconds": 3.0})
    specs = runner.matrix(exp, st)
    assert all(s.params["seconds"] == 3.0 and s.params["seconds_scaled"] == 10.0 for s in specs)
    (_, p), = sqlite.variants("delete", 0.5)
    assert p["seconds"] == 5.0 and p["journal_mode"] == "delete"
    inv = sqlite.invocation(p, Path("/mnt/t"), tmp_path)
    assert inv.argv[1:] == [str(DRIVER), "sqlite", "--dir", "/mnt/t/nvbench-sqlite",
                            "--journal-mode", "delete", "--seconds", "5.0"]
    assert inv.pre[0] == ["mkdir", "-p", "/mnt/t/nvbench-sqlite"] and inv.pre[1][-1] == "--init"
    for mod in (maildir, applog):
        (_, p), = mod.variants("showcase", 1.0)
        assert mod.invocation(p, Path("/m"), tmp_path).argv[2] == p["kind"]


def test_nvstack_defaults_config_and_lower_ext4():
    c = fs.CONFIGS["nvstack-ext4-defaults"]
    assert c.nvstack == {"consistency": "undo", "tempfiles": "on", "cache": "on",
                         "writeback": "relo"}
    assert fs.lower_kernel_config("nvstack-ext4-defaults", ["ext4-ordered"]) == "ext4-ordered"
    # the lower ext4 is formatted like ext4-ordered: only data=journal gets a sized journal
    assert not fs.sized_journal(c) and not fs.sized_journal(fs.CONFIGS["ext4-ordered"])
    assert fs.sized_journal(fs.CONFIGS["ext4-journal"])
    argv = fs.nvstack_mount_argv("nv", c.nvstack, Path("/l/data"), Path("/m"), Path("/dev/shm/r"),
                                 256 << 20, {"tempfiles", "cache", "writeback"})
    assert argv == ["nv", "mount", "/l/data", "/m", "--nvram", "/dev/shm/r", "--size", "256M",
                    "--consistency", "undo", "--tempfiles", "on", "--cache", "on",
                    "--writeback", "relo", "--foreground"]


# ----- run directories -> CSV -> durability table and figure -------------------------------------
def make_durable_run(out: Path, fs_name: str, workload: str, variant: str, tps: float,
                     n: int, requests: int, written: int):
    d = out / "runs" / "showcase" / f"{workload}-x" / variant / fs_name / "rep1"
    d.mkdir(parents=True)
    spec = {"experiment": "showcase", "workload": workload, "config": "x", "variant": variant,
            "fs": fs_name, "rep": 1, "device": "hdd-7200", "memory_bytes": 1 << 30, "scale": 1.0,
            "nvram_bytes": 256 << 20, "params": {"seconds": 10.0}}
    (d / "spec.json").write_text(json.dumps(spec))
    nv = fs.CONFIGS[fs_name].nvstack is not None
    (d / "env.json").write_text(json.dumps({"run": {"fs": {"label": fs.CONFIGS[fs_name].label},
                                                     "nvram_bytes": (256 << 20) if nv else None}}))
    (d / "result.json").write_text(json.dumps({"status": "ok", "reason": "",
                                               "wall_seconds": 10.4, "sync_seconds": 0.1}))
    (d / "stdout.txt").write_text(json.dumps({
        "kind": workload, "transactions": n, "seconds": n / tps, "tx_per_second": tps,
        "first_id": 1, "last_id": n, "latency_us": {"mean": 1e6 / tps, "p50": 1e6 / tps,
                                                     "p99": 2e6 / tps, "max": 3e6 / tps}}) + "\n")
    (d / "device_stat_before.json").write_text(json.dumps(
        {"requests": 10, "writes": 5, "flushes": 5, "bytes_written": 4096, "busy_ms": 1.0}))
    (d / "device_stat_after.json").write_text(json.dumps(
        {"requests": 10 + requests, "writes": 5 + requests // 2, "flushes": 5 + requests // 2,
         "bytes_written": 4096 + written, "busy_ms": 1.0 + requests * 8.0}))


@pytest.fixture
def showcase_dir(tmp_path):
    for wl, var, (e_tps, n_tps) in (("sqlite", "journal=wal", (70.0, 7000.0)),
                                    ("sqlite", "journal=delete", (35.0, 500.0)),
                                    ("maildir", "deliveries", (30.0, 1000.0)),
                                    ("applog", "append+fdatasync", (65.0, 9000.0))):
        make_durable_run(tmp_path, "ext4-ordered", wl, var, e_tps, int(e_tps * 10),
                         int(e_tps * 10) * 3, int(e_tps * 10) * 12288)
        make_durable_run(tmp_path, "nvstack-ext4-defaults", wl, var, n_tps, int(n_tps * 10),
                         int(n_tps * 10), 8192)
    (tmp_path / "experiment.json").write_text(json.dumps(
        {"experiment": "showcase", "baseline": "ext4-ordered",
         "fs": ["ext4-ordered", "nvstack-ext4-defaults"]}))
    return tmp_path


def test_durability_rows_text_and_figure(showcase_dir):
    csv = parse.parse_tree(showcase_dir)["showcase"]
    rows = parse.read_csv(csv)
    tps = [r for r in rows if r["metric"] == "tx_per_second"]
    assert len(tps) == 8 and all(r["primary"] == "1" and r["unit"] == "tx/s" for r in tps)
    per = {(r["workload"], r["variant"], r["fs"]): float(r["value"]) for r in rows
           if r["metric"] == "dev_requests_per_tx"}
    assert per[("sqlite", "journal=wal", "ext4-ordered")] == 3.0
    assert per[("sqlite", "journal=wal", "nvstack-ext4-defaults")] == 1.0
    ratio = {(r["workload"], r["variant"]): float(r["value"]) for r in rows
             if r["metric"] == "throughput_ratio_vs_lower_fs"}
    assert ratio[("sqlite", "journal=wal")] == pytest.approx(100.0)   # by tx/s, not wall time
    lines = summary.durability_rows(rows, "ext4-ordered", ["ext4-ordered", "nvstack-ext4-defaults"])
    assert [ln["name"] for ln in lines] == ["sqlite WAL", "sqlite rollback journal",
                                             "Maildir delivery", "log append+fdatasync"]
    assert lines[0]["fs"] == ["ext4-ordered", "nvstack-ext4-defaults"]
    assert lines[3]["ratio"]["nvstack-ext4-defaults"] == pytest.approx(9000 / 65)
    text = summary.durability_text(showcase_dir)
    assert "sqlite WAL" in text and "100.0x" in text and "7,000" in text
    assert "Same disk, same durability" in text
    assert "10 s each" in text and "NVRAM region 256 MiB" in text
    md = summary.markdown(showcase_dir)
    assert "### Durable transactions" in md and "| sqlite WAL | nvstack-ext4-defaults | 7,000 |" in md
    pngs = plot.plot_dir(showcase_dir)
    fig = showcase_dir / "showcase-durability.png"
    assert fig in pngs and fig.read_bytes()[:8] == PNG_MAGIC
    # the generic per-metric bar charts are not drawn for the durable workloads
    assert not [p for p in pngs if "tx_per_second" in p.name]


# ----- the power cut's text ------------------------------------------------------------------------
def test_powercut_text():
    ok = {"fs": "nvstack-ext4-defaults", "journal_mode": "wal", "cut_after_s": 8.0,
          "status": "ok", "reason": "", "acknowledged": 41234, "survived": 41234, "lost": 0,
          "extra": 1, "integrity_ok": True, "e2fsck_exit": 0, "recovery_mount_seconds": 0.4,
          "nvstack_check_exit": 0, "frames_used_after_umount": 0, "cut_held_sectors": 12,
          "cut_dropped_sectors": 12, "cut_mode": "drop"}
    bad = {**ok, "fs": "ext4-ordered", "status": "failed", "reason": "2 acknowledged commits "
           "lost", "survived": 41232, "lost": 2}
    del bad["recovery_mount_seconds"]
    skipped = {"fs": "x", "journal_mode": "wal", "cut_after_s": 8.0, "status": "skipped",
               "reason": "nvstack binary not found"}
    text = powercut.text([ok, bad, skipped]).splitlines()
    assert "41,234 commits acknowledged, 41,234 survived, 0 lost" in text[0]
    assert "integrity_check: ok" in text[0] and text[0].endswith("OK")
    assert "recovery mount 0.4 s, nvstack check exit 0" in text[0]
    assert "(disk cache at the cut: 12 sectors held, 12 dropped, mode drop)" in text[0]
    assert "FAILED: 2 acknowledged commits lost" in text[1] and "recovery" not in text[1]
    assert text[2].endswith("SKIPPED: nvstack binary not found")
