//! The base: the services every mechanism of the engine borrows, and nothing else.
//!
//! A mechanism (the metadata journal `journal/`, the page cache `cache/`, TempFFS with its
//! overlay `tempfs/`, the routes `route/`) is a type that owns its state and takes a
//! [`Base`] for everything it shares with the others: the lower file system (only through its
//! facade, [`Lower`]), the NVRAM pool and its transactions ([`OpTx`], [`Base::atomically`]),
//! the request and byte counters, the count of each kind of failure reported ([`incidents`]),
//! the lower-FS space reserved for NVRAM data, what the lower file system has not made durable
//! yet ([`durability`]), the failpoints of the crash tests,
//! and the building blocks below (locks, errors, packed record slots, node and handle tables).
//!
//! Dependencies point one way: `engine/` -> the mechanisms -> `base/`; nothing in `base/`
//! names a mechanism (checked by `crates/core/tests/rooms.rs`).
//!
//! Files: `lowerfs.rs` (the facade; L1, W1), `optx.rs` (the one transaction idiom),
//! `durability.rs` (unsynced lower objects, sync epochs: E1), `space.rs` (ENOSPC at write
//! time), `counters.rs` (requests per operation, bytes), `incidents.rs` (every failure
//! reported on stderr, counted by kind), `pages.rs` (file data in page frames, for
//! temp files and cached pages alike), `slots.rs` (records packed in slots
//! of frames), `sync.rs` (ranked locks, the one lock order), `inodes.rs` and `handles.rs` (the
//! tables of what the kernel names), `binding.rs` (the region tied to its lower directory),
//! `error.rs` (typed errors), `frames.rs` (the one table of frame kinds), `hidden.rs` (nvstack's own names in lower directories), `share.rs` (limits that are shares of the region).

/// Checks a mechanism's invariants at the end of an operation, in debug builds only (the test
/// suites build debug, so every test checks them; a release build compiles the check away).
/// `$check` is an expression of type `Result<(), String>`, usually a `check` method of the
/// state the operation changed; a broken invariant panics with what is wrong.
macro_rules! debug_check {
    ($check:expr) => {
        if cfg!(debug_assertions) {
            if let Err(why) = $check {
                panic!("invariant broken: {why}");
            }
        }
    };
}
pub(crate) use debug_check;

pub mod binding;
pub mod counters;
pub mod durability;
pub mod error;
pub mod frames;
pub mod handles;
pub mod hidden;
pub mod incidents;
pub mod inodes;
pub mod lowerfs;
pub mod optx;
pub mod pages;
pub mod share;
pub mod slots;
pub mod space;
pub mod sync;

use std::sync::Arc;

use lower::{Attr, LowerFs, TimeSet};
use txn::{Pool, Tx, TxError};

use counters::Counters;
use durability::{Durability, FsyncRequests};
use error::{FsError, FsResult, answer};
pub use incidents::Incident;
use incidents::Incidents;
pub use lowerfs::{Committed, Lower};
pub use optx::OpTx;
use slots::{Place, Released, SlotList};
use space::Space;

pub use pages::PAGE;

/// A looked-up object: its node id and attributes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub node_id: u64,
    pub attr: Attr,
}

/// A test hook: called with the name of each persistence step of the engine's protocols
/// (e.g. `transform.copied`), so that process-level tests can kill the daemon exactly there.
pub trait Failpoints: Send + Sync + std::fmt::Debug {
    fn hit(&self, point: &'static str);
}

/// See the module docs. Every field is a service; none belongs to one mechanism.
#[derive(Debug)]
pub struct Base<L: LowerFs> {
    /// The lower file system, reached only through its facade.
    pub(crate) lower: Lower<L>,
    pub(crate) pool: Pool,
    pub(crate) counters: Counters,
    /// The failures reported on stderr, counted by kind (`Base::incident`).
    pub(crate) incidents: Incidents,
    /// Lower-FS space reserved for data that lives only in NVRAM.
    pub(crate) space: Space,
    /// What the lower file system has not made durable yet (fsync answers from it).
    pub(crate) durability: Durability,
    pub(crate) failpoints: Option<Arc<dyn Failpoints>>,
    /// The lower root's device: temp files live on it only.
    pub(crate) root_dev: u64,
    /// Most directories a walk visits to find an object by its handle when the lower file
    /// system cannot open handles directly (unprivileged daemon).
    pub(crate) max_walk: usize,
}

impl<L: LowerFs> Base<L> {
    pub(crate) fn new(
        lower: L,
        pool: Pool,
        failpoints: Option<Arc<dyn Failpoints>>,
        max_walk: usize,
        fsync_requests: FsyncRequests,
    ) -> Base<L> {
        let root_dev = lower.key(lower.root()).0;
        Base {
            lower: Lower::new(lower),
            pool,
            counters: Counters::default(),
            incidents: Incidents::default(),
            space: Space::default(),
            durability: Durability::new(fsync_requests),
            failpoints,
            root_dev,
            max_walk,
        }
    }

