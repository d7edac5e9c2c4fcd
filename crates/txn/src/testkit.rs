//! A seeded workload of transactions and the logical state of a pool: shared by the crash-image
//! tests, the process-kill test (`txn-torture`) and the benchmark. Deterministic: the same seed
//! on a freshly formatted region of the same geometry makes the same transactions and the same
//! allocation decisions, which is what lets a test replay a killed process's history.
//!
//! Each transaction mixes frame allocations (full random contents), frees, snapshots of random
//! ranges from one byte to a whole frame, ranges that cross a frame boundary, root-area updates
//! and, sometimes, many frames at once (larger than a page, and occasionally larger than the
//! undo slot, which exercises `UndoFull` and abort). The committed-transaction counter lives in
//! the first 8 bytes of the root area.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use nvram::layout::{FRAME_SIZE, ROOT_OFFSET, ROOT_SIZE};
use nvram::{CrashMode, CrashPoint, Error, FormatParams, Layout, Region, SimRegion};
use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::frames::{self, FrameId, FrameTag};
use crate::journal;
use crate::pool::{Consistency, Pool};
use crate::tx::{Tx, TxError};

/// Offset, inside the root area, of the committed-transaction counter.
pub const COUNTER_OFFSET: u64 = ROOT_OFFSET;
/// The descriptor kind the workload tags its frames with.
pub const WORKLOAD_KIND: u32 = 0x7e57;

/// What a region holds, as the layers above see it: the root area, and every allocated frame
/// with its tag and contents. Free frames' bytes are not part of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogicalState {
    pub root: Vec<u8>,
    pub frames: BTreeMap<u64, (FrameTag, Vec<u8>)>,
}

impl LogicalState {
    pub fn read(region: &dyn Region, layout: &Layout) -> Result<LogicalState, Error> {
        let tags = frames::scan(region, layout)?;
        let frames = tags
            .iter()
            .enumerate()
            .filter_map(|(i, tag)| {
                tag.map(|t| {
                    let i = i as u64;
                    (i, (t, region.read_vec(layout.frame_offset(i), FRAME_SIZE as usize)))
                })
            })
            .collect();
        Ok(LogicalState { root: region.read_vec(ROOT_OFFSET, ROOT_SIZE as usize), frames })
    }

    pub fn of(pool: &Pool) -> LogicalState {
        LogicalState::read(pool.region(), pool.layout()).expect("descriptors of a live pool")
    }

    /// The committed-transaction counter.
    pub fn counter(&self) -> u64 {
        u64::from_le_bytes(self.root[..8].try_into().expect("8 bytes"))
    }

    /// A one-line description of the first difference, for test failures.
    pub fn diff(&self, other: &LogicalState) -> String {
        if self.root != other.root {
            let at = self.root.iter().zip(&other.root).position(|(a, b)| a != b);
            return format!("root area differs at byte {at:?}");
        }
        let a: Vec<_> = self.frames.keys().collect();
        let b: Vec<_> = other.frames.keys().collect();
        if a != b {
            return format!("allocated frames differ: {a:?} vs {b:?}");
        }
        for (frame, (tag, data)) in &self.frames {
            let (tag2, data2) = &other.frames[frame];
            if tag != tag2 {
                return format!("frame {frame} tag {tag:?} vs {tag2:?}");
            }
            if data != data2 {
                let at = data.iter().zip(data2).position(|(x, y)| x != y);
                return format!("frame {frame} contents differ at byte {at:?}");
            }
        }
        "equal".into()
    }
}

/// The workload's own idea of the state, independent of the pool: contents by owner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Model {
    pub root: Vec<u8>,
    pub frames: BTreeMap<u64, Vec<u8>>,
}

impl Model {
    fn new() -> Model {
        Model { root: vec![0; ROOT_SIZE as usize], frames: BTreeMap::new() }
    }

