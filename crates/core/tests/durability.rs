//! Durability calls at NVRAM speed (engine/durability.rs): fsync, fdatasync and fsync of a
//! directory wait for the lower file system only when something they cover went to it
//! directly. Each scenario acknowledges a durability call, then crashes both the region (only
//! what was persisted survives) and the lower file system (only what it was asked to make
//! durable survives), recovers, and finds what was acknowledged; the counters say whether the
//! call waited for the lower file system.

use std::ffi::OsStr;
use std::sync::Arc;

use engine::{CacheConfig, Engine, EngineConfig, Nbw, Share, TempConfig};
use lower::{Creds, LowerFs, MemLower};
use nvram::{CrashMode, FormatParams, SimRegion};
use txn::{Consistency, Pool};

const ROOT: Creds = Creds { uid: 0, gid: 0, groups: Vec::new() };

fn name(s: &str) -> &OsStr {
    OsStr::new(s)
}

fn params() -> FormatParams {
    FormatParams {
        region_size: 12288 + 4 * 65536 + 4096 + 256 * 4096,
        undo_slots: 4,
        undo_slot_size: 65536,
    }
}

fn start(lower: &MemLower, region: &Arc<SimRegion>, config: EngineConfig) -> Engine<MemLower> {
    let (pool, _) = Pool::open(region.clone(), Consistency::Undo).unwrap();
    Engine::new(lower.clone(), pool, config).unwrap()
}

fn fresh(config: &EngineConfig) -> (MemLower, Arc<SimRegion>, Engine<MemLower>) {
    let lower = MemLower::default();
    let region = Arc::new(SimRegion::new(params().region_size));
    Pool::format(&*region, params()).unwrap();
    let engine = start(&lower, &region, config.clone());
    (lower, region, engine)
}

/// A power cut now: the region keeps what was persisted, the lower file system what it was
/// asked to make durable. An engine recovered over both.
fn crash(lower: &MemLower, region: &SimRegion, config: EngineConfig) -> Engine<MemLower> {
    let image = region.crash_image(CrashMode::DropAll);
    start(&lower.crash(), &Arc::new(SimRegion::from_image(image)), config)
}

fn read(e: &Engine<MemLower>, dir: u64, n: &str) -> Vec<u8> {
    let entry = e.lookup(dir, name(n)).unwrap();
    let fh = e.open(entry.node_id, libc::O_RDONLY).unwrap();
    let mut out = Vec::new();
    e.read(fh, 0, 1 << 20, |d| out.extend_from_slice(d)).unwrap();
    e.release(fh).unwrap();
    out
}

fn waited(e: &Engine<MemLower>) -> u64 {
    e.stats().fsync.waited_on_lower
}

/// Temp files and the page cache on, where the mount's defaults differ as these scenarios were
/// written: temp files may take the whole region, a writer past the high watermark writes back
/// in its own request (no background writer), partial writes patch lazily, and every open is
/// on the NVRAM path (no kernel passthrough: its fsync would wait for the lower file system).
fn temp_and_cache() -> EngineConfig {
    EngineConfig {
        temp: TempConfig { share: Share::Percent(100), ..TempConfig::default() },
        cache: CacheConfig { background: false, nbw: Nbw::Lazy, ..CacheConfig::default() },
        passthrough: false,
        ..EngineConfig::default()
    }
}

/// Temp files and the page cache off, every open on the NVRAM path.
fn write_through() -> EngineConfig {
    EngineConfig {
        temp: TempConfig { enabled: false, ..TempConfig::default() },
        cache: CacheConfig { enabled: false, ..CacheConfig::default() },
        passthrough: false,
        ..EngineConfig::default()
    }
}

#[test]
fn fsync_of_a_cached_file_waits_for_nothing_and_survives_a_power_cut() {
    let config = temp_and_cache();
    let (lower, region, e) = fresh(&config);
    // An existing lower file, durable.
    let (_, _, f) = lower.create(&ROOT, lower.root(), name("db"), 0o644, libc::O_RDWR).unwrap();
    lower.write(&f, 0, &[1u8; 8192]).unwrap();
    lower.sync_all();
    let root = e.root_id();
    let entry = e.lookup(root, name("db")).unwrap();
    let fh = e.open(entry.node_id, libc::O_RDWR).unwrap();
    e.write(fh, 100, b"committed row", false).unwrap();
    e.fsync(fh, true).unwrap();
    assert_eq!(waited(&e), 0, "the dirty page is in NVRAM: nothing to wait for");
    assert_eq!(e.stats().fsync.calls, 1);
    let after = crash(&lower, &region, config);
    let content = read(&after, after.root_id(), "db");
    assert_eq!(&content[100..113], b"committed row");
    assert_eq!(content.len(), 8192);
}

