//! TempFFS behaviour at its boundaries, on the engine over the in-memory lower file system: a
//! full lower file system (ENOSPC at write time, never a lost file at transform), a full NVRAM
//! (transforms, never an error the lower file system would not give), unlinked-but-open temp
//! files, shadowing renames over lower files, hard links, xattrs, and the counters.

use std::ffi::OsStr;
use std::sync::Arc;

use engine::{CacheConfig, Engine, EngineConfig, FsError, Incident, Nbw, Share, TempConfig};
use lower::{Creds, Errno, LowerFs, MemConfig, MemLower};
use nvram::{FormatParams, SimRegion};
use txn::{Consistency, Pool};

const ROOT: Creds = Creds { uid: 0, gid: 0, groups: Vec::new() };

fn pool(frames: u64) -> Pool {
    let params = FormatParams {
        region_size: 12288 + 4 * 65536 + 4096 + frames * 4096,
        undo_slots: 4,
        undo_slot_size: 65536,
    };
    let region = Arc::new(SimRegion::new(params.region_size));
    Pool::format(&*region, params).unwrap();
    Pool::open(region, Consistency::Undo).unwrap().0
}

/// Every open on the NVRAM path (no kernel passthrough for the transformed files), where the
/// mount's default differs.
fn config(temp: TempConfig) -> EngineConfig {
    EngineConfig { temp, passthrough: false, ..EngineConfig::default() }
}

fn engine(lower: MemLower, frames: u64, temp: TempConfig) -> Engine<MemLower> {
    Engine::new(lower, pool(frames), config(temp)).unwrap()
}

/// The temp-file store these tests are written against, where the mount's default differs:
/// no share (temp files may take the whole region), so only a write that finds no free frame
/// transforms - unless a test sets one.
fn temp() -> TempConfig {
    TempConfig { share: Share::Percent(100), ..TempConfig::default() }
}

fn name(s: &str) -> &OsStr {
    OsStr::new(s)
}

fn read_all(e: &Engine<MemLower>, parent: u64, n: &str) -> Vec<u8> {
    let id = e.lookup(parent, name(n)).unwrap().node_id;
    let fh = e.open(id, libc::O_RDONLY).unwrap();
    let mut out = Vec::new();
    e.read(fh, 0, 1 << 22, |d| out.extend_from_slice(d)).unwrap();
    e.release(fh).unwrap();
    e.forget(id, 1);
    out
}

/// Creates `{prefix}{i}` for each i of `ids` in the root, `len` bytes of the value i each,
/// closed and forgotten (the kernel let go of them).
fn make_files(e: &Engine<MemLower>, prefix: &str, ids: std::ops::Range<u8>, len: usize) {
    let root = e.root_id();
    for i in ids {
        let (entry, fh) =
            e.create(&ROOT, root, name(&format!("{prefix}{i}")), 0o600, libc::O_RDWR).unwrap();
        e.write(fh, 0, &vec![i; len], false).unwrap();
        e.release(fh).unwrap();
        e.forget(entry.node_id, 1);
    }
}

fn lower_content(lower: &MemLower, n: &str) -> Option<Vec<u8>> {
    let (node, attr) = lower.lookup(lower.root(), name(n)).ok()?;
    let f = lower.open(&node, libc::O_RDONLY).unwrap();
    let mut buf = vec![0u8; attr.size as usize];
    let got = lower.read(&f, 0, &mut buf).unwrap();
    buf.truncate(got);
    Some(buf)
}

