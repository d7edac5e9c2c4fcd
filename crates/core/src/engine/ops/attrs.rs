//! Attributes: getattr, setattr (with the kernel's set-ID rules), readlink, access, and the
//! extended attributes (which live in the lower file system: a temp file is transformed
//! before one is set or removed).

use std::ffi::OsStr;

use lower::{Attr, LowerFs, SetAttr};

use crate::base::OpTx;
use crate::base::counters::Op;
use crate::base::error::{FsResult, answer};
use crate::base::inodes::ROOT_ID;
use crate::base::suidgid_bits;
use crate::cache::Cached;
use crate::engine::Engine;
use crate::tempfs::names::{Obj, Open};
use crate::tempfs::{self, Fate};

impl<L: LowerFs> Engine<L> {
    pub fn getattr(&self, node_id: u64) -> FsResult<Attr> {
        let result = self.attr_of(node_id);
        self.base.counters.request(Op::Getattr, result.is_ok());
        result
    }

    /// A node's attributes, not counted as a request (the direct path's grant and merge ask).
    pub(crate) fn attr_of(&self, node_id: u64) -> FsResult<Attr> {
        self.attempt(|_| {
            loop {
                match self.obj(node_id)? {
                    Obj::Lower(n) => {
                        return Ok(
                            self.shown_attr(self.base.lower.key(&n), self.base.lower.getattr(&n)?)
                        );
                    }
                    Obj::Temp(f) => {
                        let st = f.lock();
                        match st.fate {
                            Fate::Resident => {
                                return Ok(crate::tempfs::TempFs::temp_attr(&self.base, &f, &st));
                            }
                            Fate::Freed => return Err(answer(libc::ENOENT)),
                            Fate::Transformed => {} // the inode now names the lower file
                        }
                    }
                }
            }
        })
    }

    /// `unprivileged`: the caller is not root. A truncate by such a caller removes the file's
    /// set-user-ID and set-group-ID bits, as the kernel would (it leaves that to us because we
    /// handle killpriv, see `kill_suidgid`).
    pub fn setattr(
        &self,
        node_id: u64,
        fh: Option<u64>,
        set: &SetAttr,
        unprivileged: bool,
    ) -> FsResult<Attr> {
        let result = self.setattr_uncounted(node_id, fh, set, unprivileged);
        self.base.counters.request(Op::Setattr, result.is_ok());
        result
    }

    /// [`Engine::setattr`] not counted as a request (a truncate record of the direct path).
    pub(crate) fn setattr_uncounted(
        &self,
        node_id: u64,
        fh: Option<u64>,
        set: &SetAttr,
        unprivileged: bool,
    ) -> FsResult<Attr> {
        self.attempt(|tx| {
            loop {
                let node = match self.obj(node_id)? {
                    Obj::Lower(n) => n,
                    Obj::Temp(f) => {
                        match self.temp.temp_setattr(&self.base, tx, &f, set, unprivileged)? {
                            Some(attr) => return Ok(attr),
                            None => continue, // transformed meanwhile
                        }
                    }
                };
                let handle = fh.and_then(|fh| self.temp.handles.get(fh));
                let file = match handle.as_deref().map(|h| &h.file) {
                    Some(Open::Lower { file, .. } | Open::Dir { file, .. }) => Some(file),
                    _ => None,
                };
                if set.size.is_some() && set.mode.is_none() && unprivileged {
                    self.kill_suidgid(tx, &node)?;
                }
                let key = self.base.lower.key(&node);
                if let Some(cf) = self.cache.cached(key) {
                    match self.cached_setattr(tx, &cf, &node, file, set)? {
                        Some(attr) => return Ok(attr),
                        None => continue, // written back meanwhile
                    }
                }
                if set.size.is_some() {
                    // Changes the lower file's data: no record may start meanwhile.
                    let attr = self.cache.with_clean_lower(&self.base, key, |w1| {
                        Ok(self.base.lower.setattr(w1, &node, file, set)?)
                    })?;
                    self.lower_changed(key, || {
                        if let Some(file) = file {
                            return Ok(self.base.lower.fsync(file, false)?);
                        }
                        // A truncate by path: fsync works on a read-only descriptor.
                        let file = self.base.lower.open(&node, libc::O_RDONLY)?;
                        Ok(self.base.lower.fsync(&file, false)?)
                    })?;
                    return Ok(attr);
                }
                let attr = self.journal.ns_setattr(&self.base, tx, &node, file, set)?;
                if set.mtime.is_some() && attr.kind() == lower::FileKind::Directory {
                    // Explicit times: pending ones (temp-file changes) follow them.
                    self.temp.follow_dir_times(&self.base, tx, key, &attr)?;
                }
                return Ok(self.shown_attr(key, attr));
            }
        })
    }

    /// Removes set-user-ID (always) and set-group-ID (when group-executable) from a regular
    /// file, exactly the bits the kernel's `should_remove_suid` names. The daemon writes to
    /// the lower file system as root, whose writes keep those bits, so for writes and
    /// truncates by unprivileged callers the engine removes them itself (FUSE
    /// handle_killpriv_v2; it also spares a security.capability query per write).
    pub(crate) fn kill_suidgid(&self, otx: &mut OpTx<'_>, node: &L::Node) -> FsResult<()> {
        let attr = self.base.lower.getattr(node)?;
        if attr.kind() != lower::FileKind::Regular {
            return Ok(());
        }
        let kill = suidgid_bits(attr.mode);
        if kill != 0 {
            let set = SetAttr { mode: Some(attr.mode & !kill & 0o7777), ..SetAttr::default() };
            self.journal.ns_setattr(&self.base, otx, node, None, &set)?;
        }
        Ok(())
    }

