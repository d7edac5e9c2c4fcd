//! Crash images of the temp-file store and the page cache (level 1 of the three crash-test levels, docs/design.md section 9): a seeded
//! workload (create, write, truncate, rename within and across directories and over temp and
//! lower files, unlink, transform by flush and by size; writes and truncates of lower files
//! land in the page cache, written back by pressure rounds under each of the four policies
//! (seed mod 4) and by flushes; writes that cover part of a page not in NVRAM become patches
//! (non-blocking writes, in the mode seed mod 3) that later writes merge or complete, a fetch
//! step merges and write-back writes) runs on an engine over a simulated region and the
//! in-memory lower file system. At every fence of the region, the region is
//! crashed three ways (nothing unpersisted survives, everything does, a seeded mix) and the
//! lower file system loses what was not fsynced; an engine started on the images (recovery:
//! rebuild, finish interrupted transforms) must show the namespace and contents either as
//! they were before the operation or as they are after it, and no hidden transform file.
//!
//! Replay a failure with `NVSTACK_SEED=<seed> cargo test -p nvstack-core --test crash_images`.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::sync::{Arc, Mutex};

use engine::{CacheConfig, Engine, EngineConfig, Nbw, Reason, Share, TempConfig, WritebackPolicy};
use lower::{Creds, FileKind, LowerFs, MemLower, SetAttr};
use nvram::{CrashMode, FormatParams, SimRegion};
use txn::{Consistency, Pool};

const ROOT: Creds = Creds { uid: 0, gid: 0, groups: Vec::new() };
/// Small, so that the size trigger fires in the workload.
const MAX_SIZE: u64 = 24 << 10;
const NAMES: [&str; 5] = ["a", "b", "c", "victim", "e"];
const DIRS: [&str; 2] = ["", "d"];

/// The visible tree: (dir, name) -> content, of regular files; plus hidden names seen.
type View = BTreeMap<(String, String), Vec<u8>>;

fn params() -> FormatParams {
    FormatParams {
        region_size: 12288 + 4 * 65536 + 4096 + 160 * 4096,
        undo_slots: 4,
        undo_slot_size: 65536,
    }
}

/// Small watermarks, so that pressure write-back rounds run often - in the writers' requests
/// (no background writer), and every open on the NVRAM path (no kernel passthrough), where the
/// mount's defaults differ.
fn config(seed: u64) -> EngineConfig {
    EngineConfig {
        // A background mark far below the share, so that the "flush" step's background
        // rounds (every other one) have files to move.
        temp: TempConfig {
            max_size: MAX_SIZE,
            share: Share::Frames(120),
            background: Some(Share::Frames(4)),
            ..TempConfig::default()
        },
        cache: CacheConfig {
            policy: WritebackPolicy::ALL[(seed % 4) as usize],
            dirty_high: Share::Frames(12),
            dirty_low: Share::Frames(4),
            background: false,
            batch_pages: 4,
            zone_blocks: 4,
            // Non-blocking writes in every mode that makes patches (seed mod 3); the
            // asynchronous ones are fetched by the workload's "fetch" step.
            nbw: [Nbw::Lazy, Nbw::AsyncBg, Nbw::AsyncFg][(seed % 3) as usize],
            ..CacheConfig::default()
        },
        passthrough: false,
        ..EngineConfig::default()
    }
}

/// A view in one line: name = length x first byte.
fn brief(v: &View) -> String {
    v.iter()
        .map(|((d, n), c)| format!("{d}/{n}={}x{}", c.len(), c.first().copied().unwrap_or(0)))
        .collect::<Vec<_>>()
        .join(" ")
}

fn view(engine: &Engine<MemLower>) -> Result<View, String> {
    let mut out = View::new();
    for dir in DIRS {
        let dir_id = if dir.is_empty() {
            engine.root_id()
        } else {
            engine.lookup(engine.root_id(), OsStr::new(dir)).map_err(|e| e.to_string())?.node_id
        };
        let fh = engine.opendir(dir_id).map_err(|e| e.to_string())?;
        let mut names = Vec::new();
        engine
            .readdir(fh, 0, &mut |e| {
                names.push((e.name, e.kind));
                true
            })
            .map_err(|e| e.to_string())?;
        engine.releasedir(fh).map_err(|e| e.to_string())?;
        for (name, kind) in names {
            let name = name.into_string().expect("utf-8 names");
            if name.starts_with(".nvstack") {
                return Err(format!("hidden file {dir}/{name} visible"));
            }
            if kind != Some(FileKind::Regular) {
                continue;
            }
            let e = engine.lookup(dir_id, OsStr::new(&name)).map_err(|e| e.to_string())?;
            let fh = engine.open(e.node_id, libc::O_RDONLY).map_err(|e| e.to_string())?;
            let mut content = Vec::new();
            engine
                .read(fh, 0, 1 << 20, |d| content.extend_from_slice(d))
                .map_err(|e| e.to_string())?;
            engine.release(fh).map_err(|e| e.to_string())?;
            engine.forget(e.node_id, 1);
            if content.len() as u64 != e.attr.size {
                return Err(format!(
                    "{dir}/{name}: size {} but {} bytes read",
                    e.attr.size,
                    content.len()
                ));
            }
            out.insert((dir.to_string(), name), content);
        }
    }
    Ok(out)
}

