//! NVRAM pressure, across mechanisms, in one place: what the region's frames are shared by
//! (temp files, dirty pages and patches, the metadata journal's records), and what makes room
//! when they run short. Each mechanism keeps its own limit and knows how to give frames back
//! (TempFFS transforms, the page cache writes back, the journal checkpoints); the policy that
//! weighs one against the other is here.

use lower::LowerFs;

use super::Engine;
use crate::base::Incident;
use crate::journal::checkpoint::Why;

impl<L: LowerFs> Engine<L> {
    /// NVRAM pressure on temp files (thesis 3.1.1): when they hold more than their share of
    /// frames, or `force` (a write found no free frame), the least recently used temp files are
    /// transformed until N = NR_WB * NR_TempFFS / NR_Dirty pages are freed, NR_Dirty counting
    /// the page cache's dirty pages too (the rest of the room comes from write-back).
    pub(crate) fn relieve_pressure(&self, force: bool) {
        if !force && !self.temp.over_share() {
            return;
        }
        let nr_tempffs = self.temp.pages_resident();
        let nr_dirty = (nr_tempffs + self.cache.pages_dirty()).max(1);
        let batch = self.temp.config.writeback_batch;
        let target = (batch * nr_tempffs / nr_dirty).max(1);
        debug_assert!(
            target <= batch.max(1),
            "the temp files' part of a batch is at most the batch"
        );
        self.temp.pressure_round(&self.base, target);
    }

    /// A write found no free frame: room is made once by every mechanism that holds frames -
    /// the journal's records checkpointed, the least recently used temp files transformed,
    /// inactive dirty pages written back by the policy - before the write is tried again
    /// (`ops/io.rs`). Failures are said and leave the write to its fallbacks.
    pub(crate) fn make_room(&self) {
        if let Err(e) = self.journal.checkpoint(&self.base, Why::Pressure) {
            self.base.incident(
                Incident::CheckpointFailed,
                format_args!("nvstack: journal checkpoint for room failed: {e}"),
            );
        }
        self.relieve_pressure(true);
        if let Err(e) = self.cache.writeback_for_room(&self.base) {
            self.base.incident(
                Incident::WritebackFailed,
                format_args!("nvstack: write-back for room failed: {e}"),
            );
        }
    }
}
