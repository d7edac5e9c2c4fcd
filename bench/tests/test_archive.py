"""Raw runs kept in git as OUT/raw.tar.xz, and bench/run without its plotting modules."""

import shutil
import subprocess
import sys
import tarfile

import pytest

from nvbench import archive, cli
from nvbench.util import BenchError

from test_pipeline import make_run


@pytest.fixture
def resultdir(tmp_path, samples):
    for rep in (1, 2):
        make_run(tmp_path, "ext2", rep, 10.0 + rep, samples / "postmark_verbose.txt")
    return tmp_path


def test_pack_is_deterministic_and_unpack_restores_the_runs(resultdir, tmp_path_factory):
    path = archive.pack(resultdir)
    assert path == resultdir / "raw.tar.xz"
    first = path.read_bytes()
    assert archive.pack(resultdir).read_bytes() == first, "same runs, same bytes (no git churn)"
    with tarfile.open(path) as tar:
        names = tar.getnames()
        assert all(n == "runs" or n.startswith("runs/") for n in names)
        assert {m.mtime for m in tar.getmembers()} == {archive._MTIME}
    copy = tmp_path_factory.mktemp("copy")
    shutil.copy(path, copy / "raw.tar.xz")
    assert archive.unpack(copy)
    before = sorted(p.relative_to(resultdir) for p in (resultdir / "runs").rglob("*"))
    assert sorted(p.relative_to(copy) for p in (copy / "runs").rglob("*")) == before
    assert not archive.unpack(copy), "existing runs/ are never overwritten"


def test_parse_unpacks_the_archive_when_runs_are_missing(resultdir, capsys):
    archive.pack(resultdir)
    shutil.rmtree(resultdir / "runs")
    assert cli.main(["parse", str(resultdir)]) == 0
    assert "unpacked" in capsys.readouterr().out
    assert (resultdir / "exp.csv").exists()


def test_an_archive_with_other_members_is_refused(tmp_path):
    (tmp_path / "evil").write_text("x")
    with tarfile.open(tmp_path / "raw.tar.xz", "w:xz") as tar:
        tar.add(tmp_path / "evil", arcname="../evil")
    with pytest.raises(BenchError, match="unexpected members"):
        archive.unpack(tmp_path)
    assert not (tmp_path / "runs").exists()


def test_raw_runs_under_bench_results_are_ignored_by_git():
    root = cli.BENCH_DIR.parent
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("not a git checkout")
    for path in ("bench/results/some-exp/runs/some-exp/x/rep1/stdout.txt",
                 "bench/results/writeback-policies/fio/runs/a/b",
                 "bench/results/fuse-tax/analysis/postmark/nvstack-none/rep1/wall.txt"):
        assert subprocess.run(["git", "-C", str(root), "check-ignore", "-q", path]).returncode == 0, path
    for path in ("bench/results/some-exp/raw.tar.xz", "bench/results/some-exp/summary.md",
                 "bench/results/some-exp/some-exp.csv"):
        assert subprocess.run(["git", "-C", str(root), "check-ignore", "-q", path]).returncode == 1, path


def test_without_matplotlib_bench_run_says_what_to_install(monkeypatch, tmp_path, capsys,
                                                          resultdir):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    # As on a fresh checkout: nvbench.plot (which imports matplotlib) not loaded yet.
    monkeypatch.delitem(sys.modules, "nvbench.plot", raising=False)
    monkeypatch.delattr(sys.modules["nvbench"], "plot", raising=False)
    out = tmp_path / "smoke"
    assert cli.main(["run", "smoke", "--dry-run", "--out", str(out)]) == 2
    assert not out.exists(), "refused before anything ran"
    assert cli.main(["plot", str(resultdir)]) == 2
    dur = tmp_path / "durability"
    assert cli.main(["durability", "--parts", "recovery", "--out", str(dur)]) == 2
    assert not dur.exists(), "refused before anything ran"
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all("matplotlib is missing" in e and "bench/install.sh" in e
                                 for e in err), err
    # Stages that do not plot still work.
    assert cli.main(["parse", str(resultdir)]) == 0
    assert cli.main(["run", "smoke", "--dry-run", "--no-plot", "--out", str(out),
                     "--device", "none", "--workdir", str(tmp_path / "w")]) == 0
