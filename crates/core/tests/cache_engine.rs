//! The NVRAM page cache at its boundaries, on the engine over the in-memory lower file system
//! (tempfiles off, so every file is a lower file): fetches of partial pages, reads and
//! attributes overlaid on the lower file, truncates that hide lower bytes until written back,
//! pressure write-back under each policy against a model of every file's content, deleted
//! files' pages dropped, recovery of dirty pages after a restart, the operations that need the
//! lower file clean (O_DIRECT, fallocate, copy_file_range), --max-dirty-age, and a full NVRAM.

mod common;

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::sync::Arc;

use common::region;
use engine::{
    CacheConfig, Engine, EngineConfig, FsError, Nbw, Reason, Share, TempConfig, WritebackPolicy,
};
use lower::{Creds, Errno, LogicalClock, LowerFs, MemConfig, MemLower, SetAttr};
use nvram::SimRegion;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use txn::{Consistency, Pool};

const ROOT: Creds = Creds { uid: 0, gid: 0, groups: Vec::new() };
const PAGE: usize = 4096;

/// Temp files off, and every open on the NVRAM path (no kernel passthrough, which would take
/// the IO of a lower file away from the cache).
fn config(cache: CacheConfig) -> EngineConfig {
    EngineConfig {
        temp: TempConfig { enabled: false, ..TempConfig::default() },
        cache,
        passthrough: false,
        ..EngineConfig::default()
    }
}

/// The cache these tests are written against, where the mount's defaults differ: a writer
/// past the high watermark writes back in its own request (no background writer), and a
/// partial write to a page not in NVRAM becomes a patch fetched only when needed (`lazy`).
fn cache() -> CacheConfig {
    CacheConfig { background: false, nbw: Nbw::Lazy, ..CacheConfig::default() }
}

fn start(lower: &MemLower, region: &Arc<SimRegion>, cache: CacheConfig) -> Engine<MemLower> {
    let pool = Pool::open(region.clone(), Consistency::Undo).unwrap().0;
    Engine::new(lower.clone(), pool, config(cache)).unwrap()
}

fn name(s: &str) -> &OsStr {
    OsStr::new(s)
}

/// A durable lower file with `content`.
fn lower_file(lower: &MemLower, n: &str, content: &[u8]) {
    let (_, _, f) = lower.create(&ROOT, lower.root(), name(n), 0o644, libc::O_RDWR).unwrap();
    lower.write(&f, 0, content).unwrap();
    lower.sync_all();
}

fn lower_content(lower: &MemLower, n: &str) -> Vec<u8> {
    let (node, attr) = lower.lookup(lower.root(), name(n)).unwrap();
    let f = lower.open(&node, libc::O_RDONLY).unwrap();
    let mut buf = vec![0u8; attr.size as usize];
    let got = lower.read(&f, 0, &mut buf).unwrap();
    buf.truncate(got);
    buf
}

fn open(e: &Engine<MemLower>, n: &str, flags: i32) -> (u64, u64) {
    let id = e.lookup(e.root_id(), name(n)).unwrap().node_id;
    (id, e.open(id, flags).unwrap())
}

fn read(e: &Engine<MemLower>, fh: u64, offset: u64, len: u32) -> Vec<u8> {
    let mut out = Vec::new();
    e.read(fh, offset, len, |d| out.extend_from_slice(d)).unwrap();
    out
}

/// Panics with the differing range (not megabytes of bytes) when `got != want`.
fn same(got: &[u8], want: &[u8], what: &str) {
    if got == want {
        return;
    }
    let first = got.iter().zip(want).position(|(a, b)| a != b);
    let last = got.iter().zip(want).rposition(|(a, b)| a != b);
    panic!(
        "{what}: {} bytes, want {}; differ in {first:?}..={last:?}: got {:?} want {:?}",
        got.len(),
        want.len(),
        first.map(|f| &got[f..(f + 8).min(got.len())]),
        first.map(|f| &want[f..(f + 8).min(want.len())])
    );
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed)).collect()
}

#[test]
fn a_partial_write_fetches_the_page_and_reads_see_the_cache_over_the_lower_file() {
    let lower = MemLower::default();
    let base = pattern(10_000, 1);
    lower_file(&lower, "f", &base);
    let e = start(&lower, &region(64), CacheConfig { nbw: Nbw::Off, ..cache() });
    let (id, fh) = open(&e, "f", libc::O_RDWR);

    assert_eq!(e.write(fh, 5000, &[0xee; 100], false).unwrap(), 100);
    let mut want = base.clone();
    want[5000..5100].fill(0xee);
    assert_eq!(read(&e, fh, 0, 1 << 20), want);
    let st = e.stats();
    assert_eq!((st.cache.fetches, st.cache.files, st.writeback.pages_dirty), (1, 1, 1));
    assert_eq!(lower_content(&lower, "f"), base, "nothing reached the lower file yet");

    // A whole page is written without reading; the file grows beyond the lower size.
    e.write(fh, 3 * PAGE as u64, &[0x11; PAGE], false).unwrap();
    e.write(fh, 20_000, b"tail", false).unwrap();
    want.resize(20_004, 0);
    want[3 * PAGE..4 * PAGE].fill(0x11);
    want[20_000..].copy_from_slice(b"tail");
    assert_eq!(e.getattr(id).unwrap().size, 20_004);
    assert_eq!(read(&e, fh, 0, 1 << 20), want);
    assert_eq!(read(&e, fh, 9_990, 20), want[9_990..10_010], "lower bytes, then zeros");
    let st = e.stats();
    assert_eq!(st.cache.fetches, 1, "the page at 20000 lies beyond the lower size: no read");
    assert!(st.cache.hits >= 1);

    let (written, err) = e.flush_cache(Reason::Flush, &mut |_, _| {});
    assert_eq!((written, err), (3, None));
    assert_eq!(lower_content(&lower, "f"), want);
    let st = e.stats();
    assert_eq!((st.cache.files, st.writeback.pages_dirty), (0, 0), "the record is freed");
    assert_eq!(read(&e, fh, 0, 1 << 20), want);
    e.release(fh).unwrap();
    e.shutdown();
}

