"""TempFFS acceptance (issue 4): the tempffs-postmark matrix, `nvstack stat` tempfiles counters,
block-device counters, the on/off pairing, summary tables and figure. Samples: tests/samples
(README: the tempfiles stat files are hand-written to the CLI contract until TempFFS exists)."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from nvbench import cli, fs, nvstack, parse, plot, runner, summary
from nvbench.experiments import EXPERIMENTS

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
ON, OFF = "nvstack-ext2-tempffs-trans", "nvstack-ext2-trans"
# the hand-written samples' numbers
CREATED, DELETED, TRANSFORMED = 30012, 21009, 9003
SPAN_SUM, SPAN_FILES = 22507, 9003
LOWER_ON, LOWER_OFF = 56123904, 198765432


def load(samples, name):
    return json.loads((samples / name).read_text())


# ----- nvstack stat: the tempfiles object ------------------------------------------------------
def test_tempfiles_counters_are_deltas(samples):
    m = parse.parse_nvstack_stat(load(samples, "nvstack_stat_tempfiles_on.json"),
                                 load(samples, "nvstack_stat_tempfiles_on_before.json"))
    assert m["nv_tempfiles.created"] == CREATED
    assert m["nv_tempfiles.deleted_in_nvram"] == DELETED
    assert m["nv_tempfiles.transformed_total"] == TRANSFORMED
    assert m["nv_tempfiles.transformed.pressure"] == 8990
    assert m["nv_tempfiles.transformed.nvram_full"] == 13
    assert m["nv_tempfiles.transformed.unmount"] == 0
    assert m["nv_tempfiles.bytes_transformed"] == LOWER_ON
    assert m["nv_tempfiles.span_blocks_avg"] == pytest.approx(SPAN_SUM / SPAN_FILES)
    assert m["nv_lower.bytes_written"] == LOWER_ON
    assert m["nv_nvram.frames_total"] == 11893          # the NVRAM budget, in frames
    assert m["nv_tempfiles.max_size"] == 1 << 20          # a setting, not a counter
    assert m["nv_tempfiles.created_in_lower"] == 0
    assert "nv_tempfiles.enabled" not in m                # booleans are not metrics


def test_tempffs_derived_metrics(samples):
    nv = parse.parse_nvstack_stat(load(samples, "nvstack_stat_tempfiles_on.json"),
                                  load(samples, "nvstack_stat_tempfiles_on_before.json"))
    d = parse.tempffs_metrics(nv)
    assert d["tempffs_deleted_in_nvram_pct"] == pytest.approx(100 * DELETED / CREATED)
    assert d["tempffs_deleted_in_nvram_pct"] == pytest.approx(70.0020, abs=1e-3)
    assert d["tempffs_transformed_pct"] == pytest.approx(100 * TRANSFORMED / CREATED)
    assert d["tempffs_span_blocks_avg_all_files"] == pytest.approx(SPAN_SUM / CREATED)


def test_span_average_recomputed_from_deltas():
    before = {"tempfiles": {"created": 10, "span_files": 10, "span_blocks_sum": 100,
                            "span_blocks_avg": 10.0, "pages_resident": 7, "files_resident": 3,
                            "record_frames": 2, "record_frames_freed": 1},
              "cache": {"files": 4, "record_frames": 1}}
    after = {"tempfiles": {"created": 40, "span_files": 30, "span_blocks_sum": 160,
                           "span_blocks_avg": 160 / 30, "pages_resident": 5, "files_resident": 2,
                           "record_frames": 1, "record_frames_freed": 3,
                           "transformed": {"flush": 4}},
             "cache": {"files": 9, "record_frames": 2}}
    m = parse.parse_nvstack_stat(after, before)
    assert m["nv_tempfiles.created"] == 30 and m["nv_tempfiles.span_files"] == 20
    assert m["nv_tempfiles.span_blocks_avg"] == 3.0               # 60 blocks / 20 files
    assert m["nv_tempfiles.pages_resident"] == 5 and m["nv_tempfiles.files_resident"] == 2
    # the frames records take are gauges (as read after), the frames freed a counter (delta)
    assert m["nv_tempfiles.record_frames"] == 1 and m["nv_cache.record_frames"] == 2
    assert m["nv_tempfiles.record_frames_freed"] == 2 and m["nv_cache.files"] == 9
    assert m["nv_tempfiles.transformed.flush"] == 4
    before["tempfiles"].update(span_files=30, span_blocks_sum=160)
    assert parse.parse_nvstack_stat(after, before)["nv_tempfiles.span_blocks_avg"] == 0.0


def test_no_tempffs_metrics_without_temp_files(samples):
    off = parse.parse_nvstack_stat(load(samples, "nvstack_stat_tempfiles_off.json"),
                                   load(samples, "nvstack_stat_tempfiles_off_before.json"))
    assert off["nv_tempfiles.created"] == 0 and off["nv_lower.bytes_written"] == LOWER_OFF
    assert parse.tempffs_metrics(off) == {}
    real = parse.parse_nvstack_stat(load(samples, "nvstack_stat_none.json"),
                                    load(samples, "nvstack_stat_none_before.json"))
    assert not any(k.startswith("nv_tempfiles.") for k in real)   # binary without TempFFS
    assert real["nv_lower.bytes_written"] == 293083759
    assert parse.tempffs_metrics(real) == {}


# ----- /sys/block/<dev>/stat ----------------------------------------------------------------------
def test_block_stat_sample(samples):
    before = (samples / "blockdev_stat_before.txt").read_text()
    after = (samples / "blockdev_stat_after.txt").read_text()
    m = parse.parse_block_stat(before, after)
    b, a = [list(map(int, t.split())) for t in (before, after)]
    assert m["blk_write_bytes"] == (a[6] - b[6]) * 512 >= 1 << 20     # dd wrote 1 MiB
    assert m["blk_write_ios"] == a[4] - b[4] and m["blk_read_ios"] == a[0] - b[0]
    assert m["blk_read_bytes"] == (a[2] - b[2]) * 512
    assert m["blk_io_ticks_ms"] == a[9] - b[9] and "blk_flush_ios" in m
    assert parse.parse_block_stat(None, after)["blk_write_bytes"] == a[6] * 512
    with pytest.raises(ValueError):
        parse.parse_block_stat(None, "no such device\n")


# ----- the experiment ------------------------------------------------------------------------------
def test_tempffs_postmark_matrix(tmp_path, no_nvstack):
    exp = EXPERIMENTS["tempffs-postmark"]
    assert exp.fs == ["ext2", OFF, ON] and exp.baseline == "ext2" and exp.device == "none"
    assert fs.CONFIGS[OFF].nvstack == {**fs.CONFIGS[ON].nvstack, "tempfiles": "off"}
    assert fs.CONFIGS[ON].nvstack["consistency"] == "undo"
    assert fs.tempfiles_pairs(exp.fs) == {ON: OFF}
    assert fs.lower_kernel_config(ON, exp.fs) == "ext2"
    assert fs.lower_kernel_config("ext2", exp.fs) is None
    st = runner.Settings(out=tmp_path / "o", device="none", workdir=tmp_path / "w", dry_run=True)
    specs = runner.matrix(exp, st)
    assert len(specs) == 3 * 4 * 3
    assert specs[0].memory_bytes == 256 << 20 and specs[0].nvram_bytes == 64 << 20
    assert [s.params["files"] for s in specs[:12:3]] == [1250, 2500, 5000, 7500]
    assert {s.params["transactions"] for s in specs} == {50_000}
    assert all(s.params["size_min"] == 512 and s.params["size_max"] == 10240 for s in specs)
    assert any("NVRAM region of 64 MiB" in n for n in exp.notes)


def test_transactions_override_and_repro(tmp_path, monkeypatch):
    caps = nvstack.Capabilities("/opt/nvstack", device=False, mount=True,
                                mount_flags={"tempfiles", "writeback", "consistency", "nvram"},
                                consistency_modes={"undo", "none"})
    monkeypatch.setattr(nvstack, "_cache", caps)
    out = tmp_path / "tp"
    rc = cli.main(["run", "tempffs-postmark", "--dry-run", "--reps", "1", "--transactions",
                   "12345", "--out", str(out), "--workdir", str(tmp_path / "w"), "--no-plot"])
    assert rc == 0
    meta = json.loads((out / "experiment.json").read_text())
    assert meta["runs"] == 12 and meta["nvram_bytes"] == 64 << 20
    assert meta["overrides"] == {"transactions": 12345} and meta["device"] == "none"
    d = out / "runs/tempffs-postmark/postmark-tempffs/files=5000" / ON / "rep1"
    cfg = (d / "postmark.cfg").read_text()
    assert "set transactions 12345" in cfg and "set number 5000" in cfg
    assert "--transactions" in cfg
    spec = json.loads((d / "spec.json").read_text())
    assert spec["params"]["transactions_scaled"] == 50_000
    assert spec["params"]["overridden"] == ["transactions"]
    env = json.loads((d / "env.json").read_text())
    assert env["run"]["nvram_bytes"] == 64 << 20 and env["run"]["memory_budget_bytes"] == 256 << 20
    text = (d / "repro.sh").read_text()
    assert "--nvram /dev/shm/nvbench-" in text and "--size 64M --consistency undo" in text
    assert "--tempfiles on" in text
    assert 'cat /sys/block/$(basename "${LOOP1}")/stat >"${RUN}/blockdev_stat_before.txt"' in text
    assert text.index("blockdev_stat_before") < text.index("time -p") < \
        text.index("blockdev_stat_after")
    assert subprocess.run(["bash", "-n", str(d / "repro.sh")]).returncode == 0
    off = (out / "runs/tempffs-postmark/postmark-tempffs/files=5000" / OFF / "rep1" /
           "repro.sh").read_text()
    assert "--consistency undo --tempfiles off" in off
    # an override no workload of the experiment has is an error
    assert cli.main(["run", "thesis-bonnie", "--dry-run", "--transactions", "5", "--out",
                     str(tmp_path / "b")]) == 2


# ----- run directories -> CSV -> summary, figure ----------------------------------------------------
def make_run(out, samples, fs_name, rep, variant, wall, stat=None, blk_written=None):
    d = out / "runs" / "tempffs-postmark" / "postmark-tempffs" / variant / fs_name / f"rep{rep}"
    d.mkdir(parents=True)
    nvram = (64 << 20) if fs.CONFIGS[fs_name].nvstack else None
    spec = {"experiment": "tempffs-postmark", "workload": "postmark", "config": "tempffs",
            "variant": variant, "fs": fs_name, "rep": rep, "device": "none",
            "memory_bytes": 256 << 20, "nvram_bytes": 64 << 20, "scale": 0.25,
            "params": {"transactions": 50_000, "files": int(variant.split("=")[1])}}
    (d / "spec.json").write_text(json.dumps(spec))
    (d / "env.json").write_text(json.dumps({"run": {"fs": {"label": fs.CONFIGS[fs_name].label},
                                                    "nvram_bytes": nvram}}))
    (d / "result.json").write_text(json.dumps({"status": "ok", "reason": "",
                                               "wall_seconds": wall, "sync_seconds": 0.1}))
    shutil.copy(samples / "postmark_verbose.txt", d / "stdout.txt")
    if stat:
        shutil.copy(samples / f"{stat}_before.json", d / "nvstack_stat_before.json")
        shutil.copy(samples / f"{stat}.json", d / "nvstack_stat.json")
    zero = " ".join(["0"] * 17)
    (d / "blockdev_stat_before.txt").write_text(zero + "\n")
    (d / "blockdev_stat_after.txt").write_text(
        f"10 0 80 1 20 0 {blk_written // 512} 5 0 30 6 0 0 0 0 2 1\n")
    return d


@pytest.fixture
def tempffs_results(tmp_path, samples):
    # wall seconds per (variant, rep): ext2, off, on
    walls = {("files=1250", 1): (1.5, 30.0, 15.0), ("files=1250", 2): (1.7, 32.0, 20.0),
             ("files=7500", 1): (2.0, 40.0, 25.0), ("files=7500", 2): (2.2, 44.0, 22.0)}
    for (variant, rep), (w_ext2, w_off, w_on) in walls.items():
        make_run(tmp_path, samples, "ext2", rep, variant, w_ext2, blk_written=4 << 20)
        make_run(tmp_path, samples, OFF, rep, variant, w_off, "nvstack_stat_tempfiles_off",
                 blk_written=8 << 20)
        make_run(tmp_path, samples, ON, rep, variant, w_on, "nvstack_stat_tempfiles_on",
                 blk_written=2 << 20)
    (tmp_path / "experiment.json").write_text(json.dumps(
        {"experiment": "tempffs-postmark", "baseline": "ext2", "fs": ["ext2", OFF, ON],
         "description": "TempFFS acceptance", "notes": ["plain loop device"]}))
    return tmp_path, walls


def values(rows, fs_name, metric, variant="files=1250"):
    return [float(r["value"]) for r in rows
            if r["fs"] == fs_name and r["metric"] == metric and r["variant"] == variant]


def test_csv_paired_and_derived_metrics(tempffs_results):
    out, walls = tempffs_results
    rows = parse.read_csv(parse.parse_tree(out)["tempffs-postmark"])
    assert values(rows, ON, "tempffs_throughput_ratio_on_off") == [30 / 15, 32 / 20]
    assert values(rows, ON, "throughput_ratio_vs_lower_fs") == [1.5 / 15, 1.7 / 20]
    assert values(rows, OFF, "throughput_ratio_vs_lower_fs") == [1.5 / 30, 1.7 / 32]
    assert values(rows, OFF, "tempffs_throughput_ratio_on_off") == []
    assert values(rows, "ext2", "throughput_ratio_vs_lower_fs") == []
    assert values(rows, ON, "tempffs_lower_bytes_eliminated_pct") == \
        [pytest.approx(100 * (1 - LOWER_ON / LOWER_OFF))] * 2
    assert values(rows, ON, "tempffs_blk_bytes_eliminated_pct") == [75.0, 75.0]   # 2 vs 8 MiB
    assert values(rows, ON, "tempffs_deleted_in_nvram_pct") == \
        [pytest.approx(100 * DELETED / CREATED)] * 2
    assert values(rows, ON, "pm_tx_per_wall_second") == [50_000 / 15, 50_000 / 20]
    assert values(rows, ON, "blk_write_bytes") == [2 << 20] * 2
    assert values(rows, OFF, "nv_lower.bytes_written") == [LOWER_OFF] * 2
    budget = {(r["fs"], r["nvram_bytes"]) for r in rows}
    assert budget == {("ext2", ""), (OFF, str(64 << 20)), (ON, str(64 << 20))}
    r = next(r for r in rows if r["metric"] == "tempffs_deleted_in_nvram_pct")
    assert r["unit"] == "%" and r["higher_is_better"] == "1" and r["primary"] == "0"


def test_summary_tempffs_tables(tempffs_results):
    out, _ = tempffs_results
    parse.parse_tree(out)
    md = summary.write(out).read_text()
    assert "NVRAM region = 64 MiB per nvstack run (inside M)" in md
    assert "### TempFFS: throughput and bytes written to the lower FS" in md
    assert "### TempFFS: temp files of the tempfiles-on runs" in md
    lines = [l for l in md.splitlines() if l.startswith("| postmark tempffs files=1250 |")]
    on = next(l for l in lines if f"| {ON} | on |" in l)
    cells = [c.strip() for c in on.split("|")]
    assert "M 256, NVRAM 64 MiB" in cells
    assert "1.800 ± 0.283" in cells                   # throughput on/off: mean of 2.0 and 1.6
    assert f"{100 * (1 - LOWER_ON / LOWER_OFF):.1f} ± 0.0" in cells
    assert "75.0 ± 0.0" in cells                      # loop device bytes eliminated
    ext2 = next(l for l in lines if "| ext2 | - |" in l)
    assert "M 256 MiB" in ext2 and "1 (itself)" in ext2
    tf = next(l for l in lines if f"| {ON} | M 256, NVRAM 64 MiB | 11893 |" in l)
    assert "| 30012 | 21009 | 70.0 ± 0.0 |" in tf
    assert "9003 (pressure 8990, nvram_full 13)" in tf
    assert "2.50 ± 0.00 (9003 files)" in tf
    assert f"{SPAN_SUM / CREATED:.2f}" in tf
    assert "at least 44 %" in md                      # the thesis numbers are stated


def test_tempffs_figure(tempffs_results):
    out, _ = tempffs_results
    parse.parse_tree(out)
    pngs = plot.plot_dir(out)
    names = [p.name for p in pngs]
    assert "tempffs-postmark-tempffs.png" in names
    p = out / "tempffs-postmark-tempffs.png"
    assert p.read_bytes()[:8] == PNG_MAGIC and p.stat().st_size > 10_000
    assert "tempffs-postmark-tempffs.png" in summary.write(out).read_text()


def test_no_tempffs_tables_without_a_pair(tmp_path, samples):
    make_run(tmp_path, samples, "ext2", 1, "files=1250", 1.0, blk_written=1 << 20)
    make_run(tmp_path, samples, OFF, 1, "files=1250", 9.0, "nvstack_stat_none",
             blk_written=1 << 20)
    parse.parse_tree(tmp_path)
    md = summary.write(tmp_path).read_text()
    assert "TempFFS:" not in md
    assert "tempffs-postmark-tempffs.png" not in [p.name for p in plot.plot_dir(tmp_path)]
