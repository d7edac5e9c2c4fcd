"""The thesis matrix (issue 17 section 2): both memory accountings in the run script, the
kernel write-back thresholds of the modeled machine set and restored, the matrix table's paired
ratios and the figure command, from dry runs and synthetic run directories. No root, no
mounts."""

import dataclasses
import json

import pytest

from nvbench import fs as fs_mod
from nvbench import parse, runner
from nvbench import thesis_figures as tf
from nvbench.experiments import EXPERIMENTS
from nvbench.shell import Shell

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

pytestmark = pytest.mark.usefixtures("no_nvstack")


def test_every_table_4_2_configuration_runs_under_both_accountings():
    exp = EXPERIMENTS["thesis-matrix"]
    assert exp.fs[:4] == ["ext2", "ext4-ordered", "ext4-journal", "ext4-journal-ram"]
    nv = exp.fs[4:]
    assert len(nv) == 16
    for name in nv:
        base, acct = name.rsplit("-", 1)
        cfg, twin = fs_mod.CONFIGS[name], fs_mod.CONFIGS[base]
        assert cfg.nvram_accounting == acct and acct in ("charged", "extra")
        # the same mount as the configuration other experiments use, only charged differently
        assert cfg.nvstack == twin.nvstack and twin.nvram_accounting == "touched"
    assert exp.kernel_dirty == (10, 40)


def _scripts(tmp_path, monkeypatch, names):
    from nvbench import nvstack
    flags = {"tempfiles", "cache", "writeback"}
    monkeypatch.setattr(nvstack, "_cache", nvstack.Capabilities(
        "/opt/nvstack", device=True, mount=True, mount_flags=flags,
        consistency_modes={"none", "undo", "journal"}))
    exp = dataclasses.replace(EXPERIMENTS["thesis-matrix"], fs=names)
    st = runner.Settings(out=tmp_path / "out", device="hdd-7200", timing="sleep", memory=None,
                         scale=None, reps=1, workdir=tmp_path / "work", dry_run=True, echo=False)
    results = runner.run_experiment(exp, st, None)
    assert [r["status"] for r in results] == ["dry-run"] * len(names)
    return {r["spec"]["fs"]: (tmp_path / "out" / runner.RunSpec(**r["spec"]).reldir())
            for r in results}


def test_the_region_is_allocated_inside_the_cgroup_when_charged_and_outside_when_extra(
        tmp_path, monkeypatch):
    dirs = _scripts(tmp_path, monkeypatch, ["nvstack-ext2-trans-charged",
                                             "nvstack-ext2-trans-extra", "nvstack-ext2-trans"])
    lines = {fs: (d / "repro.sh").read_text().splitlines() for fs, d in dirs.items()}

    def line(fs, word):
        return [ln for ln in lines[fs] if word in ln]

    for fs in ("nvstack-ext2-trans-charged", "nvstack-ext2-trans-extra"):
        fmt = line(fs, " format --nvram ")
        # 102 MiB budget: a 51 MiB region with the 12 undo slots a mount would give it
        assert len(fmt) == 1 and "--size 51M --undo-slots 12" in fmt[0]
        alloc = line(fs, "fallocate -l 51M /dev/shm/")
        assert len(alloc) == 1
        charged_inside = "cgroup.procs" in alloc[0]
        assert charged_inside == fs.endswith("-charged")
        # formatted and allocated before the daemon starts
        mount = line(fs, " mount /")[0]
        assert lines[fs].index(alloc[0]) < lines[fs].index(mount)
    # the configuration of the other experiments: the daemon creates the region (touched)
    assert not line("nvstack-ext2-trans", "fallocate") and \
        not line("nvstack-ext2-trans", " format --nvram ")
    env = json.loads((dirs["nvstack-ext2-trans-extra"] / "env.json").read_text())["run"]
    assert env["fs"]["nvram_accounting"] == "extra"
    assert env["cgroup_limit_bytes"] == 102 << 20