#[test]
fn a_truncate_hides_lower_bytes_until_the_write_back_cuts_the_lower_file() {
    let lower = MemLower::default();
    lower_file(&lower, "f", &[b'x'; 3 * PAGE]);
    let e = start(&lower, &region(64), cache());
    let (id, fh) = open(&e, "f", libc::O_RDWR);
    e.write(fh, 0, b"head", false).unwrap();
    let set = |size| SetAttr { size: Some(size), ..SetAttr::default() };
    assert_eq!(e.setattr(id, Some(fh), &set(100), false).unwrap().size, 100);
    assert_eq!(e.setattr(id, Some(fh), &set(3 * PAGE as u64), false).unwrap().size, 12_288);
    let mut want = vec![0u8; 3 * PAGE];
    want[..4].copy_from_slice(b"head");
    want[4..100].fill(b'x');
    assert_eq!(read(&e, fh, 0, 1 << 20), want, "bytes beyond the truncate read as zeros");
    assert_eq!(lower_content(&lower, "f"), vec![b'x'; 3 * PAGE], "lower untouched so far");
    e.flush_cache(Reason::Flush, &mut |_, _| {});
    assert_eq!(lower_content(&lower, "f"), want);
    assert_eq!(e.stats().cache.files, 0);
    // Truncate of a file without dirty pages goes straight to the lower file.
    e.setattr(id, Some(fh), &set(10), false).unwrap();
    assert_eq!(lower_content(&lower, "f"), want[..10]);
    e.release(fh).unwrap();
    e.shutdown();
}

/// Random writes and truncates over four files with NVRAM for far fewer pages than they
/// touch: write-back rounds run all the time; the content read back always equals a model,
/// and after the final flush so does the lower directory alone.
#[test]
fn under_pressure_every_policy_writes_back_and_no_byte_is_lost() {
    for chosen in WritebackPolicy::ALL {
        let policy = chosen.name();
        let lower = MemLower::default();
        let files = ["a", "b", "c", "d"];
        let mut model: BTreeMap<&str, Vec<u8>> = BTreeMap::new();
        for (i, f) in files.iter().enumerate() {
            let content = pattern(6 * PAGE + i * 1000, i as u8);
            lower_file(&lower, f, &content);
            model.insert(f, content);
        }
        let cache = CacheConfig {
            policy: chosen,
            dirty_high: Share::Frames(16),
            dirty_low: Share::Frames(8),
            batch_pages: 4,
            zone_blocks: 8,
            ..cache()
        };
        let e = start(&lower, &region(48), cache);
        let handles: Vec<(u64, u64)> = files.iter().map(|f| open(&e, f, libc::O_RDWR)).collect();
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for step in 0..600 {
            let i = rng.random_range(0..files.len());
            let (id, fh) = handles[i];
            let m = model.get_mut(files[i]).unwrap();
            if step % 50 == 49 {
                let size = rng.random_range(0..8 * PAGE);
                let set = SetAttr { size: Some(size as u64), ..SetAttr::default() };
                e.setattr(id, Some(fh), &set, false).unwrap();
                m.resize(size, 0);
            } else {
                // Hot pages (the first two) are rewritten often; the rest now and then.
                let page = if rng.random_bool(0.6) {
                    rng.random_range(0..2)
                } else {
                    rng.random_range(0..10)
                };
                let off = page * PAGE + rng.random_range(0..PAGE);
                let len = rng.random_range(1..2 * PAGE);
                let byte = rng.random_range(0..=255u8);
                e.write(fh, off as u64, &vec![byte; len], false).unwrap();
                if m.len() < off + len {
                    m.resize(off + len, 0);
                }
                m[off..off + len].fill(byte);
            }
            if step % 97 == 0 {
                e.check_cache().unwrap_or_else(|err| panic!("{policy} step {step}: {err}"));
                for (j, f) in files.iter().enumerate() {
                    assert_eq!(
                        read(&e, handles[j].1, 0, 1 << 20),
                        model[f],
                        "{policy} step {step} {f}"
                    );
                }
            }
        }
        let st = e.stats();
        assert!(st.writeback.pages_written > 50, "{policy}: {:?}", st.writeback);
        assert!(st.writeback.rounds["pressure"] > 0, "{policy}");
        assert!(st.writeback.pages_dirty <= 16 + 4, "{policy}: {:?}", st.writeback);
        // Whole files or zones chosen are written NR_WB pages a batch.
        assert!(
            st.writeback.pages_written <= st.writeback.batches * 4,
            "{policy}: {:?}",
            st.writeback
        );
        eprintln!(
            "{policy}: {} pages written in {} batches, {} requests, {} repeated, distance {}",
            st.writeback.pages_written,
            st.writeback.batches,
            st.writeback.requests,
            st.writeback.repeated_pages,
            st.writeback.inter_request_distance_blocks
        );
        for (j, f) in files.iter().enumerate() {
            assert_eq!(read(&e, handles[j].1, 0, 1 << 20), model[f], "{policy} {f}");
            e.release(handles[j].1).unwrap();
        }
        assert_eq!(e.flush_cache(Reason::Flush, &mut |_, _| {}).1, None);
        for f in files {
            assert_eq!(lower_content(&lower, f), model[f], "{policy} lower {f}");
        }
        e.shutdown();
    }
}

