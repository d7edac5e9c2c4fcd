//! Plain data exchanged with a lower file system.

use std::fmt;

/// An errno value from the lower file system (positive), passed up unchanged.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Errno(pub i32);

impl Errno {
    /// The calling thread's last OS error.
    pub fn last() -> Errno {
        Errno(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO))
    }

    pub fn from_io(e: &std::io::Error) -> Errno {
        Errno(e.raw_os_error().unwrap_or(libc::EIO))
    }
}

impl fmt::Debug for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Errno({}: {})", self.0, std::io::Error::from_raw_os_error(self.0))
    }
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", std::io::Error::from_raw_os_error(self.0))
    }
}

impl std::error::Error for Errno {}

/// The type of a lower object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    Regular,
    Directory,
    Symlink,
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
}

impl FileKind {
    pub fn from_mode(mode: u32) -> FileKind {
        match mode & libc::S_IFMT {
            libc::S_IFDIR => FileKind::Directory,
            libc::S_IFLNK => FileKind::Symlink,
            libc::S_IFIFO => FileKind::Fifo,
            libc::S_IFSOCK => FileKind::Socket,
            libc::S_IFCHR => FileKind::CharDevice,
            libc::S_IFBLK => FileKind::BlockDevice,
            _ => FileKind::Regular,
        }
    }

    pub fn from_dtype(d_type: u8) -> Option<FileKind> {
        Some(match d_type {
            libc::DT_REG => FileKind::Regular,
            libc::DT_DIR => FileKind::Directory,
            libc::DT_LNK => FileKind::Symlink,
            libc::DT_FIFO => FileKind::Fifo,
            libc::DT_SOCK => FileKind::Socket,
            libc::DT_CHR => FileKind::CharDevice,
            libc::DT_BLK => FileKind::BlockDevice,
            _ => return None,
        })
    }
}

/// Attributes of a lower object (stat(2)). Times are (seconds, nanoseconds) since the epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attr {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub blocks: u64,
    pub atime: (i64, u32),
    pub mtime: (i64, u32),
    pub ctime: (i64, u32),
    /// Type and permission bits (st_mode).
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u64,
    pub blksize: u32,
}

impl Attr {
    /// A placeholder directory attribute (readdirplus entries that carry no lookup).
    pub fn default_dir() -> Attr {
        Attr {
            dev: 0,
            ino: 0,
            size: 0,
            blocks: 0,
            atime: (0, 0),
            mtime: (0, 0),
            ctime: (0, 0),
            mode: libc::S_IFDIR,
            nlink: 1,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
        }
    }

    pub fn kind(&self) -> FileKind {
        FileKind::from_mode(self.mode)
    }
}

/// One time in a setattr: a value, or "now".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeSet {
    Now,
    At(i64, u32),
}

/// The changes of a setattr; `None` = unchanged.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeSet>,
    pub mtime: Option<TimeSet>,
}

/// One directory entry. `offset` is where to resume after this entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub ino: u64,
    pub offset: u64,
    pub kind: Option<FileKind>,
    pub name: std::ffi::OsString,
}

/// statfs(2) of the lower file system.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatFs {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
    /// The file system id (f_fsid), to recognise the lower file system across mounts.
    pub fsid: u64,
}

/// One physical extent of a file (FIEMAP), in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub logical: u64,
    pub physical: u64,
    pub length: u64,
    /// FIEMAP_EXTENT_* flags (e.g. UNWRITTEN, DELALLOC: no physical block yet).
    pub flags: u32,
}

/// How a lower file system's nodes hold their descriptors (the POSIX implementation bounds
/// them; others report zeros). Serialised as `stat --json`'s `lower_nodes`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct NodeStats {
    /// Node descriptors open now, and the most that may be (past it, nodes release theirs).
    pub fds_held: u64,
    pub fds_limit: u64,
    /// Nodes without a descriptor now (they reopen by file handle when used).
    pub released_now: u64,
    /// Descriptors released and reopened since the start.
    pub releases: u64,
    pub reopens: u64,
    /// Nodes that never release theirs (the root, objects without a name or on another file
    /// system, and all of them when `handles` is false).
    pub pinned: u64,
    /// Whether file handles reopen here (the file system exports them and the daemon has
    /// CAP_DAC_READ_SEARCH): without them no node releases its descriptor.
    pub handles: bool,
}
