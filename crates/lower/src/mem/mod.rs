//! An in-memory [`LowerFs`] with *pending* and *durable* state, for deterministic tests.
//!
//! [`MemLower`] models a local POSIX file system (ext4 is the reference) closely enough that the
//! engine cannot tell it from [`PosixLower`](crate::posix::PosixLower) on the operations of the
//! trait (`tests/posix_vs_mem.rs` runs one table of operations on both and compares), and it
//! models *durability*: every change is pending until an fsync makes it durable, and
//! [`MemLower::crash`] returns the file system a power cut would leave behind. Nothing here reads
//! the wall clock or a random source: time comes from a [`Clock`] (a [`LogicalClock`] by
//! default), inode and block numbers are allocated lowest-first, and the randomised crash
//! ([`MemLower::crash_with`]) draws from a seeded generator, so every run replays exactly.
//!
//! ```text
//!   let fs = MemLower::new(MemConfig::default());
//!   let (_, _, f) = fs.create(&creds, fs.root(), "f".as_ref(), 0o644, O_RDWR)?;
//!   fs.write(&f, 0, b"data")?;                      // pending
//!   fs.fsync(&f, false)?;                            // data + attributes durable, name not
//!   fs.fsyncdir(&fs.opendir(fs.root())?, false)?;    // the name "f" durable
//!   let after = fs.crash();                          // new file system: durable state only
//! ```
//!
//! # State of an inode
//!
//! Every inode has a *live* version (what every operation reads and changes) and at most one
//! *durable* version (what a crash keeps). Per inode:
//!
//! ```text
//!   (none) --create/mkdir/mknod/symlink--> NEW: live only
//!   NEW --fsyncdir(parent)--> SKELETON durable (existence only)      [State::persist of parent]
//!   NEW | SKELETON | CLEAN --any change--> DIRTY: live != durable
//!   DIRTY --fsync(self) / fsyncdir(self) / sync_all--> CLEAN          [State::persist]
//!   nlink 0 and no holder --> live freed; durable kept while a durable entry names it
//!   durable unreachable from durable root and not linked live --> durable freed
//!                                                              [State::collect_durable]
//! ```
//!
//! # Rules (invariants)
//!
//! 1. Every change (data, size, attributes, times, xattrs, directory entries) is made to the
//!    live version only and is *pending*; reads always see the live version.
//! 2. `fsync(file)` copies the file's whole live version (data, size, attributes, xattrs) to its
//!    durable version. `fsync(file, datasync)` copies data and size and keeps the durable
//!    attributes, times and xattrs (fdatasync's contract).
//! 3. `fsyncdir(dir)` (or fsync of a directory) copies the directory's live version: its entries
//!    with their cookies and its attributes. An entry whose target has no durable version yet
//!    gives the target a *skeleton* durable version: kind, mode, owner, times, symlink target and
//!    device number; no data (size 0), no entries, no xattrs. So a new file's name is durable
//!    only after its directory is fsynced, its data only after the file is fsynced.
//! 4. A rename or link changes each directory involved; each change is durable when that
//!    directory is fsynced. Until both directories of a cross-directory rename are, a crash may
//!    keep the old name, the new name, or both.
//! 5. `sync_all()` (syncfs) makes every live inode durable.
//! 6. [`MemLower::crash`] builds a new file system from the durable versions by a breadth-first
//!    walk from the root (entries in name order): an entry whose target has no durable version is
//!    dropped; a directory reached a second time is dropped there, so the image is a tree; link
//!    counts and ".." come from the walk, as fsck would set them; unreachable inodes (orphans,
//!    unlinked-but-open files) are gone. The image is entirely durable and nothing is open.
//! 7. [`MemLower::crash_with`] does the same over versions mixed per object: for every inode its
//!    attributes, its xattrs, its size, each data block and each directory entry independently
//!    come from the durable or the live version (an inode never made durable mixes with its
//!    skeleton, a freed one is its durable version). The choices come from SplitMix64 seeded by
//!    `seed`, drawn over inodes in number order: the same seed after the same history gives the
//!    same image. It models a file system without a journal writing back in arbitrary order.
//! 8. An unlinked inode stays live (nlink 0, data readable and writable) while a node or open
//!    file holds it; its inode and blocks are freed when the last holder is dropped.
//! 9. Inode numbers: the root is 2; others the lowest from 11 up that no live or durable version
//!    uses, so a number is never reused while a crash could still bring the old object back.
//!    Blocks are numbered 1..=`blocks` (0 is never handed out, keeping its FIEMAP meaning of
//!    "unknown"), allocated at the block after the previous logical block when it is free (so
//!    sequential writes make one extent), else the lowest free block.
//! 10. Space: every data block (written or unwritten) and every directory takes one block; every
//!     inode one of `inodes`. Out of blocks, a write is short (or ENOSPC if nothing fits),
//!     fallocate is ENOSPC with nothing allocated, mkdir is ENOSPC; out of inodes, every create
//!     is ENOSPC. statfs reports the live use.
//! 11. Bytes past the size in the last block are zero, and written blocks lie below the size
//!     (only unwritten ones may lie beyond it: fallocate KEEP_SIZE), so extending shows zeros.
//! 12. Readdir cookies: "." is 1, ".." is 2; an entry gets its directory's next cookie when
//!     inserted and keeps it until removed (a rename onto an existing name keeps that entry's
//!     cookie, an exchange keeps both). `readdir(offset)` returns the entries with larger
//!     cookies in cookie order: a resumed listing never repeats or skips an entry that stayed.
//! 13. No permission checks (the kernel checks above FUSE). New objects belong to the `Creds`'
//!     uid and gid, or the parent's group when the parent is setgid (subdirectories then inherit
//!     S_ISGID; a non-member's setgid bit is stripped as Linux does).
//!
//! # Where the model deliberately differs from ext4
//!
//! - ext4 commits one journal transaction for all metadata, so an fsync of a new file usually
//!   makes its name durable too, and fsyncdir makes new children's sizes durable. The model is
//!   per object and stricter (rules 2-4, POSIX's minimum): code above it must fsync what it
//!   relies on. `crash_with` can leave states a journal never would (a half-applied rename).
//! - Freed blocks are reused at once; ext4 waits for the journal commit. A crash image that would
//!   put two files on one block moves the later one (in inode order) to a free block, or drops
//!   that block if none is free.
//! - A directory is always 4096 bytes and one block; symlinks take no block; xattrs share a
//!   fixed per-inode space (`xattr_space`) instead of in-inode space plus one block.
//! - Readdir cookies are sequence numbers, not name hashes: the order is creation order.
//! - No delayed allocation: blocks are allocated at write, FIEMAP never reports DELALLOC, and
//!   physical addresses are synthetic. Inode numbers are lowest-first, not spread by group.
//! - fallocate modes other than 0, KEEP_SIZE and PUNCH_HOLE|KEEP_SIZE (ZERO_RANGE,
//!   COLLAPSE_RANGE, INSERT_RANGE) are EOPNOTSUPP.
//! - FIFOs, sockets and devices are objects only: read and write on them are EINVAL (the kernel
//!   serves FIFO and device IO itself above FUSE), and opening never blocks.
//! - "system.*" xattrs (POSIX ACLs) are EOPNOTSUPP. Names containing '/' are EINVAL (the kernel
//!   never sends them). ".." of the root is the root. lseek on a directory knows only
//!   SEEK_SET/SEEK_CUR/SEEK_END.
//! - Every clock reading is new (a [`LogicalClock`] ticks per reading), there is no coarse
//!   timestamp granularity.
//!
//! # Files
//!
//! - `mod.rs`: the public types ([`MemLower`], [`MemConfig`], [`Clock`], [`LogicalClock`],
//!   [`MemNode`], [`MemFile`]), the limits, and the [`LowerFs`] impl, which dispatches each
//!   operation to its family below.
//! - `inode.rs`: the inode model (content, live and durable versions in one `State`),
//!   getattr/setattr/readlink.
//! - `alloc.rs`: block and inode allocation, freeing, statfs (rules 8-10).
//! - `file.rs`: regular-file data: read, write, truncate, holes, fallocate, seek, FIEMAP,
//!   copy_file_range, open.
//! - `dir.rs`: names: lookup, create, mkdir, mknod, symlink, link, unlink, rmdir, rename,
//!   readdir (rules 12-13).
//! - `xattr.rs`: extended attributes.
//! - `crash.rs`: durability and crashes: fsync, sync_all, crash, crash_with and the fsck-like
//!   rebuild of the image (rules 2-7).

