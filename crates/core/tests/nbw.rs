//! Non-blocking writes (design.md section 11.8) at the engine's boundary, over the in-memory
//! lower file system with temp files off: partial writes to pages not in NVRAM become patches
//! without reading the page; reads the patches cover are served without the lower file;
//! later writes merge or complete a patch; truncates clip it; the asynchronous fetch merges
//! it; write-back writes only its bytes; a restart finds it again; the patch limit and
//! fragmentation fall back to reading the page - and a seeded model of small unaligned writes,
//! reads, truncates, fetches, write-backs and restarts in every mode agrees with the engine at
//! every step and with the lower file after the last write-back.

mod common;

use std::ffi::OsStr;
use std::sync::Arc;

use common::region;
use engine::{CacheConfig, Engine, EngineConfig, Nbw, PatchLimit, Reason, Share, TempConfig};
use lower::{Creds, LowerFs, MemLower, SetAttr};
use nvram::SimRegion;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use txn::{Consistency, Pool};

const ROOT: Creds = Creds { uid: 0, gid: 0, groups: Vec::new() };
const PAGE: usize = 4096;

fn start(lower: &MemLower, region: &Arc<SimRegion>, cache: CacheConfig) -> Engine<MemLower> {
    let pool = Pool::open(region.clone(), Consistency::Undo).unwrap().0;
    let config = EngineConfig {
        temp: TempConfig { enabled: false, ..TempConfig::default() },
        cache,
        passthrough: false,
        ..EngineConfig::default()
    };
    Engine::new(lower.clone(), pool, config).unwrap()
}

/// Every open on the NVRAM path (`start`: no kernel passthrough), and a writer past the high
/// watermark writes back in its own request (no background writer), where the mount's
/// defaults differ.
fn nbw(mode: Nbw) -> CacheConfig {
    CacheConfig {
        nbw: mode,
        writeback_on_unmount: false,
        background: false,
        ..CacheConfig::default()
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed)).collect()
}

fn lower_file(lower: &MemLower, content: &[u8]) {
    let (_, _, f) =
        lower.create(&ROOT, lower.root(), OsStr::new("f"), 0o644, libc::O_RDWR).unwrap();
    lower.write(&f, 0, content).unwrap();
    lower.sync_all();
}

fn lower_content(lower: &MemLower) -> Vec<u8> {
    let (node, attr) = lower.lookup(lower.root(), OsStr::new("f")).unwrap();
    let f = lower.open(&node, libc::O_RDONLY).unwrap();
    let mut buf = vec![0u8; attr.size as usize];
    let got = lower.read(&f, 0, &mut buf).unwrap();
    buf.truncate(got);
    buf
}

fn open(e: &Engine<MemLower>) -> (u64, u64) {
    let id = e.lookup(e.root_id(), OsStr::new("f")).unwrap().node_id;
    (id, e.open(id, libc::O_RDWR).unwrap())
}

fn read(e: &Engine<MemLower>, fh: u64, offset: u64, len: u32) -> Vec<u8> {
    let mut out = Vec::new();
    e.read(fh, offset, len, |d| out.extend_from_slice(d)).unwrap();
    out
}

/// A read of `len` bytes at `off` returns what the model holds there.
fn read_agrees(e: &Engine<MemLower>, fh: u64, off: usize, len: usize, model: &[u8], what: &str) {
    let got = read(e, fh, off as u64, len as u32);
    let end = (off + len).min(model.len());
    let want = if off < model.len() { &model[off..end] } else { &[][..] };
    assert_eq!(got, want, "{what}: read {off}+{len}");
}

fn write(e: &Engine<MemLower>, fh: u64, offset: usize, data: &[u8], model: &mut Vec<u8>) {
    assert_eq!(e.write(fh, offset as u64, data, false).unwrap(), data.len());
    if model.len() < offset + data.len() {
        model.resize(offset + data.len(), 0);
    }
    model[offset..offset + data.len()].copy_from_slice(data);
}