#[test]
fn the_mail_delivery_pattern_waits_for_nothing_and_survives_a_power_cut() {
    let config = temp_and_cache();
    let (lower, region, e) = fresh(&config);
    lower.mkdir(&ROOT, lower.root(), name("tmp"), 0o755).unwrap();
    lower.mkdir(&ROOT, lower.root(), name("new"), 0o755).unwrap();
    lower.sync_all();
    let root = e.root_id();
    let tmp = e.lookup(root, name("tmp")).unwrap().node_id;
    let new = e.lookup(root, name("new")).unwrap().node_id;
    for i in 0..5 {
        let msg = format!("message {i}");
        let (_, fh) = e.create(&ROOT, tmp, name(&msg), 0o600, libc::O_WRONLY).unwrap();
        e.write(fh, 0, msg.as_bytes(), false).unwrap();
        e.fsync(fh, false).unwrap();
        e.release(fh).unwrap();
        e.rename(tmp, name(&msg), new, name(&msg), 0).unwrap();
        let dh = e.opendir(new).unwrap();
        e.fsyncdir(dh, false).unwrap();
        e.releasedir(dh).unwrap();
    }
    assert_eq!(waited(&e), 0, "temp files and their names are in NVRAM");
    assert_eq!(e.stats().fsync.calls, 10);
    let after = crash(&lower, &region, config);
    let new = after.lookup(after.root_id(), name("new")).unwrap().node_id;
    for i in 0..5 {
        let msg = format!("message {i}");
        assert_eq!(read(&after, new, &msg), msg.as_bytes(), "{msg} delivered");
    }
}

#[test]
fn written_through_data_and_lower_namespace_changes_make_fsync_wait_once() {
    let config = write_through();
    let (lower, region, e) = fresh(&config);
    let root = e.root_id();
    let (entry, fh) = e.create(&ROOT, root, name("log"), 0o644, libc::O_RDWR).unwrap();
    e.write(fh, 0, b"first", false).unwrap();
    e.fsync(fh, false).unwrap();
    assert_eq!(waited(&e), 1, "written through: the lower file system must sync");
    e.fsync(fh, false).unwrap();
    assert_eq!(waited(&e), 1, "nothing changed since: no second wait");
    let d = e.mkdir(&ROOT, root, name("d"), 0o755).unwrap();
    let dh = e.opendir(root).unwrap();
    e.fsyncdir(dh, false).unwrap();
    assert_eq!(waited(&e), 1, "a lower mkdir is in the metadata journal: nothing to wait for");
    // The write-through fsync checkpointed the journal (the create's record went with it).
    assert_eq!(e.stats().journal.records, 1, "the mkdir");
    e.releasedir(dh).unwrap();
    e.release(fh).unwrap();
    e.forget(entry.node_id, 1);
    e.forget(d.node_id, 1);
    let after = crash(&lower, &region, config);
    assert_eq!(read(&after, after.root_id(), "log"), b"first");
    assert!(after.lookup(after.root_id(), name("d")).is_ok(), "the journaled mkdir is replayed");
    assert_eq!(after.stats().journal.replayed_at_mount, 1, "the mkdir, lost by the lower");
}

#[test]
fn without_the_journal_a_lower_namespace_change_makes_fsyncdir_wait() {
    let config = write_through();
    let lower = MemLower::default();
    let region = Arc::new(SimRegion::new(params().region_size));
    Pool::format(&*region, params()).unwrap();
    let (pool, _) = Pool::open(region.clone(), Consistency::None).unwrap();
    let e = Engine::new(lower.clone(), pool, config).unwrap();
    assert!(!e.stats().journal.enabled, "no journal without crash-consistent NVRAM");
    let root = e.root_id();
    let d = e.mkdir(&ROOT, root, name("d"), 0o755).unwrap();
    let dh = e.opendir(root).unwrap();
    e.fsyncdir(dh, false).unwrap();
    assert_eq!(waited(&e), 1, "a lower mkdir: the directory must sync");
    e.fsyncdir(dh, false).unwrap();
    assert_eq!(waited(&e), 1, "nothing changed since");
    e.releasedir(dh).unwrap();
    e.forget(d.node_id, 1);
    let crashed = lower.crash();
    assert!(crashed.lookup(crashed.root(), name("d")).is_ok(), "the synced mkdir is durable");
}