mod alloc;
mod crash;
mod dir;
mod file;
mod inode;
mod xattr;

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::creds::Creds;
use crate::types::{Attr, DirEntry, Errno, Extent, SetAttr, StatFs};
use crate::{LowerFs, Result};

use self::alloc::Allocator;
use self::inode::{Content, DirData, Inode, State, Time};

/// The block size (st_blksize, statfs f_bsize, the allocation unit).
pub const BLOCK_SIZE: u64 = 4096;
/// The root directory's inode number (as on ext4).
pub const ROOT_INO: u64 = 2;
/// The first inode number handed out to a created object (ext4's first non-reserved inode).
pub const FIRST_INO: u64 = 11;
/// ext4's s_maxbytes for extent files with 4 KiB blocks.
pub const MAX_FILE_SIZE: u64 = (1 << 44) - BLOCK_SIZE;
const NAME_MAX: usize = 255;
const SYMLINK_MAX: usize = 4095;
/// ext4's EXT4_LINK_MAX.
const LINK_MAX: u32 = 65_000;
const XATTR_NAME_MAX: usize = 255;
const XATTR_SIZE_MAX: usize = 65_536;
/// Bytes an xattr costs beyond its name and value (ext4's entry header, rounded).
const XATTR_ENTRY_OVERHEAD: usize = 16;
/// O_DIRECT alignment of offsets, lengths and buffers (the logical sector size).
const DIRECT_ALIGN: u64 = 512;
const FIEMAP_EXTENT_LAST: u32 = 0x1;
const FIEMAP_EXTENT_UNWRITTEN: u32 = 0x800;
const COOKIE_DOT: u64 = 1;
const COOKIE_DOTDOT: u64 = 2;
const COOKIE_FIRST: u64 = 3;
/// Largest chunk copy_file_range moves at once (bounds its buffer).
const COPY_CHUNK: u64 = 1 << 20;
const NANOS: u64 = 1_000_000_000;
const RELATIME_SECS: i64 = 24 * 3600;

