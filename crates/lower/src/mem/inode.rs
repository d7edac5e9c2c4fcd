//! The inode model: an inode's content (file blocks, directory entries, symlink target), the
//! [`State`] holding every inode's live and durable versions, and the attribute operations
//! (getattr, setattr, readlink).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::sync::Arc;

use super::alloc::Allocator;
use super::{BLOCK_SIZE, MemConfig, MemFile, MemLower, MemNode, RELATIME_SECS, err};
use crate::Result;
use crate::types::{Attr, FileKind, SetAttr, TimeSet};

/// One block of a regular file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Block {
    pub(super) phys: u64,
    /// `None`: allocated but unwritten (fallocate): reads as zeros, a hole to SEEK_DATA.
    /// Shared copy-on-write between the live and durable versions.
    pub(super) data: Option<Arc<Vec<u8>>>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct FileData {
    pub(super) size: u64,
    /// Logical block index -> block; absent = hole.
    pub(super) blocks: BTreeMap<u64, Block>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Dentry {
    pub(super) ino: u64,
    /// Where readdir resumes after this entry (rule 12).
    pub(super) cookie: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct DirData {
    pub(super) entries: BTreeMap<OsString, Dentry>,
    pub(super) next_cookie: u64,
    /// "..": the parent directory's inode number.
    pub(super) parent: u64,
    pub(super) phys: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Content {
    File(FileData),
    Dir(DirData),
    Symlink(Vec<u8>),
    /// FIFO, socket, character or block device.
    Special,
}

pub(super) type Time = (i64, u32);

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Inode {
    /// Distinguishes the objects that reuse an inode number (as `i_generation` in file
    /// handles): unique in the process.
    pub(super) generation: u64,
    /// Type and permission bits (st_mode).
    pub(super) mode: u32,
    pub(super) uid: u32,
    pub(super) gid: u32,
    pub(super) nlink: u32,
    pub(super) rdev: u64,
    pub(super) atime: Time,
    pub(super) mtime: Time,
    pub(super) ctime: Time,
    pub(super) xattrs: BTreeMap<OsString, Vec<u8>>,
    pub(super) content: Content,
}

/// Source of [`Inode::generation`].
static GENERATION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

pub(super) fn next_generation() -> u64 {
    GENERATION.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

impl Inode {
    pub(super) fn kind(&self) -> FileKind {
        FileKind::from_mode(self.mode)
    }

    pub(super) fn file(&self) -> &FileData {
        match &self.content {
            Content::File(f) => f,
            _ => panic!("not a regular file"),
        }
    }

    pub(super) fn file_mut(&mut self) -> &mut FileData {
        match &mut self.content {
            Content::File(f) => f,
            _ => panic!("not a regular file"),
        }
    }

    pub(super) fn dir(&self) -> Option<&DirData> {
        match &self.content {
            Content::Dir(d) => Some(d),
            _ => None,
        }
    }

    pub(super) fn dir_mut(&mut self) -> &mut DirData {
        match &mut self.content {
            Content::Dir(d) => d,
            _ => panic!("not a directory"),
        }
    }

    pub(super) fn touch(&mut self, now: Time) {
        self.mtime = now;
        self.ctime = now;
    }

    /// relatime: atime moves when it is not newer than mtime or ctime, or a day old.
    pub(super) fn accessed(&mut self, now: Time) {
        if self.atime <= self.mtime
            || self.atime <= self.ctime
            || now.0 - self.atime.0 >= RELATIME_SECS
        {
            self.atime = now;
        }
    }

    /// The durable version of an object whose existence only is durable (rule 3).
    pub(super) fn skeleton(&self) -> Inode {
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
            generation: self.generation,
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
// The whole file system state

#[derive(Debug)]
pub(super) struct State {
    pub(super) live: BTreeMap<u64, Inode>,
    pub(super) durable: BTreeMap<u64, Inode>,
    /// Held nodes (open files hold their node) per live inode.
    pub(super) refs: BTreeMap<u64, u32>,
    pub(super) alloc: Allocator,
}

impl State {
    pub(super) fn get(&self, ino: u64) -> &Inode {
        self.live.get(&ino).expect("a held inode is live")
    }

    pub(super) fn get_mut(&mut self, ino: u64) -> &mut Inode {
        self.live.get_mut(&ino).expect("a held inode is live")
    }

    pub(super) fn attr(&self, config: &MemConfig, ino: u64) -> Attr {
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
}

impl MemLower {
    pub(super) fn do_setattr(
        &self,
        node: &MemNode,
        file: Option<&MemFile>,
        set: &SetAttr,
    ) -> Result<Attr> {
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

    pub(super) fn do_readlink(&self, node: &MemNode) -> Result<Vec<u8>> {
        match &self.fs.lock().get(node.ino).content {
            Content::Symlink(t) => Ok(t.clone()),
            // readlinkat(fd, "") of a non-symlink, as the POSIX adapter asks, says ENOENT.
            _ => err(libc::ENOENT),
        }
    }
}