/// The lower directory must hold no hidden transform file after recovery.
fn hidden_in_lower(lower: &MemLower) -> Vec<String> {
    let mut found = Vec::new();
    let mut dirs = vec![(String::new(), lower.lookup(lower.root(), OsStr::new(".")).unwrap().0)];
    while let Some((path, node)) = dirs.pop() {
        let d = lower.opendir(&node).unwrap();
        let mut names = Vec::new();
        lower
            .readdir(&d, 0, &mut |e| {
                names.push((e.name, e.kind));
                true
            })
            .unwrap();
        for (name, kind) in names {
            let n = name.to_string_lossy().into_owned();
            if n.starts_with(".nvstack-transform-") {
                found.push(format!("{path}/{n}"));
            }
            if kind == Some(FileKind::Directory) && n != "." && n != ".." {
                let (child, _) = lower.lookup(&node, &name).unwrap();
                dirs.push((format!("{path}/{n}"), child));
            }
        }
    }
    found
}

#[derive(Default)]
struct Sweep {
    before: View,
    after: Option<View>,
    lower: Option<MemLower>,
    seed: u64,
    op: String,
    /// The operation journaled a lower namespace change (its fork run did).
    ordered: bool,
    points: u64,
    images: u64,
    failure: Option<String>,
    quiet: bool,
}

fn recover(image: Vec<u8>, lower: &MemLower, seed: u64) -> Result<(View, Vec<String>), String> {
    recover_in(Consistency::Undo, image, lower, seed)
}

fn recover_in(
    mode: Consistency,
    image: Vec<u8>,
    lower: &MemLower,
    seed: u64,
) -> Result<(View, Vec<String>), String> {
    let region = Arc::new(SimRegion::from_image(image));
    let (pool, _) = Pool::open(region, mode).map_err(|e| format!("open: {e}"))?;
    let engine =
        Engine::new(lower.clone(), pool, config(seed)).map_err(|e| format!("start: {e}"))?;
    let v = view(&engine)?;
    engine.pool().check_invariants()?;
    let hidden = hidden_in_lower(lower);
    Ok((v, hidden))
}

fn check_point(s: &mut Sweep, point: &nvram::CrashPoint<'_>) -> Result<(), String> {
    let lower = s.lower.as_ref().expect("lower set");
    s.points += 1;
    for (i, mode) in
        [CrashMode::DropAll, CrashMode::KeepAll, CrashMode::Torn { seed: s.seed ^ s.points }]
            .into_iter()
            .enumerate()
    {
        // The lower file system loses what was not fsynced (the Torn case: a seeded mix).
        // The third image: a seeded per-object mix of the lower file system's pending state -
        // per directory entry (as ext2 might leave it), or, for an operation that journaled a
        // namespace change, with the namespace as of the last sync or as now (a journaling
        // lower file system commits its namespace in order: assumption K2, design.md 8).
        let crashed = match i {
            2 if s.ordered => lower.crash_ordered(s.seed ^ s.points),
            2 => lower.crash_with(s.seed ^ s.points),
            _ => lower.crash(),
        };
        // A second engine on this thread, in the middle of the first one's persist: its
        // locks are checked on their own.
        let (v, hidden) = engine::sync::isolated(|| recover(point.image(mode), &crashed, s.seed))
            .map_err(|e| {
            format!("seed {} op {:?} fence {} {mode:?}: {e}", s.seed, s.op, point.fence_seq)
        })?;
        s.images += 1;
        if !hidden.is_empty() {
            return Err(format!("seed {} op {:?}: hidden files left: {hidden:?}", s.seed, s.op));
        }
        let after_ok = s.after.as_ref().is_some_and(|a| *a == v);
        if v != s.before && !after_ok {
            return Err(format!(
                "seed {} op {:?} fence {} {mode:?}: recovered {}\n  before {}\n  after {}",
                s.seed,
                s.op,
                point.fence_seq,
                brief(&v),
                brief(&s.before),
                s.after.as_ref().map_or_else(String::new, brief)
            ));
        }
    }
    Ok(())
}