fn err<T>(errno: i32) -> Result<T> {
    Err(Errno(errno))
}

// ---------------------------------------------------------------------------------------------
// Time

/// Where the model's timestamps come from.
pub trait Clock: Send + Sync + fmt::Debug {
    /// The current time, (seconds, nanoseconds) since the epoch.
    fn now(&self) -> (i64, u32);
}

/// A settable logical clock: every reading returns the current value, then advances it by
/// `tick_ns`, so every change gets a distinct, reproducible time.
#[derive(Debug)]
pub struct LogicalClock {
    /// Nanoseconds since the epoch.
    nanos: AtomicU64,
    tick_ns: u64,
}

impl LogicalClock {
    /// 2023-11-14: a plausible "now" that needs no wall clock.
    pub const DEFAULT_START_SECS: u64 = 1_700_000_000;

    pub fn new(start_secs: u64, tick_ns: u64) -> LogicalClock {
        LogicalClock { nanos: AtomicU64::new(start_secs * NANOS), tick_ns }
    }

    pub fn set(&self, secs: u64, nanos: u32) {
        assert!(u64::from(nanos) < NANOS, "nanoseconds out of range");
        self.nanos.store(secs * NANOS + u64::from(nanos), Ordering::SeqCst);
    }

    pub fn advance(&self, ns: u64) {
        self.nanos.fetch_add(ns, Ordering::SeqCst);
    }
}

impl Default for LogicalClock {
    fn default() -> Self {
        LogicalClock::new(Self::DEFAULT_START_SECS, 1_000)
    }
}

impl Clock for LogicalClock {
    fn now(&self) -> (i64, u32) {
        let n = self.nanos.fetch_add(self.tick_ns, Ordering::SeqCst);
        (i64::try_from(n / NANOS).expect("clock within i64 seconds"), (n % NANOS) as u32)
    }
}

// ---------------------------------------------------------------------------------------------
// Configuration

/// Capacity and identity of a [`MemLower`], fixed at creation.
#[derive(Clone, Debug)]
pub struct MemConfig {
    /// Capacity in blocks of [`BLOCK_SIZE`] (statfs f_blocks).
    pub blocks: u64,
    /// Most inodes, live ones including unlinked-but-open (statfs f_files).
    pub inodes: u64,
    /// st_dev of every object.
    pub dev: u64,
    /// statfs f_fsid.
    pub fsid: u64,
    /// Applied to the mode of created objects, as the daemon's process umask is by the kernel.
    pub umask: u32,
    /// Bytes of xattrs per inode (names + values + 16 per entry); beyond: ENOSPC.
    pub xattr_space: usize,
    pub clock: Arc<dyn Clock>,
    /// Objects whose generation is at least this get handles [`LONG_HANDLE_EXTRA`] bytes
    /// longer (128 in all, as an NFS file system's may be; XFS's grow too, less, once inode
    /// numbers pass 32 bits): a test sets it (shared by every fork) so that objects made
    /// again after a crash get longer handles than the ones they replace. `u64::MAX` (the
    /// default): every handle is 16 bytes.
    pub long_handles_from: Arc<std::sync::atomic::AtomicU64>,
}

