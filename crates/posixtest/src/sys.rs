//! Thin syscall helpers: errno values with their names, flag tables both ways, and the
//! normalization of `struct stat` into the fields that must agree between two file systems.

use std::ffi::CString;
use std::fmt::Write;

/// An errno value. A case's errno is data (it is printed by name), never a runner failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Errno(pub i32);

pub type Res<T> = Result<T, Errno>;

impl Errno {
    pub fn last() -> Errno {
        Errno(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    }

    /// The symbolic name (`ENOENT`); EAGAIN and EWOULDBLOCK, ENOTSUP and EOPNOTSUPP are one value
    /// on Linux and print as the first.
    pub fn name(self) -> String {
        let name = match self.0 {
            libc::EPERM => "EPERM",
            libc::ENOENT => "ENOENT",
            libc::EIO => "EIO",
            libc::ENXIO => "ENXIO",
            libc::E2BIG => "E2BIG",
            libc::EBADF => "EBADF",
            libc::EAGAIN => "EAGAIN",
            libc::ENOMEM => "ENOMEM",
            libc::EACCES => "EACCES",
            libc::EFAULT => "EFAULT",
            libc::EBUSY => "EBUSY",
            libc::EEXIST => "EEXIST",
            libc::EXDEV => "EXDEV",
            libc::ENODEV => "ENODEV",
            libc::ENOTDIR => "ENOTDIR",
            libc::EISDIR => "EISDIR",
            libc::EINVAL => "EINVAL",
            libc::ENFILE => "ENFILE",
            libc::EMFILE => "EMFILE",
            libc::ETXTBSY => "ETXTBSY",
            libc::EFBIG => "EFBIG",
            libc::ENOSPC => "ENOSPC",
            libc::ESPIPE => "ESPIPE",
            libc::EROFS => "EROFS",
            libc::EMLINK => "EMLINK",
            libc::ERANGE => "ERANGE",
            libc::ENAMETOOLONG => "ENAMETOOLONG",
            libc::ENOSYS => "ENOSYS",
            libc::ENOTEMPTY => "ENOTEMPTY",
            libc::ELOOP => "ELOOP",
            libc::ENODATA => "ENODATA",
            libc::EOVERFLOW => "EOVERFLOW",
            libc::EOPNOTSUPP => "EOPNOTSUPP",
            libc::ESTALE => "ESTALE",
            libc::EDQUOT => "EDQUOT",
            libc::ENOTTY => "ENOTTY",
            _ => return format!("E#{}", self.0),
        };
        name.to_string()
    }
}

/// Converts a libc return value (`-1` = failure with errno) into a `Res`.
pub fn check<T: Into<i64>>(r: T) -> Res<i64> {
    let r = r.into();
    if r == -1 { Err(Errno::last()) } else { Ok(r) }
}

pub fn cstr(s: &str) -> CString {
    CString::new(s).expect("no NUL in a case's string")
}

const OPEN_FLAGS: &[(&str, i32)] = &[
    ("O_RDONLY", libc::O_RDONLY),
    ("O_WRONLY", libc::O_WRONLY),
    ("O_RDWR", libc::O_RDWR),
    ("O_CREAT", libc::O_CREAT),
    ("O_EXCL", libc::O_EXCL),
    ("O_TRUNC", libc::O_TRUNC),
    ("O_APPEND", libc::O_APPEND),
    ("O_DIRECTORY", libc::O_DIRECTORY),
    ("O_NOFOLLOW", libc::O_NOFOLLOW),
    ("O_PATH", libc::O_PATH),
    ("O_NONBLOCK", libc::O_NONBLOCK),
    ("O_DIRECT", libc::O_DIRECT),
    ("O_TMPFILE", libc::O_TMPFILE),
    ("O_SYNC", libc::O_SYNC),
    ("O_NOATIME", libc::O_NOATIME),
];

/// `"O_RDWR|O_CREAT"` -> bits. A name not in the table is a bug in the table of cases.
pub fn open_flags(spec: &str) -> i32 {
    spec.split('|')
        .map(|f| {
            OPEN_FLAGS.iter().find(|(n, _)| *n == f).unwrap_or_else(|| panic!("unknown flag {f}")).1
        })
        .fold(libc::O_CLOEXEC, |a, b| a | b)
}

const NAMED_FLAGS: &[(&str, i64)] = &[
    ("0", 0),
    ("RENAME_NOREPLACE", libc::RENAME_NOREPLACE as i64),
    ("RENAME_EXCHANGE", libc::RENAME_EXCHANGE as i64),
    ("FALLOC_FL_KEEP_SIZE", libc::FALLOC_FL_KEEP_SIZE as i64),
    ("FALLOC_FL_PUNCH_HOLE", libc::FALLOC_FL_PUNCH_HOLE as i64),
    ("FALLOC_FL_ZERO_RANGE", libc::FALLOC_FL_ZERO_RANGE as i64),
    ("XATTR_CREATE", libc::XATTR_CREATE as i64),
    ("XATTR_REPLACE", libc::XATTR_REPLACE as i64),
    ("AT_SYMLINK_NOFOLLOW", libc::AT_SYMLINK_NOFOLLOW as i64),
    ("AT_EACCESS", libc::AT_EACCESS as i64),
    ("F_OK", libc::F_OK as i64),
    ("R_OK", libc::R_OK as i64),
    ("W_OK", libc::W_OK as i64),
    ("X_OK", libc::X_OK as i64),
    ("SEEK_SET", libc::SEEK_SET as i64),
    ("SEEK_CUR", libc::SEEK_CUR as i64),
    ("SEEK_END", libc::SEEK_END as i64),
    ("SEEK_DATA", libc::SEEK_DATA as i64),
    ("SEEK_HOLE", libc::SEEK_HOLE as i64),
    ("LOCK_EX", libc::LOCK_EX as i64),
    ("LOCK_SH", libc::LOCK_SH as i64),
    ("LOCK_NB", libc::LOCK_NB as i64),
    ("LOCK_UN", libc::LOCK_UN as i64),
];

/// `"FALLOC_FL_PUNCH_HOLE|FALLOC_FL_KEEP_SIZE"` -> bits, for every other flag family.
pub fn flags(spec: &str) -> i64 {
    spec.split('|')
        .map(|f| {
            NAMED_FLAGS
                .iter()
                .find(|(n, _)| *n == f)
                .unwrap_or_else(|| panic!("unknown flag {f}"))
                .1
        })
        .fold(0, |a, b| a | b)
}

pub fn file_type(mode: u32) -> &'static str {
    match mode & libc::S_IFMT {
        libc::S_IFREG => "reg",
        libc::S_IFDIR => "dir",
        libc::S_IFLNK => "lnk",
        libc::S_IFIFO => "fifo",
        libc::S_IFCHR => "chr",
        libc::S_IFBLK => "blk",
        libc::S_IFSOCK => "sock",
        _ => "?",
    }
}

