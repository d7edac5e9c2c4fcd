//! The engine: the mechanisms composed. [`Engine`] holds the base and one value per
//! mechanism, and here are the accessors every operation uses: what a node id and an open
//! handle name, and how a handle's IO reaches its lower file (`Via`).
//!
//! The requests of the front end are the public methods in `ops/` (one file per family). Each
//! runs its body through [`Engine::op`]: counted, with an `OpTx` whose transaction begins at
//! its first NVRAM change. Two do not: `write` runs `Engine::attempt` again after making room
//! and counts the request once (`ops/io.rs`), and `forget` only counts. Each first asks what
//! the object is: a lower object (through the page cache, or straight to the lower file
//! system) or a temp file (TempFFS, `tempfs/`). The other public methods are not requests:
//! start-up and shutdown (`start.rs`), what the daemon's threads and tools call
//! (`background.rs`, `clock.rs`, `durability.rs`), the front end's reply policy for routes
//! (`routing.rs`), `nvstack stat` (`stats.rs`), and accessors for tests and tools.
//!
//! State and its owners: `base` (the lower facade, the pool, counters, space reserved for
//! NVRAM data, durability), `journal` (the metadata journal), `temp` (TempFFS with its
//! overlay, and the tables of node ids and open handles), `cache` (the page cache), `routes`
//! (routes and the route profile), `xattrs` (served or refused). Policy across mechanisms:
//! `pressure.rs`. Lock order: `base/sync.rs`.

mod background;
mod clock;
pub(crate) mod direct;
mod durability;
mod ops;
mod pressure;
pub mod routing;
pub mod start;
pub mod stats;

use std::sync::Arc;

use lower::{Attr, LowerFs};
use txn::Pool;

use crate::base::counters::Op;
use crate::base::error::{FsError, FsResult, answer};
use crate::base::handles::Handle;
use crate::base::inodes::{Identity, Inode, ROOT_ID};
use crate::base::{Base, Entry, Failpoints, OpTx};
use crate::cache::{CacheConfig, PageCache};
use crate::tempfs::names::{Obj, Open};
use crate::tempfs::{Fate, TempConfig, TempFile, TempFs};

/// Limits and knobs of an engine, fixed at mount. The default (with the nested configurations'
/// defaults) is what `nvstack mount` runs with when no flag is given: the mount's flags take
/// their defaults from here, so each is written once. Knobs that depend on the region are
/// shares of it, resolved by `Engine::new` (`CacheConfig::limits`, `TempConfig::limits`).
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Most open files and directories at once.
    pub max_handles: usize,
    /// The temp-file store (TempFFS).
    pub temp: TempConfig,
    /// Most directories the recovery walk visits to find a directory by its handle when the
    /// lower file system cannot open handles directly (unprivileged daemon).
    pub max_walk: usize,
    pub failpoints: Option<Arc<dyn Failpoints>>,
    /// Extended attributes served (on) or refused with ENOSYS, after which the kernel stops
    /// asking (it otherwise asks for security.capability before every write(2), because FUSE
    /// super blocks lack SB_NOSEC).
    pub xattrs: bool,
    /// The NVRAM page cache and its write-back.
    pub cache: CacheConfig,
    /// The metadata journal's checkpoints.
    pub journal: crate::journal::JournalConfig,
    /// Opens of lower files may take kernel passthrough (`route/`, `--passthrough`); the front
    /// end turns it off when the kernel or the privilege is missing. Off with
    /// `FsyncRequests::Spare` (a passthrough file's fsync must reach the lower file).
    pub passthrough: bool,
    /// Whether the kernel sends FSYNC and FSYNCDIR (`--fsync-requests`, E2 in
    /// `base/durability.rs`); `Spare` needs undo mode.
    pub fsync_requests: crate::base::durability::FsyncRequests,
    /// The direct path (`--direct-path on`, docs/direct-path.md): where delegations' log
    /// areas are made; `None` refuses every grant.
    pub direct_logs: Option<Arc<dyn crate::direct::LogAreas>>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            max_handles: 1 << 16,
            temp: TempConfig::default(),
            max_walk: 1 << 20,
            failpoints: None,
            xattrs: true,
            cache: CacheConfig::default(),
            journal: crate::journal::JournalConfig::default(),
            passthrough: true,
            fsync_requests: crate::base::durability::FsyncRequests::Forward,
            direct_logs: None,
        }
    }
}

/// See the module docs.
#[derive(Debug)]
pub struct Engine<L: LowerFs> {
    /// The services every mechanism borrows: the lower facade, the pool, counters, space.
    pub(crate) base: Base<L>,
    /// The metadata journal: lower namespace and attribute changes durable in NVRAM.
    pub(crate) journal: crate::journal::Journal,
    /// TempFFS with its overlay, and the tables of what the kernel names (node ids, open
    /// handles) over the merged namespace.
    pub(crate) temp: TempFs<L>,
    /// The NVRAM page cache of lower files, with its patches and write-back.
    pub(crate) cache: PageCache<L>,
    pub(crate) xattrs: bool,
    /// The route of each open file (NVRAM path or passthrough) and the route profile.
    pub(crate) routes: crate::route::Routes,
    /// The direct path's delegations (`direct/`).
    pub(crate) direct: crate::direct::Delegations,
}

/// How a handle's IO reaches its lower file (see [`Engine::via`]).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Via {
    /// Through the page cache (a regular file).
    Cache((u64, u64)),
    /// A regular file opened with O_DIRECT or in passthrough: to the lower file, written back
    /// first.
    Direct((u64, u64)),
    /// Not a regular file (device, FIFO): straight through.
    Plain,
}

/// The node of a stale id is an error the kernel should never cause; report ESTALE.
pub(crate) fn stale(id: u64) -> FsError {
    FsError::Stale(id)
}

