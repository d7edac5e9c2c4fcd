//! The engine by scenario: the write/flush cycle, armed cuts, model time in account timing,
//! the flash counters, and the NVRAM cache paths (absorb, read, drain, cut and recovery,
//! metadata mode, LRW destage, discard).

use std::fs::File;

use super::*;
use crate::cache::CutMode;
use crate::model::presets::{ModelOverrides, Preset, build_model};
use crate::nvcache::{CacheMode, NvCache};

fn engine(dir: &std::path::Path, preset: Preset) -> Engine {
    let path = dir.join("img");
    let f = File::options().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
    f.set_len(1 << 20).unwrap();
    let act = Actuator::new(build_model(preset, &ModelOverrides::default(), 1 << 20).unwrap());
    let cfg = EngineConfig {
        timing: Timing::Account,
        volatile_bytes_max: 1 << 20,
        trace: Some(dir.join("trace")),
        histogram: Some(dir.join("hist")),
        lbn_bytes: 4096,
    };
    Engine::new(FileMedium::new(f, 1 << 20), act, &cfg).unwrap()
}

fn image(dir: &std::path::Path) -> Vec<u8> {
    std::fs::read(dir.join("img")).unwrap()
}

#[test]
fn write_flush_cycle_reaches_the_image_only_at_flush() {
    let d = tempfile::tempdir().unwrap();
    let mut e = engine(d.path(), Preset::Hdd15k);
    e.write(None, 4096, &[1u8; 4096]).unwrap();
    assert_eq!(e.read(None, 4096, 4096).unwrap().0, vec![1u8; 4096]);
    assert_eq!(image(d.path())[4096], 0);
    e.flush().unwrap();
    assert_eq!(image(d.path())[4096], 1);
    let s = e.stats();
    assert_eq!((s.requests, s.counters.bytes_written, s.counters.bytes_read), (3, 4096, 4096));
    assert!(s.busy_ns > 0);
    e.finish().unwrap();
    let trace = std::fs::read_to_string(d.path().join("trace")).unwrap();
    assert_eq!(trace.lines().count(), 4);
    let hist = std::fs::read_to_string(d.path().join("hist")).unwrap();
    assert!(hist.contains("\n1 1\n"));
}

#[test]
fn armed_cut_fires_after_the_given_flushes_and_writes() {
    let d = tempfile::tempdir().unwrap();
    let mut e = engine(d.path(), Preset::None);
    e.arm_cut(ArmedCut { flushes: 1, writes: 2, seed: 3, mode: CutMode::Drop }).unwrap();
    e.write(None, 0, &[1u8; 512]).unwrap();
    e.flush().unwrap(); // the one flush: durable
    e.write(None, 512, &[2u8; 512]).unwrap();
    e.write(None, 1024, &[3u8; 512]).unwrap();
    e.write(None, 1536, &[4u8; 512]).unwrap(); // cut happens before this one
    e.flush().unwrap();
    let s = e.stats();
    let cut = s.cut.expect("cut fired");
    assert_eq!((cut.held_sectors, cut.persisted_sectors), (2, 0));
    assert_eq!(s.counters.writes_after_cut, 1);
    e.finish().unwrap();
    let img = image(d.path());
    assert_eq!((img[0], img[512], img[1024], img[1536]), (1, 0, 0, 0));
}

#[test]
fn armed_cut_fires_at_the_next_flush_if_writes_do_not_run_out() {
    let d = tempfile::tempdir().unwrap();
    let mut e = engine(d.path(), Preset::None);
    e.arm_cut(ArmedCut { flushes: 0, writes: 100, seed: 0, mode: CutMode::Drop }).unwrap();
    e.write(None, 0, &[1u8; 512]).unwrap();
    e.flush().unwrap();
    assert!(e.is_off());
    e.finish().unwrap();
    assert_eq!(image(d.path())[0], 0);
}

#[test]
fn sequential_writes_cost_only_transfer_in_account_timing() {
    let d = tempfile::tempdir().unwrap();
    let mut e = engine(d.path(), Preset::Hdd15k);
    e.write(None, 0, &vec![0u8; 65536]).unwrap();
    let b0 = e.stats().busy_ns;
    e.write(None, 65536, &vec![0u8; 65536]).unwrap();
    let p = crate::model::presets::hdd_params(Preset::Hdd15k);
    assert_eq!(e.stats().busy_ns - b0, p.transfer_ns(128));
    assert_eq!(e.stats().seek_distance_sectors, 0);
}

