//! Durability calls across mechanisms: a group commit (journal consistency mode) on the
//! engine's behalf, and the sync of an object the lower file system has not made durable -
//! by a checkpoint of the metadata journal when it holds records (the object may have been
//! created by one), else by the object's own fsync (`base/durability.rs`, E1).

use lower::LowerFs;

use super::Engine;
use crate::base::error::FsResult;

impl<L: LowerFs> Engine<L> {
    /// `--consistency journal` (design.md section 12): makes every operation committed so far
    /// durable - one group commit. Called by durability calls (fsync, fsyncdir, flush) and by
    /// the clock when the group is due; a no-op in the other modes. Never called with a
    /// transaction running: it waits for every running one.
    pub fn group_commit(&self) {
        self.base.group_commit();
    }

    /// Syncs one object with `sync` (fsync or fsyncdir of it) when it is unsynced; returns
    /// whether it had to.
    pub(crate) fn sync_if_unsynced(
        &self,
        key: (u64, u64),
        sync: impl FnOnce() -> FsResult<()>,
    ) -> FsResult<bool> {
        if !self.base.is_unsynced(key) {
            return Ok(false);
        }
        if !self.journal.is_empty() {
            // The object may have been created by a journaled change not yet durable in the
            // lower file system: a checkpoint syncs it all (and frees the records).
            self.journal.checkpoint(&self.base, crate::journal::checkpoint::Why::Sync)?;
            return Ok(true);
        }
        self.base.sync_unsynced(key, sync)?;
        Ok(true)
    }
}
