//! The operations. Each public method is one FUSE request, runs through [`Engine::op`] (counted,
//! inside a transaction) and returns plain data; the front end replies.
//!
//! Lock order: inode table, then handle table; no lock is held across a lower syscall except
//! the directory-stream mutex inside the lower adapter.

use std::ffi::OsStr;
use std::sync::Arc;

use lower::{Attr, Creds, DirEntry, LowerFs, SetAttr, StatFs};
use txn::{Pool, Tx};

use crate::error::{FsError, FsResult};
use crate::handles::{Handle, HandleTable};
use crate::inodes::{Inode, InodeTable, ROOT_ID};
use crate::stats::{Counters, NvramStats, Op, Stats};

/// Limits and knobs of an engine, fixed at mount.
#[derive(Clone, Copy, Debug)]
pub struct EngineConfig {
    /// Most open files and directories at once.
    pub max_handles: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig { max_handles: 1 << 16 }
    }
}

/// A looked-up object: its node id and attributes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub node_id: u64,
    pub attr: Attr,
}

/// See the crate docs.
#[derive(Debug)]
pub struct Engine<L: LowerFs> {
    lower: L,
    pool: Pool,
    inodes: InodeTable<Arc<L::Node>>,
    handles: HandleTable<L::File>,
    counters: Counters,
}

/// The node of a stale id is an error the kernel should never cause; report ESTALE.
fn stale(id: u64) -> FsError {
    FsError::Stale(id)
}

impl<L: LowerFs> Engine<L> {
    pub fn new(lower: L, pool: Pool, config: EngineConfig) -> Engine<L> {
        // The root node is borrowed from the adapter; the table holds its own reference by
        // looking the root up again ("." of the root).
        let root_key = lower.key(lower.root());
        let (root, _) = lower.lookup(lower.root(), OsStr::new(".")).expect("lower root readable");
        Engine {
            inodes: InodeTable::new(Arc::new(root), root_key),
            handles: HandleTable::new(config.max_handles),
            counters: Counters::default(),
            lower,
            pool,
        }
    }