/// See [`MemConfig::long_handles_from`].
pub const LONG_HANDLE_EXTRA: usize = 112;

impl Default for MemConfig {
    fn default() -> Self {
        MemConfig {
            blocks: 1 << 18,
            inodes: 1 << 16,
            dev: 0x00fe_0001,
            fsid: 0x6d65_6d6c_6f77_6572,
            umask: 0,
            xattr_space: 4096 - 32,
            clock: Arc::new(LogicalClock::default()),
            long_handles_from: Arc::new(std::sync::atomic::AtomicU64::new(u64::MAX)),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Nodes and files

#[derive(Debug)]
struct Shared {
    config: MemConfig,
    /// The one lock of the file system; never held while calling out (readdir's `emit`).
    state: Mutex<State>,
    /// Whole-file-system syncs so far (`sync_all`, syncfs).
    syncs: std::sync::atomic::AtomicU64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A test that panicked while holding the lock must not make every Drop panic too.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn now(&self) -> Time {
        self.config.clock.now()
    }
}

/// A held reference to an inode: keeps it (and its data) alive while held (rule 8).
pub struct MemNode {
    fs: Arc<Shared>,
    ino: u64,
}

impl fmt::Debug for MemNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemNode").field("ino", &self.ino).finish_non_exhaustive()
    }
}

impl Drop for MemNode {
    fn drop(&mut self) {
        self.fs.lock().release(self.ino);
    }
}

fn hold(fs: &Arc<Shared>, st: &mut State, ino: u64) -> MemNode {
    *st.refs.entry(ino).or_default() += 1;
    MemNode { fs: Arc::clone(fs), ino }
}

/// An open file or directory.
pub struct MemFile {
    node: MemNode,
    /// open(2) flags (access mode, O_APPEND, O_DIRECT).
    flags: i32,
    /// Opened by opendir: only such files can be listed.
    dir: bool,
    /// The file position, for SEEK_CUR (reads and writes are positional).
    pos: Mutex<i64>,
}

impl fmt::Debug for MemFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemFile")
            .field("ino", &self.node.ino)
            .field("flags", &self.flags)
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl MemFile {
    fn readable(&self) -> bool {
        matches!(self.flags & libc::O_ACCMODE, libc::O_RDONLY | libc::O_RDWR)
    }

    fn writable(&self) -> bool {
        matches!(self.flags & libc::O_ACCMODE, libc::O_WRONLY | libc::O_RDWR)
    }

    fn check_direct(&self, offset: u64, buf: *const u8, len: usize) -> Result<()> {
        let misaligned = offset % DIRECT_ALIGN != 0
            || len as u64 % DIRECT_ALIGN != 0
            || (buf as usize) % (DIRECT_ALIGN as usize) != 0;
        if self.flags & libc::O_DIRECT != 0 && misaligned { err(libc::EINVAL) } else { Ok(()) }
    }
}

// ---------------------------------------------------------------------------------------------
// The file system

/// See the module docs. `Clone` gives a second handle to the same file system (as a second
/// process would see it), e.g. to crash it while an engine owns the first.
pub struct MemLower {
    fs: Arc<Shared>,
    root: MemNode,
}

impl fmt::Debug for MemLower {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.fs.lock();
        f.debug_struct("MemLower")
            .field("live_inodes", &st.live.len())
            .field("durable_inodes", &st.durable.len())
            .field("free_blocks", &st.alloc.free_count)
            .finish_non_exhaustive()
    }
}

impl Default for MemLower {
    fn default() -> Self {
        MemLower::new(MemConfig::default())
    }
}

impl Clone for MemLower {
    fn clone(&self) -> Self {
        let root = hold(&self.fs, &mut self.fs.lock(), ROOT_INO);
        MemLower { fs: Arc::clone(&self.fs), root }
    }
}

