//! The direct path's delegations (docs/direct-path.md): which files the daemon delegated to a
//! library process, with their log areas, and what the grants and take-backs did. The grant,
//! the merge and the take-back compose the engine's write path and live in
//! `engine/direct.rs`; this room owns the table and the counters.
//!
//! Invariants (the engine keeps them): **DG1** a node has a delegation only while the holder's
//! open is the node's only open, on the NVRAM path, in undo mode (checked at the grant, and
//! again after the delegation is in the table, so that an open registering meanwhile either is
//! seen by the grant or sees the delegation and takes it back). **DT1** no request on a
//! delegated node is served before every record committed before it started is merged (the
//! front end asks [`crate::engine::Engine::take_back`] first). A delegation's `cursor` lock
//! orders its merges; it is held across the merge's writes (rank `Delegation`, before every
//! lock of the write path).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use nvram::Region;

use crate::base::sync::{Mutex, Rank};

/// Most delegations at once (each is a log file and a mapping in the daemon).
pub const MAX_DELEGATIONS: usize = 1024;

/// Where log areas live: created for a grant, owned by the caller, removed when it ends. The
/// daemon implements it with files beside the region (`crates/cli/src/cmd/logs.rs`), tests in
/// memory. Time enters here too: the take-back's bounded wait sleeps through [`LogAreas::pause`].
pub trait LogAreas: Send + Sync + std::fmt::Debug {
    /// A zero-filled area for `grant`, owned by `owner` (uid, gid) and readable and writable
    /// by it alone; the path the library opens, and the daemon's own mapping.
    fn create(&self, grant: u64, owner: (u32, u32)) -> std::io::Result<(PathBuf, Arc<dyn Region>)>;
    /// The delegation ended: the area goes.
    fn remove(&self, path: &Path);
    /// One pause of the take-back's wait for a library thread inside an append, `waited_us`
    /// after the wait began: the microseconds it paused, or `None` when the wait's bound has
    /// passed (the caller then takes the log as it is).
    fn pause(&self, waited_us: u64) -> Option<u64>;
}

/// Why a delegation was taken back (or merged and kept): `nvstack stat`'s `direct.taken_back`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TakeBack {
    /// Another open of the file (by anyone).
    Open,
    /// A lookup or directory listing that answers the file's attributes.
    Lookup,
    /// A stat by another process (or through another open).
    Getattr,
    /// A stat through the holder's own open that the library did not answer: merged, kept
    /// (answered with the merged attributes, uncached).
    Stat,
    /// A truncate, chmod, chown or utimes.
    Setattr,
    /// A write that did not go through the library (stdio's own calls, a child after fork).
    Write,
    /// The holder's last close.
    Release,
    /// lseek to data or holes, fallocate, copy_file_range.
    Other,
    /// The library asked (before an mmap, or at exit).
    Asked,
    /// The log failed validation.
    RefusedLog,
    /// The daemon is stopping.
    Unmount,
    /// A read through the descriptor: merged, kept.
    Read,
    /// An fsync that reached the daemon: merged, kept.
    Fsync,
    /// The library's log was full: merged, kept, the log starts over.
    Full,
}

impl TakeBack {
    /// Every reason, in the order of the counters.
    pub const ALL: [TakeBack; 14] = [
        TakeBack::Open,
        TakeBack::Lookup,
        TakeBack::Getattr,
        TakeBack::Stat,
        TakeBack::Setattr,
        TakeBack::Write,
        TakeBack::Release,
        TakeBack::Other,
        TakeBack::Asked,
        TakeBack::RefusedLog,
        TakeBack::Unmount,
        TakeBack::Read,
        TakeBack::Fsync,
        TakeBack::Full,
    ];

    /// The name in `nvstack stat` (kept once published).
    pub fn name(self) -> &'static str {
        match self {
            TakeBack::Open => "open",
            TakeBack::Lookup => "lookup",
            TakeBack::Getattr => "getattr",
            TakeBack::Stat => "stat",
            TakeBack::Setattr => "setattr",
            TakeBack::Write => "write",
            TakeBack::Release => "release",
            TakeBack::Other => "other",
            TakeBack::Asked => "asked",
            TakeBack::RefusedLog => "refused_log",
            TakeBack::Unmount => "unmount",
            TakeBack::Read => "read",
            TakeBack::Fsync => "fsync",
            TakeBack::Full => "full",
        }
    }

    /// Whether the delegation survives: the log is merged and the library goes on appending.
    pub fn keeps(self) -> bool {
        matches!(self, TakeBack::Read | TakeBack::Stat | TakeBack::Fsync | TakeBack::Full)
    }
}