/// The lower tree of the workloads: directory d and, with `victims`, a lower file `victim` in
/// both directories, durable: five pages and a bit, so that small writes to its cold pages
/// become patches.
fn lower_tree(victims: bool) -> MemLower {
    let lower = MemLower::default();
    let d = lower.mkdir(&ROOT, lower.root(), OsStr::new("d"), 0o755).unwrap().0;
    for dir in [lower.root(), &d].into_iter().filter(|_| victims) {
        let (_, _, f) =
            lower.create(&ROOT, dir, OsStr::new("victim"), 0o644, libc::O_RDWR).unwrap();
        let content: Vec<u8> = (0..5 * 4096 + 300).map(|i| b"lower victim "[i % 13]).collect();
        lower.write(&f, 0, &content).unwrap();
    }
    lower.sync_all();
    lower
}

/// An engine over a fresh simulated region in `mode`, and the ids of the root and of d.
fn start_fresh(
    lower: &MemLower,
    mode: Consistency,
    seed: u64,
) -> (Arc<SimRegion>, Engine<MemLower>, [u64; 2]) {
    let region = Arc::new(SimRegion::new(params().region_size));
    Pool::format(&*region, params()).unwrap();
    let (pool, _) = Pool::open(region.clone(), mode).unwrap();
    let engine = Engine::new(lower.clone(), pool, config(seed)).unwrap();
    let dirs =
        [engine.root_id(), engine.lookup(engine.root_id(), OsStr::new("d")).unwrap().node_id];
    (region, engine, dirs)
}

/// The seeded generator of the workload (replayable by seed).
struct Rng(rand_chacha::ChaCha8Rng);
impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(rand::SeedableRng::seed_from_u64(seed))
    }
    fn below(&mut self, n: u64) -> u64 {
        rand::Rng::random_range(&mut self.0, 0..n)
    }
}

/// One operation of the workload on `engine`; returns a label. Errors the lower file system
/// would also give (ENOENT of an absent name, ...) are part of the workload.
fn step(engine: &Engine<MemLower>, rng: &mut Rng, dirs: &[u64; 2]) -> String {
    let dir = rng.below(2) as usize;
    let name = NAMES[rng.below(NAMES.len() as u64) as usize];
    let p = dirs[dir];
    let os = OsStr::new(name);
    match rng.below(13) {
        0 | 1 => {
            // One state change per step: the create (the writes are steps of their own).
            if let Ok((e, fh)) = engine.create(&ROOT, p, os, 0o644, libc::O_RDWR) {
                engine.release(fh).unwrap();
                engine.forget(e.node_id, 1);
            }
            format!("create {dir}/{name}")
        }
        2 | 3 => {
            let off = rng.below(5 * 4096);
            // Half of the writes small, so that a file's patches share frames, grow and move.
            let most = if rng.below(2) == 0 { 700 } else { 9000 };
            let len = rng.below(most) as usize;
            let byte = rng.below(256) as u8;
            if let Ok(e) = engine.lookup(p, os) {
                if let Ok(fh) = engine.open(e.node_id, libc::O_RDWR) {
                    let _ = engine.write(fh, off, &vec![byte; len], false);
                    engine.release(fh).unwrap();
                }
                engine.forget(e.node_id, 1);
            }
            format!("write {dir}/{name} {off}+{len}")
        }
        4 => {
            let size = rng.below(4 * 4096);
            if let Ok(e) = engine.lookup(p, os) {
                let set = SetAttr { size: Some(size), ..SetAttr::default() };
                let _ = engine.setattr(e.node_id, None, &set, false);
                engine.forget(e.node_id, 1);
            }
            format!("truncate {dir}/{name} {size}")
        }
        5 => {
            let _ = engine.unlink(p, os);
            format!("unlink {dir}/{name}")
        }
        6 | 7 => {
            let to_dir = rng.below(2) as usize;
            let to = NAMES[rng.below(NAMES.len() as u64) as usize];
            let _ = engine.rename(p, os, dirs[to_dir], OsStr::new(to), 0);
            format!("rename {dir}/{name} -> {to_dir}/{to}")
        }
        8 => {
            if let Ok(e) = engine.lookup(p, os) {
                if let Some(f) = engine.temp_file(e.node_id) {
                    let _ = engine.transform(&f, engine::Trigger::Flush);
                }
                engine.forget(e.node_id, 1);
            }
            format!("transform {dir}/{name}")
        }
        9 => {
            // The asynchronous fetcher of non-blocking writes: patched pages read and merged.
            let n = engine.fetch_patches(2);
            format!("fetch {n}")
        }
        10 if dir == 0 => {
            // A background round: the least recently used temp files above the mark, as one
            // group (half of these steps; no extra draw from the seed's sequence).
            let n = engine.transform_in_background();
            format!("background round {n}")
        }
        10 => {
            // Every temp file at once: the group transform (one syncfs per step).
            let _ = engine.flush_tempfiles(&mut |_, _| {});
            "flush".to_string()
        }
        11 => {
            // Every dirty page of the page cache, in batches.
            let _ = engine.flush_cache(Reason::Flush, &mut |_, _| {});
            "write back".to_string()
        }
        _ => {
            // Over the size limit: the size trigger transforms it.
            if let Ok(e) = engine.lookup(p, os) {
                if let Ok(fh) = engine.open(e.node_id, libc::O_WRONLY) {
                    let _ = engine.write(fh, MAX_SIZE, b"beyond", false);
                    engine.release(fh).unwrap();
                }
                engine.forget(e.node_id, 1);
            }
            format!("grow {dir}/{name}")
        }
    }
}

