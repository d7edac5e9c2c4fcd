"""Write-back policies (issue 5): the meaning of the Table 4.2 configurations now that the NVRAM
page cache exists (flags per configuration and binary), the writeback-policies matrix and its
repro.sh, `nvstack stat` cache/writeback counters, the pairing with WB file, summary tables and
figure. Samples: tests/samples (README: the wb stat files are hand-written to the binary's
Stats struct until a real run replaces them)."""

import json
import shutil
import stat
import subprocess

import pytest

from nvbench import cli, fs, nvstack, parse, plot, runner, summary
from nvbench.experiments import EXPERIMENTS
from nvbench.shell import Shell
from nvbench.workloads import fio, postmark

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
EXP = "writeback-policies"
WB = [f"nvstack-ext2-wb-{p}" for p in ("file", "recency", "location", "relo")]
OFF = "nvstack-ext2-trans"
# `nvstack mount --help` of the binary with the page cache (long options), and of one without
NEW_FLAGS = {"nvram", "size", "undo-slots", "undo-slot-size", "consistency", "foreground",
             "threads", "attr-timeout", "entry-timeout", "max-write", "tempfiles",
             "tempfile-max-size", "tempfile-share", "tempfile-writeback-batch", "xattrs",
             "keep-tempfiles", "cache", "writeback", "zone-blocks", "dirty-high", "dirty-low",
             "writeback-batch", "max-dirty-age", "keep-dirty", "passthrough"}
OLD_FLAGS = {"nvram", "size", "consistency", "foreground", "threads", "attr-timeout",
             "entry-timeout", "max-write"}


def caps(flags, device=True):
    return nvstack.Capabilities("/opt/nvstack", device=device, mount=True, mount_flags=set(flags),
                                consistency_modes={"undo", "none"})


def mount_line(tmp_path, name, c):
    """The `nvstack mount` line setup() runs for configuration `name` (dry run)."""
    sh = Shell(dry_run=True)
    t = fs.Target(sh, fs.CONFIGS[name], "none", fs.Layout(tmp_path / name, "t"), 1 << 30,
                  16 << 20, 32 << 20, caps=c)
    t.setup()
    line = next(l for l in sh.setup if "/opt/nvstack mount " in l)
    return line[line.index(" --consistency"):line.index(" >")]


@pytest.fixture(autouse=True)
def reset_caps():
    yield
    nvstack._cache = None


# ----- Table 4.2 with the page cache ---------------------------------------------------------------
def test_flags_per_configuration_and_binary(tmp_path):
    new, old = caps(NEW_FLAGS), caps(OLD_FLAGS)
    for policy in ("file", "recency", "location", "relo"):
        assert mount_line(tmp_path / "n", f"nvstack-ext2-wb-{policy}", new) == (
            f" --consistency undo --tempfiles off --cache on --passthrough off --writeback {policy} "
            f"--max-dirty-age 0 --foreground")
    # without WB: the NVRAM page cache off (Linux's write-back of ext2), if the binary has it
    assert mount_line(tmp_path / "n", OFF, new) == \
        " --consistency undo --tempfiles off --cache off --passthrough off --foreground"
    assert mount_line(tmp_path / "o", OFF, old) == " --consistency undo --foreground"
    assert mount_line(tmp_path / "n", "nvstack-ext2", new) == \
        " --consistency none --tempfiles off --cache off --passthrough off --foreground"
    # Table 4.2's WB: the cache on with relo; TempFFS alone: cache off
    assert mount_line(tmp_path / "n", "nvstack-ext2-wb-trans", new) == \
        " --consistency undo --tempfiles off --cache on --passthrough off --writeback relo --foreground"
    assert mount_line(tmp_path / "n", "nvstack-ext4-tempffs", new) == \
        " --consistency none --tempfiles on --cache off --passthrough off --foreground"
    # fuse-tax: a pass-through (both mechanisms off), knobs after the flags
    assert mount_line(tmp_path / "n", "nvstack-none", new) == \
        " --consistency none --tempfiles off --cache off --passthrough off --foreground"
    assert mount_line(tmp_path / "n", "nvstack-none-t1", new) == \
        " --consistency none --tempfiles off --cache off --passthrough off --threads 1 --foreground"
    assert mount_line(tmp_path / "o", "nvstack-none-t1", old) == \
        " --consistency none --threads 1 --foreground"
    assert "pass-through" in fs.CONFIGS["nvstack-none"].description
    assert "--tempfiles off --cache off" in fs.CONFIGS["nvstack-none"].description


