//! Checkpoints of the metadata journal: group commit into the lower file system.
//!
//! Protocol (failpoint names in brackets): (1) note the committed records; (2) one `syncfs` of
//! the lower file system - every change those records describe was applied before it started,
//! so all are durable after it [checkpoint.synced]; (3) transactions of at most `FREE_BATCH`
//! frames free the records: a frame none of whose records stays is freed, and in a frame that
//! keeps records committed after (1) the freed records' slots are zeroed (M6)
//! [checkpoint.freed]. A crash before a record's free commits leaves it, and replay redoes a
//! change the lower file system already has - the records are idempotent (`replay.rs`).
//! Records committed while a checkpoint runs are not in its list and wait for the next one;
//! they may take slots freed before (J2), so any frame can hold both kinds, and the
//! transactions of (3) are halved while one does not fit. A record annulled while the
//! checkpoint runs (M7) is skipped: its slots are zero already.
//!
//! Triggers: the journal's size limit (checked after every operation), the interval (the
//! daemon's clock drives `Engine::tick`, which asks `interval_due`), a durability call that must reach the lower file
//! system anyway, NVRAM pressure, `nvstack flush`, unmount, and the end of recovery.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use lower::LowerFs;
use txn::{FrameId, TxError};

use super::record::{Place, SLOT_SIZE, slot_offset};
use super::{Journal, Pending};
use crate::base::Base;
use crate::base::Incident;
use crate::base::OpTx;
use crate::base::counters::Counters;
use crate::base::error::{FsError, FsResult};

/// Frames freed per transaction at most (a freed frame costs its descriptor's undo record, a
/// frame whose records are zeroed instead up to its 4 KiB: fewer when a transaction cannot
/// hold them).
const FREE_BATCH: usize = 1024;

/// Why a checkpoint ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    Size,
    Interval,
    Sync,
    Pressure,
    /// `nvstack flush`: the lower directory alone complete and durable.
    Flush,
    Unmount,
    Recovery,
}

impl Journal {
    /// Makes every committed journal record durable in the lower file system and frees it
    /// (see the module docs); returns the records freed.
    pub(crate) fn checkpoint<L: LowerFs>(&self, b: &Base<L>, why: Why) -> FsResult<u64> {
        let _one = self.checkpointing.lock();
        // Several requests can find the journal full at once and queue here: the first frees
        // it, and the others must not run a syncfs each (seconds at scale) for records that
        // have not filled it again.
        if why == Why::Size && !self.full() {
            return Ok(0);
        }
        let now = b.lower.now();
        let (listed, idle): (Vec<(u64, Place)>, Vec<FrameId>) = {
            let pending = self.pending.lock();
            let idle = pending.idle_frames();
            (pending.records.iter().map(|(&s, &p)| (s, p)).collect(), idle.collect())
        };
        if listed.is_empty() && idle.is_empty() {
            return Ok(0);
        }
        if !listed.is_empty() {
            b.syncfs_lower()?;
            b.fail("checkpoint.synced");
        }
        let mut by_frame: BTreeMap<FrameId, Vec<(u64, Place)>> =
            idle.into_iter().map(|f| (f, Vec::new())).collect();
        for &(seq, place) in &listed {
            by_frame.entry(place.frame).or_default().push((seq, place));
        }
        let by_frame: Vec<(FrameId, Vec<(u64, Place)>)> = by_frame.into_iter().collect();
        // Transactions of at most FREE_BATCH frames, halved while one does not fit (an undo
        // slot, journal mode's log credit): every frame may keep newer records, in slots
        // freed before, and then its listed records are zeroed - up to a page each.
        let (mut size, mut rest) = (FREE_BATCH, &by_frame[..]);
        while !rest.is_empty() {
            let batch = &rest[..size.min(rest.len())];
            match self.free_batch(b, batch, now) {
                Ok(()) => rest = &rest[batch.len()..],
                Err(FsError::Nvram(TxError::UndoFull { .. })) if batch.len() > 1 => {
                    size = batch.len() / 2;
                }
                Err(e) => return Err(e),
            }
        }

        b.fail("checkpoint.freed");
        let c = &self.counters;
        Counters::add(&c.checkpoints, 1);
        let nanos = |t: (i64, u32)| i128::from(t.0) * 1_000_000_000 + i128::from(t.1);
        let ms = (nanos(b.lower.now()) - nanos(now)).max(0) / 1_000_000;
        Counters::add(&c.checkpoint_ms_total, u64::try_from(ms).unwrap_or(u64::MAX));
        Ok(listed.len() as u64)
    }

