//! The operations. Each public method is one FUSE request, runs through [`Engine::op`] (counted,
//! inside a transaction) and returns plain data; the front end replies.
//!
//! Every method first asks what the object is: a lower object (passed through to the lower
//! file system) or a temp file (TempFFS: kept in NVRAM; the namespace overlay and the
//! transform live in `overlay.rs` and `transform.rs`).
//!
//! Lock order: temp index, then a temp file's state, then inode table, then handle table; no
//! lock is held across a lower syscall except the temp index during short namespace calls
//! (lookup, unlink, rename, fsyncdir of one directory) and the directory-stream mutex inside the
//! lower adapter.

use std::ffi::OsStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use lower::{Attr, Creds, DirEntry, LowerFs, SetAttr, StatFs, TimeSet};
use txn::{Pool, Tx, TxError};

use crate::cache::{CacheConfig, PageCache, Reason};
use crate::error::{FsError, FsResult};
use crate::handles::{Handle, HandleTable};
use crate::inodes::{Inode, InodeTable, ROOT_ID, TEMP_BASE, TEMP_DEV};
use crate::stats::{Counters, NvramStats, Op, Stats};
use crate::tempfs::{self, Fate, Index, TempConfig, TempCounters, TempFile, TempState, data};

/// A test hook: called with the name of each persistence step of the temp-file protocols
/// (e.g. `transform.copied`), so that process-level tests can kill the daemon exactly there.
pub trait Failpoints: Send + Sync + std::fmt::Debug {
    fn hit(&self, point: &'static str);
}

/// Limits and knobs of an engine, fixed at mount.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Most open files and directories at once.
    pub max_handles: usize,
    /// The temp-file store (TempFFS).
    pub temp: TempConfig,
    /// Most directories the recovery walk visits to find a directory by its handle when the
    /// lower file system cannot open handles directly (unprivileged daemon).
    pub max_walk: usize,
    pub failpoints: Option<Arc<dyn Failpoints>>,
    /// Extended attributes served (on) or refused with ENOSYS, after which the kernel stops
    /// asking (it otherwise asks for security.capability before every write(2), because FUSE
    /// super blocks lack SB_NOSEC).
    pub xattrs: bool,
    /// The NVRAM page cache and its write-back.
    pub cache: CacheConfig,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            max_handles: 1 << 16,
            temp: TempConfig::default(),
            max_walk: 1 << 20,
            failpoints: None,
            xattrs: true,
            cache: CacheConfig::default(),
        }
    }
}

/// A looked-up object: its node id and attributes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub node_id: u64,
    pub attr: Attr,
}

/// What a node id names.
#[derive(Debug)]
pub enum Obj<N> {
    Lower(Arc<N>),
    Temp(Arc<TempFile>),
}

impl<N> Clone for Obj<N> {
    fn clone(&self) -> Self {
        match self {
            Obj::Lower(n) => Obj::Lower(Arc::clone(n)),
            Obj::Temp(f) => Obj::Temp(Arc::clone(f)),
        }
    }
}

/// One entry of a merged directory listing (a directory holding temp files).
#[derive(Debug, Clone)]
pub struct Listed {
    pub entry: DirEntry,
    pub temp: Option<Arc<TempFile>>,
}

/// An open file or directory.
#[derive(Debug)]
pub enum Open<L: LowerFs> {
    /// An open lower object (not a directory): `key` is its lower identity, `regular` whether
    /// it is a regular file (only those are cached), `direct` whether opened with O_DIRECT
    /// (its IO goes to the lower file, which is written back first).
    Lower { file: L::File, key: (u64, u64), regular: bool, direct: bool },
    /// An open temp file. After a transform, `lower` is opened on first use with `flags`.
    Temp { file: Arc<TempFile>, flags: i32, lower: OnceLock<L::File> },
    /// An open lower directory; `listing` is the merged snapshot taken at offset 0 when the
    /// directory held temp files (offsets are then positions in it: stable across changes).
    Dir { file: L::File, key: tempfs::DirKey, listing: Mutex<Option<Arc<Vec<Listed>>>> },
}

/// See the crate docs.
#[derive(Debug)]
pub struct Engine<L: LowerFs> {
    pub(crate) lower: L,
    pub(crate) pool: Pool,
    pub(crate) inodes: InodeTable<Obj<L::Node>>,
    pub(crate) handles: HandleTable<Open<L>>,
    pub(crate) counters: Counters,
    pub(crate) temp: TempConfig,
    pub(crate) index: Mutex<Index<L::Node>>,
    pub(crate) tc: TempCounters,
    pub(crate) lru: tempfs::Clock,
    pub(crate) root_dev: u64,
    pub(crate) max_walk: usize,
    pub(crate) failpoints: Option<Arc<dyn Failpoints>>,
    /// One pressure relief at a time.
    pub(crate) relieving: AtomicBool,
    /// Pages of temp files not yet accounted as transformed bytes (for `lower` statfs).
    pub(crate) reserved_pages: AtomicU64,
    pub(crate) xattrs: bool,
    pub(crate) cache: PageCache<L::Node, L::File>,
}

