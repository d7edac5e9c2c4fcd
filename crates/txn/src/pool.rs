//! The pool: an open region with its undo slots and frame allocator. Opening a pool *is*
//! recovery: every unfinished transaction is rolled back before anything else reads the region.
//!
//! Mount states (the state word): `format` writes clean; `open` rolls back, verifies, then
//! stores unclean with the mount count incremented; `close` stores clean. A pool dropped without
//! `close` (or a killed process) leaves it unclean. Recovery never trusts the clean bit: it
//! always scans every slot, so a damaged or stale bit cannot skip a rollback.
//!
//! Open order (each step relies on the previous):
//! 1. superblock: magic, checksum, version, geometry (`Layout::read`);
//! 2. state word self-check;
//! 3. the undo area, by the format recorded in it (not by the mode asked for, which may differ
//!    after a crash): undo slots - every slot's header, tail and records verified, then rolled
//!    back (`undo::rollback`); group log - the running group's entries verified, then rolled
//!    back (`journal::rollback_group`);
//! 4. the area switched to the format of the mode asked for, if it differs (one atomic store of
//!    the format word, after everything the new format needs is durable);
//! 5. every descriptor verified (after rollback, which may have restored some) and the free
//!    list rebuilt from them;
//! 6. state word stored: unclean, mount count + 1;
//! 7. journal mode: a new running group; every page write-protected.
//!
//! Consistency modes and their contracts (docs/design.md section 12.1):
//! - **undo** (default): `Tx::commit` returns when the operation is atomic and durable.
//! - **journal**: `Tx::commit` makes the operation atomic at once (a crash keeps all of it or
//!   none) and durable at the next group commit ([`Pool::group_commit`], which the engine calls
//!   on fsync and friends, and when [`Pool::group_due`] says the interval or size is reached).
//! - **none**: no log; a crash may leave an operation half done.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::ThreadId;

use nvram::layout::{FRAME_SIZE, ROOT_OFFSET, ROOT_SIZE};
use nvram::{Error, FormatParams, Layout, PersistMode, Region, RegionCounters, RegionState};

use crate::frames::{self, FrameId, FrameTag, FreeFrames};
use crate::group::{GroupCommit, Journal, JournalStats, OpenOptions};
use crate::journal::{self, AreaFormat};
use crate::tx::Tx;
use crate::undo;

/// How operations are made crash-consistent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Consistency {
    /// Per-operation undo log (the thesis' lightweight transactions): every committed
    /// transaction is atomic and durable.
    #[default]
    Undo,
    /// No undo log: stores go straight to the region (the ext2-like baseline). A crash in the
    /// middle of an operation may leave it half done; abort cannot restore bytes.
    None,
    /// VM-aware journaling: operations join a running group that commits as a whole
    /// ([`Pool::group_commit`]); every operation is atomic at once and durable at the next group
    /// commit. Committed pages are write-protected between group commits.
    Journal,
}

/// What recovery found and did at open.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct RecoveryReport {
    pub was_clean: bool,
    pub mount_count: u32,
    pub transactions_rolled_back: u32,
    pub records_undone: u64,
    pub bytes_restored: u64,
    pub frames_total: u64,
    pub frames_used: u64,
    /// What the undo area held: the mode the region was last written in.
    pub area_format: Option<AreaFormat>,
    /// Pages a journal-mode group rollback restored (the group counts as one transaction in
    /// `transactions_rolled_back`).
    pub group_pages_restored: u64,
    /// The area was switched to the other format for the mode asked for.
    pub area_converted: bool,
}

/// Counters since open.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct PoolStats {
    pub transactions_committed: u64,
    pub transactions_aborted: u64,
    pub snapshot_records: u64,
    pub snapshot_bytes: u64,
    /// The largest undo log a transaction used, in bytes of records (thesis Table 4.3).
    pub undo_bytes_max: u64,
    pub undo_slots: u32,
    pub undo_slots_in_use: u32,
    pub undo_slot_capacity: u64,
    pub frames_total: u64,
    pub frames_free: u64,
    pub persist_mode: Option<PersistMode>,
    pub region: RegionCounters,
    pub consistency: Consistency,
    /// Journal mode's counters (zero in the other modes).
    pub journal: JournalStats,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub committed: AtomicU64,
    pub aborted: AtomicU64,
    pub records: AtomicU64,
    pub record_bytes: AtomicU64,
    pub undo_bytes_max: AtomicU64,
}

