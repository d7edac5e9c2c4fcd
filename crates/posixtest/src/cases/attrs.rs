//! Attributes: chmod, chown, timestamps, extended attributes, access, statfs.

use crate::cases::files::nap;
use crate::ctx::Ctx;

pub fn chmod_modes(c: &mut Ctx) {
    c.put("f", b"x");
    c.chmod("f", 0o640);
    c.stat("f");
    c.chmod("f", 0o7777);
    c.stat("f");
    c.chmod("f", 0);
    c.stat("f");
    c.content("f");
    c.mkdir("d", 0o755);
    c.chmod("d", 0o1777);
    c.stat("d");
    c.symlink("f", "l");
    c.chmod("l", 0o604);
    c.stat("f");
    c.lstat("l");
    c.chmod("absent", 0o644);
    if let Some(fd) = c.open("f", "O_RDONLY", 0) {
        c.fchmod(&fd, 0o2755);
        c.fstat(&fd);
    }
    let before = c.times("f");
    nap();
    c.chmod("f", 0o644);
    if let (Some(b), Some(a)) = (before, c.times("f")) {
        c.check("ctime changed by chmod", a.ctime != b.ctime);
        c.check("mtime unchanged by chmod", a.mtime == b.mtime);
    }
}

pub fn chown_as_root(c: &mut Ctx) {
    c.put("f", b"x");
    c.chown("f", 65534, 65534);
    c.stat("f");
    c.chown("f", u32::MAX, 1234);
    c.stat("f");
    c.chown("f", u32::MAX, u32::MAX);
    c.stat("f");
    // chown of an executable clears set-user-ID and set-group-ID, even for root.
    c.chmod("f", 0o6755);
    c.chown("f", 0, 0);
    c.stat("f");
    // Set-group-ID without group execute (mandatory locking marker) survives.
    c.chmod("f", 0o2644);
    c.chown("f", 1, 1);
    c.stat("f");
    c.symlink("f", "l");
    c.lchown("l", 4321, 4321);
    c.lstat("l");
    c.stat("l");
    c.chown("l", 7, 7);
    c.stat("f");
    c.mkdir("d", 0o2755);
    c.chown("d", 5, 5);
    c.stat("d");
}

pub fn utimensat_times(c: &mut Ctx) {
    c.put("f", b"x");
    c.utimens("f", (1000, 500_000_000), (2000, 250_000_000), "0");
    let t = c.times("f");
    if let Some(t) = t {
        c.log("atime, mtime", format!("{:?} {:?}", t.atime, t.mtime));
    }
    // OMIT leaves one time alone; NOW sets the current time.
    c.utimens("f", (0, libc::UTIME_OMIT), (3000, 0), "0");
    if let Some(t) = c.times("f") {
        c.log("atime, mtime", format!("{:?} {:?}", t.atime, t.mtime));
    }
    let before = c.times("f");
    nap();
    c.utimens("f", (0, libc::UTIME_NOW), (0, libc::UTIME_OMIT), "0");
    if let (Some(b), Some(a)) = (before, c.times("f")) {
        c.check("atime is recent", a.atime.0 > 1_600_000_000);
        c.check("mtime kept", a.mtime == (3000, 0));
        c.check("ctime changed", a.ctime != b.ctime);
        c.check("atime <= ctime", a.atime <= a.ctime);
    }
    c.utimens("f", (0, libc::UTIME_OMIT), (0, libc::UTIME_OMIT), "0");
    c.utimens("f", (0, 1_000_000_000), (0, 0), "0");
    // Times before 1970 and after 2038.
    c.utimens("f", (-1000, 0), (4_102_444_800, 7), "0");
    if let Some(t) = c.times("f") {
        c.log("atime, mtime", format!("{:?} {:?}", t.atime, t.mtime));
    }
    c.symlink("f", "l");
    c.utimens("l", (111, 0), (222, 0), "AT_SYMLINK_NOFOLLOW");
    if let (Some(l), Some(f)) = (c.times("l"), c.times("f")) {
        c.log("link atime, mtime", format!("{:?} {:?}", l.atime, l.mtime));
        c.check("target untouched", f.mtime == (4_102_444_800, 7));
    }
    c.utimens("absent", (1, 0), (1, 0), "0");
}

