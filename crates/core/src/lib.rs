//! The nvstack engine: what the file system does, independent of how requests arrive.
//!
//! The front end (`fuse`) decodes a request and calls one method of [`Engine`]; every method
//! runs as one *operation* (`Engine::op`): it is counted, and it runs inside a transaction of
//! the consistency layer (`txn`), so that every mechanism that keeps state in NVRAM (temp
//! files, cached pages) changes it atomically with the operation that caused it.
//!
//! Code map (the folder layout is the architecture; dependencies point down this list):
//! - `engine/`: the engine's state and accessors (`mod.rs`), the transaction idiom
//!   (`optx.rs`), start-up and shutdown (`start.rs`), lower-FS space reserved for NVRAM data
//!   (`space.rs`).
//! - `ops/`: the operations, one file per family (names, attrs, files, io, dirs).
//! - `tempfs/`: TempFFS - temp-file record and data-frame formats, operations on temp files,
//!   rename over the merged namespace, the transform protocol, recovery.
//! - `cache/`: the NVRAM page cache - cached-file record, volatile state, operations through
//!   the cache, write-back, the four policies and zone tables (`policy/`), recovery.
//! - `overlay/`: what NVRAM adds to the lower namespace (temp-file names), merged listings.
//! - `route/`: which path an open file takes (NVRAM or kernel passthrough to the lower
//!   file), the rule and the durable route profile.
//! - `journal/`: every namespace and attribute change of a lower object, applied through the
//!   facade and accounted for (durability).
//! - `lowerfs.rs`: the one facade through which every lower call goes (L1: never under a
//!   short lock or an undo slot).
//! - `share.rs`: limits that depend on the region (a percentage of its frames, or frames),
//!   resolved once at start.
//! - `slots.rs`: records packed eight to a frame (temp files' and cached files'), the
//!   volatile list of taken slots.
//! - `sync.rs`: the ranked locks and the one lock order, checked in debug builds.
//! - `inodes.rs` (node ids and identities), `handles.rs` (open files), `binding.rs` (the
//!   root-area record tying a region to its lower directory), `stats.rs` (counters),
//!   `error.rs` (typed errors; mapped to errno by the front end in one place).

pub mod base;
pub mod cache;
pub mod engine;
pub mod journal;
pub mod route;
pub mod tempfs;

pub use base::Entry;
pub use base::binding;
pub use base::counters::Op;
pub use base::error::StartError;
pub use base::error::{FsError, FsResult};
pub use base::incidents::Incident;
pub use base::share::Share;
pub use base::{Failpoints, sync};
pub use cache::{CacheConfig, CacheLimits, Nbw, PatchLimit, Reason, WritebackPolicy};
pub use engine::stats::Stats;
pub use engine::{Engine, EngineConfig};
pub use journal::JournalConfig;
pub use tempfs::{TempConfig, TempLimits, Trigger};