/// The undo slots: a running transaction holds one (in journal mode only as a token of the
/// concurrency limit and of "running": a group commit waits until all are free).
#[derive(Debug)]
pub(crate) struct Slots {
    pub(crate) free: Vec<u32>,
    /// The thread running a transaction in each slot (a group commit from one of them would
    /// wait for itself: refused with a panic).
    owners: Vec<Option<ThreadId>>,
    /// A group commit waits for the running transactions to end; `begin` waits for it.
    commit_pending: bool,
    /// Threads waiting on `slot_released` (changed only under this lock, around each wait):
    /// a notify is skipped when it is 0, since std's `Condvar::notify_all` is a system call even
    /// with nobody waiting (one per transaction and per group commit otherwise).
    waiters: u32,
}

/// See the module docs.
#[derive(Debug)]
pub struct Pool {
    pub(crate) region: Arc<dyn Region>,
    pub(crate) layout: Layout,
    pub(crate) consistency: Consistency,
    /// The undo slots. Lock order: `slots`, then the journal's group state, then `frames`.
    pub(crate) slots: Mutex<Slots>,
    pub(crate) slot_released: Condvar,
    /// Journal mode's running group (`None` in the other modes).
    pub(crate) journal: Option<Journal>,
    /// The volatile free list (rebuilt at open).
    pub(crate) frames: Mutex<FreeFrames>,
    pub(crate) counters: Counters,
    /// Set when a transaction was dropped during a panic: its slot was not rolled back, so no
    /// new transaction may start until the region is reopened (and recovered).
    pub(crate) poisoned: AtomicBool,
    state: RegionState,
}

impl Pool {
    /// Writes a new, empty region: slot headers, free descriptors, zero root, then the superblock
    /// and state word last (a crash during format leaves an unformatted region, never a half
    /// formatted one that looks valid).
    pub fn format(region: &dyn Region, params: FormatParams) -> Result<Layout, Error> {
        if region.len() != params.region_size {
            return Err(Error::BadParameter(format!(
                "region is {} bytes but format was asked for {}",
                region.len(),
                params.region_size
            )));
        }
        let layout = Layout::compute(params)?;
        // Invalidate an old superblock first, so that nothing below can be mistaken for it.
        region.write(0, &[0u8; 8]);
        region.persist(0, 8);
        undo::format_slots(region, &layout);
        region.write(ROOT_OFFSET, &[0u8; ROOT_SIZE as usize]);
        let zeros = vec![0u8; 1 << 16];
        let mut off = layout.desc_offset;
        while off < layout.frames_offset {
            let n = (layout.frames_offset - off).min(zeros.len() as u64);
            region.write(off, &zeros[..n as usize]);
            off += n;
        }
        region.persist(ROOT_OFFSET, layout.frames_offset - ROOT_OFFSET);
        layout.write_new(region);
        Ok(layout)
    }

    /// Opens and recovers a region with default options; see the module docs for the order
    /// of checks.
    pub fn open(
        region: Arc<dyn Region>,
        consistency: Consistency,
    ) -> Result<(Pool, RecoveryReport), Error> {
        Pool::open_with(region, consistency, OpenOptions::default())
    }

