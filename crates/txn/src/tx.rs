//! A transaction: the three-call API of the thesis (`transaction_start()` = [`Pool::begin`],
//! `duplicate()` = [`Tx::snapshot`], `transaction_stop()` = [`Tx::commit`]) plus stores,
//! frame allocation and abort.
//!
//! Stages and their transitions:
//!
//! ```text
//!   Pool::begin ──> Running ──commit()──> Committed   (tail := 0 persisted: the commit point)
//!                      │
//!                      └──abort() / drop──> Aborted   (records written back, tail := 0)
//! ```
//!
//! Rules, each enforced by a panic because breaking one is a bug, not an operating error:
//! - R1 a store ([`Tx::write`]) must fall inside ranges this transaction snapshotted or frames it
//!   allocated (snapshot before modify: "duplicate() right before the modification");
//! - R2 no store to, or snapshot of, a frame this transaction freed;
//! - R3 every call needs the Running stage (commit and abort consume the transaction, so this
//!   can only fail through internal misuse);
//! - R4 stores stay inside the data areas (root, descriptors, frames).
//!
//! Concurrency: a transaction owns one undo slot. The layers above hold the locks of every
//! object a transaction touches until it ends (strict two-phase locking), so two running
//! transactions never snapshot the same bytes; this is what makes recovery order across slots
//! irrelevant. Dropping a running transaction aborts it; dropping it during a panic leaves its
//! slot for recovery and poisons the pool.
//!
//! Journal mode (`group.rs`): the same calls, other persistence. `snapshot` keeps the old bytes
//! in DRAM (for `abort`) and covers the pages they lie in for the running group: a page's first
//! change in a group copies it into the group log (one fence per snapshot that needs copies,
//! none otherwise); `alloc_frame` covers its frame; `commit` only hands the changes to the
//! group (no fence: durable at the next group commit); `abort` writes the DRAM copies back.

use std::sync::atomic::Ordering;

use nvram::layout::{DESCRIPTOR_SIZE, FRAME_SIZE};

use crate::frames::{self, FrameId, FrameTag};
use crate::group;
use crate::pool::{Consistency, Pool};
use crate::ranges::RangeSet;
use crate::undo::{self, SLOT_HEADER_SIZE, TAIL_OFFSET};

/// See the module docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    Running,
    Committed,
    Aborted,
}

/// Operating errors of a running transaction. The transaction is unchanged by a failed call
/// and may go on (e.g. after freeing something) or be aborted.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TxError {
    #[error(
        "undo log slot full: {needed} more bytes of undo records needed, {free} of {capacity} left \
         (format the region with a larger --undo-slot-size)"
    )]
    UndoFull { needed: u64, free: u64, capacity: u64 },
    #[error("NVRAM full: every frame is in use")]
    NoFrames,
}

/// See the module docs.
#[derive(Debug)]
pub struct Tx<'p> {
    pool: &'p Pool,
    slot: u32,
    /// Region offset of the slot.
    slot_off: u64,
    /// Bytes of records appended (mirror of the persisted tail).
    used: u64,
    records: u64,
    stage: Stage,
    /// Bytes this transaction may store to: snapshotted ranges and fresh frames (R1).
    writable: RangeSet,
    /// Bytes stored to, persisted at commit.
    written: RangeSet,
    /// Frames allocated by this transaction (F3); returned to the free list on abort.
    fresh: Vec<u64>,
    /// Frames freed by this transaction (F2); returned to the free list on commit.
    freed: Vec<u64>,
    /// Journal mode: the old bytes of every snapshotted range, oldest first (for `abort`).
    dram_undo: Vec<(u64, Vec<u8>)>,
    /// Journal mode: group log pages this transaction may still use (its credit, J7).
    credit_left: u64,
}

impl<'p> Tx<'p> {
    pub(crate) fn new(pool: &'p Pool, slot: u32) -> Tx<'p> {
        Tx {
            pool,
            slot,
            slot_off: pool.layout.slot_offset(slot),
            used: 0,
            records: 0,
            stage: Stage::Running,
            writable: RangeSet::new(),
            written: RangeSet::new(),
            fresh: Vec::new(),
            freed: Vec::new(),
            dram_undo: Vec::new(),
            credit_left: pool.journal.as_ref().map_or(0, |j| j.credit),
        }
    }

    pub fn stage(&self) -> Stage {
        self.stage
    }

    /// Bytes of undo records this transaction has appended so far (journal mode: bytes of its
    /// DRAM undo).
    pub fn undo_bytes(&self) -> u64 {
        self.used
    }

    pub fn pool(&self) -> &'p Pool {
        self.pool
    }

    fn assert_running(&self) {
        assert!(self.stage == Stage::Running, "transaction used in stage {:?} (R3)", self.stage);
    }

    fn assert_data_range(&self, off: u64, len: u64) {
        assert!(
            undo::is_data_range(&self.pool.layout, off, len),
            "transaction access [{off}, +{len}) outside the root, descriptor and frame areas (R4)"
        );
    }

