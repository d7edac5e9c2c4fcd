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
//! 3. every undo slot: header, tail, records verified, then rolled back (`undo::rollback`);
//! 4. every descriptor verified (after rollback, which may have restored some) and the free
//!    list rebuilt from them;
//! 5. state word stored: unclean, mount count + 1.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use nvram::layout::{FRAME_SIZE, ROOT_OFFSET, ROOT_SIZE};
use nvram::{Error, FormatParams, Layout, PersistMode, Region, RegionCounters, RegionState};

use crate::frames::{self, FrameId, FrameTag, FreeFrames};
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
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub committed: AtomicU64,
    pub aborted: AtomicU64,
    pub records: AtomicU64,
    pub record_bytes: AtomicU64,
    pub undo_bytes_max: AtomicU64,
}

/// See the module docs.
#[derive(Debug)]
pub struct Pool {
    pub(crate) region: Arc<dyn Region>,
    pub(crate) layout: Layout,
    pub(crate) consistency: Consistency,
    /// Free undo slots. Lock order: `slots` is never held while taking `frames`.
    pub(crate) slots: Mutex<Vec<u32>>,
    pub(crate) slot_released: Condvar,
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

    /// Opens and recovers a region; see the module docs for the order of checks.
    pub fn open(
        region: Arc<dyn Region>,
        consistency: Consistency,
    ) -> Result<(Pool, RecoveryReport), Error> {
        let layout = Layout::read(&*region)?;
        let state = RegionState::read(&*region)?;
        let mut report = RecoveryReport { was_clean: state.clean, ..RecoveryReport::default() };
        // Verify every slot before rolling back any: damage anywhere refuses the whole open
        // rather than leaving the region half recovered.
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
        let tags = frames::scan(&*region, &layout)?;
        let free = FreeFrames::from_scan(&tags);
        report.frames_total = free.total();
        report.frames_used = free.total() - free.free();
        let state = RegionState { clean: false, mount_count: state.mount_count.wrapping_add(1) };
        state.write(&*region);
        report.mount_count = state.mount_count;
        let slots = (0..layout.undo_slots).rev().collect();
        let pool = Pool {
            region,
            layout,
            consistency,
            slots: Mutex::new(slots),
            slot_released: Condvar::new(),
            frames: Mutex::new(free),
            counters: Counters::default(),
            poisoned: AtomicBool::new(false),
            state,
        };
        Ok((pool, report))
    }

    /// Marks the region cleanly shut down. Every transaction must have ended.
    pub fn close(self) {
        let in_use = self.layout.undo_slots as usize - self.slots.lock().expect("slots lock").len();
        assert!(in_use == 0, "close with {in_use} transactions still running");
        RegionState { clean: true, ..self.state }.write(&*self.region);
    }

    /// Starts a transaction (the thesis' `transaction_start()`). Blocks while every undo slot
    /// is taken by a running transaction.
    pub fn begin(&self) -> Tx<'_> {
        assert!(
            !self.poisoned.load(Ordering::Acquire),
            "pool poisoned by a panic inside a transaction; reopen the region to recover"
        );
        let mut slots = self.slots.lock().expect("slots lock");
        let slot = loop {
            if let Some(slot) = slots.pop() {
                break slot;
            }
            slots = self.slot_released.wait(slots).expect("slots lock");
        };
        drop(slots);
        Tx::new(self, slot)
    }

    pub(crate) fn release_slot(&self, slot: u32) {
        self.slots.lock().expect("slots lock").push(slot);
        self.slot_released.notify_one();
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
        let free_slots = self.slots.lock().expect("slots lock").len() as u32;
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
        }
    }

    /// Verifies the allocator invariants while no transaction runs: the free list is exactly
    /// the set of free descriptors, and every slot is empty. For tests and `check`.
    pub fn check_invariants(&self) -> Result<(), String> {
        let slots = self.slots.lock().expect("slots lock");
        if slots.len() != self.layout.undo_slots as usize {
            return Err("check_invariants while transactions run".into());
        }
        for slot in 0..self.layout.undo_slots {
            let used = undo::read_slot_used(&*self.region, &self.layout, slot)
                .map_err(|e| e.to_string())?;
            if used != 0 {
                return Err(format!("slot {slot} holds {used} bytes with no transaction running"));
            }
        }
        let tags = frames::scan(&*self.region, &self.layout).map_err(|e| e.to_string())?;
        let free = self.frames.lock().expect("frames lock");
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
    let undo_slot_used = (0..layout.undo_slots)
        .map(|slot| {
            undo::read_records(region, &layout, slot)?;
            undo::read_slot_used(region, &layout, slot)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let tags = frames::scan(region, &layout)?;
    let mut frames_by_kind = std::collections::BTreeMap::new();
    for tag in tags.iter().flatten() {
        *frames_by_kind.entry(tag.kind).or_insert(0) += 1;
    }
    let frames_used = tags.iter().filter(|t| t.is_some()).count() as u64;
    let root = region.read_vec(ROOT_OFFSET, ROOT_SIZE as usize);
    Ok(Inspection {
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
