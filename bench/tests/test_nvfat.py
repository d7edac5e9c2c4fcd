"""The NVFAT experiment (issue 15): configurations and the device's NVRAM options in the run
script, the FAT write-back step, the tables, goals and Figures 4-8 from synthetic run
directories. No root, no mounts."""

import json

import pytest

from nvbench import fs as fs_mod
from nvbench import nvfat, parse, plot, runner, summary
from nvbench.experiments import EXPERIMENTS

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

pytestmark = pytest.mark.usefixtures("no_nvstack")


def test_nvfat_configurations_carry_the_cache_size():
    exp = EXPERIMENTS["nvfat"]
    assert exp.fs[0] == "vfat" and exp.baseline == "vfat" and exp.device == "flash"
    assert [fs_mod.CONFIGS[f].nvram_cache for f in exp.fs[1:]] == \
        [f"{k}K" for k in (1, 2, 4, 8, 16, 32, 64, 128)]
    assert all(fs_mod.CONFIGS[f].mkfs == "vfat" for f in exp.fs)
    assert [nvfat.cache_kib(f) for f in ("vfat", "nvfat-1k", "nvfat-128k")] == [0, 1, 128]


def test_the_run_script_attaches_the_nvram_cache_and_flushes_fat(tmp_path, monkeypatch):
    from nvbench import nvstack
    monkeypatch.setattr(nvstack, "_cache", nvstack.Capabilities("/opt/nvstack", device=True))
    exp = EXPERIMENTS["nvfat"]
    import dataclasses
    exp = dataclasses.replace(exp, fs=["vfat", "nvfat-128k"], workloads=[("postmark", "nvfat-sync")])
    st = runner.Settings(out=tmp_path / "out", device="flash", timing="sleep", memory=None,
                         scale=1.0, reps=1, workdir=tmp_path / "work", dry_run=True, echo=False)
    results = runner.run_experiment(exp, st, None)
    assert len(results) == 2
    scripts = {r["spec"]["fs"]: (tmp_path / "out" / runner.RunSpec(**r["spec"]).reldir()
                                 / "repro.sh").read_text() for r in results}
    attach = [ln for ln in scripts["nvfat-128k"].splitlines() if " device attach " in ln][0]
    assert "--model flash" in attach and "--mkfs vfat" in attach
    assert "--mount-options sync" in attach
    assert "--nvram /dev/shm/" in attach and "--nvram-cache-size 128K" in attach
    assert "--nvram" not in [ln for ln in scripts["vfat"].splitlines()
                             if " device attach " in ln][0]
    # What a user-space FAT server still holds is written back (fsync of its root: `sync
    # MNT`) and timed after the sync; the NVRAM cache is not drained (no `device flush`).
    for text in scripts.values():
        assert "time -p sync /" in text and " device flush " not in text


def _run(root, config, fs, wall, flush, busy_ms, erases, energy_uj, mean, std, absorbed=0):
    d = root / "runs" / "nvfat" / f"postmark-{config}" / "files=1000" / fs / "rep1"
    d.mkdir(parents=True)
    spec = {"experiment": "nvfat", "workload": "postmark", "config": config, "variant":
            "files=1000", "fs": fs, "rep": 1, "device": "flash", "memory_bytes": 1 << 26,
            "nvram_bytes": 1 << 25, "scale": 1.0, "params": {"transactions": 10000}}
    (d / "spec.json").write_text(json.dumps(spec))
    (d / "result.json").write_text(json.dumps({"status": "ok", "wall_seconds": wall,
                                               "sync_seconds": 0.01, "flush_seconds": flush,
                                               "exit_code": 0, "spec": spec}))
    (d / "stdout.txt").write_text(f"{int(wall)} seconds total\n")

    def hist(n):
        return {"item": "logical block", "items": 16, "per_bucket": 4, "sum": [n, 0, n, 1],
                "max": [1, 0, 1, 1]}
    before = {"busy_ms": 1.0, "requests": 10, "flash": {
        "block_erases": 0, "energy_uj": 1000.0, "erase_count_mean": 0.0,
        "erase_count_stddev": 0.0, "erase_count_max": 0, "lbn_writes": hist(1),
        "page_writes": hist(1)}}
    after = {"busy_ms": 1.0 + busy_ms, "requests": 1000, "flash": {
        "block_erases": erases, "energy_uj": 1000.0 + energy_uj, "erase_count_mean": mean,
        "erase_count_stddev": std, "erase_count_max": int(mean * 3), "lbn_writes": hist(50),
        "page_writes": hist(70), "merges_full": erases // 2, "merges_switch": 1,
        "merges_partial": 2, "host_page_programs": 5000}}
    if absorbed:
        after["nvcache"] = {"writes_absorbed": absorbed, "destaged": 3}
        before["nvcache"] = {"writes_absorbed": 0, "destaged": 0}
    (d / "device_stat_before.json").write_text(json.dumps(before))
    (d / "device_stat_after.json").write_text(json.dumps(after))


