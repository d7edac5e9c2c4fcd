//! The one transaction idiom of the engine: every NVRAM change happens in an [`OpTx`].
//!
//! - An operation (one request) runs in `Engine::op` (`engine/`), which hands it an `OpTx`; the
//!   transaction begins at the operation's first NVRAM change ([`OpTx::tx`]) and ends when the
//!   operation returns: committed if it succeeded, rolled back if it failed.
//! - Code that changes NVRAM state under a lock ends the transaction itself with
//!   [`OpTx::end`] *before* it releases the lock (strict two-phase locking: no other
//!   transaction may snapshot bytes this one changed until it has committed or rolled back),
//!   and only then updates the volatile mirror of that state. A later change in the same
//!   operation gets a new transaction from [`OpTx::tx`].
//! - Work outside a request (a transform step, a write-back batch, recovery) uses
//!   [`Base::atomically`](super::Base::atomically): one closure, one transaction, committed if
//!   it returns `Ok`.
//!
//! A running transaction holds an undo slot, registered with the lock checker as rank
//! `UndoSlot` (`sync.rs`): no lower call and no wait may happen while it runs, so a slot is
//! only ever held for NVRAM-speed work and a region's few slots never queue behind a disk.

use txn::{Pool, Tx, TxError};

use super::error::FsResult;
use super::sync::{Held, Rank};

/// See the module docs.
#[derive(Debug)]
pub struct OpTx<'p> {
    pool: &'p Pool,
    tx: Option<(Tx<'p>, Held)>,
}

impl<'p> OpTx<'p> {
    pub(crate) fn new(pool: &'p Pool) -> Self {
        OpTx { pool, tx: None }
    }

    /// The running transaction, begun now if there is none (this may wait for a free undo
    /// slot).
    pub(crate) fn tx(&mut self) -> &mut Tx<'p> {
        let pool = self.pool;
        &mut self
            .tx
            .get_or_insert_with(|| {
                // Registered first: taking a slot while holding a later rank is the bug.
                let held = Held::token(Rank::UndoSlot);
                (pool.begin(), held)
            })
            .0
    }

    /// True while a transaction is running (begun and not ended).
    pub(crate) fn is_running(&self) -> bool {
        self.tx.is_some()
    }

    /// Commits (on `Ok`) or rolls back (on `Err`) now, and passes the result on.
    pub(crate) fn end<T>(&mut self, result: FsResult<T>) -> FsResult<T> {
        if let Some((tx, held)) = self.tx.take() {
            match &result {
                Ok(_) => tx.commit(),
                Err(_) => tx.abort(),
            }
            drop(held);
        }
        result
    }
}

/// Stores `after` over `before` at `off`, changing (and snapshotting) only the bytes that
/// differ: a rewrite of a handle in a record costs its length, not the record's.
pub(crate) fn rewrite(
    tx: &mut Tx<'_>,
    off: u64,
    before: &[u8],
    after: &[u8],
) -> Result<(), TxError> {
    let mut i = 0;
    while i < after.len() {
        if before[i] == after[i] {
            i += 1;
            continue;
        }
        let start = i;
        while i < after.len() && before[i] != after[i] {
            i += 1;
        }
        tx.update(off + start as u64, &after[start..i])?;
    }
    Ok(())
}