#[test]
fn a_full_lower_file_system_says_enospc_at_write_time_and_every_accepted_byte_lands() {
    // 64 blocks of 4 KiB: room for the root directory and some data.
    let lower = MemLower::new(MemConfig { blocks: 64, ..MemConfig::default() });
    let view = lower.clone();
    let e = engine(lower, 256, temp());
    let root = e.root_id();
    let mut accepted = Vec::new();
    let mut refused = None;
    'files: for i in 0..40 {
        let (entry, fh) = match e.create(&ROOT, root, name(&format!("f{i}")), 0o644, libc::O_RDWR) {
            Ok(x) => x,
            Err(err) => {
                refused = Some(err);
                break;
            }
        };
        let mut written = 0u64;
        for _ in 0..4 {
            match e.write(fh, written, &[i + 1; 4096], false) {
                Ok(n) => written += n as u64,
                Err(err) => {
                    refused = Some(err);
                    e.release(fh).unwrap();
                    accepted.push((format!("f{i}"), written));
                    break 'files;
                }
            }
        }
        e.release(fh).unwrap();
        e.forget(entry.node_id, 1);
        accepted.push((format!("f{i}"), written));
    }
    assert_eq!(refused, Some(FsError::Answer(Errno(libc::ENOSPC))), "the writer hears ENOSPC");
    // statfs already counts the reserved space as used.
    let s = e.statfs(root).unwrap();
    assert!(s.bavail <= 1, "statfs shows the reservation: {s:?}");
    let (done, err) = e.flush_tempfiles(&mut |_, _| {});
    assert!(err.is_none(), "no transform fails for lack of space: {err:?}");
    assert_eq!(done as usize, accepted.len());
    for (n, len) in &accepted {
        let i: u8 = n[1..].parse().unwrap();
        assert_eq!(lower_content(&view, n), Some(vec![i + 1; *len as usize]), "{n}");
    }
}

#[test]
fn a_full_nvram_transforms_the_least_recently_used_instead_of_failing() {
    let lower = MemLower::default();
    let view = lower.clone();
    // 48 frames for everything; writes of 60 files x 12 KiB need 240.
    let temp = TempConfig { share: Share::Frames(40), writeback_batch: 8, ..temp() };
    let e = engine(lower, 48, temp);
    let root = e.root_id();
    make_files(&e, "g", 0..60, 12288);
    let t = e.stats().tempfiles;
    assert_eq!(t.created, 60);
    assert!(t.transformed["pressure"] + t.transformed["nvram_full"] > 0, "{t:?}");
    assert!(t.pages_resident + t.record_frames <= 48, "{t:?}");
    for i in 0..60u8 {
        assert_eq!(read_all(&e, root, &format!("g{i}")), vec![i; 12288], "g{i}");
    }
    e.shutdown();
    for i in 0..60u8 {
        assert_eq!(lower_content(&view, &format!("g{i}")), Some(vec![i; 12288]));
    }
}

#[test]
fn the_background_transformer_moves_the_least_recently_used_out_before_any_writer_must() {
    let lower = MemLower::default();
    let view = lower.clone();
    // The share is 160 frames, the background mark 90; a round takes 8 x NR_WB = 64 frames.
    let temp = TempConfig {
        share: Share::Frames(160),
        writeback_batch: 8,
        background: Some(Share::Frames(90)),
        ..temp()
    };
    let e = engine(lower, 256, temp);
    let root = e.root_id();
    // 80 one-page files hold 80 pages, their records 10 frames: at the mark, not above it.
    make_files(&e, "g", 0..80, 4096);
    let t = e.stats().tempfiles;
    assert_eq!((t.pages_resident, t.record_frames), (80, 10));
    assert_eq!(e.transform_in_background(), 0, "nothing to do at the mark");
    make_files(&e, "g", 80..88, 4096); // 88 + 11 frames
    let first = e.transform_in_background();
    // 64 frames are 512 eighths; a one-page file takes 9 (its page and its record's slot).
    assert_eq!(first, 57, "one round: 64 frames = 57 files of a page and a slot");
    assert_eq!(e.transform_in_background(), 0, "under the mark again");
    let t = e.stats().tempfiles;
    // The records of g57..g87 fill 4 frames; of the 7 frames g0..g55 emptied one stays as
    // room and 6 were freed.
    assert_eq!((t.pages_resident, t.record_frames), (31, 5), "{t:?}");
    assert_eq!(t.transformed["background"], 57);
    assert_eq!(t.transformed["pressure"], 0, "no writer had to relieve pressure: {t:?}");
    // Least recently used first: the oldest 57 are lower files, the newest 31 still in NVRAM.
    for i in 0..88u8 {
        let n = format!("g{i}");
        assert_eq!(lower_content(&view, &n).is_some(), i < 57, "{n}");
        assert_eq!(read_all(&e, root, &n), vec![i; 4096], "{n} through the mount");
    }
    e.shutdown();
    for i in 0..88u8 {
        assert_eq!(lower_content(&view, &format!("g{i}")), Some(vec![i; 4096]));
    }
}

