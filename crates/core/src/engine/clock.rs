//! The engine's clock-driven work, in one place for every mechanism: the daemon's timer
//! calls [`Engine::tick`] about twice a second (the engine starts no thread and reads no
//! clock but the lower file system's).

use lower::LowerFs;

use super::Engine;
use crate::base::error::FsResult;
use crate::journal::checkpoint::Why;

impl<L: LowerFs> Engine<L> {
    /// A group commit when journal mode's running group is due, a checkpoint of the metadata
    /// journal when its oldest record may be older than `--checkpoint-interval`, and the
    /// write-back of pages older than `--max-dirty-age`.
    pub fn tick(&self) -> FsResult<()> {
        let b = &self.base;
        let (secs, nanos) = b.lower.now();
        let now_ns = u64::try_from(secs).unwrap_or(0) * 1_000_000_000 + u64::from(nanos);
        if b.pool.group_due(now_ns) {
            b.group_commit();
        }
        if self.journal.interval_due(b) {
            self.journal.checkpoint(b, Why::Interval)?;
        }
        self.cache.writeback_aged(&self.base)?;
        Ok(())
    }

    /// Makes every committed metadata-journal record durable in the lower file system and
    /// frees it (`journal/checkpoint.rs`); returns the records freed.
    pub fn checkpoint(&self, why: Why) -> FsResult<u64> {
        self.journal.checkpoint(&self.base, why)
    }
}
