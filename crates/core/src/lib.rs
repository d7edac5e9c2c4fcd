//! The nvstack engine: what the file system does, independent of how requests arrive.
//!
//! The front end (`fuse`) decodes a request and calls one public method of [`Engine`]; nearly
//! every one runs as one *operation* (`Engine::op`; a write may make several attempts, and
//! `forget` is only counted): it is counted, and its NVRAM changes are made in transactions of
//! the consistency layer (`txn`, through `base::OpTx`), committed if it succeeds and rolled
//! back if it fails, so that every mechanism that keeps state in NVRAM (temp files, cached
//! pages, journal records) changes it together with the operation that caused it.
//!
//! The crate is divided into rooms, one folder each, listed here in the order in which they
//! may use each other: a room uses only the rooms above it, and no file is part of an import
//! cycle (`crates/core/tests/rooms.rs` checks both; ARCHITECTURE.md, "Rooms and their edges",
//! has the rule and the code map).
//! - `base/`: the services every mechanism borrows (`Base`: the lower-FS facade `Lower`, the
//!   pool, counters, space reserved for NVRAM data, durability, failpoints) and the building
//!   blocks (ranked locks, record slots, node and handle tables, frame kinds, errors).
//! - `journal/`: the metadata journal (`Journal`): redo records, checkpoint, replay.
//! - `cache/`: the NVRAM page cache (`PageCache`): dirty pages, patches, write-back.
//! - `tempfs/`: TempFFS (`TempFs`) and its overlay (`tempfs/overlay/`).
//! - `route/`: which path an open takes, NVRAM or kernel passthrough (`Routes`).
//! - `direct/`: the direct path's delegations (`Delegations`): the table, the log areas, the
//!   counters (the grant, merge and take-back compose the write path in `engine/direct.rs`).
//! - `engine/`: [`Engine`], composing them: the operations (`engine/ops/`), start and
//!   shutdown, the clock, durability calls, NVRAM pressure, stats.

pub mod base;
pub mod cache;
pub mod direct;
pub mod engine;
pub mod journal;
pub mod route;
pub mod tempfs;

pub use base::Entry;
pub use base::binding;
pub use base::counters::Op;
pub use base::durability::FsyncRequests;
pub use base::error::StartError;
pub use base::error::{FsError, FsResult};
pub use base::incidents::Incident;
pub use base::share::Share;
pub use base::{Failpoints, sync};
pub use cache::{CacheConfig, CacheLimits, Nbw, PatchLimit, Reason, WritebackPolicy};
pub use direct::{DirectStats, LogAreas, Refusal, TakeBack};
pub use engine::direct::{Caller, Merged, TakenBack};
pub use engine::routing::writable;
pub use engine::stats::Stats;
pub use engine::{Engine, EngineConfig};
pub use journal::JournalConfig;
pub use tempfs::{TempConfig, TempLimits, Trigger};