#[test]
fn the_dirty_pages_of_a_deleted_file_are_dropped_when_the_kernel_forgets_it() {
    let lower = MemLower::default();
    lower_file(&lower, "gone", &[1; PAGE]);
    let e = start(&lower, &region(64), cache());
    let (id, fh) = open(&e, "gone", libc::O_RDWR);
    e.write(fh, 0, &[2; 3 * PAGE], false).unwrap();
    e.unlink(e.root_id(), name("gone")).unwrap();
    // Still open: the data lives on.
    assert_eq!(read(&e, fh, 0, 1 << 20), vec![2; 3 * PAGE]);
    e.release(fh).unwrap();
    e.forget(id, 1);
    let st = e.stats();
    assert_eq!((st.cache.pages_dropped, st.cache.files, st.writeback.pages_dirty), (3, 0, 0));
    assert_eq!(st.writeback.pages_written, 0, "never written to the lower file system");
    e.shutdown();
}

#[test]
fn dirty_pages_survive_a_restart_and_are_written_back_later() {
    let lower = MemLower::default();
    lower_file(&lower, "f", &pattern(2 * PAGE, 3));
    let reg = region(64);
    let keep = CacheConfig { writeback_on_unmount: false, ..cache() };
    let e = start(&lower, &reg, keep.clone());
    let (_, fh) = open(&e, "f", libc::O_RDWR);
    e.write(fh, 100, b"kept in NVRAM", false).unwrap();
    e.write(fh, 5 * PAGE as u64, b"appended", false).unwrap();
    let want = read(&e, fh, 0, 1 << 20);
    e.release(fh).unwrap();
    e.shutdown();
    assert_eq!(lower_content(&lower, "f"), pattern(2 * PAGE, 3), "kept, not written back");

    // A crash of the lower file system loses nothing: it never had those writes.
    let crashed = lower.crash();
    let e = start(&crashed, &reg, keep);
    assert_eq!(e.stats().cache.files, 1);
    let (id, fh) = open(&e, "f", libc::O_RDONLY);
    assert_eq!(read(&e, fh, 0, 1 << 20), want);
    assert_eq!(e.getattr(id).unwrap().size, want.len() as u64);
    e.release(fh).unwrap();
    e.flush_cache(Reason::Flush, &mut |_, _| {});
    assert_eq!(lower_content(&crashed, "f"), want);
    e.shutdown();
}

#[test]
fn o_direct_fallocate_and_copy_file_range_see_what_the_application_wrote() {
    let lower = MemLower::default();
    lower_file(&lower, "src", &[b's'; 2 * PAGE]);
    lower_file(&lower, "dst", &[b'd'; 2 * PAGE]);
    let e = start(&lower, &region(64), cache());
    let (_, src) = open(&e, "src", libc::O_RDWR);
    e.write(src, 0, &[b'S'; PAGE], false).unwrap();
    // copy_file_range from a cached file copies the cached bytes.
    let (_, dst) = open(&e, "dst", libc::O_RDWR);
    assert_eq!(e.copy_file_range(src, 0, dst, PAGE as u64, PAGE as u64).unwrap(), PAGE as u64);
    let mut want = vec![b'd'; PAGE];
    want.extend_from_slice(&[b'S'; PAGE]);
    assert_eq!(read(&e, dst, 0, 1 << 20), want);
    // O_DIRECT IO goes to the lower file: the cached pages are written back first.
    let (_, direct) = open(&e, "dst", libc::O_RDWR | libc::O_DIRECT);
    let mut direct_read = Vec::new();
    e.read(direct, 0, 2 * PAGE as u32, |d| direct_read.extend_from_slice(d)).unwrap();
    assert_eq!(direct_read, want);
    assert!(e.stats().writeback.rounds["coherence"] >= 1);
    // fallocate needs the lower file clean too.
    e.write(src, 10, b"dirty again", false).unwrap();
    e.fallocate(src, 0, 0, 4 * PAGE as u64).unwrap();
    let mut s = vec![b'S'; PAGE];
    s[10..21].copy_from_slice(b"dirty again");
    s.extend_from_slice(&[b's'; PAGE]);
    s.resize(4 * PAGE, 0);
    assert_eq!(lower_content(&lower, "src"), s);
    assert_eq!(read(&e, src, 0, 1 << 20), s);
    for fh in [src, dst, direct] {
        e.release(fh).unwrap();
    }
    e.shutdown();
}

#[test]
fn pages_older_than_max_dirty_age_are_written_back() {
    let clock = Arc::new(LogicalClock::default());
    let lower = MemLower::new(MemConfig { clock: clock.clone(), ..MemConfig::default() });
    lower_file(&lower, "f", &[0; PAGE]);
    let cache = CacheConfig { max_dirty_age: 30, ..cache() };
    let e = start(&lower, &region(64), cache);
    let (_, fh) = open(&e, "f", libc::O_RDWR);
    e.write(fh, 0, b"old", false).unwrap();
    clock.set(LogicalClock::DEFAULT_START_SECS + 20, 0);
    e.write(fh, PAGE as u64, b"young", false).unwrap();
    assert_eq!(e.writeback_aged().unwrap(), 0, "nothing is 30 s old yet");
    clock.set(LogicalClock::DEFAULT_START_SECS + 31, 0);
    assert_eq!(e.writeback_aged().unwrap(), 1, "only the old page");
    assert_eq!(&lower_content(&lower, "f")[..3], b"old");
    assert_eq!(e.stats().writeback.pages_dirty, 1);
    e.release(fh).unwrap();
    e.shutdown();
}