    /// Checks that `state` holds exactly what the model says.
    pub fn check(&self, state: &LogicalState) -> Result<(), String> {
        if state.root != self.root {
            return Err("root area differs from the model".into());
        }
        let by_owner: BTreeMap<u64, &Vec<u8>> =
            state.frames.values().map(|(tag, data)| (tag.owner, data)).collect();
        if by_owner.len() != state.frames.len() {
            return Err("two frames share an owner".into());
        }
        if by_owner.keys().collect::<Vec<_>>() != self.frames.keys().collect::<Vec<_>>() {
            return Err("the set of allocated frames differs from the model".into());
        }
        for (owner, data) in &self.frames {
            if by_owner[owner] != data {
                return Err(format!("contents of owner {owner} differ from the model"));
            }
        }
        Ok(())
    }
}

#[derive(Clone, Debug)]
struct WorkState {
    model: Model,
    /// Live frames and their owners.
    live: BTreeMap<u64, u64>,
    next_owner: u64,
    committed: u64,
}

/// How a prepared transaction is to end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    Commit,
    Abort,
}

/// Knobs of the workload.
#[derive(Clone, Copy, Debug)]
pub struct WorkloadConfig {
    /// Percent of transactions that touch many frames.
    pub big_percent: u32,
    /// Percent of transactions the workload aborts on purpose.
    pub abort_percent: u32,
}

impl Default for WorkloadConfig {
    fn default() -> Self {
        WorkloadConfig { big_percent: 8, abort_percent: 10 }
    }
}

/// The seeded workload. See the module docs.
#[derive(Debug)]
pub struct Workload {
    rng: ChaCha8Rng,
    config: WorkloadConfig,
    state: WorkState,
    /// Transactions prepared so far (committed or aborted).
    pub steps: u64,
}

/// A transaction built by [`Workload::prepare`], to be ended with [`Prepared::finish`].
#[derive(Debug)]
pub struct Prepared<'p, 'w> {
    pub tx: Tx<'p>,
    pub decision: Decision,
    next: WorkState,
    workload: &'w mut Workload,
}

impl Prepared<'_, '_> {
    /// Commits or aborts as decided, and advances the workload's model.
    pub fn finish(self) {
        match self.decision {
            Decision::Commit => {
                self.tx.commit();
                self.workload.state = self.next;
            }
            Decision::Abort => self.tx.abort(),
        }
    }
}

impl Workload {
    pub fn new(seed: u64, config: WorkloadConfig) -> Workload {
        Workload {
            rng: ChaCha8Rng::seed_from_u64(seed),
            config,
            state: WorkState {
                model: Model::new(),
                live: BTreeMap::new(),
                next_owner: 1,
                committed: 0,
            },
            steps: 0,
        }
    }

    /// The model of the last committed state.
    pub fn model(&self) -> &Model {
        &self.state.model
    }

    pub fn committed(&self) -> u64 {
        self.state.committed
    }

    /// Runs one transaction and commits or aborts it as it decides.
    pub fn step(&mut self, pool: &Pool) -> Decision {
        let prepared = self.prepare(pool);
        let decision = prepared.decision;
        prepared.finish();
        decision
    }

    /// Builds one transaction (every snapshot and store done) without ending it.
    pub fn prepare<'p, 'w>(&'w mut self, pool: &'p Pool) -> Prepared<'p, 'w> {
        self.steps += 1;
        let mut next = self.state.clone();
        let mut tx = pool.begin();
        let big = self.rng.random_ratio(self.config.big_percent, 100);
        let ops = if big { self.rng.random_range(8..=40) } else { self.rng.random_range(1..=5) };
        let mut failed = false;
        for _ in 0..ops {
            if let Err(e) = self.op(&mut tx, &mut next, big) {
                assert!(matches!(e, TxError::UndoFull { .. }), "unexpected {e}");
                failed = true;
                break;
            }
        }
        let decision = if failed || self.rng.random_ratio(self.config.abort_percent, 100) {
            Decision::Abort
        } else {
            Decision::Commit
        };
        if !failed {
            next.committed += 1;
            let counter = next.committed.to_le_bytes();
            match tx.update(COUNTER_OFFSET, &counter) {
                Ok(()) => next.model.root[..8].copy_from_slice(&counter),
                Err(_) => {
                    return Prepared { tx, decision: Decision::Abort, next, workload: self };
                }
            }
        }
        Prepared { tx, decision, next, workload: self }
    }