impl MemLower {
    /// A new, empty file system whose root (mode 0755, owned by 0:0) is durable.
    pub fn new(config: MemConfig) -> MemLower {
        assert!(config.blocks >= 1 && config.inodes >= 1, "room for the root directory");
        let now = config.clock.now();
        let mut alloc = Allocator::with_used(config.blocks, &BTreeSet::new());
        let phys = alloc.alloc(None).expect("room for the root directory");
        let root = Inode {
            generation: inode::next_generation(),
            mode: libc::S_IFDIR | 0o755,
            uid: 0,
            gid: 0,
            nlink: 2,
            rdev: 0,
            atime: now,
            mtime: now,
            ctime: now,
            xattrs: BTreeMap::new(),
            content: Content::Dir(DirData {
                entries: BTreeMap::new(),
                next_cookie: COOKIE_FIRST,
                parent: ROOT_INO,
                phys,
            }),
        };
        let live = BTreeMap::from([(ROOT_INO, root)]);
        let state = State { durable: live.clone(), live, refs: BTreeMap::new(), alloc };
        Self::from_state(config, state)
    }

    fn from_state(config: MemConfig, state: State) -> MemLower {
        let fs = Arc::new(Shared {
            config,
            state: Mutex::new(state),
            syncs: std::sync::atomic::AtomicU64::new(0),
        });
        let root = hold(&fs, &mut fs.lock(), ROOT_INO);
        MemLower { fs, root }
    }

    pub fn config(&self) -> &MemConfig {
        &self.fs.config
    }

    /// The length of the handle of an object of generation `generation`.
    fn handle_len(&self, generation: u64) -> usize {
        let from = self.fs.config.long_handles_from.load(std::sync::atomic::Ordering::Relaxed);
        if generation >= from { 16 + LONG_HANDLE_EXTRA } else { 16 }
    }
}

// ---------------------------------------------------------------------------------------------
// The LowerFs operations

/// Each operation's body is a `do_<operation>` method in its family's file (see "Files" in the
/// module docs); the few that only take the lock and call one helper stay here.
impl LowerFs for MemLower {
    type Node = MemNode;
    type File = MemFile;

    fn root(&self) -> &MemNode {
        &self.root
    }

    fn key(&self, node: &MemNode) -> (u64, u64) {
        (self.fs.config.dev, node.ino)
    }

    fn lookup(&self, parent: &MemNode, name: &OsStr) -> Result<(MemNode, Attr)> {
        let mut st = self.fs.lock();
        let ino = st.lookup(parent.ino, name)?;
        Ok(self.entry(&mut st, ino))
    }

    fn getattr(&self, node: &MemNode) -> Result<Attr> {
        Ok(self.fs.lock().attr(&self.fs.config, node.ino))
    }

    fn setattr(&self, node: &MemNode, file: Option<&MemFile>, set: &SetAttr) -> Result<Attr> {
        self.do_setattr(node, file, set)
    }

    fn readlink(&self, node: &MemNode) -> Result<Vec<u8>> {
        self.do_readlink(node)
    }

    fn mknod(
        &self,
        creds: &Creds,
        parent: &MemNode,
        name: &OsStr,
        mode: u32,
        rdev: u64,
    ) -> Result<(MemNode, Attr)> {
        self.do_mknod(creds, parent, name, mode, rdev)
    }

    fn mkdir(
        &self,
        creds: &Creds,
        parent: &MemNode,
        name: &OsStr,
        mode: u32,
    ) -> Result<(MemNode, Attr)> {
        self.do_mkdir(creds, parent, name, mode)
    }

    fn symlink(
        &self,
        creds: &Creds,
        parent: &MemNode,
        name: &OsStr,
        target: &OsStr,
    ) -> Result<(MemNode, Attr)> {
        self.do_symlink(creds, parent, name, target)
    }

    fn link(&self, node: &MemNode, newparent: &MemNode, newname: &OsStr) -> Result<Attr> {
        self.do_link(node, newparent, newname)
    }

    fn unlink(&self, parent: &MemNode, name: &OsStr) -> Result<()> {
        self.do_unlink(parent, name)
    }

    fn rmdir(&self, parent: &MemNode, name: &OsStr) -> Result<()> {
        self.do_rmdir(parent, name)
    }

    fn rename(
        &self,
        parent: &MemNode,
        name: &OsStr,
        newparent: &MemNode,
        newname: &OsStr,
        flags: u32,
    ) -> Result<()> {
        let mut st = self.fs.lock();
        self.rename_locked(&mut st, (parent.ino, name), (newparent.ino, newname), flags)
    }

    fn open(&self, node: &MemNode, flags: i32) -> Result<MemFile> {
        self.open_locked(&mut self.fs.lock(), node.ino, flags)
    }

