"""The experiment matrix and repro.sh, in dry-run mode (no root, no mounts, nothing executed)."""

import json
import subprocess

import pytest

from nvbench import fs, nvstack, runner
from nvbench.experiments import EXPERIMENTS
from nvbench.shell import Shell


pytestmark = pytest.mark.usefixtures("no_nvstack")


def settings(tmp_path, device="none"):
    return runner.Settings(out=tmp_path / "out", device=device, workdir=tmp_path / "work",
                           dry_run=True)


def test_every_experiment_expands(tmp_path):
    for exp in EXPERIMENTS.values():
        specs = runner.matrix(exp, settings(tmp_path))
        assert specs, exp.name
        assert {s.fs for s in specs} == set(exp.fs)
        fs.resolve(exp.fs)                        # all names exist
        assert exp.baseline in exp.fs


def test_thesis_matrix_shape(tmp_path):
    specs = runner.matrix(EXPERIMENTS["thesis-postmark"], settings(tmp_path))
    assert len(specs) == 11 * 6 * 3
    assert specs[0].memory_bytes == 256 << 20 and specs[0].journal_bytes == 64 << 20
    assert specs[0].nvram_bytes == 128 << 20
    # interleaved: first all FS for the first variant of rep 1
    assert [s.fs for s in specs[:11]] == EXPERIMENTS["thesis-postmark"].fs
    assert len({s.reldir() for s in specs}) == len(specs)


def test_table_4_2_flags():
    c = fs.CONFIGS["nvstack-ext2-tempffs-wb-trans"]
    assert c.nvstack == {"consistency": "undo", "tempfiles": "on", "cache": "on",
                         "passthrough": "off", "writeback": "relo"}
    assert c.label == "TempFFS_WB_Ext2_Trans" and c.consistent and c.cache_on
    # WB off = the NVRAM page cache off (Linux's write-back of the lower FS): no policy
    bare = fs.CONFIGS["nvstack-ext2"]
    assert bare.nvstack == {"consistency": "none", "tempfiles": "off", "cache": "off",
                            "passthrough": "off"}
    assert not bare.cache_on
    assert fs.CONFIGS["nvstack-ext2-trans"].nvstack == {
        "consistency": "undo", "tempfiles": "off", "cache": "off", "passthrough": "off"}
    # Every thesis configuration (Table 4.2, the write-back policies) and the FUSE tax's
    # pass-through keep lower files on the NVRAM path: with kernel passthrough (nvstack's
    # default since issue 16) a lower file's writes never reach the page cache they measure.
    thesis = [n for n, c in fs.CONFIGS.items() if c.nvstack and (
        n.startswith(("nvstack-ext2", "nvstack-none")) or n == "nvstack-ext4-journal"
        or n.startswith("nvstack-ext4-tempffs") or n.startswith("nvstack-ext4-wb"))]
    assert len(thesis) > 30
    for name in thesis:
        assert fs.CONFIGS[name].nvstack["passthrough"] == "off", name
    assert fs.CONFIGS["nvstack-ext4-tempffs"].nvstack["cache"] == "off"
    assert fs.CONFIGS["ext4-journal-ram"].label == "Mext3"


def test_smoke_dry_run_and_skips(tmp_path):
    exp = EXPERIMENTS["smoke"]
    notes = []
    assert runner.choose_device(None, exp, notes) == "none"      # no nvstack here
    assert "fell back to a plain loop device" in notes[0]
    with pytest.raises(Exception):
        runner.choose_device("hdd-7200", exp, [])                 # explicit request: error
    st = settings(tmp_path)
    results = runner.run_experiment(exp, st, "none")
    assert {r["status"] for r in results} == {"dry-run"}
    meta = json.loads((st.out / "experiment.json").read_text())
    assert meta["runs"] == 4 and meta["device"] == "none"


def test_nvstack_configs_skipped_with_reason(tmp_path):
    exp = EXPERIMENTS["tempffs-postmark"]
    st = settings(tmp_path)
    st.reps = 1
    results = runner.run_experiment(exp, st, "none")
    skipped = [r for r in results if r["status"] == "skipped"]
    assert skipped and all("nvstack" in r["reason"] for r in skipped)
    assert {r["spec"]["fs"] for r in skipped} == {"nvstack-ext2-trans",
                                                  "nvstack-ext2-tempffs-trans"}