    fn random_bytes(&mut self, len: usize) -> Vec<u8> {
        let mut data = vec![0u8; len];
        self.rng.fill_bytes(&mut data);
        data
    }

    fn pick_live(&mut self, next: &WorkState) -> Option<(u64, u64)> {
        if next.live.is_empty() {
            return None;
        }
        let i = self.rng.random_range(0..next.live.len());
        next.live.iter().nth(i).map(|(&f, &o)| (f, o))
    }

    fn op(&mut self, tx: &mut Tx<'_>, next: &mut WorkState, big: bool) -> Result<(), TxError> {
        let pool = tx.pool();
        let roll =
            if big { 40 + self.rng.random_range(0..45) } else { self.rng.random_range(0..100) };
        match roll {
            0..25 => {
                let owner = next.next_owner;
                let tag = FrameTag { kind: WORKLOAD_KIND, owner, index: self.steps };
                let frame = match tx.alloc_frame(tag) {
                    Ok(frame) => frame,
                    Err(TxError::NoFrames) => return Ok(()),
                    Err(e) => return Err(e),
                };
                next.next_owner += 1;
                let data = self.random_bytes(FRAME_SIZE as usize);
                tx.write(pool.frame_offset(frame), &data);
                next.model.frames.insert(owner, data);
                next.live.insert(frame.0, owner);
            }
            25..40 => {
                if let Some((frame, owner)) = self.pick_live(next) {
                    tx.free_frame(FrameId(frame))?;
                    next.model.frames.remove(&owner);
                    next.live.remove(&frame);
                }
            }
            40..85 => {
                if let Some((frame, owner)) = self.pick_live(next) {
                    let len = match self.rng.random_range(0..4) {
                        0 => self.rng.random_range(1..=8),
                        1 => self.rng.random_range(9..=64),
                        2 => self.rng.random_range(65..=512),
                        _ => self.rng.random_range(513..=FRAME_SIZE as usize),
                    };
                    let start = self.rng.random_range(0..=FRAME_SIZE as usize - len);
                    let data = self.random_bytes(len);
                    tx.update(pool.frame_offset(FrameId(frame)) + start as u64, &data)?;
                    let contents = next.model.frames.get_mut(&owner).expect("live frame modelled");
                    contents[start..start + len].copy_from_slice(&data);
                }
            }
            85..95 => {
                // A range across the boundary of two physically adjacent live frames.
                let pairs: Vec<(u64, u64, u64)> = next
                    .live
                    .iter()
                    .filter_map(|(&f, &o)| next.live.get(&(f + 1)).map(|&o2| (f, o, o2)))
                    .collect();
                if !pairs.is_empty() {
                    let (frame, first, second) = pairs[self.rng.random_range(0..pairs.len())];
                    let head = self.rng.random_range(1..=FRAME_SIZE as usize);
                    let tail = self.rng.random_range(1..=FRAME_SIZE as usize);
                    let data = self.random_bytes(head + tail);
                    let off = pool.frame_offset(FrameId(frame)) + FRAME_SIZE - head as u64;
                    tx.update(off, &data)?;
                    let a = next.model.frames.get_mut(&first).expect("modelled");
                    a[FRAME_SIZE as usize - head..].copy_from_slice(&data[..head]);
                    let b = next.model.frames.get_mut(&second).expect("modelled");
                    b[..tail].copy_from_slice(&data[head..]);
                }
            }
            _ => {
                let len = self.rng.random_range(1..=256);
                let start = self.rng.random_range(8..=ROOT_SIZE as usize - len);
                let data = self.random_bytes(len);
                tx.update(ROOT_OFFSET + start as u64, &data)?;
                next.model.root[start..start + len].copy_from_slice(&data);
            }
        }
        Ok(())
    }
}

/// Geometry for crash sweeps: 2 slots of 32 KiB (small enough that big transactions overflow
/// them) and 48 frames, so thousands of crash images stay cheap to recover.
pub fn sweep_params() -> FormatParams {
    FormatParams {
        region_size: 12288 + 2 * 32768 + 4096 + 48 * 4096,
        undo_slots: 2,
        undo_slot_size: 32768,
    }
}