#[test]
fn a_partial_write_to_a_cold_page_is_a_patch_and_never_reads_it() {
    let lower = MemLower::default();
    let mut model = pattern(10 * PAGE, 1);
    lower_file(&lower, &model);
    let e = start(&lower, &region(128), nbw(Nbw::Lazy));
    let (_, fh) = open(&e);
    write(&e, fh, 5000, &[0xee; 100], &mut model);
    write(&e, fh, 5200, &[0xdd; 50], &mut model); // merges into the page's patch
    write(&e, fh, 3 * PAGE + 7, b"xyz", &mut model);
    let st = e.stats();
    assert_eq!((st.cache.fetches, st.nbw.patches_created, st.nbw.patches), (0, 2, 2));
    assert_eq!(st.nbw.patch_bytes, 153);
    // Covered by the patch: no lower read.
    let before = st.lower.bytes_read;
    assert_eq!(read(&e, fh, 5010, 40), vec![0xee; 40]);
    let st = e.stats();
    assert_eq!((st.lower.bytes_read, st.nbw.reads_served_from_patches), (before, 1));
    // Not covered: the lower bytes with the patch over them.
    assert_eq!(read(&e, fh, 0, 1 << 20), model);
    assert!(e.stats().nbw.fetches_on_read >= 2);
    // Completing the page turns the patch into a dirty page without any read.
    write(&e, fh, 3 * PAGE, &[0x55; 7], &mut model);
    write(&e, fh, 3 * PAGE + 10, &[0x66; PAGE - 10], &mut model);
    let st = e.stats();
    assert_eq!((st.nbw.pages_completed_without_fetch, st.nbw.patches, st.cache.fetches), (1, 1, 0));
    assert_eq!(read(&e, fh, 0, 1 << 20), model);
    assert_eq!(lower_content(&lower), pattern(10 * PAGE, 1), "nothing reached the lower file");
    // Write-back writes only the patched bytes; the lower file is then the content.
    let (_, err) = e.flush_cache(Reason::Flush, &mut |_, _| {});
    assert!(err.is_none(), "{err:?}");
    let st = e.stats();
    assert_eq!((st.nbw.patches, st.nbw.patch_bytes, st.nbw.fetches_on_writeback), (0, 0, 1));
    assert_eq!(lower_content(&lower), model);
    e.check_cache().unwrap();
}

#[test]
fn a_truncate_clips_a_patch_and_a_restart_finds_it_again() {
    let lower = MemLower::default();
    let mut model = pattern(8 * PAGE, 2);
    lower_file(&lower, &model);
    let r = region(128);
    let e = start(&lower, &r, nbw(Nbw::Lazy));
    let (id, fh) = open(&e);
    write(&e, fh, 2 * PAGE + 100, &[1; 300], &mut model);
    write(&e, fh, 5 * PAGE + 10, &[2; 20], &mut model);
    // Cut inside the second patch: its bytes at and beyond the size go (P5).
    let set = SetAttr { size: Some((5 * PAGE + 20) as u64), ..SetAttr::default() };
    e.setattr(id, Some(fh), &set, false).unwrap();
    model.truncate(5 * PAGE + 20);
    assert_eq!(read(&e, fh, 0, 1 << 20), model);
    assert_eq!(e.stats().nbw.patch_bytes, 310);
    // Grown again: zeros beyond the cut, whatever the lower file still holds there.
    write(&e, fh, 6 * PAGE, b"end", &mut model);
    assert_eq!(read(&e, fh, 0, 1 << 20), model);
    e.release(fh).unwrap();
    e.forget(id, 1);
    e.shutdown();
    let e = start(&lower, &r, nbw(Nbw::Lazy));
    let (_, fh) = open(&e);
    let st = e.stats();
    assert_eq!((st.nbw.patches, st.nbw.patch_bytes), (2, 310), "patches found at start");
    assert_eq!(read(&e, fh, 0, 1 << 20), model);
    e.check_cache().unwrap();
    let (_, err) = e.flush_cache(Reason::Flush, &mut |_, _| {});
    assert!(err.is_none());
    assert_eq!(lower_content(&lower), model);
}

