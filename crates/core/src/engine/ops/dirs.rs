//! Directories: opendir, readdir (merged with the overlay), readdirplus, releasedir,
//! fsyncdir, and statfs.

use lower::{DirEntry, LowerFs, StatFs};

use crate::base::Entry;
use crate::base::counters::{Counters, Op};
use crate::base::error::{FsResult, answer};
use crate::base::handles::Handle;
use crate::base::inodes::ROOT_ID;
use crate::base::sync::{Mutex, Rank};
use crate::engine::{Engine, stale};
use crate::tempfs::Fate;
use crate::tempfs::names::{Obj, Open};
use crate::tempfs::overlay::{DirKey, Listing};

impl<L: LowerFs> Engine<L> {
    pub fn opendir(&self, node_id: u64) -> FsResult<u64> {
        self.op(Op::Opendir, |_| {
            let node = self.dir(node_id)?;
            let dir = self.base.lower.opendir(&node)?;
            let key = self.base.lower.key(&node);
            self.register(
                node_id,
                Open::Dir { file: dir, key, listing: Mutex::new(Rank::Listing, None) },
            )
        })
    }

    /// Lists entries after `offset`; `emit` returns false when the reply buffer is full.
    pub fn readdir(
        &self,
        fh: u64,
        offset: u64,
        emit: &mut dyn FnMut(DirEntry) -> bool,
    ) -> FsResult<()> {
        self.op(Op::Readdir, |_| {
            let h = self.handle(fh)?;
            self.temp.list_merged(&self.base, Self::open_dir(&h)?, offset, &mut |l| {
                emit(l.entry.clone())
            })
        })
    }

    /// Lists entries after `offset` with their lookups (readdirplus): every entry except "."
    /// and ".." is looked up and counts as one kernel lookup. `emit` returns false when the
    /// reply buffer is full; that entry's lookup is then forgotten again, since the kernel never
    /// saw it.
    pub fn readdirplus(
        &self,
        fh: u64,
        offset: u64,
        emit: &mut dyn FnMut(&DirEntry, Option<&Entry>) -> bool,
    ) -> FsResult<()> {
        self.op(Op::Readdir, |_| {
            let handle = self.handle(fh)?;
            let dir = self.dir(handle.node_id)?;
            let mut failure = None;
            self.temp.list_merged(&self.base, Self::open_dir(&handle)?, offset, &mut |listed| {
                let entry = &listed.entry;
                if entry.name == "." || entry.name == ".." {
                    return emit(entry, None);
                }
                let looked_up = match &listed.temp {
                    Some(f) => {
                        // Under the file's lock a transform cannot re-key it meanwhile.
                        let st = f.lock();
                        if st.fate == Fate::Resident {
                            Ok(self.temp.temp_entry(&self.base, f, &st))
                        } else {
                            drop(st);
                            self.base.lower.lookup(&dir, &entry.name).map(|(n, a)| self.entry(n, a))
                        }
                    }
                    None => {
                        self.base.lower.lookup(&dir, &entry.name).map(|(n, a)| self.entry(n, a))
                    }
                };
                match looked_up {
                    Ok(looked_up) => {
                        let added = emit(entry, Some(&looked_up));
                        if !added {
                            self.temp.nodes.forget(looked_up.node_id, 1);
                        }
                        added
                    }
                    // Removed between readdir and lookup: skip it, as a later readdir would.
                    Err(lower::Errno(libc::ENOENT)) => true,
                    Err(e) => {
                        failure = Some(e);
                        false
                    }
                }
            })?;
            match failure {
                Some(e) => Err(e.into()),
                None => Ok(()),
            }
        })
    }

    pub fn releasedir(&self, fh: u64) -> FsResult<()> {
        self.op(Op::Releasedir, |_| self.temp.handles.remove(fh).map(drop).ok_or_else(|| stale(fh)))
    }

    /// fsync of a directory: its temp-file entries and pending times are in NVRAM already; the
    /// lower directory is synced only when it changed in the lower file system directly
    /// (`engine/durability.rs`).
    pub fn fsyncdir(&self, fh: u64, datasync: bool) -> FsResult<()> {
        self.op(Op::Fsyncdir, |_| {
            let c = &self.base.durability.counters;
            Counters::add(&c.calls, 1);
            Counters::add(&c.dir_calls, 1);
            self.base.group_commit();
            let h = self.handle(fh)?;
            let Open::Dir { file, key, .. } = &h.file else {
                return Err(answer(libc::ENOTDIR));
            };
            let waited =
                self.sync_if_unsynced(*key, || Ok(self.base.lower.fsyncdir(file, datasync)?))?;
            Counters::add(&c.waited_on_lower, u64::from(waited));
            Ok(())
        })
    }

    /// The lower file system's statfs, less the space and inodes reserved for temp files
    /// (they will need it when transformed).
    pub fn statfs(&self, node_id: u64) -> FsResult<StatFs> {
        self.op(Op::Statfs, |_| {
            let node = match self.obj(node_id)? {
                Obj::Lower(n) => n,
                Obj::Temp(_) => self.dir(ROOT_ID)?,
            };
            let mut s = self.base.lower.statfs(&node)?;
            let unit = u64::from(s.frsize.max(1));
            let reserved = self.base.reserved_bytes().div_ceil(unit);
            s.bfree = s.bfree.saturating_sub(reserved);
            s.bavail = s.bavail.saturating_sub(reserved);
            s.ffree = s.ffree.saturating_sub(self.base.space.files());
            Ok(s)
        })
    }
}

impl<L: LowerFs> Engine<L> {
    /// The parts of an open directory the merged listing needs; ENOTDIR for another handle.
    fn open_dir(h: &Handle<Open<L>>) -> FsResult<(&L::File, &DirKey, &Listing)> {
        match &h.file {
            Open::Dir { file, key, listing } => Ok((file, key, listing)),
            _ => Err(answer(libc::ENOTDIR)),
        }
    }
}
