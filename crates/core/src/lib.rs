//! The nvstack engine: what the file system does, independent of how requests arrive.
//!
//! The front end (`fuse`) decodes a request and calls one method here; every method runs as one
//! *operation* ([`ops::Engine::op`]): it is counted, and it runs inside a transaction of the
//! consistency layer (`txn`), so that every mechanism that keeps state in NVRAM (temp files,
//! cached pages, patches) changes it atomically with the operation that caused it. Today the
//! operations pass through to the lower file system and the transaction holds nothing; the
//! request path is already the one the later mechanisms plug into.
//!
//! Code map: `inodes.rs` (node ids <-> lower objects, lookup counts), `handles.rs` (open files),
//! `binding.rs` (the root-area record that ties a region to its lower directory), `ops.rs` (the
//! operations), `stats.rs` (counters), `writeback/` (zone tables and the four write-back policies), `error.rs` (the engine's errors; mapped to errno by the
//! front end in one place).

pub mod binding;
pub mod error;
pub mod handles;
pub mod inodes;
pub mod ops;
pub mod stats;
pub mod writeback;

pub use error::{FsError, FsResult};
pub use ops::{Engine, EngineConfig, Entry};
pub use stats::{Op, Stats};