#[test]
fn a_journaled_rename_survives_a_power_cut_without_any_lower_sync() {
    let config = temp_and_cache();
    let (lower, region, e) = fresh(&config);
    let (_, _, f) = lower.create(&ROOT, lower.root(), name("old"), 0o644, libc::O_RDWR).unwrap();
    lower.write(&f, 0, b"contents").unwrap();
    lower.sync_all();
    let root = e.root_id();
    e.mkdir(&ROOT, root, name("archive"), 0o755).unwrap();
    let archive = e.lookup(root, name("archive")).unwrap().node_id;
    e.rename(root, name("old"), archive, name("kept"), 0).unwrap();
    let dh = e.opendir(archive).unwrap();
    e.fsyncdir(dh, false).unwrap();
    e.releasedir(dh).unwrap();
    assert_eq!(waited(&e), 0, "journaled: the lower file system was not asked");
    let syncs_before = e.stats().fsync.lower_syncfs;
    let after = crash(&lower, &region, config);
    assert!(after.stats().journal.replayed_at_mount >= 2, "mkdir and rename replayed");
    let archive = after.lookup(after.root_id(), name("archive")).unwrap().node_id;
    assert_eq!(read(&after, archive, "kept"), b"contents");
    assert!(after.lookup(after.root_id(), name("old")).is_err());
    assert_eq!(syncs_before, 1, "only the start's syncfs before the crash");
}

#[test]
fn a_clean_file_after_start_needs_no_sync() {
    let config = write_through();
    let (lower, _region, e) = fresh(&config);
    let (_, _, f) = lower.create(&ROOT, lower.root(), name("old"), 0o644, libc::O_RDWR).unwrap();
    lower.write(&f, 0, b"before the mount").unwrap();
    // Not synced by whoever wrote it; the engine's start syncs the lower file system (D1).
    let e2 = {
        drop(e);
        let region = Arc::new(SimRegion::new(params().region_size));
        Pool::format(&*region, params()).unwrap();
        start(&lower, &region, config.clone())
    };
    let entry = e2.lookup(e2.root_id(), name("old")).unwrap();
    let fh = e2.open(entry.node_id, libc::O_RDONLY).unwrap();
    e2.fsync(fh, false).unwrap();
    assert_eq!(waited(&e2), 0);
    assert_eq!(read_lower_durable(&lower, "old"), b"before the mount", "start synced it");
}

fn read_lower_durable(lower: &MemLower, n: &str) -> Vec<u8> {
    let crashed = lower.crash();
    let (node, attr) = crashed.lookup(crashed.root(), name(n)).unwrap();
    let f = crashed.open(&node, libc::O_RDONLY).unwrap();
    let mut buf = vec![0u8; attr.size as usize];
    crashed.read(&f, 0, &mut buf).unwrap();
    buf
}

// --- `--fsync-requests spare` (E2 in base/durability.rs) ---------------------------------------

fn spare(config: EngineConfig) -> EngineConfig {
    EngineConfig { fsync_requests: engine::FsyncRequests::Spare, ..config }
}

fn lower_file(lower: &MemLower, n: &str, byte: u8, len: usize) {
    let (_, _, f) = lower.create(&ROOT, lower.root(), name(n), 0o644, libc::O_RDWR).unwrap();
    lower.write(&f, 0, &vec![byte; len]).unwrap();
}

fn open_rw(e: &Engine<MemLower>, n: &str) -> (u64, u64) {
    let node = e.lookup(e.root_id(), name(n)).unwrap().node_id;
    (node, e.open(node, libc::O_RDWR).unwrap())
}

fn size(e: &Engine<MemLower>, n: &str) -> u64 {
    e.lookup(e.root_id(), name(n)).unwrap().attr.size
}

type Act = fn(&Engine<MemLower>);
type Survived = fn(&Engine<MemLower>) -> bool;

/// Every change that reaches the lower file system outside NVRAM, made with no fsync after
/// it: with `spare` no fsync request will ever come, so the operation itself must have made
/// it durable (E2). Each row is run in both modes and crashed: with `spare` the change
/// survives the power cut, with `forward` (nothing asked the lower file system) it is lost -
/// the row really exercises a change E1 alone leaves to a later fsync.
const SPARE_ROWS: &[(&str, Act, Survived)] = &[
    (
        "a write written through",
        |e| {
            let (_, fh) = open_rw(e, "a");
            e.write(fh, 0, b"new", false).unwrap();
            e.release(fh).unwrap();
        },
        |e| read(e, e.root_id(), "a").starts_with(b"new"),
    ),
    (
        "fallocate past the end",
        |e| {
            let (_, fh) = open_rw(e, "a");
            e.fallocate(fh, 0, 0, 20_000).unwrap();
            e.release(fh).unwrap();
        },
        |e| size(e, "a") == 20_000,
    ),
    (
        "a truncate by path",
        |e| {
            let node = e.lookup(e.root_id(), name("a")).unwrap().node_id;
            let set = lower::SetAttr { size: Some(100), ..lower::SetAttr::default() };
            e.setattr(node, None, &set, false).unwrap();
        },
        |e| size(e, "a") == 100,
    ),
    (
        "a truncate through a handle",
        |e| {
            let (node, fh) = open_rw(e, "a");
            let set = lower::SetAttr { size: Some(10), ..lower::SetAttr::default() };
            e.setattr(node, Some(fh), &set, false).unwrap();
            e.release(fh).unwrap();
        },
        |e| size(e, "a") == 10,
    ),
    (
        "copy_file_range between lower files",
        |e| {
            let (_, src) = open_rw(e, "b");
            let (_, dst) = open_rw(e, "a");
            assert_eq!(e.copy_file_range(src, 0, dst, 0, 4096).unwrap(), 4096);
            e.release(src).unwrap();
            e.release(dst).unwrap();
        },
        |e| read(e, e.root_id(), "a")[..4096].iter().all(|&b| b == 2),
    ),
    (
        "an extended attribute too large for a journal record",
        |e| {
            let node = e.lookup(e.root_id(), name("a")).unwrap().node_id;
            e.setxattr(node, name("user.big"), &[7u8; 3500], 0).unwrap();
            assert_eq!(e.stats().journal.not_journaled, 1, "the row's premise");
        },
        |e| {
            let node = e.lookup(e.root_id(), name("a")).unwrap().node_id;
            e.getxattr(node, name("user.big"), 4096).is_ok_and(|v| v == [7u8; 3500])
        },
    ),
];