/// What one seed's sweep did.
struct Swept {
    points: u64,
    images: u64,
    /// Pages written back.
    written: u64,
    patches: u64,
    fetched: u64,
    /// The most patches that ever shared frames (patches - patch frames) after a step.
    shared: u64,
    moved: u64,
    /// Temp files transformed by background rounds.
    background: u64,
    /// The most record frames temp files held after a step, how many were freed, and how
    /// many steps other than a flush freed one (a release found a second empty frame).
    record_frames: u64,
    record_frames_freed: u64,
    released_frames: u64,
}

/// One step of a workload (`step`, `patch_step`).
type Step = fn(&Engine<MemLower>, &mut Rng, &[u64; 2]) -> String;

fn sweep(seed: u64, ops: usize) -> Result<Swept, String> {
    sweep_with(seed, ops, step)
}

/// Runs `ops` steps of `step` from seed `seed` over `lower_tree(true)`, crashing at every fence.
fn sweep_with(seed: u64, ops: usize, step: Step) -> Result<Swept, String> {
    let lower = lower_tree(true);
    let (region, engine, dirs) = start_fresh(&lower, Consistency::Undo, seed);
    let state =
        Arc::new(Mutex::new(Sweep { seed, lower: Some(lower.clone()), ..Sweep::default() }));
    state.lock().unwrap().before = view(&engine)?;
    let hook_state = Arc::clone(&state);
    region.set_fence_hook(Some(Box::new(move |point| {
        let mut s = hook_state.lock().unwrap();
        if s.quiet || s.failure.is_some() {
            return;
        }
        if let Err(e) = check_point(&mut s, point) {
            s.failure = Some(e);
        }
    })));
    let mut rng = Rng::new(seed);
    let (mut shared, mut record_frames, mut released_frames) = (0, 0, 0);
    for _ in 0..ops {
        let frames_before = engine.stats().tempfiles.record_frames;
        // The state after the operation, needed at its crash points, comes from a dry run of
        // the same operation on a fork (copies of the region and of the lower file system).
        let image = region.current();
        let fork_lower = lower.fork();
        let fork_region = Arc::new(SimRegion::from_image(image));
        let (fork_pool, _) = Pool::open(fork_region, Consistency::Undo).unwrap();
        let fork = Engine::new(fork_lower, fork_pool, config(seed)).map_err(|e| e.to_string())?;
        let fork_dirs =
            [fork.root_id(), fork.lookup(fork.root_id(), OsStr::new("d")).unwrap().node_id];
        let mut fork_rng = Rng(rng.0.clone());
        let journaled = fork.stats().journal.records_total;
        let label = step(&fork, &mut fork_rng, &fork_dirs);
        let after = view(&fork)?;
        {
            let mut s = state.lock().unwrap();
            s.after = Some(after.clone());
            s.op.clone_from(&label);
            s.ordered = fork.stats().journal.records_total > journaled;
        }
        step(&engine, &mut rng, &dirs);
        // Changes to lower objects (writes to transformed files, renames of them) are only as
        // durable as the lower file system makes them; make them durable between steps so
        // that the next step's crash images start from this state. Inside a step, the
        // temp-file protocols must be durable on their own (fsync, fsyncdir), which is what
        // the crash points check.
        lower.sync_all();
        let mut s = state.lock().unwrap();
        if let Some(f) = s.failure.take() {
            return Err(f);
        }
        s.quiet = true;
        drop(s);
        let now = view(&engine)?;
        engine.check_cache().map_err(|e| format!("seed {seed} op {label:?}: cache mirror: {e}"))?;
        let nbw = engine.stats().nbw;
        shared = shared.max(nbw.patches - nbw.patch_frames);
        let frames_now = engine.stats().tempfiles.record_frames;
        record_frames = record_frames.max(frames_now);
        if frames_now < frames_before && label != "flush" {
            released_frames += 1;
        }
        let mut s = state.lock().unwrap();
        s.quiet = false;
        if now != after {
            return Err(format!(
                "seed {seed} op {label:?}: the run differs from its fork: {} vs {}",
                brief(&now),
                brief(&after)
            ));
        }
        s.before = now;
    }
    region.set_fence_hook(None);
    let st = engine.stats();
    eprintln!(
        "seed {seed} ({}): {} temp files transformed, {} cache writes hit, {} fetches, {} patches ({} completed without a read, {} fetched, {} written back, {} moved; up to {shared} sharing frames), {} pages written back in {} batches",
        st.writeback.policy,
        st.tempfiles.transformed_total,
        st.cache.hits,
        st.cache.fetches,
        st.nbw.patches_created,
        st.nbw.pages_completed_without_fetch,
        st.nbw.fetches_async,
        st.nbw.fetches_on_writeback,
        st.nbw.patches_moved,
        st.writeback.pages_written,
        st.writeback.batches
    );
    let s = state.lock().unwrap();
    Ok(Swept {
        points: s.points,
        images: s.images,
        written: st.writeback.pages_written,
        patches: st.nbw.patches_created,
        fetched: st.nbw.fetches_async,
        shared,
        moved: st.nbw.patches_moved,
        background: st.tempfiles.transformed["background"],
        record_frames,
        record_frames_freed: st.tempfiles.record_frames_freed,
        released_frames,
    })
}

