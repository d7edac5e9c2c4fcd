//! `impl fuser::Filesystem`: one handler per request, named after the syscall.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use engine::route::Opened;
use engine::{Engine, Entry, FsError, TakeBack, TakenBack};
use fuser::{
    AccessFlags, BackingId, CopyFileRangeFlags, FileHandle, FileType, Filesystem, FopenFlags,
    Generation, INodeNo, IoctlFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl,
    ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use lower::{Creds, LowerFs, SetAttr};

use crate::attr::{file_attr, kind, negative_entry, time_set};
use crate::errno::errno;

/// How long the kernel may cache what we tell it. See the crate docs for why long is coherent.
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    pub entry: Duration,
    pub attr: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts { entry: Duration::from_secs(86_400), attr: Duration::from_secs(86_400) }
    }
}

/// The FUSE file system: the engine plus the reply policy.
#[derive(Debug)]
pub struct FuseFs<L: LowerFs> {
    engine: Arc<Engine<L>>,
    timeouts: Timeouts,
    /// Largest write the kernel may send (bytes).
    max_write: u32,
    /// The backing file of each node with passthrough opens, with their count: the kernel
    /// wants one backing file per inode for all its passthrough opens (`route/` chooses).
    backings: Mutex<HashMap<u64, (Arc<BackingId>, u32)>>,
    /// Which opens of files that live in NVRAM bypass the kernel's page cache (`--direct-io`,
    /// a [`DirectIo`] as u8): their bytes are then cached once, in NVRAM, and each write(2) is
    /// one request. Turned to `Never` at init when the kernel cannot mmap such files
    /// (FUSE_DIRECT_IO_ALLOW_MMAP).
    direct_io: std::sync::atomic::AtomicU8,
    /// The session's notifier (set by the daemon once the session exists): the direct path's
    /// invalidations (`direct.rs`).
    notifier: crate::direct::NotifierSlot,
}

/// `--direct-io`: which opens of NVRAM-resident files (temp files) bypass the kernel's page
/// cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum DirectIo {
    /// None: the kernel caches them as any file.
    Never = 0,
    /// Opens that cannot read (O_WRONLY): writers such as tar, cp and mail delivery take one
    /// request per write(2) and leave no second copy; readers keep the page cache.
    WriteOnly = 1,
    /// Every open of such a file.
    Nvram = 2,
}

/// The only flags the kernel accepts with a passthrough open (besides direct IO): it has no
/// page cache of its own to keep.
const PASSTHROUGH_FLAGS: FopenFlags = FopenFlags::FOPEN_NOFLUSH;

/// What a kernel refusal of a backing file says: errors that mean "never" (no privilege, no
/// support) turn passthrough off; others refuse this file only.
fn passthrough_impossible(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EPERM | libc::ENOTTY | libc::EOPNOTSUPP | libc::ENOSYS))
}

/// A reply that can carry a backing file (open and create).
trait BackingReply {
    fn open_backing(&self, fd: std::os::fd::BorrowedFd<'_>) -> std::io::Result<BackingId>;
}

impl BackingReply for ReplyOpen {
    fn open_backing(&self, fd: std::os::fd::BorrowedFd<'_>) -> std::io::Result<BackingId> {
        ReplyOpen::open_backing(self, fd)
    }
}

impl BackingReply for ReplyCreate {
    fn open_backing(&self, fd: std::os::fd::BorrowedFd<'_>) -> std::io::Result<BackingId> {
        ReplyCreate::open_backing(self, fd)
    }
}

/// Flags that the kernel handles itself and that must not reach the lower open: offsets of
/// O_APPEND writes are chosen by the kernel, O_DIRECT alignment is the kernel's business, and
/// creation flags belong to `create`.
const KERNEL_FLAGS: i32 =
    libc::O_APPEND | libc::O_DIRECT | libc::O_CREAT | libc::O_EXCL | libc::O_NOCTTY;

/// The caller's credentials for a creation. Root's supplementary groups are never consulted
/// (a root caller creates as the daemon does, and the set-group-ID rules exempt it), so they
/// are not read: reading /proc/PID/status took 4-5 % of the daemon's CPU in Postmark.
fn creds(req: &Request) -> Creds {
    let groups = if req.uid() == 0 { Vec::new() } else { Creds::groups_of(req.pid()) };
    Creds { uid: req.uid(), gid: req.gid(), groups }
}

impl<L: LowerFs> FuseFs<L> {
    pub fn new(engine: Arc<Engine<L>>, timeouts: Timeouts, max_write: u32) -> Self {
        FuseFs {
            engine,
            timeouts,
            max_write,
            backings: Mutex::new(HashMap::new()),
            direct_io: std::sync::atomic::AtomicU8::new(DirectIo::Never as u8),
            notifier: crate::direct::NotifierSlot::default(),
        }
    }