def test_the_kernel_write_back_of_the_modeled_machine_is_set_for_the_run(tmp_path, monkeypatch):
    dirs = _scripts(tmp_path, monkeypatch, ["ext2"])
    d = dirs["ext2"]
    env = json.loads((d / "env.json").read_text())["run"]
    m = 102 << 20
    assert env["kernel_dirty"] == {"dirty_background_bytes": m // 10, "dirty_bytes": m * 4 // 10,
                                   "dirty_expire_centisecs": 3000,
                                   "dirty_writeback_centisecs": 500}
    text = (d / "repro.sh").read_text()
    assert (f"sysctl -q -w vm.dirty_background_bytes={m // 10} vm.dirty_bytes={m * 4 // 10} "
            "vm.dirty_expire_centisecs=3000 vm.dirty_writeback_centisecs=500") in text
    # the host's own values come back in the cleanup, whichever twin (ratio, bytes) it uses
    cleanup = text[text.index("cleanup() {"):text.index("trap cleanup EXIT")]
    restore = [ln for ln in cleanup.splitlines() if "sysctl -q -w" in ln]
    assert len(restore) == 1 and "vm.dirty_expire_centisecs=" in restore[0]
    assert "vm.dirty_ratio=" in restore[0] or "vm.dirty_bytes=" in restore[0]
    # an experiment without kernel_dirty leaves the host's settings alone
    spec = runner.RunSpec("x", "postmark", "thesis", "files=1", {}, "ext2", 1, "none", "sleep",
                          m, 1 << 30, 1 << 24, m // 2, 1.0)
    assert runner.kernel_dirty_settings(spec) is None


def test_set_vm_never_writes_a_zero_and_returns_what_was_there(monkeypatch):
    sh = Shell(dry_run=False, echo=False)
    ran = []
    monkeypatch.setattr(sh, "run", lambda argv, **kw: ran.append(argv))
    before = runner.set_vm(sh, {"dirty_background_ratio": 10, "dirty_background_bytes": 0,
                                "dirty_ratio": 20, "dirty_bytes": 0})
    assert ran == [["sysctl", "-q", "-w", "vm.dirty_background_ratio=10", "vm.dirty_ratio=20"]]
    assert set(before) == set(runner.VM_DIRTY_KEYS)
    assert all(isinstance(v, int) for v in before.values())


def _run(root, fs, rep, wall, tx=20000, scale=0.1):
    d = (root / "runs" / "thesis-matrix" / "postmark-thesis-matrix" / "files=2500" / fs /
         f"rep{rep}")
    d.mkdir(parents=True)
    spec = {"experiment": "thesis-matrix", "workload": "postmark", "config": "thesis-matrix",
            "variant": "files=2500", "fs": fs, "rep": rep, "device": "hdd-7200",
            "memory_bytes": 102 << 20, "nvram_bytes": 51 << 20, "scale": scale,
            "params": {"transactions": tx, "files": 2500}}
    (d / "spec.json").write_text(json.dumps(spec))
    (d / "result.json").write_text(json.dumps({"status": "ok", "wall_seconds": wall,
                                               "sync_seconds": 0.01, "exit_code": 0,
                                               "spec": spec}))
    (d / "stdout.txt").write_text(f"Time:\n\t{int(wall)} seconds total\n"
                                  f"\t{int(wall)} seconds of transactions ({tx} per second)\n")


def test_the_matrix_table_pairs_ratios_by_repetition_and_the_figure_is_drawn(tmp_path):
    root = tmp_path / "res"
    walls = {"ext2": (6.0, 8.0), "ext4-journal": (45.0, 50.0),
             "nvstack-ext2-tempffs-wb-trans-charged": (30.0, 25.0),
             "nvstack-ext2-tempffs-wb-trans-extra": (20.0, 40.0),
             "nvstack-ext2-tempffs-charged": (12.0, 8.0)}
    for fs, ws in walls.items():
        for rep, w in enumerate(ws, 1):
            _run(root, fs, rep, w)
    parse.parse_tree(root)
    from nvbench.summary import read_csv
    rows = read_csv(root / "thesis-matrix.csv")
    table = {t["fs"]: t for t in tf.matrix_table(rows)}
    # Table 4.2 order: group 1 (no consistency) first, kernel baselines before nvstack
    assert list(table) == ["ext2", "nvstack-ext2-tempffs-charged", "ext4-journal",
                           "nvstack-ext2-tempffs-wb-trans-charged",
                           "nvstack-ext2-tempffs-wb-trans-extra"]
    t = table["nvstack-ext2-tempffs-wb-trans-charged"]
    # paired: rep1 45/30 = 1.5, rep2 50/25 = 2.0 -> mean 1.75 (not 47.5/27.5)
    assert t["vs_ext4_journal"][0] == pytest.approx(1.75)
    assert t["vs_ext4_journal"][1] == pytest.approx(0.35355, rel=1e-3)
    assert t["vs_ext2"][0] == pytest.approx((6 / 30 + 8 / 25) / 2)
    assert t["n"] == 2 and t["accounting"] == "charged" and t["group"] == 2
    assert table["ext2"]["vs_ext2"][0] == pytest.approx(1.0)
    assert table["ext2"]["tx"][0] == pytest.approx((20000 / 6 + 20000 / 8) / 2)
    out = tmp_path / "figs"
    for number in ("4.15", "4.18"):
        path = tf.draw(number, root, out)
        assert path == out / f"thesis-fig-{number}.png"
        assert path.read_bytes()[:8] == PNG_MAGIC
    # Fig 4.15 draws the transaction mechanism against Ext3 and Mext3 only
    rows415 = [r for r in rows if r["fs"] in tf.FIGURES["4.15"].fs]
    assert {r["fs"] for r in rows415} == {"ext4-journal"}


def test_several_runs_merge_each_configuration_from_its_last_run_paired_within_it(tmp_path):
    from nvbench.util import BenchError
    old, new = tmp_path / "old", tmp_path / "new"
    # the old run: every configuration; the new one measures ext2, Ext3 and Ext2_Trans again
    for fs, ws in {"ext2": (6.0, 6.0), "ext4-journal": (48.0, 48.0),
                   "nvstack-ext2-tempffs-charged": (12.0, 12.0),
                   "nvstack-ext2-trans-charged": (80.0, 80.0)}.items():
        for rep, w in enumerate(ws, 1):
            _run(old, fs, rep, w)
    for fs, ws in {"ext2": (4.0, 5.0), "ext4-journal": (40.0, 50.0),
                   "nvstack-ext2-trans-charged": (20.0, 25.0)}.items():
        for rep, w in enumerate(ws, 1):
            _run(new, fs, rep, w)
    from nvbench.summary import read_csv
    for d in (old, new):
        parse.parse_tree(d)
    rows = tf.merge_sources([(d.name, read_csv(d / "thesis-matrix.csv")) for d in (old, new)])
    table = {t["fs"]: t for t in tf.matrix_table(rows)}
    assert {fs: t["source"] for fs, t in table.items()} == {
        "ext2": "new", "ext4-journal": "new", "nvstack-ext2-tempffs-charged": "old",
        "nvstack-ext2-trans-charged": "new"}
    # TempFFS pairs with the old run's ext2 (6/12), Ext2_Trans with the new run's (4/20, 5/25)
    assert table["nvstack-ext2-tempffs-charged"]["vs_ext2"][0] == pytest.approx(0.5)
    assert table["nvstack-ext2-trans-charged"]["vs_ext2"][0] == pytest.approx(0.2)
    assert table["nvstack-ext2-trans-charged"]["vs_ext4_journal"][0] == pytest.approx(2.0)
    # the bars: each configuration's own run only (ext2's from the new run)
    assert table["ext2"]["wall"][0] == pytest.approx(4.5) and table["ext2"]["n"] == 2
    out = tmp_path / "figs"
    for number in ("4.15", "4.18"):
        assert tf.draw(number, [old, new], out).read_bytes()[:8] == PNG_MAGIC
    # --fs with --from: only the named configurations are drawn, still paired with ext2
    only = tf.matrix_table(rows, ["nvstack-ext2-tempffs-charged"])
    assert [t["fs"] for t in only] == ["nvstack-ext2-tempffs-charged"]
    assert only[0]["vs_ext2"][0] == pytest.approx(0.5)
    assert tf.draw("4.18", [old, new], out, ["ext2", "nvstack-ext2-trans-charged"]).exists()
    with pytest.raises(BenchError, match="only the matrix and bar figures"):
        tf.draw("4.4", [old, new], out)
    # runs of another scale do not share a figure
    other = tmp_path / "scale-1"
    _run(other, "ext2", 1, 30.0, scale=1)
    parse.parse_tree(other)
    with pytest.raises(BenchError, match="cannot share a figure"):
        tf.draw("4.18", [old, other], out)


def test_a_figure_without_its_experiment_results_is_a_clear_error(tmp_path):
    from nvbench.util import BenchError
    (tmp_path / "empty").mkdir()
    with pytest.raises(BenchError, match="no results of experiment thesis-matrix"):
        tf.draw("4.18", tmp_path / "empty", tmp_path / "figs")
    assert set(tf.FIGURES) == {f"4.{n}" for n in range(1, 20)} - {"4.9"}


def test_one_panel_alone_and_bars_relative_to_the_named_base(tmp_path):
    from nvbench import plot
    fig, axes = plot._panels("4.4", ("4.3", "4.4", "4.5", "4.6"), (11, 7.5))
    assert [type(a).__name__ for a in axes].count("_Unused") == 3
    axes[0].set_title("ignored")            # the panels not drawn accept every call
    with pytest.raises(ValueError, match="panel 4.9"):
        plot._panels("4.9", ("4.3", "4.4"), (11, 7.5))
    import matplotlib.pyplot as plt
    plt.close(fig)
    root = tmp_path / "res"
    for fs, w in (("ext2", 6.0), ("ext4-journal", 12.0), ("nvstack-ext2-trans-extra", 4.0)):
        _run(root, fs, 1, w)
    parse.parse_tree(root)
    from nvbench.summary import read_csv
    rows = read_csv(root / "thesis-matrix.csv")
    path = tf.bars_figure(rows, tmp_path / "b.png", "t", base="ext4-journal")
    assert path.read_bytes()[:8] == PNG_MAGIC


def _capture_bars(monkeypatch) -> dict:
    """What bars_figure hands to plot.grouped_bars, instead of a PNG."""
    from nvbench import plot
    seen = {}
    monkeypatch.setattr(plot, "grouped_bars",
                        lambda path, title, groups, series, labels, mean, std, ylabel, imp,
                        base, note=None: seen.update(groups=groups, series=series, mean=mean,
                                                     imp=imp, ylabel=ylabel, note=note) or path)
    return seen


def test_bonnie_bars_draw_the_thesis_three_tests_against_ext2(monkeypatch, tmp_path):
    """Figs 4.1/4.7/4.13/4.16: char write, block write and rewrite (not only the primary
    metric), one group per test, improvements relative to the figure's first configuration."""
    seen = _capture_bars(monkeypatch)

    def row(fs, metric, value, primary=False):
        return {"status": "ok", "workload": "bonnie", "config": "thesis",
                "variant": "file=256M", "fs": fs, "metric": metric, "value": str(value),
                "unit": "KiB/s", "fs_label": fs, "higher_is_better": "1",
                "primary": "1" if primary else "0"}
    rows = []
    for fs, k in (("nvstack-ext2-tempffs", 2.0), ("ext2", 1.0)):
        rows += [row(fs, "put_char_kBps", 100 * k), row(fs, "put_block_kBps", 200 * k, True),
                 row(fs, "rewrite_kBps", 50 * k), row(fs, "seeks_per_s", 7)]
    tf.bars_figure(rows, tmp_path / "b.png", "t", base="ext2")
    assert seen["groups"] == ["char write", "block write", "rewrite"]
    assert seen["series"] == ["ext2", "nvstack-ext2-tempffs"]
    assert seen["imp"][("nvstack-ext2-tempffs", "rewrite")] == pytest.approx(100.0)
    assert seen["imp"][("ext2", "char write")] == pytest.approx(0.0)
    assert seen["ylabel"] == "the test's result (KiB/s; mean, std)"


def test_bar_figures_merge_runs_each_bar_from_its_last_run_improved_over_that_runs_base(
        monkeypatch, tmp_path):
    """Bonnie++ re-run for some configurations only (Fig 4.16 from two runs): every bar is its
    configuration's newest run, its improvement over ext2 of that same run."""
    seen = _capture_bars(monkeypatch)

    def row(fs, value, rep):
        return {"status": "ok", "workload": "bonnie", "config": "thesis", "rep": str(rep),
                "variant": "file=256M", "fs": fs, "metric": "put_char_kBps",
                "value": str(value), "unit": "KiB/s", "fs_label": fs, "higher_is_better": "1",
                "primary": "1", "device": "hdd-7200", "scale": "1.0",
                "memory_bytes": "134217728"}
    old = [row("ext2", 100, 1), row("nvstack-ext2-tempffs", 50, 1), row("nvstack-ext2", 80, 1)]
    new = [row("ext2", 200, 1), row("nvstack-ext2", 100, 1)]
    rows = tf.merge_sources([("old", old), ("new", new)])
    tf.bars_figure(rows, tmp_path / "b.png", "t")
    assert seen["series"][0] == "ext2", "the newest run's baseline, not the first run's"
    assert seen["mean"][("ext2", "char write")] == pytest.approx(200)
    assert seen["mean"][("nvstack-ext2", "char write")] == pytest.approx(100)
    # improvements within each bar's own run: FUSE-Ext2 100 vs the new ext2's 200,
    # TempFFS 50 vs the old ext2's 100 - both -50 %, not 50 vs 200
    assert seen["imp"][("nvstack-ext2", "char write")] == pytest.approx(-50.0)
    assert seen["imp"][("nvstack-ext2-tempffs", "char write")] == pytest.approx(-50.0)
    assert "old: nvstack-ext2-tempffs" in seen["note"] and "new: ext2, nvstack-ext2" in seen["note"]
    # one run: no note
    tf.bars_figure(new, tmp_path / "c.png", "t")
    assert seen["note"] is None
