"""The load test's measurements and checks (nvbench/load.py), on real samples: a
/proc/PID/status, `nvstack stat --json` of a real load run at its end and after the flush, a
real fsx output. No root, no mounts."""

import copy
import json

import pytest

from nvbench import cli, load


def stat(samples, name):
    return json.loads((samples / name).read_text())


def test_parse_status(samples):
    st = load.parse_status((samples / "proc_status.txt").read_text())
    assert set(st) == {"VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem"}
    assert st["VmHWM"] >= st["VmRSS"] > 0 and st["VmRSS"] % 1024 == 0
    assert st["VmRSS"] == st["RssAnon"] + st["RssFile"] + st["RssShmem"]


def test_memory_check_bounded_and_growing():
    flat = [{"t": t, "RssAnon": (12 << 20) + (t % 3) * 4096, "VmHWM": 43 << 20,
             "VmRSS": 40 << 20, "RssShmem": 24 << 20} for t in range(0, 600)]
    m = load.memory_check(flat)
    assert m["ok"] and m["rss_anon_peak"] == (12 << 20) + 8192 and m["vm_hwm_peak"] == 43 << 20
    assert m["samples"] == 600
    leak = [{"t": t, "RssAnon": (12 << 20) + t * (100 << 10)} for t in range(0, 600)]
    m = load.memory_check(leak)
    assert not m["ok"] and m["rss_anon_peak_last_third"] > m["bound"]
    assert not load.memory_check(flat[:2])["ok"]


def test_error_check_real_end_of_run(samples):
    end = stat(samples, "nvstack_stat_load_end.json")
    e = load.error_check(end)
    # a real run: 1198 WRITE attempts found NVRAM full and were retried after pressure relief;
    # each aborted its transaction, so they are not errors an application saw
    assert e["aborts_by_kind"]["write_retries"] == 1198 == e["transactions_aborted"]
    assert e["ok"] and not e["data_path_errors"] and not e["errors_over_requests"]
    assert e["requests_total"] == sum(end["requests"].values())
    end["nvram"]["transactions_aborted"] = 1197          # a write error that was not a retry
    assert not load.error_check(end)["ok"]
    end["nvram"]["transactions_aborted"] = 1198
    end["errors"]["fsync"] = 1
    assert load.error_check(end)["data_path_errors"] == {"fsync": 1}
    end["errors"].pop("fsync")
    end["errors"]["mkdir"] = end["requests"]["mkdir"] + 1
    assert load.error_check(end)["errors_over_requests"] == {
        "mkdir": (end["requests"]["mkdir"] + 1, end["requests"]["mkdir"])}


def test_error_check_with_retries_counted_apart(samples):
    # since 2026-11-28 the retried attempts are `retries.write` and a write error is an answer
    end = stat(samples, "nvstack_stat_load_end.json")
    end["retries"] = {"write": end["errors"].pop("write")}
    e = load.error_check(end)
    assert e["ok"] and e["aborts_by_kind"]["write_retries"] == 1198 == e["transactions_aborted"]
    end["errors"]["write"] = 1
    assert load.error_check(end)["data_path_errors"] == {"write": 1}
    assert not load.error_check(end)["ok"]


def test_flush_tempfiles_and_pressure_checks(samples):
    end = stat(samples, "nvstack_stat_load_end.json")
    fl = stat(samples, "nvstack_stat_load_flushed.json")
    f = load.flush_check(fl)
    assert f["ok"] and f["frames_used"] == 0 and f["pages_dirty"] == 0
    t = load.tempfiles_check(fl)
    assert t["ok"] and t["created"] == t["deleted_in_nvram"] + t["transformed_total"]
    p = load.pressure_check({}, end)
    assert p["ok"] and p["pressure_transforms"] > 0 and p["pages_written_back"] > 0
    assert not load.pressure_check(end, end)["ok"]        # nothing happened in between
    bg = copy.deepcopy(end)                               # the background transformer moved
    bg["tempfiles"]["transformed"]["background"] = 5      # temp files instead of writers
    before = copy.deepcopy(end)
    before["tempfiles"]["transformed"]["background"] = 0
    before["writeback"]["rounds"]["pressure"] -= 1
    q = load.pressure_check(before, bg)
    assert q["ok"] and q["pressure_transforms"] == 0 and q["background_transforms"] == 5
    # the watermark's rounds in the daemon's background writer (the default) count as well;
    # none of either kind fails the check
    rounds = copy.deepcopy(end)
    rounds["writeback"]["rounds"].update(pressure=0, nvram_full=0, background=4)
    zero = copy.deepcopy(rounds)
    zero["writeback"]["rounds"]["background"] = 0
    r = load.pressure_check(zero, rounds)
    assert not r["ok"]                                    # no transform in between
    zero["tempfiles"]["transformed"]["pressure"] -= 1
    r = load.pressure_check(zero, rounds)
    assert r["ok"] and r["writeback_background_rounds"] == 4
    assert r["writeback_pressure_rounds"] == 0
    assert not load.pressure_check(rounds, rounds)["ok"]
    fl["writeback"]["pages_dirty"] = 3
    assert not load.flush_check(fl)["ok"]
    fl["tempfiles"]["created"] += 1                       # a temp file nobody accounts for
    assert not load.tempfiles_check(fl)["ok"]