    /// Where the daemon puts the session's notifier.
    pub fn notifier_slot(&self) -> crate::direct::NotifierSlot {
        std::sync::Arc::clone(&self.notifier)
    }

    pub(crate) fn notifier(&self) -> Option<&fuser::Notifier> {
        self.notifier.get()
    }

    pub(crate) fn engine(&self) -> &Engine<L> {
        &self.engine
    }

    /// The entry of a lookup or readdirplus answer: a delegated node is taken back first
    /// (the kernel caches the attributes it gets) and its attributes read again.
    fn settled_entry(&self, e: Entry) -> Result<Entry, FsError> {
        if !self.engine.delegated(e.node_id) {
            return Ok(e);
        }
        let t = self.engine.take_back(e.node_id, TakeBack::Lookup)?;
        self.settle(e.node_id, t);
        let attr = self.engine.getattr(e.node_id)?;
        Ok(Entry { attr, ..e })
    }

    /// `--direct-io`: see the field.
    #[must_use]
    pub fn with_direct_io(self, mode: DirectIo) -> Self {
        self.direct_io.store(mode as u8, std::sync::atomic::Ordering::Relaxed);
        self
    }

    fn direct_io(&self) -> DirectIo {
        match self.direct_io.load(std::sync::atomic::Ordering::Relaxed) {
            1 => DirectIo::WriteOnly,
            2 => DirectIo::Nvram,
            _ => DirectIo::Never,
        }
    }

    /// The backing file for passthrough open `o` of node `ino` (the node's, or registered
    /// now); `None` when the kernel refused it, after which the open takes the NVRAM path.
    fn backing(&self, ino: u64, o: &Opened, reply: &impl BackingReply) -> Option<Arc<BackingId>> {
        let mut backings = self.backings.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((id, opens)) = backings.get_mut(&ino) {
            *opens += 1;
            return Some(Arc::clone(id));
        }
        let refused = |off: bool, why: &dyn std::fmt::Display| {
            if off && self.engine.passthrough_enabled() {
                eprintln!(
                    "nvstack: passthrough is not available ({why}); every file takes the NVRAM path"
                );
            }
            self.engine.passthrough_refused(o.fh, off);
            None
        };
        let Some(fd) = self.engine.backing_fd(o.fh) else {
            return refused(true, &"the lower file system has no descriptors");
        };
        match reply.open_backing(std::os::fd::AsFd::as_fd(&fd)) {
            Ok(id) => {
                let id = Arc::new(id);
                backings.insert(ino, (Arc::clone(&id), 1));
                Some(id)
            }
            Err(e) => refused(passthrough_impossible(&e), &e),
        }
    }

    /// One passthrough open of `ino` closed: the last lets go of the backing file.
    fn release_backing(&self, ino: u64) {
        let mut backings = self.backings.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((_, opens)) = backings.get_mut(&ino) {
            *opens -= 1;
            if *opens == 0 {
                backings.remove(&ino);
            }
        }
    }

    /// The flags of an open's reply on the NVRAM path. FLUSH is never needed: the engine
    /// keeps nothing per close (no POSIX locks are served; every write is durable or written
    /// when it returns), so the kernel is told not to send it (one round trip less per close).
    /// A file that lives in NVRAM is opened for direct IO as `--direct-io` says (`flags`: the
    /// open's).
    fn opened_flags(&self, o: &Opened, flags: i32) -> FopenFlags {
        let direct = match self.direct_io() {
            DirectIo::Never => false,
            DirectIo::WriteOnly => flags & libc::O_ACCMODE == libc::O_WRONLY,
            DirectIo::Nvram => true,
        };
        // The direct path (docs/direct-path.md, DG2): an open that may be delegated keeps no
        // page cache, so that nothing the kernel caches for its reads can miss a write the
        // library makes (its reads are READ requests, answered after a merge).
        let delegable = self.engine.direct_enabled() && !o.passthrough && engine::writable(flags);
        let mut flags = FopenFlags::FOPEN_NOFLUSH;
        if (o.nvram_resident && direct) || delegable {
            flags |= FopenFlags::FOPEN_DIRECT_IO;
        } else if o.keep_cache && !o.passthrough && !self.timeouts.attr.is_zero() {
            // (a passthrough open the kernel refused keeps no page cache: T3)
            flags |= FopenFlags::FOPEN_KEEP_CACHE;
        }
        flags
    }

