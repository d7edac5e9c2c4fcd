"""Parsers on real tool outputs (tests/samples/README.md says how each was produced)."""

import json

import pytest

from nvbench import parse


def test_postmark_verbose(samples):
    m = parse.parse_postmark((samples / "postmark_verbose.txt").read_text())
    assert m["pm_total_seconds"] == 1.0
    assert m["pm_transactions_per_second"] == 2000.0
    assert m["pm_files_created"] == 1440 and m["pm_files_deleted"] == 1440
    assert m["pm_files_read"] == 1004 and m["pm_files_appended"] == 993
    assert m["pm_bytes_read"] == pytest.approx(6.37 * 2**20)
    assert m["pm_bytes_written"] == pytest.approx(9.26 * 2**20)


def test_postmark_kilobytes_units(samples):
    m = parse.parse_postmark((samples / "postmark_tiny.txt").read_text())
    assert m["pm_bytes_read"] == pytest.approx(350.03 * 1024)
    assert m["pm_files_created"] == 100


def test_postmark_terse(samples):
    m = parse.parse_postmark((samples / "postmark_terse.txt").read_text())
    assert m["pm_total_seconds"] == 1.0
    assert m["pm_transactions_per_second"] == 2000.0
    assert m["pm_write_bytes_per_second"] > 0


def test_postmark_garbage():
    with pytest.raises(ValueError):
        parse.parse_postmark("postmark: cannot open file\n")


def test_bonnie_full(samples):
    m = parse.parse_bonnie((samples / "bonnie_2g.csv").read_text())
    assert m["put_char_kBps"] == 3051
    assert m["put_block_kBps"] == 365721
    assert m["rewrite_kBps"] == 3499539
    assert m["put_char_latency_us"] == 3655
    assert "get_block_kBps" not in m          # '+++++' = too fast to measure


def test_bonnie_too_fast_fields_omitted(samples):
    m = parse.parse_bonnie((samples / "bonnie_64m.csv").read_text())
    assert m["put_char_kBps"] == 3069
    assert "put_block_kBps" not in m and "rewrite_kBps" not in m


def test_bonnie_latency_units():
    assert parse._latency_us("12ms") == 12000
    assert parse._latency_us("3s") == 3e6
    assert parse._latency_us("") is None


def test_fio_seq_write(samples):
    text = (samples / "fio_seq_write.json").read_text()
    m = parse.parse_fio(text)
    job = json.loads(text)["jobs"][0]
    assert m["write_kBps"] == job["write"]["bw"]
    assert m["write_bytes"] == job["write"]["io_bytes"] > 0
    assert m["runtime_s"] == job["job_runtime"] / 1000
    assert m["read_iops"] == 0


def test_fio_two_jobs_summed(samples):
    text = (samples / "fio_nbw-random-readwrite.json").read_text()
    jobs = json.loads(text)["jobs"]
    m = parse.parse_fio("fio: some warning line\n" + text)   # leading noise is skipped
    assert len(jobs) == 2
    assert m["total_iops"] == pytest.approx(sum(j["read"]["iops"] + j["write"]["iops"] for j in jobs))
    assert m["read_iops"] > 0 and m["write_iops"] > 0
    assert m["write_clat_mean_us"] > 0


def test_fio_not_json():
    with pytest.raises(ValueError):
        parse.parse_fio("fio: failed to parse job file\n")


def test_device_stat_delta():
    before = {"requests": 10, "bytes_written": 4096, "busy_ms": 1.5, "model": "hdd-7200"}
    after = {"requests": 110, "bytes_written": 8192, "bytes_read": 512, "busy_ms": 11.5,
             "seek_distance_sectors": 1000, "model": "hdd-7200", "zones": {"hot": 3}}
    m = parse.parse_device_stat(before, after)
    assert m["dev_requests"] == 100 and m["dev_bytes_written"] == 4096
    assert m["dev_busy_ms"] == 10.0 and m["dev_bytes_read"] == 512
    assert m["dev_zones.hot"] == 3 and "dev_model" not in m


def test_nvstack_stat_flatten():
    m = parse.parse_nvstack_stat({"frames": {"dirty": 3, "free": 5}, "mode": "undo", "ok": True})
    assert m == {"nv_frames.dirty": 3.0, "nv_frames.free": 5.0}


def test_nvstack_stat_delta_of_counters_only():
    before = {"requests": {"write": 10, "lookup": 2}, "inodes": 7, "nvram": {"frames_free": 9,
              "transactions_committed": 12}}
    after = {"requests": {"write": 110, "lookup": 2, "read": 5}, "inodes": 9,
             "nvram": {"frames_free": 8, "transactions_committed": 120}}
    m = parse.parse_nvstack_stat(after, before)
    assert m["nv_requests.write"] == 100 and m["nv_requests.lookup"] == 0
    assert m["nv_requests.read"] == 5 and m["nv_nvram.transactions_committed"] == 108
    assert m["nv_inodes"] == 9 and m["nv_nvram.frames_free"] == 8     # gauges stay absolute
