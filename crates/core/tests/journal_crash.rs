//! Crash images of the metadata journal (journal/, design.md section 13): a seeded workload
//! of namespace and attribute changes of lower objects (mkdir, rmdir, create, unlink, rename
//! with its flags - cycles included -, link, symlink, chmod, set/removexattr, small writes
//! through the page cache) runs with temp files off, so every change is a lower one, and with
//! a small journal, so checkpoints come and go. Nothing syncs the lower file system but the
//! engine: after a crash it holds any prefix of the applied changes since the last checkpoint
//! (assumption K2). At every fence of the region, two region images (nothing unpersisted
//! survives, everything does) x three lower images (the last checkpoint's state, the state
//! after a random earlier operation since, everything applied) are recovered by a fresh engine
//! (replay first); it must show the tree as it was before the operation or as it is after.
//!
//! Replay a failure with `NVSTACK_SEED=<seed> cargo test -p nvstack-core --test journal_crash`.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use engine::journal::checkpoint::Why;
use engine::{
    CacheConfig, Engine, EngineConfig, Failpoints, JournalConfig, Nbw, Share, TempConfig,
};
use lower::{Creds, FileKind, LowerFs, MemLower, SetAttr, TimeSet};
use nvram::{CrashMode, FormatParams, SimRegion};
use txn::{Consistency, Pool};

const ROOT: Creds = Creds { uid: 0, gid: 0, groups: Vec::new() };
const NAMES: [&str; 4] = ["a", "b", "c", "d"];
const DIRS: [&str; 3] = ["", "x", "y"];

/// path -> what is there: kind, permission bits, content or target, xattrs.
type View = BTreeMap<String, String>;

fn params() -> FormatParams {
    FormatParams {
        region_size: 12288 + 4 * 65536 + 4096 + 192 * 4096,
        undo_slots: 4,
        undo_slot_size: 65536,
    }
}

/// Where the mount's defaults differ: every open on the NVRAM path (no kernel passthrough), a
/// writer past the high watermark writes back in its own request (no background writer), and
/// partial writes patch lazily.
fn config() -> EngineConfig {
    EngineConfig {
        temp: TempConfig { enabled: false, ..TempConfig::default() },
        cache: CacheConfig {
            dirty_high: Share::Frames(40),
            dirty_low: Share::Frames(20),
            background: false,
            nbw: Nbw::Lazy,
            batch_pages: 4,
            ..CacheConfig::default()
        },
        // Two frames (16 slots each; a record takes 1-2 here): a checkpoint every few dozen
        // operations, most of them zeroing records of the frame still taking new ones.
        journal: JournalConfig { size_max: 2 * 4096, interval_secs: 0 },
        passthrough: false,
        ..EngineConfig::default()
    }
}

fn name(s: &str) -> &OsStr {
    OsStr::new(s)
}

/// The whole tree through the engine.
fn view(e: &Engine<MemLower>) -> Result<View, String> {
    let mut out = View::new();
    let mut dirs = vec![(String::new(), e.root_id())];
    while let Some((path, id)) = dirs.pop() {
        let fh = e.opendir(id).map_err(|x| x.to_string())?;
        let mut entries = Vec::new();
        e.readdir(fh, 0, &mut |d| {
            entries.push(d.name);
            true
        })
        .map_err(|x| x.to_string())?;
        e.releasedir(fh).map_err(|x| x.to_string())?;
        for n in entries {
            if n == "." || n == ".." {
                continue;
            }
            let p = format!("{path}/{}", n.to_string_lossy());
            let entry = e.lookup(id, &n).map_err(|x| format!("{p}: {x}"))?;
            let a = entry.attr;
            let mut xattrs =
                String::from_utf8_lossy(&e.listxattr(entry.node_id, 4096).unwrap_or_default())
                    .into_owned();
            xattrs.retain(|c| c != '\0');
            let what = match a.kind() {
                FileKind::Directory => {
                    dirs.push((p.clone(), entry.node_id));
                    format!("dir {:o} {xattrs}", a.mode & 0o7777)
                }
                FileKind::Symlink => {
                    let t = e.readlink(entry.node_id).map_err(|x| x.to_string())?;
                    format!("link -> {}", String::from_utf8_lossy(&t))
                }
                _ => {
                    let fh = e.open(entry.node_id, libc::O_RDONLY).map_err(|x| x.to_string())?;
                    let mut data = Vec::new();
                    e.read(fh, 0, 1 << 16, |d| data.extend_from_slice(d))
                        .map_err(|x| x.to_string())?;
                    e.release(fh).map_err(|x| x.to_string())?;
                    format!(
                        "file {:o} nlink {} {:?} {xattrs}",
                        a.mode & 0o7777,
                        a.nlink,
                        String::from_utf8_lossy(&data)
                    )
                }
            };
            if !matches!(a.kind(), FileKind::Directory) {
                e.forget(entry.node_id, 1);
            }
            out.insert(p, what);
        }
    }
    Ok(out)
}

struct Rng(rand_chacha::ChaCha8Rng);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        rand::Rng::random_range(&mut self.0, 0..n)
    }
}