#[test]
fn the_background_transformer_is_off_by_default_in_the_engine() {
    let e = engine(MemLower::default(), 64, TempConfig { share: Share::Frames(40), ..temp() });
    make_files(&e, "h", 0..10, 4096);
    assert_eq!(e.transform_in_background(), 0);
    assert_eq!(e.stats().tempfiles.transformed["background"], 0);
}

/// An engine over a lower file `cold` of `pages` pages (bytes `i % 251`) with `--nbw async-bg`
/// (the daemon's default: a partial write to a page not in NVRAM becomes a patch fetched in
/// the background) and no share, on a region of 24 frames: nothing relieves pressure until a
/// write finds the region full. Returns the engine and the lower file's content.
fn engine_with_cold_file(pages: u32) -> (Engine<MemLower>, Vec<u8>) {
    let lower = MemLower::default();
    let cold: Vec<u8> = (0..pages * 4096).map(|i| (i % 251) as u8).collect();
    {
        let (_, _, f) =
            lower.create(&ROOT, lower.root(), name("cold"), 0o644, libc::O_RDWR).unwrap();
        lower.write(&f, 0, &cold).unwrap();
    }
    let cache = CacheConfig { nbw: Nbw::AsyncBg, ..CacheConfig::default() };
    let config = EngineConfig { temp: temp(), cache, ..config(temp()) };
    (Engine::new(lower, pool(24), config).unwrap(), cold)
}

/// The kinds: a write attempt retried, a create sent down, a journal record left out, an
/// asynchronous fetch that failed (bench/nvbench/load.py `ABORT_KINDS`).
#[test]
fn every_aborted_transaction_is_a_write_retry_or_another_counted_kind() {
    // A lower file whose page 0 gets a patch (`--nbw async-bg`, the daemon's default): its
    // asynchronous fetch is the fourth kind of abort, when it finds NVRAM full.
    let (e, cold) = engine_with_cold_file(2);
    let root = e.root_id();
    let cold_id = e.lookup(root, name("cold")).unwrap().node_id;
    let cold_fh = e.open(cold_id, libc::O_RDWR).unwrap();
    e.write(cold_fh, 7, &[0xaa; 20], false).unwrap();
    assert_eq!((e.stats().nbw.patches, e.fetches_queued()), (1, 1), "a patch waits for its fetch");
    // One write takes every free frame; the next create finds none and goes to the lower
    // directory (its journal record finds none either).
    let (entry, fh) = e.create(&ROOT, root, name("a"), 0o600, libc::O_RDWR).unwrap();
    // Seven more records fill a's record frame, so that the next create needs a frame.
    make_files(&e, "s", 0..7, 0);
    let free = e.stats().nvram.frames_free as usize;
    e.write(fh, 0, &vec![7; free * 4096], false).unwrap();
    assert_eq!(e.stats().nvram.frames_free, 0);
    // The fetcher reads the page, but its merge finds no frame: rolled back, the patch stays.
    assert_eq!(e.fetch_patches(usize::MAX), 0);
    let n = e.stats().nbw;
    assert_eq!((n.fetches_failed, n.fetches_async, n.patches), (1, 0, 1), "{n:?}");
    make_files(&e, "b", 0..1, 4096);
    // Then writes that find the region full relieve it and retry.
    make_files(&e, "f", 0..20, 4096);
    e.release(fh).unwrap();
    e.forget(entry.node_id, 1);
    let s = e.stats();
    let t = &s.tempfiles;
    assert_eq!(t.created_in_lower_nvram_full, 1, "{t:?}");
    assert!(t.created_in_lower >= t.created_in_lower_nvram_full, "{t:?}");
    // The retried attempts are not errors, nor requests: 30 writes (cold, a, s0-s6, b0,
    // f0-f19), every one answered with its byte count.
    assert_eq!(s.requests["write"], 30, "{:?}", s.requests);
    assert_eq!(s.errors.get("write"), None, "{:?}", s.errors);
    let write_retries = s.retries.get("write").copied().unwrap_or(0);
    assert!(write_retries > 0, "{:?}", s.retries);
    assert_eq!(s.nbw.fetches_failed, 1, "{:?}", s.nbw);
    assert_eq!(
        s.nvram.transactions_aborted,
        write_retries
            + s.journal.not_journaled
            + t.created_in_lower_nvram_full
            + s.nbw.fetches_failed,
        "the load test's error check (bench/nvbench/load.py ABORT_KINDS) relies on this: {s:?}"
    );
    assert_eq!(read_all(&e, root, "a"), vec![7; free * 4096]);
    assert_eq!(read_all(&e, root, "b0"), vec![0; 4096]);
    for i in 0..20u8 {
        assert_eq!(read_all(&e, root, &format!("f{i}")), vec![i; 4096], "f{i}");
    }
    let mut want = cold;
    want[7..27].fill(0xaa);
    let mut got = Vec::new();
    e.read(cold_fh, 0, 1 << 20, |d| got.extend_from_slice(d)).unwrap();
    assert_eq!(got, want, "the patch that stayed is the file's content");
    e.release(cold_fh).unwrap();
    e.forget(cold_id, 1);
}

