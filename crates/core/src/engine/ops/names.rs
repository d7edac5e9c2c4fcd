//! Namespace operations: lookup, forget, mknod, mkdir, symlink, link, unlink, rmdir, rename.
//! A name is a temp file (the overlay, consulted first) or a lower object; rules O1-O4 of
//! the merged namespace are in `tempfs/` and design.md section 10.

use std::ffi::OsStr;
use std::sync::Arc;

use lower::{Creds, LowerFs};

use crate::base::Entry;
use crate::base::counters::Op;
use crate::base::error::{FsResult, answer};
use crate::engine::Engine;
use crate::tempfs::{self, Fate};

impl<L: LowerFs> Engine<L> {
    pub fn lookup(&self, parent: u64, name: &OsStr) -> FsResult<Entry> {
        self.op(Op::Lookup, |_| {
            let p = self.dir(parent)?;
            if let Some(e) = self.temp.temp_lookup(&self.base, &p, name) {
                return Ok(e);
            }
            if tempfs::is_hidden(name) {
                return Err(answer(libc::ENOENT));
            }
            let (node, attr) = self.base.lower.lookup(&p, name)?;
            Ok(self.entry(node, attr))
        })
    }

    pub fn forget(&self, node_id: u64, nlookup: u64) {
        self.base.counters.request(Op::Forget, true);
        // The kernel's last reference: the pages of a deleted file are dropped now.
        if let Some(identity) = self.temp.nodes.forget(node_id, nlookup) {
            self.routes.forget(node_id);
            if let Some(key) = identity.lower_key() {
                self.cache.drop_if_deleted(&self.base, key);
            }
        }
    }

    pub fn mknod(
        &self,
        creds: &Creds,
        parent: u64,
        name: &OsStr,
        mode: u32,
        rdev: u64,
    ) -> FsResult<Entry> {
        self.op(Op::Mknod, |otx| {
            let p = self.dir(parent)?;
            self.check_new_name(&p, name)?;
            let (node, attr) =
                self.journal.ns_mknod(&self.base, otx, creds, (&p, name), mode, rdev)?;
            Ok(self.entry(node, attr))
        })
    }

    pub fn mkdir(&self, creds: &Creds, parent: u64, name: &OsStr, mode: u32) -> FsResult<Entry> {
        self.op(Op::Mkdir, |otx| {
            let p = self.dir(parent)?;
            self.check_new_name(&p, name)?;
            let (node, attr) = self.journal.ns_mkdir(&self.base, otx, creds, (&p, name), mode)?;
            Ok(self.entry(node, attr))
        })
    }

    pub fn symlink(
        &self,
        creds: &Creds,
        parent: u64,
        name: &OsStr,
        target: &OsStr,
    ) -> FsResult<Entry> {
        self.op(Op::Symlink, |otx| {
            let p = self.dir(parent)?;
            self.check_new_name(&p, name)?;
            let (node, attr) =
                self.journal.ns_symlink(&self.base, otx, creds, (&p, name), target)?;
            Ok(self.entry(node, attr))
        })
    }

    /// A hard link to a temp file transforms it first (links are the lower file system's).
    pub fn link(&self, node_id: u64, newparent: u64, newname: &OsStr) -> FsResult<Entry> {
        let node = self.lower_object(node_id, tempfs::Trigger::Link)?;
        self.op(Op::Link, |otx| {
            let p = self.dir(newparent)?;
            self.check_new_name(&p, newname)?;
            let attr = self.journal.ns_link(&self.base, otx, &node, &p, newname)?;
            // The kernel counts this reply as a lookup of the same node.
            let (node, _) = self.base.lower.lookup(&p, newname)?;
            Ok(self.entry(node, attr))
        })
    }

    /// The lower object behind `node_id`, transforming a temp file first (`trigger`).
    pub(crate) fn lower_object(
        &self,
        node_id: u64,
        trigger: tempfs::Trigger,
    ) -> FsResult<Arc<L::Node>> {
        loop {
            match self.lower_obj(node_id)? {
                Ok(node) => return Ok(node),
                Err(f) => {
                    if f.lock().fate == Fate::Freed {
                        return Err(answer(libc::ENOENT));
                    }
                    self.temp.transform(&self.base, &f, trigger)?;
                }
            }
        }
    }

    pub fn unlink(&self, parent: u64, name: &OsStr) -> FsResult<()> {
        self.op(Op::Unlink, |tx| {
            let p = self.dir(parent)?;
            if self.temp.temp_unlink(&self.base, tx, &p, name)? {
                return Ok(());
            }
            if tempfs::is_hidden(name) {
                return Err(answer(libc::ENOENT));
            }
            self.journal.ns_unlink(&self.base, tx, &p, name)
        })?;
        self.temp.settle_if_many(&self.base);
        Ok(())
    }

    pub fn rmdir(&self, parent: u64, name: &OsStr) -> FsResult<()> {
        self.op(Op::Rmdir, |otx| {
            let p = self.dir(parent)?;
            let key = self.base.lower.key(&p);
            if self.temp.overlay.lock().get(key, name).is_some() {
                return Err(answer(libc::ENOTDIR));
            }
            if tempfs::is_hidden(name) {
                return Err(answer(libc::ENOENT));
            }
            // A directory holding only temp files is empty to the lower file system.
            if let Ok((child, _)) = self.base.lower.lookup(&p, name)
                && self.temp.overlay.lock().has_entries(self.base.lower.key(&child))
            {
                return Err(answer(libc::ENOTEMPTY));
            }
            self.journal.ns_rmdir(&self.base, otx, &p, name)
        })
    }

    pub fn rename(
        &self,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
    ) -> FsResult<()> {
        self.op(Op::Rename, |tx| {
            let p = self.dir(parent)?;
            let np = self.dir(newparent)?;
            self.temp.rename_merged(
                &self.base,
                &self.journal,
                tx,
                (&p, name),
                (&np, newname),
                flags,
            )
        })?;
        self.temp.settle_if_many(&self.base);
        Ok(())
    }

    /// Fails with EEXIST when `name` is a temp file in `parent` (the lower file system does
    /// not see it), and refuses nvstack's hidden names.
    pub(crate) fn check_new_name(&self, parent: &L::Node, name: &OsStr) -> FsResult<()> {
        if tempfs::is_hidden(name) {
            return Err(answer(libc::EPERM));
        }
        let key = self.base.lower.key(parent);
        if self.temp.overlay.lock().get(key, name).is_some() {
            return Err(answer(libc::EEXIST));
        }
        Ok(())
    }
}
