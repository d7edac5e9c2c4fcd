//! What the lower file system still has to make durable, so that a durability call (fsync,
//! fdatasync, O_SYNC/O_DSYNC writes, fsync of a directory) waits for the disk only when
//! something it covers is not in NVRAM.
//!
//! Everything nvstack keeps in NVRAM is durable when its operation returns: temp files, the
//! dirty pages and records of cached files, pending directory times (and, with the metadata
//! journal, namespace and attribute changes of lower objects). What is *not* in NVRAM is what
//! went to the lower file system directly and is only as durable as it makes it: data written
//! through (NVRAM full, `--cache off`, O_DIRECT), fallocate and copy_file_range on lower files,
//! and lower namespace and attribute changes not journaled. Each such change marks its lower
//! object *unsynced* ([`Base::unsynced`]); a durability call on an object that is not
//! unsynced returns at once, on one that is it syncs that object in the lower file system.
//!
//! Epochs make this race-free without a lock across the sync: the epoch counter advances
//! before every sync starts; a change is marked with the epoch it saw *after* it reached the
//! lower file system; a sync that started at epoch `e` covers every mark `<= e`. Invariant
//! E1: an object changed in the lower file system and not yet covered by a completed sync is
//! in the map. At start the engine syncs the lower file system once, so that changes made
//! before the mount (or by a daemon that died) are covered too.
//!
//! **Spared durability requests** (`--fsync-requests spare`, design.md section 13.7): the
//! front end answers FSYNC and FSYNCDIR "not implemented", after which the kernel sends
//! neither again on this connection (and returns success to the application). That is
//! correct only if no durability call could ever have work: invariant **E2**, with
//! [`FsyncRequests::Spare`], an operation that changes a lower object outside NVRAM syncs it
//! before it returns ([`Durability::eager`]; the callers do it, `engine/durability.rs`), so no
//! object stays unsynced after the operation that changed it. The mount must therefore be
//! in undo mode (journal mode's group commit *is* the work of an fsync) and have no passthrough
//! files (their writes reach the lower file system unseen).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use lower::LowerFs;

use super::Base;
use super::error::FsResult;
use super::incidents::Incident;
use super::sync::{Held, Mutex, Rank};

/// Objects tracked before the whole lower file system is synced instead (bounds the map).
pub const MAX_UNSYNCED: usize = 1 << 16;

/// Whether the kernel sends durability requests (FSYNC, FSYNCDIR) to the daemon
/// (`--fsync-requests`; module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FsyncRequests {
    /// The kernel sends them; each is answered after the lower file system made durable
    /// what it covers that is not in NVRAM (E1).
    #[default]
    Forward,
    /// The first is answered ENOSYS and the kernel sends no more: every change is durable
    /// when its operation returns (E2).
    Spare,
}

impl FsyncRequests {
    pub fn name(self) -> &'static str {
        match self {
            FsyncRequests::Forward => "forward",
            FsyncRequests::Spare => "spare",
        }
    }
}

/// See the module docs.
#[derive(Debug)]
pub struct Durability {
    /// With `Spare`, E2: lower changes are synced by the operation that made them.
    requests: FsyncRequests,
    epoch: AtomicU64,
    /// Unsynced lower objects by key, with the epoch of their last change (rank `Unsynced`).
    unsynced: Mutex<HashMap<(u64, u64), u64>>,
    pub counters: FsyncCounters,
}

impl Durability {
    pub(crate) fn new(requests: FsyncRequests) -> Self {
        Durability { requests, ..Durability::default() }
    }

    /// E2 holds: an operation that changes a lower object outside NVRAM syncs it before it
    /// returns, because no durability request will come for it.
    pub(crate) fn eager(&self) -> bool {
        self.requests == FsyncRequests::Spare
    }
}

impl Default for Durability {
    fn default() -> Self {
        Durability {
            requests: FsyncRequests::Forward,
            epoch: AtomicU64::new(1),
            unsynced: Mutex::new(Rank::Unsynced, HashMap::new()),
            counters: FsyncCounters::default(),
        }
    }
}

/// `nvstack stat --json`: `fsync`.
#[derive(Debug, Default)]
pub struct FsyncCounters {
    pub calls: AtomicU64,
    pub waited_on_lower: AtomicU64,
    pub file_calls: AtomicU64,
    pub dir_calls: AtomicU64,
    pub temp_calls: AtomicU64,
    pub lower_syncfs: AtomicU64,
    pub spared: AtomicU64,
    pub eager_syncs: AtomicU64,
    pub sync_requests: AtomicU64,
}