    /// Runs one operation: counted, inside a transaction that commits if `f` succeeds and
    /// aborts (rolling back its NVRAM changes) if it fails.
    fn op<T>(&self, op: Op, f: impl FnOnce(&mut Tx<'_>) -> FsResult<T>) -> FsResult<T> {
        let mut tx = self.pool.begin();
        let result = f(&mut tx);
        match &result {
            Ok(_) => tx.commit(),
            Err(_) => tx.abort(),
        }
        self.counters.request(op, result.is_ok());
        result
    }

    fn inode(&self, id: u64) -> FsResult<Arc<Inode<Arc<L::Node>>>> {
        self.inodes.get(id).ok_or_else(|| stale(id))
    }

    fn handle(&self, fh: u64) -> FsResult<Arc<Handle<L::File>>> {
        self.handles.get(fh).ok_or_else(|| stale(fh))
    }

    fn entry(&self, node: L::Node, attr: Attr) -> Entry {
        let key = self.lower.key(&node);
        let node_id = self.inodes.remember(Arc::new(node), key);
        Entry { node_id, attr }
    }

    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    pub fn lookup(&self, parent: u64, name: &OsStr) -> FsResult<Entry> {
        self.op(Op::Lookup, |_| {
            let p = self.inode(parent)?;
            let (node, attr) = self.lower.lookup(&p.node, name)?;
            Ok(self.entry(node, attr))
        })
    }

    pub fn forget(&self, node_id: u64, nlookup: u64) {
        self.counters.request(Op::Forget, true);
        self.inodes.forget(node_id, nlookup);
    }

    pub fn getattr(&self, node_id: u64) -> FsResult<Attr> {
        self.op(Op::Getattr, |_| Ok(self.lower.getattr(&self.inode(node_id)?.node)?))
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
        self.op(Op::Setattr, |_| {
            let inode = self.inode(node_id)?;
            let handle = fh.and_then(|fh| self.handles.get(fh));
            if set.size.is_some() && set.mode.is_none() && unprivileged {
                self.kill_suidgid(&inode.node)?;
            }
            Ok(self.lower.setattr(&inode.node, handle.as_ref().map(|h| &h.file), set)?)
        })
    }

    /// Removes set-user-ID (always) and set-group-ID (when group-executable) from a regular
    /// file, exactly the bits the kernel's `should_remove_suid` names. The daemon writes to
    /// the lower file system as root, whose writes keep those bits, so for writes and
    /// truncates by unprivileged callers the engine removes them itself (FUSE
    /// handle_killpriv_v2; it also spares a security.capability query per write).
    fn kill_suidgid(&self, node: &L::Node) -> FsResult<()> {
        let attr = self.lower.getattr(node)?;
        if attr.kind() != lower::FileKind::Regular {
            return Ok(());
        }
        let mut kill = 0;
        if attr.mode & libc::S_ISUID != 0 {
            kill |= libc::S_ISUID;
        }
        if attr.mode & (libc::S_ISGID | libc::S_IXGRP) == libc::S_ISGID | libc::S_IXGRP {
            kill |= libc::S_ISGID;
        }
        if kill != 0 {
            let set = SetAttr { mode: Some(attr.mode & !kill & 0o7777), ..SetAttr::default() };
            self.lower.setattr(node, None, &set)?;
        }
        Ok(())
    }

    pub fn readlink(&self, node_id: u64) -> FsResult<Vec<u8>> {
        self.op(Op::Readlink, |_| Ok(self.lower.readlink(&self.inode(node_id)?.node)?))
    }

    pub fn mknod(
        &self,
        creds: &Creds,
        parent: u64,
        name: &OsStr,
        mode: u32,
        rdev: u64,
    ) -> FsResult<Entry> {
        self.op(Op::Mknod, |_| {
            let p = self.inode(parent)?;
            let (node, attr) = self.lower.mknod(creds, &p.node, name, mode, rdev)?;
            Ok(self.entry(node, attr))
        })
    }

    pub fn mkdir(&self, creds: &Creds, parent: u64, name: &OsStr, mode: u32) -> FsResult<Entry> {
        self.op(Op::Mkdir, |_| {
            let p = self.inode(parent)?;
            let (node, attr) = self.lower.mkdir(creds, &p.node, name, mode)?;
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
        self.op(Op::Symlink, |_| {
            let p = self.inode(parent)?;
            let (node, attr) = self.lower.symlink(creds, &p.node, name, target)?;
            Ok(self.entry(node, attr))
        })
    }

    pub fn link(&self, node_id: u64, newparent: u64, newname: &OsStr) -> FsResult<Entry> {
        self.op(Op::Link, |_| {
            let inode = self.inode(node_id)?;
            let p = self.inode(newparent)?;
            let attr = self.lower.link(&inode.node, &p.node, newname)?;
            // The kernel counts this reply as a lookup of the same node.
            let (node, _) = self.lower.lookup(&p.node, newname)?;
            Ok(self.entry(node, attr))
        })
    }

    pub fn unlink(&self, parent: u64, name: &OsStr) -> FsResult<()> {
        self.op(Op::Unlink, |_| Ok(self.lower.unlink(&self.inode(parent)?.node, name)?))
    }

    pub fn rmdir(&self, parent: u64, name: &OsStr) -> FsResult<()> {
        self.op(Op::Rmdir, |_| Ok(self.lower.rmdir(&self.inode(parent)?.node, name)?))
    }

    pub fn rename(
        &self,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
    ) -> FsResult<()> {
        self.op(Op::Rename, |_| {
            let p = self.inode(parent)?;
            let np = self.inode(newparent)?;
            Ok(self.lower.rename(&p.node, name, &np.node, newname, flags)?)
        })
    }

    fn register(&self, node_id: u64, file: L::File) -> FsResult<u64> {
        // Too many open files: the lower file system would say EMFILE too.
        self.handles.insert(node_id, file).ok_or(FsError::Lower(lower::Errno(libc::EMFILE)))
    }

    pub fn open(&self, node_id: u64, flags: i32) -> FsResult<u64> {
        self.op(Op::Open, |_| {
            let inode = self.inode(node_id)?;
            let file = self.lower.open(&inode.node, flags)?;
            self.register(node_id, file)
        })
    }

    pub fn create(
        &self,
        creds: &Creds,
        parent: u64,
        name: &OsStr,
        mode: u32,
        flags: i32,
    ) -> FsResult<(Entry, u64)> {
        self.op(Op::Create, |_| {
            let p = self.inode(parent)?;
            let (node, attr, file) = self.lower.create(creds, &p.node, name, mode, flags)?;
            let entry = self.entry(node, attr);
            let fh = self.register(entry.node_id, file)?;
            Ok((entry, fh))
        })
    }

    /// Reads up to `size` bytes and hands them to `reply`. The bytes live in a buffer owned by
    /// the calling worker thread and reused across requests (no allocation and zero-fill per
    /// read).
    pub fn read(&self, fh: u64, offset: u64, size: u32, reply: impl FnOnce(&[u8])) -> FsResult<()> {
        thread_local! {
            static BUFFER: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        self.op(Op::Read, |_| {
            let h = self.handle(fh)?;
            BUFFER.with_borrow_mut(|buf| {
                if buf.len() < size as usize {
                    buf.resize(size as usize, 0);
                }
                let n = self.lower.read(&h.file, offset, &mut buf[..size as usize])?;
                Counters::add(&self.counters.app_bytes_read, n as u64);
                Counters::add(&self.counters.lower_bytes_read, n as u64);
                reply(&buf[..n]);
                Ok(())
            })
        })
    }

    /// `kill_suidgid`: the kernel asks to remove set-ID bits first (a write by an
    /// unprivileged caller).
    pub fn write(&self, fh: u64, offset: u64, data: &[u8], kill_suidgid: bool) -> FsResult<usize> {
        self.op(Op::Write, |_| {
            let h = self.handle(fh)?;
            if kill_suidgid {
                self.kill_suidgid(&self.inode(h.node_id)?.node)?;
            }
            let n = self.lower.write(&h.file, offset, data)?;
            Counters::add(&self.counters.app_bytes_written, n as u64);
            Counters::add(&self.counters.lower_bytes_written, n as u64);
            Ok(n)
        })
    }

    pub fn flush(&self, fh: u64) -> FsResult<()> {
        self.op(Op::Flush, |_| self.handle(fh).map(drop))
    }

    pub fn release(&self, fh: u64) -> FsResult<()> {
        self.op(Op::Release, |_| self.handles.remove(fh).map(drop).ok_or_else(|| stale(fh)))
    }

    pub fn fsync(&self, fh: u64, datasync: bool) -> FsResult<()> {
        self.op(Op::Fsync, |_| Ok(self.lower.fsync(&self.handle(fh)?.file, datasync)?))
    }

    pub fn opendir(&self, node_id: u64) -> FsResult<u64> {
        self.op(Op::Opendir, |_| {
            let inode = self.inode(node_id)?;
            let dir = self.lower.opendir(&inode.node)?;
            self.register(node_id, dir)
        })
    }

    /// Lists entries after `offset`; `emit` returns false when the reply buffer is full.
    pub fn readdir(
        &self,
        fh: u64,
        offset: u64,
        emit: &mut dyn FnMut(DirEntry) -> bool,
    ) -> FsResult<()> {
        self.op(Op::Readdir, |_| Ok(self.lower.readdir(&self.handle(fh)?.file, offset, emit)?))
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
            let dir = self.inode(handle.node_id)?;
            let mut failure = None;
            self.lower.readdir(&handle.file, offset, &mut |entry| {
                if entry.name == "." || entry.name == ".." {
                    return emit(&entry, None);
                }
                match self.lower.lookup(&dir.node, &entry.name) {
                    Ok((node, attr)) => {
                        let looked_up = self.entry(node, attr);
                        let added = emit(&entry, Some(&looked_up));
                        if !added {
                            self.inodes.forget(looked_up.node_id, 1);
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
        self.op(Op::Releasedir, |_| self.handles.remove(fh).map(drop).ok_or_else(|| stale(fh)))
    }

    pub fn fsyncdir(&self, fh: u64, datasync: bool) -> FsResult<()> {
        self.op(Op::Fsyncdir, |_| Ok(self.lower.fsyncdir(&self.handle(fh)?.file, datasync)?))
    }

    pub fn statfs(&self, node_id: u64) -> FsResult<StatFs> {
        self.op(Op::Statfs, |_| Ok(self.lower.statfs(&self.inode(node_id)?.node)?))
    }

    pub fn setxattr(&self, node_id: u64, name: &OsStr, value: &[u8], flags: i32) -> FsResult<()> {
        self.op(Op::Setxattr, |_| {
            Ok(self.lower.setxattr(&self.inode(node_id)?.node, name, value, flags)?)
        })
    }

    pub fn getxattr(&self, node_id: u64, name: &OsStr, size: usize) -> FsResult<Vec<u8>> {
        self.op(Op::Getxattr, |_| {
            Ok(self.lower.getxattr(&self.inode(node_id)?.node, name, size)?)
        })
    }

    pub fn listxattr(&self, node_id: u64, size: usize) -> FsResult<Vec<u8>> {
        self.op(Op::Listxattr, |_| Ok(self.lower.listxattr(&self.inode(node_id)?.node, size)?))
    }

    pub fn removexattr(&self, node_id: u64, name: &OsStr) -> FsResult<()> {
        self.op(Op::Removexattr, |_| {
            Ok(self.lower.removexattr(&self.inode(node_id)?.node, name)?)
        })
    }

    /// Permission checks are the kernel's (`default_permissions`); this only confirms the node.
    pub fn access(&self, node_id: u64) -> FsResult<()> {
        self.op(Op::Access, |_| self.inode(node_id).map(drop))
    }

    pub fn fallocate(&self, fh: u64, mode: i32, offset: u64, len: u64) -> FsResult<()> {
        self.op(Op::Fallocate, |_| {
            Ok(self.lower.fallocate(&self.handle(fh)?.file, mode, offset, len)?)
        })
    }

    pub fn lseek(&self, fh: u64, offset: i64, whence: i32) -> FsResult<i64> {
        self.op(Op::Lseek, |_| Ok(self.lower.lseek(&self.handle(fh)?.file, offset, whence)?))
    }

    pub fn copy_file_range(
        &self,
        fh_in: u64,
        offset_in: u64,
        fh_out: u64,
        offset_out: u64,
        len: u64,
    ) -> FsResult<u64> {
        self.op(Op::CopyFileRange, |_| {
            let input = self.handle(fh_in)?;
            let output = self.handle(fh_out)?;
            let n = self.lower.copy_file_range(
                &input.file,
                offset_in,
                &output.file,
                offset_out,
                len,
            )?;
            Counters::add(&self.counters.app_bytes_written, n);
            Counters::add(&self.counters.lower_bytes_written, n);
            Ok(n)
        })
    }

    pub fn stats(&self) -> Stats {
        let mut stats = self.counters.snapshot();
        let pool = self.pool.stats();
        stats.inodes = self.inodes.len() as u64;
        stats.open_handles = self.handles.len() as u64;
        stats.nvram = NvramStats {
            frames_total: pool.frames_total,
            frames_used: pool.frames_total - pool.frames_free,
            frames_free: pool.frames_free,
            undo_bytes_max: pool.undo_bytes_max,
            undo_slots: pool.undo_slots,
            undo_slots_in_use: pool.undo_slots_in_use,
            transactions_committed: pool.transactions_committed,
            transactions_aborted: pool.transactions_aborted,
            persist_mode: pool
                .persist_mode
                .map(|m| format!("{m:?}").to_lowercase())
                .unwrap_or_default(),
            consistency: format!("{:?}", self.pool.consistency()).to_lowercase(),
        };
        stats
    }

    /// Ends the engine: every open handle is closed, the region is marked clean.
    pub fn shutdown(self) {
        let Engine { pool, inodes, handles, .. } = self;
        drop(handles);
        drop(inodes);
        pool.close();
    }

    /// The root's node id (always 1).
    pub fn root_id(&self) -> u64 {
        ROOT_ID
    }
}