impl<L: LowerFs> Engine<L> {
    /// Runs one operation: counted, inside a transaction (begun on first use) that commits if
    /// `f` succeeds and aborts (rolling back its NVRAM changes) if it fails.
    pub(crate) fn op<T>(
        &self,
        op: Op,
        f: impl FnOnce(&mut OpTx<'_>) -> FsResult<T>,
    ) -> FsResult<T> {
        let result = self.attempt(f);
        self.base.counters.request(op, result.is_ok());
        result
    }

    /// One attempt of an operation, as `op` runs it but not counted: for a caller that may try
    /// again (a write that found NVRAM full) and counts the request once, with the answer the
    /// kernel gets.
    pub(crate) fn attempt<T>(&self, f: impl FnOnce(&mut OpTx<'_>) -> FsResult<T>) -> FsResult<T> {
        // The transaction begins at the first change of NVRAM state: an operation that only
        // passes through to the lower file system holds no undo slot while it waits for it.
        let mut otx = OpTx::new(&self.base.pool);
        let result = f(&mut otx);
        let result = otx.end(result);
        self.journal.checkpoint_if_full(&self.base);
        result
    }

    pub(crate) fn inode(&self, id: u64) -> FsResult<Arc<Inode<Obj<L::Node>>>> {
        self.temp.nodes.get(id).ok_or_else(|| stale(id))
    }

    /// The object behind a node id.
    pub(crate) fn obj(&self, id: u64) -> FsResult<Obj<L::Node>> {
        Ok(self.inode(id)?.node())
    }

    /// The lower object behind a node id; a temp file that is still in NVRAM yields `Err`
    /// with the file, so callers that need a lower object can transform it first.
    pub(crate) fn lower_obj(&self, id: u64) -> FsResult<Result<Arc<L::Node>, Arc<TempFile>>> {
        Ok(match self.obj(id)? {
            Obj::Lower(n) => Ok(n),
            Obj::Temp(f) => Err(f),
        })
    }

    /// A directory (always a lower object); a temp file is not one.
    pub(crate) fn dir(&self, id: u64) -> FsResult<Arc<L::Node>> {
        match self.obj(id)? {
            Obj::Lower(n) => Ok(n),
            Obj::Temp(_) => Err(answer(libc::ENOTDIR)),
        }
    }

    pub(crate) fn handle(&self, fh: u64) -> FsResult<Arc<Handle<Open<L>>>> {
        self.temp.handles.get(fh).ok_or_else(|| stale(fh))
    }

    pub(crate) fn entry(&self, node: L::Node, attr: Attr) -> Entry {
        self.entry_of(Arc::new(node), attr)
    }

    pub(crate) fn entry_of(&self, node: Arc<L::Node>, attr: Attr) -> Entry {
        let key = self.base.lower.key(&node);
        let node_id = self.temp.nodes.remember(Obj::Lower(node), Identity::lower(key));
        Entry { node_id, attr: self.shown_attr(key, attr) }
    }

    /// A lower object's attributes as the mount shows them: a cached file's size and times
    /// from its record, a directory's times with its pending ones.
    pub(crate) fn shown_attr(&self, key: (u64, u64), mut attr: Attr) -> Attr {
        match attr.kind() {
            lower::FileKind::Regular => self.cache.cached_attr(key, &mut attr),
            lower::FileKind::Directory => self.temp.dir_times_over(key, &mut attr),
            _ => {}
        }
        attr
    }

    pub fn pool(&self) -> &Pool {
        &self.base.pool
    }

    pub(crate) fn register(&self, node_id: u64, file: Open<L>) -> FsResult<u64> {
        // Too many open files: the lower file system would say EMFILE too.
        self.temp.handles.insert(node_id, file).ok_or(answer(libc::EMFILE))
    }

    /// The lower file of an open handle: the handle's own, or (for a temp file that has been
    /// transformed since it was opened) the lower file opened now.
    pub(crate) fn lower_file<'h>(&self, h: &'h Handle<Open<L>>) -> FsResult<&'h L::File> {
        match &h.file {
            Open::Lower { file, .. } | Open::Dir { file, .. } => Ok(file),
            Open::Temp { lower, flags, .. } => {
                if let Some(file) = lower.get() {
                    return Ok(file);
                }
                let Obj::Lower(node) = self.obj(h.node_id)? else {
                    return Err(stale(h.node_id));
                };
                let file = self.base.lower.open(&node, *flags)?;
                // Two threads may race here; the loser's descriptor is simply closed.
                let _ = lower.set(file);
                Ok(lower.get().expect("set above"))
            }
        }
    }

    /// How IO on an open lower object (or a transformed temp file) reaches the lower file.
    pub(crate) fn via(&self, h: &Handle<Open<L>>) -> FsResult<Via> {
        Ok(match &h.file {
            Open::Lower { key, regular: true, direct: false, passthrough: false, .. } => {
                Via::Cache(*key)
            }
            Open::Lower { key, regular: true, .. } => Via::Direct(*key),
            Open::Lower { .. } | Open::Dir { .. } => Via::Plain,
            Open::Temp { .. } => match self.obj(h.node_id)? {
                Obj::Lower(n) => Via::Cache(self.base.lower.key(&n)),
                Obj::Temp(_) => Via::Plain,
            },
        })
    }

    /// The temp file behind a node id, if it is one and still in NVRAM (tests, tools).
    pub fn temp_file(&self, node_id: u64) -> Option<Arc<TempFile>> {
        match self.obj(node_id) {
            Ok(Obj::Temp(f)) if f.lock().fate == Fate::Resident => Some(f),
            _ => None,
        }
    }

    /// The root's node id (always 1).
    pub fn root_id(&self) -> u64 {
        ROOT_ID
    }
}