#[test]
fn every_crash_point_of_temp_file_and_cache_operations_recovers_to_before_or_after() {
    let seeds: Vec<u64> = match std::env::var("NVSTACK_SEED") {
        Ok(s) => vec![s.parse().expect("NVSTACK_SEED is a number")],
        Err(_) => (1..=10).collect(),
    };
    let (mut points, mut images, mut written, mut patches, mut fetched) = (0, 0, 0, 0, 0);
    let (mut shared, mut background) = (0, 0);
    for seed in seeds {
        let got = sweep(seed, 200).unwrap_or_else(|e| panic!("{e}"));
        background += got.background;
        points += got.points;
        images += got.images;
        written += got.written;
        patches += got.patches;
        fetched += got.fetched;
        shared = shared.max(got.shared);
    }
    eprintln!(
        "crash images: {points} crash points (fences), {images} images recovered and compared; {written} pages written back; {background} temp files transformed by background rounds"
    );
    assert!(points > 500, "too few crash points: {points}");
    assert!(written > 0, "the workload never wrote back a page");
    if std::env::var_os("NVSTACK_SEED").is_none() {
        assert!(patches > 0 && fetched > 0, "patches {patches}, fetched {fetched}");
        assert!(background > 0, "no background round transformed a file");
        // Patches packed: some frame held two or more at once (patchframe.rs).
        assert!(shared > 0, "no patch frame ever held two patches");
    }
}

/// One operation of the patch workload: small writes to the cold pages of the lower file
/// `victim` (they become patches that share frames, grow in place, grow into the slots after
/// them, move, and complete pages), larger writes, truncates that clip or drop patches,
/// fetches that merge them and write-back that writes them and frees them.
fn patch_step(engine: &Engine<MemLower>, rng: &mut Rng, dirs: &[u64; 2]) -> String {
    let dir = rng.below(2) as usize;
    let Ok(e) = engine.lookup(dirs[dir], OsStr::new("victim")) else {
        return "no victim".to_string();
    };
    let label = match rng.below(10) {
        0..=5 => {
            let off = rng.below(6 * 4096);
            let most = if rng.below(4) == 0 { 4096 } else { 400 };
            let len = 1 + rng.below(most) as usize;
            let byte = rng.below(256) as u8;
            if let Ok(fh) = engine.open(e.node_id, libc::O_RDWR) {
                let _ = engine.write(fh, off, &vec![byte; len], false);
                engine.release(fh).unwrap();
            }
            format!("write {dir}/victim {off}+{len}")
        }
        6 => {
            let size = 4 * 4096 + rng.below(2 * 4096);
            let set = SetAttr { size: Some(size), ..SetAttr::default() };
            let _ = engine.setattr(e.node_id, None, &set, false);
            format!("truncate {dir}/victim {size}")
        }
        7 | 8 => format!("fetch {}", engine.fetch_patches(1 + rng.below(2) as usize)),
        _ => {
            let _ = engine.flush_cache(Reason::Flush, &mut |_, _| {});
            "write back".to_string()
        }
    };
    engine.forget(e.node_id, 1);
    label
}