def test_tables_goals_and_figures(tmp_path):
    out = tmp_path / "out"
    _run(out, "nvfat-sync", "vfat", 300.0, 0.1, 280_000, 35000, 9.0e6, 16.0, 9.0)
    _run(out, "nvfat-sync", "nvfat-64k", 150.0, 0.1, 130_000, 17000, 4.0e6, 8.0, 5.0, 1000)
    _run(out, "nvfat-sync", "nvfat-128k", 20.0, 0.1, 15_000, 2000, 0.5e6, 1.0, 0.5, 2000)
    _run(out, "nvfat-async", "vfat", 80.0, 2.0, 70_000, 8000, 2.0e6, 4.0, 2.0)
    _run(out, "nvfat-async", "nvfat-128k", 70.0, 1.0, 60_000, 7000, 1.8e6, 3.5, 1.9, 500)
    parse.parse_tree(out)
    rows = parse.read_csv(out / "nvfat.csv")
    assert nvfat.is_nvfat(rows)
    ls = {(ln["config"], ln["fs"]): ln for ln in nvfat.lines(rows, out)}
    sync128 = ls[("nvfat-sync", "nvfat-128k")]
    assert sync128["kib"] == 128 and sync128["time"] == 20.0
    assert sync128["durable"] == pytest.approx(20.11)   # wall + sync + the FAT write-back
    assert sync128["erases"] == 2000 and sync128["energy"] == pytest.approx(0.5)
    assert (sync128["erase_mean"], sync128["erase_stddev"]) == (1.0, 0.5)
    assert sync128["absorbed"] == 2000
    g = {(x["config"], x["quantity"]): x for x in nvfat.goals(list(ls.values()))}
    assert g[("nvfat-sync", "time")]["ratio"] == pytest.approx(15.0)
    assert g[("nvfat-sync", "time")]["met"]
    assert g[("nvfat-async", "time")]["ratio"] == pytest.approx(80 / 70)
    assert not g[("nvfat-async", "time")]["met"]
    assert g[("nvfat-sync", "erase_mean")]["ratio"] == pytest.approx(16.0)
    assert g[("nvfat-sync", "erase_stddev")]["ratio"] == pytest.approx(18.0)
    assert g[("nvfat-sync", "energy")]["ratio"] == pytest.approx(18.0)
    h = nvfat.histograms(rows, out, "nvfat-sync", "lbn_writes")
    assert h["vfat"]["sum"] == [49, 0, 49, 0]                # after minus before
    md = "\n".join(nvfat.markdown(rows, out))
    assert "| nvfat-128k | 128 KiB | 20.0 | 15.00x |" in md
    assert "Goals (issue 15" in md
    pngs = plot.plot_experiment(out / "nvfat.csv", out)
    names = sorted(p.name for p in pngs)
    assert names == ["nvfat-fig4-time.png", "nvfat-fig5-lbn-writes.png",
                     "nvfat-fig6-page-writes.png", "nvfat-fig7-8-erases-energy.png"]
    assert all(p.read_bytes().startswith(PNG_MAGIC) for p in pngs)
    text = summary.markdown(out)
    assert "Sync-PostMark (-o sync)" in text
