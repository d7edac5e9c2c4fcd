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
//! Journal mode ([`Consistency::Journal`], docs/design.md section 12) keeps the same API with
//! the paper's VM-aware journaling underneath: operations join a running group, committed as
//! a whole by [`Pool::group_commit`]; committed pages are write-protected between group
//! commits, a page's first change in a group retains its committed copy in the group log.
//!
//! Code map: `undo.rs` (slot and record formats, rollback), `journal.rs` (the group log's
//! format, its rollback, switching the undo area between formats), `group.rs` (the running
//! group: page covering, group commit, protecting the region), `frames.rs` (descriptor format, free
//! list), `pool.rs` (format, open = recovery, stats, inspect), `tx.rs` (the transaction and its
//! rules), `ranges.rs` (range sets), `slots.rs` (frames divided into slots: the occupancy every packed
//! record kind keeps), `testkit.rs` (the seeded workload the crash tests and the
//! benchmark drive).

pub mod frames;
pub mod group;
pub mod journal;
pub mod pool;
pub mod ranges;
pub mod slots;
pub mod testkit;
pub mod tx;
pub mod undo;

pub use frames::{FrameId, FrameTag};
pub use group::{GroupCommit, JournalStats, OpenOptions};
pub use journal::AreaFormat;
pub use pool::{Consistency, Inspection, Pool, PoolStats, RecoveryReport, inspect};
pub use tx::{Stage, Tx, TxError};