/// Why a grant was refused: `nvstack stat`'s `direct.refused_grants`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The direct path is off (`--direct-path off`) or the mount is not in undo mode.
    Off,
    /// The file has another open, or is delegated already.
    Busy,
    /// The open is in passthrough, O_DIRECT, or not of a regular file.
    Route,
    /// The open cannot write.
    ReadOnly,
    /// [`MAX_DELEGATIONS`] are held.
    Limit,
    /// The log area could not be made.
    Area,
}

impl Refusal {
    pub const ALL: [Refusal; 6] = [
        Refusal::Off,
        Refusal::Busy,
        Refusal::Route,
        Refusal::ReadOnly,
        Refusal::Limit,
        Refusal::Area,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Refusal::Off => "off",
            Refusal::Busy => "busy",
            Refusal::Route => "route",
            Refusal::ReadOnly => "read_only",
            Refusal::Limit => "limit",
            Refusal::Area => "area",
        }
    }

    /// The ioctl's answer (docs of `direct::ioctl`).
    pub fn errno(self) -> i32 {
        match self {
            Refusal::Off | Refusal::Route => libc::EOPNOTSUPP,
            Refusal::Busy => libc::EBUSY,
            Refusal::ReadOnly => libc::EBADF,
            Refusal::Limit | Refusal::Area => libc::ENOSPC,
        }
    }
}

/// Where the daemon's merges of one delegation stand (under its lock).
#[derive(Debug)]
pub(crate) struct Cursor {
    /// Where the next record of this pass over the area is, and its sequence number.
    pub(crate) end: u64,
    pub(crate) next_seq: u64,
    /// The library's fsync count already added to the counters.
    pub(crate) fsyncs_seen: u64,
    /// The delegation ended (a request that waited for the lock finds it gone).
    pub(crate) ended: bool,
}

/// One delegation: a node's writes served by a library process through a log area.
#[derive(Debug)]
pub(crate) struct Delegation {
    pub(crate) grant: u64,
    pub(crate) node: u64,
    /// The holder's open: the merge writes through it.
    pub(crate) fh: u64,
    pub(crate) path: PathBuf,
    pub(crate) area: Arc<dyn Region>,
    pub(crate) cursor: Mutex<Cursor>,
}

/// The table of delegations, the log areas and the counters.
#[derive(Debug)]
pub(crate) struct Delegations {
    areas: Option<Arc<dyn LogAreas>>,
    /// Cleared when the kernel cannot serve what the direct path needs (mmap of direct-IO
    /// files): grants are refused from then on.
    usable: std::sync::atomic::AtomicBool,
    table: Mutex<HashMap<u64, Arc<Delegation>>>,
    /// Delegations in the table: requests on a mount with none pay one load.
    active: AtomicUsize,
    next_grant: AtomicU64,
    /// Nodes delegated since their opens began: the kernel's size of them may miss the
    /// library's appends until it is told (`FUSE_NOTIFY_STORE` at the end of a delegation),
    /// and an O_APPEND write it placed by that size goes to the real end instead. Cleared
    /// when the node has no open left (no write can be in flight then).
    stale_size: Mutex<std::collections::HashSet<u64>>,
    pub(crate) counters: DirectCounters,
}

impl Delegations {
    pub(crate) fn new(areas: Option<Arc<dyn LogAreas>>) -> Self {
        Delegations {
            areas,
            usable: std::sync::atomic::AtomicBool::new(true),
            table: Mutex::new(Rank::Delegations, HashMap::new()),
            active: AtomicUsize::new(0),
            next_grant: AtomicU64::new(1),
            stale_size: Mutex::new(Rank::StaleSizes, std::collections::HashSet::new()),
            counters: DirectCounters::default(),
        }
    }

    pub(crate) fn areas(&self) -> Option<&Arc<dyn LogAreas>> {
        self.areas.as_ref()
    }

    pub(crate) fn enabled(&self) -> bool {
        self.areas.is_some() && self.usable.load(Ordering::Relaxed)
    }

    /// The kernel lacks what the direct path needs: no grant from now on.
    pub(crate) fn disable(&self) {
        self.usable.store(false, Ordering::Relaxed);
    }

    pub(crate) fn next_grant(&self) -> u64 {
        self.next_grant.fetch_add(1, Ordering::Relaxed)
    }

    /// The delegation of `node`, if any (one load when there is none anywhere).
    pub(crate) fn get(&self, node: u64) -> Option<Arc<Delegation>> {
        if self.active.load(Ordering::Acquire) == 0 {
            return None;
        }
        self.table.lock().get(&node).cloned()
    }

    pub(crate) fn len(&self) -> usize {
        self.active.load(Ordering::Acquire)
    }

