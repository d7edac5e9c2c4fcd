//! Durability calls across mechanisms: a group commit (journal consistency mode) on the
//! engine's behalf, and the sync of an object the lower file system has not made durable -
//! by a checkpoint of the metadata journal when it holds records (the object may have been
//! created by one), else by the object's own fsync (`base/durability.rs`, E1); and, with
//! `--fsync-requests spare`, that sync done by the operation that made the change (E2).

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

    /// A change reached lower object `key` outside NVRAM: marked unsynced (E1), and with
    /// `--fsync-requests spare` synced before the operation returns with `sync` (an fsync of
    /// the object), because no durability request will come for it (E2).
    pub(crate) fn lower_changed(
        &self,
        key: (u64, u64),
        sync: impl FnOnce() -> FsResult<()>,
    ) -> FsResult<()> {
        self.base.unsynced(key);
        if self.base.durability.eager() {
            crate::base::counters::Counters::add(&self.base.durability.counters.eager_syncs, 1);
            self.sync_if_unsynced(key, sync)?;
        }
        Ok(())
    }

    /// `nvstack sync MNT` (the `sync(1)`/`syncfs(2)` the kernel does not send a FUSE daemon:
    /// design.md 13.7): every operation that returned before it is durable when it returns -
    /// journal mode's open group committed, and everything that reached the lower file system
    /// outside NVRAM (passthrough files' writes, write-through data, unjournaled changes)
    /// synced by one syncfs of the lower file system.
    pub fn sync_all(&self) -> FsResult<()> {
        crate::base::counters::Counters::add(&self.base.durability.counters.sync_requests, 1);
        self.base.group_commit();
        self.base.syncfs_lower()
    }

    /// With `--fsync-requests spare`: true, and the front end answers this FSYNC or FSYNCDIR
    /// "not implemented", after which the kernel sends no more of its kind on this connection
    /// and returns success to the application. Nothing is left to do (E2: every operation
    /// that returned is durable, in NVRAM or synced by itself).
    pub fn spares_fsync(&self) -> bool {
        let spare = self.base.durability.eager();
        if spare {
            crate::base::counters::Counters::add(&self.base.durability.counters.spared, 1);
        }
        spare
    }
}
