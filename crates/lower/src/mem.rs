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

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::creds::Creds;
use crate::types::{Attr, DirEntry, Errno, Extent, FileKind, SetAttr, StatFs, TimeSet};
use crate::{LowerFs, Result};

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
}

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
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The block allocator

/// Free blocks as ranges (start -> length) over 1..=total, lowest-first (rule 9).
#[derive(Clone, Debug)]
struct Allocator {
    free: BTreeMap<u64, u64>,
    free_count: u64,
}

impl Allocator {
    fn with_used(total: u64, used: &BTreeSet<u64>) -> Allocator {
        let mut free = BTreeMap::new();
        let mut start = 1;
        let mut used_count = 0;
        for &b in used.range(1..=total) {
            if b > start {
                free.insert(start, b - start);
            }
            start = b + 1;
            used_count += 1;
        }
        if start <= total {
            free.insert(start, total + 1 - start);
        }
        Allocator { free, free_count: total - used_count }
    }

    /// Marks `b` used if it is free.
    fn take(&mut self, b: u64) -> bool {
        let Some((&s, &len)) = self.free.range(..=b).next_back() else { return false };
        if b >= s + len {
            return false;
        }
        self.free.remove(&s);
        if b > s {
            self.free.insert(s, b - s);
        }
        if b + 1 < s + len {
            self.free.insert(b + 1, s + len - b - 1);
        }
        self.free_count -= 1;
        true
    }

    fn alloc(&mut self, goal: Option<u64>) -> Option<u64> {
        if let Some(g) = goal
            && self.take(g)
        {
            return Some(g);
        }
        let (&s, _) = self.free.iter().next()?;
        assert!(self.take(s));
        Some(s)
    }

    fn release(&mut self, b: u64) {
        if b == 0 {
            return; // "no block" (a crash image out of space)
        }
        assert!(!self.free.contains_key(&b), "block {b} freed twice");
        let (mut start, mut len) = (b, 1);
        if let Some((&s, &l)) = self.free.range(..b).next_back() {
            assert!(s + l <= b, "block {b} freed twice");
            if s + l == b {
                self.free.remove(&s);
                start = s;
                len += l;
            }
        }
        if let Some(l) = self.free.remove(&(b + 1)) {
            len += l;
        }
        self.free.insert(start, len);
        self.free_count += 1;
    }
}

// ---------------------------------------------------------------------------------------------
// Inodes

