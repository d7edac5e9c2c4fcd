//! Directory listing: names and types, a large directory, changes during a listing.

use crate::ctx::Ctx;
use crate::sys::{Errno, d_type};

pub fn readdir_names_and_types(c: &mut Ctx) {
    c.readdir("");
    c.put("reg", b"x");
    c.mkdir("dir", 0o755);
    c.symlink("reg", "lnk");
    c.mknod("fifo", libc::S_IFIFO | 0o644, 0, 0);
    c.mknod("chr", libc::S_IFCHR | 0o600, 1, 3);
    c.put("with space", b"");
    c.put("ünïcödé", b"");
    c.put(".hidden", b"");
    c.readdir("");
    c.readdir("dir");
    c.readdir("reg");
    c.readdir("absent");
}

pub fn readdir_1000_entries(c: &mut Ctx) {
    c.mkdir("big", 0o755);
    let mut made = 0;
    for i in 0..1000 {
        let p = c.path(&format!("big/entry-{i:04}-{}", "x".repeat(i % 40)));
        // SAFETY: p is a valid C string.
        let fd = unsafe {
            libc::open(p.as_ptr(), libc::O_WRONLY | libc::O_CREAT | libc::O_CLOEXEC, 0o644)
        };
        if fd >= 0 {
            made += 1;
            // SAFETY: fd was just opened.
            unsafe { libc::close(fd) };
        }
    }
    c.log("created", made.to_string());
    c.readdir("big");
    c.stat("big");
    // Remove every other entry and list again.
    let mut removed = 0;
    for i in (0..1000).step_by(2) {
        let p = c.path(&format!("big/entry-{i:04}-{}", "x".repeat(i % 40)));
        // SAFETY: p is a valid C string.
        if unsafe { libc::unlink(p.as_ptr()) } == 0 {
            removed += 1;
        }
    }
    c.log("removed", removed.to_string());
    c.readdir("big");
}

/// `rm -r` reads a directory while it unlinks what it has read; every entry must be seen
/// exactly once and the directory must end up empty. Also: entries unlinked ahead of the
/// listing position, and a listing that is rewound after a create.
pub fn readdir_while_unlinking(c: &mut Ctx) {
    c.mkdir("d", 0o755);
    let n = 300;
    for i in 0..n {
        let p = c.path(&format!("d/f{i:03}"));
        // SAFETY: p is a valid C string.
        let fd = unsafe {
            libc::open(p.as_ptr(), libc::O_WRONLY | libc::O_CREAT | libc::O_CLOEXEC, 0o644)
        };
        assert!(fd >= 0, "create in readdir_while_unlinking: {}", Errno::last().name());
        // SAFETY: fd was just opened.
        unsafe { libc::close(fd) };
    }
    let dir = c.path("d");
    // SAFETY: dir is a valid C string.
    let d = unsafe { libc::opendir(dir.as_ptr()) };
    if d.is_null() {
        c.log("opendir(d)", Errno::last().name());
        return;
    }
    let mut seen = std::collections::BTreeMap::<String, usize>::new();
    let mut unlink_errors = 0;
    loop {
        // SAFETY: d is an open DIR stream.
        let e = unsafe { libc::readdir(d) };
        if e.is_null() {
            break;
        }
        // SAFETY: a valid entry with a NUL-terminated name.
        let (name, t) = unsafe {
            (
                std::ffi::CStr::from_ptr((*e).d_name.as_ptr()).to_string_lossy().into_owned(),
                (*e).d_type,
            )
        };
        if name == "." || name == ".." {
            continue;
        }
        *seen.entry(name.clone()).or_default() += 1;
        if d_type(t) != "reg" {
            unlink_errors += 1000;
        }
        let p = c.path(&format!("d/{name}"));
        // SAFETY: p is a valid C string.
        if unsafe { libc::unlink(p.as_ptr()) } != 0 {
            unlink_errors += 1;
        }
    }
    // SAFETY: d is open.
    unsafe { libc::closedir(d) };
    c.log("distinct names seen", seen.len().to_string());
    c.log("names seen twice", seen.values().filter(|v| **v > 1).count().to_string());
    c.log("unlink errors (1000 per wrong d_type)", unlink_errors.to_string());
    c.readdir("d");
    c.rmdir("d");

    // Rewind picks up entries created after the listing started.
    c.mkdir("r", 0o755);
    c.put("r/first", b"");
    // SAFETY: the path is a valid C string.
    let d = unsafe { libc::opendir(c.path("r").as_ptr()) };
    if d.is_null() {
        return;
    }
    let count = |d: *mut libc::DIR| {
        let mut n = 0;
        // SAFETY: d is an open DIR stream.
        while !unsafe { libc::readdir(d) }.is_null() {
            n += 1;
        }
        n
    };
    c.log("entries (with . and ..)", count(d).to_string());
    c.put("r/second", b"");
    // SAFETY: d is open.
    unsafe { libc::rewinddir(d) };
    c.log("entries after create and rewinddir", count(d).to_string());
    // SAFETY: d is open.
    unsafe { libc::closedir(d) };
}

/// telldir/seekdir: positions stay valid, and a listing resumed at a saved position yields the
/// same remainder.
pub fn readdir_seek(c: &mut Ctx) {
    c.mkdir("d", 0o755);
    for i in 0..50 {
        c.path(&format!("d/e{i:02}"));
        let p = c.path(&format!("d/e{i:02}"));
        // SAFETY: p is a valid C string.
        let fd = unsafe {
            libc::open(p.as_ptr(), libc::O_WRONLY | libc::O_CREAT | libc::O_CLOEXEC, 0o644)
        };
        if fd >= 0 {
            // SAFETY: fd was just opened.
            unsafe { libc::close(fd) };
        }
    }
    // SAFETY: the path is a valid C string.
    let d = unsafe { libc::opendir(c.path("d").as_ptr()) };
    if d.is_null() {
        c.log("opendir(d)", Errno::last().name());
        return;
    }
    let next = |d: *mut libc::DIR| -> Option<String> {
        // SAFETY: d is an open DIR stream.
        let e = unsafe { libc::readdir(d) };
        // SAFETY: a valid entry with a NUL-terminated name.
        (!e.is_null()).then(|| {
            unsafe { std::ffi::CStr::from_ptr((*e).d_name.as_ptr()) }.to_string_lossy().into_owned()
        })
    };
    for _ in 0..20 {
        next(d);
    }
    // SAFETY: d is open.
    let pos = unsafe { libc::telldir(d) };
    let mut rest1 = Vec::new();
    while let Some(n) = next(d) {
        rest1.push(n);
    }
    // SAFETY: d is open and pos came from telldir on it.
    unsafe { libc::seekdir(d, pos) };
    let mut rest2 = Vec::new();
    while let Some(n) = next(d) {
        rest2.push(n);
    }
    // SAFETY: d is open.
    unsafe { libc::closedir(d) };
    c.log("entries after the saved position", rest1.len().to_string());
    c.check("seekdir resumes with the same entries", rest1 == rest2);
}