#[test]
fn a_full_nvram_writes_back_or_writes_through_never_fails_a_write() {
    let lower = MemLower::default();
    lower_file(&lower, "big", &[]);
    // 24 frames and watermarks the writer never reaches: only "no free frame" makes room.
    let cache = CacheConfig {
        dirty_high: Share::Frames(u64::MAX - 1),
        dirty_low: Share::Frames(0),
        batch_pages: 8,
        ..cache()
    };
    let e = start(&lower, &region(24), cache);
    let (_, fh) = open(&e, "big", libc::O_RDWR);
    let data = pattern(64 * PAGE, 9);
    for chunk in 0..16 {
        let at = chunk * 4 * PAGE;
        assert_eq!(e.write(fh, at as u64, &data[at..at + 4 * PAGE], false).unwrap(), 4 * PAGE);
    }
    assert_eq!(read(&e, fh, 0, 1 << 22), data);
    let st = e.stats();
    assert!(st.writeback.rounds["nvram_full"] > 0, "{:?}", st.writeback);
    e.release(fh).unwrap();
    e.shutdown();
    assert_eq!(lower_content(&lower, "big"), data);
}

/// A 32-frame region's cache with the background writer on: rounds from 12 pages down to 4,
/// in batches of 4.
fn background_cache() -> CacheConfig {
    CacheConfig {
        dirty_high: Share::Frames(12),
        dirty_low: Share::Frames(4),
        batch_pages: 4,
        background: true,
        ..cache()
    }
}

/// `--writeback-background`: a writer past the high watermark starts no round; the background
/// writer's round takes the cache down to the low watermark (counted `background`); a full
/// NVRAM still makes room in the writer's request; and with two writers beside a background
/// writer that never stops, every byte is where the model says.
#[test]
fn background_write_back_takes_the_rounds_off_the_writers() {
    let lower = MemLower::default();
    let mut model = pattern(40 * PAGE, 9);
    lower_file(&lower, "f", &model);
    let cache = background_cache();
    let e = start(&lower, &region(32), cache);
    let (_, fh) = open(&e, "f", libc::O_RDWR);
    let put = |e: &Engine<MemLower>, page: usize, byte: u8, model: &mut Vec<u8>| {
        e.write(fh, (page * PAGE) as u64, &[byte; PAGE], false).unwrap();
        model[page * PAGE..(page + 1) * PAGE].fill(byte);
    };
    // The writer's bell (the daemon's writer sleeps on it) rings for every write that leaves
    // the cache above the mark (12 frames: the record frame and 11 pages), and only then.
    for page in 0..11 {
        put(&e, page, 1, &mut model);
    }
    assert_eq!(e.writer_bell().rung(), 0, "at the mark, not above it");
    for page in 11..20 {
        put(&e, page, 1, &mut model);
    }
    assert_eq!(e.writer_bell().rung(), 9);
    let st = e.stats();
    assert_eq!((st.writeback.rounds["pressure"], st.writeback.pages_dirty), (0, 20));
    // 20 pages and the record frame: 21 frames, down to 4 at least (the policy may take a
    // little more: whole zones).
    let written = e.writeback_in_background();
    assert!((17..=20).contains(&written), "{written}");
    assert_eq!(e.writeback_in_background(), 0, "below the high watermark: nothing due");
    let st = e.stats();
    assert_eq!((st.writeback.rounds["background"], st.writeback.pages_dirty), (1, 20 - written));
    same(&read(&e, fh, 0, 1 << 22), &model, "after the background round");
    // 40 pages more than the 32 frames hold: with no background round the writer makes room.
    for page in 0..40 {
        put(&e, page, 2, &mut model);
    }
    let st = e.stats();
    assert!(st.writeback.rounds["nvram_full"] > 0, "{:?}", st.writeback);
    assert_eq!(st.writeback.rounds["pressure"], 0);
    same(&read(&e, fh, 0, 1 << 22), &model, "after NVRAM was full");
    e.check_cache().unwrap();
    e.release(fh).unwrap();

    // Two writers of their own files beside a background writer looping.
    let e = Arc::new(e);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let background = {
        let (e, stop) = (Arc::clone(&e), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut written = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                written += e.writeback_in_background();
                std::thread::yield_now();
            }
            written
        })
    };
    let writers: Vec<_> = (0..2u8)
        .map(|t| {
            let e = Arc::clone(&e);
            let name = format!("w{t}");
            lower_file(&lower, &name, &pattern(16 * PAGE, t));
            std::thread::spawn(move || {
                let (_, fh) = open(&e, &name, libc::O_RDWR);
                let mut model = pattern(16 * PAGE, t);
                let mut rng = ChaCha8Rng::seed_from_u64(40 + u64::from(t));
                for _ in 0..600 {
                    let off = rng.random_range(0..16 * PAGE);
                    let len = rng.random_range(1..2 * PAGE).min(16 * PAGE - off);
                    let byte = rng.random_range(1..=255u8);
                    e.write(fh, off as u64, &vec![byte; len], false).unwrap();
                    model[off..off + len].fill(byte);
                }
                same(&read(&e, fh, 0, 1 << 22), &model, &format!("writer {t}"));
                e.release(fh).unwrap();
                (name, model)
            })
        })
        .collect();
    let models: Vec<(String, Vec<u8>)> = writers.into_iter().map(|w| w.join().unwrap()).collect();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let written = background.join().unwrap();
    assert!(written > 0, "the background writer wrote back beside the writers");
    let Ok(e) = Arc::try_unwrap(e) else { panic!("the threads are done") };
    e.check_cache().unwrap();
    assert_eq!(e.stats().writeback.rounds["pressure"], 0, "no writer ran a pressure round");
    e.shutdown();
    same(&lower_content(&lower, "f"), &model, "f after the unmount's write-back");
    for (name, want) in &models {
        same(&lower_content(&lower, name), want, &format!("{name} after the write-back"));
    }
}