/// A snapshot of [`FsyncCounters`].
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct FsyncStats {
    /// fsync and fdatasync of files (O_SYNC/O_DSYNC writes arrive as these) and of directories.
    pub calls: u64,
    /// Of those, the calls that had to sync something in the lower file system.
    pub waited_on_lower: u64,
    /// Calls on lower (cached or written-through) files, on directories, on temp files.
    pub file_calls: u64,
    pub dir_calls: u64,
    pub temp_calls: u64,
    /// syncfs of the lower file system (transform groups, write-back, settling, start).
    pub lower_syncfs: u64,
    /// Lower objects changed and not yet synced now.
    pub unsynced_objects: u64,
    /// `--fsync-requests`: `forward` or `spare`.
    pub requests: &'static str,
    /// FSYNC and FSYNCDIR requests answered "not implemented" (`spare`): the kernel stops
    /// sending each kind after its first, so this is at most a few (one per kind, plus those
    /// already in flight); the calls it spares are not seen.
    pub spared: u64,
    /// Lower changes synced by their own operation because no durability request will come
    /// (`spare`, E2): write-through writes, fallocate, copy_file_range, truncates of uncached
    /// files, namespace changes the metadata journal could not take.
    pub eager_syncs: u64,
    /// `nvstack sync` requests (the `sync(1)` the kernel does not send: design.md 13.7).
    pub sync_requests: u64,
}

impl<L: LowerFs> Base<L> {
    /// Marks lower object `key` changed in the lower file system and not yet durable there.
    /// Call it after the change reached the lower file system.
    pub(crate) fn unsynced(&self, key: (u64, u64)) {
        let d = &self.durability;
        let epoch = d.epoch.load(Ordering::SeqCst);
        let many = {
            let mut map = d.unsynced.lock();
            map.insert(key, epoch);
            map.len() > MAX_UNSYNCED
        };
        if many && let Err(e) = self.syncfs_lower() {
            self.incident(
                Incident::LowerSyncFailed,
                format_args!(
                    "nvstack: syncing the lower file system (too many unsynced objects): {e}"
                ),
            );
        }
    }

    /// True when `key` has changes the lower file system has not made durable.
    pub(crate) fn is_unsynced(&self, key: (u64, u64)) -> bool {
        self.durability.unsynced.lock().contains_key(&key)
    }

    /// `--consistency journal` (design.md section 12): makes every operation committed so far
    /// durable - one group commit. Called by durability calls (fsync, fsyncdir, flush), by the
    /// clock when the group is due, and before anything reaches the lower file system (rule
    /// W1: NVRAM state reaches it only after its group commit, so a crash that loses the group
    /// never leaves a lower change made after a lost operation). A no-op in the other modes.
    /// Never called with a transaction running: it waits for every running one.
    pub(crate) fn group_commit(&self) {
        let _slot = Held::token(Rank::UndoSlot);
        self.pool.group_commit();
    }

    /// syncfs of the lower file system: everything changed before it started is durable after.
    pub(crate) fn syncfs_lower(&self) -> FsResult<()> {
        let d = &self.durability;
        let started = d.epoch.fetch_add(1, Ordering::SeqCst);
        self.lower.syncfs()?;
        d.unsynced.lock().retain(|_, &mut at| at > started);
        d.counters.lower_syncfs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Syncs one unsynced object with `sync` (fsync or fsyncdir of it); marks it synced if
    /// no change came since the sync started. (The engine first checkpoints the metadata
    /// journal instead when it holds records: `engine/durability.rs`.)
    pub(crate) fn sync_unsynced(
        &self,
        key: (u64, u64),
        sync: impl FnOnce() -> FsResult<()>,
    ) -> FsResult<()> {
        let d = &self.durability;
        let started = d.epoch.fetch_add(1, Ordering::SeqCst);
        sync()?;
        let mut map = d.unsynced.lock();
        if map.get(&key).is_some_and(|&at| at <= started) {
            map.remove(&key);
        }
        Ok(())
    }

    pub(crate) fn fsync_stats(&self) -> FsyncStats {
        let c = &self.durability.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        FsyncStats {
            calls: get(&c.calls),
            waited_on_lower: get(&c.waited_on_lower),
            file_calls: get(&c.file_calls),
            dir_calls: get(&c.dir_calls),
            temp_calls: get(&c.temp_calls),
            lower_syncfs: get(&c.lower_syncfs),
            unsynced_objects: self.durability.unsynced.lock().len() as u64,
            requests: self.durability.requests.name(),
            spared: get(&c.spared),
            eager_syncs: get(&c.eager_syncs),
            sync_requests: get(&c.sync_requests),
        }
    }
}