    pub fn readlink(&self, node_id: u64) -> FsResult<Vec<u8>> {
        self.op(Op::Readlink, |_| match self.obj(node_id)? {
            Obj::Lower(n) => Ok(self.base.lower.readlink(&n)?),
            Obj::Temp(_) => Err(answer(libc::EINVAL)),
        })
    }

    /// Permission checks are the kernel's (`default_permissions`); this only confirms the node.
    pub fn access(&self, node_id: u64) -> FsResult<()> {
        self.op(Op::Access, |_| self.inode(node_id).map(drop))
    }

    /// Extended attributes live in the lower file system: setting or removing one on a temp
    /// file transforms it first. A temp file has none (reads say ENODATA, lists are empty).
    /// With xattrs off every xattr request fails with ENOSYS: the kernel then marks the
    /// operation unsupported for the mount and answers EOPNOTSUPP itself from then on.
    fn xattrs_off(&self, op: Op) -> FsResult<()> {
        if self.xattrs {
            return Ok(());
        }
        self.base.counters.request(op, false);
        Err(answer(libc::ENOSYS))
    }

    pub fn setxattr(&self, node_id: u64, name: &OsStr, value: &[u8], flags: i32) -> FsResult<()> {
        self.xattrs_off(Op::Setxattr)?;
        if is_marker(node_id, name) {
            self.base.counters.request(Op::Setxattr, false);
            return Err(answer(libc::EPERM));
        }
        let node = self.lower_object(node_id, tempfs::Trigger::Xattr)?;
        self.op(Op::Setxattr, |otx| {
            self.journal.ns_setxattr(&self.base, otx, &node, name, value, flags)
        })
    }

    pub fn getxattr(&self, node_id: u64, name: &OsStr, size: usize) -> FsResult<Vec<u8>> {
        self.xattrs_off(Op::Getxattr)?;
        self.op(Op::Getxattr, |_| match self.lower_obj(node_id)? {
            Ok(_) if is_marker(node_id, name) => Err(answer(libc::ENODATA)),
            Ok(node) => Ok(self.base.lower.getxattr(&node, name, size)?),
            Err(_) => Err(answer(libc::ENODATA)),
        })
    }

    pub fn listxattr(&self, node_id: u64, size: usize) -> FsResult<Vec<u8>> {
        self.xattrs_off(Op::Listxattr)?;
        self.op(Op::Listxattr, |_| match self.lower_obj(node_id)? {
            Ok(node) if node_id == ROOT_ID => {
                // The journal's marker is nvstack's own: the list without it, sized as asked.
                let all = self.base.lower.listxattr(&node, 0)?;
                let list: Vec<u8> = all
                    .split(|&b| b == 0)
                    .filter(|n| !n.is_empty() && *n != crate::journal::MARKER.as_bytes())
                    .flat_map(|n| n.iter().copied().chain([0]))
                    .collect();
                if size != 0 && list.len() > size {
                    return Err(crate::base::error::FsError::Lower(lower::Errno(libc::ERANGE)));
                }
                Ok(list)
            }
            Ok(node) => Ok(self.base.lower.listxattr(&node, size)?),
            Err(_) => Ok(Vec::new()),
        })
    }

    pub fn removexattr(&self, node_id: u64, name: &OsStr) -> FsResult<()> {
        self.xattrs_off(Op::Removexattr)?;
        if let Err(f) = self.lower_obj(node_id)? {
            // Nothing to remove: answer as the lower file system would for a file without it.
            if f.lock().fate == Fate::Resident {
                self.base.counters.request(Op::Removexattr, false);
                return Err(answer(libc::ENODATA));
            }
        }
        if is_marker(node_id, name) {
            self.base.counters.request(Op::Removexattr, false);
            return Err(answer(libc::EPERM));
        }
        let node = self.lower_object(node_id, tempfs::Trigger::Xattr)?;
        self.op(Op::Removexattr, |otx| self.journal.ns_removexattr(&self.base, otx, &node, name))
    }
}

/// The metadata journal's marker on the lower root (`journal::MARKER`): invisible through the
/// mount, and not an application's to change.
fn is_marker(node_id: u64, name: &OsStr) -> bool {
    node_id == ROOT_ID && name == crate::journal::MARKER
}

impl<L: LowerFs> Engine<L> {
    /// setattr of a lower regular file with a record: the size in the cache, the rest in the
    /// lower file system (through the metadata journal); an mtime set explicitly is kept in
    /// the record too. `None` when the record was freed meanwhile (look the file up again).
    fn cached_setattr(
        &self,
        otx: &mut OpTx<'_>,
        cf: &Cached<L>,
        node: &L::Node,
        file: Option<&L::File>,
        set: &SetAttr,
    ) -> FsResult<Option<Attr>> {
        let b = &self.base;
        if let Some(size) = set.size
            && self.cache.cached_truncate(b, otx, cf, size)?.is_none()
        {
            return Ok(None);
        }
        let rest = SetAttr { size: None, ..*set };
        let attr = if rest == SetAttr::default() {
            b.lower.getattr(node)?
        } else {
            self.journal.ns_setattr(b, otx, node, file, &rest)?
        };
        // (Freed meanwhile: the lower file has the times, which the mount then shows.)
        if set.mtime.is_some() {
            crate::cache::PageCache::<L>::set_times(otx, cf, &attr)?;
        }
        Ok(Some(self.shown_attr(cf.key, attr)))
    }
}