def test_checks_of_a_run_with_background_transforms_and_a_route_profile(samples):
    end = stat(samples, "nvstack_stat_load_bg_end.json")
    fl = stat(samples, "nvstack_stat_load_bg_flushed.json")
    e = load.error_check(end)
    # a full NVRAM aborted writes (retried), creates (sent to the lower directory) and
    # journal records (applied without one): all answered without an error
    assert e["ok"] and e["transactions_aborted"] == 7781
    assert e["aborts_by_kind"] == {"write_retries": 1248, "creates_sent_down": 3385,
                                   "records_not_journaled": 3148, "fetches_failed": 0}
    end["tempfiles"]["created_in_lower_nvram_full"] -= 1  # an abort nobody accounts for
    assert not load.error_check(end)["ok"]
    p = load.pressure_check({}, stat(samples, "nvstack_stat_load_bg_end.json"))
    assert p["ok"] and p["pressure_transforms"] == 0 and p["background_transforms"] == 311092
    f = load.flush_check(fl)
    assert f["ok"] and f["frames_used"] == f["profile_frames"] == 1  # the route profile
    fl["nvram"]["frames_used"] = 2                         # anything else left in NVRAM
    assert not load.flush_check(fl)["ok"]
    fl["nvram"]["frames_used"] = 1
    fl["passthrough"]["profile_files"] = 0                 # no profile: nothing may be left
    assert not load.flush_check(fl)["ok"]


def test_error_check_of_a_run_with_async_bg_fetches_that_found_nvram_full(samples):
    # --nbw async-bg (the default since 2026-11-28): the background fetcher's merge of a
    # patched page aborts when it finds no frame (the patch stays). The three kinds the check
    # knew before missed exactly these 20; now every abort has its kind and its count.
    end = stat(samples, "nvstack_stat_load_asyncbg_end.json")
    assert end["nbw"]["mode"] == "async-bg"
    e = load.error_check(end)
    assert e["ok"] and e["aborts_unaccounted"] == 0 and "gap" not in e
    assert e["aborts_by_kind"] == {"write_retries": 1209, "creates_sent_down": 53,
                                   "records_not_journaled": 68, "fetches_failed": 20}
    assert e["transactions_aborted"] == 1350 == sum(e["aborts_by_kind"].values())
    end["nbw"]["fetches_failed"] = 0                      # the check as it was: 20 short
    e = load.error_check(end)
    assert not e["ok"] and e["aborts_unaccounted"] == 20
    assert e["gap"].startswith("20 of 1,350 aborted transactions are of no counted kind")


def test_every_abort_kind_has_its_counter_in_a_real_stat(samples):
    # A renamed or moved counter would read as 0 and show as unaccounted aborts: every
    # kind's counter is where the stat of today's nvstack has it.
    end = stat(samples, "nvstack_stat_load_asyncbg_end.json")
    for kind in load.ABORT_KINDS:
        d = end
        for k in kind.counter:
            assert k in d, f"{kind.name}: {'.'.join(kind.counter)} not in nvstack stat"
            d = d[k]
        assert isinstance(d, int) and d > 0, kind.name
    assert [k.name for k in load.ABORT_KINDS] == list(load.abort_kinds(end))


def _snapshot(aborted, write=0, creates=0, unjournaled=0, fetches=0, legacy=False):
    """A counter snapshot as `nvstack stat --json` has it, only what error_check reads."""
    s = {"requests": {"write": 100, "create": 10}, "errors": {},
         "nvram": {"transactions_aborted": aborted},
         "tempfiles": {"created_in_lower_nvram_full": creates},
         "journal": {"not_journaled": unjournaled}, "nbw": {"fetches_failed": fetches}}
    if legacy:                                            # before 2026-11-28
        s["errors"]["write"] = write
    else:
        s["retries"] = {"write": write} if write else {}
    return s