/// Every failure the engine survives is counted by its kind (`base/incidents.rs`, `incidents`
/// in `nvstack stat --json`): here asynchronous fetches of a patched page that find NVRAM full.
/// Every kind is listed, zeros included; the fetch's kind counts every failure, also those it
/// does not say on stderr (the first and every power of two only).
#[test]
fn a_failed_fetch_is_counted_as_an_incident_of_its_kind_and_no_other() {
    let (e, _) = engine_with_cold_file(3);
    let incidents = e.stats().incidents;
    let names: Vec<&str> = Incident::ALL.iter().map(Incident::name).collect();
    assert_eq!(
        incidents.keys().copied().collect::<std::collections::BTreeSet<_>>(),
        names.iter().copied().collect(),
        "every kind listed"
    );
    assert!(incidents.values().all(|&n| n == 0), "none at start: {incidents:?}");
    let root = e.root_id();
    let cold_id = e.lookup(root, name("cold")).unwrap().node_id;
    let cold_fh = e.open(cold_id, libc::O_RDWR).unwrap();
    for page in 0..3 {
        e.write(cold_fh, page * 4096 + 7, &[0xaa; 20], false).unwrap();
    }
    assert_eq!(e.fetches_queued(), 3, "three patches wait for their fetches");
    // A temp file takes every free frame: the fetches' merges then find none.
    let (entry, fh) = e.create(&ROOT, root, name("a"), 0o600, libc::O_RDWR).unwrap();
    let free = e.stats().nvram.frames_free as usize;
    e.write(fh, 0, &vec![7; free * 4096], false).unwrap();
    assert_eq!(e.stats().nvram.frames_free, 0);
    assert_eq!(e.stats().incidents["fetch_failed"], 0);
    // Three fetches read their page, and their merges find no frame: rolled back, the
    // patches stay. The first two failures are said on stderr, the third only counted.
    assert_eq!(e.fetch_patches(usize::MAX), 0);
    let s = e.stats();
    assert_eq!(s.nbw.fetches_failed, 3, "{:?}", s.nbw);
    for (&kind, &n) in &s.incidents {
        let want = if kind == "fetch_failed" { 3 } else { 0 };
        assert_eq!(n, want, "{kind}: {:?}", s.incidents);
    }
    e.release(fh).unwrap();
    e.forget(entry.node_id, 1);
    e.release(cold_fh).unwrap();
    e.forget(cold_id, 1);
}