pub fn d_type(t: u8) -> &'static str {
    match t {
        libc::DT_REG => "reg",
        libc::DT_DIR => "dir",
        libc::DT_LNK => "lnk",
        libc::DT_FIFO => "fifo",
        libc::DT_CHR => "chr",
        libc::DT_BLK => "blk",
        libc::DT_SOCK => "sock",
        _ => "unknown",
    }
}

/// The fields of a stat that two correct file systems over the same operations agree on: type,
/// permission bits, nlink, size, owner, whether any block is allocated, and the device number of
/// device nodes. Never inode numbers, st_dev, exact block counts or absolute times.
pub fn stat_fields(st: &libc::stat) -> String {
    let mut s = format!(
        "{} {:04o} nlink={} size={} uid={} gid={} alloc={}",
        file_type(st.st_mode),
        st.st_mode & 0o7777,
        st.st_nlink,
        st.st_size,
        st.st_uid,
        st.st_gid,
        if st.st_blocks > 0 { "yes" } else { "no" },
    );
    if matches!(st.st_mode & libc::S_IFMT, libc::S_IFCHR | libc::S_IFBLK) {
        let _ = write!(s, " rdev={}:{}", libc::major(st.st_rdev), libc::minor(st.st_rdev));
    }
    s
}

/// A data summary for the log: short printable data verbatim, otherwise length and digest.
pub fn data(b: &[u8]) -> String {
    if b.is_empty() {
        "0 bytes".to_string()
    } else if b.len() <= 40 && b.iter().all(|c| c.is_ascii_graphic() || *c == b' ') {
        format!("{} \"{}\"", b.len(), String::from_utf8_lossy(b))
    } else if b.iter().all(|c| *c == 0) {
        format!("{} zero bytes", b.len())
    } else {
        format!("{} bytes xxh3={:016x}", b.len(), xxhash_rust::xxh3::xxh3_64(b))
    }
}

/// Deterministic non-trivial content: `len` bytes of a pattern seeded by `seed`.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ ((i >> 8) as u8)).collect()
}
