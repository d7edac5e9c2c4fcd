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

use lower::{DirEntry, FileKind, LowerFs};

use crate::base::Base;
use crate::base::error::{FsResult, answer};
use crate::base::handles::Handle;
use crate::base::inodes::TEMP_BASE;
use crate::tempfs::TempFs;
use crate::tempfs::names::Open;
use crate::tempfs::{self, TempFile};
pub use times::DirTimes;

pub(crate) mod pending;
pub mod times;

/// The volatile identity of a lower directory: its (device, inode) key.
pub type DirKey = (u64, u64);

/// Most entries of a merged directory listing (it is held in memory per open directory).
pub const MAX_LISTING: usize = 1 << 22;

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
    pub fn get(&self, dir: DirKey, name: &OsStr) -> Option<&Arc<TempFile>> {
        self.dirs.get(&dir).and_then(|d| d.names.get(name))
    }

    pub fn has_entries(&self, dir: DirKey) -> bool {
        self.dirs.get(&dir).is_some_and(|d| !d.names.is_empty())
    }

    /// Removes a name; drops the directory's entry (and its pin) when it was the last and no
    /// times are pending.
    pub fn remove_name(&mut self, dir: DirKey, name: &OsStr) -> Option<Arc<TempFile>> {
        let d = self.dirs.get_mut(&dir)?;
        let f = d.names.remove(name);
        if d.names.is_empty() && d.times.is_none() {
            self.dirs.remove(&dir);
        }
        f
    }

    /// The directory's entry, made (pinning `node`) if it has none.
    pub fn dir_entry(&mut self, dir: DirKey, node: &Arc<N>, handle: &[u8]) -> &mut Dir<N> {
        self.dirs.entry(dir).or_insert_with(|| Dir {
            node: Arc::clone(node),
            handle: handle.to_vec(),
            names: BTreeMap::new(),
            times: None,
        })
    }

    /// Directories with pending times and no temp files (those whose record a settle frees).
    pub fn times_only(&self) -> usize {
        self.dirs.values().filter(|d| d.names.is_empty() && d.times.is_some()).count()
    }

    pub fn insert_name(
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

impl<L: LowerFs> TempFs<L> {
    /// Lists a directory for readdir: the lower entries (nvstack's hidden names left out) and,
    /// when the directory holds temp files, the merged snapshot (see `Open::Dir`).
    pub(crate) fn list_merged(
        &self,
        b: &Base<L>,
        h: &Handle<Open<L>>,
        offset: u64,
        emit: &mut dyn FnMut(&Listed) -> bool,
    ) -> FsResult<()> {
        let Open::Dir { file, key, listing } = &h.file else {
            return Err(answer(libc::ENOTDIR));
        };
        let snapshot = {
            let mut l = listing.lock();
            if offset == 0 {
                *l = if self.overlay.lock().has_entries(*key) {
                    Some(Arc::new(self.snapshot_dir(b, file, *key)?))
                } else {
                    None
                };
            }
            l.clone()
        };
        if let Some(entries) = snapshot {
            for l in entries.iter().skip(offset as usize) {
                if !emit(l) {
                    break;
                }
            }
            return Ok(());
        }
        b.lower.readdir(file, offset, &mut |entry| {
            if tempfs::is_hidden(&entry.name) {
                return true;
            }
            emit(&Listed { entry, temp: None })
        })?;
        Ok(())
    }

    /// The merged listing: the overlay's names read *before* the lower directory, so that a
    /// name moving from the overlay into the lower directory meanwhile (a transform) is in
    /// one of the two; a name in both is listed once, as the temp file.
    fn snapshot_dir(&self, b: &Base<L>, file: &L::File, key: DirKey) -> FsResult<Vec<Listed>> {
        let temps = self.overlay.lock().dirs.get(&key).map(|d| d.names.clone()).unwrap_or_default();
        let mut lower_entries = Vec::new();
        let mut too_many = false;
        b.lower.readdir(file, 0, &mut |e| {
            if lower_entries.len() >= MAX_LISTING {
                too_many = true;
                return false;
            }
            lower_entries.push(e);
            true
        })?;
        if too_many {
            return Err(answer(libc::EOVERFLOW));
        }
        let mut out = Vec::with_capacity(lower_entries.len() + temps.len());
        for e in lower_entries {
            if tempfs::is_hidden(&e.name) || temps.contains_key(&e.name) {
                continue; // hidden, or shadowed by a temp file (O1)
            }
            out.push(Listed { entry: e, temp: None });
        }
        for (name, f) in temps {
            out.push(Listed {
                entry: DirEntry {
                    ino: TEMP_BASE + f.serial,
                    offset: 0,
                    kind: Some(FileKind::Regular),
                    name,
                },
                temp: Some(f),
            });
        }
        for (i, l) in out.iter_mut().enumerate() {
            l.entry.offset = i as u64 + 1;
        }
        Ok(out)
    }
}