/// One block of a regular file.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Block {
    phys: u64,
    /// `None`: allocated but unwritten (fallocate): reads as zeros, a hole to SEEK_DATA.
    /// Shared copy-on-write between the live and durable versions.
    data: Option<Arc<Vec<u8>>>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct FileData {
    size: u64,
    /// Logical block index -> block; absent = hole.
    blocks: BTreeMap<u64, Block>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Dentry {
    ino: u64,
    /// Where readdir resumes after this entry (rule 12).
    cookie: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct DirData {
    entries: BTreeMap<OsString, Dentry>,
    next_cookie: u64,
    /// "..": the parent directory's inode number.
    parent: u64,
    phys: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Content {
    File(FileData),
    Dir(DirData),
    Symlink(Vec<u8>),
    /// FIFO, socket, character or block device.
    Special,
}

type Time = (i64, u32);

#[derive(Clone, Debug, PartialEq, Eq)]
struct Inode {
    /// Type and permission bits (st_mode).
    mode: u32,
    uid: u32,
    gid: u32,
    nlink: u32,
    rdev: u64,
    atime: Time,
    mtime: Time,
    ctime: Time,
    xattrs: BTreeMap<OsString, Vec<u8>>,
    content: Content,
}

impl Inode {
    fn kind(&self) -> FileKind {
        FileKind::from_mode(self.mode)
    }

    fn file(&self) -> &FileData {
        match &self.content {
            Content::File(f) => f,
            _ => panic!("not a regular file"),
        }
    }

    fn file_mut(&mut self) -> &mut FileData {
        match &mut self.content {
            Content::File(f) => f,
            _ => panic!("not a regular file"),
        }
    }

    fn dir(&self) -> Option<&DirData> {
        match &self.content {
            Content::Dir(d) => Some(d),
            _ => None,
        }
    }

    fn dir_mut(&mut self) -> &mut DirData {
        match &mut self.content {
            Content::Dir(d) => d,
            _ => panic!("not a directory"),
        }
    }

    fn touch(&mut self, now: Time) {
        self.mtime = now;
        self.ctime = now;
    }

    /// relatime: atime moves when it is not newer than mtime or ctime, or a day old.
    fn accessed(&mut self, now: Time) {
        if self.atime <= self.mtime
            || self.atime <= self.ctime
            || now.0 - self.atime.0 >= RELATIME_SECS
        {
            self.atime = now;
        }
    }

    /// The durable version of an object whose existence only is durable (rule 3).
    fn skeleton(&self) -> Inode {
        let content = match &self.content {
            Content::File(_) => Content::File(FileData::default()),
            Content::Dir(d) => Content::Dir(DirData {
                entries: BTreeMap::new(),
                next_cookie: d.next_cookie,
                parent: d.parent,
                phys: d.phys,
            }),
            Content::Symlink(t) => Content::Symlink(t.clone()),
            Content::Special => Content::Special,
        };
        Inode {
            mode: self.mode,
            uid: self.uid,
            gid: self.gid,
            nlink: self.nlink,
            rdev: self.rdev,
            atime: self.atime,
            mtime: self.mtime,
            ctime: self.ctime,
            xattrs: BTreeMap::new(),
            content,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// File data

fn block_len() -> usize {
    BLOCK_SIZE as usize
}

impl FileData {
    /// The block after the previous logical block's, for contiguous extents (rule 9).
    fn goal(&self, index: u64) -> Option<u64> {
        index.checked_sub(1).and_then(|prev| self.blocks.get(&prev)).map(|b| b.phys + 1)
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> usize {
        if offset >= self.size {
            return 0;
        }
        let n = buf.len().min(usize::try_from(self.size - offset).unwrap_or(usize::MAX));
        let mut done = 0;
        while done < n {
            let pos = offset + done as u64;
            let within = (pos % BLOCK_SIZE) as usize;
            let len = (block_len() - within).min(n - done);
            let out = &mut buf[done..done + len];
            match self.blocks.get(&(pos / BLOCK_SIZE)).and_then(|b| b.data.as_ref()) {
                Some(data) => out.copy_from_slice(&data[within..within + len]),
                None => out.fill(0),
            }
            done += len;
        }
        n
    }

    /// Writes as much of `data` as there are blocks for; returns the bytes written.
    fn write(&mut self, alloc: &mut Allocator, offset: u64, data: &[u8]) -> usize {
        let mut done = 0;
        while done < data.len() {
            let pos = offset + done as u64;
            let index = pos / BLOCK_SIZE;
            let within = (pos % BLOCK_SIZE) as usize;
            let len = (block_len() - within).min(data.len() - done);
            if !self.blocks.contains_key(&index) {
                let Some(phys) = alloc.alloc(self.goal(index)) else { break };
                self.blocks.insert(index, Block { phys, data: None });
            }
            let block = self.blocks.get_mut(&index).expect("present");
            let bytes =
                Arc::make_mut(block.data.get_or_insert_with(|| Arc::new(vec![0; block_len()])));
            bytes[within..within + len].copy_from_slice(&data[done..done + len]);
            done += len;
        }
        self.size = self.size.max(offset + done as u64);
        done
    }

    /// Zeroes `[from, to)` inside block `index` if it holds data.
    fn zero_within(&mut self, index: u64, from: usize, to: usize) {
        if let Some(Block { data: Some(data), .. }) = self.blocks.get_mut(&index) {
            Arc::make_mut(data)[from..to].fill(0);
        }
    }

    /// ftruncate: shrinking (or keeping the size) frees every block past the new size,
    /// preallocated ones included, and zeroes the tail of the last block (rule 11).
    fn truncate(&mut self, alloc: &mut Allocator, size: u64) {
        if size <= self.size {
            for (_, b) in self.blocks.split_off(&size.div_ceil(BLOCK_SIZE)) {
                alloc.release(b.phys);
            }
            if size % BLOCK_SIZE != 0 {
                self.zero_within(size / BLOCK_SIZE, (size % BLOCK_SIZE) as usize, block_len());
            }
        }
        self.size = size;
    }

    /// Allocates unwritten blocks over `[offset, end)` where there are holes; all or nothing.
    fn preallocate(&mut self, alloc: &mut Allocator, offset: u64, end: u64) -> Result<()> {
        let (first, last) = (offset / BLOCK_SIZE, (end - 1) / BLOCK_SIZE);
        let missing = (first..=last).filter(|i| !self.blocks.contains_key(i)).count() as u64;
        if missing > alloc.free_count {
            return err(libc::ENOSPC);
        }
        for index in first..=last {
            if !self.blocks.contains_key(&index) {
                let phys = alloc.alloc(self.goal(index)).expect("counted free blocks");
                self.blocks.insert(index, Block { phys, data: None });
            }
        }
        Ok(())
    }

    /// PUNCH_HOLE|KEEP_SIZE, as ext4 bounds it: nothing at or past the size, and the range ends
    /// at the end of the block holding the size (preallocated blocks past it stay).
    fn punch(&mut self, alloc: &mut Allocator, offset: u64, end: u64) {
        if offset >= self.size {
            return;
        }
        let end = end.min(self.size.div_ceil(BLOCK_SIZE) * BLOCK_SIZE);
        let (full_first, full_end) = (offset.div_ceil(BLOCK_SIZE), end / BLOCK_SIZE);
        if full_first < full_end {
            let mut tail = self.blocks.split_off(&full_first);
            let mut keep = tail.split_off(&full_end);
            for b in tail.values() {
                alloc.release(b.phys);
            }
            self.blocks.append(&mut keep);
        }
        let (first, last) = (offset / BLOCK_SIZE, (end - 1) / BLOCK_SIZE);
        let from = (offset % BLOCK_SIZE) as usize;
        let to = if last == first { ((end - 1) % BLOCK_SIZE) as usize + 1 } else { block_len() };
        if from != 0 || to != block_len() {
            self.zero_within(first, from, to);
        }
        if last != first && end % BLOCK_SIZE != 0 {
            self.zero_within(last, 0, (end % BLOCK_SIZE) as usize);
        }
    }

    /// SEEK_DATA / SEEK_HOLE: only written blocks are data (ext4 reports unwritten extents
    /// without cached pages as holes).
    fn seek(&self, offset: u64, data: bool) -> Result<u64> {
        if offset >= self.size {
            return err(libc::ENXIO);
        }
        let written = |i: &u64| self.blocks.get(i).is_some_and(|b| b.data.is_some());
        let mut index = offset / BLOCK_SIZE;
        if data {
            let next = self.blocks.range(index..).find(|(_, b)| b.data.is_some()).map(|(&i, _)| i);
            return match next {
                Some(i) if (i * BLOCK_SIZE).max(offset) < self.size => {
                    Ok((i * BLOCK_SIZE).max(offset))
                }
                _ => err(libc::ENXIO),
            };
        }
        while written(&index) && index * BLOCK_SIZE < self.size {
            index += 1;
        }
        Ok((index * BLOCK_SIZE).max(offset).min(self.size))
    }

    fn extents(&self) -> Vec<Extent> {
        let mut out: Vec<Extent> = Vec::new();
        let mut prev: Option<(u64, u64)> = None;
        for (&index, b) in &self.blocks {
            let flags = if b.data.is_none() { FIEMAP_EXTENT_UNWRITTEN } else { 0 };
            match out.last_mut() {
                Some(e) if prev == Some((index - 1, b.phys - 1)) && e.flags == flags => {
                    e.length += BLOCK_SIZE;
                }
                _ => out.push(Extent {
                    logical: index * BLOCK_SIZE,
                    physical: b.phys * BLOCK_SIZE,
                    length: BLOCK_SIZE,
                    flags,
                }),
            }
            prev = Some((index, b.phys));
        }
        if let Some(last) = out.last_mut() {
            last.flags |= FIEMAP_EXTENT_LAST;
        }
        out
    }

    /// Restores rule 11 on a crash image: written blocks past the size go, the tail is zeroed.
    fn normalize(&mut self) {
        let end = self.size.div_ceil(BLOCK_SIZE);
        self.blocks.retain(|&i, b| i < end || b.data.is_none());
        if self.size % BLOCK_SIZE != 0 {
            self.zero_within(
                self.size / BLOCK_SIZE,
                (self.size % BLOCK_SIZE) as usize,
                block_len(),
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The whole file system state

#[derive(Debug)]
struct State {
    live: BTreeMap<u64, Inode>,
    durable: BTreeMap<u64, Inode>,
    /// Held nodes (open files hold their node) per live inode.
    refs: BTreeMap<u64, u32>,
    alloc: Allocator,
}

fn check_name(name: &OsStr) -> Result<()> {
    let b = name.as_bytes();
    if b.is_empty() {
        return err(libc::ENOENT);
    }
    if b.len() > NAME_MAX {
        return err(libc::ENAMETOOLONG);
    }
    if b.contains(&b'/') || b.contains(&0) {
        return err(libc::EINVAL);
    }
    Ok(())
}

fn is_dot(name: &OsStr) -> bool {
    name == "." || name == ".."
}

impl State {
    fn get(&self, ino: u64) -> &Inode {
        self.live.get(&ino).expect("a held inode is live")
    }

    fn get_mut(&mut self, ino: u64) -> &mut Inode {
        self.live.get_mut(&ino).expect("a held inode is live")
    }

    /// `ino` as the parent of a name operation: ENOTDIR if it is not a directory, ENOENT if it
    /// has been removed.
    fn parent_dir(&self, ino: u64) -> Result<&DirData> {
        let inode = self.get(ino);
        let Some(dir) = inode.dir() else { return err(libc::ENOTDIR) };
        if inode.nlink == 0 {
            return err(libc::ENOENT);
        }
        Ok(dir)
    }

    fn child(&self, dir: u64, name: &OsStr) -> Result<Option<u64>> {
        Ok(self.parent_dir(dir)?.entries.get(name).map(|e| e.ino))
    }

    fn lookup(&self, dir: u64, name: &OsStr) -> Result<u64> {
        let inode = self.get(dir);
        let Some(d) = inode.dir() else { return err(libc::ENOTDIR) };
        if name == "." {
            return Ok(dir);
        }
        if inode.nlink == 0 {
            return err(libc::ENOENT);
        }
        if name == ".." {
            return Ok(d.parent);
        }
        check_name(name)?;
        self.child(dir, name)?.ok_or(Errno(libc::ENOENT))
    }

    fn attr(&self, config: &MemConfig, ino: u64) -> Attr {
        let i = self.get(ino);
        let (size, blocks) = match &i.content {
            Content::File(f) => (f.size, f.blocks.len() as u64 * (BLOCK_SIZE / 512)),
            Content::Dir(_) => (BLOCK_SIZE, BLOCK_SIZE / 512),
            Content::Symlink(t) => (t.len() as u64, 0),
            Content::Special => (0, 0),
        };
        Attr {
            dev: config.dev,
            ino,
            size,
            blocks,
            atime: i.atime,
            mtime: i.mtime,
            ctime: i.ctime,
            mode: i.mode,
            nlink: i.nlink,
            uid: i.uid,
            gid: i.gid,
            rdev: i.rdev,
            blksize: BLOCK_SIZE as u32,
        }
    }

    fn alloc_ino(&self, config: &MemConfig) -> Result<u64> {
        if self.live.len() as u64 >= config.inodes {
            return err(libc::ENOSPC);
        }
        Ok((FIRST_INO..u64::MAX)
            .find(|i| !self.live.contains_key(i) && !self.durable.contains_key(i))
            .expect("inode numbers do not run out"))
    }

    /// Whether `ancestor` is `dir` or one of its ancestors.
    fn is_ancestor_or_self(&self, ancestor: u64, dir: u64) -> bool {
        let mut cur = dir;
        loop {
            if cur == ancestor {
                return true;
            }
            if cur == ROOT_INO {
                return false;
            }
            cur = self.get(cur).dir().expect("parents are directories").parent;
        }
    }

    fn release(&mut self, ino: u64) {
        let count = self.refs.get_mut(&ino).expect("a held inode is counted");
        *count -= 1;
        if *count == 0 {
            self.refs.remove(&ino);
            self.free_if_unused(ino);
        }
    }

    /// Rule 8: frees an inode with no name and no holder.
    fn free_if_unused(&mut self, ino: u64) {
        if self.refs.contains_key(&ino) || self.get(ino).nlink > 0 {
            return;
        }
        let inode = self.live.remove(&ino).expect("live");
        match inode.content {
            Content::File(f) => f.blocks.values().for_each(|b| self.alloc.release(b.phys)),
            Content::Dir(d) => self.alloc.release(d.phys),
            Content::Symlink(_) | Content::Special => {}
        }
    }

    /// Rules 2 and 3: the live version of `ino` becomes durable.
    fn persist(&mut self, ino: u64, datasync: bool) {
        let live = self.get(ino).clone();
        let version = match (datasync, self.durable.get(&ino)) {
            (true, Some(old)) => Inode { content: live.content, nlink: live.nlink, ..old.clone() },
            _ => live,
        };
        if let Some(dir) = version.dir() {
            for e in dir.entries.values() {
                if !self.durable.contains_key(&e.ino) {
                    let skeleton = self.get(e.ino).skeleton();
                    self.durable.insert(e.ino, skeleton);
                }
            }
            self.durable.insert(ino, version);
            self.collect_durable();
        } else {
            self.durable.insert(ino, version);
        }
    }

    /// Drops durable versions no durable entry reaches and no live name can bring back.
    fn collect_durable(&mut self) {
        let mut reached = BTreeSet::from([ROOT_INO]);
        let mut stack = vec![ROOT_INO];
        while let Some(ino) = stack.pop() {
            if let Some(dir) = self.durable.get(&ino).and_then(Inode::dir) {
                for e in dir.entries.values() {
                    if reached.insert(e.ino) {
                        stack.push(e.ino);
                    }
                }
            }
        }
        let live = &self.live;
        self.durable
            .retain(|ino, _| reached.contains(ino) || live.get(ino).is_some_and(|i| i.nlink > 0));
    }
}

// ---------------------------------------------------------------------------------------------
// Nodes and files

#[derive(Debug)]
struct Shared {
    config: MemConfig,
    /// The one lock of the file system; never held while calling out (readdir's `emit`).
    state: Mutex<State>,
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

/// What a create makes.
enum NewKind {
    File,
    Dir,
    Symlink(Vec<u8>),
    /// FIFO, socket or device, with its device number.
    Special(u64),
}

/// SplitMix64: a tiny, well-mixed, seedable generator (rule 7).
#[derive(Debug)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn coin(&mut self) -> bool {
        self.next() & 1 == 1
    }
}

/// Rule 7: `old` (durable) with each part independently replaced by `new`'s (live).
fn mix(old: &Inode, new: &Inode, rng: &mut SplitMix64) -> Inode {
    let mut m = old.clone();
    if rng.coin() {
        (m.mode, m.uid, m.gid) = (new.mode, new.uid, new.gid);
        (m.atime, m.mtime, m.ctime) = (new.atime, new.mtime, new.ctime);
    }
    if rng.coin() {
        m.xattrs.clone_from(&new.xattrs);
    }
    match (&mut m.content, &new.content) {
        (Content::File(a), Content::File(b)) => {
            if rng.coin() {
                a.size = b.size;
            }
            let keys: BTreeSet<u64> = a.blocks.keys().chain(b.blocks.keys()).copied().collect();
            for k in keys {
                if rng.coin() {
                    match b.blocks.get(&k) {
                        Some(block) => a.blocks.insert(k, block.clone()),
                        None => a.blocks.remove(&k),
                    };
                }
            }
        }
        (Content::Dir(a), Content::Dir(b)) => {
            let names: BTreeSet<OsString> =
                a.entries.keys().chain(b.entries.keys()).cloned().collect();
            for name in names {
                if rng.coin() {
                    match b.entries.get(&name) {
                        Some(e) => a.entries.insert(name, *e),
                        None => a.entries.remove(&name),
                    };
                }
            }
            a.next_cookie = a.next_cookie.max(b.next_cookie);
        }
        _ => {}
    }
    m
}

impl MemLower {
    /// A new, empty file system whose root (mode 0755, owned by 0:0) is durable.
    pub fn new(config: MemConfig) -> MemLower {
        assert!(config.blocks >= 1 && config.inodes >= 1, "room for the root directory");
        let now = config.clock.now();
        let mut alloc = Allocator::with_used(config.blocks, &BTreeSet::new());
        let phys = alloc.alloc(None).expect("room for the root directory");
        let root = Inode {
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
        let fs = Arc::new(Shared { config, state: Mutex::new(state) });
        let root = hold(&fs, &mut fs.lock(), ROOT_INO);
        MemLower { fs, root }
    }

    pub fn config(&self) -> &MemConfig {
        &self.fs.config
    }

    /// syncfs: every live inode becomes durable (rule 5).
    pub fn sync_all(&self) {
        let mut st = self.fs.lock();
        let live: Vec<(u64, Inode)> = st.live.iter().map(|(&i, n)| (i, n.clone())).collect();
        st.durable.extend(live);
        st.collect_durable();
    }

    /// Inode numbers whose live version differs from the durable one (pending changes).
    pub fn pending(&self) -> Vec<u64> {
        let st = self.fs.lock();
        st.live.iter().filter(|(i, n)| st.durable.get(i) != Some(*n)).map(|(&i, _)| i).collect()
    }

    /// The file system a power cut now would leave: the durable state only (rule 6).
    #[must_use]
    pub fn crash(&self) -> MemLower {
        let versions = self.fs.lock().durable.clone();
        self.image(versions)
    }

    /// A power cut after arbitrary write-back: per object a seeded mix of durable and pending
    /// state (rule 7).
    #[must_use]
    pub fn crash_with(&self, seed: u64) -> MemLower {
        let st = self.fs.lock();
        let mut rng = SplitMix64(seed);
        let inos: BTreeSet<u64> = st.live.keys().chain(st.durable.keys()).copied().collect();
        let mut versions = BTreeMap::new();
        for ino in inos {
            let version = match (st.durable.get(&ino), st.live.get(&ino)) {
                (Some(d), Some(l)) => mix(d, l, &mut rng),
                (None, Some(l)) => mix(&l.skeleton(), l, &mut rng),
                (Some(d), None) => d.clone(),
                (None, None) => unreachable!("from the union of both"),
            };
            versions.insert(ino, version);
        }
        drop(st);
        self.image(versions)
    }

    /// Rule 6: the tree reachable from the root in `versions`, as fsck would leave it.
    fn image(&self, mut versions: BTreeMap<u64, Inode>) -> MemLower {
        let config = self.fs.config.clone();
        let mut parents = BTreeMap::from([(ROOT_INO, ROOT_INO)]);
        let mut links: BTreeMap<u64, u32> = BTreeMap::new();
        let mut queue = VecDeque::from([ROOT_INO]);
        while let Some(dir) = queue.pop_front() {
            let d = versions[&dir].dir().expect("queued inodes are directories");
            let mut dropped = Vec::new();
            let mut subdirs = 0;
            for (name, e) in &d.entries {
                match versions.get(&e.ino).map(Inode::kind) {
                    None => dropped.push(name.clone()),
                    Some(FileKind::Directory) => {
                        if let std::collections::btree_map::Entry::Vacant(v) = parents.entry(e.ino)
                        {
                            v.insert(dir);
                            queue.push_back(e.ino);
                            subdirs += 1;
                        } else {
                            dropped.push(name.clone());
                        }
                    }
                    Some(_) => *links.entry(e.ino).or_default() += 1,
                }
            }
            let inode = versions.get_mut(&dir).expect("present");
            inode.nlink = 2 + subdirs;
            let d = inode.dir_mut();
            d.parent = parents[&dir];
            for name in dropped {
                d.entries.remove(&name);
            }
        }
        let mut out: BTreeMap<u64, Inode> = versions
            .into_iter()
            .filter(|(ino, _)| parents.contains_key(ino) || links.contains_key(ino))
            .collect();
        for (ino, inode) in &mut out {
            if let Some(&n) = links.get(ino) {
                inode.nlink = n;
            }
            if let Content::File(f) = &mut inode.content {
                f.normalize();
            }
        }
        let alloc = place_blocks(&mut out, config.blocks);
        let state = State { durable: out.clone(), live: out, refs: BTreeMap::new(), alloc };
        Self::from_state(config, state)
    }

    fn make(
        &self,
        st: &mut State,
        creds: &Creds,
        parent: u64,
        name: &OsStr,
        mode: u32,
        kind: NewKind,
    ) -> Result<u64> {
        st.parent_dir(parent)?;
        if is_dot(name) {
            return err(libc::EEXIST);
        }
        check_name(name)?;
        if st.child(parent, name)?.is_some() {
            return err(libc::EEXIST);
        }
        let ino = st.alloc_ino(&self.fs.config)?;
        let p = st.get(parent);
        let sgid_parent = p.mode & libc::S_ISGID != 0;
        let gid = if sgid_parent { p.gid } else { creds.gid };
        let mut mode = mode;
        if matches!(kind, NewKind::Dir) && sgid_parent {
            mode |= libc::S_ISGID;
        }
        // mode_strip_sgid: a group-executable setgid file in a setgid directory keeps S_ISGID
        // only if the creator is in that group (or privileged: fsuid 0).
        let sgid_x = libc::S_ISGID | libc::S_IXGRP;
        if !matches!(kind, NewKind::Dir)
            && mode & sgid_x == sgid_x
            && sgid_parent
            && creds.uid != 0
            && creds.gid != p.gid
            && !creds.groups.contains(&p.gid)
        {
            mode &= !libc::S_ISGID;
        }
        let rdev = if let NewKind::Special(rdev) = kind { rdev } else { 0 };
        let content = match kind {
            NewKind::File => Content::File(FileData::default()),
            NewKind::Dir => {
                let Some(phys) = st.alloc.alloc(None) else { return err(libc::ENOSPC) };
                Content::Dir(DirData {
                    entries: BTreeMap::new(),
                    next_cookie: COOKIE_FIRST,
                    parent,
                    phys,
                })
            }
            NewKind::Symlink(target) => Content::Symlink(target),
            NewKind::Special(_) => Content::Special,
        };
        let is_dir = matches!(content, Content::Dir(_));
        let now = self.fs.now();
        let inode = Inode {
            mode,
            uid: creds.uid,
            gid,
            nlink: if is_dir { 2 } else { 1 },
            rdev,
            atime: now,
            mtime: now,
            ctime: now,
            xattrs: BTreeMap::new(),
            content,
        };
        st.live.insert(ino, inode);
        let p = st.get_mut(parent);
        p.touch(now);
        if is_dir {
            p.nlink += 1;
        }
        let d = p.dir_mut();
        d.entries.insert(name.to_owned(), Dentry { ino, cookie: d.next_cookie });
        d.next_cookie += 1;
        Ok(ino)
    }

    fn entry(&self, st: &mut State, ino: u64) -> (MemNode, Attr) {
        let attr = st.attr(&self.fs.config, ino);
        (hold(&self.fs, st, ino), attr)
    }

    fn open_locked(&self, st: &mut State, ino: u64, flags: i32) -> Result<MemFile> {
        let writable = matches!(flags & libc::O_ACCMODE, libc::O_WRONLY | libc::O_RDWR);
        match st.get(ino).kind() {
            FileKind::Directory if writable => return err(libc::EISDIR),
            FileKind::Directory => {}
            _ if flags & libc::O_DIRECTORY != 0 => return err(libc::ENOTDIR),
            FileKind::Symlink => return err(libc::ELOOP),
            FileKind::Regular if flags & libc::O_TRUNC != 0 && writable => {
                let now = self.fs.now();
                let State { live, alloc, .. } = st;
                let inode = live.get_mut(&ino).expect("held");
                inode.file_mut().truncate(alloc, 0);
                inode.touch(now);
            }
            _ => {}
        }
        let flags = flags & (libc::O_ACCMODE | libc::O_APPEND | libc::O_DIRECT);
        Ok(MemFile { node: hold(&self.fs, st, ino), flags, dir: false, pos: Mutex::new(0) })
    }

    fn new_object(
        &self,
        creds: &Creds,
        parent: &MemNode,
        name: &OsStr,
        mode: u32,
        kind: NewKind,
    ) -> Result<(MemNode, Attr)> {
        let mut st = self.fs.lock();
        let ino = self.make(&mut st, creds, parent.ino, name, mode, kind)?;
        Ok(self.entry(&mut st, ino))
    }

    /// Regular-file data of an open file, checked as read(2)/write(2) would.
    fn io_target(st: &State, file: &MemFile, write: bool) -> Result<()> {
        if file.dir {
            return err(if write { libc::EBADF } else { libc::EISDIR });
        }
        if (write && !file.writable()) || (!write && !file.readable()) {
            return err(libc::EBADF);
        }
        match st.get(file.node.ino).kind() {
            FileKind::Regular => Ok(()),
            FileKind::Directory => err(libc::EISDIR),
            _ => err(libc::EINVAL),
        }
    }

    fn rename_locked(
        &self,
        st: &mut State,
        (parent, name): (u64, &OsStr),
        (newparent, newname): (u64, &OsStr),
        flags: u32,
    ) -> Result<()> {
        let exchange = flags & libc::RENAME_EXCHANGE != 0;
        let noreplace = flags & libc::RENAME_NOREPLACE != 0;
        if flags & !(libc::RENAME_EXCHANGE | libc::RENAME_NOREPLACE) != 0 || (exchange && noreplace)
        {
            return err(libc::EINVAL);
        }
        st.parent_dir(parent)?;
        st.parent_dir(newparent)?;
        if is_dot(name) {
            return err(libc::EBUSY);
        }
        if is_dot(newname) {
            return err(if noreplace { libc::EEXIST } else { libc::EBUSY });
        }
        check_name(name)?;
        check_name(newname)?;
        let src = st.child(parent, name)?.ok_or(Errno(libc::ENOENT))?;
        let dst = st.child(newparent, newname)?;
        if exchange && dst.is_none() {
            return err(libc::ENOENT);
        }
        if noreplace && dst.is_some() {
            return err(libc::EEXIST);
        }
        // lock_rename's traps: the source may not be an ancestor of the new parent, the
        // target not an ancestor of the old parent.
        if st.is_ancestor_or_self(src, newparent) {
            return err(libc::EINVAL);
        }
        if let Some(d) = dst
            && st.is_ancestor_or_self(d, parent)
        {
            return err(if exchange { libc::EINVAL } else { libc::ENOTEMPTY });
        }
        if dst == Some(src) {
            return Ok(());
        }
        let src_dir = st.get(src).kind() == FileKind::Directory;
        let dst_dir = dst.is_some_and(|d| st.get(d).kind() == FileKind::Directory);
        if let Some(d) = dst
            && !exchange
        {
            if src_dir && !dst_dir {
                return err(libc::ENOTDIR);
            }
            if !src_dir && dst_dir {
                return err(libc::EISDIR);
            }
            if dst_dir && !st.get(d).dir().expect("dir").entries.is_empty() {
                return err(libc::ENOTEMPTY);
            }
        }
        let now = self.fs.now();
        if exchange {
            let d = dst.expect("checked");
            st.get_mut(parent).dir_mut().entries.get_mut(name).expect("found").ino = d;
            st.get_mut(newparent).dir_mut().entries.get_mut(newname).expect("found").ino = src;
            self.reparent(st, src, parent, newparent);
            self.reparent(st, d, newparent, parent);
            st.get_mut(d).ctime = now;
        } else {
            st.get_mut(parent).dir_mut().entries.remove(name);
            if let Some(d) = dst {
                let victim = st.get_mut(d);
                victim.ctime = now;
                if dst_dir {
                    victim.nlink = 0;
                    st.get_mut(newparent).nlink -= 1;
                } else {
                    victim.nlink -= 1;
                }
                st.get_mut(newparent).dir_mut().entries.get_mut(newname).expect("found").ino = src;
                st.free_if_unused(d);
            } else {
                let nd = st.get_mut(newparent).dir_mut();
                nd.entries.insert(newname.to_owned(), Dentry { ino: src, cookie: nd.next_cookie });
                nd.next_cookie += 1;
            }
            self.reparent(st, src, parent, newparent);
        }
        st.get_mut(src).ctime = now;
        st.get_mut(parent).touch(now);
        st.get_mut(newparent).touch(now);
        Ok(())
    }

    /// A directory moved from `from` to `to`: ".." and the parents' link counts follow.
    #[allow(clippy::unused_self)] // kept a method beside rename_locked for reading order
    fn reparent(&self, st: &mut State, ino: u64, from: u64, to: u64) {
        if from == to || st.get(ino).kind() != FileKind::Directory {
            return;
        }
        st.get_mut(ino).dir_mut().parent = to;
        st.get_mut(from).nlink -= 1;
        st.get_mut(to).nlink += 1;
    }

    fn truncate_locked(&self, st: &mut State, ino: u64, size: u64) -> Result<()> {
        if size > MAX_FILE_SIZE {
            return err(libc::EFBIG);
        }
        let now = self.fs.now();
        let State { live, alloc, .. } = st;
        let inode = live.get_mut(&ino).expect("held");
        inode.file_mut().truncate(alloc, size);
        inode.touch(now);
        Ok(())
    }

    fn setattr_size(
        &self,
        st: &mut State,
        ino: u64,
        file: Option<&MemFile>,
        size: u64,
    ) -> Result<()> {
        i64::try_from(size).map_err(|_| Errno(libc::EFBIG))?;
        match file {
            // ftruncate: the file must be a regular file open for writing.
            Some(f) if f.dir || !f.writable() || st.get(ino).kind() != FileKind::Regular => {
                err(libc::EINVAL)
            }
            // truncate without a file reopens the node for writing.
            None => match st.get(ino).kind() {
                FileKind::Regular => self.truncate_locked(st, ino, size),
                FileKind::Directory => err(libc::EISDIR),
                FileKind::Symlink => err(libc::ELOOP),
                _ => err(libc::EINVAL),
            },
            Some(_) => self.truncate_locked(st, ino, size),
        }
    }
}

/// Gives every block of a crash image a distinct physical block (the first claim in inode
/// order keeps its number) and returns the allocator of the rest.
fn place_blocks(inodes: &mut BTreeMap<u64, Inode>, total: u64) -> Allocator {
    let mut used = BTreeSet::new();
    let mut moved: Vec<(u64, Option<u64>)> = Vec::new();
    for (&ino, inode) in inodes.iter() {
        match &inode.content {
            Content::File(f) => {
                for (&i, b) in &f.blocks {
                    if b.phys == 0 || b.phys > total || !used.insert(b.phys) {
                        moved.push((ino, Some(i)));
                    }
                }
            }
            Content::Dir(d) => {
                if d.phys == 0 || d.phys > total || !used.insert(d.phys) {
                    moved.push((ino, None));
                }
            }
            Content::Symlink(_) | Content::Special => {}
        }
    }
    let mut alloc = Allocator::with_used(total, &used);
    for (ino, index) in moved {
        let phys = alloc.alloc(None);
        let inode = inodes.get_mut(&ino).expect("present");
        match (index, &mut inode.content) {
            (Some(i), Content::File(f)) => match phys {
                Some(p) => f.blocks.get_mut(&i).expect("present").phys = p,
                None => drop(f.blocks.remove(&i)),
            },
            (None, Content::Dir(d)) => d.phys = phys.unwrap_or(0),
            _ => unreachable!("recorded from the same content"),
        }
    }
    alloc
}

fn xattr_name(name: &OsStr) -> Result<()> {
    let b = name.as_bytes();
    if b.is_empty() || b.len() > XATTR_NAME_MAX {
        return err(libc::ERANGE);
    }
    for prefix in [&b"user."[..], b"trusted.", b"security."] {
        if let Some(rest) = b.strip_prefix(prefix) {
            return if rest.is_empty() { err(libc::EINVAL) } else { Ok(()) };
        }
    }
    err(libc::EOPNOTSUPP)
}

fn is_user_xattr(name: &OsStr) -> bool {
    name.as_bytes().starts_with(b"user.")
}

/// Answers a sized xattr query: `size == 0` asks for the length.
fn sized(value: Vec<u8>, size: usize) -> Result<Vec<u8>> {
    if size == 0 {
        Ok(vec![0; value.len()])
    } else if value.len() > size {
        err(libc::ERANGE)
    } else {
        Ok(value)
    }
}

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
        let mut st = self.fs.lock();
        let ino = node.ino;
        let kind = st.get(ino).kind();
        if let Some(mode) = set.mode
            && kind != FileKind::Symlink
        {
            let now = self.fs.now();
            let i = st.get_mut(ino);
            i.mode = (i.mode & libc::S_IFMT) | (mode & 0o7777);
            i.ctime = now;
        }
        if set.uid.is_some() || set.gid.is_some() {
            let now = self.fs.now();
            let i = st.get_mut(ino);
            i.uid = set.uid.unwrap_or(i.uid);
            i.gid = set.gid.unwrap_or(i.gid);
            // chown clears set-user-ID, and set-group-ID when group-executable, even for root.
            if kind != FileKind::Directory {
                i.mode &= !libc::S_ISUID;
                if i.mode & libc::S_IXGRP != 0 {
                    i.mode &= !libc::S_ISGID;
                }
            }
            i.ctime = now;
        }
        if let Some(size) = set.size {
            self.setattr_size(&mut st, ino, file, size)?;
        }
        if set.atime.is_some() || set.mtime.is_some() {
            let now = self.fs.now();
            let at = |t: TimeSet| match t {
                TimeSet::Now => now,
                TimeSet::At(s, ns) => (s, ns),
            };
            let i = st.get_mut(ino);
            i.atime = set.atime.map_or(i.atime, at);
            i.mtime = set.mtime.map_or(i.mtime, at);
            i.ctime = now;
        }
        Ok(st.attr(&self.fs.config, ino))
    }

    fn readlink(&self, node: &MemNode) -> Result<Vec<u8>> {
        match &self.fs.lock().get(node.ino).content {
            Content::Symlink(t) => Ok(t.clone()),
            // readlinkat(fd, "") of a non-symlink, as the POSIX adapter asks, says ENOENT.
            _ => err(libc::ENOENT),
        }
    }

    fn mknod(
        &self,
        creds: &Creds,
        parent: &MemNode,
        name: &OsStr,
        mode: u32,
        rdev: u64,
    ) -> Result<(MemNode, Attr)> {
        let kind = match mode & libc::S_IFMT {
            0 | libc::S_IFREG => NewKind::File,
            libc::S_IFIFO | libc::S_IFSOCK => NewKind::Special(0),
            libc::S_IFCHR | libc::S_IFBLK => NewKind::Special(rdev),
            libc::S_IFDIR => return err(libc::EPERM),
            _ => return err(libc::EINVAL),
        };
        let ty = if mode & libc::S_IFMT == 0 { libc::S_IFREG } else { mode & libc::S_IFMT };
        let mode = ty | (mode & 0o7777 & !self.fs.config.umask);
        self.new_object(creds, parent, name, mode, kind)
    }

    fn mkdir(
        &self,
        creds: &Creds,
        parent: &MemNode,
        name: &OsStr,
        mode: u32,
    ) -> Result<(MemNode, Attr)> {
        let mode = libc::S_IFDIR | (mode & 0o1777 & !self.fs.config.umask);
        self.new_object(creds, parent, name, mode, NewKind::Dir)
    }

    fn symlink(
        &self,
        creds: &Creds,
        parent: &MemNode,
        name: &OsStr,
        target: &OsStr,
    ) -> Result<(MemNode, Attr)> {
        let t = target.as_bytes();
        if t.is_empty() {
            return err(libc::ENOENT);
        }
        if t.len() > SYMLINK_MAX {
            return err(libc::ENAMETOOLONG);
        }
        if t.contains(&0) {
            return err(libc::EINVAL);
        }
        let kind = NewKind::Symlink(t.to_vec());
        self.new_object(creds, parent, name, libc::S_IFLNK | 0o777, kind)
    }

    fn link(&self, node: &MemNode, newparent: &MemNode, newname: &OsStr) -> Result<Attr> {
        let mut st = self.fs.lock();
        st.parent_dir(newparent.ino)?;
        if is_dot(newname) {
            return err(libc::EEXIST);
        }
        check_name(newname)?;
        if st.child(newparent.ino, newname)?.is_some() {
            return err(libc::EEXIST);
        }
        let inode = st.get(node.ino);
        if inode.kind() == FileKind::Directory {
            return err(libc::EPERM);
        }
        if inode.nlink == 0 {
            return err(libc::ENOENT);
        }
        if inode.nlink >= LINK_MAX {
            return err(libc::EMLINK);
        }
        let now = self.fs.now();
        let inode = st.get_mut(node.ino);
        inode.nlink += 1;
        inode.ctime = now;
        let p = st.get_mut(newparent.ino);
        p.touch(now);
        let d = p.dir_mut();
        d.entries.insert(newname.to_owned(), Dentry { ino: node.ino, cookie: d.next_cookie });
        d.next_cookie += 1;
        Ok(st.attr(&self.fs.config, node.ino))
    }

    fn unlink(&self, parent: &MemNode, name: &OsStr) -> Result<()> {
        let mut st = self.fs.lock();
        st.parent_dir(parent.ino)?;
        if is_dot(name) {
            return err(libc::EISDIR);
        }
        check_name(name)?;
        let ino = st.child(parent.ino, name)?.ok_or(Errno(libc::ENOENT))?;
        if st.get(ino).kind() == FileKind::Directory {
            return err(libc::EISDIR);
        }
        let now = self.fs.now();
        let p = st.get_mut(parent.ino);
        p.touch(now);
        p.dir_mut().entries.remove(name);
        let inode = st.get_mut(ino);
        inode.nlink -= 1;
        inode.ctime = now;
        st.free_if_unused(ino);
        Ok(())
    }

    fn rmdir(&self, parent: &MemNode, name: &OsStr) -> Result<()> {
        let mut st = self.fs.lock();
        st.parent_dir(parent.ino)?;
        if name == "." {
            return err(libc::EINVAL);
        }
        if name == ".." {
            return err(libc::ENOTEMPTY);
        }
        check_name(name)?;
        let ino = st.child(parent.ino, name)?.ok_or(Errno(libc::ENOENT))?;
        match st.get(ino).dir() {
            None => return err(libc::ENOTDIR),
            Some(d) if !d.entries.is_empty() => return err(libc::ENOTEMPTY),
            Some(_) => {}
        }
        let now = self.fs.now();
        let p = st.get_mut(parent.ino);
        p.touch(now);
        p.nlink -= 1;
        p.dir_mut().entries.remove(name);
        let inode = st.get_mut(ino);
        inode.nlink = 0;
        inode.ctime = now;
        st.free_if_unused(ino);
        Ok(())
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
        let mut st = self.fs.lock();
        st.parent_dir(parent.ino)?;
        if is_dot(name) {
            return err(libc::EISDIR);
        }
        check_name(name)?;
        let ino = match st.child(parent.ino, name)? {
            Some(_) if flags & libc::O_EXCL != 0 => return err(libc::EEXIST),
            Some(ino) => match st.get(ino).kind() {
                FileKind::Directory => return err(libc::EISDIR),
                FileKind::Symlink => return err(libc::ELOOP),
                _ => ino,
            },
            None => {
                let mode = libc::S_IFREG | (mode & 0o7777 & !self.fs.config.umask);
                self.make(&mut st, creds, parent.ino, name, mode, NewKind::File)?
            }
        };
        let file = self.open_locked(&mut st, ino, flags)?;
        let (node, attr) = self.entry(&mut st, ino);
        Ok((node, attr, file))
    }

    fn open_direct(&self, node: &MemNode, writable: bool) -> Result<Option<MemFile>> {
        let mut st = self.fs.lock();
        match st.get(node.ino).kind() {
            FileKind::Regular => {
                let access = if writable { libc::O_RDWR } else { libc::O_RDONLY };
                self.open_locked(&mut st, node.ino, access | libc::O_DIRECT).map(Some)
            }
            FileKind::Directory if writable => err(libc::EISDIR),
            FileKind::Symlink => err(libc::ELOOP),
            _ => Ok(None),
        }
    }

    fn read(&self, file: &MemFile, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let mut st = self.fs.lock();
        Self::io_target(&st, file, false)?;
        file.check_direct(offset, buf.as_ptr(), buf.len())?;
        i64::try_from(offset).map_err(|_| Errno(libc::EINVAL))?;
        let now = self.fs.now();
        let inode = st.get_mut(file.node.ino);
        let n = inode.file().read(offset, buf);
        inode.accessed(now);
        Ok(n)
    }

    fn write(&self, file: &MemFile, offset: u64, data: &[u8]) -> Result<usize> {
        let mut st = self.fs.lock();
        Self::io_target(&st, file, true)?;
        file.check_direct(offset, data.as_ptr(), data.len())?;
        i64::try_from(offset).map_err(|_| Errno(libc::EINVAL))?;
        if data.is_empty() {
            return Ok(0);
        }
        let State { live, alloc, .. } = &mut *st;
        let inode = live.get_mut(&file.node.ino).expect("held");
        // pwrite on an O_APPEND file appends (Linux ignores the offset).
        let offset = if file.flags & libc::O_APPEND != 0 { inode.file().size } else { offset };
        if offset >= MAX_FILE_SIZE {
            return err(libc::EFBIG);
        }
        let len = data.len().min(usize::try_from(MAX_FILE_SIZE - offset).unwrap_or(usize::MAX));
        let n = inode.file_mut().write(alloc, offset, &data[..len]);
        if n == 0 {
            return err(libc::ENOSPC);
        }
        inode.touch(self.fs.now());
        Ok(n)
    }

    fn fsync(&self, file: &MemFile, datasync: bool) -> Result<()> {
        let mut st = self.fs.lock();
        match st.get(file.node.ino).kind() {
            FileKind::Regular | FileKind::Directory => {}
            _ => return err(libc::EINVAL),
        }
        st.persist(file.node.ino, datasync);
        Ok(())
    }

    fn fallocate(&self, file: &MemFile, mode: i32, offset: u64, len: u64) -> Result<()> {
        const KEEP: i32 = libc::FALLOC_FL_KEEP_SIZE;
        const PUNCH: i32 = libc::FALLOC_FL_PUNCH_HOLE;
        if i64::try_from(offset).is_err() || len == 0 || i64::try_from(len).is_err() {
            return err(libc::EINVAL);
        }
        if mode & PUNCH != 0 && mode & KEEP == 0 {
            return err(libc::EOPNOTSUPP);
        }
        if !matches!(mode, 0 | KEEP) && mode != PUNCH | KEEP {
            return err(libc::EOPNOTSUPP);
        }
        let mut st = self.fs.lock();
        if !file.writable() {
            return err(libc::EBADF);
        }
        match st.get(file.node.ino).kind() {
            FileKind::Regular => {}
            FileKind::Directory => return err(libc::EISDIR),
            _ => return err(libc::ENODEV),
        }
        let end = offset.checked_add(len).filter(|&e| e <= MAX_FILE_SIZE);
        let Some(end) = end else { return err(libc::EFBIG) };
        let now = self.fs.now();
        let State { live, alloc, .. } = &mut *st;
        let inode = live.get_mut(&file.node.ino).expect("held");
        let f = inode.file_mut();
        if mode == PUNCH | KEEP {
            f.punch(alloc, offset, end);
            inode.touch(now);
            return Ok(());
        }
        f.preallocate(alloc, offset, end)?;
        if mode == 0 && end > f.size {
            f.size = end;
            inode.mtime = now;
        }
        inode.ctime = now;
        Ok(())
    }

    fn lseek(&self, file: &MemFile, offset: i64, whence: i32) -> Result<i64> {
        let st = self.fs.lock();
        let inode = st.get(file.node.ino);
        let mut pos = file.pos.lock().unwrap_or_else(PoisonError::into_inner);
        let size = match &inode.content {
            Content::File(f) => f.size,
            Content::Dir(_) => BLOCK_SIZE,
            _ => return err(libc::ESPIPE),
        };
        let size = i64::try_from(size).expect("sizes fit i64");
        let new = match whence {
            libc::SEEK_SET => Some(offset),
            libc::SEEK_CUR => pos.checked_add(offset),
            libc::SEEK_END => size.checked_add(offset),
            libc::SEEK_DATA | libc::SEEK_HOLE => {
                let Content::File(f) = &inode.content else { return err(libc::EINVAL) };
                let Ok(off) = u64::try_from(offset) else { return err(libc::ENXIO) };
                let found = f.seek(off, whence == libc::SEEK_DATA)?;
                Some(i64::try_from(found).expect("below the size"))
            }
            _ => return err(libc::EINVAL),
        };
        let Some(new) = new else { return err(libc::EOVERFLOW) };
        if new < 0 {
            return err(libc::EINVAL);
        }
        *pos = new;
        Ok(new)
    }

    fn copy_file_range(
        &self,
        input: &MemFile,
        offset_in: u64,
        output: &MemFile,
        offset_out: u64,
        len: u64,
    ) -> Result<u64> {
        let mut st = self.fs.lock();
        let (ino_in, ino_out) = (input.node.ino, output.node.ino);
        let (kind_in, kind_out) = (st.get(ino_in).kind(), st.get(ino_out).kind());
        if kind_in == FileKind::Directory || kind_out == FileKind::Directory {
            return err(libc::EISDIR);
        }
        if kind_in != FileKind::Regular || kind_out != FileKind::Regular {
            return err(libc::EINVAL);
        }
        if input.dir
            || !input.readable()
            || !output.writable()
            || output.flags & libc::O_APPEND != 0
        {
            return err(libc::EBADF);
        }
        if i64::try_from(offset_in).is_err() || i64::try_from(offset_out).is_err() {
            return err(libc::EINVAL);
        }
        let size_in = st.get(ino_in).file().size;
        let mut count = if offset_in >= size_in { 0 } else { len.min(size_in - offset_in) };
        if count > 0 && offset_out >= MAX_FILE_SIZE {
            return err(libc::EFBIG);
        }
        count = count.min(MAX_FILE_SIZE.saturating_sub(offset_out));
        if ino_in == ino_out && offset_out + count > offset_in && offset_out < offset_in + count {
            return err(libc::EINVAL);
        }
        let mut done = 0;
        let mut buf = Vec::new();
        while done < count {
            let n = (count - done).min(COPY_CHUNK);
            buf.resize(n as usize, 0);
            st.get(ino_in).file().read(offset_in + done, &mut buf);
            let State { live, alloc, .. } = &mut *st;
            let out = live.get_mut(&ino_out).expect("held").file_mut();
            let written = out.write(alloc, offset_out + done, &buf) as u64;
            done += written;
            if written < n {
                break;
            }
        }
        if count > 0 && done == 0 {
            return err(libc::ENOSPC);
        }
        let now = self.fs.now();
        if done > 0 {
            st.get_mut(ino_out).touch(now);
        }
        st.get_mut(ino_in).accessed(now);
        Ok(done)
    }

    fn fiemap(&self, file: &MemFile) -> Result<Vec<Extent>> {
        let st = self.fs.lock();
        match &st.get(file.node.ino).content {
            Content::File(f) => Ok(f.extents()),
            Content::Dir(d) => Ok(vec![Extent {
                logical: 0,
                physical: d.phys * BLOCK_SIZE,
                length: BLOCK_SIZE,
                flags: FIEMAP_EXTENT_LAST,
            }]),
            _ => err(libc::EOPNOTSUPP),
        }
    }

    fn opendir(&self, node: &MemNode) -> Result<MemFile> {
        let mut st = self.fs.lock();
        if st.get(node.ino).kind() != FileKind::Directory {
            return err(libc::ENOTDIR);
        }
        let mut file = self.open_locked(&mut st, node.ino, libc::O_RDONLY)?;
        file.dir = true;
        Ok(file)
    }

    fn readdir(
        &self,
        dir: &MemFile,
        offset: u64,
        emit: &mut dyn FnMut(DirEntry) -> bool,
    ) -> Result<()> {
        if !dir.dir {
            return err(libc::ENOTDIR);
        }
        // Collected under the lock, emitted after it: `emit` may call back into the file system.
        let entries = {
            let mut st = self.fs.lock();
            let inode = st.get(dir.node.ino);
            if inode.nlink == 0 {
                // ext4 says ENOENT for a removed directory; glibc's readdir turns that into
                // the end of the directory, which is what the POSIX adapter reports.
                return Ok(());
            }
            let d = inode.dir().expect("opened as a directory");
            let mut list = vec![
                (COOKIE_DOT, OsString::from("."), dir.node.ino),
                (COOKIE_DOTDOT, OsString::from(".."), d.parent),
            ];
            list.extend(d.entries.iter().map(|(n, e)| (e.cookie, n.clone(), e.ino)));
            list.retain(|(cookie, _, _)| *cookie > offset);
            list.sort_by_key(|(cookie, _, _)| *cookie);
            let entries: Vec<DirEntry> = list
                .into_iter()
                .map(|(cookie, name, ino)| DirEntry {
                    ino,
                    offset: cookie,
                    kind: Some(st.get(ino).kind()),
                    name,
                })
                .collect();
            let now = self.fs.now();
            st.get_mut(dir.node.ino).accessed(now);
            entries
        };
        for entry in entries {
            if !emit(entry) {
                break;
            }
        }
        Ok(())
    }

    fn fsyncdir(&self, dir: &MemFile, datasync: bool) -> Result<()> {
        self.fsync(dir, datasync)
    }

    fn statfs(&self, _node: &MemNode) -> Result<StatFs> {
        let st = self.fs.lock();
        let c = &self.fs.config;
        Ok(StatFs {
            blocks: c.blocks,
            bfree: st.alloc.free_count,
            bavail: st.alloc.free_count,
            files: c.inodes,
            ffree: c.inodes.saturating_sub(st.live.len() as u64),
            bsize: BLOCK_SIZE as u32,
            namelen: NAME_MAX as u32,
            frsize: BLOCK_SIZE as u32,
            fsid: c.fsid,
        })
    }

    fn setxattr(&self, node: &MemNode, name: &OsStr, value: &[u8], flags: i32) -> Result<()> {
        if flags & !(libc::XATTR_CREATE | libc::XATTR_REPLACE) != 0 {
            return err(libc::EINVAL);
        }
        if name.is_empty() || name.len() > XATTR_NAME_MAX {
            return err(libc::ERANGE);
        }
        if value.len() > XATTR_SIZE_MAX {
            return err(libc::E2BIG);
        }
        let mut st = self.fs.lock();
        let kind = st.get(node.ino).kind();
        if is_user_xattr(name) && !matches!(kind, FileKind::Regular | FileKind::Directory) {
            return err(libc::EPERM);
        }
        xattr_name(name)?;
        let inode = st.get(node.ino);
        let old = inode.xattrs.get(name);
        if old.is_none() && flags & libc::XATTR_REPLACE != 0 {
            return err(libc::ENODATA);
        }
        if old.is_some() && flags & libc::XATTR_CREATE != 0 {
            return err(libc::EEXIST);
        }
        let cost = |n: &OsStr, v: &[u8]| n.len() + v.len() + XATTR_ENTRY_OVERHEAD;
        let used: usize = inode.xattrs.iter().map(|(n, v)| cost(n, v)).sum();
        let after = used - old.map_or(0, |v| cost(name, v)) + cost(name, value);
        if after > self.fs.config.xattr_space {
            return err(libc::ENOSPC);
        }
        let now = self.fs.now();
        let inode = st.get_mut(node.ino);
        inode.xattrs.insert(name.to_owned(), value.to_vec());
        inode.ctime = now;
        Ok(())
    }

    fn getxattr(&self, node: &MemNode, name: &OsStr, size: usize) -> Result<Vec<u8>> {
        if name.is_empty() || name.len() > XATTR_NAME_MAX {
            return err(libc::ERANGE);
        }
        let st = self.fs.lock();
        let inode = st.get(node.ino);
        if is_user_xattr(name) && !matches!(inode.kind(), FileKind::Regular | FileKind::Directory) {
            return err(libc::ENODATA);
        }
        xattr_name(name)?;
        let value = inode.xattrs.get(name).ok_or(Errno(libc::ENODATA))?;
        sized(value.clone(), size)
    }

    fn listxattr(&self, node: &MemNode, size: usize) -> Result<Vec<u8>> {
        let st = self.fs.lock();
        let mut list = Vec::new();
        for name in st.get(node.ino).xattrs.keys() {
            list.extend_from_slice(name.as_bytes());
            list.push(0);
        }
        sized(list, size)
    }

    fn removexattr(&self, node: &MemNode, name: &OsStr) -> Result<()> {
        if name.is_empty() || name.len() > XATTR_NAME_MAX {
            return err(libc::ERANGE);
        }
        let mut st = self.fs.lock();
        if is_user_xattr(name)
            && !matches!(st.get(node.ino).kind(), FileKind::Regular | FileKind::Directory)
        {
            return err(libc::EPERM);
        }
        xattr_name(name)?;
        let now = self.fs.now();
        let inode = st.get_mut(node.ino);
        inode.xattrs.remove(name).ok_or(Errno(libc::ENODATA))?;
        inode.ctime = now;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROOT: Creds = Creds { uid: 0, gid: 0, groups: Vec::new() };

    fn small(blocks: u64) -> MemLower {
        MemLower::new(MemConfig { blocks, ..MemConfig::default() })
    }

    #[test]
    fn allocator_prefers_the_goal_then_the_lowest_and_merges_on_release() {
        let mut a = Allocator::with_used(10, &BTreeSet::from([3]));
        assert_eq!(a.free_count, 9);
        assert_eq!(a.alloc(Some(5)), Some(5));
        assert_eq!(a.alloc(Some(5)), Some(1), "goal taken: lowest free");
        assert_eq!(a.alloc(None), Some(2));
        assert_eq!(a.alloc(None), Some(4));
        a.release(4);
        a.release(2);
        a.release(1);
        assert_eq!(a.free.get(&1), Some(&2));
        assert_eq!(a.free.get(&4), Some(&1));
        assert_eq!(a.free_count, 8);
    }

    #[test]
    fn sequential_writes_make_one_extent_and_preallocation_is_unwritten() {
        let l = MemLower::default();
        let (_, _, f) = l.create(&ROOT, l.root(), OsStr::new("f"), 0o644, libc::O_RDWR).unwrap();
        for i in 0..4u64 {
            l.write(&f, i * BLOCK_SIZE, &[1u8; 4096]).unwrap();
        }
        l.fallocate(&f, libc::FALLOC_FL_KEEP_SIZE, 4 * BLOCK_SIZE, 2 * BLOCK_SIZE).unwrap();
        let e = l.fiemap(&f).unwrap();
        assert_eq!(e.len(), 2, "{e:?}");
        assert_eq!((e[0].logical, e[0].length, e[0].flags), (0, 4 * BLOCK_SIZE, 0));
        assert_eq!(e[1].flags, FIEMAP_EXTENT_UNWRITTEN | FIEMAP_EXTENT_LAST);
        assert_eq!(e[1].physical, e[0].physical + e[0].length, "allocated after the data");
        assert_eq!(l.getattr(&l.lookup(l.root(), OsStr::new("f")).unwrap().0).unwrap().size, 16384);
    }

    #[test]
    fn readdir_cookies_stay_with_their_entries() {
        let l = MemLower::default();
        for n in ["a", "b", "c"] {
            l.mkdir(&ROOT, l.root(), OsStr::new(n), 0o755).unwrap();
        }
        let dir = l.opendir(l.root()).unwrap();
        let mut seen = Vec::new();
        l.readdir(&dir, 0, &mut |e| {
            seen.push((e.name, e.offset));
            seen.len() < 3
        })
        .unwrap();
        assert_eq!(seen.last().unwrap().0, "a");
        l.rmdir(l.root(), OsStr::new("b")).unwrap();
        l.mkdir(&ROOT, l.root(), OsStr::new("d"), 0o755).unwrap();
        let mut rest = Vec::new();
        l.readdir(&dir, seen.last().unwrap().1, &mut |e| {
            rest.push(e.name.into_string().unwrap());
            true
        })
        .unwrap();
        assert_eq!(rest, ["c", "d"]);
    }

    #[test]
    fn a_full_file_system_gives_short_writes_then_enospc() {
        // The root directory holds one of the 4 blocks.
        let l = small(4);
        let (_, _, f) = l.create(&ROOT, l.root(), OsStr::new("f"), 0o644, libc::O_RDWR).unwrap();
        assert_eq!(l.write(&f, 100, &vec![7u8; 5 * 4096]).unwrap(), 3 * 4096 - 100);
        assert_eq!(l.write(&f, 3 * 4096, b"x").unwrap_err(), Errno(libc::ENOSPC));
        assert_eq!(l.statfs(l.root()).unwrap().bfree, 0);
        assert_eq!(
            l.mkdir(&ROOT, l.root(), OsStr::new("d"), 0o755).unwrap_err(),
            Errno(libc::ENOSPC)
        );
        l.setattr(l.root(), None, &SetAttr::default()).unwrap();
        let node = l.lookup(l.root(), OsStr::new("f")).unwrap().0;
        l.setattr(&node, Some(&f), &SetAttr { size: Some(0), ..SetAttr::default() }).unwrap();
        assert_eq!(l.statfs(l.root()).unwrap().bfree, 3);
    }

    #[test]
    fn freed_inode_numbers_are_reused_only_when_no_durable_version_names_them() {
        let l = MemLower::default();
        let (n, _, f) = l.create(&ROOT, l.root(), OsStr::new("a"), 0o644, libc::O_RDWR).unwrap();
        assert_eq!(n.ino, FIRST_INO);
        l.sync_all();
        l.unlink(l.root(), OsStr::new("a")).unwrap();
        drop((n, f));
        let (n2, _) = l.mkdir(&ROOT, l.root(), OsStr::new("b"), 0o755).unwrap();
        assert_eq!(n2.ino, FIRST_INO + 1, "the durable root still names inode 11");
        l.sync_all();
        l.rmdir(l.root(), OsStr::new("b")).unwrap();
        drop(n2);
        l.sync_all();
        let (n3, _) = l.mkdir(&ROOT, l.root(), OsStr::new("c"), 0o755).unwrap();
        assert_eq!(n3.ino, FIRST_INO);
    }

    #[test]
    fn crash_images_have_one_block_per_physical_number() {
        let l = MemLower::default();
        let (_, _, a) = l.create(&ROOT, l.root(), OsStr::new("a"), 0o644, libc::O_RDWR).unwrap();
        l.write(&a, 0, &[1u8; 8192]).unwrap();
        l.sync_all();
        // Free a's blocks live, then give them to b: durable a and live b share numbers.
        let node = l.lookup(l.root(), OsStr::new("a")).unwrap().0;
        l.setattr(&node, Some(&a), &SetAttr { size: Some(0), ..SetAttr::default() }).unwrap();
        let (_, _, b) = l.create(&ROOT, l.root(), OsStr::new("b"), 0o644, libc::O_RDWR).unwrap();
        l.write(&b, 0, &[2u8; 8192]).unwrap();
        for seed in 0..32 {
            let c = l.crash_with(seed);
            let st = c.fs.lock();
            let mut phys = BTreeSet::new();
            for inode in st.live.values() {
                if let Content::File(f) = &inode.content {
                    for b in f.blocks.values() {
                        assert!(phys.insert(b.phys), "seed {seed}: block {} twice", b.phys);
                    }
                }
            }
        }
    }
}