@pytest.mark.parametrize("snap, ok, unaccounted, gap", [
    (_snapshot(0), True, 0, None),
    (_snapshot(10, write=10), True, 0, None),
    (_snapshot(4799, write=4489, creates=80, unjournaled=163, fetches=67), True, 0, None),
    (_snapshot(67, fetches=67), True, 0, None),
    (_snapshot(5, write=2, legacy=True, fetches=3), True, 0, None),
    # the run of the issue, read by the check that knew three kinds
    (_snapshot(4799, write=4489, creates=80, unjournaled=163), False, 67,
     "67 of 4,799 aborted transactions are of no counted kind (not write_retries 4,489 + "
     "creates_sent_down 80 + records_not_journaled 163 + fetches_failed 0)"),
    (_snapshot(1), False, 1, "1 of 1 aborted transactions are of no counted kind"),
    # a kind's counter counted something that aborted nothing
    (_snapshot(3, write=3, unjournaled=1), False, -1,
     "the kinds count 1 more than the 3 aborted transactions"),
], ids=["idle", "writes", "issue-44-run", "fetches-only", "legacy-stat", "issue-44-three-kinds",
        "one-uncounted", "overcounted"])
def test_error_check_accounts_for_every_aborted_transaction_by_kind(snap, ok, unaccounted, gap):
    e = load.error_check(snap)
    assert e["ok"] is ok and e["aborts_unaccounted"] == unaccounted
    assert set(e["aborts_by_kind"]) == {"write_retries", "creates_sent_down",
                                        "records_not_journaled", "fetches_failed"}
    assert sum(e["aborts_by_kind"].values()) + unaccounted == e["transactions_aborted"]
    if gap is None:
        assert "gap" not in e
    else:
        assert e["gap"].startswith(gap), e["gap"]
    text = load.summary_text({**SUMMARY_RUN, "checks": {"errors": e}})
    assert f"| errors | {'yes' if ok else '**NO**'} |" in text
    assert "aborts_by_kind {'write_retries': " in text     # every kind, named, in the summary
    assert f"aborts_unaccounted {unaccounted:,}" in text


SUMMARY_RUN = {"status": "ok", "device": "hdd-7200", "timing": "account",
               "nvram_bytes": 32 << 20, "dirty_high": 50, "dirty_low": 30, "postmarks": 8,
               "fsx_processes": 2, "duration_s": 180.0, "wall_seconds": 185.4}


def test_fsx_check(samples):
    text = (samples / "fsx_ok.txt").read_text()
    assert load.fsx_operations(text) == 13981
    ok = {"name": "fsx-0", "exit": 0, "output": text, "operations": 13981}
    assert load.fsx_check([ok])["ok"]
    bad = {"name": "fsx-1", "exit": 1, "operations": None,
           "output": "READ BAD DATA: offset = 0x1000, size = 0x2000\nLOG DUMP (3 total "
                     "operations):\n"}
    r = load.fsx_check([ok, bad])
    assert not r["ok"] and [b["name"] for b in r["failed"]] == ["fsx-1"]
    sneaky = {**ok, "output": text + "\nsize mismatch\n"}       # exit 0 but a mismatch line
    assert not load.fsx_check([sneaky])["ok"]
    assert not load.fsx_check([])["ok"]


def test_postmark_config_and_cli(tmp_path):
    cfg = load.postmark_config(tmp_path / "pm-3", 3007)
    assert f"set location {tmp_path / 'pm-3'}" in cfg and "set seed 3007" in cfg
    assert cfg.rstrip().endswith("quit")
    args = cli.build_parser().parse_args(["load", "--out", str(tmp_path), "--duration", "30"])
    assert args.duration == 30.0 and args.postmarks == 8 and args.fsx_procs == 2
    assert args.nvram == "32M" and args.timing == "account"
    assert cli.main(["run", "load", "--out", str(tmp_path)]) == 2


def test_summary_text():
    r = {"status": "failed", "reason": "checks failed: errors", "device": "hdd-7200",
         "timing": "account", "nvram_bytes": 32 << 20, "dirty_high": 50, "dirty_low": 30,
         "postmarks": 8, "fsx_processes": 2, "duration_s": 600.0, "wall_seconds": 612.3,
         "checks": {"errors": {"ok": False, "errors_total": 5, "data_path_errors": {"write": 5}},
                    "memory": {"ok": True, "vm_hwm_peak": 45 << 20, "rss_shmem_peak": 25 << 20,
                               "rss_anon_peak": 14 << 20,
                               "rss_anon_peak_first_third": 13 << 20,
                               "rss_anon_peak_last_third": 14 << 20, "bound": 32 << 20}},
         "counters": {"requests_total": 123456}}
    text = load.summary_text(r)
    assert text.startswith("# Load test: FAILED (checks failed: errors)")
    assert "| errors | **NO** |" in text and "data_path_errors {'write': 5}" in text
    assert "peak VmHWM 45.0 MiB" in text and "requests_total 123,456" in text
