//! Open files and directories, by the handle number given to the kernel.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::base::sync::{Rank, RwLock};

/// An open lower file with the node it belongs to.
#[derive(Debug)]
pub struct Handle<F> {
    pub node_id: u64,
    pub file: F,
}

#[derive(Debug)]
pub struct HandleTable<F> {
    next: AtomicU64,
    handles: RwLock<HashMap<u64, Arc<Handle<F>>>>,
    /// A limit on open handles, so that a runaway client cannot exhaust the daemon's descriptors.
    max: usize,
}

impl<F> HandleTable<F> {
    pub(crate) fn new(max: usize) -> Self {
        HandleTable {
            next: AtomicU64::new(1),
            handles: RwLock::new(Rank::Handles, HashMap::new()),
            max,
        }
    }

    /// Registers an open file; `None` when the table is full.
    pub(crate) fn insert(&self, node_id: u64, file: F) -> Option<u64> {
        let mut h = self.handles.write();
        if h.len() >= self.max {
            return None;
        }
        let fh = self.next.fetch_add(1, Ordering::Relaxed);
        h.insert(fh, Arc::new(Handle { node_id, file }));
        Some(fh)
    }

    pub(crate) fn get(&self, fh: u64) -> Option<Arc<Handle<F>>> {
        self.handles.read().get(&fh).cloned()
    }

    pub(crate) fn remove(&self, fh: u64) -> Option<Arc<Handle<F>>> {
        self.handles.write().remove(&fh)
    }

    pub(crate) fn len(&self) -> usize {
        self.handles.read().len()
    }
}