def _repro(tmp_path, fsname, device="none"):
    spec = runner.matrix(EXPERIMENTS["smoke"], settings(tmp_path))[0]
    spec.fs, spec.device = fsname, device
    runner.execute(spec, settings(tmp_path, device), [])
    d = settings(tmp_path).out / spec.reldir()
    return d, (d / "repro.sh").read_text()


def test_repro_sh_plain_loop(tmp_path):
    d, text = _repro(tmp_path, "ext2")
    assert text.startswith("#!/bin/bash")
    assert 'RUN="${1:-$(mktemp -d' in text
    assert "LOOP1=$(losetup --find --show" in text and "/dev/loop" not in text
    assert "mke2fs -q -F -t ext2 -b 4096 \"${LOOP1}\"" in text
    assert "echo 3 > /proc/sys/vm/drop_caches" in text
    assert "memory.limit_in_bytes" in text and "cgroup.procs" in text
    assert "time -p sh -c" in text and 'postmark "${RUN}/postmark.cfg"' in text
    cleanup = text[text.index("cleanup() {"):text.index("trap cleanup EXIT")]
    assert cleanup.index("umount") < cleanup.index("losetup -d") < cleanup.index("rmdir")
    assert subprocess.run(["bash", "-n", str(d / "repro.sh")]).returncode == 0
    assert (d / "postmark.cfg").exists() and (d / "env.json").exists()
    env = json.loads((d / "env.json").read_text())
    for key in ("kernel", "cpu_model", "memory_total_bytes", "tools", "git_commit"):
        assert key in env
    for key in ("scale", "memory_budget_bytes", "device_model", "cgroup_limit_bytes"):
        assert key in env["run"]


def test_repro_sh_ram_journal(tmp_path):
    d, text = _repro(tmp_path, "ext4-journal-ram")
    assert "truncate -s 32M /dev/shm/nvbench-" in text      # J = 256M x (128M / 1G)
    assert "JLOOP1=$(losetup --find --show /dev/shm/" in text
    assert "mke2fs -q -F -O journal_dev -b 4096 \"${JLOOP1}\"" in text
    assert "-J \"device=${JLOOP1}\"" in text
    assert "data=journal,journal_path=${JLOOP1}" in text
    env = json.loads((d / "env.json").read_text())
    assert env["run"]["cgroup_limit_bytes"] == (128 - 32) << 20   # the RAM journal is inside M
    cleanup = text[text.index("cleanup() {"):]
    assert cleanup.index("losetup -d \"${LOOP") < cleanup.index("losetup -d \"${JLOOP")


def test_repro_sh_nvstack_over_modeled_disk(tmp_path, monkeypatch):
    caps = nvstack.Capabilities("/opt/nvstack", device=True, mount=True,
                                mount_flags={"tempfiles", "cache", "writeback", "consistency",
                                             "passthrough"},
                                consistency_modes={"undo", "none"})   # a binary with the features
    monkeypatch.setattr(nvstack, "_cache", caps)
    d, text = _repro(tmp_path, "nvstack-ext2-tempffs-wb-trans", device="hdd-7200")
    assert "/opt/nvstack device attach" in text and "--model hdd-7200" in text
    assert "--mkfs ext2" in text
    assert ("--consistency undo --tempfiles on --cache on --passthrough off --writeback relo "
            "--foreground" in text)
    assert "cgroup.procs && exec \"$@\"' sh /opt/nvstack mount" in text   # daemon in the cgroup
    assert "DAEMON" in text and "/opt/nvstack device stat" in text
    cleanup = text[text.index("cleanup() {"):]
    assert cleanup.index("nvstack umount") < cleanup.index("device detach")
    assert cleanup.index("nvstack umount") < cleanup.index(".nvram")


def test_shell_captured_variable_quoting():
    sh = Shell(dry_run=True)
    dev = sh.run(["losetup", "--find", "--show", "/x y/img"], capture_as="LOOP").stdout
    sh.run(["mount", "-o", f"a,journal_path={dev}", dev, "/m"])
    assert sh.setup[0] == "LOOP1=$(losetup --find --show '/x y/img')"
    assert sh.setup[1] == 'mount -o "a,journal_path=${LOOP1}" "${LOOP1}" /m'


