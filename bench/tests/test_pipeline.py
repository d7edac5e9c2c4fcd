"""Run directories -> CSV -> summary ratios -> PNGs, with real sample outputs as stdout."""

import json
import shutil
from pathlib import Path

import pytest

from nvbench import parse, plot, summary

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def make_run(out: Path, fs: str, rep: int, wall: float, stdout: Path, workload="postmark",
             config="smoke", variant="files=4000", status="ok", reason="", label=None):
    d = out / "runs" / "exp" / f"{workload}-{config}" / variant / fs / f"rep{rep}"
    d.mkdir(parents=True)
    spec = {"experiment": "exp", "workload": workload, "config": config, "variant": variant,
            "fs": fs, "rep": rep, "device": "none", "memory_bytes": 128 << 20, "scale": 1.0}
    (d / "spec.json").write_text(json.dumps(spec))
    (d / "env.json").write_text(json.dumps({"run": {"fs": {"label": label or fs.upper()}}}))
    (d / "result.json").write_text(json.dumps({"status": status, "reason": reason,
                                               "wall_seconds": wall, "sync_seconds": 0.1}))
    if stdout:
        shutil.copy(stdout, d / "stdout.txt")
    (d / "cgroup.json").write_text(json.dumps({"max_usage_in_bytes": 1000, "failcnt": 0}))
    return d


@pytest.fixture
def resultdir(tmp_path, samples):
    pm = samples / "postmark_verbose.txt"
    for rep, (a, b) in enumerate([(10.0, 5.0), (12.0, 7.0)], 1):
        make_run(tmp_path, "ext2", rep, a, pm)
        make_run(tmp_path, "nvstack-ext2-tempffs", rep, b, pm, label="TempFFS")
    make_run(tmp_path, "nvstack-ext2", 1, None, None, status="skipped",
             reason="`nvstack mount --help` failed (exit 2)")
    (tmp_path / "experiment.json").write_text(json.dumps(
        {"experiment": "exp", "baseline": "ext2", "description": "test experiment",
         "notes": ["**NOTE: fell back to a plain loop device**"]}))
    return tmp_path


def test_csv_written(resultdir):
    written = parse.parse_tree(resultdir)
    assert list(written) == ["exp"]
    rows = parse.read_csv(written["exp"])
    assert set(rows[0]) == set(parse.COLUMNS)
    walls = [r for r in rows if r["metric"] == "wall_seconds"]
    assert len(walls) == 4 and all(r["primary"] == "1" for r in walls)
    assert {r["unit"] for r in walls} == {"s"}
    skipped = [r for r in rows if r["status"] == "skipped"]
    assert len(skipped) == 1 and "nvstack mount" in skipped[0]["reason"]
    assert any(r["metric"] == "pm_files_created" for r in rows)
    assert any(r["metric"] == "cgroup_max_usage_in_bytes" for r in rows)


def test_parse_error_becomes_failed_row(tmp_path):
    d = make_run(tmp_path, "ext2", 1, 3.0, None)
    (d / "stdout.txt").write_text("postmark: out of space\n")
    rows = parse.parse_run(d)
    assert rows[0]["status"] == "failed" and "parse error" in rows[0]["reason"]


def test_summary_ratios(resultdir):
    parse.parse_tree(resultdir)
    rows = parse.read_csv(resultdir / "exp.csv")
    (t,) = [t for t in summary.tables(rows, "ext2") if t["metric"] == "wall_seconds"]
    by_fs = {ln["fs"]: ln for ln in t["lines"]}
    assert by_fs["ext2"]["mean"] == 11.0 and by_fs["ext2"]["ratio"] == 1.0
    assert by_fs["nvstack-ext2-tempffs"]["mean"] == 6.0
    assert by_fs["nvstack-ext2-tempffs"]["ratio"] == pytest.approx(6 / 11)
    assert by_fs["nvstack-ext2-tempffs"]["improvement"] == pytest.approx(5 / 11 * 100)
    assert by_fs["ext2"]["std"] == pytest.approx(2 ** 0.5)


def test_improvement_direction():
    assert summary.improvement(5, 10, higher_is_better=False) == 50.0
    assert summary.improvement(15, 10, higher_is_better=True) == 50.0
    assert summary.improvement(1, 0, True) is None


def test_summary_markdown(resultdir):
    parse.parse_tree(resultdir)
    md = summary.write(resultdir).read_text()
    assert "| files=4000 | nvstack-ext2-tempffs | TempFFS | 6 |" in md
    assert "+45.5%" in md
    assert "fell back to a plain loop device" in md
    assert "Skipped and failed runs" in md and "nvstack mount --help" in md


def test_plot_png(resultdir):
    parse.parse_tree(resultdir)
    pngs = plot.plot_dir(resultdir)
    assert pngs, "no figure written"
    for p in pngs:
        assert p.exists() and p.read_bytes()[:8] == PNG_MAGIC and p.stat().st_size > 1000


def test_plot_bonnie_groups_tests(tmp_path, samples):
    for fs in ("ext2", "ext4-journal"):
        make_run(tmp_path, fs, 1, 30.0, samples / "bonnie_2g.csv", workload="bonnie",
                 config="thesis", variant="file=512M")
    parse.parse_tree(tmp_path)
    pngs = plot.plot_dir(tmp_path)
    assert [p.name for p in pngs] == ["exp-bonnie-thesis-bonnie.png"]
    assert pngs[0].read_bytes()[:8] == PNG_MAGIC


def test_plot_never_runs_benchmarks(resultdir, monkeypatch):
    import subprocess
    parse.parse_tree(resultdir)

    def boom(*a, **k):
        raise AssertionError("plot must not run commands")
    monkeypatch.setattr(subprocess, "run", boom)
    monkeypatch.setattr(subprocess, "Popen", boom)
    assert plot.plot_dir(resultdir)
    summary.write(resultdir)


def test_paired_ratio_table():
    from nvbench import summary
    rows = []
    for rep, (b, x) in enumerate([(100.0, 50.0), (200.0, 120.0)], 1):
        for fs, v in (("ext4", b), ("fuse", x)):
            for w in ("a", "b"):
                rows.append({"workload": w, "config": "c", "variant": "default", "fs": fs,
                             "rep": str(rep), "status": "ok", "primary": "1", "metric": "iops",
                             "value": str(v), "unit": "ops/s", "higher_is_better": "1",
                             "fs_label": fs})
    pr = summary.paired_ratios(rows, "ext4")
    assert pr[("a", "c", "default", "fuse")]["ratios"] == [0.5, 0.6]
    table = "\n".join(summary.ratio_table(rows, "ext4", ["ext4", "fuse"]))
    assert "| a c | iops" in table and "0.550 [0.500-0.600]" in table


def test_watch_still_span_becomes_a_metric(tmp_path, samples):
    """result.json's watch (watch.py) reaches the CSV as still_seconds; a run without it
    (recorded before the sampler existed) has no such row."""
    d = make_run(tmp_path, "ext2", 1, 3.0, samples / "postmark_verbose.txt")
    res = json.loads((d / "result.json").read_text())
    res["watch"] = {"samples": 9, "interval_s": 10.0, "longest_still_s": 840.0,
                    "still_waits": {"balance_dirty_pages": 3}}
    (d / "result.json").write_text(json.dumps(res))
    make_run(tmp_path, "ext2", 2, 3.0, samples / "postmark_verbose.txt")
    rows = parse.parse_run(d) + parse.parse_run(d.parent / "rep2")
    still = [r for r in rows if r["metric"] == "still_seconds"]
    assert [(r["rep"], r["value"], r["unit"]) for r in still] == [(1, "840.0", "s")]
