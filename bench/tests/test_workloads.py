"""Input generators: postmark command files, fio job files, bonnie sizes."""

from pathlib import Path

from nvbench.workloads import bonnie, fio, postmark


def test_postmark_thesis_scaled():
    vs = postmark.variants("thesis", 0.25)
    assert [v for v, _ in vs] == [f"files={n}" for n in (1250, 2500, 3750, 5000, 6250, 7500)]
    p = vs[0][1]
    assert p["transactions"] == 50_000 and p["paper_transactions"] == 200_000
    assert p["paper_files"] == 5000 and p["scale"] == 0.25
    cfg = postmark.command_file(p, Path("/mnt/x/nvbench-postmark"))
    lines = cfg.splitlines()
    assert "set location /mnt/x/nvbench-postmark" in lines
    assert "set number 1250" in lines and "set transactions 50000" in lines
    assert "set size 512 10240" in lines          # sizes are never scaled
    assert lines[-2:] == ["run", "quit"]
    assert not any(l.startswith("set subdirectories") for l in lines)  # postmark default


def test_postmark_vma_and_nvfat():
    (_, vma), = postmark.variants("vma", 1.0)
    cfg = postmark.command_file(vma, Path("/d"))
    assert "set number 10000" in cfg and "set subdirectories 200" in cfg
    assert "set transactions 25000" in cfg and "set size 500 10000" in cfg
    (_, nvf), = postmark.variants("nvfat-sync", 1.0)
    cfg = postmark.command_file(nvf, Path("/d"))
    assert "set buffering false" in cfg and "set read 512" in cfg and "set write 512" in cfg
    assert postmark.mount_option(nvf) == "sync"
    (_, asy), = postmark.variants("nvfat-async", 1.0)
    assert postmark.mount_option(asy) is None


def test_postmark_2m_sizes():
    (_, p), = postmark.variants("thesis-2m", 0.1)
    assert p["size_max"] == 2 * 1024 * 1024 and p["files"] == 2500


def test_postmark_invocation_paths(tmp_path):
    (_, p), = postmark.variants("smoke", 1.0)
    long_target = Path("/mnt/" + "t" * 100)
    inv = postmark.invocation(p, long_target, tmp_path)
    # Postmark runs in its directory with a relative location: a work directory of any length
    # (Postmark garbles a location past 80 characters)
    assert inv.argv == ["env", "-C", str(long_target / "nvbench-postmark"), "postmark",
                        str(tmp_path / "postmark.cfg")]
    assert "set location .\n" in inv.files["postmark.cfg"]
    assert ["mkdir", "-p", str(long_target / "nvbench-postmark")] in inv.pre


def test_a_postmark_run_that_printed_errors_is_a_failure(tmp_path):
    assert postmark.failure(tmp_path) is None
    (tmp_path / "stdout.txt").write_text("Creating files...Done\n200 seconds total\n")
    (tmp_path / "stderr.txt").write_text("")
    assert postmark.failure(tmp_path) is None
    (tmp_path / "stderr.txt").write_text("Error: cannot open '/m/nvbench-post/#' for writing\n"
                                         "Error: cannot open '/m/nvbench-post/' for writing\n")
    why = postmark.failure(tmp_path)
    assert why.startswith("Postmark reported 2 failed file operations") and "/#'" in why


def test_fio_job_files_scale():
    (_, p), = fio.variants("rnd_write", 0.25)
    job = fio.job_file(p, Path("/mnt/t/nvbench-fio"))
    assert "directory=/mnt/t/nvbench-fio" in job
    assert "rw=randwrite" in job and "bs=4k" in job
    assert f"size={128 << 20}" in job and f"io_size={32 << 20}" in job
    assert "end_fsync=1" in job


def test_fio_nbw_iosizes_and_two_threads():
    vs = fio.variants("nbw-random-readwrite", 0.1)
    assert [v for v, _ in vs] == ["iosize=128", "iosize=512", "iosize=1024", "iosize=2048",
                                  "iosize=4096"]
    job = fio.job_file(vs[1][1], Path("/d"))
    assert job.count("bs=512") == 2 and "[randread]" in job and "[randwrite]" in job
    assert "runtime=6" in job and "time_based=1" in job


def test_fio_nbw_file_is_laid_out_before_the_stack_and_every_mode_runs():
    from nvbench.experiments import EXPERIMENTS
    from nvbench.fs import CONFIGS
    for config in ("nbw-seq-write", "nbw-random-write", "nbw-random-readwrite"):
        inv = fio.invocation(fio.variants(config, 0.25)[0][1], Path("/m"), Path("/r"))
        assert inv.pre == [["mkdir", "-p", "/m/nvbench-fio"]], "nothing laid out through nvstack"
        (mkdir, prefill) = inv.pre_lower(Path("/lower/data"))
        assert prefill[:2] == ["fio", "--name=prefill"] and "--size=1342177280" in prefill
    exp = EXPERIMENTS["nbw"]
    assert exp.devices == ["hdd-7200", "ssd"] and exp.baseline == "ext4-ordered"
    modes = []
    for name in exp.fs[1:]:
        args = CONFIGS[name].nvstack["args"]
        # The NVRAM path: with passthrough on, a never-fsynced file never reaches nvstack.
        assert args[:2] == ["--passthrough", "off"] and args[2] == "--nbw"
        modes.append(args[3])
    assert modes == ["off", "async-fg", "async-bg", "lazy"]


def test_bonnie_twice_memory():
    (v, p), = bonnie.variants("thesis", 0.25, 256 << 20)
    assert v == "file=512M" and p["ram_mb"] == 256 and p["scale"] == 0.25
    inv = bonnie.invocation(p, Path("/m"), Path("/r"))
    # file = 2 x M, 8 KiB chunks, and a seek phase of 16 seeks by 1 process (in no figure)
    assert inv.argv[:5] == ["bonnie++", "-d", "/m/nvbench-bonnie", "-s", "512M:8192:16:1"]
    assert "-q" in inv.argv and ["-n", "0"] == inv.argv[inv.argv.index("-n"):inv.argv.index("-n") + 2]


def test_fio_fuse_tax_jobs_and_prefill():
    (_, p), = fio.variants("tax-rand-write", 1.0)
    job = fio.job_file(p, Path("/m/nvbench-fio"))
    assert "bs=4k" in job and "size=1073741824" in job and "runtime=20" in job
    assert "end_fsync=1" in job and "direct=0" in job
    inv = fio.invocation(p, Path("/m"), Path("/r"))
    assert inv.pre[1][:2] == ["fio", "--name=prefill"]
    assert "--size=1073741824" in inv.pre[1] and "--filename=tax.dat" in inv.pre[1]
    (_, w), = fio.variants("tax-seq-write", 1.0)
    assert len(fio.invocation(w, Path("/m"), Path("/r")).pre) == 1   # a new file: no prefill


def test_postmark_fuse_tax():
    (v, p), = postmark.variants("fuse-tax", 1.0)
    assert v == "files=10000" and p["transactions"] == 150_000 and p["subdirectories"] == 100