#[test]
fn the_asynchronous_fetcher_pauses_while_the_cache_is_above_its_high_watermark() {
    // A fetch turns a patch (a few slots) into a whole dirty page: above the high watermark
    // the fetcher starts none, keeps the queue, and goes on once write-back made room.
    let lower = MemLower::default();
    let mut model = pattern(4 * PAGE, 5);
    lower_file(&lower, &model);
    let config = CacheConfig {
        dirty_high: Share::Frames(2),
        dirty_low: Share::Frames(0),
        ..nbw(Nbw::AsyncBg)
    };
    let e = start(&lower, &region(128), config);
    let (_, fh) = open(&e);
    for page in 0..3 {
        write(&e, fh, page * PAGE + 7, &[page as u8 + 1; 20], &mut model);
    }
    let st = e.stats();
    // One record frame and one patch frame: at the mark, not above it.
    assert_eq!((st.nbw.patches, st.nbw.patch_frames, st.cache.record_frames), (3, 1, 1));
    assert_eq!(e.fetches_queued(), 3);
    // The first fetch adds a page frame (3 > 2): the fetcher stops there.
    assert_eq!(e.fetch_patches(usize::MAX), 1);
    let st = e.stats();
    assert_eq!((st.nbw.fetches_async, st.nbw.fetches_paused, st.nbw.fetches_failed), (1, 1, 0));
    assert_eq!((st.nbw.patches, st.cache.fetches), (2, 1), "no disk read above the mark");
    assert_eq!(e.fetches_queued(), 2, "the paused fetches stay queued");
    assert_eq!(e.fetch_patches(usize::MAX), 0);
    assert_eq!(e.stats().nbw.fetches_paused, 2);
    assert_eq!(read(&e, fh, 0, 1 << 20), model);
    // Write-back empties the cache: the queued pages are fetched again (their patches went
    // with the write-back, so nothing is left to merge) and the fetcher does not pause.
    let (_, err) = e.flush_cache(Reason::Flush, &mut |_, _| {});
    assert!(err.is_none());
    assert_eq!(e.fetch_patches(usize::MAX), 0);
    let st = e.stats();
    assert_eq!((st.nbw.fetches_paused, e.fetches_queued()), (2, 0));
    assert_eq!(lower_content(&lower), model);
    e.check_cache().unwrap();
}

#[test]
fn the_asynchronous_fetch_merges_a_patch_into_a_dirty_page() {
    let lower = MemLower::default();
    let mut model = pattern(4 * PAGE, 3);
    lower_file(&lower, &model);
    let e = start(&lower, &region(128), nbw(Nbw::AsyncBg));
    let (_, fh) = open(&e);
    // The fetcher's bell (the daemon's fetcher sleeps on it) rings when a page is queued,
    // not for a page already waiting.
    write(&e, fh, 100, &[9; 10], &mut model);
    assert_eq!(e.fetcher_bell().rung(), 1);
    write(&e, fh, 300, &[7; 10], &mut model);
    assert_eq!(e.fetcher_bell().rung(), 1, "page 0 is queued already");
    write(&e, fh, PAGE + 100, &[8; 10], &mut model);
    assert_eq!(e.fetcher_bell().rung(), 2);
    assert_eq!(e.fetches_queued(), 2);
    assert_eq!(e.fetch_patches(usize::MAX), 2);
    let st = e.stats();
    assert_eq!((st.nbw.patches, st.nbw.fetches_async, st.cache.fetches), (0, 2, 2));
    assert_eq!(st.writeback.pages_dirty, 2);
    assert_eq!(read(&e, fh, 0, 1 << 20), model);
    e.check_cache().unwrap();
}

#[test]
fn at_the_patch_limit_and_when_fragmented_the_writer_reads_the_page() {
    let lower = MemLower::default();
    let mut model = pattern(16 * PAGE, 4);
    lower_file(&lower, &model);
    let e = start(
        &lower,
        &region(128),
        CacheConfig { patch_limit: PatchLimit::Frames(1), ..nbw(Nbw::Lazy) },
    );
    let (_, fh) = open(&e);
    // Four small patches share the one frame the limit allows (a slot each)...
    for p in 0..4 {
        write(&e, fh, p * PAGE + 1, b"ab", &mut model);
    }
    // ... and so does a 2000-byte one (32 slots); the next finds no run of 32 left in it.
    for p in 4..6 {
        write(&e, fh, p * PAGE + 1, &[0x5a; 2000], &mut model);
    }
    let st = e.stats();
    assert_eq!((st.nbw.patches, st.nbw.patch_frames, st.cache.fetches), (5, 1, 1));
    assert_eq!(st.nbw.writer_wait_reasons["patch_limit"], 1);
    // A patch that would outgrow its run with no room left reads its page too (the limit
    // holds for moves); the frame keeps the four others.
    write(&e, fh, PAGE + 100, &[0xa5; 2000], &mut model);
    let st = e.stats();
    assert_eq!((st.nbw.patches, st.nbw.patch_frames, st.cache.fetches), (4, 1, 2));
    assert_eq!((st.nbw.writer_wait_reasons["patch_limit"], st.nbw.patches_moved), (2, 0));
    // 65 fragments do not fit one patch (MAX_RANGES = 64): the page is read and merged.
    for i in 0..65 {
        write(&e, fh, i * 8, b"z", &mut model);
    }
    let st = e.stats();
    assert_eq!(st.nbw.writer_wait_reasons["fragmented"], 1);
    assert_eq!(read(&e, fh, 0, 1 << 20), model);
    e.check_cache().unwrap();
}