    /// Opens and recovers a region; `options` tune journal mode.
    pub fn open_with(
        region: Arc<dyn Region>,
        consistency: Consistency,
        options: OpenOptions,
    ) -> Result<(Pool, RecoveryReport), Error> {
        let layout = Layout::read(&*region)?;
        let state = RegionState::read(&*region)?;
        if consistency == Consistency::Journal {
            Journal::check_geometry(&layout)?;
        }
        let mut report = RecoveryReport { was_clean: state.clean, ..RecoveryReport::default() };
        let format = journal::read_format(&*region, &layout)?;
        report.area_format = Some(format);
        match format {
            AreaFormat::UndoSlots => {
                // Verify every slot before rolling back any: damage anywhere refuses the whole
                // open rather than leaving the region half recovered.
                for slot in 0..layout.undo_slots {
                    undo::read_records(&*region, &layout, slot)?;
                }
                for slot in 0..layout.undo_slots {
                    let done = undo::rollback(&*region, &layout, slot)?;
                    if done.records > 0 {
                        report.transactions_rolled_back += 1;
                        report.records_undone += done.records;
                        report.bytes_restored += done.bytes_restored;
                    }
                }
            }
            AreaFormat::GroupLog => {
                let done = journal::rollback_group(&*region, &layout)?;
                if done.pages_restored > 0 {
                    report.transactions_rolled_back = 1;
                    report.records_undone = done.pages_restored;
                    report.bytes_restored = done.pages_restored * FRAME_SIZE;
                    report.group_pages_restored = done.pages_restored;
                }
            }
        }
        match (format, consistency) {
            (AreaFormat::UndoSlots, Consistency::Journal) => {
                journal::convert_to_group_log(&*region, &layout)?;
                report.area_converted = true;
            }
            (AreaFormat::GroupLog, Consistency::Undo | Consistency::None) => {
                journal::convert_to_undo_slots(&*region, &layout)?;
                report.area_converted = true;
            }
            _ => {}
        }
        let tags = frames::scan(&*region, &layout)?;
        let free = FreeFrames::from_scan(&tags);
        report.frames_total = free.total();
        report.frames_used = free.total() - free.free();
        let state = RegionState { clean: false, mount_count: state.mount_count.wrapping_add(1) };
        state.write(&*region);
        report.mount_count = state.mount_count;
        let journal = match consistency {
            Consistency::Journal => Some(Journal::start(&*region, &layout, options)?),
            Consistency::Undo | Consistency::None => None,
        };
        let slots = Slots {
            free: (0..layout.undo_slots).rev().collect(),
            owners: vec![None; layout.undo_slots as usize],
            commit_pending: false,
            waiters: 0,
        };
        let pool = Pool {
            region,
            layout,
            consistency,
            slots: Mutex::new(slots),
            slot_released: Condvar::new(),
            journal,
            frames: Mutex::new(free),
            counters: Counters::default(),
            poisoned: AtomicBool::new(false),
            state,
        };
        Ok((pool, report))
    }

    /// Marks the region cleanly shut down. Every transaction must have ended. In journal mode
    /// the running group is committed first.
    pub fn close(self) {
        let in_use =
            self.layout.undo_slots as usize - self.slots.lock().expect("slots lock").free.len();
        assert!(in_use == 0, "close with {in_use} transactions still running");
        if let Some(journal) = &self.journal {
            let _ = self.group_commit();
            journal.unprotect_all(&*self.region);
        }
        RegionState { clean: true, ..self.state }.write(&*self.region);
    }

