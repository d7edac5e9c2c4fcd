//! The direct path (issue 45 item 2, docs/direct-path.md): an application's writes to a file
//! the daemon delegated to its process are served in the process by a preload library, durable
//! in a log area of the delegation's own in NVRAM, and merged into the file by the daemon.
//!
//! This crate is what the library and the daemon share: the log format ([`log`]), the library's
//! append and the daemon's validator, the take-back's handshake ([`control`]) and the ioctls
//! through which the library asks ([`ioctl`]). It depends on nothing of nvstack but the region
//! trait, so that the library stays small and never links the engine. The grant, the
//! take-back and the merge live in the daemon (`crates/core/src/direct/`,
//! `crates/core/src/engine/direct.rs`).

pub mod control;
pub mod ioctl;
pub mod log;

pub use log::{
    Damage, Full, HEADER_BYTES, LogError, LogHeader, LogWriter, MAX_RECORD_DATA, Record,
    RecordKind, Scan, format, reset, scan, scan_area,
};