/// Recovers `image` as `open` would; returns the logical state after checking the allocator.
pub fn recover_image(image: Vec<u8>) -> Result<LogicalState, String> {
    recover_image_as(image, Consistency::Undo)
}

/// Recovers `image` by opening it in `mode` (whatever mode wrote it).
pub fn recover_image_as(image: Vec<u8>, mode: Consistency) -> Result<LogicalState, String> {
    let region: Arc<dyn Region> = Arc::new(SimRegion::from_image(image));
    let (pool, _) = Pool::open(region, mode).map_err(|e| e.to_string())?;
    pool.check_invariants()?;
    Ok(LogicalState::of(&pool))
}

/// Recovers `image`, crashing the recovery itself at each of its fences (dropped and torn) and
/// recovering those images too; every result must be the same state.
fn recover_with_nested_crashes(image: Vec<u8>, nested: &mut u64) -> Result<LogicalState, String> {
    recover_with_nested_crashes_as(image, Consistency::Undo, nested)
}

/// `recover_with_nested_crashes` opening in `mode` (each nested image is recovered in `mode`
/// too).
fn recover_with_nested_crashes_as(
    image: Vec<u8>,
    mode: Consistency,
    nested: &mut u64,
) -> Result<LogicalState, String> {
    let region = Arc::new(SimRegion::from_image(image));
    let images: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
    let sink = Arc::clone(&images);
    region.set_fence_hook(Some(Box::new(move |point| {
        let mut images = sink.lock().expect("nested images");
        images.push(point.image(CrashMode::DropAll));
        images.push(point.image(CrashMode::Torn { seed: point.fence_seq }));
    })));
    let dyn_region: Arc<dyn Region> = region.clone();
    let (pool, _) = Pool::open(dyn_region, mode).map_err(|e| e.to_string())?;
    region.set_fence_hook(None);
    pool.check_invariants()?;
    let state = LogicalState::of(&pool);
    for image in images.lock().expect("nested images").drain(..) {
        *nested += 1;
        let again = recover_image_as(image, mode)?;
        if again != state {
            return Err(format!("recovery after a crash during recovery: {}", again.diff(&state)));
        }
    }
    Ok(state)
}

/// What a crash sweep exercised.
#[derive(Clone, Debug, Default)]
pub struct SweepReport {
    pub transactions: u64,
    pub committed: u64,
    /// Fences at which crash images were taken.
    pub crash_points: u64,
    pub images: u64,
    /// Images that showed the transaction being committed (taken inside its commit call).
    pub images_in_commit: u64,
    /// Images from crashes during recovery.
    pub nested_images: u64,
}

#[derive(Default)]
struct SweepState {
    seed: u64,
    before: Option<LogicalState>,
    after: Option<LogicalState>,
    committing: bool,
    report: SweepReport,
    nested_every: u64,
    failure: Option<String>,
}

/// The crash modes tried at a fence: drop all, keep all, and two seeded tearings.
pub fn crash_modes(seed: u64, fence: u64) -> [CrashMode; 4] {
    let base = seed.wrapping_mul(1_000_003).wrapping_add(fence.wrapping_mul(7919));
    [
        CrashMode::DropAll,
        CrashMode::KeepAll,
        CrashMode::Torn { seed: base },
        CrashMode::Torn { seed: base ^ 0x5555 },
    ]
}

fn check_crash_point(s: &mut SweepState, point: &CrashPoint<'_>) -> Result<(), String> {
    s.report.crash_points += 1;
    let nested = s.nested_every > 0 && s.report.crash_points % s.nested_every == 0;
    for mode in crash_modes(s.seed, point.fence_seq) {
        let image = point.image(mode);
        let got = if nested {
            recover_with_nested_crashes(image, &mut s.report.nested_images)
        } else {
            recover_image(image)
        };
        let where_ = format!("seed {} fence {} {mode:?}", s.seed, point.fence_seq);
        let got = got.map_err(|e| format!("{where_}: recovery failed: {e}"))?;
        s.report.images += 1;
        let before = s.before.as_ref().expect("before state set");
        if got == *before {
            continue;
        }
        if s.committing && s.after.as_ref() == Some(&got) {
            s.report.images_in_commit += 1;
            continue;
        }
        return Err(format!(
            "{where_} (committing: {}): the recovered state is neither the last committed state \
             nor the one being committed: {}",
            s.committing,
            got.diff(before)
        ));
    }
    Ok(())
}