    /// The failpoint `point` (a persistence step) was reached.
    pub(crate) fn fail(&self, point: &'static str) {
        if let Some(f) = &self.failpoints {
            f.hit(point);
        }
    }

    /// A failure the engine survives (`incidents.rs`): counted under `kind`, `message` said on
    /// stderr.
    pub(crate) fn incident(&self, kind: Incident, message: std::fmt::Arguments<'_>) {
        self.incidents.report(kind, message);
    }

    /// One transaction around `f`, outside any operation: committed if `f` returns `Ok`,
    /// rolled back (leaving NVRAM as it was) if it returns `Err`.
    pub(crate) fn atomically<T>(
        &self,
        f: impl FnOnce(&mut Tx<'_>) -> Result<T, TxError>,
    ) -> FsResult<T> {
        let mut otx = OpTx::new(&self.pool);
        let result = f(otx.tx()).map_err(FsError::from);
        otx.end(result)
    }

    /// A group commit (journal consistency mode; nothing in the others) and the proof of it
    /// that every lower change needs (W1, `lowerfs.rs`). Never with a transaction running.
    pub(crate) fn committed(&self) -> Committed {
        self.group_commit();
        Committed::after_group_commit()
    }

    /// A time an application set, or now by the lower file system's clock.
    pub(crate) fn time(&self, t: TimeSet) -> (i64, u32) {
        match t {
            TimeSet::Now => self.lower.now(),
            TimeSet::At(s, ns) => (s, ns),
        }
    }

    /// Bytes the lower file system must keep free: reserved pages plus one block per temp
    /// file (`space.rs`).
    pub(crate) fn reserved_bytes(&self) -> u64 {
        (self.space.pages() + self.space.files()) * PAGE
    }

    /// ENOSPC now when the lower file system could not take what NVRAM holds plus
    /// `more_pages`. A lower call (statfs): never under a short lock.
    pub(crate) fn reserve(&self, more_pages: u64) -> FsResult<()> {
        if more_pages == 0 {
            return Ok(());
        }
        let s = self.lower.statfs(self.lower.root())?;
        let avail = s.bavail.saturating_mul(u64::from(s.frsize.max(1)));
        if self.reserved_bytes() + more_pages * PAGE > avail {
            return Err(answer(libc::ENOSPC));
        }
        Ok(())
    }

    /// After the removal of the record at `place` committed (`slots::remove`): its slot is
    /// free again (T6); a second empty record frame is freed in a transaction of its own (off
    /// the list first, so nobody reserves in it meanwhile). Returns the frames freed (0 or 1).
    pub(crate) fn release_slot(&self, list: &SlotList, place: Place) -> u64 {
        let released = list.lock().release(place);
        let Released::FreeFrame(frame) = released else { return 0 };
        match self.atomically(|tx| tx.free_frame(frame)) {
            Ok(()) => 1,
            Err(e) => {
                // Still allocated and zero (T5): listed again as room.
                self.incident(
                    Incident::FreeFailed,
                    format_args!("nvstack: an empty record frame was not freed: {e}"),
                );
                list.lock().add_frame(frame, 0);
                0
            }
        }
    }

    /// Frees the record frames of `list` that hold no record, all but `keep` (off the list
    /// first); returns how many.
    pub(crate) fn free_empty_slots(&self, list: &SlotList, keep: usize) -> FsResult<u64> {
        let empty = list.lock().take_empty(keep);
        if empty.is_empty() {
            return Ok(0);
        }
        match self.atomically(|tx| empty.iter().try_for_each(|&f| tx.free_frame(f))) {
            Ok(()) => Ok(empty.len() as u64),
            Err(e) => {
                let mut l = list.lock();
                for &f in &empty {
                    l.add_frame(f, 0); // still allocated and zero (T5): room again
                }
                Err(e)
            }
        }
    }
}

/// The set-ID bits a write or truncate by an unprivileged caller removes (as the kernel's
/// `should_remove_suid` says; `Engine::kill_suidgid`).
pub(crate) fn suidgid_bits(mode: u32) -> u32 {
    let mut kill = 0;
    if mode & libc::S_ISUID != 0 {
        kill |= libc::S_ISUID;
    }
    if mode & (libc::S_ISGID | libc::S_IXGRP) == libc::S_ISGID | libc::S_IXGRP {
        kill |= libc::S_ISGID;
    }
    kill
}