#[test]
fn an_unlinked_open_temp_file_stays_usable_until_closed_then_its_frames_are_free() {
    let e = engine(MemLower::default(), 64, temp());
    let root = e.root_id();
    let free0 = e.stats().nvram.frames_free;
    let (entry, fh) = e.create(&ROOT, root, name("t"), 0o644, libc::O_RDWR).unwrap();
    e.write(fh, 0, b"still here", false).unwrap();
    e.unlink(root, name("t")).unwrap();
    assert_eq!(e.lookup(root, name("t")).unwrap_err(), FsError::Lower(Errno(libc::ENOENT)));
    assert_eq!(e.getattr(entry.node_id).unwrap().nlink, 0);
    let mut got = Vec::new();
    e.read(fh, 0, 100, |d| got.extend_from_slice(d)).unwrap();
    assert_eq!(got, b"still here");
    e.write(fh, 10, b"!", false).unwrap();
    assert_eq!(e.stats().tempfiles.deleted_in_nvram, 1);
    e.release(fh).unwrap();
    // The record frame, empty now, stays as room for the next create (T6), and the root's
    // pending times (the create and the unlink changed it) hold one frame until they are
    // settled into the lower directory.
    assert_eq!(e.stats().nvram.frames_free, free0 - 2, "the data frame freed at close");
    assert_eq!(e.stats().tempfiles.files_resident, 0);
    assert_eq!(e.stats().tempfiles.record_frames, 1);
    assert_eq!(e.settle_dir_times().unwrap(), 1);
    assert_eq!(e.stats().nvram.frames_free, free0 - 1, "the dir-times frame freed by settling");
    assert_eq!(e.flush_tempfiles(&mut |_, _| {}), (0, None));
    assert_eq!(e.stats().nvram.frames_free, free0, "a flush frees the record frame kept as room");
}

#[test]
fn renames_over_lower_files_shadow_them_until_the_transform_replaces_them() {
    let lower = MemLower::default();
    let view = lower.clone();
    {
        let (_, _, f) =
            lower.create(&ROOT, lower.root(), name("old"), 0o644, libc::O_RDWR).unwrap();
        lower.write(&f, 0, b"old content").unwrap();
        let (_, _, f) =
            lower.create(&ROOT, lower.root(), name("linked"), 0o644, libc::O_RDWR).unwrap();
        lower.write(&f, 0, b"has two names").unwrap();
        let (n, _) = lower.lookup(lower.root(), name("linked")).unwrap();
        lower.link(&n, lower.root(), name("linked2")).unwrap();
    }
    let e = engine(lower, 64, temp());
    let root = e.root_id();
    let (a, fh) = e.create(&ROOT, root, name("new"), 0o644, libc::O_RDWR).unwrap();
    e.write(fh, 0, b"new content", false).unwrap();
    e.release(fh).unwrap();
    e.forget(a.node_id, 1);
    e.rename(root, name("new"), root, name("old"), 0).unwrap();
    // The mount shows the temp file; the lower file is still there, shadowed.
    assert_eq!(read_all(&e, root, "old"), b"new content");
    assert_eq!(lower_content(&view, "old").unwrap(), b"old content");
    assert!(lower_content(&view, "new").is_none());
    // NOREPLACE and EXCHANGE against the merged namespace.
    let (b, fh) = e.create(&ROOT, root, name("other"), 0o644, libc::O_RDWR).unwrap();
    e.release(fh).unwrap();
    e.forget(b.node_id, 1);
    let err = e.rename(root, name("other"), root, name("old"), libc::RENAME_NOREPLACE).unwrap_err();
    assert_eq!(err, FsError::Answer(Errno(libc::EEXIST)));
    e.rename(root, name("other"), root, name("old"), libc::RENAME_EXCHANGE).unwrap();
    assert_eq!(read_all(&e, root, "other"), b"new content");
    assert_eq!(read_all(&e, root, "old"), b"");
    // Renaming a temp file over a lower file with another link: the lower rename does it
    // (after a transform), so the other link's count is right.
    e.rename(root, name("other"), root, name("linked"), 0).unwrap();
    let l2 = e.lookup(root, name("linked2")).unwrap();
    assert_eq!(l2.attr.nlink, 1);
    assert_eq!(e.stats().tempfiles.transformed["lower_rename"], 1);
    // The transform of the shadowing file replaces the lower one in one rename.
    e.flush_tempfiles(&mut |_, _| {});
    assert_eq!(lower_content(&view, "old").unwrap(), b"");
    assert_eq!(lower_content(&view, "linked").unwrap(), b"new content");
    assert_eq!(lower_content(&view, "linked2").unwrap(), b"has two names");
}

