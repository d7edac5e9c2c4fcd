//! Checkpoints of the metadata journal: group commit into the lower file system.
//!
//! Protocol (failpoint names in brackets): (1) note the committed records; (2) one `syncfs` of
//! the lower file system - every change those records describe was applied before it started,
//! so all are durable after it [checkpoint.synced]; (3) transactions of at most
//! `FREE_BATCH` records free their frames [checkpoint.freed]. A crash before a record's free
//! commits leaves it, and replay redoes a change the lower file system already has - the
//! records are idempotent (`replay.rs`). Records committed while a checkpoint runs are not in
//! its list and wait for the next one.
//!
//! Triggers: the journal's size limit (checked after every operation), the interval (the
//! daemon's clock drives `Engine::tick`), a durability call that must reach the lower file
//! system anyway, NVRAM pressure, `nvstack flush`, unmount, and the end of recovery.

use std::sync::atomic::Ordering;

use lower::LowerFs;

use crate::engine::Engine;
use crate::error::FsResult;
use crate::stats::Counters;

/// Records freed per transaction (a freed frame costs its descriptor's undo record).
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

impl<L: LowerFs> Engine<L> {
    /// Makes every committed journal record durable in the lower file system and frees it
    /// (see the module docs); returns the records freed.
    pub fn checkpoint(&self, _why: Why) -> FsResult<u64> {
        let _one = self.journal.checkpointing.lock();
        let now = self.lower.now();
        let listed: Vec<(u64, txn::FrameId)> =
            self.journal.pending.lock().records.iter().map(|(&s, &f)| (s, f)).collect();
        if listed.is_empty() {
            return Ok(0);
        }
        self.syncfs_lower()?;
        self.fail("checkpoint.synced");
        for batch in listed.chunks(FREE_BATCH) {
            self.atomically(|tx| batch.iter().try_for_each(|&(_, frame)| tx.free_frame(frame)))?;
            let mut pending = self.journal.pending.lock();
            for (seq, _) in batch {
                pending.records.remove(seq);
            }
            if !pending.records.is_empty() {
                // Committed during the checkpoint: no older than its start.
                self.journal.oldest_at.store(now.0, Ordering::Relaxed);
            }
        }

        self.fail("checkpoint.freed");
        let c = &self.journal.counters;
        Counters::add(&c.checkpoints, 1);
        let nanos = |t: (i64, u32)| i128::from(t.0) * 1_000_000_000 + i128::from(t.1);
        let ms = (nanos(self.lower.now()) - nanos(now)).max(0) / 1_000_000;
        Counters::add(&c.checkpoint_ms_total, u64::try_from(ms).unwrap_or(u64::MAX));
        Ok(listed.len() as u64)
    }

    /// A checkpoint when the journal is at its size limit (called after every operation, with
    /// no lock held).
    pub(crate) fn checkpoint_if_full(&self) {
        if self.journal.full()
            && let Err(e) = self.checkpoint(Why::Size)
        {
            eprintln!("nvstack: journal checkpoint failed (the records stay in NVRAM): {e}");
        }
    }

    /// The engine's clock-driven work, called about twice a second by the daemon: a
    /// checkpoint when the oldest record may be older than `--checkpoint-interval`, and the
    /// write-back of pages older than `--max-dirty-age`.
    pub fn tick(&self) -> FsResult<()> {
        let (secs, nanos) = self.lower.now();
        let now_ns = u64::try_from(secs).unwrap_or(0) * 1_000_000_000 + u64::from(nanos);
        if self.pool.group_due(now_ns) {
            self.group_commit();
        }
        let interval = self.journal.config.interval_secs;
        if interval > 0 && !self.journal.is_empty() {
            let oldest = self.journal.oldest_at.load(Ordering::Relaxed);
            let age = self.lower.now().0.saturating_sub(oldest);
            if u64::try_from(age).unwrap_or(u64::MAX) >= interval {
                self.checkpoint(Why::Interval)?;
            }
        }
        self.writeback_aged()?;
        Ok(())
    }
}