#[test]
fn flash_counters_appear_in_stats_and_discards_trim_the_ftl() {
    let d = tempfile::tempdir().unwrap();
    let mut e = engine(d.path(), Preset::Flash);
    assert!(engine(d.path(), Preset::Hdd15k).stats().flash.is_none());
    // 1 MiB on the small-block chip: 64 logical blocks of 16 KiB (32 pages of 512 B).
    e.write(None, 0, &[7u8; 16384]).unwrap();
    e.write(None, 0, &[8u8; 16384]).unwrap(); // sequential overwrite: one switch merge
    let v = serde_json::to_value(e.stats()).unwrap();
    let f = &v["flash"];
    for (key, want) in [
        ("page_programs", 64),
        ("page_reads", 0),
        ("block_erases", 1),
        ("merges_switch", 1),
        ("merges_partial", 0),
        ("merges_full", 0),
    ] {
        assert_eq!(f[key].as_u64(), Some(want), "{key}: {f}");
    }
    assert!(f["energy_uj"].as_f64().unwrap() > 0.0);
    // A discard of bytes 100..400 holds no whole sector: the FTL trims nothing (the
    // cache still zeroes the bytes); a discard of the first 1024 bytes trims pages 0, 1.
    e.discard(100, 300).unwrap();
    assert_eq!(e.read(None, 0, 512).unwrap().0[..100], [8u8; 100]);
    let reads = |e: &Engine| e.stats().flash.unwrap().page_reads;
    assert_eq!(reads(&e), 1);
    e.discard(0, 1024).unwrap();
    e.read(None, 0, 1024).unwrap();
    assert_eq!(reads(&e), 1, "trimmed pages cost no NAND read");
    e.read(None, 1024, 512).unwrap();
    assert_eq!(reads(&e), 2);
}

fn with_nvram(
    dir: &std::path::Path,
    region: &std::sync::Arc<nvram::SimRegion>,
    capacity: Option<u64>,
    mode: CacheMode,
) -> Engine {
    let mut e = engine(dir, Preset::Hdd15k);
    let r: std::sync::Arc<dyn nvram::Region> = region.clone();
    let id = crate::nvcache::ImageId::of(&dir.join("img")).unwrap();
    let (c, rep) = NvCache::open(r, &id, capacity, Some(mode)).unwrap();
    e.attach_nvcache(c, rep, "sim".into()).unwrap();
    e
}

fn sim_region(capacity: u64) -> std::sync::Arc<nvram::SimRegion> {
    let p = crate::nvcache::format_params(capacity);
    let r = std::sync::Arc::new(nvram::SimRegion::new(p.region_size));
    txn::Pool::format(&*r, p).unwrap();
    r
}

#[test]
fn nvram_absorbs_serves_reads_and_drains_only_when_asked() {
    let d = tempfile::tempdir().unwrap();
    let region = sim_region(64);
    let mut e = with_nvram(d.path(), &region, Some(64), CacheMode::All);
    e.write(None, 8192, &[5u8; 4096]).unwrap();
    e.write(None, 8192 + 100, &[6u8; 10]).unwrap(); // partial sector: merged in NVRAM
    assert_eq!(e.stats().busy_ns, 0, "absorbed writes cost no disk time");
    let (data, _) = e.read(None, 8192, 4096).unwrap();
    assert_eq!(&data[..100], &[5u8; 100][..]);
    assert_eq!(&data[100..110], &[6u8; 10][..]);
    assert_eq!(e.stats().busy_ns, 0, "reads of resident sectors cost no disk time");
    e.flush().unwrap();
    assert_eq!(image(d.path())[8192], 0, "a flush does not destage");
    let v = serde_json::to_value(e.stats()).unwrap();
    let nv = &v["nvcache"];
    for (k, want) in
        [("hits", 8), ("writes_absorbed", 9), ("destaged", 0), ("bytes_resident", 4096)]
    {
        assert_eq!(nv[k].as_u64(), Some(want), "{k}: {nv}");
    }
    assert_eq!(e.drain().unwrap(), 8);
    assert_eq!(image(d.path())[8192 + 100], 6);
    assert!(e.stats().busy_ns > 0, "the drain is charged to the model");
    assert_eq!(e.stats().nvcache.unwrap().sectors_resident, 0);
}

