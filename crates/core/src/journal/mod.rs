//! Namespace and attribute changes of lower objects: every one the engine makes for an
//! application goes through one of these methods, which apply it to the lower file system
//! (through the `lowerfs` facade: the lower tree stays what readers see) and account for its
//! durability. Until the change is durable in the lower file system, the objects it touched
//! are *unsynced* (`engine/durability.rs`), so a durability call on them syncs the lower
//! file system.
//!
//! Size changes are not here: a truncate of a lower file goes through the page cache (an
//! NVRAM transaction; the lower file is cut by write-back) or, with the cache off, straight to
//! the lower file, marked unsynced like any other data written there.

use std::ffi::OsStr;

use lower::{Attr, Creds, LowerFs, SetAttr};

use crate::engine::Engine;
use crate::engine::optx::OpTx;
use crate::error::FsResult;

impl<L: LowerFs> Engine<L> {
    pub(crate) fn ns_mknod(
        &self,
        _otx: &mut OpTx<'_>,
        creds: &Creds,
        parent: &L::Node,
        name: &OsStr,
        mode: u32,
        rdev: u64,
    ) -> FsResult<(L::Node, Attr)> {
        let (node, attr) = self.lower.mknod(creds, parent, name, mode, rdev)?;
        self.created(parent, &node);
        Ok((node, attr))
    }

    pub(crate) fn ns_mkdir(
        &self,
        _otx: &mut OpTx<'_>,
        creds: &Creds,
        parent: &L::Node,
        name: &OsStr,
        mode: u32,
    ) -> FsResult<(L::Node, Attr)> {
        let (node, attr) = self.lower.mkdir(creds, parent, name, mode)?;
        self.created(parent, &node);
        Ok((node, attr))
    }

    pub(crate) fn ns_symlink(
        &self,
        _otx: &mut OpTx<'_>,
        creds: &Creds,
        parent: &L::Node,
        name: &OsStr,
        target: &OsStr,
    ) -> FsResult<(L::Node, Attr)> {
        let (node, attr) = self.lower.symlink(creds, parent, name, target)?;
        self.created(parent, &node);
        Ok((node, attr))
    }

    /// Creates and opens a regular file in the lower directory.
    pub(crate) fn ns_create(
        &self,
        _otx: &mut OpTx<'_>,
        creds: &Creds,
        parent: &L::Node,
        name: &OsStr,
        mode: u32,
        flags: i32,
    ) -> FsResult<(L::Node, Attr, L::File)> {
        let (node, attr, file) = self.lower.create(creds, parent, name, mode, flags)?;
        self.created(parent, &node);
        Ok((node, attr, file))
    }

    pub(crate) fn ns_link(
        &self,
        _otx: &mut OpTx<'_>,
        node: &L::Node,
        parent: &L::Node,
        name: &OsStr,
    ) -> FsResult<Attr> {
        let attr = self.lower.link(node, parent, name)?;
        self.created(parent, node);
        Ok(attr)
    }

    pub(crate) fn ns_unlink(
        &self,
        _otx: &mut OpTx<'_>,
        parent: &L::Node,
        name: &OsStr,
    ) -> FsResult<()> {
        self.lower.unlink(parent, name)?;
        self.unsynced(self.lower.key(parent));
        Ok(())
    }

    pub(crate) fn ns_rmdir(
        &self,
        _otx: &mut OpTx<'_>,
        parent: &L::Node,
        name: &OsStr,
    ) -> FsResult<()> {
        self.lower.rmdir(parent, name)?;
        self.unsynced(self.lower.key(parent));
        Ok(())
    }

    pub(crate) fn ns_rename(
        &self,
        _otx: &mut OpTx<'_>,
        (parent, name): (&L::Node, &OsStr),
        (newparent, newname): (&L::Node, &OsStr),
        flags: u32,
    ) -> FsResult<()> {
        self.lower.rename(parent, name, newparent, newname, flags)?;
        self.unsynced(self.lower.key(parent));
        self.unsynced(self.lower.key(newparent));
        Ok(())
    }

    /// mode, owner and times (never the size: see the module docs).
    pub(crate) fn ns_setattr(
        &self,
        _otx: &mut OpTx<'_>,
        node: &L::Node,
        file: Option<&L::File>,
        set: &SetAttr,
    ) -> FsResult<Attr> {
        assert!(set.size.is_none(), "size changes are data, not journaled attributes");
        let attr = self.lower.setattr(node, file, set)?;
        self.unsynced(self.lower.key(node));
        Ok(attr)
    }

    pub(crate) fn ns_setxattr(
        &self,
        _otx: &mut OpTx<'_>,
        node: &L::Node,
        name: &OsStr,
        value: &[u8],
        flags: i32,
    ) -> FsResult<()> {
        self.lower.setxattr(node, name, value, flags)?;
        self.unsynced(self.lower.key(node));
        Ok(())
    }

    pub(crate) fn ns_removexattr(
        &self,
        _otx: &mut OpTx<'_>,
        node: &L::Node,
        name: &OsStr,
    ) -> FsResult<()> {
        self.lower.removexattr(node, name)?;
        self.unsynced(self.lower.key(node));
        Ok(())
    }

    /// `node` got a name in `parent`: both changed in the lower file system.
    fn created(&self, parent: &L::Node, node: &L::Node) {
        self.unsynced(self.lower.key(parent));
        self.unsynced(self.lower.key(node));
    }
}
