//! The lower file system adapter: everything nvstack asks of the file system it is stacked on
//! goes through the [`LowerFs`] trait, so the engine above can run over the real POSIX
//! implementation ([`posix::PosixLower`]) or, in tests, over an in-memory one.
//!
//! Objects are *nodes* (a held reference to a lower inode: an `O_PATH` descriptor in the POSIX
//! implementation) and *files* (an open file or directory). Every error is an [`Errno`]: the
//! lower file system's own answer, passed up unchanged so that applications see exactly what the
//! lower directory would have told them.

pub mod creds;
pub mod mem;
pub mod posix;
pub mod types;

pub use creds::Creds;
pub use mem::{Clock, LogicalClock, MemConfig, MemLower};
pub use types::{Attr, DirEntry, Errno, Extent, FileKind, NodeStats, SetAttr, StatFs, TimeSet};

use std::ffi::OsStr;

pub type Result<T> = std::result::Result<T, Errno>;

/// What the engine needs from a lower file system. Names follow the syscalls.
///
/// Identity: `key(node)` is the lower object's (device, inode) pair; two nodes with the same key
/// are the same object. Creating calls take the caller's credentials so that new objects belong
/// to the caller exactly as on the lower directory.
pub trait LowerFs: Send + Sync + std::fmt::Debug + 'static {
    /// A held reference to a lower object (keeps it reachable while held).
    type Node: Send + Sync + std::fmt::Debug + 'static;
    /// An open file or directory.
    type File: Send + Sync + std::fmt::Debug + 'static;

    fn root(&self) -> &Self::Node;
    fn key(&self, node: &Self::Node) -> (u64, u64);

    fn lookup(&self, parent: &Self::Node, name: &OsStr) -> Result<(Self::Node, Attr)>;
    fn getattr(&self, node: &Self::Node) -> Result<Attr>;
    fn setattr(&self, node: &Self::Node, file: Option<&Self::File>, set: &SetAttr) -> Result<Attr>;
    fn readlink(&self, node: &Self::Node) -> Result<Vec<u8>>;

    fn mknod(
        &self,
        creds: &Creds,
        parent: &Self::Node,
        name: &OsStr,
        mode: u32,
        rdev: u64,
    ) -> Result<(Self::Node, Attr)>;
    fn mkdir(
        &self,
        creds: &Creds,
        parent: &Self::Node,
        name: &OsStr,
        mode: u32,
    ) -> Result<(Self::Node, Attr)>;
    fn symlink(
        &self,
        creds: &Creds,
        parent: &Self::Node,
        name: &OsStr,
        target: &OsStr,
    ) -> Result<(Self::Node, Attr)>;
    fn link(&self, node: &Self::Node, newparent: &Self::Node, newname: &OsStr) -> Result<Attr>;
    fn unlink(&self, parent: &Self::Node, name: &OsStr) -> Result<()>;
    fn rmdir(&self, parent: &Self::Node, name: &OsStr) -> Result<()>;
    /// `flags`: 0, RENAME_NOREPLACE or RENAME_EXCHANGE (the renameat2 values).
    fn rename(
        &self,
        parent: &Self::Node,
        name: &OsStr,
        newparent: &Self::Node,
        newname: &OsStr,
        flags: u32,
    ) -> Result<()>;

    /// Opens with open(2) `flags` (O_CREAT and O_EXCL are ignored: use `create`).
    fn open(&self, node: &Self::Node, flags: i32) -> Result<Self::File>;
    /// Creates and opens a regular file as `creds`.
    fn create(
        &self,
        creds: &Creds,
        parent: &Self::Node,
        name: &OsStr,
        mode: u32,
        flags: i32,
    ) -> Result<(Self::Node, Attr, Self::File)>;
    /// The descriptor of an open regular file that the kernel may serve IO from directly
    /// (FUSE passthrough); `None` (the default) when the file system has none.
    fn backing_fd<'a>(&self, _file: &'a Self::File) -> Option<std::os::fd::BorrowedFd<'a>> {
        None
    }
    /// Opens for O_DIRECT IO; `None` when the lower file system does not support it (tmpfs).
    fn open_direct(&self, node: &Self::Node, writable: bool) -> Result<Option<Self::File>>;
    fn read(&self, file: &Self::File, offset: u64, buf: &mut [u8]) -> Result<usize>;
    fn write(&self, file: &Self::File, offset: u64, data: &[u8]) -> Result<usize>;
    fn fsync(&self, file: &Self::File, datasync: bool) -> Result<()>;
    fn fallocate(&self, file: &Self::File, mode: i32, offset: u64, len: u64) -> Result<()>;
    fn lseek(&self, file: &Self::File, offset: i64, whence: i32) -> Result<i64>;
    #[allow(clippy::too_many_arguments)]
    fn copy_file_range(
        &self,
        input: &Self::File,
        offset_in: u64,
        output: &Self::File,
        offset_out: u64,
        len: u64,
    ) -> Result<u64>;
    /// The physical extents of the file (FIEMAP), for location-aware write-back.
    fn fiemap(&self, file: &Self::File) -> Result<Vec<Extent>>;

    fn opendir(&self, node: &Self::Node) -> Result<Self::File>;
    /// Calls `emit` for entries after `offset` (0 = from the start) until it returns false.
    /// Each entry carries the offset to resume after it.
    fn readdir(
        &self,
        dir: &Self::File,
        offset: u64,
        emit: &mut dyn FnMut(DirEntry) -> bool,
    ) -> Result<()>;
    fn fsyncdir(&self, dir: &Self::File, datasync: bool) -> Result<()>;

    fn statfs(&self, node: &Self::Node) -> Result<StatFs>;
    fn setxattr(&self, node: &Self::Node, name: &OsStr, value: &[u8], flags: i32) -> Result<()>;
    /// The value; with `size == 0`, an empty buffer of the value's length is not made: the
    /// caller asks for the length with `size == 0` and gets `Err` ERANGE semantics from `size`.
    fn getxattr(&self, node: &Self::Node, name: &OsStr, size: usize) -> Result<Vec<u8>>;
    fn listxattr(&self, node: &Self::Node, size: usize) -> Result<Vec<u8>>;
    fn removexattr(&self, node: &Self::Node, name: &OsStr) -> Result<()>;

    /// syncfs(2): everything written to the lower file system so far is durable.
    fn syncfs(&self) -> Result<()>;

    /// How nodes hold their descriptors, for `stat`.
    fn node_stats(&self) -> NodeStats {
        NodeStats::default()
    }

    /// The lower file system's clock (for objects nvstack keeps itself, e.g. temp files, whose
    /// times must read like the lower file system's own).
    fn now(&self) -> (i64, u32);

    /// A durable identity of a directory that survives renames and remounts (a file handle,
    /// `name_to_handle_at`, where the lower file system has them; at most [`MAX_DIR_HANDLE`]
    /// bytes). Only meaningful for directories on the lower root's file system.
    fn dir_handle(&self, dir: &Self::Node) -> Result<Vec<u8>>;

    /// The directory whose [`LowerFs::dir_handle`] is `handle`. The default walks the tree
    /// from the root breadth-first, visiting at most `limit` directories (ENOENT when not
    /// found); implementations with a direct way (`open_by_handle_at`) try it first.
    fn find_dir(&self, handle: &[u8], limit: usize) -> Result<Self::Node> {
        walk_for_dir(self, handle, limit)
    }

    /// A durable identity of a regular file that never names another object, even after the
    /// file is deleted and its inode number reused (a file handle with its generation; the
    /// page cache finds the owner of dirty pages again after a crash with it). EOPNOTSUPP
    /// when the file system has none.
    fn file_handle(&self, file: &Self::Node) -> Result<Vec<u8>> {
        self.dir_handle(file)
    }

    /// The regular file whose [`LowerFs::file_handle`] is `handle`: like `find_dir`, but the
    /// walk compares the handles of regular files (ENOENT or ESTALE when it is gone).
    fn find_file(&self, handle: &[u8], limit: usize) -> Result<Self::Node> {
        walk_for_handle(self, handle, limit, FileKind::Regular)
    }

    /// The object of any kind whose [`LowerFs::file_handle`] is `handle`, if it still exists
    /// with a name (ENOENT or ESTALE when not): the metadata journal's replay asks whether an
    /// object it recorded was created. The default walks the tree (at most `limit`
    /// directories).
    fn find_object(&self, handle: &[u8], limit: usize) -> Result<Self::Node> {
        walk_for_any(self, handle, limit)
    }
}

