//! The one transaction idiom of the engine: every NVRAM change happens in an [`OpTx`].
//!
//! - An operation (one request) runs in [`Engine::op`], which hands it an `OpTx`; the
//!   transaction begins at the operation's first NVRAM change ([`OpTx::tx`]) and ends when the
//!   operation returns: committed if it succeeded, rolled back if it failed.
//! - Code that changes NVRAM state under a lock ends the transaction itself with
//!   [`OpTx::end`] *before* it releases the lock (strict two-phase locking: no other
//!   transaction may snapshot bytes this one changed until it has committed or rolled back),
//!   and only then updates the volatile mirror of that state. A later change in the same
//!   operation gets a new transaction from [`OpTx::tx`].
//! - Work outside a request (a transform step, a write-back batch, recovery) uses
//!   [`Engine::atomically`]: one closure, one transaction, committed if it returns `Ok`.
//!
//! A running transaction holds an undo slot, registered with the lock checker as rank
//! `UndoSlot` (`sync.rs`): no lower call and no wait may happen while it runs, so a slot is
//! only ever held for NVRAM-speed work and a region's few slots never queue behind a disk.

use lower::LowerFs;
use txn::{Pool, Tx, TxError};

use super::Engine;
use crate::error::{FsError, FsResult};
use crate::stats::Op;
use crate::sync::{Held, Rank};

/// See the module docs.
#[derive(Debug)]
pub struct OpTx<'p> {
    pool: &'p Pool,
    tx: Option<(Tx<'p>, Held)>,
}

impl<'p> OpTx<'p> {
    pub fn new(pool: &'p Pool) -> Self {
        OpTx { pool, tx: None }
    }

    /// The running transaction, begun now if there is none (this may wait for a free undo
    /// slot).
    pub fn tx(&mut self) -> &mut Tx<'p> {
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
    pub fn is_running(&self) -> bool {
        self.tx.is_some()
    }

    /// Commits (on `Ok`) or rolls back (on `Err`) now, and passes the result on.
    pub fn end<T>(&mut self, result: FsResult<T>) -> FsResult<T> {
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

impl<L: LowerFs> Engine<L> {
    /// Runs one operation: counted, inside a transaction (begun on first use) that commits if
    /// `f` succeeds and aborts (rolling back its NVRAM changes) if it fails.
    pub(crate) fn op<T>(
        &self,
        op: Op,
        f: impl FnOnce(&mut OpTx<'_>) -> FsResult<T>,
    ) -> FsResult<T> {
        let result = self.attempt(f);
        self.counters.request(op, result.is_ok());
        result
    }

    /// One attempt of an operation, as `op` runs it but not counted: for a caller that may try
    /// again (a write that found NVRAM full) and counts the request once, with the answer the
    /// kernel gets.
    pub(crate) fn attempt<T>(&self, f: impl FnOnce(&mut OpTx<'_>) -> FsResult<T>) -> FsResult<T> {
        // The transaction begins at the first change of NVRAM state: an operation that only
        // passes through to the lower file system holds no undo slot while it waits for it.
        let mut otx = OpTx::new(&self.pool);
        let result = f(&mut otx);
        let result = otx.end(result);
        self.checkpoint_if_full();
        result
    }

    /// One transaction around `f`, outside any operation: committed if `f` returns `Ok`,
    /// rolled back (leaving NVRAM as it was) if it returns `Err`.
    pub(crate) fn atomically<T>(
        &self,
        f: impl FnOnce(&mut Tx<'_>) -> Result<T, TxError>,
    ) -> FsResult<T> {
        let mut otx = OpTx::new(&self.pool);
        let result = f(otx.tx()).map_err(FsError::from);
        otx.end(result)
    }
}