/// The crash-image sweep (level 1 of the three crash-test levels, docs/design.md section 9): runs `transactions` transactions of the seeded
/// workload on a simulated region; at every fence takes four crash images (drop all, keep all,
/// two torn), recovers each in a fresh pool and requires the logical state to equal, byte for
/// byte, the state after the last committed transaction - or, while the transaction is inside
/// its commit call, the state after it. A shadow pool runs the same workload without crashes to
/// provide those states, and the workload's independent model checks the shadow. Every
/// `nested_every`-th crash point is also crashed at every fence of its own recovery.
pub fn crash_sweep(
    seed: u64,
    transactions: usize,
    nested_every: u64,
) -> Result<SweepReport, String> {
    let params = sweep_params();
    let primary = Arc::new(SimRegion::new(params.region_size));
    Pool::format(&*primary, params).map_err(|e| e.to_string())?;
    let shadow = Arc::new(SimRegion::from_image(primary.current()));
    let (pool, _) = Pool::open(primary.clone(), Consistency::Undo).map_err(|e| e.to_string())?;
    let (shadow_pool, _) = Pool::open(shadow, Consistency::Undo).map_err(|e| e.to_string())?;
    let state = Arc::new(Mutex::new(SweepState {
        seed,
        before: Some(LogicalState::of(&shadow_pool)),
        nested_every,
        ..SweepState::default()
    }));
    let hook_state = Arc::clone(&state);
    primary.set_fence_hook(Some(Box::new(move |point| {
        let mut s = hook_state.lock().expect("sweep state");
        if s.failure.is_none()
            && let Err(e) = check_crash_point(&mut s, point)
        {
            s.failure = Some(e);
        }
    })));
    let config = WorkloadConfig::default();
    let mut reference = Workload::new(seed, config);
    let mut workload = Workload::new(seed, config);
    for _ in 0..transactions {
        let decision = reference.step(&shadow_pool);
        let after = LogicalState::of(&shadow_pool);
        reference
            .model()
            .check(&after)
            .map_err(|e| format!("seed {seed}: shadow vs model: {e}"))?;
        state.lock().expect("sweep state").after = Some(after.clone());
        let prepared = workload.prepare(&pool);
        if prepared.decision != decision {
            return Err(format!("seed {seed}: the two workloads diverged"));
        }
        state.lock().expect("sweep state").committing = true;
        prepared.finish();
        let mut s = state.lock().expect("sweep state");
        s.committing = false;
        if let Some(failure) = s.failure.take() {
            return Err(failure);
        }
        let now = LogicalState::of(&pool);
        if now != after {
            return Err(format!("seed {seed}: primary differs from shadow: {}", now.diff(&after)));
        }
        s.before = Some(after);
    }
    primary.set_fence_hook(None);
    pool.check_invariants()?;
    let mut report = std::mem::take(&mut state.lock().expect("sweep state").report);
    report.transactions = workload.steps;
    report.committed = workload.committed();
    Ok(report)
}

/// Geometry for journal-mode crash sweeps: 2 slots of 64 KiB, i.e. a group log of 31 page
/// copies and 15 per transaction (the workload's big transactions overflow it: `UndoFull`,
/// abort; groups fill up: forced commits), and 48 frames.
pub fn journal_sweep_params() -> FormatParams {
    FormatParams {
        region_size: 12288 + 2 * 65536 + 4096 + 48 * 4096,
        undo_slots: 2,
        undo_slot_size: 65536,
    }
}