    /// Starts a transaction (the thesis' `transaction_start()`). Blocks while every undo slot
    /// is taken by a running transaction, and while a group commit runs. In journal mode, when
    /// the group log lacks a transaction's credit or the group reached its size limit, it
    /// commits the running group first (waiting for the running transactions to end): call it
    /// holding no lock a running transaction may wait for (the engine's rank order guarantees
    /// this: `UndoSlot` ranks above every lock held when a transaction begins).
    pub fn begin(&self) -> Tx<'_> {
        assert!(
            !self.poisoned.load(Ordering::Acquire),
            "pool poisoned by a panic inside a transaction; reopen the region to recover"
        );
        let mut slots = self.slots.lock().expect("slots lock");
        let slot = loop {
            if slots.commit_pending || slots.free.is_empty() {
                slots = self.wait_released(slots);
                continue;
            }
            if let Some(journal) = &self.journal
                && !journal.try_reserve()
            {
                let me = std::thread::current().id();
                assert!(
                    !slots.owners.contains(&Some(me)),
                    "begin from a thread with a running transaction needs a group commit, which \
                     would wait for itself"
                );
                slots = self.commit_group_locked(slots, true).0;
                continue;
            }
            let slot = slots.free.pop().expect("a free slot");
            slots.owners[slot as usize] = Some(std::thread::current().id());
            break slot;
        };
        drop(slots);
        Tx::new(self, slot)
    }

    /// Frames a transaction allocated go back to the free list (it rolled back, or failed
    /// before writing the descriptor); journal mode holds those its group freed (F4).
    pub(crate) fn return_frames(&self, frames: &[u64]) {
        match &self.journal {
            Some(journal) => journal.return_frames(frames, &self.frames),
            None => self.frames.lock().expect("frames lock").push_all(frames),
        }
    }

    pub(crate) fn release_slot(&self, slot: u32) {
        let mut slots = self.slots.lock().expect("slots lock");
        slots.owners[slot as usize] = None;
        slots.free.push(slot);
        // Read under the lock: a thread that starts waiting later sees the free slot first.
        let wake = slots.waiters > 0;
        drop(slots);
        // Both `begin` and a waiting group commit wait on this condition.
        if wake {
            self.slot_released.notify_all();
        }
    }

    /// Waits on `slot_released`, counted in `waiters` so that notifiers can skip the call
    /// when nobody waits.
    fn wait_released<'a>(&self, mut slots: MutexGuard<'a, Slots>) -> MutexGuard<'a, Slots> {
        slots.waiters += 1;
        let mut slots = self.slot_released.wait(slots).expect("slots lock");
        slots.waiters -= 1;
        slots
    }

    /// Journal mode: makes every committed operation durable (protocol step 2 of
    /// `journal.rs`). Waits until no transaction runs (new ones wait meanwhile), so that the
    /// group never holds part of an operation. Call it on fsync, fdatasync, O_SYNC writes,
    /// syncfs, and when [`Pool::group_due`] says so; never from a thread with a running
    /// transaction (it would wait for itself: a panic). A no-op in the other modes.
    pub fn group_commit(&self) -> GroupCommit {
        if self.journal.is_none() {
            return GroupCommit::default();
        }
        let slots = self.slots.lock().expect("slots lock");
        let me = std::thread::current().id();
        assert!(
            !slots.owners.contains(&Some(me)),
            "group_commit from a thread with a running transaction: it would wait for itself"
        );
        self.commit_group_locked(slots, false).1
    }

    /// Waits for every slot to be free (others wait for `commit_pending`), commits the group
    /// with the slots lock held, and hands the lock back.
    fn commit_group_locked<'a>(
        &'a self,
        mut slots: MutexGuard<'a, Slots>,
        forced: bool,
    ) -> (MutexGuard<'a, Slots>, GroupCommit) {
        let journal = self.journal.as_ref().expect("journal mode");
        while slots.commit_pending {
            slots = self.wait_released(slots);
        }
        slots.commit_pending = true;
        while slots.free.len() < self.layout.undo_slots as usize {
            slots = self.wait_released(slots);
        }
        assert!(
            !self.poisoned.load(Ordering::Acquire),
            "group commit of a pool poisoned by a panic inside a transaction: the group may hold \
             part of an operation; reopen the region to recover"
        );
        let done = journal.commit_group(&*self.region, &self.layout, &self.frames, forced);
        slots.commit_pending = false;
        if slots.waiters > 0 {
            self.slot_released.notify_all();
        }
        (slots, done)
    }

    /// Journal mode: true when the running group should be committed now - it is older than
    /// the interval (default 5 s; measured from the first call that saw it non-empty, so call
    /// this at least once a second for the bound to hold within a second), it changed
    /// `group_bytes_max` bytes (default 32 MiB), or three quarters of the group log are in use.
    /// Time enters as an argument (any monotonic clock in nanoseconds). False in the other
    /// modes.
    pub fn group_due(&self, now_ns: u64) -> bool {
        self.journal.as_ref().is_some_and(|j| j.due(now_ns))
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    pub fn consistency(&self) -> Consistency {
        self.consistency
    }

    pub fn region(&self) -> &dyn Region {
        &*self.region
    }

    /// Reads region bytes (any area; the caller's locks keep them stable).
    pub fn read(&self, off: u64, buf: &mut [u8]) {
        self.region.read(off, buf);
    }

    pub fn read_vec(&self, off: u64, len: usize) -> Vec<u8> {
        self.region.read_vec(off, len)
    }

    /// The root area: the layers above anchor their persistent structures here.
    pub fn root_range(&self) -> (u64, u64) {
        (ROOT_OFFSET, ROOT_SIZE)
    }

    pub fn frame_offset(&self, frame: FrameId) -> u64 {
        self.layout.frame_offset(frame.0)
    }

    pub fn frame_size(&self) -> u64 {
        FRAME_SIZE
    }

    /// Every allocated frame with its tag, in frame order: what the layers above rebuild their
    /// volatile indexes from at open.
    pub fn allocated_frames(&self) -> Result<Vec<(FrameId, FrameTag)>, Error> {
        Ok(frames::scan(&*self.region, &self.layout)?
            .into_iter()
            .enumerate()
            .filter_map(|(i, tag)| tag.map(|t| (FrameId(i as u64), t)))
            .collect())
    }

    pub fn stats(&self) -> PoolStats {
        let free_slots = self.slots.lock().expect("slots lock").free.len() as u32;
        // The group's lock before the frames' (the lock order).
        let journal = self.journal.as_ref().map(|j| j.stats(&*self.region)).unwrap_or_default();
        let frames = self.frames.lock().expect("frames lock");
        PoolStats {
            transactions_committed: self.counters.committed.load(Ordering::Relaxed),
            transactions_aborted: self.counters.aborted.load(Ordering::Relaxed),
            snapshot_records: self.counters.records.load(Ordering::Relaxed),
            snapshot_bytes: self.counters.record_bytes.load(Ordering::Relaxed),
            undo_bytes_max: self.counters.undo_bytes_max.load(Ordering::Relaxed),
            undo_slots: self.layout.undo_slots,
            undo_slots_in_use: self.layout.undo_slots - free_slots,
            undo_slot_capacity: undo::slot_capacity(&self.layout),
            frames_total: frames.total(),
            frames_free: frames.free(),
            persist_mode: Some(self.region.mode()),
            region: self.region.counters(),
            consistency: self.consistency,
            journal,
        }
    }

    /// Verifies the allocator invariants while no transaction runs: the free list is exactly
    /// the set of free descriptors, and every slot is empty (journal mode: the group log holds
    /// exactly the running group's copies, and exactly its pages are writable). For tests and
    /// `check`.
    pub fn check_invariants(&self) -> Result<(), String> {
        let slots = self.slots.lock().expect("slots lock");
        if slots.free.len() != self.layout.undo_slots as usize {
            return Err("check_invariants while transactions run".into());
        }
        let format =
            journal::read_format(&*self.region, &self.layout).map_err(|e| e.to_string())?;
        if (format == AreaFormat::GroupLog) != self.journal.is_some() {
            return Err(format!(
                "the undo area is in {format:?} format in {:?} mode",
                self.consistency
            ));
        }
        if let Some(journal) = &self.journal {
            journal.check(&*self.region, &self.layout)?;
        }
        let slots_in_use = if self.journal.is_some() { 1 } else { self.layout.undo_slots };
        for slot in 0..slots_in_use {
            let used = undo::read_slot_used(&*self.region, &self.layout, slot)
                .map_err(|e| e.to_string())?;
            if used != 0 {
                return Err(format!("slot {slot} holds {used} bytes with no transaction running"));
            }
        }
        let tags = frames::scan(&*self.region, &self.layout).map_err(|e| e.to_string())?;
        // The group's lock before the frames' (the lock order).
        let freed = self.journal.as_ref().map(Journal::freed).unwrap_or_default();
        let free = self.frames.lock().expect("frames lock");
        // F4: the held frames are exactly the free frames the running group freed.
        let held: BTreeSet<u64> = free.held().collect();
        let want: BTreeSet<u64> = freed.into_iter().filter(|&f| free.contains(f)).collect();
        if held != want {
            return Err(format!(
                "free frames held {held:?}, but the free frames the running group freed are \
                 {want:?} (F4)"
            ));
        }
        for (i, tag) in tags.iter().enumerate() {
            if tag.is_none() != free.contains(i as u64) {
                return Err(format!(
                    "frame {i}: descriptor says {} but the free list {}",
                    if tag.is_none() { "free" } else { "allocated" },
                    if free.contains(i as u64) { "has it" } else { "does not" }
                ));
            }
        }
        Ok(())
    }
}