    /// Step (3) for the frames of `batch` and their listed records, in one transaction.
    fn free_batch<L: LowerFs>(
        &self,
        b: &Base<L>,
        batch: &[(FrameId, Vec<(u64, Place)>)],
        now: (i64, u32),
    ) -> FsResult<()> {
        let pool = &b.pool;
        // Begun before the journal's lock (short: held while the batch is planned, written
        // and committed, so no record is packed into a frame being freed).
        let mut otx = OpTx::new(pool);
        otx.tx();
        let mut pending = self.pending.lock();
        // Records annulled since (1) left the journal already (their slots are zero).
        let batch: Vec<(FrameId, Vec<(u64, Place)>)> = batch
            .iter()
            .map(|(f, r)| {
                let left = r.iter().filter(|(seq, _)| pending.records.contains_key(seq));
                (*f, left.copied().collect())
            })
            .collect();
        let freed = |frame: &FrameId, records: &[(u64, Place)], pending: &Pending| {
            pending.records_in(*frame) as usize == records.len()
                && pending.slots.bits(*frame).is_some()
        };
        let plan: Vec<bool> = batch.iter().map(|(f, r)| freed(f, r, &pending)).collect();
        let written = (|| -> Result<(), TxError> {
            let tx = otx.tx();
            for ((frame, records), &free) in batch.iter().zip(&plan) {
                if free {
                    tx.free_frame(*frame)?;
                    continue;
                }
                for (_, p) in records {
                    let zero = vec![0u8; p.slots * SLOT_SIZE];
                    tx.update(slot_offset(pool, p.frame, p.slot), &zero)?;
                }
            }
            Ok(())
        })();
        otx.end(written.map_err(FsError::from))?;
        for ((frame, records), &free) in batch.iter().zip(&plan) {
            if free {
                pending.drop_frame(*frame);
                Counters::add(&self.counters.frames_freed, 1);
            } else {
                for &(_, p) in records {
                    pending.release(p);
                }
                Counters::add(&self.counters.records_zeroed, records.len() as u64);
            }
            for (seq, _) in records {
                pending.records.remove(seq);
                pending.gone(*seq);
            }
        }
        crate::base::debug_check!(pending.check());
        if !pending.records.is_empty() {
            // Committed during the checkpoint: no older than its start.
            self.oldest_at.store(now.0, Ordering::Relaxed);
        }
        Ok(())
    }

    /// A checkpoint when the journal is at its size limit (called after every operation, with
    /// no lock held).
    pub(crate) fn checkpoint_if_full<L: LowerFs>(&self, b: &Base<L>) {
        if self.full()
            && let Err(e) = self.checkpoint(b, Why::Size)
        {
            b.incident(
                Incident::CheckpointFailed,
                format_args!("nvstack: journal checkpoint failed (the records stay in NVRAM): {e}"),
            );
        }
    }

    /// Whether the oldest record may be older than `--checkpoint-interval` (the clock's
    /// checkpoint; never with an interval of 0 or no record).
    pub(crate) fn interval_due<L: LowerFs>(&self, b: &Base<L>) -> bool {
        let interval = self.config.interval_secs;
        if interval == 0 || self.is_empty() {
            return false;
        }
        let oldest = self.oldest_at.load(Ordering::Relaxed);
        let age = b.lower.now().0.saturating_sub(oldest);
        u64::try_from(age).unwrap_or(u64::MAX) >= interval
    }
}