def test_needs_and_skips():
    new, old = caps(NEW_FLAGS), caps(OLD_FLAGS)
    for name in WB + [OFF, "nvstack-ext2", "nvstack-none", "nvstack-ext2-wb"]:
        assert all(new.missing(n) is None for n in fs.CONFIGS[name].needs), name
    # a feature that is off needs no flag on an old binary; the cache on does
    for name in (OFF, "nvstack-ext2", "nvstack-none", "nvstack-none-t2"):
        assert all(old.missing(n) is None for n in fs.CONFIGS[name].needs), name
    for name in WB + ["nvstack-ext2-wb-trans"]:
        why = [old.missing(n) for n in fs.CONFIGS[name].needs]
        assert any(w and "--cache" in w for w in why), name
    assert "mount-flag:max-dirty-age" in fs.CONFIGS["nvstack-ext2-wb-relo"].needs
    assert "mount-flag:writeback" not in fs.CONFIGS[OFF].needs   # no policy with the cache off
    labels = [fs.CONFIGS[n].label for n in WB]
    assert labels == ["WB file", "WB recency", "WB location", "WB relo"]
    assert all(fs.CONFIGS[n].cache_on and fs.CONFIGS[n].consistent for n in WB)
    assert not fs.CONFIGS[OFF].cache_on and not fs.CONFIGS["ext2"].cache_on


