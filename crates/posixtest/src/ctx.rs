//! The case context: every operation a case performs is done here and appended to the case's log
//! as one step, `"what = outcome"`, where the outcome is normalized (errno names, data digests,
//! the comparable stat fields). Two runs of a case on correct file systems produce equal logs.
//!
//! Paths are relative to the case's own directory. An operation returns `Option`: `None` when it
//! failed (the errno is already in the log), so a case can go on or stop as it needs.

use std::ffi::CString;
use std::fmt::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::sys::{self, Errno, Res, check, cstr};

/// An open file descriptor, closed (without logging) when dropped; `Ctx::close` logs the close.
#[derive(Debug)]
pub struct Fd(pub i32);

impl Drop for Fd {
    fn drop(&mut self) {
        if self.0 >= 0 {
            // SAFETY: the descriptor is owned by this value.
            unsafe { libc::close(self.0) };
        }
    }
}

/// The three times of a stat, as (seconds, nanoseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Times {
    pub atime: (i64, i64),
    pub mtime: (i64, i64),
    pub ctime: (i64, i64),
}

#[derive(Debug)]
pub struct Ctx {
    dir: PathBuf,
    /// Prefix of every step (the identity of a forked child).
    who: String,
    pub steps: Vec<String>,
}

impl Ctx {
    pub fn new(dir: &Path) -> Ctx {
        Ctx { dir: dir.to_path_buf(), who: String::new(), steps: Vec::new() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The absolute path of `name` inside the case directory (`""` is the directory itself).
    pub fn path(&self, name: &str) -> CString {
        let p = if name.is_empty() { self.dir.clone() } else { self.dir.join(name) };
        CString::new(p.as_os_str().as_bytes()).expect("no NUL in a path")
    }

    /// Appends one step to the log.
    pub fn log(&mut self, what: impl AsRef<str>, outcome: impl AsRef<str>) {
        let step =
            format!("{}{} = {}", self.who, squeeze(what.as_ref()), squeeze(outcome.as_ref()));
        self.steps.push(step);
    }

    /// Logs a relation or property that must hold the same way on both file systems.
    pub fn check(&mut self, what: &str, holds: bool) {
        self.log(what, if holds { "true" } else { "false" });
    }

    /// Logs `r` (its success shown by `show`) and hands back the value.
    pub fn rec<T>(&mut self, what: &str, r: Res<T>, show: impl FnOnce(&T) -> String) -> Option<T> {
        match r {
            Ok(v) => {
                let s = show(&v);
                self.log(what, if s.is_empty() { "ok".to_string() } else { s });
                Some(v)
            }
            Err(e) => {
                self.log(what, e.name());
                None
            }
        }
    }

    fn rec_unit(&mut self, what: &str, r: Res<i64>) -> bool {
        self.rec(what, r, |_| String::new()).is_some()
    }

    // --- files ---------------------------------------------------------------------------------

    pub fn open(&mut self, name: &str, flags: &str, mode: u32) -> Option<Fd> {
        let p = self.path(name);
        // SAFETY: p is a valid C string.
        let r = check(unsafe { libc::open(p.as_ptr(), sys::open_flags(flags), mode) });
        self.rec(&format!("open({name}, {flags}, {mode:o})"), r, |_| String::new())
            .map(|fd| Fd(fd as i32))
    }

    /// Creates (or truncates) `name` with `content`, mode 0644; logs one step.
    pub fn put(&mut self, name: &str, content: &[u8]) -> bool {
        let p = self.path(name);
        let r = (|| {
            // SAFETY: p is a valid C string.
            let fd = Fd(check(unsafe {
                libc::open(p.as_ptr(), libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC, 0o644)
            })? as i32);
            write_all(fd.0, content, 0)?;
            // SAFETY: fd is open; it is closed here so that close errors are seen.
            let r = check(unsafe { libc::close(fd.0) });
            std::mem::forget(fd);
            r
        })();
        self.rec_unit(&format!("put({name}, {})", sys::data(content)), r)
    }

    /// Reads the whole file `name` and logs its summary.
    pub fn content(&mut self, name: &str) -> Option<Vec<u8>> {
        let p = self.path(name);
        let r = (|| {
            // SAFETY: p is a valid C string.
            let fd =
                Fd(check(unsafe { libc::open(p.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) })?
                    as i32);
            read_all(fd.0)
        })();
        self.rec(&format!("content({name})"), r, |b| sys::data(b))
    }

    pub fn close(&mut self, fd: Fd) -> bool {
        // SAFETY: fd is open and owned; forgetting it prevents a second close.
        let r = check(unsafe { libc::close(fd.0) });
        std::mem::forget(fd);
        self.rec_unit("close", r)
    }

    pub fn write(&mut self, fd: &Fd, data: &[u8]) -> Option<i64> {
        // SAFETY: data is a valid buffer of its length.
        let r = check(unsafe { libc::write(fd.0, data.as_ptr().cast(), data.len()) } as i64);
        self.rec(&format!("write({})", sys::data(data)), r, ToString::to_string)
    }

    pub fn pwrite(&mut self, fd: &Fd, data: &[u8], off: i64) -> Option<i64> {
        // SAFETY: data is a valid buffer of its length.
        let r = check(unsafe { libc::pwrite(fd.0, data.as_ptr().cast(), data.len(), off) } as i64);
        self.rec(&format!("pwrite({}, @{off})", sys::data(data)), r, ToString::to_string)
    }

    pub fn read(&mut self, fd: &Fd, len: usize) -> Option<Vec<u8>> {
        let mut buf = vec![0u8; len];
        // SAFETY: buf is valid for len bytes.
        let r = check(unsafe { libc::read(fd.0, buf.as_mut_ptr().cast(), len) } as i64);
        let r = r.map(|n| {
            buf.truncate(n as usize);
            buf
        });
        self.rec(&format!("read({len})"), r, |b| sys::data(b))
    }

    pub fn pread(&mut self, fd: &Fd, len: usize, off: i64) -> Option<Vec<u8>> {
        let mut buf = vec![0u8; len];
        // SAFETY: buf is valid for len bytes.
        let r = check(unsafe { libc::pread(fd.0, buf.as_mut_ptr().cast(), len, off) } as i64);
        let r = r.map(|n| {
            buf.truncate(n as usize);
            buf
        });
        self.rec(&format!("pread({len}, @{off})"), r, |b| sys::data(b))
    }

    pub fn lseek(&mut self, fd: &Fd, off: i64, whence: &str) -> Option<i64> {
        // SAFETY: plain syscall.
        let r = check(unsafe { libc::lseek(fd.0, off, sys::flags(whence) as i32) });
        self.rec(&format!("lseek({off}, {whence})"), r, ToString::to_string)
    }

    pub fn ftruncate(&mut self, fd: &Fd, len: i64) -> bool {
        // SAFETY: plain syscall.
        let r = check(unsafe { libc::ftruncate(fd.0, len) });
        self.rec_unit(&format!("ftruncate({len})"), r)
    }

    pub fn truncate(&mut self, name: &str, len: i64) -> bool {
        let p = self.path(name);
        // SAFETY: p is a valid C string.
        let r = check(unsafe { libc::truncate(p.as_ptr(), len) });
        self.rec_unit(&format!("truncate({name}, {len})"), r)
    }

    pub fn fsync(&mut self, fd: &Fd) -> bool {
        // SAFETY: plain syscall.
        let r = check(unsafe { libc::fsync(fd.0) });
        self.rec_unit("fsync", r)
    }

    pub fn fdatasync(&mut self, fd: &Fd) -> bool {
        // SAFETY: plain syscall.
        let r = check(unsafe { libc::fdatasync(fd.0) });
        self.rec_unit("fdatasync", r)
    }

    pub fn fallocate(&mut self, fd: &Fd, mode: &str, off: i64, len: i64) -> bool {
        // SAFETY: plain syscall.
        let r = check(unsafe { libc::fallocate(fd.0, sys::flags(mode) as i32, off, len) });
        self.rec_unit(&format!("fallocate({mode}, @{off}, {len})"), r)
    }

    pub fn copy_file_range(
        &mut self,
        from: &Fd,
        off_in: i64,
        to: &Fd,
        off_out: i64,
        len: usize,
    ) -> Option<i64> {
        let (mut i, mut o) = (off_in, off_out);
        // SAFETY: the offsets are valid pointers to i64 for the call.
        let r =
            check(unsafe { libc::copy_file_range(from.0, &raw mut i, to.0, &raw mut o, len, 0) }
                as i64);
        self.rec(
            &format!("copy_file_range(@{off_in} -> @{off_out}, {len})"),
            r,
            ToString::to_string,
        )
    }

    pub fn flock(&mut self, fd: &Fd, op: &str) -> bool {
        // SAFETY: plain syscall.
        let r = check(unsafe { libc::flock(fd.0, sys::flags(op) as i32) });
        self.rec_unit(&format!("flock({op})"), r)
    }

    // --- attributes ----------------------------------------------------------------------------

    pub fn stat(&mut self, name: &str) -> Option<libc::stat> {
        let r = self.raw_stat(name, true);
        self.rec(&format!("stat({name})"), r, sys::stat_fields)
    }

    pub fn lstat(&mut self, name: &str) -> Option<libc::stat> {
        let r = self.raw_stat(name, false);
        self.rec(&format!("lstat({name})"), r, sys::stat_fields)
    }

    pub fn fstat(&mut self, fd: &Fd) -> Option<libc::stat> {
        let r = fstat_raw(fd.0);
        self.rec("fstat", r, sys::stat_fields)
    }

    /// stat without logging (for times and for values a case compares itself).
    pub fn raw_stat(&self, name: &str, follow: bool) -> Res<libc::stat> {
        let p = self.path(name);
        // SAFETY: an all-zero stat is a valid value; stat/lstat fill it.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: p is a valid C string and st a valid out pointer.
        let r = unsafe {
            if follow {
                libc::stat(p.as_ptr(), &raw mut st)
            } else {
                libc::lstat(p.as_ptr(), &raw mut st)
            }
        };
        check(r).map(|_| st)
    }

    /// The times of `name` (lstat), not logged; `None` (logged) if the stat fails.
    pub fn times(&mut self, name: &str) -> Option<Times> {
        match self.raw_stat(name, false) {
            Ok(st) => Some(times_of(&st)),
            Err(e) => {
                self.log(format!("times({name})"), e.name());
                None
            }
        }
    }

    pub fn chmod(&mut self, name: &str, mode: u32) -> bool {
        let p = self.path(name);
        // SAFETY: p is a valid C string.
        let r = check(unsafe { libc::chmod(p.as_ptr(), mode) });
        self.rec_unit(&format!("chmod({name}, {mode:o})"), r)
    }

    pub fn fchmod(&mut self, fd: &Fd, mode: u32) -> bool {
        // SAFETY: plain syscall.
        let r = check(unsafe { libc::fchmod(fd.0, mode) });
        self.rec_unit(&format!("fchmod({mode:o})"), r)
    }

    pub fn chown(&mut self, name: &str, uid: u32, gid: u32) -> bool {
        let p = self.path(name);
        // SAFETY: p is a valid C string.
        let r = check(unsafe { libc::chown(p.as_ptr(), uid, gid) });
        self.rec_unit(&format!("chown({name}, {}, {})", uid as i32, gid as i32), r)
    }

    pub fn lchown(&mut self, name: &str, uid: u32, gid: u32) -> bool {
        let p = self.path(name);
        // SAFETY: p is a valid C string.
        let r = check(unsafe { libc::lchown(p.as_ptr(), uid, gid) });
        self.rec_unit(&format!("lchown({name}, {}, {})", uid as i32, gid as i32), r)
    }

    /// utimensat with (sec, nsec) pairs; nsec may be UTIME_NOW or UTIME_OMIT.
    pub fn utimens(
        &mut self,
        name: &str,
        atime: (i64, i64),
        mtime: (i64, i64),
        flags: &str,
    ) -> bool {
        let p = self.path(name);
        let ts = [
            libc::timespec { tv_sec: atime.0, tv_nsec: atime.1 },
            libc::timespec { tv_sec: mtime.0, tv_nsec: mtime.1 },
        ];
        // SAFETY: p is a valid C string, ts two timespecs.
        let r = check(unsafe {
            libc::utimensat(libc::AT_FDCWD, p.as_ptr(), ts.as_ptr(), sys::flags(flags) as i32)
        });
        let show = |t: (i64, i64)| match t.1 {
            libc::UTIME_NOW => "NOW".to_string(),
            libc::UTIME_OMIT => "OMIT".to_string(),
            n => format!("{}.{n:09}", t.0),
        };
        self.rec_unit(&format!("utimensat({name}, {}, {}, {flags})", show(atime), show(mtime)), r)
    }

    pub fn access(&mut self, name: &str, mode: &str, flags: &str) -> bool {
        let p = self.path(name);
        // SAFETY: p is a valid C string.
        let r = check(unsafe {
            libc::faccessat(
                libc::AT_FDCWD,
                p.as_ptr(),
                sys::flags(mode) as i32,
                sys::flags(flags) as i32,
            )
        });
        self.rec_unit(&format!("faccessat({name}, {mode}, {flags})"), r)
    }

    // --- xattrs --------------------------------------------------------------------------------

    pub fn setxattr(
        &mut self,
        name: &str,
        key: &str,
        value: &[u8],
        flags: &str,
        follow: bool,
    ) -> bool {
        let (p, k) = (self.path(name), cstr(key));
        // SAFETY: valid C strings and buffer.
        let r = check(unsafe {
            if follow {
                libc::setxattr(
                    p.as_ptr(),
                    k.as_ptr(),
                    value.as_ptr().cast(),
                    value.len(),
                    sys::flags(flags) as i32,
                )
            } else {
                libc::lsetxattr(
                    p.as_ptr(),
                    k.as_ptr(),
                    value.as_ptr().cast(),
                    value.len(),
                    sys::flags(flags) as i32,
                )
            }
        });
        let call = if follow { "setxattr" } else { "lsetxattr" };
        self.rec_unit(&format!("{call}({name}, {key}, {}, {flags})", sys::data(value)), r)
    }

    /// getxattr with a buffer of `size` bytes (0 = ask for the size).
    pub fn getxattr(&mut self, name: &str, key: &str, size: usize) -> Option<Vec<u8>> {
        let (p, k) = (self.path(name), cstr(key));
        let mut buf = vec![0u8; size];
        // SAFETY: valid C strings; buf valid for size bytes (null when 0).
        let r = check(unsafe {
            let ptr = if size == 0 { std::ptr::null_mut() } else { buf.as_mut_ptr().cast() };
            libc::lgetxattr(p.as_ptr(), k.as_ptr(), ptr, size)
        } as i64);
        if size == 0 {
            return self
                .rec(&format!("lgetxattr({name}, {key}, size?)"), r, ToString::to_string)
                .map(|_| Vec::new());
        }
        let r = r.map(|n| {
            buf.truncate(n as usize);
            buf
        });
        self.rec(&format!("lgetxattr({name}, {key}, {size})"), r, |b| sys::data(b))
    }

    /// The sorted list of xattr names (the order of listxattr is unspecified).
    pub fn listxattr(&mut self, name: &str) -> Option<Vec<String>> {
        let p = self.path(name);
        let mut buf = vec![0u8; 65536];
        // SAFETY: valid C string and buffer.
        let r = check(
            unsafe { libc::llistxattr(p.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) } as i64
        );
        let r = r.map(|n| {
            let mut names: Vec<String> = buf[..n as usize]
                .split(|b| *b == 0)
                .filter(|s| !s.is_empty())
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect();
            names.sort();
            names
        });
        self.rec(&format!("llistxattr({name})"), r, |v| format!("[{}]", v.join(",")))
    }

    pub fn removexattr(&mut self, name: &str, key: &str) -> bool {
        let (p, k) = (self.path(name), cstr(key));
        // SAFETY: valid C strings.
        let r = check(unsafe { libc::lremovexattr(p.as_ptr(), k.as_ptr()) });
        self.rec_unit(&format!("lremovexattr({name}, {key})"), r)
    }

    // --- names ---------------------------------------------------------------------------------

    pub fn mkdir(&mut self, name: &str, mode: u32) -> bool {
        let p = self.path(name);
        // SAFETY: p is a valid C string.
        let r = check(unsafe { libc::mkdir(p.as_ptr(), mode) });
        self.rec_unit(&format!("mkdir({name}, {mode:o})"), r)
    }

    pub fn rmdir(&mut self, name: &str) -> bool {
        let p = self.path(name);
        // SAFETY: p is a valid C string.
        let r = check(unsafe { libc::rmdir(p.as_ptr()) });
        self.rec_unit(&format!("rmdir({name})"), r)
    }

    pub fn unlink(&mut self, name: &str) -> bool {
        let p = self.path(name);
        // SAFETY: p is a valid C string.
        let r = check(unsafe { libc::unlink(p.as_ptr()) });
        self.rec_unit(&format!("unlink({name})"), r)
    }

    pub fn rename(&mut self, from: &str, to: &str, flags: &str) -> bool {
        let (a, b) = (self.path(from), self.path(to));
        // SAFETY: valid C strings.
        let r = check(unsafe {
            libc::renameat2(
                libc::AT_FDCWD,
                a.as_ptr(),
                libc::AT_FDCWD,
                b.as_ptr(),
                sys::flags(flags) as u32,
            )
        });
        self.rec_unit(&format!("rename({from}, {to}, {flags})"), r)
    }

    pub fn link(&mut self, from: &str, to: &str) -> bool {
        let (a, b) = (self.path(from), self.path(to));
        // SAFETY: valid C strings.
        let r = check(unsafe { libc::link(a.as_ptr(), b.as_ptr()) });
        self.rec_unit(&format!("link({from}, {to})"), r)
    }

    /// symlink(target, name): the target is stored verbatim (not made absolute).
    pub fn symlink(&mut self, target: &str, name: &str) -> bool {
        let (t, p) = (cstr(target), self.path(name));
        // SAFETY: valid C strings.
        let r = check(unsafe { libc::symlink(t.as_ptr(), p.as_ptr()) });
        self.rec_unit(&format!("symlink({target}, {name})"), r)
    }

    pub fn readlink(&mut self, name: &str) -> Option<String> {
        let p = self.path(name);
        let mut buf = vec![0u8; 4096];
        // SAFETY: valid C string and buffer.
        let r =
            check(unsafe { libc::readlink(p.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) } as i64);
        let r = r.map(|n| String::from_utf8_lossy(&buf[..n as usize]).into_owned());
        self.rec(&format!("readlink({name})"), r, |s| format!("\"{s}\""))
    }

    pub fn mknod(&mut self, name: &str, mode: u32, major: u32, minor: u32) -> bool {
        let p = self.path(name);
        // SAFETY: p is a valid C string.
        let r = check(unsafe { libc::mknod(p.as_ptr(), mode, libc::makedev(major, minor)) });
        self.rec_unit(&format!("mknod({name}, {mode:o}, {major}:{minor})"), r)
    }

    /// The entries of directory `name` (without . and ..), sorted, with their d_type, as read by
    /// opendir/readdir. `.` and `..` are checked to be present.
    pub fn readdir(&mut self, name: &str) -> Option<Vec<(String, &'static str)>> {
        let r = list_dir(&self.path(name));
        self.rec(&format!("readdir({name})"), r, |v| {
            if v.len() <= 12 {
                let items: Vec<String> = v.iter().map(|(n, t)| format!("{n}:{t}")).collect();
                format!("[{}]", items.join(" "))
            } else {
                let all = v.iter().fold(String::new(), |acc, (n, t)| acc + n + ":" + t + "\n");
                format!(
                    "{} entries xxh3={:016x}",
                    v.len(),
                    xxhash_rust::xxh3::xxh3_64(all.as_bytes())
                )
            }
        })
    }

    // --- identities ----------------------------------------------------------------------------

    /// Runs `f` in a forked child that has dropped to `uid`/`gid` with supplementary `groups`;
    /// its steps are appended to this log, prefixed with the identity. A child that dies is
    /// logged as such (it is a result like any other).
    pub fn as_user(&mut self, uid: u32, gid: u32, groups: &[u32], f: impl FnOnce(&mut Ctx)) {
        let mut fds = [0i32; 2];
        // SAFETY: fds is a valid array of two ints.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0, "pipe2");
        // SAFETY: the runner is single-threaded, so the child may allocate and run Rust code.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", Errno::last().name());
        if pid == 0 {
            // SAFETY: plain syscalls in the child; it leaves with _exit.
            unsafe {
                libc::close(fds[0]);
                let ok = libc::setgroups(groups.len(), groups.as_ptr()) == 0
                    && libc::setgid(gid) == 0
                    && libc::setuid(uid) == 0;
                if !ok {
                    libc::_exit(3);
                }
            }
            let mut child =
                Ctx { dir: self.dir.clone(), who: format!("[{uid}:{gid}] "), steps: Vec::new() };
            f(&mut child);
            let out = serde_json::to_vec(&child.steps).expect("steps to json");
            let _ = write_all(fds[1], &out, -1);
            // SAFETY: leaves the child without running the parent's destructors.
            unsafe { libc::_exit(0) };
        }
        // SAFETY: the write end belongs to the child now.
        unsafe { libc::close(fds[1]) };
        let out = read_all(fds[0]).unwrap_or_default();
        // SAFETY: the read end is ours.
        unsafe { libc::close(fds[0]) };
        let mut status = 0;
        // SAFETY: pid is our child.
        unsafe { libc::waitpid(pid, &raw mut status, 0) };
        match serde_json::from_slice::<Vec<String>>(&out) {
            Ok(steps) if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 => {
                self.steps.extend(steps);
            }
            _ => {
                self.log(format!("[{uid}:{gid}] child"), format!("died (wait status {status:#x})"));
            }
        }
    }
}

/// Writes a run of more than 12 equal characters as `c*N`, so that long names stay readable.
fn squeeze(s: &str) -> String {
    let chars: Vec<char> = s.chars().collect();
    let mut out = String::new();
    let mut i = 0;
    while i < chars.len() {
        let run = chars[i..].iter().take_while(|c| **c == chars[i]).count();
        if run > 12 {
            let _ = write!(out, "{}*{run}", chars[i]);
        } else {
            out.extend(std::iter::repeat_n(chars[i], run));
        }
        i += run;
    }
    out
}

pub fn times_of(st: &libc::stat) -> Times {
    Times {
        atime: (st.st_atime, st.st_atime_nsec),
        mtime: (st.st_mtime, st.st_mtime_nsec),
        ctime: (st.st_ctime, st.st_ctime_nsec),
    }
}

pub fn fstat_raw(fd: i32) -> Res<libc::stat> {
    // SAFETY: an all-zero stat is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: st is a valid out pointer.
    check(unsafe { libc::fstat(fd, &raw mut st) }).map(|_| st)
}

/// Writes all of `data` at `off` (or at the file position when `off` is negative).
pub fn write_all(fd: i32, mut data: &[u8], mut off: i64) -> Res<i64> {
    while !data.is_empty() {
        // SAFETY: data is a valid buffer of its length.
        let n = check(unsafe {
            if off < 0 {
                libc::write(fd, data.as_ptr().cast(), data.len())
            } else {
                libc::pwrite(fd, data.as_ptr().cast(), data.len(), off)
            }
        } as i64)?;
        if n == 0 {
            return Err(Errno(libc::EIO));
        }
        data = &data[n as usize..];
        if off >= 0 {
            off += n;
        }
    }
    Ok(0)
}

pub fn read_all(fd: i32) -> Res<Vec<u8>> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 65536];
    loop {
        // SAFETY: buf is valid for its length.
        let n = check(unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) } as i64)?;
        if n == 0 {
            return Ok(out);
        }
        out.extend_from_slice(&buf[..n as usize]);
    }
}

/// Lists a directory with opendir/readdir: sorted entries without `.` and `..`; fails with
/// EIO-as-data (`E#5`) if `.` or `..` is missing, since every directory has both.
pub fn list_dir(path: &CString) -> Res<Vec<(String, &'static str)>> {
    // SAFETY: path is a valid C string.
    let d = unsafe { libc::opendir(path.as_ptr()) };
    if d.is_null() {
        return Err(Errno::last());
    }
    let mut out = Vec::new();
    let mut dots = 0;
    loop {
        // SAFETY: d is an open DIR stream.
        let e = unsafe { libc::readdir(d) };
        if e.is_null() {
            break;
        }
        // SAFETY: readdir returned a valid entry whose name is NUL-terminated.
        let (name, t) = unsafe { (std::ffi::CStr::from_ptr((*e).d_name.as_ptr()), (*e).d_type) };
        let name = name.to_string_lossy().into_owned();
        if name == "." || name == ".." {
            dots += 1;
            continue;
        }
        out.push((name, sys::d_type(t)));
    }
    // SAFETY: d is open.
    unsafe { libc::closedir(d) };
    if dots != 2 {
        return Err(Errno(libc::EIO));
    }
    out.sort();
    Ok(out)
}