/// How a handle's IO reaches its lower file (see [`Engine::via`]).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Via {
    /// Through the page cache (a regular file).
    Cache((u64, u64)),
    /// A regular file opened with O_DIRECT: to the lower file, written back first.
    Direct((u64, u64)),
    /// Not a regular file (device, FIFO): straight through.
    Plain,
}

/// What a write leaves to do after its operation ended.
enum After {
    Nothing,
    Temp(Arc<TempFile>),
    Cached,
}

/// The node of a stale id is an error the kernel should never cause; report ESTALE.
fn stale(id: u64) -> FsError {
    FsError::Stale(id)
}

pub(crate) fn errno(code: i32) -> FsError {
    FsError::Lower(lower::Errno(code))
}

/// The transaction of one operation. Code that changes NVRAM state under a lock ends the
/// transaction itself with [`OpTx::end`] *before* it releases the lock (strict two-phase
/// locking: no other transaction may snapshot bytes this one changed until it has committed
/// or rolled back), and only then updates the volatile mirror of that state. A later change in
/// the same operation gets a new transaction from [`OpTx::tx`].
#[derive(Debug)]
pub struct OpTx<'p> {
    pool: &'p Pool,
    tx: Option<Tx<'p>>,
}

impl<'p> OpTx<'p> {
    pub fn tx(&mut self) -> &mut Tx<'p> {
        let pool = self.pool;
        self.tx.get_or_insert_with(|| pool.begin())
    }

    /// Commits (on `Ok`) or rolls back (on `Err`) now, and passes the result on.
    pub fn end<T>(&mut self, result: FsResult<T>) -> FsResult<T> {
        if let Some(tx) = self.tx.take() {
            match &result {
                Ok(_) => tx.commit(),
                Err(_) => tx.abort(),
            }
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
        // The transaction begins at the first change of NVRAM state: an operation that only
        // passes through to the lower file system holds no undo slot while it waits for it.
        let mut otx = OpTx { pool: &self.pool, tx: None };
        let result = f(&mut otx);
        let result = otx.end(result);
        self.counters.request(op, result.is_ok());
        result
    }

    pub(crate) fn fail(&self, point: &'static str) {
        if let Some(f) = &self.failpoints {
            f.hit(point);
        }
    }

    pub(crate) fn inode(&self, id: u64) -> FsResult<Arc<Inode<Obj<L::Node>>>> {
        self.inodes.get(id).ok_or_else(|| stale(id))
    }

    /// The object behind a node id.
    pub(crate) fn obj(&self, id: u64) -> FsResult<Obj<L::Node>> {
        Ok(self.inode(id)?.node())
    }

    /// The lower object behind a node id; a temp file that is still in NVRAM yields `Err`
    /// with the file, so callers that need a lower object can transform it first.
    pub(crate) fn lower_obj(&self, id: u64) -> FsResult<Result<Arc<L::Node>, Arc<TempFile>>> {
        Ok(match self.obj(id)? {
            Obj::Lower(n) => Ok(n),
            Obj::Temp(f) => Err(f),
        })
    }

    /// A directory (always a lower object); a temp file is not one.
    pub(crate) fn dir(&self, id: u64) -> FsResult<Arc<L::Node>> {
        match self.obj(id)? {
            Obj::Lower(n) => Ok(n),
            Obj::Temp(_) => Err(errno(libc::ENOTDIR)),
        }
    }

    pub(crate) fn handle(&self, fh: u64) -> FsResult<Arc<Handle<Open<L>>>> {
        self.handles.get(fh).ok_or_else(|| stale(fh))
    }

    pub(crate) fn entry(&self, node: L::Node, attr: Attr) -> Entry {
        let key = self.lower.key(&node);
        let node_id = self.inodes.remember(Obj::Lower(Arc::new(node)), key);
        Entry { node_id, attr: self.overlay_attr(key, attr) }
    }

    /// Registers a temp file with the kernel (one lookup). Called with the index locked, so
    /// that a transform cannot re-key the file in between.
    pub(crate) fn temp_entry(&self, f: &Arc<TempFile>, st: &TempState) -> Entry {
        let node_id = self.inodes.remember(Obj::Temp(Arc::clone(f)), (TEMP_DEV, f.serial));
        Entry { node_id, attr: self.temp_attr(f, st) }
    }

    pub(crate) fn temp_attr(&self, f: &TempFile, st: &TempState) -> Attr {
        let r = &st.rec;
        Attr {
            dev: self.root_dev,
            ino: TEMP_BASE + f.serial,
            size: r.size,
            blocks: st.pages.len() as u64 * (data::PAGE / 512),
            atime: r.atime,
            mtime: r.mtime,
            ctime: r.ctime,
            mode: r.mode,
            nlink: r.nlink,
            uid: r.uid,
            gid: r.gid,
            rdev: 0,
            blksize: data::PAGE as u32,
        }
    }

    pub(crate) fn time(&self, t: TimeSet) -> (i64, u32) {
        match t {
            TimeSet::Now => self.lower.now(),
            TimeSet::At(s, ns) => (s, ns),
        }
    }

    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    pub fn lookup(&self, parent: u64, name: &OsStr) -> FsResult<Entry> {
        self.op(Op::Lookup, |_| {
            let p = self.dir(parent)?;
            if let Some(e) = self.temp_lookup(&p, name) {
                return Ok(e);
            }
            if tempfs::is_hidden(name) {
                return Err(errno(libc::ENOENT));
            }
            let (node, attr) = self.lower.lookup(&p, name)?;
            Ok(self.entry(node, attr))
        })
    }

    pub fn forget(&self, node_id: u64, nlookup: u64) {
        self.counters.request(Op::Forget, true);
        // The kernel's last reference: the pages of a deleted file are dropped now.
        if let Some(key) = self.inodes.forget(node_id, nlookup) {
            self.drop_if_deleted(key);
        }
    }

    pub fn getattr(&self, node_id: u64) -> FsResult<Attr> {
        self.op(Op::Getattr, |_| {
            loop {
                match self.obj(node_id)? {
                    Obj::Lower(n) => {
                        return Ok(self.overlay_attr(self.lower.key(&n), self.lower.getattr(&n)?));
                    }
                    Obj::Temp(f) => {
                        let st = f.lock();
                        match st.fate {
                            Fate::Resident => return Ok(self.temp_attr(&f, &st)),
                            Fate::Freed => return Err(errno(libc::ENOENT)),
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
        self.op(Op::Setattr, |tx| {
            loop {
                let node = match self.obj(node_id)? {
                    Obj::Lower(n) => n,
                    Obj::Temp(f) => match self.temp_setattr(tx, &f, set, unprivileged)? {
                        Some(attr) => return Ok(attr),
                        None => continue, // transformed meanwhile
                    },
                };
                let handle = fh.and_then(|fh| self.handles.get(fh));
                let file = match handle.as_deref().map(|h| &h.file) {
                    Some(Open::Lower { file, .. } | Open::Dir { file, .. }) => Some(file),
                    _ => None,
                };
                if set.size.is_some() && set.mode.is_none() && unprivileged {
                    self.kill_suidgid(&node)?;
                }
                let key = self.lower.key(&node);
                if let Some(cf) = self.cached(key) {
                    match self.cached_setattr(tx, &cf, &node, file, set)? {
                        Some(attr) => return Ok(attr),
                        None => continue, // written back meanwhile
                    }
                }
                if set.size.is_some() {
                    // Changes the lower file's data: no record may start meanwhile.
                    return self
                        .with_clean_lower(key, || Ok(self.lower.setattr(&node, file, set)?));
                }
                return Ok(self.lower.setattr(&node, file, set)?);
            }
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
        let kill = suidgid_bits(attr.mode);
        if kill != 0 {
            let set = SetAttr { mode: Some(attr.mode & !kill & 0o7777), ..SetAttr::default() };
            self.lower.setattr(node, None, &set)?;
        }
        Ok(())
    }

    pub fn readlink(&self, node_id: u64) -> FsResult<Vec<u8>> {
        self.op(Op::Readlink, |_| match self.obj(node_id)? {
            Obj::Lower(n) => Ok(self.lower.readlink(&n)?),
            Obj::Temp(_) => Err(errno(libc::EINVAL)),
        })
    }

    /// Fails with EEXIST when `name` is a temp file in `parent` (the lower file system does
    /// not see it), and refuses nvstack's hidden names.
    fn check_new_name(&self, parent: &L::Node, name: &OsStr) -> FsResult<()> {
        if tempfs::is_hidden(name) {
            return Err(errno(libc::EPERM));
        }
        let key = self.lower.key(parent);
        if self.index.lock().expect("temp index").get(key, name).is_some() {
            return Err(errno(libc::EEXIST));
        }
        Ok(())
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
            let p = self.dir(parent)?;
            self.check_new_name(&p, name)?;
            let (node, attr) = self.lower.mknod(creds, &p, name, mode, rdev)?;
            Ok(self.entry(node, attr))
        })
    }

    pub fn mkdir(&self, creds: &Creds, parent: u64, name: &OsStr, mode: u32) -> FsResult<Entry> {
        self.op(Op::Mkdir, |_| {
            let p = self.dir(parent)?;
            self.check_new_name(&p, name)?;
            let (node, attr) = self.lower.mkdir(creds, &p, name, mode)?;
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
            let p = self.dir(parent)?;
            self.check_new_name(&p, name)?;
            let (node, attr) = self.lower.symlink(creds, &p, name, target)?;
            Ok(self.entry(node, attr))
        })
    }

    /// A hard link to a temp file transforms it first (links are the lower file system's).
    pub fn link(&self, node_id: u64, newparent: u64, newname: &OsStr) -> FsResult<Entry> {
        let node = self.lower_object(node_id, tempfs::Trigger::Link)?;
        self.op(Op::Link, |_| {
            let p = self.dir(newparent)?;
            self.check_new_name(&p, newname)?;
            let attr = self.lower.link(&node, &p, newname)?;
            // The kernel counts this reply as a lookup of the same node.
            let (node, _) = self.lower.lookup(&p, newname)?;
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
                        return Err(errno(libc::ENOENT));
                    }
                    self.transform(&f, trigger)?;
                }
            }
        }
    }

    pub fn unlink(&self, parent: u64, name: &OsStr) -> FsResult<()> {
        self.op(Op::Unlink, |tx| {
            let p = self.dir(parent)?;
            if self.temp_unlink(tx, &p, name)? {
                return Ok(());
            }
            if tempfs::is_hidden(name) {
                return Err(errno(libc::ENOENT));
            }
            Ok(self.lower.unlink(&p, name)?)
        })
    }

    pub fn rmdir(&self, parent: u64, name: &OsStr) -> FsResult<()> {
        self.op(Op::Rmdir, |_| {
            let p = self.dir(parent)?;
            let key = self.lower.key(&p);
            if self.index.lock().expect("temp index").get(key, name).is_some() {
                return Err(errno(libc::ENOTDIR));
            }
            if tempfs::is_hidden(name) {
                return Err(errno(libc::ENOENT));
            }
            // A directory holding only temp files is empty to the lower file system.
            if let Ok((child, _)) = self.lower.lookup(&p, name)
                && self.index.lock().expect("temp index").has_entries(self.lower.key(&child))
            {
                return Err(errno(libc::ENOTEMPTY));
            }
            Ok(self.lower.rmdir(&p, name)?)
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
            self.rename_merged(tx, &p, name, &np, newname, flags)
        })
    }

    fn register(&self, node_id: u64, file: Open<L>) -> FsResult<u64> {
        // Too many open files: the lower file system would say EMFILE too.
        self.handles.insert(node_id, file).ok_or(errno(libc::EMFILE))
    }

    pub fn open(&self, node_id: u64, flags: i32) -> FsResult<u64> {
        self.op(Op::Open, |tx| {
            loop {
                let node = match self.obj(node_id)? {
                    Obj::Lower(n) => n,
                    Obj::Temp(f) => match self.temp_open(tx, node_id, &f, flags)? {
                        Some(fh) => return Ok(fh),
                        None => continue,
                    },
                };
                // O_DIRECT is the kernel's business above FUSE (it bypasses its page cache and
                // sends us every request); our lower IO uses buffers of any alignment.
                let file = self.lower.open(&node, flags & !libc::O_DIRECT)?;
                let regular = self.lower.getattr(&node)?.kind() == lower::FileKind::Regular;
                let key = self.lower.key(&node);
                let direct = flags & libc::O_DIRECT != 0;
                return self.register(node_id, Open::Lower { file, key, regular, direct });
            }
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
        self.op(Op::Create, |tx| {
            let p = self.dir(parent)?;
            if let Some(created) = self.temp_create(tx, creds, &p, name, mode, flags)? {
                return Ok(created);
            }
            self.check_new_name(&p, name)?;
            let (node, attr, file) =
                self.lower.create(creds, &p, name, mode, flags & !libc::O_DIRECT)?;
            let key = self.lower.key(&node);
            let entry = self.entry(node, attr);
            let direct = flags & libc::O_DIRECT != 0;
            let fh =
                self.register(entry.node_id, Open::Lower { file, key, regular: true, direct })?;
            if self.temp.enabled {
                Counters::add(&self.tc.created_in_lower, 1);
            }
            Ok((entry, fh))
        })
    }

    /// The lower file of an open handle: the handle's own, or (for a temp file that has been
    /// transformed since it was opened) the lower file opened now.
    pub(crate) fn lower_file<'h>(&self, h: &'h Handle<Open<L>>) -> FsResult<&'h L::File> {
        match &h.file {
            Open::Lower { file, .. } | Open::Dir { file, .. } => Ok(file),
            Open::Temp { lower, flags, .. } => {
                if let Some(file) = lower.get() {
                    return Ok(file);
                }
                let Obj::Lower(node) = self.obj(h.node_id)? else {
                    return Err(stale(h.node_id));
                };
                let file = self.lower.open(&node, *flags)?;
                // Two threads may race here; the loser's descriptor is simply closed.
                let _ = lower.set(file);
                Ok(lower.get().expect("set above"))
            }
        }
    }

    /// Reads up to `size` bytes and hands them to `reply`. The bytes live in a buffer owned by
    /// the calling worker thread and reused across requests (no allocation and zero-fill per
    /// read).
    pub fn read(&self, fh: u64, offset: u64, size: u32, reply: impl FnOnce(&[u8])) -> FsResult<()> {
        thread_local! {
            static BUFFER: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        self.op(Op::Read, |tx| {
            let h = self.handle(fh)?;
            BUFFER.with_borrow_mut(|buf| {
                if buf.len() < size as usize {
                    buf.resize(size as usize, 0);
                }
                let buf = &mut buf[..size as usize];
                if let Open::Temp { file, .. } = &h.file {
                    let mut st = file.lock();
                    if st.fate == Fate::Resident {
                        let n = data::read(&self.pool, &st.pages, st.rec.size, offset, buf);
                        st.last_use = self.lru.tick();
                        self.temp_touch_atime(tx, file, &mut st)?;
                        drop(st);
                        Counters::add(&self.counters.app_bytes_read, n as u64);
                        reply(&buf[..n]);
                        return Ok(());
                    }
                }
                let file = self.lower_file(&h)?;
                let n = match self.via(&h)? {
                    Via::Cache(key) => {
                        let cached = match self.cached(key) {
                            Some(cf) => self.cached_read(&cf, file, offset, buf)?,
                            None => None,
                        };
                        if let Some(n) = cached {
                            Counters::add(&self.counters.app_bytes_read, n as u64);
                            reply(&buf[..n]);
                            return Ok(());
                        }
                        self.lower.read(file, offset, buf)?
                    }
                    Via::Direct(key) => {
                        self.with_clean_lower(key, || Ok(self.lower.read(file, offset, buf)?))?
                    }
                    Via::Plain => self.lower.read(file, offset, buf)?,
                };
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
        let mut pressured = false;
        let mut write_through = false;
        loop {
            let result = self.op(Op::Write, |tx| {
                let h = self.handle(fh)?;
                if let Open::Temp { file, .. } = &h.file
                    && let Some(written) = self.temp_write(tx, file, offset, data, kill_suidgid)?
                {
                    return Ok((written, After::Temp(Arc::clone(file))));
                }
                let via = self.via(&h)?;
                if kill_suidgid || matches!(via, Via::Cache(_)) {
                    let Obj::Lower(node) = self.obj(h.node_id)? else {
                        return Err(stale(h.node_id));
                    };
                    if kill_suidgid {
                        self.kill_suidgid(&node)?;
                    }
                    if let Via::Cache(key) = via
                        && self.cache.config.enabled
                        && !write_through
                    {
                        while let Some(cf) = self.cache_entry(tx, &node, key)? {
                            if let Some(n) = self.cached_write(tx, &cf, offset, data)? {
                                Counters::add(&self.counters.app_bytes_written, n as u64);
                                return Ok((n, After::Cached));
                            }
                        }
                    }
                }
                let file = self.lower_file(&h)?;
                let n = match via {
                    Via::Cache(key) | Via::Direct(key) => {
                        self.with_clean_lower(key, || Ok(self.lower.write(file, offset, data)?))?
                    }
                    Via::Plain => self.lower.write(file, offset, data)?,
                };
                Counters::add(&self.counters.app_bytes_written, n as u64);
                Counters::add(&self.counters.lower_bytes_written, n as u64);
                Ok((n, After::Nothing))
            });
            match result {
                Ok((n, After::Temp(file))) => {
                    self.after_temp_write(&file);
                    return Ok(n);
                }
                Ok((n, After::Cached)) => {
                    self.after_cached_write();
                    return Ok(n);
                }
                Ok((n, After::Nothing)) => return Ok(n),
                // Out of frames: make room (least recently used temp files first, inactive
                // dirty pages by the write-back policy), then, if that did not help, move this
                // file to the lower file system (a temp file is transformed, a cached file is
                // written back and the write goes through); never an error the lower file
                // system would not give.
                Err(FsError::NvramFull(_)) if !pressured => {
                    pressured = true;
                    self.relieve_pressure(true);
                    if let Err(e) = self.writeback_for_room() {
                        eprintln!("nvstack: write-back for room failed: {e}");
                    }
                }
                Err(FsError::NvramFull(e)) => {
                    let h = self.handle(fh)?;
                    match &h.file {
                        Open::Temp { file, .. } if file.lock().fate == Fate::Resident => {
                            self.transform(file, tempfs::Trigger::NvramFull)?;
                        }
                        _ if !write_through => {
                            write_through = true;
                            crate::cache::inc(&self.cache.counters.write_through);
                        }
                        _ => return Err(FsError::NvramFull(e)),
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// How IO on an open lower object (or a transformed temp file) reaches the lower file.
    pub(crate) fn via(&self, h: &Handle<Open<L>>) -> FsResult<Via> {
        Ok(match &h.file {
            Open::Lower { key, regular: true, direct: false, .. } => Via::Cache(*key),
            Open::Lower { key, regular: true, direct: true, .. } => Via::Direct(*key),
            Open::Lower { .. } | Open::Dir { .. } => Via::Plain,
            Open::Temp { .. } => match self.obj(h.node_id)? {
                Obj::Lower(n) => Via::Cache(self.lower.key(&n)),
                Obj::Temp(_) => Via::Plain,
            },
        })
    }

    pub fn flush(&self, fh: u64) -> FsResult<()> {
        self.op(Op::Flush, |_| self.handle(fh).map(drop))
    }

    pub fn release(&self, fh: u64) -> FsResult<()> {
        self.op(Op::Release, |tx| {
            let h = self.handles.remove(fh).ok_or_else(|| stale(fh))?;
            if let Open::Temp { file, .. } = &h.file {
                self.temp_release(tx, file)?;
            }
            Ok(())
        })
    }

    /// A temp file is durable once a write returns (undo mode): fsync has nothing to do.
    pub fn fsync(&self, fh: u64, datasync: bool) -> FsResult<()> {
        self.op(Op::Fsync, |_| {
            let h = self.handle(fh)?;
            if let Open::Temp { file, .. } = &h.file
                && file.lock().fate == Fate::Resident
            {
                return Ok(());
            }
            Ok(self.lower.fsync(self.lower_file(&h)?, datasync)?)
        })
    }

    pub fn opendir(&self, node_id: u64) -> FsResult<u64> {
        self.op(Op::Opendir, |_| {
            let node = self.dir(node_id)?;
            let dir = self.lower.opendir(&node)?;
            let key = self.lower.key(&node);
            self.register(node_id, Open::Dir { file: dir, key, listing: Mutex::new(None) })
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
            self.list_merged(&h, offset, &mut |l| emit(l.entry.clone()))
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
            self.list_merged(&handle, offset, &mut |listed| {
                let entry = &listed.entry;
                if entry.name == "." || entry.name == ".." {
                    return emit(entry, None);
                }
                let looked_up = match &listed.temp {
                    Some(f) => {
                        let idx = self.index.lock().expect("temp index");
                        let st = f.lock();
                        if st.fate == Fate::Resident {
                            Ok(self.temp_entry(f, &st))
                        } else {
                            drop(st);
                            drop(idx);
                            self.lower.lookup(&dir, &entry.name).map(|(n, a)| self.entry(n, a))
                        }
                    }
                    None => self.lower.lookup(&dir, &entry.name).map(|(n, a)| self.entry(n, a)),
                };
                match looked_up {
                    Ok(looked_up) => {
                        let added = emit(entry, Some(&looked_up));
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
        self.op(Op::Fsyncdir, |_| {
            let h = self.handle(fh)?;
            Ok(self.lower.fsyncdir(self.lower_file(&h)?, datasync)?)
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
            let mut s = self.lower.statfs(&node)?;
            let unit = u64::from(s.frsize.max(1));
            let reserved = self.reserved_bytes().div_ceil(unit);
            s.bfree = s.bfree.saturating_sub(reserved);
            s.bavail = s.bavail.saturating_sub(reserved);
            s.ffree = s.ffree.saturating_sub(self.tc.files_resident.load(Ordering::Relaxed));
            Ok(s)
        })
    }

    /// Extended attributes live in the lower file system: setting or removing one on a temp
    /// file transforms it first. A temp file has none (reads say ENODATA, lists are empty).
    /// With xattrs off every xattr request fails with ENOSYS: the kernel then marks the
    /// operation unsupported for the mount and answers EOPNOTSUPP itself from then on.
    fn xattrs_off(&self, op: Op) -> FsResult<()> {
        if self.xattrs {
            return Ok(());
        }
        self.counters.request(op, false);
        Err(errno(libc::ENOSYS))
    }

    pub fn setxattr(&self, node_id: u64, name: &OsStr, value: &[u8], flags: i32) -> FsResult<()> {
        self.xattrs_off(Op::Setxattr)?;
        let node = self.lower_object(node_id, tempfs::Trigger::Xattr)?;
        self.op(Op::Setxattr, |_| Ok(self.lower.setxattr(&node, name, value, flags)?))
    }

    pub fn getxattr(&self, node_id: u64, name: &OsStr, size: usize) -> FsResult<Vec<u8>> {
        self.xattrs_off(Op::Getxattr)?;
        self.op(Op::Getxattr, |_| match self.lower_obj(node_id)? {
            Ok(node) => Ok(self.lower.getxattr(&node, name, size)?),
            Err(_) => Err(errno(libc::ENODATA)),
        })
    }

    pub fn listxattr(&self, node_id: u64, size: usize) -> FsResult<Vec<u8>> {
        self.xattrs_off(Op::Listxattr)?;
        self.op(Op::Listxattr, |_| match self.lower_obj(node_id)? {
            Ok(node) => Ok(self.lower.listxattr(&node, size)?),
            Err(_) => Ok(Vec::new()),
        })
    }

    pub fn removexattr(&self, node_id: u64, name: &OsStr) -> FsResult<()> {
        self.xattrs_off(Op::Removexattr)?;
        if let Err(f) = self.lower_obj(node_id)? {
            // Nothing to remove: answer as the lower file system would for a file without it.
            if f.lock().fate == Fate::Resident {
                self.counters.request(Op::Removexattr, false);
                return Err(errno(libc::ENODATA));
            }
        }
        let node = self.lower_object(node_id, tempfs::Trigger::Xattr)?;
        self.op(Op::Removexattr, |_| Ok(self.lower.removexattr(&node, name)?))
    }

    /// Permission checks are the kernel's (`default_permissions`); this only confirms the node.
    pub fn access(&self, node_id: u64) -> FsResult<()> {
        self.op(Op::Access, |_| self.inode(node_id).map(drop))
    }

    /// Allocation is the lower file system's business: fallocate on a temp file transforms
    /// it first.
    pub fn fallocate(&self, fh: u64, mode: i32, offset: u64, len: u64) -> FsResult<()> {
        let h = self.handle(fh)?;
        if let Open::Temp { .. } = &h.file {
            self.lower_object(h.node_id, tempfs::Trigger::Fallocate)?;
        }
        self.op(Op::Fallocate, |_| {
            let file = self.lower_file(&h)?;
            match self.via(&h)? {
                Via::Cache(key) | Via::Direct(key) => self
                    .with_clean_lower(key, || Ok(self.lower.fallocate(file, mode, offset, len)?)),
                Via::Plain => Ok(self.lower.fallocate(file, mode, offset, len)?),
            }
        })
    }

    pub fn lseek(&self, fh: u64, offset: i64, whence: i32) -> FsResult<i64> {
        self.op(Op::Lseek, |_| {
            let h = self.handle(fh)?;
            if let Open::Temp { file, .. } = &h.file {
                let st = file.lock();
                if st.fate == Fate::Resident {
                    let from = u64::try_from(offset).map_err(|_| errno(libc::EINVAL))?;
                    let found = match whence {
                        libc::SEEK_DATA => data::seek_data(&st.pages, st.rec.size, from),
                        libc::SEEK_HOLE => data::seek_hole(&st.pages, st.rec.size, from),
                        _ => return Err(errno(libc::EINVAL)),
                    };
                    return found.and_then(|o| i64::try_from(o).ok()).ok_or(errno(libc::ENXIO));
                }
            }
            if let Via::Cache(key) = self.via(&h)?
                && let Some(cf) = self.cached(key)
                && matches!(whence, libc::SEEK_DATA | libc::SEEK_HOLE)
                && let Some(found) = self.cached_seek(&cf, self.lower_file(&h)?, offset, whence)?
            {
                return Ok(found);
            }
            Ok(self.lower.lseek(self.lower_file(&h)?, offset, whence)?)
        })
    }

    pub fn copy_file_range(
        &self,
        fh_in: u64,
        offset_in: u64,
        fh_out: u64,
        offset_out: u64,
        len: u64,
    ) -> FsResult<u64> {
        let input = self.handle(fh_in)?;
        let output = self.handle(fh_out)?;
        // A temp file on either side, an input with dirty pages in NVRAM, or an output the
        // cache takes: copy through the engine.
        let temp = |h: &Handle<Open<L>>| matches!(h.file, Open::Temp { .. });
        let (via_in, via_out) = (self.via(&input)?, self.via(&output)?);
        let cached_in = matches!(via_in, Via::Cache(k) if self.cached(k).is_some());
        let cached_out = matches!(via_out, Via::Cache(_)) && self.cache.config.enabled;
        if temp(&input) || temp(&output) || cached_in || cached_out {
            return self.copy_by_buffer(fh_in, offset_in, fh_out, offset_out, len);
        }
        self.op(Op::CopyFileRange, |_| {
            let copy = || -> FsResult<u64> {
                Ok(self.lower.copy_file_range(
                    self.lower_file(&input)?,
                    offset_in,
                    self.lower_file(&output)?,
                    offset_out,
                    len,
                )?)
            };
            let n = match via_out {
                Via::Cache(key) | Via::Direct(key) => self.with_clean_lower(key, copy)?,
                Via::Plain => copy()?,
            };
            Counters::add(&self.counters.app_bytes_written, n);
            Counters::add(&self.counters.lower_bytes_written, n);
            Ok(n)
        })
    }

    /// copy_file_range through the engine (a temp file or the page cache on a side): read and
    /// write in chunks of at most 1 MiB; each chunk is one read and one write operation.
    fn copy_by_buffer(
        &self,
        fh_in: u64,
        offset_in: u64,
        fh_out: u64,
        offset_out: u64,
        len: u64,
    ) -> FsResult<u64> {
        const CHUNK: u64 = 1 << 20;
        let mut done = 0u64;
        while done < len {
            let want = (len - done).min(CHUNK) as u32;
            let mut chunk = Vec::new();
            self.read(fh_in, offset_in + done, want, |d| chunk.extend_from_slice(d))?;
            if chunk.is_empty() {
                break;
            }
            let n = self.write(fh_out, offset_out + done, &chunk, false)?;
            done += n as u64;
            if n < chunk.len() {
                break;
            }
        }
        self.counters.request(Op::CopyFileRange, true);
        Ok(done)
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
        stats.tempfiles = self.tc.snapshot(&self.temp);
        (stats.cache, stats.writeback) =
            self.cache.counters.snapshot(&self.cache.config, self.cache.policy.name());
        stats
    }

    /// Ends the engine: temp files are transformed (unless configured to stay in NVRAM),
    /// every open handle is closed, the region is marked clean.
    pub fn shutdown(self) {
        if self.temp.transform_on_unmount {
            self.transform_all(tempfs::Trigger::Unmount, &mut |_, _| {});
        }
        if self.cache.config.writeback_on_unmount
            && let (_, Some(e)) = self.flush_cache(Reason::Unmount, &mut |_, _| {})
        {
            eprintln!("nvstack: write-back at unmount failed (the pages stay in NVRAM): {e}");
        }
        let Engine { pool, inodes, handles, index, .. } = self;
        drop(handles);
        drop(inodes);
        drop(index);
        pool.close();
    }

    /// The root's node id (always 1).
    pub fn root_id(&self) -> u64 {
        ROOT_ID
    }

    /// Bytes the lower file system must keep free for temp files: their resident pages plus
    /// one block per file (inode table and directory growth are the lower file system's own).
    pub(crate) fn reserved_bytes(&self) -> u64 {
        (self.reserved_pages.load(Ordering::Relaxed)
            + self.tc.files_resident.load(Ordering::Relaxed))
            * data::PAGE
    }

    /// ENOSPC now when the lower file system could not take the temp files' data plus
    /// `more_pages` at transform time.
    pub(crate) fn reserve(&self, more_pages: u64) -> FsResult<()> {
        if more_pages == 0 {
            return Ok(());
        }
        let s = self.lower.statfs(self.lower.root())?;
        let avail = s.bavail.saturating_mul(u64::from(s.frsize.max(1)));
        if self.reserved_bytes() + more_pages * data::PAGE > avail {
            return Err(errno(libc::ENOSPC));
        }
        Ok(())
    }
}

/// The set-ID bits a write or truncate by an unprivileged caller removes (see
/// `Engine::kill_suidgid`).
pub(crate) fn suidgid_bits(mode: u32) -> u32 {
    let mut kill = 0;
    if mode & libc::S_ISUID != 0 {
        kill |= libc::S_ISUID;
    }
    if mode & (libc::S_ISGID | libc::S_IXGRP) == libc::S_ISGID | libc::S_IXGRP {
        kill |= libc::S_ISGID;
    }
    kill
}

/// `TxError` while changing a temp file: frames or undo space ran out.
#[allow(clippy::needless_pass_by_value)] // used as `map_err(nvram_full)`
pub(crate) fn nvram_full(e: TxError) -> FsError {
    FsError::NvramFull(e.to_string())
}