    fn assert_not_freed(&self, off: u64, len: u64) {
        for &frame in &self.freed {
            let start = self.pool.layout.frame_offset(frame);
            assert!(
                off + len <= start || off >= start + FRAME_SIZE,
                "access [{off}, +{len}) to frame {frame} freed by this transaction (R2)"
            );
        }
    }

    /// Copies the current bytes of `[off, off + len)` into the undo log and persists them, so
    /// that the range may then be changed (the thesis' `duplicate()`). Bytes already snapshotted
    /// by this transaction, and fresh frames, are not logged again.
    pub fn snapshot(&mut self, off: u64, len: u64) -> Result<(), TxError> {
        self.assert_running();
        self.assert_data_range(off, len);
        self.assert_not_freed(off, len);
        if self.pool.consistency == Consistency::None {
            self.writable.insert(off, off + len);
            return Ok(());
        }
        let gaps = self.writable.gaps(off, off + len);
        if gaps.is_empty() {
            return Ok(());
        }
        if let Some(journal) = &self.pool.journal {
            // The pages first (the only step that can fail), then the DRAM undo.
            journal.cover(&*self.pool.region, &group::pages_of(&gaps), &mut self.credit_left)?;
            let mut bytes = 0;
            for &(s, e) in &gaps {
                self.dram_undo.push((s, self.pool.region.read_vec(s, (e - s) as usize)));
                bytes += e - s;
            }
            self.used += bytes;
            self.records += gaps.len() as u64;
            self.writable.insert(off, off + len);
            let counters = &self.pool.counters;
            counters.records.fetch_add(gaps.len() as u64, Ordering::Relaxed);
            counters.record_bytes.fetch_add(bytes, Ordering::Relaxed);
            return Ok(());
        }
        let needed: u64 = gaps.iter().map(|(s, e)| undo::record_size(e - s)).sum();
        let capacity = undo::slot_capacity(&self.pool.layout);
        if self.used + needed > capacity {
            return Err(TxError::UndoFull { needed, free: capacity - self.used, capacity });
        }
        let region = &*self.pool.region;
        let start = self.slot_off + SLOT_HEADER_SIZE + self.used;
        let mut pos = start;
        for &(s, e) in &gaps {
            let old = region.read_vec(s, (e - s) as usize);
            let record = undo::encode_record(s, self.records, &old);
            region.write(pos, &record);
            pos += record.len() as u64;
            self.records += 1;
        }
        debug_assert_eq!(pos - start, needed);
        // The records must be durable before the tail covers them, and the tail before any
        // snapshotted byte changes (invariant U1).
        region.persist(start, needed);
        self.used += needed;
        region.store_u64(self.slot_off + TAIL_OFFSET, undo::encode_tail(self.used));
        region.persist(self.slot_off + TAIL_OFFSET, 8);
        self.writable.insert(off, off + len);
        let counters = &self.pool.counters;
        counters.records.fetch_add(gaps.len() as u64, Ordering::Relaxed);
        counters.record_bytes.fetch_add(needed, Ordering::Relaxed);
        Ok(())
    }

    /// Stores `data` at `off`. The range must have been snapshotted or lie in a frame allocated
    /// by this transaction (R1). Durable at commit.
    pub fn write(&mut self, off: u64, data: &[u8]) {
        self.assert_running();
        let len = data.len() as u64;
        if len == 0 {
            return;
        }
        self.assert_data_range(off, len);
        self.assert_not_freed(off, len);
        if self.pool.consistency != Consistency::None {
            assert!(
                self.writable.covers(off, off + len),
                "store to [{off}, +{len}) that this transaction neither snapshotted nor allocated \
                 (R1: snapshot before modify)"
            );
        }
        match &self.pool.journal {
            // The group's pages stay write-protected (J9): through the region's writer, counted.
            Some(journal) => {
                journal.count_retained(off, len);
                self.pool.region.write_retained(off, data);
            }
            None => self.pool.region.write(off, data),
        }
        self.written.insert(off, off + len);
    }

    /// `snapshot` then `write`: the usual way to change bytes.
    pub fn update(&mut self, off: u64, data: &[u8]) -> Result<(), TxError> {
        self.snapshot(off, data.len() as u64)?;
        self.write(off, data);
        Ok(())
    }

    /// Allocates a frame tagged `tag`. Its contents are undefined until written; it needs no
    /// snapshot (F3).
    pub fn alloc_frame(&mut self, tag: FrameTag) -> Result<FrameId, TxError> {
        self.assert_running();
        let pool = self.pool;
        let frame = match &pool.journal {
            Some(journal) => {
                journal.alloc(&*pool.region, &pool.layout, &pool.frames, &mut self.credit_left)?
            }
            None => pool.frames.lock().expect("frames lock").pop().ok_or(TxError::NoFrames)?,
        };
        let desc = self.pool.layout.descriptor_offset(frame);
        if let Err(e) = self.snapshot(desc, DESCRIPTOR_SIZE) {
            pool.return_frames(&[frame]);
            return Err(e);
        }
        self.write(desc, &frames::encode_allocated(tag));
        self.fresh.push(frame);
        let data = self.pool.layout.frame_offset(frame);
        self.writable.insert(data, data + FRAME_SIZE);
        Ok(FrameId(frame))
    }

