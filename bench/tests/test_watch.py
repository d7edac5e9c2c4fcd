"""watch.py: the sampler beside a run's timed command sees the run's processes, their CPU
and what their threads sleep in, and measures the longest span in which none used CPU."""

import subprocess
import sys
import time

from nvbench import watch


def _spawn(code: str, marker: str) -> subprocess.Popen:
    # the marker is an argument, so the process' command line names it as a run's path would
    return subprocess.Popen([sys.executable, "-c", code, marker])


def test_a_sleeping_process_is_still_and_its_wait_is_named(tmp_path):
    marker = str(tmp_path / "run-sleeping")
    proc = _spawn("import time; time.sleep(30)", marker)
    try:
        time.sleep(0.3)   # past the interpreter's start-up CPU
        w = watch.Watch(tmp_path / "progress.tsv", [marker], interval=0.2)
        w.start()
        time.sleep(2.0)
        out = w.stop()
    finally:
        proc.kill()
        proc.wait()
    lines = (tmp_path / "progress.tsv").read_text().splitlines()
    assert lines[0].startswith("t_s\tdirty_kB") and len(lines) - 1 == out["samples"] >= 5
    assert all(f"{proc.pid}:python" in line for line in lines[1:])
    assert out["longest_still_s"] >= 1.0
    # a sleeping Python thread waits in the kernel's sleep, never "running"
    assert out["still_waits"] and "running" not in out["still_waits"]


def test_a_busy_process_is_never_still_and_other_processes_are_not_watched(tmp_path):
    marker = str(tmp_path / "run-busy")
    proc = _spawn("while True: pass", marker)
    other = _spawn("import time; time.sleep(30)", str(tmp_path / "another-run"))
    try:
        w = watch.Watch(tmp_path / "progress.tsv", [marker], interval=0.2)
        w.start()
        time.sleep(1.5)
        out = w.stop()
    finally:
        for p in (proc, other):
            p.kill()
            p.wait()
    text = (tmp_path / "progress.tsv").read_text()
    assert f"{proc.pid}:" in text and f"{other.pid}:" not in text
    assert out["samples"] >= 4 and out["longest_still_s"] == 0.0 and out["still_waits"] == {}


def test_nothing_to_watch_is_not_a_stall(tmp_path):
    w = watch.Watch(tmp_path / "progress.tsv", [str(tmp_path / "no-such-run")], interval=0.1)
    w.start()
    time.sleep(0.5)
    out = w.stop()
    assert out["samples"] >= 3 and out["longest_still_s"] == 0.0