def test_probe_reads_the_cache_flags(tmp_path, monkeypatch):
    """`nvstack mount --help` as the binary prints it -> mount_flags with the new flags."""
    fake = tmp_path / "nvstack"
    fake.write_text("#!/bin/sh\n"
                    "if [ \"$1 $2\" = \"mount --help\" ]; then cat <<'EOF'\n"
                    "      --consistency <CONSISTENCY>\n"
                    "          How operations are made crash-consistent\n\n"
                    "          Possible values:\n"
                    "          - undo: Every completed operation is atomic\n"
                    "          - none: No undo log\n\n"
                    "      --tempfiles <on|off>\n"
                    "      --cache <on|off>\n"
                    "      --writeback <WRITEBACK>\n"
                    "      --max-dirty-age <SECONDS>\n"
                    "EOF\nfi\nexit 0\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("NVSTACK_BIN", str(fake))
    c = nvstack.probe(refresh=True)
    assert {"cache", "writeback", "max-dirty-age", "tempfiles"} <= c.mount_flags
    assert c.consistency_modes == {"undo", "none"}
    assert all(c.missing(n) is None for n in fs.CONFIGS["nvstack-ext2-wb-relo"].needs)


def test_writeback_file_twins():
    names = EXPERIMENTS[EXP].fs
    twins = fs.writeback_file_twins(names)
    assert twins == {n: "nvstack-ext2-wb-file" for n in names if n != "nvstack-ext2-wb-file"}
    assert fs.writeback_file_twins(["ext2", OFF]) == {}
    assert fs.writeback_file_twins(["ext4-ordered", "nvstack-ext2-wb-file"]) == {}


# ----- the experiment --------------------------------------------------------------------------
def test_writeback_policies_matrix(tmp_path, monkeypatch):
    monkeypatch.setattr(nvstack, "_cache", caps(NEW_FLAGS))
    exp = EXPERIMENTS[EXP]
    assert exp.fs == ["ext2", OFF] + WB and exp.baseline == "nvstack-ext2-wb-file"
    assert exp.workloads == [("postmark", "writeback"), ("fio", "wb-zipf-rewrite")]
    assert (exp.reps, exp.memory, exp.nvram, exp.device, exp.disk) == (3, "64M", "32M",
                                                                      "hdd-7200", "2G")
    st = runner.Settings(out=tmp_path / "o", device="hdd-7200", workdir=tmp_path / "w",
                         dry_run=True)
    specs = runner.matrix(exp, st)
    assert len(specs) == 6 * (3 + 1) * 3
    assert specs[0].memory_bytes == 64 << 20 and specs[0].nvram_bytes == 32 << 20
    pm = [s for s in specs if s.workload == "postmark" and s.rep == 1 and s.fs == "ext2"]
    assert [s.params["files"] for s in pm] == [2500, 5000, 7500]
    assert {s.params["transactions"] for s in specs if s.workload == "postmark"} == {20_000}
    assert all(s.params["size_min"] == 512 and s.params["size_max"] == 10240
               and s.params["subdirectories"] == 0 for s in pm)
    # interleaved: every configuration for one variant, then the next
    assert [s.fs for s in specs[:6]] == exp.fs
    assert any("NVRAM region of 32 MiB" in n for n in exp.notes)
    assert any("Bonnie++" in n for n in exp.notes)
    assert "estimated" in exp.estimate


def test_fio_zipf_rewrite_job(tmp_path):
    (variant, p), = fio.variants("wb-zipf-rewrite", 1.0)
    job = fio.job_file(p, tmp_path / "mnt" / "nvbench-fio")
    for line in ("rw=randwrite", "bs=4k", f"size={512 << 20}", f"io_size={400 << 20}",
                 "random_distribution=zipf:1.1", "end_fsync=1", "fallocate=none",
                 "ioengine=psync", "direct=0", "filename=wb.dat", "randrepeat=1"):
        assert line in job.splitlines(), line
    assert fio.primary("wb-zipf-rewrite") == ("wall_seconds", "s", False)
    inv = fio.invocation(p, tmp_path / "mnt", tmp_path / "run")
    assert inv.pre == [["mkdir", "-p", str(tmp_path / "mnt" / "nvbench-fio")]]  # no prefill here
    lower = inv.pre_lower(tmp_path / "lower" / "data")
    assert lower[0] == ["mkdir", "-p", str(tmp_path / "lower/data/nvbench-fio")]
    assert lower[1][:2] == ["fio", "--name=prefill"]
    assert f"--directory={tmp_path / 'lower/data/nvbench-fio'}" in lower[1]
    assert f"--size={512 << 20}" in lower[1] and "--filename=wb.dat" in lower[1]
    assert "--fallocate=none" in lower[1] and "--end_fsync=1" in lower[1]
    # the fuse-tax prefill is unchanged: through the mount, no fallocate option
    (_, t), = fio.variants("tax-rand-write", 1.0)
    tinv = fio.invocation(t, tmp_path / "mnt", tmp_path / "run")
    assert tinv.pre_lower is None and not any("--fallocate" in a for a in tinv.pre[1])
    (_, pmp), = postmark.variants("writeback", 1.0)[:1]
    assert pmp["files"] == 2500 and pmp["transactions"] == 20_000


def test_dry_run_repro(tmp_path, monkeypatch):
    monkeypatch.setattr(nvstack, "_cache", caps(NEW_FLAGS))
    out = tmp_path / "wbp"
    rc = cli.main(["run", EXP, "--dry-run", "--reps", "1", "--out", str(out), "--workdir",
                   str(tmp_path / "w"), "--no-plot"])
    assert rc == 0
    meta = json.loads((out / "experiment.json").read_text())
    assert meta["runs"] == 24 and meta["device"] == "hdd-7200"
    assert meta["nvram_bytes"] == 32 << 20 and meta["memory_bytes"] == 64 << 20
    runs = out / "runs" / EXP
    d = runs / "fio-wb-zipf-rewrite" / "default" / "nvstack-ext2-wb-relo" / "rep1"
    text = (d / "repro.sh").read_text()
    assert subprocess.run(["bash", "-n", str(d / "repro.sh")]).returncode == 0
    attach = text.index("device attach")
    prefill = text.index("fio --name=prefill --directory=")
    mount = text.index("/opt/nvstack mount ")
    assert attach < prefill < mount < text.index("drop_caches") < text.index("time -p")
    assert "--model hdd-7200 --timing sleep --size 2G --mkfs ext2" in text
    assert "/lower/data/nvbench-fio --filename=wb.dat" in text[prefill:mount]
    assert "--size 32M --consistency undo --tempfiles off --cache on --passthrough off --writeback relo " \
           "--max-dirty-age 0 --foreground" in text
    assert "echo 67108864 > " in text                              # M = 64 MiB
    job = (d / "job.fio").read_text()
    assert "random_distribution=zipf:1.1" in job and "/mnt/nvbench-fio" in job
    cmd = (d / "cmd.txt").read_text()
    assert cmd.rstrip().endswith('sh fio --output-format=json "${RUN}/job.fio"')
    assert "cgroup.procs" in cmd                                   # in the run's cgroup
    # ext2 alone: the file is laid out on the kernel FS itself, no nvstack
    e = (runs / "fio-wb-zipf-rewrite" / "default" / "ext2" / "rep1" / "repro.sh").read_text()
    assert "/mnt/nvbench-fio --filename=wb.dat" in e and "/opt/nvstack mount" not in e
    # the same stack without the NVRAM page cache
    o = (runs / "fio-wb-zipf-rewrite" / "default" / OFF / "rep1" / "repro.sh").read_text()
    assert "--consistency undo --tempfiles off --cache off --passthrough off --foreground" in o
    # Postmark
    pd = runs / "postmark-writeback" / "files=7500" / "nvstack-ext2-wb-file" / "rep1"
    cfg = (pd / "postmark.cfg").read_text().splitlines()
    assert "set number 7500" in cfg and "set transactions 20000" in cfg
    assert "set size 512 10240" in cfg and not any(l.startswith("set subdir") for l in cfg)
    assert "--writeback file --max-dirty-age 0" in (pd / "repro.sh").read_text()
    assert (pd / "cmd.txt").read_text().rstrip().endswith(
        '/nvbench-postmark postmark "${RUN}/postmark.cfg"')


def test_dry_run_on_an_old_binary_skips_the_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(nvstack, "_cache", caps(OLD_FLAGS, device=False))
    st = runner.Settings(out=tmp_path / "o", device="none", workdir=tmp_path / "w",
                         dry_run=True, reps=1)
    results = runner.run_experiment(EXPERIMENTS[EXP], st, None)
    by_fs = {}
    for r in results:
        by_fs.setdefault(r["spec"]["fs"], set()).add(r["status"])
    assert by_fs["ext2"] == {"dry-run"} and by_fs[OFF] == {"dry-run"}
    assert all(by_fs[n] == {"skipped"} for n in WB)
    why = next(r["reason"] for r in results if r["spec"]["fs"] == "nvstack-ext2-wb-relo")
    assert "--cache" in why
    meta = json.loads((tmp_path / "o" / "experiment.json").read_text())
    assert meta["device"] == "none" and any("fell back" in n for n in meta["notes"])


# ----- nvstack stat: cache and writeback ---------------------------------------------------------
def load(samples, name):
    return json.loads((samples / name).read_text())


def test_cache_and_writeback_counters_are_deltas(samples):
    m = parse.parse_nvstack_stat(load(samples, "nvstack_stat_wb_relo.json"),
                                 load(samples, "nvstack_stat_wb_relo_before.json"))
    assert m["nv_writeback.pages_written"] == 21695
    assert m["nv_writeback.batches"] == 85
    assert m["nv_writeback.requests"] == 20405
    assert m["nv_writeback.repeated_pages"] == 5211
    assert m["nv_writeback.inter_request_distance_blocks"] == 15593780
    assert m["nv_writeback.rounds.pressure"] == 17
    assert m["nv_writeback.rounds.nvram_full"] == 0 and m["nv_writeback.rounds.age"] == 0
    assert m["nv_cache.hits"] == 76497 and m["nv_cache.fetches"] == 0
    assert m["nv_cache.pages_dropped"] == 0 and m["nv_cache.write_through"] == 0
    # gauges and settings as read after
    assert m["nv_writeback.pages_dirty"] == 4210
    assert m["nv_writeback.pages_inactive_dirty"] == 1807
    assert m["nv_writeback.high_pages"] == 4989 and m["nv_writeback.low_pages"] == 3742
    assert m["nv_writeback.zone_blocks"] == 1024 and m["nv_cache.files"] == 1
    # syncs (counted since 7cf5a34) is a counter: a delta
    after, before = (load(samples, n) for n in ("nvstack_stat_wb_relo.json",
                                                "nvstack_stat_wb_relo_before.json"))
    after["writeback"]["syncs"], before["writeback"]["syncs"] = 10, 3
    assert parse.parse_nvstack_stat(after, before)["nv_writeback.syncs"] == 7
    assert m["nv_nvram.frames_total"] == 6237
    assert "nv_cache.enabled" not in m and "nv_writeback.policy" not in m
    # consistent sample: every newly dirty page was written back or is still dirty
    assert m["nv_cache.hits"] + m["nv_writeback.pages_written"] + 4210 - 2 == 102400
    assert m["nv_lower.bytes_written"] == 21695 * 4096
    d = parse.writeback_metrics(m)
    assert d["wb_repeated_pct"] == pytest.approx(100 * 5211 / 21695)
    assert d["wb_pages_per_request"] == pytest.approx(21695 / 20405)
    assert d["wb_inter_request_distance_per_request"] == pytest.approx(15593780 / 20405)


def test_no_writeback_metrics_with_the_cache_off(samples):
    off = parse.parse_nvstack_stat(load(samples, "nvstack_stat_wb_off.json"),
                                   load(samples, "nvstack_stat_wb_off_before.json"))
    assert off["nv_writeback.pages_written"] == 0 and off["nv_cache.hits"] == 0
    assert off["nv_lower.bytes_written"] == 400 << 20
    assert parse.writeback_metrics(off) == {}
    real = parse.parse_nvstack_stat(load(samples, "nvstack_stat_none.json"),
                                    load(samples, "nvstack_stat_none_before.json"))
    assert not any(k.startswith(("nv_cache.", "nv_writeback.")) for k in real)  # older binary
    assert parse.writeback_metrics(real) == {}


# ----- run directories -> CSV -> summary, figure -----------------------------------------------------
WALLS = {  # (workload, variant) -> rep -> fs -> wall seconds
    ("fio", "default"): {1: {"ext2": 40.0, OFF: 60.0, WB[0]: 60.0, WB[1]: 100.0, WB[2]: 50.0,
                             WB[3]: 48.0},
                         2: {"ext2": 42.0, OFF: 62.0, WB[0]: 64.0, WB[1]: 96.0, WB[2]: 48.0,
                             WB[3]: 48.0}},
    ("postmark", "files=2500"): {1: {"ext2": 10.0, OFF: 50.0, WB[0]: 40.0, WB[1]: 38.0,
                                     WB[2]: 39.0, WB[3]: 30.0}},
}


def make_run(out, samples, workload, variant, fs_name, rep, wall):
    config = "wb-zipf-rewrite" if workload == "fio" else "writeback"
    d = out / "runs" / EXP / f"{workload}-{config}" / variant / fs_name / f"rep{rep}"
    d.mkdir(parents=True)
    cfg = fs.CONFIGS[fs_name]
    spec = {"experiment": EXP, "workload": workload, "config": config, "variant": variant,
            "fs": fs_name, "rep": rep, "device": "hdd-7200", "memory_bytes": 64 << 20,
            "nvram_bytes": 32 << 20, "scale": 1.0,
            "params": {"transactions": 20_000, "files": 2500} if workload == "postmark" else {}}
    (d / "spec.json").write_text(json.dumps(spec))
    (d / "env.json").write_text(json.dumps({"run": {
        "fs": {"label": cfg.label}, "nvram_bytes": (32 << 20) if cfg.nvstack else None}}))
    (d / "result.json").write_text(json.dumps({"status": "ok", "reason": "",
                                               "wall_seconds": wall, "sync_seconds": 0.2}))
    if workload == "fio":
        shutil.copy(samples / "fio_rnd_write.json", d / "stdout.txt")
    else:
        shutil.copy(samples / "postmark_verbose.txt", d / "stdout.txt")
    stat_name = "nvstack_stat_wb_relo" if cfg.cache_on else "nvstack_stat_wb_off"
    if cfg.nvstack:
        shutil.copy(samples / f"{stat_name}_before.json", d / "nvstack_stat_before.json")
        shutil.copy(samples / f"{stat_name}.json", d / "nvstack_stat.json")
    (d / "device_stat_before.json").write_text(json.dumps(
        {"busy_ms": 100.0, "bytes_written": 0, "requests": 10, "seek_distance_sectors": 800}))
    (d / "device_stat_after.json").write_text(json.dumps(
        {"busy_ms": 100.0 + wall * 900, "bytes_written": int(wall) << 20, "requests": 5000,
         "seek_distance_sectors": 800 + int(wall) * 8000}))
    return d


@pytest.fixture
def wb_results(tmp_path, samples):
    for (workload, variant), reps in WALLS.items():
        for rep, walls in reps.items():
            for fs_name, wall in walls.items():
                make_run(tmp_path, samples, workload, variant, fs_name, rep, wall)
    exp = EXPERIMENTS[EXP]
    (tmp_path / "experiment.json").write_text(json.dumps(
        {"experiment": EXP, "baseline": exp.baseline, "fs": exp.fs,
         "description": exp.description, "notes": exp.notes[:1]}))
    return tmp_path


def values(rows, fs_name, metric, workload="fio"):
    return [float(r["value"]) for r in rows
            if r["fs"] == fs_name and r["metric"] == metric and r["workload"] == workload]


def test_csv_writeback_metrics_and_pairs(wb_results):
    rows = parse.read_csv(parse.parse_tree(wb_results)[EXP])
    relo = "nvstack-ext2-wb-relo"
    assert values(rows, relo, "wb_time_ratio_vs_file") == [48 / 60, 48 / 64]
    assert values(rows, relo, "wb_improvement_vs_file_pct") == \
        [pytest.approx(100 * 12 / 60), pytest.approx(100 * 16 / 64)]
    assert values(rows, "ext2", "wb_time_ratio_vs_file") == [40 / 60, 42 / 64]
    assert values(rows, OFF, "wb_time_ratio_vs_file") == [1.0, 62 / 64]
    assert values(rows, "nvstack-ext2-wb-file", "wb_time_ratio_vs_file") == []
    assert values(rows, relo, "wb_time_ratio_vs_file", "postmark") == [30 / 40]
    assert values(rows, relo, "nv_writeback.pages_written") == [21695, 21695]
    assert values(rows, relo, "nv_writeback.pages_dirty") == [4210, 4210]
    assert values(rows, relo, "wb_repeated_pct") == [pytest.approx(100 * 5211 / 21695)] * 2
    assert values(rows, OFF, "nv_writeback.pages_written") == [0, 0]
    assert values(rows, OFF, "wb_repeated_pct") == []
    assert values(rows, relo, "dev_busy_ms") == [48 * 900, 48 * 900]
    r = next(r for r in rows if r["metric"] == "wb_time_ratio_vs_file")
    assert r["unit"] == "x" and r["higher_is_better"] == "0" and r["primary"] == "0"
    r = next(r for r in rows if r["metric"] == "nv_writeback.repeated_pages")
    assert r["unit"] == "pages"
    prim = {r["metric"] for r in rows if r["primary"] == "1"}
    assert prim == {"wall_seconds"}


def test_summary_writeback_tables(wb_results):
    parse.parse_tree(wb_results)
    plot.plot_dir(wb_results)
    md = summary.write(wb_results).read_text()
    head = ("### Write-back: fio wb-zipf-rewrite (means ± std over repetitions; M 64, NVRAM 32 "
            "MiB = 6237 frames, write-back above 4989 / down to 3742 dirty pages)")
    assert head in md
    assert "### Write-back: postmark writeback files=2500" in md
    section = md[md.index(head):md.index("### Write-back: postmark")]
    lines = {l.split("|")[1].strip(): [c.strip() for c in l.split("|")[1:-1]]
             for l in section.splitlines() if l.startswith("| ")}
    relo = lines["nvstack-ext2-wb-relo"]
    assert relo[1] == "cache on, relo" and relo[2] == "2"
    assert relo[3] == "48.00 ± 0.00"
    assert relo[4] == f"{(48 / 60 + 48 / 64) / 2:.3f} ± {0.035355:.3f}"
    assert relo[5] == f"+{(20 + 25) / 2:.1f} ± 3.5"
    assert relo[6] == "21695 ± 0"
    assert relo[7] == "5211 (24.0 %)"
    assert relo[8] == "20405 (1.06)"
    assert relo[9] == f"15593780 ({15593780 / 20405:.4g})"
    assert relo[10] == "pressure 17"
    assert relo[11] == ""                   # syncs: the sample's binary did not count them yet
    assert relo[12] == "0" and relo[13] == "4210"                 # pages dropped, dirty at end
    assert relo[14] == f"{48 * 0.9:.1f}" and relo[15] == "48.0"
    assert lines["nvstack-ext2-wb-file"][4] == "1 (itself)"
    assert lines["ext2"][1] == "- (kernel FS alone)" and lines["ext2"][6] == ""
    assert lines[OFF][1] == "cache off" and lines[OFF][6] == "0 ± 0"
    assert "about 62 %, 58 % and 67 %" in md                # the thesis' numbers
    # the generic tables: ratios to the experiment's baseline, WB file
    assert "wall time / nvstack-ext2-wb-file" in md
    assert "writeback-policies-writeback.png" in md


def test_writeback_figure(wb_results):
    parse.parse_tree(wb_results)
    names = [p.name for p in plot.plot_dir(wb_results)]
    assert "writeback-policies-writeback.png" in names
    p = wb_results / "writeback-policies-writeback.png"
    assert p.read_bytes()[:8] == PNG_MAGIC and p.stat().st_size > 10_000


def test_no_writeback_tables_without_the_cache(tmp_path, samples):
    for fs_name in ("ext2", OFF):
        make_run(tmp_path, samples, "fio", "default", fs_name, 1, 10.0)
    parse.parse_tree(tmp_path)
    md = summary.write(tmp_path).read_text()
    assert "Write-back:" not in md
    assert "writeback-policies-writeback.png" not in [p.name for p in plot.plot_dir(tmp_path)]


def test_a_ctrl_c_during_teardown_undoes_everything_and_is_kept(tmp_path):
    """A Ctrl-C while a run is torn down (an nvstack unmount may write back for minutes) must
    not stop the undoing - the daemon would outlive its run - and must not be lost either: the
    harness would go on to the next run (seen 2026-11-26: two runs' daemons at once)."""
    sh = Shell(dry_run=True)
    t = fs.Target(sh, fs.CONFIGS["ext4-ordered"], "none", fs.Layout(tmp_path / "t", "t"),
                  1 << 30, 16 << 20, 32 << 20)
    done = []

    def interrupted():
        done.append("umount")
        raise KeyboardInterrupt("signal 2")

    t._undo.extend([lambda: done.append("detach"), interrupted, lambda: done.append("stop")])
    errors = t.teardown()
    assert done == ["stop", "umount", "detach"]
    assert errors == ["interrupted: signal 2"]
    assert isinstance(t.interrupted, KeyboardInterrupt)
