//! The overlay: what NVRAM adds to the namespace of the lower directories (design.md section 10, "The overlay").
//!
//! Directories always live in the lower file system. The overlay holds, per lower directory
//! (by its volatile key, and pinned by its node), the names that exist only in NVRAM: temp
//! files (TempFFS); a temp file that shadows a lower file of the same name (rule O1) is the
//! pending removal of that file. Objects named here have no lower identity yet: the inode
//! table knows them as `Identity::Nvram(serial)`. Lookups consult the overlay before the lower
//! directory; readdir of a directory with overlay names is a merged snapshot.
//!
//! The overlay is one short lock (rank `Overlay`, `sync.rs`): it is held only for in-memory
//! work and NVRAM commits, never across a lower call. Rules that keep the merged view right
//! without holding it across lower calls:
//! - a name moves from the overlay to the lower directory (transform) by a lower rename first
//!   and the overlay's removal after, so a lookup that reads the overlay before the lower
//!   directory always finds it in one of the two;
//! - a merged listing reads the overlay's names *before* the lower directory, for the same
//!   reason, and a name found in both is listed once (as the temp file, whose state says
//!   whether it was transformed meanwhile).

use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::sync::Arc;

use lower::DirEntry;

use crate::base::sync::Mutex;
use crate::tempfs::file::TempFile;
pub use times::DirTimes;

pub(crate) mod pending;
pub mod times;

/// The volatile identity of a lower directory: its (device, inode) key.
pub type DirKey = crate::base::inodes::Key;

/// Most entries of a merged directory listing (it is held in memory per open directory).
pub const MAX_LISTING: usize = 1 << 22;

/// An open directory's merged listing, taken at offset 0 (rank `Listing`; `None` while the
/// directory holds no temp files).
pub type Listing = Mutex<Option<Arc<Vec<Listed>>>>;

/// One entry of a merged directory listing (a directory holding temp files).
#[derive(Debug, Clone)]
pub struct Listed {
    pub entry: DirEntry,
    pub temp: Option<Arc<TempFile>>,
}

/// A lower directory holding temp files: its pinned node and its named temp files.
#[derive(Debug)]
pub struct Dir<N> {
    pub node: Arc<N>,
    pub handle: Vec<u8>,
    pub names: BTreeMap<OsString, Arc<TempFile>>,
    /// The directory's pending times (`times.rs`) and the frame of their record. P3: every
    /// directory holding temp files has one.
    pub times: Option<(txn::FrameId, DirTimes)>,
}

/// See the module docs.
#[derive(Debug)]
pub struct Overlay<N> {
    /// Lower directories holding temp files, by key.
    pub dirs: HashMap<DirKey, Dir<N>>,
    /// Every temp file in NVRAM (named or unlinked but open), by serial.
    pub temps: BTreeMap<u64, Arc<TempFile>>,
    /// The serial of the next temp file.
    pub next_serial: u64,
}

impl<N> Default for Overlay<N> {
    fn default() -> Self {
        Overlay { dirs: HashMap::new(), temps: BTreeMap::new(), next_serial: 1 }
    }
}

impl<N> Overlay<N> {
    pub(crate) fn get(&self, dir: DirKey, name: &OsStr) -> Option<&Arc<TempFile>> {
        self.dirs.get(&dir).and_then(|d| d.names.get(name))
    }

    pub(crate) fn has_entries(&self, dir: DirKey) -> bool {
        self.dirs.get(&dir).is_some_and(|d| !d.names.is_empty())
    }

    /// Removes a name; drops the directory's entry (and its pin) when it was the last and no
    /// times are pending.
    pub(crate) fn remove_name(&mut self, dir: DirKey, name: &OsStr) -> Option<Arc<TempFile>> {
        let d = self.dirs.get_mut(&dir)?;
        let f = d.names.remove(name);
        if d.names.is_empty() && d.times.is_none() {
            self.dirs.remove(&dir);
        }
        f
    }

    /// The directory's entry, made (pinning `node`) if it has none.
    pub(crate) fn dir_entry(&mut self, dir: DirKey, node: &Arc<N>, handle: &[u8]) -> &mut Dir<N> {
        self.dirs.entry(dir).or_insert_with(|| Dir {
            node: Arc::clone(node),
            handle: handle.to_vec(),
            names: BTreeMap::new(),
            times: None,
        })
    }

    /// Directories with pending times and no temp files (those whose record a settle frees).
    pub(crate) fn times_only(&self) -> usize {
        self.dirs.values().filter(|d| d.names.is_empty() && d.times.is_some()).count()
    }

    pub(crate) fn insert_name(
        &mut self,
        dir: DirKey,
        node: &Arc<N>,
        handle: &[u8],
        name: &OsStr,
        f: Arc<TempFile>,
    ) {
        self.dir_entry(dir, node, handle).names.insert(name.to_os_string(), f);
    }
}