#[test]
fn every_crash_point_of_patch_changes_recovers_to_before_or_after() {
    let seeds: Vec<u64> = match std::env::var("NVSTACK_SEED") {
        Ok(s) => vec![s.parse().expect("NVSTACK_SEED is a number")],
        Err(_) => (101..=106).collect(),
    };
    let (mut images, mut patches, mut shared, mut moved) = (0, 0, 0, 0);
    for seed in seeds {
        let got = sweep_with(seed, 120, patch_step).unwrap_or_else(|e| panic!("{e}"));
        images += got.images;
        patches += got.patches;
        shared = shared.max(got.shared);
        moved += got.moved;
    }
    eprintln!(
        "patch crash images: {images} images, {patches} patches, {moved} moved, up to {shared} \
         sharing"
    );
    if std::env::var_os("NVSTACK_SEED").is_none() {
        assert!(patches > 100 && moved > 0, "patches {patches}, moved {moved}");
        assert!(shared >= 3, "patch frames shared by at most {shared} patches beyond one each");
    }
}

/// One operation of the record-frame workload: small temp files under 20 names in each of
/// two directories (up to 40 records: five record frames) created, written, unlinked - also
/// while open, so that the record stays, unnamed, until the close - renamed over one another,
/// and now and then transformed by a background round or a flush; so record frames fill,
/// empty and are freed (`crate::slots`, T5 and T6), by a release after the transaction
/// that emptied them and by the flush.
fn record_step(engine: &Engine<MemLower>, rng: &mut Rng, dirs: &[u64; 2]) -> String {
    let dir = rng.below(2) as usize;
    let name = format!("r{}", rng.below(20));
    let (p, os) = (dirs[dir], OsStr::new(&name));
    match rng.below(40) {
        0..=17 => {
            if let Ok((e, fh)) = engine.create(&ROOT, p, os, 0o644, libc::O_RDWR) {
                engine.release(fh).unwrap();
                engine.forget(e.node_id, 1);
            }
            format!("create {dir}/{name}")
        }
        18..=23 => {
            let len = 1 + rng.below(600) as usize;
            let byte = rng.below(256) as u8;
            if let Ok(e) = engine.lookup(p, os) {
                if let Ok(fh) = engine.open(e.node_id, libc::O_RDWR) {
                    let _ = engine.write(fh, 0, &vec![byte; len], false);
                    engine.release(fh).unwrap();
                }
                engine.forget(e.node_id, 1);
            }
            format!("write {dir}/{name} {len}")
        }
        24..=31 => {
            let _ = engine.unlink(p, os);
            format!("unlink {dir}/{name}")
        }
        32 | 33 => {
            // Unlinked while open: the close frees it (a crash before: recovery does).
            if let Ok(e) = engine.lookup(p, os) {
                if let Ok(fh) = engine.open(e.node_id, libc::O_RDWR) {
                    let _ = engine.unlink(p, os);
                    engine.release(fh).unwrap();
                }
                engine.forget(e.node_id, 1);
            }
            format!("unlink {dir}/{name} while open")
        }
        34..=38 => {
            let to_dir = rng.below(2) as usize;
            let to = format!("r{}", rng.below(20));
            let _ = engine.rename(p, os, dirs[to_dir], OsStr::new(&to), 0);
            format!("rename {dir}/{name} -> {to_dir}/{to}")
        }
        _ if dir == 0 => {
            // The least recently used as one group (the mark is 4 frames): records freed in a
            // burst, their frames emptied and released one by one.
            format!("background round {}", engine.transform_in_background())
        }
        _ => {
            let _ = engine.flush_tempfiles(&mut |_, _| {});
            "flush".to_string()
        }
    }
}

#[test]
fn every_crash_point_of_packed_temp_file_records_recovers_to_before_or_after() {
    let seeds: Vec<u64> = match std::env::var("NVSTACK_SEED") {
        Ok(s) => vec![s.parse().expect("NVSTACK_SEED is a number")],
        Err(_) => (201..=208).collect(),
    };
    let (mut images, mut frames, mut freed, mut released) = (0, 0, 0, 0);
    for seed in seeds {
        let got = sweep_with(seed, 150, record_step).unwrap_or_else(|e| panic!("{e}"));
        images += got.images;
        frames = frames.max(got.record_frames);
        freed += got.record_frames_freed;
        released += got.released_frames;
    }
    eprintln!(
        "record crash images: {images} images, up to {frames} record frames, {freed} freed \
         ({released} by a release, the rest by flushes)"
    );
    if std::env::var_os("NVSTACK_SEED").is_none() {
        assert!(frames >= 3, "record frames: up to {frames}");
        assert!(released > 0 && freed > released, "{freed} freed, {released} by a release");
    }
}

