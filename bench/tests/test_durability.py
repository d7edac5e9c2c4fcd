"""The durability experiment (issue 13): the new transaction loops (files, editor) and the
checks after a crash (maildir, editor), the matrix over two devices with per-workload
configurations and baselines, the per-operation metrics, the tables, goals and figure, the
recovery and power-cut summaries. No root, no mounts: loops run on pytest's tmp_path, the
matrix in dry-run mode, the summaries on synthetic run directories."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nvbench import durability, nvstack, parse, plot, recovery, runner, summary, workloads
from nvbench.experiments import EXPERIMENTS
from nvbench.workloads import durable, filecreate, fio, postmark, untar

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
DRIVER = workloads.DURABLE_DRIVER


def drive(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(DRIVER), *map(str, args)], capture_output=True,
                          text=True, timeout=120)


pytestmark = pytest.mark.usefixtures("no_nvstack")


# ----- the loops and the checks after a crash ---------------------------------------------------
def test_files_loop_fsmark_style(tmp_path):
    assert drive("files", "--dir", tmp_path, "--init").returncode == 0
    p = drive("files", "--dir", tmp_path, "--count", 12, "--acks", tmp_path / "acks")
    assert p.returncode == 0, p.stderr
    assert parse.parse_durable(p.stdout)["transactions"] == 12
    made = sorted((tmp_path / "files").iterdir(), key=lambda f: int(f.name))
    assert [int(f.name) for f in made] == list(range(1, 13))
    assert all(f.stat().st_size == durable.FILE_BYTES for f in made)
    # a second run continues after the files already there
    p = drive("files", "--dir", tmp_path, "--count", 2)
    assert json.loads(p.stdout)["first_id"] == 13


def test_editor_versions_and_check(tmp_path):
    v = durable.editor_version(42)
    assert len(v) == durable.VERSION_BYTES and durable.editor_parse(v) == 42
    assert durable.editor_parse(v[:-1] + bytes([v[-1] ^ 1])) is None      # checksum
    assert durable.editor_parse(v[:100]) is None                          # torn
    acks = tmp_path / "acks"
    assert drive("editor", "--dir", tmp_path, "--init").returncode == 0
    p = drive("editor", "--dir", tmp_path, "--count", 9, "--acks", acks, "--dir-fsync")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["params"]["dir_fsync"] is True
    assert durable.editor_parse((tmp_path / "doc.txt").read_bytes()) == 9
    assert not (tmp_path / "doc.txt.tmp").exists()
    chk = drive("editor-check", "--dir", tmp_path, "--acks", acks)
    res = json.loads(chk.stdout)
    assert chk.returncode == 0 and res["ok"] and res["acknowledged"] == 9 and res["lost"] == 0
    # the save in flight found: allowed
    (tmp_path / "doc.txt").write_bytes(durable.editor_version(10))
    res = json.loads(drive("editor-check", "--dir", tmp_path, "--acks", acks).stdout)
    assert res["ok"] and res["extra"] == 1
    # an older version after the crash: acknowledged saves lost
    (tmp_path / "doc.txt").write_bytes(durable.editor_version(7))
    chk = drive("editor-check", "--dir", tmp_path, "--acks", acks)
    res = json.loads(chk.stdout)
    assert chk.returncode == 1 and res["lost"] == 2 and res["lost_ids"] == [8, 9]
    # a torn document is not a version at all
    (tmp_path / "doc.txt").write_bytes(durable.editor_version(9)[:2048])
    res = json.loads(drive("editor-check", "--dir", tmp_path, "--acks", acks).stdout)
    assert not res["ok"] and not res["integrity_ok"] and res["version"] is None


def test_maildir_check(tmp_path):
    acks = tmp_path / "acks"
    assert drive("maildir", "--dir", tmp_path, "--init").returncode == 0
    assert drive("maildir", "--dir", tmp_path, "--count", 6, "--acks", acks).returncode == 0
    res = json.loads(drive("maildir-check", "--dir", tmp_path, "--acks", acks).stdout)
    assert res["ok"] and res["survived"] == 6 and res["damaged"] == 0
    (tmp_path / "new" / "3").write_bytes(b"short")                        # torn message
    (tmp_path / "new" / "5").unlink()                                      # lost delivery
    chk = drive("maildir-check", "--dir", tmp_path, "--acks", acks)
    res = json.loads(chk.stdout)
    assert chk.returncode == 1 and not res["integrity_ok"] and res["damaged_ids"] == [3]
    assert res["lost_ids"] == [3, 5]


def test_sync_point(tmp_path):
    p = drive("sync-point", "--dir", tmp_path)
    assert p.returncode == 0 and (tmp_path / ".nvbench-sync-point").exists()
    assert workloads.sync_point_argv(Path("/m"))[2:] == ["sync-point", "--dir", "/m"]


# ----- workload configurations ----------------------------------------------------------------
def test_new_workload_configs(tmp_path):
    (_, p), = filecreate.variants("fsync", 1.0)
    inv = filecreate.invocation(p, Path("/m"), tmp_path)
    assert inv.argv[2:] == ["files", "--dir", "/m/nvbench-files", "--seconds", "10.0",
                            "--count", "10000"]
    (name, p), = postmark.variants("sync", 1.0)
    assert name == "files=200" and p["transactions"] == 400 and postmark.mount_option(p) == "sync"
    assert "set write 4096" in postmark.command_file(p, Path("/m"))
    assert fio.JOBS["seq_write-150m"]["global"] == fio.JOBS["seq_write"]["global"]
    assert "size=157286400" in fio.job_file({"config": "seq_write-150m", "scale": 1.0}, Path("/d"))


def test_untar_subset_is_made_untimed(tmp_path, monkeypatch):
    monkeypatch.setattr(untar, "find_tarball", lambda c="": "/usr/src/linux-source-6.1.tar.xz")
    (name, p), = untar.variants("linux-fs-net", 1.0)
    assert name == "linux-source-6.1-fs-net" and p["members"] == ["fs", "net"]
    inv = untar.invocation(p, Path("/m"), tmp_path, tmp_path / "cache")
    sub = tmp_path / "cache" / "linux-source-6.1-fs-net.tar"
    assert inv.argv == ["tar", "-xvf", str(sub), "-C", "/m/nvbench-untar"]
    assert "linux-source-6.1/fs linux-source-6.1/net" in inv.pre[-1][-1]
    (_, whole), = untar.variants("linux-source", 1.0)
    inv = untar.invocation(whole, Path("/m"), tmp_path, tmp_path)
    assert inv.argv[:2] == ["tar", "-xvf"] and len(inv.pre) == 2       # no subset to make
    assert parse.parse_untar("a/\na/b\n\na/c\n") == {"untar_members": 3.0}


# ----- the matrix: two devices, workload-specific configurations and baselines --------------------
def test_durability_matrix(tmp_path):
    exp = EXPERIMENTS["durability"]
    assert exp.devices == ["hdd-7200", "ssd"]
    st = runner.Settings(out=tmp_path, device=exp.device, dry_run=True)
    specs = runner.matrix(exp, st)
    assert len(specs) == 2 * (6 * 3 + 3 * 3)
    assert [s.device for s in specs[:27]] == ["hdd-7200"] * 27
    assert len({s.reldir() for s in specs}) == len(specs)
    assert specs[0].reldir().parts[:3] == ("runs", "durability", "hdd-7200")
    fsync = {s.fs for s in specs if s.workload == "sqlite"}
    paper = {s.fs for s in specs if s.workload == "untar"}
    assert fsync == {"ext4-ordered", "nvstack-ext4-defaults", "nvstack-ext4-defaults-journal"}
    assert paper == {"ext4-journal", "nvstack-ext4-defaults", "nvstack-ext4-defaults-journal"}
    assert exp.baseline_for("untar", "linux-fs-net") == "ext4-journal"
    assert exp.baseline_for("sqlite", "wal") == "ext4-ordered"
    assert all(s.sync_point for s in specs)
    loops = [s for s in specs if "seconds" in s.params]
    assert loops and all(s.params["seconds"] == 5.0 for s in loops)
    # --seconds on the command line wins over the experiment's own
    st = runner.Settings(out=tmp_path, device="ssd", dry_run=True, overrides={"seconds": 2.0})
    specs = runner.matrix(exp, st)
    assert {s.device for s in specs} == {"ssd"} and not specs[0].device_in_path
    assert all(s.params["seconds"] == 2.0 for s in specs if "seconds" in s.params)


def test_sync_postmark_remounts_nvstack_sync(tmp_path, monkeypatch):
    """Sync-PostMark on nvstack: the FUSE mount is remounted with `sync` (the kernel then
    sends an FSYNC after every WRITE); on ext4 the option is a mount option."""
    caps = nvstack.Capabilities("/bin/true", device=True, mount=True,
                                mount_flags={"tempfiles", "cache", "writeback"},
                                consistency_modes={"undo", "journal", "none"})
    monkeypatch.setattr(nvstack, "_cache", caps)
    exp = EXPERIMENTS["durability"]
    st = runner.Settings(out=tmp_path / "out", device="ssd", workdir=tmp_path / "w",
                         dry_run=True)
    specs = [s for s in runner.matrix(exp, st) if s.config == "sync"]
    for spec in specs:
        r = runner.execute(spec, st, [])
        assert r["status"] == "dry-run", r["reason"]
        repro = (st.out / spec.reldir() / "repro.sh").read_text()
        env = json.loads((st.out / spec.reldir() / "env.json").read_text())
        assert env["run"]["loadavg_start"] is not None
        if spec.fs.startswith("nvstack"):
            assert "mount -i -o remount,sync" in repro
        else:
            assert "data=ordered,sync" in repro and "-o remount" not in repro
        assert "sync-point" in repro


# ----- per-operation metrics ---------------------------------------------------------------------
def test_ops_metrics():
    m = {"transactions": 100.0, "tx_per_second": 50.0, "wall_seconds": 2.1,
         "durable_seconds": 2.5, "dev_requests": 250.0, "dev_flushes": 100.0,
         "nv_fsync.calls": 200.0, "nv_fsync.waited_on_lower": 3.0, "nv_requests.write": 100.0,
         "nv_requests.fsync": 200.0, "cpu_daemon_s": 0.05}
    o = parse.ops_metrics("sqlite", {}, m)
    assert o["ops"] == 100 and o["ops_per_second"] == 50.0 and o["ops_per_durable_second"] == 40
    assert o["dev_requests_per_op"] == 2.5 and o["nv_fsync_waited_on_lower_per_op"] == 0.03
    assert o["nv_requests_per_op"] == 3.0 and o["cpu_daemon_us_per_op"] == pytest.approx(500)
    o = parse.ops_metrics("postmark", {"transactions": 400}, {"wall_seconds": 4.0})
    assert o == {"ops": 400.0, "ops_per_second": 100.0}
    o = parse.ops_metrics("fio", {}, {"write_ios": 1000.0, "read_ios": 0.0, "wall_seconds": 2.0})
    assert o["ops_per_second"] == 500.0
    assert parse.ops_metrics("untar", {}, {"untar_members": 0.0}) == {}
    assert parse.ops_metrics("bonnie", {}, {"wall_seconds": 1.0}) == {}


def test_cpu_delta():
    a = {"host_total_s": 10.0, "host_busy_s": 4.0, "daemon_s": 1.0, "children_s": 2.0}
    b = {"host_total_s": 14.0, "host_busy_s": 7.0, "daemon_s": 1.5, "children_s": 2.25}
    d = runner.cpu_delta(a, b)
    assert d["host_total_s"] == 4.0 and d["host_busy_s"] == 3.0 and d["daemon_s"] == 0.5
    assert d["app_s"] == 0.25
    assert "daemon_s" not in runner.cpu_delta({"children_s": 0}, {"children_s": 1})
    snap = runner.cpu_snapshot(None)
    assert snap["host_total_s"] > 0 and "daemon_s" not in snap


# ----- synthetic results -> tables, goals, figure ------------------------------------------------
def make_run(out: Path, device: str, fs_name: str, workload: str, config: str, variant: str,
             stdout: str, wall: float, dev_requests: int, fsyncs: int = 0, waited: int = 0,
             params: dict | None = None):
    d = out / "runs" / "durability" / device / f"{workload}-{config}" / variant / fs_name / "rep1"
    d.mkdir(parents=True)
    spec = {"experiment": "durability", "workload": workload, "config": config,
            "variant": variant, "fs": fs_name, "rep": 1, "device": device,
            "memory_bytes": 1 << 30, "scale": 1.0, "nvram_bytes": 256 << 20,
            "params": params or {}}
    (d / "spec.json").write_text(json.dumps(spec))
    (d / "env.json").write_text(json.dumps({"run": {"fs": {"label": fs_name}}}))
    (d / "result.json").write_text(json.dumps({
        "status": "ok", "reason": "", "wall_seconds": wall, "sync_seconds": 0.5,
        "sync_point_seconds": 0.01, "cpu": {"host_total_s": 2 * wall, "host_busy_s": wall,
                                            "daemon_s": 0.2, "app_s": 0.3, "cpus": 2}}))
    (d / "stdout.txt").write_text(stdout)
    (d / "device_stat_before.json").write_text(json.dumps({"requests": 0, "flushes": 0}))
    (d / "device_stat_after.json").write_text(json.dumps({"requests": dev_requests,
                                                          "flushes": dev_requests // 2}))
    if fs_name.startswith("nvstack"):
        (d / "nvstack_stat_before.json").write_text(json.dumps(
            {"fsync": {"calls": 0, "waited_on_lower": 0}, "requests": {"write": 0}}))
        (d / "nvstack_stat.json").write_text(json.dumps(
            {"fsync": {"calls": fsyncs, "waited_on_lower": waited},
             "requests": {"write": fsyncs}}))


def loop_out(tps: float, n: int) -> str:
    return json.dumps({"kind": "x", "transactions": n, "seconds": n / tps, "tx_per_second": tps,
                       "latency_us": {"p50": 1.0, "p99": 2.0}}) + "\n"


@pytest.fixture
def durability_dir(tmp_path):
    for dev, ext4, undo, journ in (("hdd-7200", 60.0, 7000.0, 5000.0),
                                   ("ssd", 500.0, 6000.0, 4000.0)):
        for fs_name, tps in (("ext4-ordered", ext4), ("nvstack-ext4-defaults", undo),
                             ("nvstack-ext4-defaults-journal", journ)):
            n = int(tps * 5)
            make_run(tmp_path, dev, fs_name, "sqlite", "wal", "journal=wal", loop_out(tps, n),
                     5.2, n * 5 if fs_name == "ext4-ordered" else 3, fsyncs=n, waited=0)
        for fs_name, wall in (("ext4-journal", 4.0), ("nvstack-ext4-defaults", 3.0),
                              ("nvstack-ext4-defaults-journal", 2.0)):
            make_run(tmp_path, dev, fs_name, "untar", "linux-fs-net", "linux-fs-net",
                     "a\nb\nc\nd\n", wall, 100, fsyncs=0)
    (tmp_path / "experiment.json").write_text(json.dumps(
        {"experiment": "durability", "baseline": "ext4-ordered",
         "fs": EXPERIMENTS["durability"].fs}))
    rec = tmp_path / "runs" / "recovery"
    for name, r in (("hdd-ext4-journal", {"fs": "ext4-journal", "device": "hdd-7200",
                                          "status": "ok", "reason": "", "fill": "data",
                                          "fill_mib": 192, "ext4_replay_seconds": 20.0,
                                          "recovery_seconds": 20.0}),
                    ("hdd-nv", {"fs": "nvstack-ext4-defaults", "device": "hdd-7200",
                                "status": "ok", "reason": "", "fill": "metadata",
                                "fill_ops": 8100, "lower_lost": True,
                                "journal_records_before_cut": 8100,
                                "journal_bytes_before_cut": 8100 * 4096,
                                "recovery_mount_seconds": 6.0, "recovery_seconds": 6.0,
                                "replayed_at_mount": 8100}),
                    ("hdd-nvj", {"fs": "nvstack-ext4-defaults-journal", "device": "hdd-7200",
                                 "status": "failed", "reason": "undo log slot full",
                                 "fill": "metadata", "fill_ops": 8100,
                                 "tree_in_journal": True})):
        (rec / name).mkdir(parents=True)
        (rec / name / "result.json").write_text(json.dumps(r))
    (tmp_path / "powercut.json").write_text(json.dumps({"results": [
        {"fs": "nvstack-ext4-defaults", "app": "maildir", "seed": 1, "status": "ok",
         "reason": "", "acknowledged": 5000, "survived": 5000, "lost": 0, "extra": 1,
         "integrity_ok": True, "e2fsck_exit": 0, "nvstack_check_exit": 0},
        {"fs": "ext4-ordered", "app": "sqlite-delete", "seed": 2, "status": "ok", "reason": "",
         "acknowledged": 100, "survived": 100, "lost": 0, "extra": 0, "integrity_ok": True,
         "e2fsck_exit": 0}]}))
    return tmp_path


def test_durability_tables_goals_and_figure(durability_dir):
    csv = parse.parse_tree(durability_dir)["durability"]
    rows = parse.read_csv(csv)
    assert durability.is_durability(rows)
    # the paired metrics keep the devices apart
    ratio = {(r["device"], r["fs"]): float(r["value"]) for r in rows
             if r["metric"] == "throughput_ratio_vs_lower_fs" and r["workload"] == "sqlite"}
    assert ratio[("hdd-7200", "nvstack-ext4-defaults")] == pytest.approx(7000 / 60)
    assert ratio[("ssd", "nvstack-ext4-defaults")] == pytest.approx(6000 / 500)
    lines = durability.table_rows(rows)
    assert [(ln["device"], ln["key"]) for ln in lines] == [
        ("hdd-7200", "sqlite:wal"), ("hdd-7200", "untar:linux-fs-net"),
        ("ssd", "sqlite:wal"), ("ssd", "untar:linux-fs-net")]
    wal, tar = lines[0], lines[1]
    assert wal["baseline"] == "ext4-ordered" and tar["baseline"] == "ext4-journal"
    assert wal["speedup"]["nvstack-ext4-defaults"] == pytest.approx(7000 / 60)
    # the paper's rows: until durable (wall + sync + sync point)
    assert tar["speedup"]["nvstack-ext4-defaults-journal"] == pytest.approx(4.51 / 2.51)
    assert tar["speedup_wall"]["nvstack-ext4-defaults-journal"] == pytest.approx(2.0)
    assert wal["per_fs"]["nvstack-ext4-defaults"]["nv_fsync_waited_on_lower_per_op"] == 0.0
    gl = durability.goals(lines, durability.load_recovery(durability_dir))
    by = {(g["device"], g["row"][:10], g["fs"]): g for g in gl}
    assert by[("hdd-7200", "sqlite WAL", "nvstack-ext4-defaults")]["met"]          # 117x
    assert not by[("hdd-7200", "sqlite WAL", "nvstack-ext4-defaults-journal")]["met"]   # 83x
    assert not by[("ssd", "sqlite WAL", "nvstack-ext4-defaults-journal")]["met"]   # 8x < 10x
    assert by[("ssd", "sqlite WAL", "nvstack-ext4-defaults")]["met"]               # 12x
    assert by[("hdd-7200", "untar Linu", "nvstack-ext4-defaults-journal")]["met"]  # 1.8x
    assert ("hdd-7200", "untar Linu", "nvstack-ext4-defaults") not in by      # journal mode only
    rec = by[("hdd-7200", "recovery, ", "nvstack-ext4-defaults")]
    assert rec["value"] == pytest.approx(0.3) and rec["met"]
    md = summary.markdown(durability_dir)
    assert "### hdd-7200: operations per second" in md and "### ssd: operations" in md
    assert "### Goals (issue 13):" in md and "**no**" in md
    assert "### Recovery after a crash with a full journal" in md
    assert "failed undo log slot full" in md
    assert "2 cuts, 2 passed, 5,100 acknowledged commits, 0 lost" in md
    # no generic per-metric tables that would mix the two devices
    assert "Ratios to" not in md
    pngs = plot.plot_dir(durability_dir)
    assert [p.name for p in pngs] == ["durability-speedup.png"]
    assert pngs[0].read_bytes()[:8] == PNG_MAGIC
    text = durability.text(rows, durability_dir)
    assert "goals met:" in text and "hdd-7200" in text


def test_ssd_goal_is_ten_x():
    # 4000 / 500 = 8x on ssd: below the 10x goal
    lines = [{"device": "ssd", "group": "fsync", "name": "x",
              "fs": ["ext4-ordered", "nvstack-ext4-defaults-journal"],
              "speedup": {"nvstack-ext4-defaults-journal": 8.0}}]
    g, = durability.goals(lines, [])
    assert g["target"] == 10.0 and not g["met"]


def test_powercut_only_summary(tmp_path):
    results = [{"fs": "nvstack-ext4-defaults-journal", "app": "editor-dirsync", "seed": 3,
                "status": "failed", "reason": "2 acknowledged transactions lost",
                "acknowledged": 10, "survived": 8, "lost": 2, "extra": 0,
                "integrity_ok": True}]
    (tmp_path / "powercut.json").write_text(json.dumps({"results": results}))
    md = summary.markdown(tmp_path)
    assert "1 cuts, 0 passed, 10 acknowledged commits, 2 lost" in md
    assert summary.powercut_text(results) == ("1 power cuts, 0 passed; 10 acknowledged "
                                              "commits, 2 lost")


def test_logdump_blocks():
    text = ("Journal starts at block 21813, transaction 3\n"
            "Found expected sequence 3, type 1 (descriptor block) at block 21813\n"
            "No magic number at block 49367: end of journal.\n")
    assert recovery.logdump_blocks(text) == 49367 - 21813
    assert recovery.logdump_blocks("Journal starts at block 900, transaction 3\n"
                                   "No magic number at block 10: end of journal.\n") is None
    assert recovery.logdump_blocks("") is None


def test_powercut_results_merge():
    from nvbench import powercut
    a = {"fs": "x", "app": "maildir", "seed": 1, "status": "ok", "acknowledged": 5}
    b = {"fs": "x", "app": "maildir", "seed": 2, "status": "ok", "acknowledged": 6}
    doc = powercut.merge({}, [a, b], "first")
    assert doc == {"commands": ["first"], "results": [a, b]}
    a2 = {**a, "acknowledged": 9}
    flushed = {**a, "flush_after_init": True}
    doc = powercut.merge(doc, [a2, flushed], "second")
    assert doc["commands"] == ["first", "second"]
    assert doc["results"] == [b, a2, flushed]           # same cut replaced, variant kept apart