#[test]
fn links_and_xattrs_move_a_temp_file_to_the_lower_file_system_first() {
    let lower = MemLower::default();
    let view = lower.clone();
    let eng = engine(lower, 64, temp());
    let e = &eng;
    let root = e.root_id();
    let (x_entry, fh) = e.create(&ROOT, root, name("x"), 0o640, libc::O_RDWR).unwrap();
    e.write(fh, 0, b"data", false).unwrap();
    assert_eq!(
        e.getxattr(x_entry.node_id, name("user.k"), 0).unwrap_err(),
        FsError::Answer(Errno(libc::ENODATA))
    );
    assert!(e.listxattr(x_entry.node_id, 0).unwrap().is_empty());
    e.setxattr(x_entry.node_id, name("user.k"), b"v", 0).unwrap();
    assert_eq!(e.getxattr(x_entry.node_id, name("user.k"), 16).unwrap(), b"v");
    assert_eq!(lower_content(&view, "x").unwrap(), b"data");
    // The open handle follows the file into the lower file system.
    e.write(fh, 4, b"+more", false).unwrap();
    e.release(fh).unwrap();
    // (The write is a dirty page of the lower file in NVRAM until written back.)
    assert_eq!(lower_content(&view, "x").unwrap(), b"data");
    assert_eq!(e.flush_cache(engine::Reason::Flush, &mut |_, _| {}), (1, None));
    assert_eq!(lower_content(&view, "x").unwrap(), b"data+more");
    let (y_entry, fh) = e.create(&ROOT, root, name("y"), 0o600, libc::O_RDWR).unwrap();
    e.release(fh).unwrap();
    let linked = e.link(y_entry.node_id, root, name("y2")).unwrap();
    assert_eq!(linked.attr.nlink, 2);
    let counts = e.stats().tempfiles;
    assert_eq!((counts.transformed["xattr"], counts.transformed["link"]), (1, 1));
    assert_eq!(counts.created, 2);
}

#[test]
fn a_directory_holding_only_temp_files_is_not_empty() {
    let lower = MemLower::default();
    let e = engine(lower, 64, temp());
    let root = e.root_id();
    let d = e.mkdir(&ROOT, root, name("d"), 0o755).unwrap();
    let (f, fh) = e.create(&ROOT, d.node_id, name("inside"), 0o644, libc::O_RDWR).unwrap();
    e.release(fh).unwrap();
    e.forget(f.node_id, 1);
    assert_eq!(e.rmdir(root, name("d")).unwrap_err(), FsError::Answer(Errno(libc::ENOTEMPTY)));
    let e2 = e.mkdir(&ROOT, root, name("e"), 0o755).unwrap();
    assert_eq!(
        e.rename(root, name("e"), root, name("d"), 0).unwrap_err(),
        FsError::Answer(Errno(libc::ENOTEMPTY))
    );
    // Renaming the directory keeps its temp files (they follow the directory's identity).
    e.rename(root, name("d"), e2.node_id, name("moved"), 0).unwrap();
    let moved = e.lookup(e2.node_id, name("moved")).unwrap();
    assert!(e.lookup(moved.node_id, name("inside")).is_ok());
    e.unlink(moved.node_id, name("inside")).unwrap();
    e.rmdir(e2.node_id, name("moved")).unwrap();
}