/// The node id of directory `DIRS[i]`, if it exists now.
fn dir(e: &Engine<MemLower>, i: usize) -> Option<u64> {
    if DIRS[i].is_empty() {
        return Some(e.root_id());
    }
    e.lookup(e.root_id(), name(DIRS[i])).ok().map(|x| x.node_id)
}

/// One operation; errors the lower file system would give are part of the workload.
/// `churn`: mostly creations and removals, so that removals annul creations (M7).
fn step(e: &Engine<MemLower>, rng: &mut Rng, churn: bool) -> String {
    let (d1, d2) = (rng.below(3) as usize, rng.below(3) as usize);
    let (n1, n2) = (NAMES[rng.below(4) as usize], NAMES[rng.below(4) as usize]);
    let (Some(p), Some(q)) = (dir(e, d1), dir(e, d2)) else { return "no directory".into() };
    let op = if churn { [0, 1, 2, 2, 4, 4, 1, 9][rng.below(8) as usize] } else { rng.below(12) };
    let label = format!("op {op} {}/{n1} {}/{n2}", DIRS[d1], DIRS[d2]);
    match op {
        0 => {
            let _ = e.mkdir(&ROOT, p, name(n1), 0o755).map(|x| e.forget(x.node_id, 1));
        }
        1 => {
            let _ = e.rmdir(p, name(n1));
        }
        2 => {
            // One change per step: the create (writes are steps of their own).
            if let Ok((x, fh)) = e.create(&ROOT, p, name(n1), 0o644, libc::O_RDWR) {
                e.release(fh).unwrap();
                e.forget(x.node_id, 1);
            }
        }
        3 => {
            if let Ok(x) = e.lookup(p, name(n1)) {
                if let Ok(fh) = e.open(x.node_id, libc::O_WRONLY) {
                    let _ = e.write(fh, 0, label.as_bytes(), false);
                    e.release(fh).unwrap();
                }
                e.forget(x.node_id, 1);
            }
        }
        4 => {
            let _ = e.unlink(p, name(n1));
        }
        5 | 6 => {
            let flags =
                [0, 0, libc::RENAME_NOREPLACE, libc::RENAME_EXCHANGE][rng.below(4) as usize];
            let _ = e.rename(p, name(n1), q, name(n2), flags);
        }
        7 => {
            if let Ok(x) = e.lookup(p, name(n1)) {
                let _ = e.link(x.node_id, q, name(n2)).map(|y| e.forget(y.node_id, 1));
                e.forget(x.node_id, 1);
            }
        }
        8 => {
            let _ = e.symlink(&ROOT, p, name(n1), name(n2)).map(|x| e.forget(x.node_id, 1));
        }
        9 => {
            if let Ok(x) = e.lookup(p, name(n1)) {
                let mode = [0o600, 0o640, 0o755][rng.below(3) as usize];
                let set =
                    SetAttr { mode: Some(mode), mtime: Some(TimeSet::Now), ..SetAttr::default() };
                let _ = e.setattr(x.node_id, None, &set, false);
                e.forget(x.node_id, 1);
            }
        }
        10 => {
            if let Ok(x) = e.lookup(p, name(n1)) {
                let _ = e.setxattr(x.node_id, name("user.k"), n2.as_bytes(), 0);
                e.forget(x.node_id, 1);
            }
        }
        _ => {
            if let Ok(x) = e.lookup(p, name(n1)) {
                let _ = e.removexattr(x.node_id, name("user.k"));
                e.forget(x.node_id, 1);
            }
        }
    }
    label
}