/// Most bytes of a directory handle (MAX_HANDLE_SZ of the kernel is 128, plus 4 of type).
pub const MAX_DIR_HANDLE: usize = 132;

/// Breadth-first search of the directory with `handle` (see [`LowerFs::find_dir`]).
pub fn walk_for_dir<L: LowerFs + ?Sized>(fs: &L, handle: &[u8], limit: usize) -> Result<L::Node> {
    walk_for_handle(fs, handle, limit, FileKind::Directory)
}

/// Breadth-first search from the root for an object of any kind whose file handle is `handle`.
pub fn walk_for_any<L: LowerFs + ?Sized>(fs: &L, handle: &[u8], limit: usize) -> Result<L::Node> {
    walk(fs, limit, |_| true, |node, _| Ok(fs.file_handle(node)? == handle))
}

/// Breadth-first search from the root for the object of kind `want` with `handle`, visiting
/// at most `limit` directories.
pub fn walk_for_handle<L: LowerFs + ?Sized>(
    fs: &L,
    handle: &[u8],
    limit: usize,
    want: FileKind,
) -> Result<L::Node> {
    walk(
        fs,
        limit,
        |kind| matches!(kind, Some(FileKind::Directory) | None) || kind == Some(want),
        |node, kind| {
            if kind != want {
                return Ok(false);
            }
            let found = match want {
                FileKind::Directory => fs.dir_handle(node)?,
                _ => fs.file_handle(node)?,
            };
            Ok(found == handle)
        },
    )
}

