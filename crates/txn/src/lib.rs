//! Undo-log transactions on the NVRAM region: the thesis' lightweight transaction support
//! (section 3.1.3, Figures 3.5-3.8), and the transactional frame allocator.
//!
//! ```text
//!   let mut tx = pool.begin();           // transaction_start()
//!   tx.snapshot(off, len)?;               // duplicate(): old bytes -> undo log, persisted
//!   tx.write(off, &new_bytes);            // modify in place
//!   let frame = tx.alloc_frame(tag)?;     // allocation recorded: undone by recovery
//!   tx.commit();                          // transaction_stop(): persist, clear log = commit
//! ```
//!
//! Every completed operation is atomic and durable without any IO outside NVRAM: before a byte
//! changes, its old value is in the undo log; committing clears the log; recovery at open
//! ([`Pool::open`]) writes back the old values of every transaction that had not committed.
//!
//! Code map: `undo.rs` (slot and record formats, rollback), `frames.rs` (descriptor format, free
//! list), `pool.rs` (format, open = recovery, stats, inspect), `tx.rs` (the transaction and its
//! rules), `ranges.rs` (range sets), `testkit.rs` (the seeded workload the crash tests and the
//! benchmark drive).

pub mod frames;
pub mod pool;
pub mod ranges;
pub mod testkit;
pub mod tx;
pub mod undo;

pub use frames::{FrameId, FrameTag};
pub use pool::{Consistency, Inspection, Pool, PoolStats, RecoveryReport, inspect};
pub use tx::{Stage, Tx, TxError};