/// Whether the process-kill workload commits the group after step `step` (as fsync would):
/// after every fifth transaction.
pub fn journal_schedule(step: u64) -> bool {
    step % 5 == 0
}

/// The generation word in a region image (the group whose commit point the image reached).
pub fn image_generation(image: &[u8]) -> Result<u64, String> {
    let region = SimRegion::from_image(image.to_vec());
    let layout = Layout::read(&region).map_err(|e| e.to_string())?;
    journal::read_generation(&region, &layout).map_err(|e| e.to_string())
}

/// What a journal-mode crash sweep exercised.
#[derive(Clone, Debug, Default)]
pub struct JournalSweepReport {
    pub transactions: u64,
    pub committed: u64,
    /// Group commits: asked for (as fsync would) and forced by `begin` (log or size full).
    pub group_commits: u64,
    pub forced_commits: u64,
    pub crash_points: u64,
    pub images: u64,
    /// Images taken while a group commit's commit point was being made durable that showed
    /// the new group (the rest of the images of that fence showed the old one).
    pub images_past_commit_point: u64,
    /// Images also recovered in undo mode (the mode switch after a crash).
    pub images_recovered_as_undo: u64,
    pub nested_images: u64,
    /// Pages copied into the group log (copy-on-write of protected pages).
    pub records: u64,
}

#[derive(Default)]
struct JournalSweepState {
    seed: u64,
    /// The logical state at the commit of each group generation: what an image whose
    /// generation word holds that generation must recover to.
    at_generation: HashMap<u64, LogicalState>,
    /// The generation durable at the last fence (every image must show it or the next one).
    durable: u64,
    report: JournalSweepReport,
    nested_every: u64,
    cross_every: u64,
    failure: Option<String>,
}

fn check_journal_crash_point(
    s: &mut JournalSweepState,
    point: &CrashPoint<'_>,
) -> Result<(), String> {
    s.report.crash_points += 1;
    let n = s.report.crash_points;
    let nested = s.nested_every > 0 && n % s.nested_every == 0;
    let cross = s.cross_every > 0 && n % s.cross_every == 0;
    let durable = image_generation(&point.image(CrashMode::DropAll))?;
    if durable < s.durable {
        return Err(format!("seed {}: the durable generation went back", s.seed));
    }
    s.durable = durable;
    for mode in crash_modes(s.seed, point.fence_seq) {
        let where_ = format!("seed {} fence {} {mode:?}", s.seed, point.fence_seq);
        let image = point.image(mode);
        let generation = image_generation(&image).map_err(|e| format!("{where_}: {e}"))?;
        if generation != durable && generation != durable + 1 {
            return Err(format!("{where_}: generation {generation} with {durable} durable"));
        }
        s.report.images_past_commit_point += u64::from(generation == durable + 1);
        let Some(expected) = s.at_generation.get(&generation) else {
            return Err(format!("{where_}: no group committed as generation {generation}"));
        };
        let got = if nested {
            recover_with_nested_crashes_as(
                image.clone(),
                Consistency::Journal,
                &mut s.report.nested_images,
            )
        } else {
            recover_image_as(image.clone(), Consistency::Journal)
        };
        let got = got.map_err(|e| format!("{where_}: recovery failed: {e}"))?;
        s.report.images += 1;
        if got != *expected {
            return Err(format!(
                "{where_}: the recovered state is not the state at the last group commit \
                 (generation {generation}): {}",
                got.diff(expected)
            ));
        }
        if cross {
            let as_undo = recover_image_as(image, Consistency::Undo)
                .map_err(|e| format!("{where_}: recovery in undo mode failed: {e}"))?;
            if as_undo != *expected {
                return Err(format!("{where_}: undo-mode recovery: {}", as_undo.diff(expected)));
            }
            s.report.images_recovered_as_undo += 1;
        }
    }
    Ok(())
}