#[test]
fn scattered_512_byte_patches_pack_seven_to_a_frame() {
    let lower = MemLower::default();
    let mut model = pattern(400 * PAGE, 6);
    lower_file(&lower, &model);
    // Watermarks count frames: 100 patches in 15 frames (and a record) stay below 50.
    let e = start(
        &lower,
        &region(512),
        CacheConfig {
            dirty_high: Share::Frames(50),
            dirty_low: Share::Frames(30),
            ..nbw(Nbw::Lazy)
        },
    );
    let (_, fh) = open(&e);
    // 100 pages in a scattered order: frames fill to 63 of 64 slots, and the one slot left in
    // each must not keep a later patch from the frames that still have room.
    for i in 0..100 {
        write(&e, fh, (i * 37 % 400) * PAGE + 512, &[i as u8; 512], &mut model);
    }
    let st = e.stats();
    assert_eq!((st.nbw.patches, st.nbw.patch_frames, st.cache.fetches), (100, 15, 0));
    assert_eq!(st.writeback.pages_written, 0, "a pressure round ran");
    assert_eq!(read(&e, fh, 0, 400 * PAGE as u32), model);
    e.check_cache().unwrap();
}

/// A seeded model of one file under every mode: small unaligned writes (mostly below 4 KiB),
/// reads compared at random places, truncates, fetches, write-backs, restarts.
#[test]
fn small_unaligned_writes_agree_with_a_model_in_every_mode() {
    for (seed, mode) in [(1, Nbw::Lazy), (2, Nbw::AsyncBg), (3, Nbw::AsyncFg), (4, Nbw::Off)] {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let lower = MemLower::default();
        let mut model = pattern(64 * PAGE, seed as u8);
        lower_file(&lower, &model);
        let r = region(256);
        let mut e =
            start(&lower, &r, CacheConfig { patch_limit: PatchLimit::Frames(24), ..nbw(mode) });
        let (mut id, mut fh) = open(&e);
        // Counters of the engines before the last restart.
        let (mut created, mut fetched) = (0, 0);
        for step in 0..1500 {
            match rng.random_range(0..100) {
                0..70 => {
                    let len =
                        [1, 7, 128, 512, 1000, 2048, 4000, 4096, 5000][rng.random_range(0..9)];
                    let off = rng.random_range(0..70 * PAGE);
                    let byte: u8 = rng.random();
                    write(&e, fh, off, &vec![byte; len], &mut model);
                    if mode == Nbw::AsyncFg {
                        e.after_write_answered();
                    }
                }
                70..85 => {
                    let off = rng.random_range(0..model.len() + 100);
                    let len = rng.random_range(1..3 * PAGE);
                    read_agrees(&e, fh, off, len, &model, &format!("seed {seed} step {step}"));
                }
                85..89 => {
                    let size = rng.random_range(0..72 * PAGE);
                    let set = SetAttr { size: Some(size as u64), ..SetAttr::default() };
                    e.setattr(id, Some(fh), &set, false).unwrap();
                    model.resize(size, 0);
                }
                89..94 => {
                    e.fetch_patches(rng.random_range(1..8));
                }
                94..98 => {
                    let (_, err) = e.flush_cache(Reason::Flush, &mut |_, _| {});
                    assert!(err.is_none(), "seed {seed} step {step}: {err:?}");
                }
                _ => {
                    let st = e.stats().nbw;
                    (created, fetched) = (created + st.patches_created, fetched + st.fetches_async);
                    e.release(fh).unwrap();
                    e.forget(id, 1);
                    e.shutdown();
                    e = start(
                        &lower,
                        &r,
                        CacheConfig { patch_limit: PatchLimit::Frames(24), ..nbw(mode) },
                    );
                    (id, fh) = open(&e);
                }
            }
            if step % 50 == 0 {
                e.check_cache().unwrap_or_else(|m| panic!("seed {seed} step {step}: {m}"));
                assert_eq!(read(&e, fh, 0, 1 << 20).len(), model.len());
            }
        }
        assert_eq!(read(&e, fh, 0, 1 << 20), model, "seed {seed}: the whole file");
        let st = e.stats().nbw;
        (created, fetched) = (created + st.patches_created, fetched + st.fetches_async);
        match mode {
            Nbw::Off => assert_eq!(created, 0),
            Nbw::Lazy => assert!(created > 50 && fetched == 0, "seed {seed}: {created} {fetched}"),
            _ => assert!(created > 50 && fetched > 20, "seed {seed}: {created} {fetched}"),
        }
        let (_, err) = e.flush_cache(Reason::Flush, &mut |_, _| {});
        assert!(err.is_none());
        assert_eq!(lower_content(&lower), model, "seed {seed}: the lower file after write-back");
        eprintln!("{mode:?}: {created} patches, {fetched} fetched asynchronously; {st:?}");
    }
}