/// At `checkpoint.synced` of a checkpoint the sweep asks for, another thread changes the root's
/// mode: its record is packed into the frame being checkpointed, which then keeps it while the
/// listed records' slots are zeroed (M6) - the path a single thread never takes. The
/// failpoint waits until that record is committed, not for the operation to end (whose own
/// size check may wait for this checkpoint); the step joins the thread afterwards.
#[derive(Debug, Default)]
struct Concurrent {
    engine: OnceLock<Weak<Engine<MemLower>>>,
    armed: AtomicBool,
    /// Instead of the chmod: unlink `/z`, created the step before, so that a creation record
    /// the checkpoint listed is annulled while it runs.
    unlink_z: AtomicBool,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Failpoints for Concurrent {
    fn hit(&self, point: &'static str) {
        if point != "checkpoint.synced" || !self.armed.swap(false, Ordering::SeqCst) {
            return;
        }
        let e = self.engine.get().and_then(Weak::upgrade).expect("the sweep's engine");
        let before = e.stats().journal.records_total;
        let chmod = Arc::clone(&e);
        let unlink = self.unlink_z.load(Ordering::SeqCst);
        if unlink && e.lookup(e.root_id(), name("z")).map(|x| e.forget(x.node_id, 1)).is_err() {
            return;
        }
        let handle = std::thread::spawn(move || {
            if unlink {
                chmod.unlink(chmod.root_id(), name("z")).unwrap();
                return;
            }
            let mode = if chmod.stats().journal.records_total % 2 == 0 { 0o750 } else { 0o755 };
            let set = SetAttr { mode: Some(mode), ..SetAttr::default() };
            chmod.setattr(chmod.root_id(), None, &set, false).unwrap();
        });
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while e.stats().journal.records_total == before {
            assert!(std::time::Instant::now() < deadline, "the concurrent chmod never committed");
            std::thread::yield_now();
        }
        *self.thread.lock().unwrap() = Some(handle);
    }
}

#[derive(Default)]
struct Sweep {
    seed: u64,
    op: String,
    before: View,
    /// The recovered views of this operation's crash points, compared once "after" is known.
    seen: Vec<(u64, String, Result<View, String>)>,
    quiet: bool,
    lower: Option<MemLower>,
    /// Lower states after each operation, with the lower file system's sync count then: one
    /// saved before the last sync is no longer a possible crash state.
    prefixes: Vec<(u64, MemLower)>,
}

fn recover(image: Vec<u8>, lower: MemLower) -> Result<View, String> {
    let (pool, _) = Pool::open(Arc::new(SimRegion::from_image(image)), Consistency::Undo)
        .map_err(|x| format!("open: {x}"))?;
    let e = Engine::new(lower, pool, config()).map_err(|x| format!("start: {x}"))?;
    let v = view(&e)?;
    e.pool().check_invariants()?;
    Ok(v)
}

/// A region of `params()` formatted for `mode` and an engine over `lower` with a journal of
/// `size_max` bytes, checkpointed by size only.
fn started(
    lower: &MemLower,
    mode: Consistency,
    size_max: u64,
) -> (Arc<SimRegion>, Engine<MemLower>, EngineConfig) {
    let region = Arc::new(SimRegion::new(params().region_size));
    Pool::format(&*region, params()).unwrap();
    let config = EngineConfig { journal: JournalConfig { size_max, interval_secs: 0 }, ..config() };
    let (pool, _) = Pool::open(region.clone(), mode).unwrap();
    let e = Engine::new(lower.clone(), pool, config.clone()).unwrap();
    (region, e, config)
}

/// The engine recovering a crash image of a region in `mode` over `lower`.
fn restarted(
    image: Vec<u8>,
    mode: Consistency,
    lower: MemLower,
    config: &EngineConfig,
) -> Result<Engine<MemLower>, String> {
    let (pool, _) = Pool::open(Arc::new(SimRegion::from_image(image)), mode)
        .map_err(|x| format!("open: {x}"))?;
    Engine::new(lower, pool, config.clone()).map_err(|x| format!("start: {x}"))
}

/// Creates `f0`..`f{files-1}`, in turn in each of `dirs`, with cached pages in every
/// `cached`-th (their records name the file).
fn make_files(e: &Engine<MemLower>, dirs: &[u64], files: usize, cached: usize) {
    for i in 0..files {
        let dir = dirs[i % dirs.len()];
        let (entry, fh) =
            e.create(&ROOT, dir, name(&format!("f{i}")), 0o644, libc::O_RDWR).unwrap();
        if i % cached == 0 {
            e.write(fh, 0, format!("data {i}").as_bytes(), false).unwrap();
        }
        e.release(fh).unwrap();
        e.forget(entry.node_id, 1);
    }
}

/// Every crash point of a replay recovers to `want`, with the lower file system as the
/// replay left it and as its last sync left it.
fn all_recover(points: Vec<Point>, mode: Consistency, config: &EngineConfig, want: &View) {
    for (i, (img, kept, lost)) in points.into_iter().enumerate() {
        for (what, lower) in [("kept", kept), ("lost", lost)] {
            let e = restarted(img.clone(), mode, lower, config)
                .unwrap_or_else(|x| panic!("{mode:?} crash point {i}, lower {what}: {x}"));
            assert_eq!(&view(&e).unwrap(), want, "{mode:?} crash point {i}, lower {what}");
            e.pool().check_invariants().unwrap();
        }
    }
}

/// Replays `image` over `crashed` once, keeping the crash points of the fences `keep`
/// selects (numbered from 1): the region image there and the lower file system as the replay
/// left it and as its last sync left it.
fn replay_recording(
    image: Vec<u8>,
    mode: Consistency,
    crashed: &MemLower,
    config: &EngineConfig,
    keep: impl Fn(usize) -> bool + Send + Sync + 'static,
) -> (Engine<MemLower>, Vec<Point>) {
    let replaying = Arc::new(SimRegion::from_image(image));
    let points: Arc<Mutex<Vec<Point>>> = Arc::default();
    let (hook_points, hook_lower, seen) =
        (Arc::clone(&points), crashed.clone(), Arc::new(Mutex::new(0)));
    replaying.set_fence_hook(Some(Box::new(move |point| {
        let mut n = seen.lock().unwrap();
        *n += 1;
        if keep(*n) {
            let img = point.image(CrashMode::DropAll);
            hook_points.lock().unwrap().push((img, hook_lower.fork(), hook_lower.crash()));
        }
    })));
    let (pool, _) = Pool::open(replaying.clone(), mode).unwrap();
    let e = Engine::new(crashed.clone(), pool, config.clone()).unwrap();
    replaying.set_fence_hook(None);
    let points = std::mem::take(&mut *points.lock().unwrap());
    (e, points)
}

fn sweep(seed: u64, ops: usize, churn: bool) -> Result<(u64, u64, u64, u64, u64), String> {
    let lower = MemLower::default();
    for d in &DIRS[1..] {
        lower.mkdir(&ROOT, lower.root(), name(d), 0o755).unwrap();
    }
    lower.sync_all();
    let region = Arc::new(SimRegion::new(params().region_size));
    Pool::format(&*region, params()).unwrap();
    let (pool, _) = Pool::open(region.clone(), Consistency::Undo).unwrap();
    let concurrent = Arc::new(Concurrent::default());
    concurrent.unlink_z.store(churn, Ordering::SeqCst);
    let failpoints: Arc<dyn Failpoints> = concurrent.clone();
    let config = EngineConfig { failpoints: Some(failpoints), ..config() };
    let engine = Arc::new(Engine::new(lower.clone(), pool, config).map_err(|x| x.to_string())?);
    concurrent.engine.set(Arc::downgrade(&engine)).unwrap();
    let state =
        Arc::new(Mutex::new(Sweep { seed, lower: Some(lower.clone()), ..Sweep::default() }));
    state.lock().unwrap().before = view(&engine)?;
    let hook = Arc::clone(&state);
    region.set_fence_hook(Some(Box::new(move |point| {
        let mut s = hook.lock().unwrap();
        if s.quiet {
            return;
        }
        let lower = s.lower.clone().expect("set");
        let mut images = vec![("checkpoint", lower.crash()), ("all", lower.fork())];
        let syncs = lower.syncs();
        let valid: Vec<&MemLower> =
            s.prefixes.iter().filter(|(at, _)| *at == syncs).map(|(_, l)| l).collect();
        if !valid.is_empty() {
            let j = (s.seed ^ point.fence_seq) as usize % valid.len();
            images.push(("prefix", valid[j].fork()));
        }
        for mode in [CrashMode::DropAll, CrashMode::KeepAll] {
            for (what, img) in &images {
                let got = engine::sync::isolated(|| recover(point.image(mode), img.fork()));
                s.seen.push((point.fence_seq, format!("{mode:?} lower {what}"), got));
            }
        }
    })));
    let mut rng = Rng(rand::SeedableRng::seed_from_u64(seed));
    let (mut points, mut replayed) = (0u64, 0u64);
    for i in 0..ops {
        let checkpoints = engine.stats().journal.checkpoints;
        let label = if i % 7 == 6 {
            // A checkpoint below the size limit, with a record committed during it.
            concurrent.armed.store(true, Ordering::SeqCst);
            engine.checkpoint(Why::Flush).map_err(|x| x.to_string())?;
            concurrent.armed.store(false, Ordering::SeqCst);
            if let Some(t) = concurrent.thread.lock().unwrap().take() {
                t.join().unwrap();
            }
            "checkpoint with a concurrent chmod of the root, or unlink of /z".to_string()
        } else if churn && i % 7 == 5 {
            if let Ok((x, fh)) = engine.create(&ROOT, engine.root_id(), name("z"), 0o644, 0) {
                engine.release(fh).unwrap();
                engine.forget(x.node_id, 1);
            }
            "create /z".to_string()
        } else {
            step(&engine, &mut rng, churn)
        };
        let mut s = state.lock().unwrap();
        s.quiet = true;
        drop(s);
        let after = view(&engine)?;
        let mut s = state.lock().unwrap();
        for (fence, what, got) in std::mem::take(&mut s.seen) {
            points += 1;
            let got =
                got.map_err(|x| format!("seed {seed} op {i} {label} fence {fence} {what}: {x}"))?;
            if got != s.before && got != after {
                return Err(format!(
                    "seed {seed} op {i} {label} fence {fence} {what}: recovered {got:?}\n before {:?}\n after {after:?}",
                    s.before
                ));
            }
        }
        if engine.stats().journal.checkpoints != checkpoints {
            s.prefixes.clear();
        }
        s.prefixes.push((lower.syncs(), lower.fork()));
        s.before = after;
        s.op = label;
        s.quiet = false;
    }
    region.set_fence_hook(None);
    let st = engine.stats();
    replayed += st.journal.records_total;
    eprintln!(
        "seed {seed}: {} records, {} checkpoints ({} frames freed, {} records zeroed), {} not \
         journaled, {} creations annulled",
        st.journal.records_total,
        st.journal.checkpoints,
        st.journal.frames_freed,
        st.journal.records_zeroed,
        st.journal.not_journaled,
        st.journal.records_annulled
    );
    let j = &st.journal;
    Ok((points, replayed, j.checkpoints, j.records_zeroed, j.records_annulled))
}

#[test]
fn every_crash_point_of_lower_namespace_changes_recovers_to_before_or_after() {
    let seeds: Vec<u64> = match std::env::var("NVSTACK_SEED") {
        Ok(s) => vec![s.parse().expect("NVSTACK_SEED is a number")],
        Err(_) => (1..=6).collect(),
    };
    let (mut points, mut records, mut checkpoints, mut zeroed, mut annulled) = (0, 0, 0, 0, 0);
    for seed in seeds {
        let got = sweep(seed, 120, false).unwrap_or_else(|x| panic!("{x}"));
        points += got.0;
        records += got.1;
        checkpoints += got.2;
        zeroed += got.3;
        annulled += got.4;
    }
    eprintln!(
        "journal crash images: {points} recovered and compared; {records} records, \
         {checkpoints} checkpoints, {zeroed} records zeroed in a frame kept, {annulled} \
         creations annulled by their removal"
    );
    // The crash points of a removal that annuls its object's creation (M7) were swept.
    assert!(annulled > 0, "no creation record was annulled");
    assert!(points > 1000, "too few crash images: {points}");
    assert!(records > 100 && checkpoints > 5, "{records} records, {checkpoints} checkpoints");
    // The crash points of both ways a checkpoint frees records were swept.
    assert!(zeroed > 0, "no checkpoint zeroed records of a frame it kept");
}

/// M7: the same sweep with mostly creations and removals, so that removals annul the
/// creation records of their objects - also while a checkpoint that listed them runs - and
/// crashes land on either side of each annulment, with every lower image.
#[test]
fn every_crash_point_of_creations_annulled_by_removals_recovers_to_before_or_after() {
    let seeds: Vec<u64> = match std::env::var("NVSTACK_SEED") {
        Ok(s) => vec![s.parse().expect("NVSTACK_SEED is a number")],
        Err(_) => (11..=14).collect(),
    };
    let (mut points, mut annulled) = (0, 0);
    for seed in seeds {
        let (p, _, _, _, a) = sweep(seed, 120, true).unwrap_or_else(|x| panic!("{x}"));
        points += p;
        annulled += a;
    }
    eprintln!("journal churn crash images: {points} recovered; {annulled} creations annulled");
    assert!(points > 1000, "too few crash images: {points}");
    assert!(annulled > 20, "{annulled} creations annulled");
}

/// M7 by cases: a removal of an object's last name annuls its creation record only while no
/// record since names the object - a file moved, chmod'ed or linked keeps its creation, and so
/// does a directory something was made in (replay of those records needs it) - and a crash
/// with the lower file system having lost everything or kept everything recovers to the tree
/// after the last operation.
#[test]
fn a_removal_annuls_only_a_creation_no_record_since_names() {
    for mode in [Consistency::Undo, Consistency::Journal] {
        let lower = MemLower::default();
        let (region, e, config) = started(&lower, mode, 1 << 20);
        let root = e.root_id();
        let created = |dir: u64, n: &str| {
            let (x, fh) = e.create(&ROOT, dir, name(n), 0o644, libc::O_RDWR).unwrap();
            e.release(fh).unwrap();
            x.node_id
        };
        let annulled = |e: &Engine<MemLower>| e.stats().journal.records_annulled;
        // Annulled: a file and an empty directory, removed with nothing in between.
        created(root, "short");
        e.unlink(root, name("short")).unwrap();
        e.mkdir(&ROOT, root, name("empty"), 0o755).unwrap();
        e.rmdir(root, name("empty")).unwrap();
        assert_eq!((annulled(&e), e.stats().journal.records), (2, 2), "{mode:?}");
        // Kept: moved, chmod'ed, linked (and its last name removed later), a directory with
        // a file made (and removed) in it.
        created(root, "moved");
        e.rename(root, name("moved"), root, name("moved2"), 0).unwrap();
        e.unlink(root, name("moved2")).unwrap();
        let f = created(root, "chmod");
        let set = SetAttr { mode: Some(0o600), ..SetAttr::default() };
        e.setattr(f, None, &set, false).unwrap();
        e.unlink(root, name("chmod")).unwrap();
        let f = created(root, "linked");
        e.link(f, root, name("link2")).unwrap();
        e.unlink(root, name("linked")).unwrap();
        e.unlink(root, name("link2")).unwrap();
        let d = e.mkdir(&ROOT, root, name("dir"), 0o755).unwrap().node_id;
        created(d, "inner"); // annulled by its own removal
        e.unlink(d, name("inner")).unwrap();
        e.rmdir(root, name("dir")).unwrap();
        assert_eq!(annulled(&e), 3, "{mode:?}: {:?}", e.stats().journal);
        e.group_commit();
        let want = view(&e).unwrap();
        assert_eq!(want.len(), 0, "{mode:?}: {want:?}");
        let image = region.crash_image(CrashMode::DropAll);
        for (what, img) in [("lost", lower.crash()), ("kept", lower.fork())] {
            let e = restarted(image.clone(), mode, img, &config)
                .unwrap_or_else(|x| panic!("{mode:?}: lower {what}: {x}"));
            assert_eq!(view(&e).unwrap(), want, "{mode:?}: lower {what}");
        }
    }
}

/// M3 (the marker): a directory created, moved, then replaced by another one, with every change
/// already in the lower file system when the daemon dies. Judged by state alone, replay would
/// make the first directory again (it no longer exists) and move it over the second.
#[test]
fn replay_starts_after_what_the_lower_file_system_has_for_certain() {
    let lower = MemLower::default();
    let region = Arc::new(SimRegion::new(params().region_size));
    Pool::format(&*region, params()).unwrap();
    let config =
        EngineConfig { journal: JournalConfig { size_max: 1 << 20, interval_secs: 0 }, ..config() };
    let (pool, _) = Pool::open(region.clone(), Consistency::Undo).unwrap();
    let e = Engine::new(lower.clone(), pool, config.clone()).unwrap();
    let root = e.root_id();
    let y = e.mkdir(&ROOT, root, name("y"), 0o755).unwrap().node_id;
    let a = e.mkdir(&ROOT, root, name("a"), 0o755).unwrap().node_id;
    e.setxattr(a, name("user.k"), b"the second", 0).unwrap();
    // The second directory is older than the journal's records.
    e.checkpoint(engine::journal::checkpoint::Why::Interval).unwrap();
    e.mkdir(&ROOT, y, name("d"), 0o700).unwrap();
    e.rename(y, name("d"), root, name("c"), 0).unwrap();
    e.rename(root, name("a"), root, name("c"), 0).unwrap();
    assert_eq!(e.stats().journal.records, 3, "the last three changes in the journal");
    // The daemon dies; the lower file system kept everything (its own commit ran).
    let image = region.crash_image(CrashMode::DropAll);
    let v = recover(image, lower.fork()).unwrap();
    assert_eq!(v.get("/c").map(String::as_str), Some("dir 755 user.k"), "{v:?}");
    assert!(!v.contains_key("/y/d") && !v.contains_key("/a"), "{v:?}");
}

/// A crash point of a replay: the region image, the lower file system as the replay left it,
/// and as its last sync left it.
type Point = (Vec<u8>, MemLower, MemLower);

/// A directory the lower file system lost, named by hundreds of later records: replay makes it
/// again and re-keys every record in bounded transactions (M4; one transaction would overflow
/// journal mode's log credit, and an undo slot with thousands), and a crash at any sampled
/// fence of that replay - with the lower file system as the replay left it, or as its last
/// sync - recovers to the same tree.
#[test]
fn a_lost_directory_named_by_many_records_is_made_again_in_bounded_steps_even_when_replay_crashes()
{
    // More records than a transaction of this geometry holds in journal mode (16 pages).
    const FILES: usize = 300;
    for mode in [Consistency::Journal, Consistency::Undo] {
        let params = FormatParams {
            region_size: 12288 + 4 * 65536 + 4096 + 2048 * 4096,
            undo_slots: 4,
            undo_slot_size: 65536,
        };
        let lower = MemLower::default();
        let region = Arc::new(SimRegion::new(params.region_size));
        Pool::format(&*region, params).unwrap();
        let config = EngineConfig {
            journal: JournalConfig { size_max: 8 << 20, interval_secs: 0 },
            ..config()
        };
        let (pool, _) = Pool::open(region.clone(), mode).unwrap();
        let e = Engine::new(lower.clone(), pool, config.clone()).unwrap();
        let big = e.mkdir(&ROOT, e.root_id(), name("big"), 0o755).unwrap().node_id;
        // Cached pages in some: their record names the file, made again with a new handle.
        make_files(&e, &[big], FILES, 50);
        e.group_commit(); // journal mode: the records are durable
        let want = view(&e).unwrap();
        assert_eq!(want.len(), FILES + 1, "{mode:?}");
        // The lower file system lost everything since its last sync: "big" and its files.
        let image = region.crash_image(CrashMode::DropAll);
        drop(e);
        // Crashes inside the replay, with the lower file system kept and lost: every tenth
        // fence, and every one of the last 40 (re-keying the records that outlive the journal,
        // the checkpoint). A first replay counts them (replay is deterministic).
        let crashed = lower.crash();
        let total = {
            let counting = Arc::new(SimRegion::from_image(image.clone()));
            let seen = Arc::new(Mutex::new(0usize));
            let hook_seen = Arc::clone(&seen);
            counting.set_fence_hook(Some(Box::new(move |_| *hook_seen.lock().unwrap() += 1)));
            let (pool, _) = Pool::open(counting.clone(), mode).unwrap();
            drop(Engine::new(crashed.fork(), pool, config.clone()).unwrap());
            counting.set_fence_hook(None);
            *seen.lock().unwrap()
        };
        let (e, points) = replay_recording(image.clone(), mode, &crashed, &config, move |n| {
            n % 10 == 0 || n + 40 > total
        });
        assert_eq!(view(&e).unwrap(), want, "{mode:?}: the first replay");
        let replayed = e.stats().journal.replayed_at_mount as usize;
        assert!(replayed > FILES, "{mode:?}: {replayed} replayed");
        drop(e);
        assert!(points.len() > 20, "{mode:?}: {} crash points", points.len());
        all_recover(points, mode, &config, &want);
    }
}

/// M5 when the note does not fit: a tree the lower file system lost is made again with
/// handles longer than the room its creation records kept (as NFS's or XFS's can be), so
/// replay moves each creation record, with its note, to larger slots. A crash at every fence
/// of that replay - with the lower file system as the replay left it, or as its last sync -
/// recovers to the same tree, in both consistency modes.
#[test]
fn a_note_longer_than_its_record_moves_the_record_even_when_replay_crashes() {
    const FILES: usize = 24;
    for mode in [Consistency::Undo, Consistency::Journal] {
        let long_from = Arc::new(std::sync::atomic::AtomicU64::new(u64::MAX));
        let lower = MemLower::new(lower::MemConfig {
            long_handles_from: Arc::clone(&long_from),
            ..Default::default()
        });
        let (region, e, config) = started(&lower, mode, 1 << 20);
        let top = e.mkdir(&ROOT, e.root_id(), name("t"), 0o755).unwrap().node_id;
        let sub = e.mkdir(&ROOT, top, name("s"), 0o700).unwrap().node_id;
        make_files(&e, &[top, sub], FILES, 8);
        e.symlink(&ROOT, sub, name("l"), OsStr::new("f1")).unwrap();
        // The newest object: its generation is the largest so far.
        let (t, _) = lower.lookup(lower.root(), name("t")).unwrap();
        let (s, _) = lower.lookup(&t, name("s")).unwrap();
        let (l, _) = lower.lookup(&s, name("l")).unwrap();
        let last = lower.file_handle(&l).unwrap();
        drop((t, s, l));
        e.group_commit(); // journal mode: the records are durable
        let want = view(&e).unwrap();
        assert_eq!(want.len(), FILES + 3, "{mode:?}: {want:?}");
        let image = region.crash_image(CrashMode::DropAll);
        drop(e);
        // Everything made from now on (replay's objects) gets a 128-byte handle.
        let generation = u64::from_le_bytes(last[8..16].try_into().unwrap());
        long_from.store(generation + 1, Ordering::SeqCst);
        let crashed = lower.crash(); // lost "t" and all below it
        let (e, points) = replay_recording(image, mode, &crashed, &config, |_| true);
        assert_eq!(view(&e).unwrap(), want, "{mode:?}: the first replay");
        let st = e.stats().journal;
        assert_eq!(st.notes_moved, FILES as u64 + 3, "{mode:?}: every creation moved");
        e.pool().check_invariants().unwrap();
        drop(e);
        assert!(points.len() > 2 * FILES, "{mode:?}: {} crash points", points.len());
        all_recover(points, mode, &config, &want);
    }
}

/// The interval counts from the oldest record not yet checkpointed, not from the last
/// checkpoint or the start: a record committed long after the last checkpoint still gets its
/// full interval, and a record never waits much more than one.
#[test]
fn the_checkpoint_interval_counts_from_the_oldest_record_waiting() {
    const START: u64 = lower::LogicalClock::DEFAULT_START_SECS;
    let clock = Arc::new(lower::LogicalClock::default());
    let lower = MemLower::new(lower::MemConfig { clock: clock.clone(), ..Default::default() });
    let params = FormatParams {
        region_size: 12288 + 4 * 65536 + 4096 + 256 * 4096,
        undo_slots: 4,
        undo_slot_size: 65536,
    };
    let region = Arc::new(SimRegion::new(params.region_size));
    Pool::format(&*region, params).unwrap();
    let config =
        EngineConfig { journal: JournalConfig { size_max: 8 << 20, interval_secs: 5 }, ..config() };
    let (pool, _) = Pool::open(region, Consistency::Undo).unwrap();
    let e = Engine::new(lower, pool, config).unwrap();
    let checkpoints = |e: &Engine<MemLower>| e.stats().journal.checkpoints;
    let before = checkpoints(&e);
    // Idle for a minute, then the first record: not checkpointed at the next tick.
    clock.set(START + 60, 0);
    e.mkdir(&ROOT, e.root_id(), name("a"), 0o755).unwrap();
    e.tick().unwrap();
    assert_eq!(checkpoints(&e), before, "checkpointed before the record's interval");
    assert_eq!(e.stats().journal.records, 1);
    clock.set(START + 64, 0);
    e.mkdir(&ROOT, e.root_id(), name("b"), 0o755).unwrap();
    e.tick().unwrap();
    assert_eq!(checkpoints(&e), before, "4 s after the oldest record");
    // 5 s after the oldest record: both go, though "b" is younger.
    clock.set(START + 65, 0);
    e.tick().unwrap();
    assert_eq!(checkpoints(&e), before + 1);
    assert_eq!(e.stats().journal.records, 0);
    // The next record counts from its own commit again.
    clock.set(START + 90, 0);
    e.mkdir(&ROOT, e.root_id(), name("c"), 0o755).unwrap();
    clock.set(START + 94, 0);
    e.tick().unwrap();
    assert_eq!(checkpoints(&e), before + 1, "checkpointed early");
    clock.set(START + 95, 0);
    e.tick().unwrap();
    assert_eq!(checkpoints(&e), before + 2, "not checkpointed at its interval");
}

/// A size checkpoint runs only while the journal is full: one that waited for another
/// checkpoint (several requests can find the journal full at once) finds room and returns
/// without a syncfs of the lower file system.
#[test]
fn a_size_checkpoint_runs_only_while_the_journal_is_full() {
    let lower = MemLower::default();
    // Two frames: 32 one-slot records.
    let (_region, e, _) = started(&lower, Consistency::Undo, 2 * 4096);
    let (checkpoints, syncs) = (e.stats().journal.checkpoints, lower.syncs());
    for i in 0..5 {
        e.mkdir(&ROOT, e.root_id(), name(&format!("d{i}")), 0o755).unwrap();
    }
    assert_eq!(e.checkpoint(Why::Size).unwrap(), 0, "not full: nothing to do");
    assert_eq!(e.stats().journal.records, 5);
    assert_eq!((e.stats().journal.checkpoints, lower.syncs()), (checkpoints, syncs));
    // Filling it checkpoints inside the request that filled it.
    for i in 5..40 {
        e.mkdir(&ROOT, e.root_id(), name(&format!("d{i}")), 0o755).unwrap();
    }
    assert!(e.stats().journal.checkpoints > checkpoints, "{:?}", e.stats().journal);
    assert!(lower.syncs() > syncs);
    assert!(e.stats().journal.records < 32);
}

/// Unlinks every other of `files` names in `/big` once, at the first `checkpoint.synced`.
#[derive(Debug, Default)]
struct UnlinkDuringCheckpoint {
    engine: OnceLock<Weak<Engine<MemLower>>>,
    files: usize,
    done: AtomicBool,
}

impl Failpoints for UnlinkDuringCheckpoint {
    fn hit(&self, point: &'static str) {
        if point != "checkpoint.synced" || self.done.swap(true, Ordering::SeqCst) {
            return;
        }
        let e = self.engine.get().and_then(Weak::upgrade).expect("the test's engine");
        let files = self.files;
        // Another thread, as another request would be; joined here (the journal never
        // fills, so none of its operations waits for this checkpoint).
        std::thread::spawn(move || {
            let big = e.lookup(e.root_id(), name("big")).unwrap().node_id;
            for i in (1..files).step_by(2) {
                e.unlink(big, name(&format!("f{i}"))).unwrap();
            }
        })
        .join()
        .unwrap();
    }
}

/// Records committed during a checkpoint take slots freed before (annulled creations') in
/// many frames, so the checkpoint must zero its records in frames that keep the newer ones -
/// more than one transaction of this geometry (64 KiB undo slots) holds: it frees them in
/// smaller ones, and the region then recovers to the tree, with the lower file system as the
/// checkpoint left it and as it was before.
#[test]
fn a_checkpoint_zeroing_records_in_many_frames_frees_them_in_transactions_that_fit() {
    const FILES: usize = 640;
    for mode in [Consistency::Undo, Consistency::Journal] {
        let lower = MemLower::default();
        let params = FormatParams {
            region_size: 12288 + 4 * 65536 + 4096 + 512 * 4096,
            undo_slots: 4,
            undo_slot_size: 65536,
        };
        let region = Arc::new(SimRegion::new(params.region_size));
        Pool::format(&*region, params).unwrap();
        let hook = Arc::new(UnlinkDuringCheckpoint { files: FILES, ..Default::default() });
        let failpoints: Arc<dyn Failpoints> = hook.clone();
        let config = EngineConfig {
            journal: JournalConfig { size_max: 1 << 20, interval_secs: 0 },
            failpoints: Some(failpoints),
            ..config()
        };
        let (pool, _) = Pool::open(region.clone(), mode).unwrap();
        let e = Arc::new(Engine::new(lower.clone(), pool, config.clone()).unwrap());
        hook.engine.set(Arc::downgrade(&e)).unwrap();
        let big = e.mkdir(&ROOT, e.root_id(), name("big"), 0o755).unwrap().node_id;
        for i in 0..FILES {
            let (x, fh) = e.create(&ROOT, big, name(&format!("f{i}")), 0o644, 0).unwrap();
            e.release(fh).unwrap();
            e.forget(x.node_id, 1);
        }
        // Every fourth file goes at once: its creation is annulled, leaving a free slot in
        // every frame.
        for i in (0..FILES).step_by(4) {
            e.unlink(big, name(&format!("f{i}"))).unwrap();
        }
        let before = e.stats().journal;
        assert_eq!(before.records_annulled, FILES as u64 / 4, "{mode:?}");
        let synced = lower.fork();
        e.checkpoint(Why::Flush).unwrap();
        let after = e.stats().journal;
        // The odd files' unlinks annulled the listed creations and took freed slots.
        assert_eq!(after.records_annulled, before.records_annulled + FILES as u64 / 2);
        assert!(after.records_zeroed > 100, "{mode:?}: {after:?}");
        assert_eq!(after.records, FILES as u64 / 2, "{mode:?}: the unlinks since (1) stay");
        e.group_commit();
        let want = view(&e).unwrap();
        assert_eq!(want.len(), 1 + FILES / 4, "{mode:?}");
        let image = region.crash_image(CrashMode::DropAll);
        drop(e);
        let config = EngineConfig { failpoints: None, ..config };
        for (what, img) in [("as left", lower.fork()), ("before the checkpoint", synced)] {
            let e = restarted(image.clone(), mode, img, &config)
                .unwrap_or_else(|x| panic!("{mode:?}: lower {what}: {x}"));
            assert_eq!(view(&e).unwrap(), want, "{mode:?}: lower {what}");
            e.pool().check_invariants().unwrap();
        }
    }
}