    /// A READ answered from the engine (the reply is given inside, from the worker's buffer).
    fn read_answered(&self, fh: FileHandle, offset: u64, size: u32, reply: ReplyData) {
        let mut reply = Some(reply);
        let result = self.engine.read(fh.0, offset, size, |data| {
            reply.take().expect("one reply").data(data);
        });
        if let (Err(e), Some(reply)) = (result, reply) {
            reply.error(errno(&e));
        }
    }

    fn reply_entry(&self, reply: ReplyEntry, result: Result<Entry, FsError>) {
        match result {
            Ok(e) => reply.entry_with_ttls(
                &self.timeouts.attr,
                &self.timeouts.entry,
                &file_attr(e.node_id, &e.attr),
                Generation(0),
            ),
            Err(e) => reply.error(errno(&e)),
        }
    }
}

fn empty(reply: ReplyEmpty, result: Result<(), FsError>) {
    match result {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(&e)),
    }
}

impl<L: LowerFs> Filesystem for FuseFs<L> {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(self.max_write);
        // Lookups and readdir in one directory may run in parallel: each maps to one atomic
        // lower syscall.
        let _ = config.add_capabilities(fuser::InitFlags::FUSE_PARALLEL_DIROPS);
        // We remove set-ID bits on writes and truncates ourselves (Engine::kill_suidgid). In
        // exchange the kernel marks inodes S_NOSEC after their first write instead of asking
        // for security.capability before every write (one extra request per write otherwise).
        let _ = config.add_capabilities(fuser::InitFlags::FUSE_HANDLE_KILLPRIV_V2);
        // readdirplus answers `ls -l` and directory walks with one request per buffer instead
        // of one lookup per entry; the kernel decides per directory when it pays (AUTO).
        let _ = config.add_capabilities(
            fuser::InitFlags::FUSE_DO_READDIRPLUS | fuser::InitFlags::FUSE_READDIRPLUS_AUTO,
        );
        // --direct-io and the direct path: shared mmap of a direct-IO file needs the kernel's
        // consent.
        if (self.direct_io() != DirectIo::Never || self.engine.direct_enabled())
            && config.add_capabilities(fuser::InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP).is_err()
        {
            eprintln!(
                "nvstack: the kernel cannot mmap direct-IO files; --direct-io is never and the \
                 direct path is off"
            );
            self.direct_io.store(DirectIo::Never as u8, std::sync::atomic::Ordering::Relaxed);
            self.engine.direct_unavailable();
        }
        // Passthrough (route/): the lower file system may not be stacked itself (depth 1
        // lets nvstack be the lower layer of an overlayfs). Without kernel support, every
        // file takes the NVRAM path.
        if self.engine.passthrough_enabled() {
            let ok = config.add_capabilities(fuser::InitFlags::FUSE_PASSTHROUGH).is_ok()
                && config.set_max_stack_depth(1).is_ok();
            if !ok {
                eprintln!(
                    "nvstack: the kernel has no FUSE passthrough; every file takes the NVRAM path"
                );
                self.engine.passthrough_unavailable();
            }
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.engine.lookup(parent.0, name).and_then(|e| self.settled_entry(e)) {
            // A name that does not exist is answered as a *negative entry* (node 0) valid for
            // the entry timeout, so the kernel keeps a negative dentry and does not ask again:
            // sqlite's hot-journal check before every transaction, a shell's PATH search or
            // an interpreter's import path otherwise cost a LOOKUP each time. Every name
            // appears through this mount (the lower directory is nvstack's while mounted), and
            // a creation through it replaces the negative dentry, as positive entries are
            // cached for the same timeout. `--entry-timeout 0` answers ENOENT, uncached.
            Err(e) if errno(&e) == fuser::Errno::ENOENT && !self.timeouts.entry.is_zero() => {
                reply.entry_with_ttls(
                    &self.timeouts.attr,
                    &self.timeouts.entry,
                    &negative_entry(),
                    Generation(0),
                );
            }
            result => self.reply_entry(reply, result),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.engine.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let mut ttl = self.timeouts.attr;
        if let Some(holder) = self.engine.delegation_holder(ino.0) {
            // The holder's own stat keeps the delegation, answered uncached (the library goes
            // on writing); anyone else's ends it.
            let why =
                if fh.map(|f| f.0) == Some(holder) { TakeBack::Stat } else { TakeBack::Getattr };
            match self.take_back(ino.0, why) {
                Ok(TakenBack::Kept) => ttl = Duration::ZERO,
                Ok(t) => self.settle(ino.0, t),
                Err(e) => return reply.error(e),
            }
        }
        match self.engine.getattr(ino.0) {
            Ok(a) => reply.attr(&ttl, &file_attr(ino.0, &a)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        match self.take_back(ino.0, TakeBack::Setattr) {
            Ok(t) => self.settle(ino.0, t),
            Err(e) => return reply.error(e),
        }
        let set = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: atime.map(time_set),
            mtime: mtime.map(time_set),
        };
        match self.engine.setattr(ino.0, fh.map(|f| f.0), &set, req.uid() != 0) {
            Ok(a) => reply.attr(&self.timeouts.attr, &file_attr(ino.0, &a)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.engine.readlink(ino.0) {
            Ok(target) => reply.data(&target),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        self.reply_entry(
            reply,
            self.engine.mknod(&creds(req), parent.0, name, mode, u64::from(rdev)),
        );
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        self.reply_entry(reply, self.engine.mkdir(&creds(req), parent.0, name, mode));
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(reply, self.engine.unlink(parent.0, name));
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(reply, self.engine.rmdir(parent.0, name));
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        self.reply_entry(
            reply,
            self.engine.symlink(&creds(req), parent.0, link_name, target.as_os_str()),
        );
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        empty(reply, self.engine.rename(parent.0, name, newparent.0, newname, flags.bits()));
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        self.reply_entry(reply, self.engine.link(ino.0, newparent.0, newname));
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let opened = self.engine.open_routed(ino.0, flags.0 & !KERNEL_FLAGS);
        // DG1: a delegation is taken back after the open registered (so that a grant racing
        // with it sees it or is seen), before the kernel has the answer.
        if let Ok(o) = &opened
            && self.engine.delegated(ino.0)
        {
            match self.take_back(ino.0, TakeBack::Open) {
                Ok(t) => self.settle(ino.0, t),
                Err(e) => {
                    let _ = self.engine.release(o.fh);
                    return reply.error(e);
                }
            }
        }
        match opened {
            Ok(o) if o.passthrough => match self.backing(ino.0, &o, &reply) {
                Some(id) => reply.opened_passthrough(FileHandle(o.fh), PASSTHROUGH_FLAGS, &id),
                None => reply.opened(FileHandle(o.fh), self.opened_flags(&o, flags.0)),
            },
            Ok(o) => reply.opened(FileHandle(o.fh), self.opened_flags(&o, flags.0)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let taken = match self.take_back(ino.0, TakeBack::Read) {
            Ok(t) => t,
            Err(e) => return reply.error(e),
        };
        self.read_answered(fh, offset, size, reply);
        self.settle(ino.0, taken);
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let taken = match self.take_back(ino.0, TakeBack::Write) {
            Ok(t) => t,
            Err(e) => return reply.error(e),
        };
        let mut offset = offset;
        if flags.0 & libc::O_APPEND != 0 {
            // An O_APPEND write of a file the library wrote (stdio's own, a child's after
            // fork, any after the delegation ended): the kernel may have taken its offset from
            // a size that missed the library's appends. It goes where an append goes, the end
            // of the file (pages the kernel filled at the wrong place are dropped: `settle`).
            match self.engine.append_offset(ino.0, offset) {
                Ok(o) => offset = o,
                Err(e) => return reply.error(errno(&e)),
            }
        }
        let kill = write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID);
        match self.engine.write(fh.0, offset, data, kill) {
            Ok(n) => {
                reply.written(n as u32);
                // After the answer: the kernel holds this write's pages locked until then.
                self.settle(ino.0, taken);
                // --nbw async-fg: the pages this write patched are fetched now, after the
                // writer has its answer.
                self.engine.after_write_answered();
            }
            Err(e) => {
                reply.error(errno(&e));
                self.settle(ino.0, taken);
            }
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        empty(reply, self.engine.flush(fh.0));
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        if self.engine.delegation_holder(ino.0) == Some(fh.0) {
            match self.take_back(ino.0, TakeBack::Release) {
                Ok(t) => self.settle(ino.0, t),
                Err(e) => return reply.error(e),
            }
        }
        match self.engine.release(fh.0) {
            Ok(passthrough) => {
                if passthrough {
                    self.release_backing(ino.0);
                }
                reply.ok();
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        if self.engine.spares_fsync() {
            // `--fsync-requests spare`: the kernel stops sending FSYNC (fc->no_fsync).
            return reply.error(crate::errno::SPARED);
        }
        if let Err(e) = self.take_back(ino.0, TakeBack::Fsync) {
            return reply.error(e);
        }
        empty(reply, self.engine.fsync(fh.0, datasync));
    }

    fn ioctl(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        self.direct_ioctl(req, ino.0, fh.0, cmd, in_data, reply);
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.engine.opendir(ino.0) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let result = self.engine.readdir(fh.0, offset, &mut |entry| {
            let kind = entry.kind.map_or(FileType::RegularFile, kind);
            // `add` returns true when the reply buffer is full: stop, this entry is not sent
            // and the next readdir resumes after the last one that was.
            !reply.add(INodeNo(entry.ino), entry.offset, kind, &entry.name)
        });
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let result = self.engine.readdirplus(fh.0, offset, &mut |entry, looked_up| {
            let full = match looked_up {
                // A delegated file's attributes are the merged file's, not the library's
                // latest: given uncached, so that a stat asks (and takes the delegation back;
                // no take-back here, inside the listing's locks).
                Some(e) if self.engine.delegated(e.node_id) => reply.add(
                    INodeNo(e.node_id),
                    entry.offset,
                    &entry.name,
                    &Duration::ZERO,
                    &file_attr(e.node_id, &e.attr),
                    Generation(0),
                ),
                Some(e) => reply.add(
                    INodeNo(e.node_id),
                    entry.offset,
                    &entry.name,
                    &self.timeouts.entry,
                    &file_attr(e.node_id, &e.attr),
                    Generation(0),
                ),
                // The kernel links no inode for "." and ".." (and counts no lookup), so they
                // carry only the dirent part: their inode number and type.
                None => reply.add(
                    INodeNo(entry.ino),
                    entry.offset,
                    &entry.name,
                    &Duration::ZERO,
                    &file_attr(entry.ino, &lower::Attr::default_dir()),
                    Generation(0),
                ),
            };
            !full
        });
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        empty(reply, self.engine.releasedir(fh.0));
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        if self.engine.spares_fsync() {
            // `--fsync-requests spare`: the kernel stops sending FSYNCDIR (fc->no_fsyncdir).
            return reply.error(crate::errno::SPARED);
        }
        empty(reply, self.engine.fsyncdir(fh.0, datasync));
    }

    fn statfs(&self, _req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        match self.engine.statfs(ino.0) {
            Ok(s) => reply.statfs(
                s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.frsize,
            ),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        empty(reply, self.engine.setxattr(ino.0, name, value, flags));
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        match self.engine.getxattr(ino.0, name, size as usize) {
            Ok(value) if size == 0 => reply.size(value.len() as u32),
            Ok(value) => reply.data(&value),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        match self.engine.listxattr(ino.0, size as usize) {
            Ok(list) if size == 0 => reply.size(list.len() as u32),
            Ok(list) => reply.data(&list),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(reply, self.engine.removexattr(ino.0, name));
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        empty(reply, self.engine.access(ino.0));
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let flags = flags & !KERNEL_FLAGS;
        match self.engine.create_routed(&creds(req), parent.0, name, mode, flags) {
            Ok((e, o)) => {
                let attr = file_attr(e.node_id, &e.attr);
                let ttl = &self.timeouts.entry;
                let backing =
                    if o.passthrough { self.backing(e.node_id, &o, &reply) } else { None };
                match backing {
                    Some(id) => reply.created_passthrough(
                        ttl,
                        &attr,
                        Generation(0),
                        FileHandle(o.fh),
                        PASSTHROUGH_FLAGS,
                        &id,
                    ),
                    None => reply.created(
                        ttl,
                        &attr,
                        Generation(0),
                        FileHandle(o.fh),
                        self.opened_flags(&o, flags),
                    ),
                }
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        match self.take_back(ino.0, TakeBack::Other) {
            Ok(t) => self.settle(ino.0, t),
            Err(e) => return reply.error(e),
        }
        empty(reply, self.engine.fallocate(fh.0, mode, offset, length));
    }

    fn lseek(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        match self.take_back(ino.0, TakeBack::Other) {
            Ok(t) => self.settle(ino.0, t),
            Err(e) => return reply.error(e),
        }
        match self.engine.lseek(fh.0, offset, whence) {
            Ok(off) => reply.offset(off),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        for ino in [ino_in.0, ino_out.0] {
            match self.take_back(ino, TakeBack::Other) {
                Ok(t) => self.settle(ino, t),
                Err(e) => return reply.error(e),
            }
        }
        let len = len.min(u64::from(u32::MAX));
        match self.engine.copy_file_range(fh_in.0, offset_in, fh_out.0, offset_out, len) {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(errno(&e)),
        }
    }
}