/// An engine as `start` makes it (on a fresh 256-frame region), lingering at a failpoint.
fn start_lingering(lower: &MemLower, cache: CacheConfig, linger: Linger) -> Engine<MemLower> {
    let pool = Pool::open(region(256), Consistency::Undo).unwrap().0;
    let config = EngineConfig {
        temp: TempConfig { enabled: false, ..TempConfig::default() },
        cache,
        failpoints: Some(Arc::new(linger)),
        passthrough: false,
        ..EngineConfig::default()
    };
    Engine::new(lower.clone(), pool, config).unwrap()
}

/// A failpoint that makes the thread that hits it linger, as a disk read would: the fetcher
/// between its read and its merge (`nbw.fetched`), a reader between its unlocked lower read
/// and its overlay (`cache.read_unlocked`).
#[derive(Debug)]
struct Linger(&'static str, u64);
impl engine::Failpoints for Linger {
    fn hit(&self, point: &'static str) {
        if point == self.0 {
            std::thread::sleep(std::time::Duration::from_micros(self.1));
        }
    }
}

/// The background fetcher reads a page without holding its file's lock (so writers are not
/// held up by the disk): writes, reads, truncates and write-backs run on this thread while
/// it fetches on another, lingering between its read and its merge, and every byte agrees
/// with a model. (A concurrency check, seeded but not replayable: thread timing decides
/// which fetches meet which changes; the version check that makes a changed page's fetch
/// give up is argued in `complete_patch`, this test does not reliably hit its window.)
#[test]
fn a_fetch_racing_writes_truncates_and_write_back_never_loses_a_byte() {
    let mut rng = ChaCha8Rng::seed_from_u64(77);
    let lower = MemLower::default();
    let mut model = pattern(32 * PAGE, 7);
    lower_file(&lower, &model);
    let cache = CacheConfig { patch_limit: PatchLimit::Frames(64), ..nbw(Nbw::AsyncBg) };
    let e = start_lingering(&lower, cache, Linger("nbw.fetched", 50));
    let (id, fh) = open(&e);
    let done = std::sync::atomic::AtomicBool::new(false);
    let so_far = std::sync::atomic::AtomicUsize::new(0);
    let merged = std::thread::scope(|s| {
        let fetcher = s.spawn(|| {
            let mut merged = 0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                merged += e.fetch_patches(2);
                so_far.store(merged, std::sync::atomic::Ordering::Relaxed);
                std::thread::yield_now();
            }
            merged
        });
        for step in 0..4000 {
            if step == 2000 {
                // On a loaded machine the fetcher may not have run yet: the second half of
                // the steps waits (bounded) until it has merged a page meanwhile.
                let t0 = std::time::Instant::now();
                while so_far.load(std::sync::atomic::Ordering::Relaxed) == 0
                    && t0.elapsed() < std::time::Duration::from_secs(10)
                {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            }
            match rng.random_range(0..100) {
                0..70 => {
                    let len = [1, 7, 100, 512, 3000][rng.random_range(0..5)];
                    let off = rng.random_range(0..34 * PAGE);
                    let byte: u8 = rng.random();
                    write(&e, fh, off, &vec![byte; len], &mut model);
                }
                70..82 => {
                    let off = rng.random_range(0..model.len() + 10);
                    let len = rng.random_range(1..2 * PAGE);
                    read_agrees(&e, fh, off, len, &model, &format!("step {step}"));
                }
                82..87 => {
                    let size = rng.random_range(16 * PAGE..36 * PAGE);
                    let set = SetAttr { size: Some(size as u64), ..SetAttr::default() };
                    e.setattr(id, Some(fh), &set, false).unwrap();
                    model.resize(size, 0);
                }
                _ => {
                    let (_, err) = e.flush_cache(Reason::Flush, &mut |_, _| {});
                    assert!(err.is_none(), "step {step}: {err:?}");
                }
            }
        }
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        fetcher.join().unwrap()
    });
    assert_eq!(read(&e, fh, 0, 1 << 20), model, "the whole file");
    e.check_cache().unwrap();
    assert!(merged > 0, "the fetcher merged no page while the writes ran");
    let (_, err) = e.flush_cache(Reason::Flush, &mut |_, _| {});
    assert!(err.is_none());
    assert_eq!(lower_content(&lower), model, "written back");
}

/// A cached read reads the lower file without its file's lock (a writer of the file does not
/// wait for a reader's disk read): while one thread rewrites page 0 with ever larger versions
/// (and then the file's last byte with the same version) and another writes the file back
/// over and over, a reader lingering after its lower read never returns a page mixed from two
/// versions, an older version than it returned before, one older than a write that returned
/// before the read began, or page 0 older than the last byte (a write-back that freed page 0
/// meanwhile made its lower read stale: it must read again). Without the `lower_gen` check the
/// last assertion fails. (Thread timing decides the interleavings; the assertions hold for
/// every one.)
#[test]
fn an_unlocked_read_never_returns_a_page_older_than_one_it_saw() {
    const PAGES: usize = 8;
    let lower = MemLower::default();
    lower_file(&lower, &vec![0u8; PAGES * PAGE]);
    let e = start_lingering(&lower, nbw(Nbw::Lazy), Linger("cache.read_unlocked", 200));
    let (_, fh) = open(&e);
    let done = std::sync::atomic::AtomicBool::new(false);
    let written = std::sync::atomic::AtomicU8::new(0);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                // (EAGAIN: the writer kept the file dirty through every attempt; go on.)
                let (_, err) = e.flush_cache(Reason::Flush, &mut |_, _| {});
                assert!(err.is_none() || format!("{err:?}").contains("os error 11"), "{err:?}");
                std::thread::sleep(std::time::Duration::from_micros(150));
            }
        });
        let reader = s.spawn(|| {
            let mut seen = [0u8; PAGES];
            let mut reads = 0u64;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                // A write that returned before the read began must be seen by it.
                let before = written.load(std::sync::atomic::Ordering::SeqCst);
                // The whole file at once: some pages in NVRAM, some read from the lower file.
                let all = read(&e, fh, 0, (PAGES * PAGE + 1) as u32);
                assert!(all[0] >= before, "version {} read after {before} was written", all[0]);
                // The last byte is written after page 0, with the same version: a read that
                // sees it must see page 0 at least as new.
                if let Some(&tail) = all.get(PAGES * PAGE) {
                    assert!(all[0] >= tail, "page 0 at version {} under a tail at {tail}", all[0]);
                }
                for (p, last) in seen.iter_mut().enumerate() {
                    let got = &all[p * PAGE..(p + 1) * PAGE];
                    assert!(got.iter().all(|&b| b == got[0]), "page {p} mixes versions");
                    assert!(got[0] >= *last, "page {p}: version {} after {}", got[0], *last);
                    *last = got[0];
                }
                reads += 1;
            }
            reads
        });
        // Page 0 takes versions; the others stay in the lower file, so that every read of the
        // whole file reads the lower file, also while page 0 is dirty and being written back.
        for version in 1..=250u8 {
            let data = vec![version; PAGE];
            assert_eq!(e.write(fh, 0, &data, false).unwrap(), PAGE);
            written.store(version, std::sync::atomic::Ordering::SeqCst);
            // The last byte, after page 0, with the same version; rewritten, it keeps the
            // record alive through most write-backs (a record without dirty pages is freed,
            // and a read that finds its record gone starts again anyway).
            for _ in 0..20 {
                assert_eq!(e.write(fh, (PAGES * PAGE) as u64, &[version], false).unwrap(), 1);
            }
            // Time for the reader and the write-back to meet this version.
            std::thread::sleep(std::time::Duration::from_micros(700));
        }
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(reader.join().unwrap() > 0);
    });
    let all = read(&e, fh, 0, (PAGES * PAGE) as u32);
    assert!(all[..PAGE].iter().all(|&b| b == 250) && all[PAGE..].iter().all(|&b| b == 0));
    e.check_cache().unwrap();
}