    /// Frees `frame`; it keeps its contents and is not reused before commit (F2).
    pub fn free_frame(&mut self, frame: FrameId) -> Result<(), TxError> {
        self.assert_running();
        let desc = self.pool.layout.descriptor_offset(frame.0);
        assert!(!self.freed.contains(&frame.0), "frame {} freed twice in one transaction", frame.0);
        let current = self.pool.region.read_vec(desc, DESCRIPTOR_SIZE as usize);
        assert!(
            matches!(frames::decode(frame.0, &current), Ok(Some(_))),
            "free of frame {} which is not allocated",
            frame.0
        );
        self.snapshot(desc, DESCRIPTOR_SIZE)?;
        self.write(desc, &frames::FREE_DESCRIPTOR);
        self.freed.push(frame.0);
        Ok(())
    }

    /// Ends the transaction: persists every change, then clears the undo log (the commit
    /// point). After it returns the transaction's effects survive any crash.
    pub fn commit(mut self) {
        self.assert_running();
        if let Some(journal) = &self.pool.journal {
            // Atomic now, durable at the next group commit. The group learns of the freed
            // frames before they can be handed out again (J6).
            journal.commit_tx(&self.written, &self.freed, self.credit_left, &self.pool.frames);
            self.pool.counters.undo_bytes_max.fetch_max(self.used, Ordering::Relaxed);
            self.pool.counters.committed.fetch_add(1, Ordering::Relaxed);
            self.stage = Stage::Committed;
            self.pool.release_slot(self.slot);
            return;
        }
        let region = &*self.pool.region;
        for (s, e) in self.written.iter() {
            region.flush(s, e - s);
        }
        if !self.written.is_empty() {
            region.fence();
        }
        if self.used > 0 {
            // THE COMMIT POINT: once this store is durable, recovery no longer undoes us.
            region.store_u64(self.slot_off + TAIL_OFFSET, undo::encode_tail(0));
            region.persist(self.slot_off + TAIL_OFFSET, 8);
        }
        self.pool.counters.undo_bytes_max.fetch_max(self.used, Ordering::Relaxed);
        self.pool.frames.lock().expect("frames lock").push_all(&self.freed);
        self.pool.counters.committed.fetch_add(1, Ordering::Relaxed);
        self.stage = Stage::Committed;
        self.pool.release_slot(self.slot);
    }

    /// Ends the transaction by undoing everything it did.
    pub fn abort(mut self) {
        self.rollback();
    }

    fn rollback(&mut self) {
        self.assert_running();
        let pool = self.pool;
        match pool.consistency {
            Consistency::Undo => {
                // The same code as recovery: rollback reads the records back from the region.
                undo::rollback(&*pool.region, &pool.layout, self.slot)
                    .expect("own undo records unreadable: NVRAM damaged while running");
                pool.return_frames(&self.fresh);
            }
            Consistency::Journal => {
                // Newest first, like undo rollback (no byte is ever saved twice anyway). Through
                // the region's writer: the pages stay write-protected (J9).
                for (off, old) in self.dram_undo.iter().rev() {
                    pool.region.write_retained(*off, old);
                }
                let journal = pool.journal.as_ref().expect("journal mode");
                journal.abort_tx(&self.written, self.credit_left);
                pool.return_frames(&self.fresh);
            }
            Consistency::None => {
                // Nothing to restore bytes from; at least release what this transaction took.
                let region = &*pool.region;
                for &frame in &self.fresh {
                    if !self.freed.contains(&frame) {
                        let desc = pool.layout.descriptor_offset(frame);
                        region.write(desc, &frames::FREE_DESCRIPTOR);
                        region.persist(desc, DESCRIPTOR_SIZE);
                    }
                }
                let mut returned = self.fresh.clone();
                returned.extend(self.freed.iter().filter(|f| !self.fresh.contains(f)));
                pool.frames.lock().expect("frames lock").push_all(&returned);
            }
        }
        pool.counters.undo_bytes_max.fetch_max(self.used, Ordering::Relaxed);
        pool.counters.aborted.fetch_add(1, Ordering::Relaxed);
        self.stage = Stage::Aborted;
        pool.release_slot(self.slot);
    }
}

impl Drop for Tx<'_> {
    fn drop(&mut self) {
        if self.stage != Stage::Running {
            return;
        }
        if std::thread::panicking() {
            // Do not touch NVRAM from a panicking thread; recovery at the next open rolls the
            // slot back. Until then no new transaction may start.
            self.pool.poisoned.store(true, Ordering::Release);
            return;
        }
        self.rollback();
    }
}