/// The directories' mtimes as the mount shows them.
fn dir_mtimes(engine: &Engine<MemLower>) -> Result<Vec<(i64, u32)>, String> {
    let d = engine.lookup(engine.root_id(), OsStr::new("d")).map_err(|e| e.to_string())?;
    let times = [engine.root_id(), d.node_id]
        .into_iter()
        .map(|id| engine.getattr(id).map(|a| a.mtime).map_err(|e| e.to_string()))
        .collect();
    engine.forget(d.node_id, 1);
    times
}

/// Pending directory times (overlay/times.rs): a workload of temp-file creates, unlinks and
/// renames within and across two directories, whose mtimes live in NVRAM records. At every
/// fence, an engine recovered from each crash image must show each directory's mtime as it
/// was before the operation or as it is after it (the recovered values are kept and compared
/// once the operation has finished and its "after" is known). ctime is not compared: settling
/// at mount writes the mtime to the lower directory, which sets its ctime to that moment.
#[test]
fn every_crash_point_of_a_temp_namespace_change_keeps_the_directory_mtime() {
    type Seen = Arc<Mutex<(bool, Vec<Result<Vec<(i64, u32)>, String>>)>>;
    let seeds: Vec<u64> = match std::env::var("NVSTACK_SEED") {
        Ok(s) => vec![s.parse().expect("NVSTACK_SEED is a number")],
        Err(_) => (1..=4).collect(),
    };
    let (mut points, mut changed) = (0usize, 0usize);
    for seed in seeds {
        let lower = lower_tree(false);
        let (region, engine, dirs) = start_fresh(&lower, Consistency::Undo, seed);
        let seen: Seen = Arc::new(Mutex::new((false, Vec::new())));
        let hook_seen = Arc::clone(&seen);
        let hook_lower = lower.clone();
        region.set_fence_hook(Some(Box::new(move |point| {
            let mut s = hook_seen.lock().unwrap();
            if s.0 {
                return;
            }
            for mode in [CrashMode::DropAll, CrashMode::KeepAll] {
                let image = point.image(mode);
                let crashed = hook_lower.crash();
                let got = engine::sync::isolated(|| {
                    let (pool, _) =
                        Pool::open(Arc::new(SimRegion::from_image(image)), Consistency::Undo)
                            .map_err(|e| e.to_string())?;
                    let e = Engine::new(crashed, pool, config(seed)).map_err(|e| e.to_string())?;
                    dir_mtimes(&e)
                });
                s.1.push(got);
            }
        })));
        let mut rng = Rng::new(seed);
        for i in 0..150 {
            seen.lock().unwrap().0 = true;
            let before = dir_mtimes(&engine).unwrap();
            seen.lock().unwrap().0 = false;
            let dir = rng.below(2) as usize;
            let name = OsStr::new(NAMES[rng.below(3) as usize]);
            let label = match rng.below(3) {
                0 => {
                    if let Ok((e, fh)) = engine.create(&ROOT, dirs[dir], name, 0o644, libc::O_RDWR)
                    {
                        engine.release(fh).unwrap();
                        engine.forget(e.node_id, 1);
                    }
                    "create"
                }
                1 => {
                    let _ = engine.unlink(dirs[dir], name);
                    "unlink"
                }
                _ => {
                    let to = OsStr::new(NAMES[rng.below(3) as usize]);
                    let _ = engine.rename(dirs[dir], name, dirs[rng.below(2) as usize], to, 0);
                    "rename"
                }
            };
            lower.sync_all();
            let mut s = seen.lock().unwrap();
            s.0 = true;
            let recovered = std::mem::take(&mut s.1);
            drop(s);
            let after = dir_mtimes(&engine).unwrap();
            // Durable at completion: the image of everything persisted at the last fence (the
            // commit) shows the change.
            if after != before {
                changed += 1;
                let last = recovered.last().expect("a change persists");
                assert_eq!(
                    last.as_ref().ok(),
                    Some(&after),
                    "seed {seed} op {i} {label}: not durable"
                );
            }
            for got in recovered {
                points += 1;
                let got = got.unwrap_or_else(|e| panic!("seed {seed} op {i} {label}: {e}"));
                assert!(
                    got == before || got == after,
                    "seed {seed} op {i} {label}: recovered mtimes {got:?}, before {before:?}, after {after:?}"
                );
            }
        }
        region.set_fence_hook(None);
        assert!(engine.stats().tempfiles.created > 10, "seed {seed}: the workload made temp files");
    }
    eprintln!(
        "directory times: {points} crash images recovered and compared, {changed} operations changed a directory's mtime"
    );
    assert!(points > 200, "too few crash images: {points}");
    assert!(changed > 50, "too few changes: {changed}");
}

