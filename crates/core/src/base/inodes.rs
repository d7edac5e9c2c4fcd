//! Node ids and the lower objects behind them.
//!
//! The kernel names every object by a node id and tells us, through lookup counts, how long it
//! needs the id: every successful lookup-like reply (lookup, create, mknod, mkdir, symlink, link)
//! adds one, `forget` subtracts. An entry lives while its count is positive; it holds the lower
//! node (an O_PATH descriptor), which keeps the lower inode from being freed and its number
//! from being reused while the kernel may still name it.
//!
//! Node id = the lower inode number when the object is on the lower root's file system (so
//! `st_ino` on the mount equals `st_ino` on the lower directory; fuser reports the node id as
//! st_ino). Objects on another file system mounted inside the lower directory get ids from
//! `FOREIGN_BASE` up. Objects that exist only in NVRAM (temp files: no lower inode yet) have
//! the identity [`Identity::Nvram`] (their serial) and the id `TEMP_BASE + serial`; when one
//! is transformed, its entry is re-keyed to the new lower object and keeps its id while the
//! kernel knows it. The root is always node id 1.
//!
//! Invariants: I1 `by_key` and `nodes` describe the same entries; I2 the root is never removed;
//! I3 an entry's count is the number of replies the kernel has not forgotten.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::base::sync::{Mutex, Rank, RwLock};

pub const ROOT_ID: u64 = 1;
/// Node ids of objects on file systems other than the lower root's start here.
pub const FOREIGN_BASE: u64 = 1 << 62;
/// Node ids of temp files: `TEMP_BASE + serial`.
pub const TEMP_BASE: u64 = 1 << 61;

/// A lower object's volatile identity: its (device, inode number).
pub type Key = (u64, u64);

/// What an inode names, durably enough to find it again while the kernel knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Identity {
    /// A lower object: (device, inode number).
    Lower(u64, u64),
    /// An object that exists only in NVRAM (a temp file), by its serial.
    Nvram(u64),
}

impl Identity {
    pub(crate) fn lower(key: (u64, u64)) -> Identity {
        Identity::Lower(key.0, key.1)
    }

    /// The lower key, for a lower object.
    pub(crate) fn lower_key(self) -> Option<(u64, u64)> {
        match self {
            Identity::Lower(dev, ino) => Some((dev, ino)),
            Identity::Nvram(_) => None,
        }
    }
}

#[derive(Debug)]
pub struct Inode<N> {
    pub id: u64,
    node: RwLock<N>,
    key: Mutex<Identity>,
    lookups: AtomicU64,
}

impl<N: Clone> Inode<N> {
    /// The object behind the id (a clone: it may be replaced by `rekey`).
    pub(crate) fn node(&self) -> N {
        self.node.read().clone()
    }
}

#[derive(Debug)]
struct Tables<N> {
    nodes: HashMap<u64, Arc<Inode<N>>>,
    by_key: HashMap<Identity, u64>,
    next_foreign: u64,
}

/// See the module docs. Lock rule: one RwLock around both maps (I1).
#[derive(Debug)]
pub struct InodeTable<N> {
    root_dev: u64,
    tables: RwLock<Tables<N>>,
}

impl<N: Clone> InodeTable<N> {
    pub(crate) fn new(root: N, root_key: Identity) -> Self {
        let Identity::Lower(root_dev, _) = root_key else { panic!("the root is a lower object") };
        let root = Arc::new(Inode {
            id: ROOT_ID,
            node: RwLock::new(Rank::Inode, root),
            key: Mutex::new(Rank::Inode, root_key),
            lookups: AtomicU64::new(1),
        });
        let mut nodes = HashMap::new();
        nodes.insert(ROOT_ID, root);
        let mut by_key = HashMap::new();
        by_key.insert(root_key, ROOT_ID);
        InodeTable {
            root_dev,
            tables: RwLock::new(Rank::Inodes, Tables { nodes, by_key, next_foreign: FOREIGN_BASE }),
        }
    }

    pub(crate) fn get(&self, id: u64) -> Option<Arc<Inode<N>>> {
        self.tables.read().nodes.get(&id).cloned()
    }