#[test]
fn a_power_cut_keeps_the_nvram_cache_and_the_next_engine_recovers_it() {
    let d = tempfile::tempdir().unwrap();
    let region = sim_region(64);
    let mut e = with_nvram(d.path(), &region, Some(64), CacheMode::All);
    e.write(None, 0, &[7u8; 1024]).unwrap();
    e.cut(1, CutMode::Drop).unwrap();
    e.write(None, 1024, &[8u8; 512]).unwrap(); // power is off: lost
    e.finish().unwrap();
    assert_eq!(image(d.path())[0], 0, "the image alone lacks the cached sectors");
    let again = std::sync::Arc::new(nvram::SimRegion::from_image(
        region.crash_image(nvram::CrashMode::DropAll),
    ));
    let mut e = with_nvram(d.path(), &again, None, CacheMode::All);
    assert_eq!(e.read(None, 0, 1024).unwrap().0, vec![7u8; 1024]);
    assert_eq!(e.read(None, 1024, 512).unwrap().0, vec![0u8; 512]);
    assert_eq!(e.stats().nvcache.unwrap().recovered_sectors, 2);
    e.finish().unwrap();
    assert_eq!(image(d.path())[1023], 7, "a clean shutdown drains");
}

#[test]
fn metadata_mode_passes_unclassified_writes_to_the_volatile_cache() {
    let d = tempfile::tempdir().unwrap();
    let region = sim_region(64);
    let mut e = with_nvram(d.path(), &region, Some(64), CacheMode::Metadata);
    assert_eq!(e.filesystem(), "none");
    e.write(None, 4096, &[1u8; 4096]).unwrap();
    assert!(e.stats().busy_ns > 0);
    assert_eq!(e.stats().nvcache.unwrap().writes_absorbed, 0);
    e.cut(0, CutMode::Drop).unwrap();
    e.finish().unwrap();
    assert_eq!(image(d.path())[4096], 0, "volatile, lost by the cut");
}

#[test]
fn a_full_nvram_cache_destages_the_lrw_sector_charged_to_the_write() {
    let d = tempfile::tempdir().unwrap();
    let region = sim_region(2);
    let mut e = with_nvram(d.path(), &region, Some(2), CacheMode::All);
    e.write(None, 0, &[1u8; 512]).unwrap();
    e.write(None, 4096, &[2u8; 512]).unwrap();
    assert_eq!(e.stats().busy_ns, 0);
    e.write(None, 8192, &[3u8; 512]).unwrap();
    let s = e.stats();
    assert!(s.busy_ns > 0, "the destage write is modeled");
    let nv = s.nvcache.unwrap();
    assert_eq!((nv.destaged, nv.cache.destaged_full, nv.sectors_resident), (1, 1, 2));
    assert_eq!(image(d.path())[0], 1, "sector 0 was the least recently written");
    assert_eq!(image(d.path())[4096], 0);
}

#[test]
fn discard_frees_resident_sectors_and_zeroes_partial_ones() {
    let d = tempfile::tempdir().unwrap();
    let region = sim_region(64);
    let mut e = with_nvram(d.path(), &region, Some(64), CacheMode::All);
    e.write(None, 0, &[9u8; 2048]).unwrap();
    e.discard(256, 1024).unwrap(); // half of sector 0, all of sector 1, half of sector 2
    let (data, _) = e.read(None, 0, 2048).unwrap();
    assert_eq!(&data[..256], &[9u8; 256][..]);
    assert!(data[256..1280].iter().all(|&b| b == 0));
    assert_eq!(&data[1280..], &[9u8; 768][..]);
    let nv = e.stats().nvcache.unwrap();
    assert_eq!((nv.sectors_resident, nv.cache.discarded), (3, 1));
}

#[test]
fn writes_beyond_the_device_fail_with_enospc() {
    let d = tempfile::tempdir().unwrap();
    let mut e = engine(d.path(), Preset::None);
    let err = e.write(None, (1 << 20) - 10, &[0u8; 20]).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC));
}