def test_feature_flags_only_when_the_binary_has_them():
    caps = nvstack.Capabilities("/bin/nvstack", device=True, mount=True,
                                mount_flags={"nvram", "consistency", "threads"},
                                consistency_modes={"undo", "none"})
    # every feature off: runs on a binary without --tempfiles/--writeback (off is all it does)
    assert all(caps.missing(n) is None for n in fs.CONFIGS["nvstack-ext2"].needs)
    assert all(caps.missing(n) is None for n in fs.CONFIGS["nvstack-ext2-trans"].needs)
    # a feature switched on needs its flag: skipped with the reason
    why = [caps.missing(n) for n in fs.CONFIGS["nvstack-ext2-tempffs"].needs]
    assert any(w and "--tempfiles" in w for w in why)
    assert "journal" in caps.missing("consistency:journal")
    # the page cache on needs --cache and --writeback
    why = [caps.missing(n) for n in fs.CONFIGS["nvstack-ext2-wb"].needs]
    assert any(w and "--cache" in w for w in why)
    caps.mount_flags |= {"tempfiles", "writeback"}
    assert any(caps.missing(n) for n in fs.CONFIGS["nvstack-ext2-tempffs-wb"].needs)
    caps.mount_flags |= {"cache"}
    assert all(caps.missing(n) is None for n in fs.CONFIGS["nvstack-ext2-tempffs-wb"].needs)


def test_showcase_and_fs_subset(tmp_path):
    from nvbench import cli
    exp = EXPERIMENTS["showcase"]
    assert exp.fs == ["ext4-ordered", "nvstack-ext4-defaults"]
    assert exp.device == "hdd-7200"
    pm = EXPERIMENTS["showcase-postmark"]
    assert pm.fs == ["ext2", "nvstack-ext2-tempffs-trans"] and pm.device == "hdd-7200"
    assert fs.CONFIGS["nvstack-ext2-trans"].nvstack["consistency"] == "undo"
    assert fs.CONFIGS["nvstack-ext2-tempffs-trans"].nvstack["tempfiles"] == "on"
    out = tmp_path / "tp"
    rc = cli.main(["run", "thesis-postmark", "--dry-run", "--device", "none", "--reps", "1",
                   "--fs", "ext2,nvstack-ext2", "--out", str(out), "--workdir",
                   str(tmp_path / "w"), "--no-plot"])
    assert rc == 0
    meta = json.loads((out / "experiment.json").read_text())
    assert meta["fs"] == ["ext2", "nvstack-ext2"] and meta["runs"] == 2 * 6
    assert cli.main(["run", "thesis-postmark", "--dry-run", "--fs", "vfat", "--out",
                     str(out)]) == 2


def test_variants_subset(tmp_path):
    from nvbench import cli
    out = tmp_path / "wbp"
    rc = cli.main(["run", "writeback-policies", "--dry-run", "--device", "none", "--reps", "1",
                   "--workloads", "postmark:writeback", "--variants", "files=2500",
                   "--out", str(out), "--workdir", str(tmp_path / "w"), "--no-plot"])
    assert rc == 0
    meta = json.loads((out / "experiment.json").read_text())
    assert meta["runs"] == len(EXPERIMENTS["writeback-policies"].fs)
    runs = sorted(p.name for p in (out / "runs").rglob("files=*"))
    assert runs and all(name == "files=2500" for name in runs)
    assert cli.main(["run", "writeback-policies", "--dry-run", "--variants", "files=3",
                     "--out", str(tmp_path / "x")]) == 2


def test_disk_size_option_reaches_every_run(tmp_path, monkeypatch):
    """--disk replaces the experiment's disk image size (nbw at the paper's scale 1 lays out a
    5 GiB file that the default 4 GiB image cannot hold); a bad size fails before any run."""
    from nvbench import cli
    caps = nvstack.Capabilities("/opt/nvstack", device=True, mount=True,
                                mount_flags={"tempfiles", "cache", "writeback", "consistency",
                                             "passthrough", "nbw", "keep-dirty"},
                                consistency_modes={"undo", "none"})
    monkeypatch.setattr(nvstack, "_cache", caps)
    out = tmp_path / "nbw"
    rc = cli.main(["run", "nbw", "--dry-run", "--device", "hdd-7200", "--scale", "1",
                   "--disk", "8G", "--variants", "iosize=128", "--workloads",
                   "fio:nbw-random-write", "--fs", "ext4-ordered,nvstack-ext4-nbw-lazy",
                   "--out", str(out), "--workdir", str(tmp_path / "w"), "--no-plot"])
    assert rc == 0
    specs = [json.loads(p.read_text()) for p in (out / "runs").rglob("spec.json")]
    assert len(specs) == 2 and {s["disk_bytes"] for s in specs} == {8 << 30}
    repro = next(p for p in (out / "runs").rglob("repro.sh") if "nbw-lazy" in str(p))
    text = repro.read_text()
    assert "--size 8G" in text and "--size=5368709120" in text and "--keep-dirty" in text
    assert cli.main(["run", "nbw", "--dry-run", "--disk", "lots", "--out",
                     str(tmp_path / "x")]) == 2