#[test]
fn a_small_file_costs_its_data_frames_and_an_eighth_of_a_record_frame() {
    let e = engine(MemLower::default(), 256, temp());
    make_files(&e, "x", 0..1, 0); // the root's pending-times frame and a record frame
    let free0 = e.stats().nvram.frames_free;
    make_files(&e, "m", 0..63, 4096);
    let t = e.stats().tempfiles;
    assert_eq!((t.files_resident, t.pages_resident, t.record_frames), (64, 63, 8), "{t:?}");
    assert_eq!(free0 - e.stats().nvram.frames_free, 63 + 7, "63 pages and 7 more record frames");
    // Removing every file of a frame empties it; only one empty frame stays.
    let root = e.root_id();
    for i in 0..63u8 {
        e.unlink(root, name(&format!("m{i}"))).unwrap();
    }
    let t = e.stats().tempfiles;
    assert_eq!((t.files_resident, t.pages_resident, t.record_frames), (1, 0, 2), "{t:?}");
    assert_eq!(e.stats().nvram.frames_free, free0 - 1, "x's frame and the one kept as room");
}

#[test]
fn a_record_in_a_whole_object_frame_from_before_the_packing_is_read_changed_and_freed() {
    use engine::tempfs::record::{KIND_DATA, KIND_OBJECT};
    let lower = MemLower::default();
    let view = lower.clone();
    let p = pool(64);
    let free0 = p.stats().frames_free;
    // What an earlier nvstack left: the record alone at offset 0 of a KIND_OBJECT frame, its
    // page's data frame owned by that frame's number.
    let rec = engine::tempfs::Record {
        state: engine::tempfs::State::Live,
        flags: 0,
        mode: libc::S_IFREG | 0o644,
        uid: 0,
        gid: 0,
        nlink: 1,
        size: 5,
        atime: (1, 0),
        mtime: (1, 0),
        ctime: (1, 0),
        serial: 7,
        dir: lower.dir_handle(lower.root()).unwrap(),
        name: "old".into(),
    };
    let mut tx = p.begin();
    let object = tx.alloc_frame(txn::FrameTag { kind: KIND_OBJECT, owner: 0, index: 0 }).unwrap();
    tx.write(p.frame_offset(object), &rec.encode());
    let page =
        tx.alloc_frame(txn::FrameTag { kind: KIND_DATA, owner: object.0, index: 0 }).unwrap();
    let mut bytes = vec![0u8; 4096];
    bytes[..5].copy_from_slice(b"hello");
    tx.write(p.frame_offset(page), &bytes);
    tx.commit();
    let e = Engine::new(lower, p, config(temp())).unwrap();
    let root = e.root_id();
    assert_eq!(read_all(&e, root, "old"), b"hello");
    let id = e.lookup(root, name("old")).unwrap().node_id;
    let fh = e.open(id, libc::O_RDWR).unwrap();
    e.write(fh, 5, b", world", false).unwrap();
    e.release(fh).unwrap();
    e.forget(id, 1);
    assert_eq!(read_all(&e, root, "old"), b"hello, world");
    assert_eq!(e.stats().tempfiles.record_frames, 1, "its whole frame counts as one");
    e.unlink(root, name("old")).unwrap();
    assert_eq!(e.stats().tempfiles.files_resident, 0);
    assert_eq!(e.stats().tempfiles.record_frames, 0);
    // Both frames are free; the root's pending times hold one.
    assert_eq!(e.stats().nvram.frames_free, free0 - 1);
    make_files(&e, "new", 0..1, 3);
    assert_eq!(e.stats().tempfiles.record_frames, 1, "new records go to slots");
    e.shutdown();
    assert_eq!(lower_content(&view, "new0"), Some(vec![0; 3]));
    assert_eq!(lower_content(&view, "old"), None);
}