pub fn times_follow_changes(c: &mut Ctx) {
    c.mkdir("d", 0o755);
    let d0 = c.times("d");
    nap();
    c.put("d/f", b"one");
    let (d1, f1) = (c.times("d"), c.times("d/f"));
    if let (Some(d0), Some(d1)) = (d0, d1) {
        c.check("dir mtime changed by create", d1.mtime != d0.mtime);
        c.check("dir ctime changed by create", d1.ctime != d0.ctime);
    }
    nap();
    if let Some(fd) = c.open("d/f", "O_WRONLY|O_APPEND", 0) {
        c.write(&fd, b" two");
    }
    let f2 = c.times("d/f");
    if let (Some(f1), Some(f2)) = (f1, f2) {
        c.check("mtime changed by write", f2.mtime != f1.mtime);
        c.check("ctime changed by write", f2.ctime != f1.ctime);
        c.check("mtime == ctime after write", f2.mtime == f2.ctime);
    }
    nap();
    c.content("d/f");
    if let (Some(f2), Some(f3)) = (f2, c.times("d/f")) {
        // relatime: the first read after a write updates atime.
        c.check("atime >= mtime after read", f3.atime >= f3.mtime);
        c.check("mtime unchanged by read", f3.mtime == f2.mtime);
    }
    let d2 = c.times("d");
    nap();
    c.unlink("d/f");
    if let (Some(d2), Some(d3)) = (d2, c.times("d")) {
        c.check("dir mtime changed by unlink", d3.mtime != d2.mtime);
    }
    c.put("g", b"x");
    c.link("g", "h");
    let g0 = c.times("g");
    nap();
    c.unlink("h");
    if let (Some(g0), Some(g1)) = (g0, c.times("g")) {
        c.check("ctime changed by unlink of another link", g1.ctime != g0.ctime);
    }
}

pub fn xattrs(c: &mut Ctx) {
    c.put("f", b"x");
    c.listxattr("f");
    c.setxattr("f", "user.a", b"1", "0", true);
    c.setxattr("f", "user.b", b"", "0", true);
    c.setxattr("f", "user.big", &crate::sys::pattern(3000, 11), "0", true);
    c.getxattr("f", "user.a", 100);
    c.getxattr("f", "user.b", 100);
    c.getxattr("f", "user.big", 0);
    c.getxattr("f", "user.big", 4096);
    c.getxattr("f", "user.big", 10);
    c.listxattr("f");
    c.setxattr("f", "user.a", b"2", "XATTR_CREATE", true);
    c.setxattr("f", "user.new", b"3", "XATTR_REPLACE", true);
    c.setxattr("f", "user.a", b"22", "XATTR_REPLACE", true);
    c.getxattr("f", "user.a", 100);
    c.getxattr("f", "user.none", 100);
    c.removexattr("f", "user.a");
    c.removexattr("f", "user.a");
    c.getxattr("f", "user.a", 100);
    c.setxattr("f", "unknownns.a", b"1", "0", true);
    c.setxattr("f", "trusted.t", b"root only", "0", true);
    c.getxattr("f", "trusted.t", 100);
    c.listxattr("f");
    c.mkdir("d", 0o755);
    c.setxattr("d", "user.dir", b"on a directory", "0", true);
    c.getxattr("d", "user.dir", 100);
    c.listxattr("d");
    // user.* xattrs are not allowed on symlinks; trusted.* are.
    c.symlink("f", "l");
    c.setxattr("l", "user.l", b"1", "0", false);
    c.setxattr("l", "trusted.l", b"1", "0", false);
    c.listxattr("l");
    c.listxattr("absent");
    // Xattrs follow the inode through rename and link.
    c.link("f", "g");
    c.rename("f", "h", "0");
    c.listxattr("g");
    c.getxattr("h", "user.b", 10);
}

pub fn access_checks(c: &mut Ctx) {
    c.put("f", b"x");
    c.access("f", "F_OK", "0");
    c.access("f", "R_OK|W_OK", "0");
    c.access("f", "X_OK", "0");
    c.chmod("f", 0o100);
    c.access("f", "X_OK", "0");
    c.access("f", "R_OK|W_OK", "AT_EACCESS");
    c.chmod("f", 0);
    c.access("f", "R_OK", "0");
    c.access("absent", "F_OK", "0");
    c.access("f/x", "F_OK", "0");
    c.mkdir("d", 0);
    c.access("d", "X_OK", "0");
    c.access("d", "R_OK|W_OK", "0");
}

pub fn statfs_sanity(c: &mut Ctx) {
    let p = c.path("");
    // SAFETY: an all-zero statfs is a valid value.
    let mut s: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: p is a valid C string and s a valid out pointer.
    let r = crate::sys::check(unsafe { libc::statfs(p.as_ptr(), &raw mut s) });
    if c.rec("statfs", r, |_| String::new()).is_none() {
        return;
    }
    c.check("bsize > 0", s.f_bsize > 0);
    c.check("blocks > 0", s.f_blocks > 0);
    c.check("bfree <= blocks", s.f_bfree <= s.f_blocks);
    c.check("bavail <= bfree", s.f_bavail <= s.f_bfree);
    c.check("files > 0", s.f_files > 0);
    c.check("ffree <= files", s.f_ffree <= s.f_files);
    c.log("namelen", s.f_namelen.to_string());
    let fd = c.open("", "O_RDONLY|O_DIRECTORY", 0);
    if let Some(fd) = fd {
        // SAFETY: as above.
        let mut t: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: fd is open and t a valid out pointer.
        let r = crate::sys::check(unsafe { libc::fstatfs(fd.0, &raw mut t) });
        c.rec("fstatfs", r, |_| String::new());
        c.check("fstatfs bsize == statfs bsize", t.f_bsize == s.f_bsize);
    }
}