/// `--consistency journal` (design.md section 12): an operation is durable at the next group
/// commit, so a crash may lose the operations since the last one - but only a suffix of them,
/// always whole, and never one completed before a group commit (here: explicit ones, like an
/// application's fsync, every few operations; the engine's own - W1 before lower changes,
/// write-back, transforms; `begin` when the group log is full - make more durable, which the
/// lower bound below allows). The same workload as the undo sweep; at every fence the region
/// is crashed twice (nothing unpersisted survives, everything does) and the lower file system
/// once (what was not synced is lost); an engine recovered from the images must show one of
/// the views at operation boundaries since the last explicit group commit, or the view after
/// the operation (kept and compared once the operation has finished).
#[test]
fn every_crash_point_in_journal_mode_recovers_to_a_state_since_the_last_group_commit() {
    type Seen = Arc<Mutex<(bool, Vec<Result<View, String>>)>>;
    let seeds: Vec<u64> = match std::env::var("NVSTACK_SEED") {
        Ok(s) => vec![s.parse().expect("NVSTACK_SEED is a number")],
        Err(_) => (41..=46).collect(),
    };
    let (mut points, mut lost_ops) = (0usize, 0usize);
    for seed in seeds {
        let lower = lower_tree(true);
        let (region, engine, dirs) = start_fresh(&lower, Consistency::Journal, seed);
        let seen: Seen = Arc::new(Mutex::new((false, Vec::new())));
        let hook_seen = Arc::clone(&seen);
        let hook_lower = lower.clone();
        region.set_fence_hook(Some(Box::new(move |point| {
            let mut s = hook_seen.lock().unwrap();
            if s.0 {
                return;
            }
            for mode in [CrashMode::DropAll, CrashMode::KeepAll] {
                let crashed = hook_lower.crash();
                let got = engine::sync::isolated(|| {
                    recover_in(Consistency::Journal, point.image(mode), &crashed, seed)
                })
                .and_then(|(v, hidden)| {
                    if hidden.is_empty() { Ok(v) } else { Err(format!("hidden: {hidden:?}")) }
                });
                s.1.push(got);
            }
        })));
        let mut rng = Rng::new(seed);
        // Views at operation boundaries since the last explicit group commit.
        let mut since_commit = vec![view(&engine).unwrap()];
        // The images of the fences since the last check: each must be one of the views since
        // the last group commit or `after`; returns how many completed operations it lost.
        let mut check = |label: &str, after: &View, since: &[View]| {
            seen.lock().unwrap().0 = true;
            let mut s = seen.lock().unwrap();
            for got in s.1.drain(..) {
                points += 1;
                let got = got.unwrap_or_else(|e| panic!("seed {seed} {label}: {e}"));
                let at = since.iter().position(|v| v == &got);
                assert!(
                    at.is_some() || got == *after,
                    "seed {seed} {label}: recovered {}\n  after {}\n  since the last group \
                     commit: {}",
                    brief(&got),
                    brief(after),
                    since.iter().map(brief).collect::<Vec<_>>().join("\n    ")
                );
                if let Some(at) = at {
                    lost_ops += since.len() - 1 - at;
                }
            }
            s.0 = false;
        };
        for i in 0..160 {
            let label = step(&engine, &mut rng, &dirs);
            lower.sync_all();
            let after = view(&engine).unwrap();
            check(&format!("op {i} {label:?}"), &after, &since_commit);
            since_commit.push(after);
            if rng.below(8) == 0 {
                // An application's fsync: everything so far is durable once it returns (its
                // own fences recover to a state since the previous one, or to now).
                engine.group_commit();
                let now = since_commit.last().unwrap().clone();
                check(&format!("group commit after op {i}"), &now, &since_commit);
                since_commit = vec![now];
            }
        }
        region.set_fence_hook(None);
        let g = engine.stats().journal.group;
        eprintln!(
            "seed {seed}: {} group commits ({} forced), {} pages copied to the group log",
            g.group_commits, g.group_commits_forced, g.records
        );
        assert!(g.group_commits > 0, "seed {seed}: no group commit");
    }
    eprintln!(
        "journal mode crash images: {points} images recovered and compared; {lost_ops} completed \
         operations lost in all (allowed: not yet group-committed)"
    );
    assert!(points > 500, "too few crash images: {points}");
    assert!(lost_ops > 0, "no image ever lost an operation: journal mode was not exercised");
}