#[test]
fn with_fsync_requests_spared_every_lower_change_is_durable_when_its_operation_returns() {
    for &(row, act, survived) in SPARE_ROWS {
        for spared in [true, false] {
            let config = if spared { spare(write_through()) } else { write_through() };
            let (lower, region, e) = fresh(&config);
            lower_file(&lower, "a", 1, 8192);
            lower_file(&lower, "b", 2, 4096);
            lower.sync_all();
            act(&e);
            let s = e.stats().fsync;
            if spared {
                assert!(s.eager_syncs >= 1, "{row}: synced by its own operation");
                assert_eq!(s.unsynced_objects, 0, "{row}: E2 - nothing left for an fsync");
                assert_eq!(s.requests, "spare");
            } else {
                assert_eq!(s.eager_syncs, 0, "{row}");
                assert!(s.unsynced_objects >= 1, "{row}: left to an fsync (E1)");
            }
            let after = crash(&lower, &region, config);
            assert_eq!(survived(&after), spared, "{row}: spared {spared}");
        }
    }
}

#[test]
fn spared_fsync_requests_need_undo_mode_and_turn_passthrough_off() {
    for consistency in [Consistency::Journal, Consistency::None] {
        let region = Arc::new(SimRegion::new(params().region_size));
        Pool::format(&*region, params()).unwrap();
        let (pool, _) = Pool::open(region.clone(), consistency).unwrap();
        let err = Engine::new(MemLower::default(), pool, spare(EngineConfig::default()))
            .expect_err("refused");
        assert!(err.to_string().contains("needs --consistency undo"), "{consistency:?}: {err}");
    }
    let (_, _, e) = fresh(&spare(EngineConfig::default()));
    assert!(!e.passthrough_enabled(), "a passthrough file's fsync must reach the lower file");
    assert!(e.spares_fsync());
    assert_eq!(e.stats().fsync.spared, 1);
    let (_, _, e) = fresh(&EngineConfig::default());
    assert!(!e.spares_fsync(), "forward: every fsync is served");
    assert_eq!(e.stats().fsync.spared, 0);
}

#[test]
fn sync_commits_journal_modes_group_and_syncs_the_lower_file_system() {
    let region = Arc::new(SimRegion::new(params().region_size));
    Pool::format(&*region, params()).unwrap();
    let (pool, _) = Pool::open(region.clone(), Consistency::Journal).unwrap();
    let lower = MemLower::default();
    let e = Engine::new(lower.clone(), pool, temp_and_cache()).unwrap();
    let (entry, fh) = e.create(&ROOT, e.root_id(), name("f"), 0o644, libc::O_RDWR).unwrap();
    e.write(fh, 0, b"x\n", false).unwrap();
    e.release(fh).unwrap();
    e.forget(entry.node_id, 1);
    let commits = e.stats().journal.group.group_commits;
    let syncfs = e.stats().fsync.lower_syncfs;
    e.sync_all().unwrap();
    let s = e.stats();
    assert_eq!(s.journal.group.group_commits, commits + 1, "the open group committed");
    assert_eq!(s.fsync.lower_syncfs, syncfs + 1);
    assert_eq!(s.fsync.sync_requests, 1);
    // A power cut right after: the file is there (the group was durable).
    let image = region.crash_image(CrashMode::DropAll);
    let (pool, _) =
        Pool::open(Arc::new(SimRegion::from_image(image)), Consistency::Journal).unwrap();
    let after = Engine::new(lower.crash(), pool, temp_and_cache()).unwrap();
    assert_eq!(read(&after, after.root_id(), "f"), b"x\n");
}