/// Gates in the background writer's round: after its first batch's lower writes it waits
/// until the writer beside it found NVRAM full (`retries.write`, at most 20 s); after each
/// freed batch (up to 8) it waits up to 2 s for the writer to write again, and notes whether
/// it did while the round was still running. (Each freed batch gets its own chance: a writer
/// that began to wait just after a batch was freed goes on after the next one.)
#[derive(Debug, Default)]
struct RoomGate {
    engine: std::sync::OnceLock<std::sync::Weak<Engine<MemLower>>>,
    progress: std::sync::atomic::AtomicU64,
    step: std::sync::atomic::AtomicU64,
    wrote_during_round: std::sync::atomic::AtomicBool,
}

impl RoomGate {
    /// Whether the round reached its first gate (the writer starts then).
    fn round_started(&self) -> bool {
        self.step.load(std::sync::atomic::Ordering::SeqCst) > 0
    }

    fn writer_found_nvram_full(&self) -> bool {
        let e = self.engine.get().and_then(std::sync::Weak::upgrade);
        e.is_some_and(|e| e.stats().retries.get("write").copied().unwrap_or(0) > 0)
    }
}

impl engine::Failpoints for RoomGate {
    fn hit(&self, point: &'static str) {
        use std::sync::atomic::Ordering::SeqCst;
        use std::time::{Duration, Instant};
        let step = self.step.load(SeqCst);
        if point == "writeback.written" && step == 0 {
            self.step.store(1, SeqCst);
            let deadline = Instant::now() + Duration::from_secs(20);
            while !self.writer_found_nvram_full() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            std::thread::sleep(Duration::from_millis(50)); // on its way to the wait
        } else if point == "writeback.freed"
            && (1..=8).contains(&step)
            && !self.wrote_during_round.load(SeqCst)
        {
            self.step.store(step + 1, SeqCst);
            let before = self.progress.load(SeqCst);
            let deadline = Instant::now() + Duration::from_secs(2);
            while Instant::now() < deadline {
                if self.progress.load(SeqCst) > before {
                    self.wrote_during_round.store(true, SeqCst);
                    return;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
}

/// With `--writeback-background`, a writer that finds NVRAM full while the background round
/// runs goes on as soon as that round frees one batch (`writeback.room_waits`), not when the
/// round ends; every byte is where the model says.
#[test]
fn a_writer_that_finds_nvram_full_waits_for_one_batch_not_the_round() {
    use std::sync::atomic::Ordering::SeqCst;
    let lower = MemLower::default();
    let mut model = pattern(64 * PAGE, 3);
    lower_file(&lower, "f", &model);
    let gate = Arc::new(RoomGate::default());
    let cache = background_cache();
    let pool = Pool::open(region(32), Consistency::Undo).unwrap().0;
    let config = EngineConfig { failpoints: Some(gate.clone()), ..config(cache) };
    let e = Arc::new(Engine::new(lower.clone(), pool, config).unwrap());
    gate.engine.set(Arc::downgrade(&e)).unwrap();
    let (_, fh) = open(&e, "f", libc::O_RDWR);
    for page in 0..16 {
        e.write(fh, (page * PAGE) as u64, &[1; PAGE], false).unwrap();
        model[page * PAGE..(page + 1) * PAGE].fill(1);
    }
    // The background writer's round (16 pages and a record frame: past the high watermark).
    let background = {
        let e = Arc::clone(&e);
        std::thread::spawn(move || e.writeback_in_background())
    };
    // The writer, once the round runs: the other 48 pages, whole, more than the free frames
    // hold.
    let writer = {
        let (e, gate) = (Arc::clone(&e), Arc::clone(&gate));
        std::thread::spawn(move || {
            while !gate.round_started() {
                std::thread::yield_now();
            }
            for page in 16..64u64 {
                e.write(fh, page * PAGE as u64, &[2; PAGE], false).unwrap();
                gate.progress.fetch_add(1, SeqCst);
            }
        })
    };
    let written = background.join().unwrap();
    writer.join().unwrap();
    model[16 * PAGE..].fill(2);
    assert!(written > 0, "the background round wrote back");
    assert!(gate.step.load(SeqCst) >= 2, "the round passed its gates");
    assert!(
        gate.wrote_during_round.load(SeqCst),
        "the writer wrote again after one of the round's freed batches, while the round ran"
    );
    let st = e.stats();
    assert!(st.writeback.room_waits >= 1, "{:?}", st.writeback);
    assert_eq!(st.writeback.rounds["pressure"], 0, "no writer ran a pressure round");
    same(&read(&e, fh, 0, 1 << 22), &model, "after the writes");
    e.check_cache().unwrap();
    e.release(fh).unwrap();
    let Ok(e) = Arc::try_unwrap(e) else { panic!("the writer is done") };
    e.shutdown();
    same(&lower_content(&lower, "f"), &model, "the lower file after the unmount's write-back");
}

/// Runs a closure once when the engine reaches a failpoint: the test interleaves operations
/// with a write-back at an exact step (the write-back holds no file lock between its steps).
struct Hook {
    at: &'static str,
    run: std::sync::Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl std::fmt::Debug for Hook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Hook({})", self.at)
    }
}

impl engine::Failpoints for Hook {
    fn hit(&self, point: &'static str) {
        if point == self.at {
            let run = self.run.lock().unwrap().take();
            if let Some(run) = run {
                run();
            }
        }
    }
}

/// Between the lower writes of a batch and its freeing transaction, the application rewrites
/// one page and truncates another away and writes it again (a fresh page in a reused frame):
/// neither may be freed as written back, and the final content is the application's.
#[test]
fn pages_changed_during_a_write_back_stay_dirty() {
    let lower = MemLower::default();
    lower_file(&lower, "f", &[b'a'; 2 * PAGE]);
    let hook = Arc::new(Hook { at: "writeback.written", run: std::sync::Mutex::new(None) });
    let pool = Pool::open(region(64), Consistency::Undo).unwrap().0;
    let config = EngineConfig { failpoints: Some(hook.clone()), ..config(cache()) };
    let e = Arc::new(Engine::new(lower.clone(), pool, config).unwrap());
    let (id, fh) = open(&e, "f", libc::O_RDWR);
    e.write(fh, 0, &[b'b'; PAGE], false).unwrap();
    e.write(fh, PAGE as u64, &[b'B'; PAGE], false).unwrap();
    let weak = Arc::downgrade(&e);
    *hook.run.lock().unwrap() = Some(Box::new(move || {
        let e = weak.upgrade().unwrap();
        // Page 0 rewritten in place.
        e.write(fh, 0, &[b'd'; PAGE], false).unwrap();
        // Page 1 truncated away, then written again: a new page, maybe in the same frame.
        let set = SetAttr { size: Some(PAGE as u64), ..SetAttr::default() };
        e.setattr(id, Some(fh), &set, false).unwrap();
        e.write(fh, PAGE as u64, &[b'C'; PAGE], false).unwrap();
    }));
    let (_, err) = e.flush_cache(Reason::Flush, &mut |_, _| {});
    assert_eq!(err, None);
    assert!(hook.run.lock().unwrap().is_none(), "the hook ran");
    let mut want = vec![b'd'; PAGE];
    want.extend_from_slice(&[b'C'; PAGE]);
    let got = read(&e, fh, 0, 1 << 20);
    assert!(
        got == want,
        "got {} bytes: {:?}",
        got.len(),
        got.chunks(PAGE).map(|c| c[0] as char).collect::<String>()
    );
    e.flush_cache(Reason::Flush, &mut |_, _| {});
    assert!(lower_content(&lower, "f") == want, "the lower file after the second flush");
    e.release(fh).unwrap();
    Arc::try_unwrap(e).unwrap().shutdown();
}

/// Four threads write, truncate and read their own files and a shared one while tiny
/// watermarks make every write start a write-back round and records come and go (frames are
/// reused at once): afterwards the volatile mirror is consistent and every private file equals
/// its model; the shared file equals one of the writes' interleavings page by page.
#[test]
fn concurrent_writers_and_write_back_keep_the_mirror_consistent() {
    let lower = MemLower::default();
    for t in 0..4 {
        lower_file(&lower, &format!("own{t}"), &pattern(8 * PAGE, t));
    }
    lower_file(&lower, "shared", &vec![0; 8 * PAGE]);
    let cache = CacheConfig {
        policy: WritebackPolicy::Relo,
        dirty_high: Share::Frames(6),
        dirty_low: Share::Frames(2),
        batch_pages: 3,
        zone_blocks: 4,
        ..cache()
    };
    let e = Arc::new(start(&lower, &region(96), cache));
    let threads: Vec<_> = (0..4u8)
        .map(|t| {
            let e = Arc::clone(&e);
            std::thread::spawn(move || {
                let mut rng = ChaCha8Rng::seed_from_u64(100 + u64::from(t));
                let (id, fh) = open(&e, &format!("own{t}"), libc::O_RDWR);
                let (_, shared) = open(&e, "shared", libc::O_RDWR);
                let mut model = pattern(8 * PAGE, t);
                for step in 0..2000 {
                    match rng.random_range(0..10) {
                        0 => {
                            let size = rng.random_range(0..10 * PAGE);
                            let set = SetAttr { size: Some(size as u64), ..SetAttr::default() };
                            e.setattr(id, Some(fh), &set, false).unwrap();
                            model.resize(size, 0);
                        }
                        1 => {
                            // Whole pages of the shared file, each write one page of one byte.
                            let page = rng.random_range(0..8);
                            e.write(shared, (page * PAGE) as u64, &[t + 1; PAGE], false).unwrap();
                        }
                        2 => {
                            same(
                                &read(&e, fh, 0, 1 << 20),
                                &model,
                                &format!("thread {t} step {step}"),
                            );
                        }
                        _ => {
                            let off = rng.random_range(0..10 * PAGE);
                            let len = rng.random_range(1..3 * PAGE);
                            let byte = rng.random_range(1..=255u8);
                            e.write(fh, off as u64, &vec![byte; len], false).unwrap();
                            if model.len() < off + len {
                                model.resize(off + len, 0);
                            }
                            model[off..off + len].fill(byte);
                        }
                    }
                }
                same(&read(&e, fh, 0, 1 << 20), &model, &format!("thread {t} at the end"));
                e.release(fh).unwrap();
                e.release(shared).unwrap();
                model
            })
        })
        .collect();
    let models: Vec<Vec<u8>> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    e.check_cache().unwrap();
    let st = e.stats();
    assert!(st.writeback.rounds["pressure"] > 10, "{:?}", st.writeback);
    let (_, shared) = open(&e, "shared", libc::O_RDONLY);
    let content = read(&e, shared, 0, 1 << 20);
    e.release(shared).unwrap();
    for page in content.chunks(PAGE) {
        assert!(page.iter().all(|&b| b == page[0]) && page[0] <= 4, "a torn shared page");
    }
    assert_eq!(e.flush_cache(Reason::Flush, &mut |_, _| {}).1, None);
    e.check_cache().unwrap();
    for (t, model) in models.iter().enumerate() {
        assert!(lower_content(&lower, &format!("own{t}")) == *model, "lower own{t}");
    }
    assert_eq!(lower_content(&lower, "shared"), content);
    Arc::try_unwrap(e).unwrap().shutdown();
}

/// A truncate between the lower writes of a batch and its freeing transaction: the lower
/// file is then longer than the file, so the record must stay to hide the tail; growing the
/// file later shows zeros there, never the old bytes.
#[test]
fn a_truncate_during_a_write_back_keeps_the_tail_hidden() {
    let lower = MemLower::default();
    lower_file(&lower, "f", &[]);
    let hook = Arc::new(Hook { at: "writeback.written", run: std::sync::Mutex::new(None) });
    let pool = Pool::open(region(64), Consistency::Undo).unwrap().0;
    let config = EngineConfig { failpoints: Some(hook.clone()), ..config(cache()) };
    let e = Arc::new(Engine::new(lower.clone(), pool, config).unwrap());
    let (id, fh) = open(&e, "f", libc::O_RDWR);
    e.write(fh, 0, &[b'x'; 3 * PAGE], false).unwrap();
    let weak = Arc::downgrade(&e);
    *hook.run.lock().unwrap() = Some(Box::new(move || {
        let e = weak.upgrade().unwrap();
        let set = SetAttr { size: Some(PAGE as u64 + 100), ..SetAttr::default() };
        e.setattr(id, Some(fh), &set, false).unwrap();
    }));
    assert_eq!(e.flush_cache(Reason::Flush, &mut |_, _| {}).1, None);
    assert_eq!(e.getattr(id).unwrap().size, PAGE as u64 + 100);
    e.write(fh, 5 * PAGE as u64, b"end", false).unwrap();
    let mut want = vec![b'x'; PAGE + 100];
    want.resize(5 * PAGE, 0);
    want.extend_from_slice(b"end");
    same(&read(&e, fh, 0, 1 << 20), &want, "after the grow");
    e.flush_cache(Reason::Flush, &mut |_, _| {});
    same(&lower_content(&lower, "f"), &want, "the lower file");
    e.check_cache().unwrap();
    e.release(fh).unwrap();
    Arc::try_unwrap(e).unwrap().shutdown();
}

/// `repeated_pages` (thesis Fig 4.12) counts a page of one file written back again, not the
/// page of a new file that got a deleted file's inode number (Postmark deletes and creates all
/// the time).
#[test]
fn repeated_pages_count_one_file_not_a_reused_inode_number() {
    let lower = MemLower::default();
    lower_file(&lower, "a", &pattern(2 * PAGE, 1));
    let e = start(&lower, &region(64), cache());
    let flush = |e: &Engine<MemLower>| {
        assert_eq!(e.flush_cache(Reason::Flush, &mut |_, _| {}).1, None);
        let st = e.stats().writeback;
        (st.pages_written, st.repeated_pages)
    };
    let (id, fh) = open(&e, "a", libc::O_RDWR);
    let ino = e.getattr(id).unwrap().ino;
    e.write(fh, 0, &[1; PAGE], false).unwrap();
    assert_eq!(flush(&e), (1, 0));
    e.write(fh, 0, &[2; PAGE], false).unwrap();
    assert_eq!(flush(&e), (2, 1), "the same page of the same file again");
    e.release(fh).unwrap();
    e.unlink(e.root_id(), name("a")).unwrap();
    e.forget(id, 1);
    lower.sync_all();

    lower_file(&lower, "b", &pattern(2 * PAGE, 2));
    let (id, fh) = open(&e, "b", libc::O_RDWR);
    assert_eq!(e.getattr(id).unwrap().ino, ino, "the test needs the inode number reused");
    e.write(fh, 0, &[3; PAGE], false).unwrap();
    assert_eq!(flush(&e), (3, 1), "another file's page 0 is not a repeat");
    assert_eq!(lower_content(&lower, "b")[..PAGE], [3; PAGE]);
}

#[test]
fn cached_files_records_are_packed_eight_to_a_frame_and_their_frames_freed() {
    let lower = MemLower::default();
    for i in 0..17 {
        lower_file(&lower, &format!("f{i}"), &pattern(PAGE, i));
    }
    let reg = region(64);
    let e = start(&lower, &reg, cache());
    let free0 = e.stats().nvram.frames_free;
    for i in 0..17 {
        let (id, fh) = open(&e, &format!("f{i}"), libc::O_RDWR);
        e.write(fh, 0, b"page", false).unwrap();
        e.release(fh).unwrap();
        e.forget(id, 1);
    }
    let s = e.stats();
    assert_eq!((s.cache.files, s.cache.record_frames, s.writeback.pages_dirty), (17, 3, 17));
    assert_eq!(free0 - s.nvram.frames_free, 17 + 3, "a page each and 3 record frames");
    // Written back, every record goes; a flush keeps no empty record frame.
    e.flush_cache(Reason::Flush, &mut |_, _| {});
    let s = e.stats();
    assert_eq!((s.cache.files, s.cache.record_frames), (0, 0), "{:?}", s.cache);
    assert_eq!(s.nvram.frames_free, free0);
    for i in 0..17u8 {
        let mut want = pattern(PAGE, i);
        want[..4].copy_from_slice(b"page");
        assert_eq!(lower_content(&lower, &format!("f{i}")), want, "f{i}");
    }
}

#[test]
fn a_record_in_a_whole_frame_from_before_the_packing_is_recovered_and_written_back() {
    use engine::cache::record::{KIND_PAGE, KIND_RECORD, Record};
    let lower = MemLower::default();
    lower_file(&lower, "old", &pattern(2 * PAGE, 9));
    let reg = region(64);
    // What an earlier nvstack left: the record alone at offset 0 of a KIND_RECORD frame, its
    // dirty page's frame owned by that frame's number.
    let (node, attr) = lower.lookup(lower.root(), name("old")).unwrap();
    let rec = Record {
        size: attr.size,
        valid: attr.size,
        mtime: attr.mtime,
        ctime: attr.ctime,
        serial: 1,
        handle: lower.file_handle(&node).unwrap(),
    };
    let pool = Pool::open(reg.clone(), Consistency::Undo).unwrap().0;
    let mut tx = pool.begin();
    let object = tx.alloc_frame(txn::FrameTag { kind: KIND_RECORD, owner: 0, index: 0 }).unwrap();
    tx.write(pool.frame_offset(object), &rec.encode());
    let page =
        tx.alloc_frame(txn::FrameTag { kind: KIND_PAGE, owner: object.0, index: 1 }).unwrap();
    tx.write(pool.frame_offset(page), &pattern(PAGE, 77));
    tx.commit();
    drop(pool);
    let e = start(&lower, &reg, cache());
    let s = e.stats();
    assert_eq!((s.cache.files, s.cache.record_frames, s.writeback.pages_dirty), (1, 1, 1));
    let (_, fh) = open(&e, "old", libc::O_RDWR);
    let mut want = pattern(2 * PAGE, 9);
    want[PAGE..].copy_from_slice(&pattern(PAGE, 77));
    assert_eq!(read(&e, fh, 0, 1 << 20), want, "the old page over the lower file");
    e.write(fh, 0, b"new", false).unwrap();
    want[..3].copy_from_slice(b"new");
    e.release(fh).unwrap();
    e.flush_cache(Reason::Flush, &mut |_, _| {});
    assert_eq!(lower_content(&lower, "old"), want);
    assert_eq!((e.stats().cache.files, e.stats().cache.record_frames), (0, 0), "its frame freed");
    assert_eq!(e.stats().nvram.frames_free, e.stats().nvram.frames_total);
    e.shutdown();
}

/// A temp file's pages and a cached file's dirty pages take one NVRAM data path: both refuse a
/// write or a truncate past `i64::MAX` (the kernel's limit for a FUSE file) with EFBIG, and a
/// refused call changes nothing.
#[test]
fn temp_files_and_cached_files_refuse_the_same_sizes() {
    let lower = MemLower::default();
    lower_file(&lower, "cached", b"lower");
    let temp = TempConfig { share: Share::Percent(100), ..TempConfig::default() };
    let config = EngineConfig { temp, ..config(cache()) };
    let e =
        Engine::new(lower.clone(), Pool::open(region(64), Consistency::Undo).unwrap().0, config)
            .unwrap();
    let (_, temp_fh) = e.create(&ROOT, e.root_id(), name("temp"), 0o644, libc::O_RDWR).unwrap();
    let (cached_id, cached_fh) = open(&e, "cached", libc::O_RDWR);
    let temp_id = e.lookup(e.root_id(), name("temp")).unwrap().node_id;
    for fh in [temp_fh, cached_fh] {
        e.write(fh, 0, b"x", false).unwrap();
    }
    assert_eq!(e.stats().tempfiles.files_resident, 1, "one temp file");
    assert_eq!(e.stats().cache.files, 1, "one cached file");
    let max = i64::MAX as u64;
    let efbig = FsError::Answer(Errno(libc::EFBIG));
    let too_big = SetAttr { size: Some(max + 1), ..SetAttr::default() };
    for (what, id, fh, want) in
        [("temp", temp_id, temp_fh, &b"x"[..]), ("cached", cached_id, cached_fh, &b"xower"[..])]
    {
        for (offset, len) in [(max - 1, 2usize), (max, 1), (u64::MAX, 1)] {
            let err = e.write(fh, offset, &vec![b'y'; len], false).unwrap_err();
            assert_eq!(err, efbig, "{what}: a write of {len} at {offset}");
        }
        let err = e.setattr(id, Some(fh), &too_big, false).unwrap_err();
        assert_eq!(err, efbig, "{what}: a truncate to i64::MAX + 1");
        assert_eq!(read(&e, fh, 0, 64), want, "{what}: the refused calls changed nothing");
    }
    for fh in [temp_fh, cached_fh] {
        e.release(fh).unwrap();
    }
    e.shutdown();
}