/// Breadth-first search from the root (included) for the first object `is_it` accepts, over
/// the entries `look_at` accepts by their kind (unknown: `None`), on the root's file system
/// only, visiting at most `limit` directories.
fn walk<L: LowerFs + ?Sized>(
    fs: &L,
    limit: usize,
    look_at: impl Fn(Option<FileKind>) -> bool,
    is_it: impl Fn(&L::Node, FileKind) -> Result<bool>,
) -> Result<L::Node> {
    let (root, _) = fs.lookup(fs.root(), OsStr::new("."))?;
    if is_it(&root, FileKind::Directory)? {
        return Ok(root);
    }
    let root_dev = fs.key(fs.root()).0;
    let mut queue = std::collections::VecDeque::from([root]);
    let mut visited = 0usize;
    while let Some(dir) = queue.pop_front() {
        visited += 1;
        if visited > limit {
            break;
        }
        let stream = fs.opendir(&dir)?;
        let mut names = Vec::new();
        fs.readdir(&stream, 0, &mut |e| {
            if e.name != "." && e.name != ".." && look_at(e.kind) {
                names.push(e.name);
            }
            true
        })?;
        for name in names {
            let Ok((node, attr)) = fs.lookup(&dir, &name) else { continue };
            if fs.key(&node).0 != root_dev {
                continue;
            }
            if is_it(&node, attr.kind())? {
                return Ok(node);
            }
            if attr.kind() == FileKind::Directory {
                queue.push_back(node);
            }
        }
    }
    Err(Errno(libc::ENOENT))
}
