//! The nvstack engine: what the file system does, independent of how requests arrive.
//!
//! The front end (`fuse`) decodes a request and calls one method here; every method runs as one
//! *operation* ([`ops::Engine::op`]): it is counted, and it runs inside a transaction of the
//! consistency layer (`txn`), so that every mechanism that keeps state in NVRAM (temp files,
//! cached pages, patches) changes it atomically with the operation that caused it. New regular
//! files are temp files (TempFFS, `tempfs/`, `overlay.rs`, `transform.rs`); everything else
//! passes through to the lower file system.
//!
//! Code map: `inodes.rs` (node ids <-> lower objects, lookup counts), `handles.rs` (open files),
//! `binding.rs` (the root-area record that ties a region to its lower directory), `ops.rs` (the
//! operations), `overlay.rs` (the namespace overlay and temp-file operations), `tempfs/` (temp
//! file records, data frames, index), `transform.rs` (temp file -> lower file, start-up
//! recovery), `stats.rs` (counters), `writeback/` (zone tables and the four write-back policies), `error.rs` (the engine's errors; mapped to errno by the
//! front end in one place).

pub mod binding;
pub mod cache;
pub mod cached;
pub mod error;
pub mod flusher;
pub mod handles;
pub mod inodes;
pub mod ops;
pub mod overlay;
pub mod stats;
pub mod tempfs;
pub mod transform;
pub mod writeback;

pub use cache::{CacheConfig, Reason};
pub use error::{FsError, FsResult};
pub use ops::{Engine, EngineConfig, Entry, Failpoints};
pub use stats::{Op, Stats};
pub use tempfs::{TempConfig, Trigger};
pub use transform::StartError;