/// The journal-mode crash-image sweep (docs/design.md section 12.6): runs `transactions`
/// transactions of the seeded workload on a simulated region in journal mode, with a group
/// commit after a seeded quarter of them (as fsync would ask) and the commits `begin` forces.
/// At every fence it takes four crash images; each must recover to exactly the state at the
/// group commit whose generation the image's generation word holds - the last group commit
/// that image reached - never to a state with part of a group, let alone part of an operation.
/// A shadow pool runs the same schedule without crashes and records the state at each of its
/// group commits. Every `nested_every`-th crash point is also crashed at every fence of its
/// recovery; every `cross_every`-th is also recovered in undo mode (the area format is
/// detected, the group rolled back, the area switched).
pub fn journal_crash_sweep(
    seed: u64,
    transactions: usize,
    nested_every: u64,
    cross_every: u64,
) -> Result<JournalSweepReport, String> {
    let params = journal_sweep_params();
    let primary = Arc::new(SimRegion::new(params.region_size));
    Pool::format(&*primary, params).map_err(|e| e.to_string())?;
    let shadow = Arc::new(SimRegion::from_image(primary.current()));
    let (pool, _) = Pool::open(primary.clone(), Consistency::Journal).map_err(|e| e.to_string())?;
    let (shadow_pool, _) =
        Pool::open(shadow.clone(), Consistency::Journal).map_err(|e| e.to_string())?;
    let generation = |p: &Pool| p.stats().journal.generation;
    let mut at_generation = HashMap::new();
    at_generation.insert(generation(&shadow_pool), LogicalState::of(&shadow_pool));
    let state = Arc::new(Mutex::new(JournalSweepState {
        seed,
        at_generation,
        durable: generation(&pool),
        nested_every,
        cross_every,
        ..JournalSweepState::default()
    }));
    let hook_state = Arc::clone(&state);
    primary.set_fence_hook(Some(Box::new(move |point| {
        let mut s = hook_state.lock().expect("sweep state");
        if s.failure.is_none()
            && let Err(e) = check_journal_crash_point(&mut s, point)
        {
            s.failure = Some(e);
        }
    })));
    let config = WorkloadConfig::default();
    let mut reference = Workload::new(seed, config);
    let mut workload = Workload::new(seed, config);
    let mut schedule = ChaCha8Rng::seed_from_u64(seed ^ 0x6a6f_7572_6e61_6c00);
    for _ in 0..transactions {
        // The shadow first: it records the state at every group commit before the primary
        // can reach that commit.
        let before = LogicalState::of(&shadow_pool);
        let generation_before = generation(&shadow_pool);
        let decision = reference.step(&shadow_pool);
        let after = LogicalState::of(&shadow_pool);
        reference
            .model()
            .check(&after)
            .map_err(|e| format!("seed {seed}: shadow vs model: {e}"))?;
        let record = |generation: u64, at: &LogicalState| {
            state.lock().expect("sweep state").at_generation.insert(generation, at.clone());
        };
        if generation(&shadow_pool) != generation_before {
            // `begin` committed the group before the transaction ran.
            record(generation(&shadow_pool), &before);
        }
        let commit_now = schedule.random_ratio(1, 4);
        if commit_now {
            shadow_pool.group_commit();
            record(generation(&shadow_pool), &after);
        }
        let prepared = workload.prepare(&pool);
        if prepared.decision != decision {
            return Err(format!("seed {seed}: the two workloads diverged"));
        }
        prepared.finish();
        if commit_now {
            pool.group_commit();
        }
        if let Some(failure) = state.lock().expect("sweep state").failure.take() {
            return Err(failure);
        }
        let now = LogicalState::of(&pool);
        if now != after {
            return Err(format!("seed {seed}: primary differs from shadow: {}", now.diff(&after)));
        }
    }
    primary.set_fence_hook(None);
    pool.check_invariants()?;
    let counters = pool.stats();
    if counters.region.trapped_writes != 0 {
        return Err(format!(
            "seed {seed}: {} stores refused as stray",
            counters.region.trapped_writes
        ));
    }
    let mut report = std::mem::take(&mut state.lock().expect("sweep state").report);
    report.transactions = workload.steps;
    report.committed = workload.committed();
    report.group_commits = counters.journal.group_commits;
    report.forced_commits = counters.journal.group_commits_forced;
    report.records = counters.journal.records;
    Ok(report)
}
