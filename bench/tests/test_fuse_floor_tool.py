"""bench/tools/fuse-floor's application loops (`--workload`) without a mount: each workload
runs durable.py in a plain directory and comes back as microseconds per operation and a count
that agree with each other (the mounts themselves need root and are not in the suite)."""

import importlib.machinery
import importlib.util
import time
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[1] / "tools" / "fuse-floor"


def load_tool():
    loader = importlib.machinery.SourceFileLoader("fuse_floor", str(TOOL))
    spec = importlib.util.spec_from_loader("fuse_floor", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@pytest.mark.parametrize("workload", ["maildir", "applog", "sqlite-wal", "sqlite-delete", "files"])
def test_a_workload_loop_reports_its_time_per_operation_after_its_untimed_init(tmp_path,
                                                                               workload):
    tool = load_tool()
    marks = []
    us, n = tool.app_loop(tmp_path / "w", workload, 0.3, lambda: marks.append(time.monotonic()))
    end = time.monotonic()
    assert len(marks) == 1, "the mark comes once, between --init and the timed loop"
    assert n > 0 and us > 0
    # n operations at `us` each are the loop's own time: at least the 0.3 s asked for (it stops
    # at the first check past its deadline), and within what passed after the mark, so the
    # untimed init is not in it. (No upper bound near 0.3 s: one fsync on a loaded machine's
    # disk can take longer than the whole loop.)
    assert 0.3 - 1e-3 <= n * us / 1e6 <= end - marks[0]
    if workload == "maildir":
        assert len(list((tmp_path / "w" / "nvbench-maildir" / "new").iterdir())) == n
    if workload == "files":
        assert len(list((tmp_path / "w" / "nvbench-files" / "files").iterdir())) == n