    /// Adds `d` unless its node has one already (false then).
    pub(crate) fn insert(&self, d: Arc<Delegation>) -> bool {
        let mut table = self.table.lock();
        if table.contains_key(&d.node) || table.len() >= MAX_DELEGATIONS {
            return false;
        }
        let mut stale = self.stale_size.lock();
        if stale.len() >= MAX_DELEGATIONS * 4 {
            // (a limit; never reached while opens end: each node leaves at its last close)
            stale.clear();
        }
        stale.insert(d.node);
        drop(stale);
        table.insert(d.node, d);
        self.active.fetch_add(1, Ordering::AcqRel);
        true
    }

    pub(crate) fn remove(&self, node: u64, grant: u64) {
        let mut table = self.table.lock();
        if table.get(&node).is_some_and(|d| d.grant == grant) {
            table.remove(&node);
            self.active.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Whether the kernel's size of `node` may be stale (see the field).
    pub(crate) fn size_may_be_stale(&self, node: u64) -> bool {
        if self.areas.is_none() {
            return false;
        }
        self.stale_size.lock().contains(&node)
    }

    /// `node` has no open left.
    pub(crate) fn closed(&self, node: u64) {
        if self.areas.is_some() {
            self.stale_size.lock().remove(&node);
        }
    }

    /// Every delegation (for the take-back at unmount).
    pub(crate) fn all(&self) -> Vec<Arc<Delegation>> {
        self.table.lock().values().cloned().collect()
    }
}

/// Counters of the direct path (relaxed atomics: observations).
#[derive(Debug, Default)]
pub(crate) struct DirectCounters {
    pub(crate) granted: AtomicU64,
    pub(crate) refused: [AtomicU64; Refusal::ALL.len()],
    pub(crate) taken_back: [AtomicU64; TakeBack::ALL.len()],
    pub(crate) merges: AtomicU64,
    pub(crate) records: AtomicU64,
    pub(crate) bytes: AtomicU64,
    pub(crate) fsyncs: AtomicU64,
    pub(crate) refused_logs: AtomicU64,
    pub(crate) wait_timeouts: AtomicU64,
    pub(crate) wait_us_total: AtomicU64,
    pub(crate) wait_us_max: AtomicU64,
}

impl DirectCounters {
    pub(crate) fn refused(&self, why: Refusal) {
        let i = Refusal::ALL.iter().position(|&r| r == why).expect("every refusal listed");
        self.refused[i].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn taken_back(&self, why: TakeBack) {
        let i = TakeBack::ALL.iter().position(|&r| r == why).expect("every reason listed");
        self.taken_back[i].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn waited(&self, us: u64) {
        self.wait_us_total.fetch_add(us, Ordering::Relaxed);
        self.wait_us_max.fetch_max(us, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self, active: usize, enabled: bool) -> DirectStats {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        DirectStats {
            enabled,
            active: active as u64,
            granted: get(&self.granted),
            refused_grants: Refusal::ALL
                .iter()
                .zip(&self.refused)
                .map(|(r, n)| (r.name(), get(n)))
                .collect(),
            taken_back: TakeBack::ALL
                .iter()
                .zip(&self.taken_back)
                .map(|(r, n)| (r.name(), get(n)))
                .collect(),
            merges: get(&self.merges),
            writes: get(&self.records),
            bytes: get(&self.bytes),
            fsyncs: get(&self.fsyncs),
            refused_logs: get(&self.refused_logs),
            wait_timeouts: get(&self.wait_timeouts),
            take_back_wait_us: get(&self.wait_us_total),
            take_back_wait_us_max: get(&self.wait_us_max),
        }
    }
}

/// `nvstack stat`'s `direct`.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct DirectStats {
    /// `--direct-path on`.
    pub enabled: bool,
    /// Delegations held now.
    pub active: u64,
    pub granted: u64,
    /// Grants refused, by reason.
    pub refused_grants: std::collections::BTreeMap<&'static str, u64>,
    /// Take-backs (and merges that kept the delegation: `read`, `fsync`, `full`), by reason.
    pub taken_back: std::collections::BTreeMap<&'static str, u64>,
    /// Merges of a log (each take-back or kept merge that found records).
    pub merges: u64,
    /// The library's writes (records) merged, and their bytes.
    pub writes: u64,
    pub bytes: u64,
    /// fsync and fdatasync calls the library answered itself (as it reported them).
    pub fsyncs: u64,
    /// Logs that failed validation (their valid prefix merged, the delegation ended).
    pub refused_logs: u64,
    /// Take-backs whose wait for a library thread inside an append reached its bound.
    pub wait_timeouts: u64,
    /// Time take-backs waited for library threads inside an append, in total and the longest.
    pub take_back_wait_us: u64,
    pub take_back_wait_us_max: u64,
}