    /// Registers a looked-up lower object (or finds it already registered) and counts one
    /// lookup. `node` is dropped if the object was known.
    pub(crate) fn remember(&self, node: N, key: Identity) -> u64 {
        let mut t = self.tables.write();
        if let Some(&id) = t.by_key.get(&key) {
            let inode = &t.nodes[&id];
            inode.lookups.fetch_add(1, Ordering::Relaxed);
            return id;
        }
        let id = match key {
            Identity::Nvram(serial) => TEMP_BASE + serial,
            Identity::Lower(dev, ino)
                if dev == self.root_dev && ino != ROOT_ID && ino < TEMP_BASE =>
            {
                ino
            }
            Identity::Lower(..) => {
                t.next_foreign += 1;
                t.next_foreign
            }
        };
        assert!(!t.nodes.contains_key(&id), "node id {id} reused while alive (I1)");
        let inode = Arc::new(Inode {
            id,
            node: RwLock::new(Rank::Inode, node),
            key: Mutex::new(Rank::Inode, key),
            lookups: AtomicU64::new(1),
        });
        t.nodes.insert(id, inode);
        t.by_key.insert(key, id);
        id
    }

    /// The kernel forgot `n` lookups of `id`; drops the entry at zero (never the root) and
    /// then returns the key it had.
    pub(crate) fn forget(&self, id: u64, n: u64) -> Option<Identity> {
        if id == ROOT_ID {
            return None;
        }
        let mut t = self.tables.write();
        let inode = t.nodes.get(&id)?;
        // Under the write lock no lookup can race with this update.
        let remaining = inode.lookups.load(Ordering::Relaxed).saturating_sub(n);
        inode.lookups.store(remaining, Ordering::Relaxed);
        if remaining == 0 {
            let key = *inode.key.lock();
            t.nodes.remove(&id);
            t.by_key.remove(&key);
            return Some(key);
        }
        None
    }

    /// The object behind `id` became another (a temp file transformed into a lower file):
    /// the id stays, the key and node change. No-op when the kernel has forgotten `id`.
    pub(crate) fn rekey(&self, id: u64, key: Identity, node: N) {
        let mut t = self.tables.write();
        let Some(inode) = t.nodes.get(&id).cloned() else { return };
        let old = std::mem::replace(&mut *inode.key.lock(), key);
        t.by_key.remove(&old);
        // The new lower object was created by us a moment ago, so no other id can name it.
        let previous = t.by_key.insert(key, id);
        assert!(previous.is_none() || previous == Some(id), "rekey onto a known object (I1)");
        *inode.node.write() = node;
    }

    pub(crate) fn len(&self) -> usize {
        self.tables.read().nodes.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_count_and_forget_drops_at_zero() {
        let t = InodeTable::new("root", Identity::Lower(8, 2));
        let id = t.remember("a", Identity::Lower(8, 100));
        assert_eq!(id, 100);
        assert_eq!(t.remember("a-again", Identity::Lower(8, 100)), 100);
        t.forget(100, 1);
        assert!(t.get(100).is_some());
        t.forget(100, 1);
        assert!(t.get(100).is_none());
        assert_eq!(t.get(ROOT_ID).unwrap().node(), "root");
        t.forget(ROOT_ID, 5);
        assert!(t.get(ROOT_ID).is_some(), "I2");
    }

    #[test]
    fn objects_on_other_devices_get_foreign_ids() {
        let t = InodeTable::new("root", Identity::Lower(8, 2));
        let a = t.remember("x", Identity::Lower(9, 100));
        let b = t.remember("y", Identity::Lower(8, 100));
        assert!(a > FOREIGN_BASE);
        assert_eq!(b, 100);
        assert_eq!(
            t.remember("one", Identity::Lower(8, 1)),
            FOREIGN_BASE + 2,
            "lower inode 1 would collide with the root id"
        );
    }

    #[test]
    fn temp_files_keep_their_id_when_rekeyed() {
        let t = InodeTable::new("root", Identity::Lower(8, 2));
        let id = t.remember("temp", Identity::Nvram(7));
        assert_eq!(id, TEMP_BASE + 7);
        t.rekey(id, Identity::Lower(8, 500), "lower");
        assert_eq!(t.get(id).unwrap().node(), "lower");
        assert_eq!(
            t.remember("again", Identity::Lower(8, 500)),
            id,
            "the lower key now names the same id"
        );
    }
}