/// A read-only description of a region, made without recovering it (`nvstack inspect`).
#[derive(Clone, Debug, serde::Serialize)]
pub struct Inspection {
    pub layout: Layout,
    pub state: RegionState,
    /// What the undo area holds (the mode the region was last written in).
    pub area_format: AreaFormat,
    /// Group-log format: generation of the running group, its live page copies (to be rolled
    /// back at the next open), and the log's capacity in pages.
    pub journal_generation: u64,
    pub journal_live_entries: u64,
    pub journal_capacity: u64,
    /// Bytes of undo records per slot (non-zero = a transaction to roll back).
    pub undo_slot_used: Vec<u64>,
    pub undo_slots_in_use: u32,
    pub frames_total: u64,
    pub frames_used: u64,
    pub frames_free: u64,
    /// Frames in use by kind (descriptor `kind` field).
    pub frames_by_kind: std::collections::BTreeMap<u32, u64>,
    pub root_area_bytes_used: u64,
}

/// Reads a region's headers without changing it. Errors name the damaged area.
pub fn inspect(region: &dyn Region) -> Result<Inspection, Error> {
    let layout = Layout::read(region)?;
    let state = RegionState::read(region)?;
    let area_format = journal::read_format(region, &layout)?;
    let (undo_slot_used, journal_live_entries) = match area_format {
        AreaFormat::UndoSlots => {
            let used = (0..layout.undo_slots)
                .map(|slot| {
                    undo::read_records(region, &layout, slot)?;
                    undo::read_slot_used(region, &layout, slot)
                })
                .collect::<Result<Vec<_>, _>>()?;
            (used, 0)
        }
        // The log overwrites the headers of slots 1..: only slot 0's is a slot header.
        AreaFormat::GroupLog => (
            vec![0; layout.undo_slots as usize],
            journal::read_group(region, &layout)?.len() as u64,
        ),
    };
    let tags = frames::scan(region, &layout)?;
    let mut frames_by_kind = std::collections::BTreeMap::new();
    for tag in tags.iter().flatten() {
        *frames_by_kind.entry(tag.kind).or_insert(0) += 1;
    }
    let frames_used = tags.iter().filter(|t| t.is_some()).count() as u64;
    let root = region.read_vec(ROOT_OFFSET, ROOT_SIZE as usize);
    Ok(Inspection {
        area_format,
        journal_generation: journal::read_generation(region, &layout)?,
        journal_live_entries,
        journal_capacity: journal::LogGeometry::of(&layout).capacity,
        undo_slots_in_use: undo_slot_used.iter().filter(|&&u| u > 0).count() as u32,
        undo_slot_used,
        frames_total: layout.nr_frames,
        frames_used,
        frames_free: layout.nr_frames - frames_used,
        frames_by_kind,
        root_area_bytes_used: root.iter().rposition(|&b| b != 0).map_or(0, |p| p as u64 + 1),
        layout,
        state,
    })
}

impl Drop for Pool {
    /// Protection is volatile and belongs to this pool: a region object used after the pool
    /// (a test reopening it) starts writable.
    fn drop(&mut self) {
        if let Some(journal) = &self.journal {
            journal.unprotect_all(&*self.region);
        }
    }
}
