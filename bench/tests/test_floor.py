"""The FUSE round trip a run set records (nvbench/floor.py): parsing fuse-floor's CSV, the
sentence the summaries print, and when it is measured at all (no root, nothing mounted)."""

import dataclasses

import pytest

from nvbench import floor, nvstack, runner
from nvbench.experiments import EXPERIMENTS


def test_the_round_trip_is_the_mount_minus_the_lower_call(tmp_path):
    csv = tmp_path / "floor.csv"
    csv.write_text("round,config,us_per_call,daemon_cpu_us\n"
                   "1,lower,1.16,\n1,nvstack,33.17,25.0\n1,nvstack-spin0,33.72,16.6\n")
    got = floor.parse(csv)
    assert got == {"round_trip_us": 32.01, "round_trip_spin0_us": 32.56, "lower_us": 1.16,
                   "calls": floor.CALLS}


def test_the_summaries_say_it_before_and_after_and_say_a_failure():
    meta = {"fuse_floor": {"start": {"round_trip_us": 32.0, "round_trip_spin0_us": 32.5},
                           "end": {"error": "fuse-floor: nvstack did not mount"}}}
    text = floor.text(meta)
    assert "32.0 us at the start (32.5 without the spinning reader)" in text
    assert "not measured at the end (fuse-floor: nvstack did not mount)" in text
    assert floor.text({}) == ""
    assert floor.text({"fuse_floor": {}}) == ""


def test_a_failing_tool_is_an_error_entry_not_an_exception(tmp_path, monkeypatch):
    monkeypatch.setattr(floor, "TOOL", tmp_path / "no-such-tool")
    got = floor.measure("/bin/false", tmp_path)
    assert set(got) == {"error"} and got["error"]
    assert not list(tmp_path.glob("fuse-floor-*")), "its directory is removed"


class Caps:
    binary, mount = "/opt/nvstack", True


@pytest.mark.parametrize("exp_name, dry_run, want_floor, expected", [
    ("showcase", False, True, "/opt/nvstack"),          # nvstack configurations: measured
    ("showcase", True, True, None),                     # a dry run mounts nothing
    ("showcase", False, False, None),                   # --no-floor
    ("nvfat", False, True, None),                       # no nvstack configuration
])
def test_it_is_measured_only_for_real_runs_with_nvstack(tmp_path, monkeypatch, exp_name, dry_run,
                                                        want_floor, expected):
    monkeypatch.setattr(nvstack, "probe", lambda refresh=False: Caps())
    st = runner.Settings(out=tmp_path, device="none", dry_run=dry_run, floor=want_floor)
    exp = dataclasses.replace(EXPERIMENTS[exp_name])
    assert runner._floor_binary(exp, st) == expected