def test_nbw_bgwb_twins_add_only_the_background_writer(tmp_path, monkeypatch):
    """Each nbw configuration has a -bgwb twin whose mount differs by exactly
    `--writeback-background on`; a binary without that flag skips the twin, not the run."""
    twins = [c for c in fs.CONFIGS if c.startswith("nvstack-ext4-nbw-") and c.endswith("-bgwb")]
    assert sorted(twins) == sorted(f"nvstack-ext4-nbw-{m}-bgwb" for m, _ in fs.NBW_MODES)
    for name in twins:
        base = fs.CONFIGS[name.removesuffix("-bgwb")].nvstack["args"]
        assert fs.CONFIGS[name].nvstack["args"] == [*base, "--writeback-background", "on"]
    from nvbench import cli
    flags = {"tempfiles", "cache", "writeback", "consistency", "passthrough", "nbw", "keep-dirty"}
    for have, ran in ((flags | {"writeback-background"}, True), (flags, False)):
        caps = nvstack.Capabilities("/opt/nvstack", device=True, mount=True, mount_flags=have,
                                    consistency_modes={"undo", "none"})
        monkeypatch.setattr(nvstack, "_cache", caps)
        out = tmp_path / f"nbw-{ran}"
        assert cli.main(["run", "nbw", "--dry-run", "--device", "ssd", "--variants",
                         "iosize=4096", "--workloads", "fio:nbw-random-write", "--fs",
                         "nvstack-ext4-nbw-lazy-bgwb", "--out", str(out), "--workdir",
                         str(tmp_path / "w"), "--no-plot"]) == 0
        results = [json.loads(p.read_text()) for p in (out / "runs").rglob("result.json")]
        assert [r["status"] for r in results] == (["dry-run"] if ran else ["skipped"])
        if ran:
            repro = next((out / "runs").rglob("repro.sh")).read_text()
            assert "--keep-dirty --writeback-background on --foreground" in repro


def test_nvstack_args_reach_every_nvstack_mount_and_are_recorded(tmp_path, monkeypatch, capsys):
    """`--nvstack-args` appends to each nvstack configuration's mount (a kernel file system is
    untouched), is written to experiment.json and env.json, and an option a configuration sets
    itself is refused before any run."""
    from nvbench import cli
    flags = {"tempfiles", "cache", "writeback", "consistency", "writeback-background"}
    caps = nvstack.Capabilities("/opt/nvstack", device=True, mount=True, mount_flags=flags,
                                consistency_modes={"undo", "none"})
    monkeypatch.setattr(nvstack, "_cache", caps)
    out = tmp_path / "pm"
    assert cli.main(["run", "showcase-postmark", "--dry-run",
                     "--nvstack-args=--writeback-background on", "--out", str(out), "--workdir", str(tmp_path / "w"), "--no-plot"]) == 0
    meta = json.loads((out / "experiment.json").read_text())
    assert meta["nvstack_args"] == ["--writeback-background", "on"]
    rundirs = [p.parent for p in (out / "runs").rglob("repro.sh")]
    assert len(rundirs) == 2
    for rundir in rundirs:
        text = (rundir / "repro.sh").read_text()
        nv = json.loads((rundir / "env.json").read_text())["run"]["fs"]["nvstack"]
        if nv:
            assert "--writeback-background on --foreground" in text
            assert nv["args"][-2:] == ["--writeback-background", "on"]
        else:
            assert "--writeback-background" not in text
    assert cli.main(["run", "showcase-postmark", "--dry-run", "--nvstack-args=--tempfiles off",
                     "--out", str(tmp_path / "x"), "--workdir", str(tmp_path / "w"),
                     "--no-plot"]) == 2
    assert "--tempfiles is set by configuration" in capsys.readouterr().err
    assert not (tmp_path / "x" / "runs").exists()