    fn create(
        &self,
        creds: &Creds,
        parent: &MemNode,
        name: &OsStr,
        mode: u32,
        flags: i32,
    ) -> Result<(MemNode, Attr, MemFile)> {
        self.do_create(creds, parent, name, mode, flags)
    }

    fn open_direct(&self, node: &MemNode, writable: bool) -> Result<Option<MemFile>> {
        self.do_open_direct(node, writable)
    }

    fn read(&self, file: &MemFile, offset: u64, buf: &mut [u8]) -> Result<usize> {
        self.do_read(file, offset, buf)
    }

    fn write(&self, file: &MemFile, offset: u64, data: &[u8]) -> Result<usize> {
        self.do_write(file, offset, data)
    }

    fn fsync(&self, file: &MemFile, datasync: bool) -> Result<()> {
        self.do_fsync(file, datasync)
    }

    fn fallocate(&self, file: &MemFile, mode: i32, offset: u64, len: u64) -> Result<()> {
        self.do_fallocate(file, mode, offset, len)
    }

    fn lseek(&self, file: &MemFile, offset: i64, whence: i32) -> Result<i64> {
        self.do_lseek(file, offset, whence)
    }

    fn copy_file_range(
        &self,
        input: &MemFile,
        offset_in: u64,
        output: &MemFile,
        offset_out: u64,
        len: u64,
    ) -> Result<u64> {
        self.do_copy_file_range(input, offset_in, output, offset_out, len)
    }

    fn fiemap(&self, file: &MemFile) -> Result<Vec<Extent>> {
        self.do_fiemap(file)
    }

    fn opendir(&self, node: &MemNode) -> Result<MemFile> {
        self.do_opendir(node)
    }

    fn readdir(
        &self,
        dir: &MemFile,
        offset: u64,
        emit: &mut dyn FnMut(DirEntry) -> bool,
    ) -> Result<()> {
        self.do_readdir(dir, offset, emit)
    }

    fn fsyncdir(&self, dir: &MemFile, datasync: bool) -> Result<()> {
        self.fsync(dir, datasync)
    }

    fn statfs(&self, _node: &MemNode) -> Result<StatFs> {
        Ok(self.do_statfs())
    }

    fn setxattr(&self, node: &MemNode, name: &OsStr, value: &[u8], flags: i32) -> Result<()> {
        self.do_setxattr(node, name, value, flags)
    }

    fn getxattr(&self, node: &MemNode, name: &OsStr, size: usize) -> Result<Vec<u8>> {
        self.do_getxattr(node, name, size)
    }

    fn listxattr(&self, node: &MemNode, size: usize) -> Result<Vec<u8>> {
        self.do_listxattr(node, size)
    }

    fn removexattr(&self, node: &MemNode, name: &OsStr) -> Result<()> {
        self.do_removexattr(node, name)
    }

    fn now(&self) -> (i64, u32) {
        self.fs.now()
    }

    fn syncfs(&self) -> Result<()> {
        self.sync_all();
        Ok(())
    }

    /// The inode number: unique while the directory exists, which is all the model needs.
    /// The same as `file_handle`: inode number and generation.
    fn dir_handle(&self, dir: &MemNode) -> Result<Vec<u8>> {
        self.file_handle(dir)
    }

    /// Inode number and generation, as a real file handle: a deleted file's handle never
    /// names the object that reuses its number.
    fn file_handle(&self, file: &MemNode) -> Result<Vec<u8>> {
        let generation = self.fs.lock().get(file.ino).generation;
        let mut h = file.ino.to_le_bytes().to_vec();
        h.extend_from_slice(&generation.to_le_bytes());
        h.resize(self.handle_len(generation), 0xa5);
        Ok(h)
    }

    /// Direct, as `open_by_handle_at`: the inode of the handle's number, if it is live, has the
    /// handle's generation and is reachable (a name, or the root).
    fn find_object(&self, handle: &[u8], _limit: usize) -> Result<MemNode> {
        let (Some(ino), Some(generation)) = (
            handle.get(..8).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes),
            handle.get(8..16).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes),
        ) else {
            return Err(Errno(libc::ESTALE));
        };
        if handle.len() != self.handle_len(generation) {
            return Err(Errno(libc::ESTALE));
        }
        let mut st = self.fs.lock();
        match st.live.get(&ino) {
            Some(i) if i.generation == generation && (i.nlink > 0 || ino == ROOT_INO) => {}
            _ => return Err(Errno(libc::ESTALE)),
        }
        Ok(hold(&self.fs, &mut st, ino))
    }
}
