//! Open flags, read/write at offsets, seeking, truncation, unlinked-but-open files, mmap, sync.

use crate::ctx::{Ctx, fstat_raw};
use crate::sys::pattern;

pub fn open_creat_excl_existing(c: &mut Ctx) {
    c.put("f", b"data");
    c.open("f", "O_WRONLY|O_CREAT|O_EXCL", 0o644);
    c.open("new", "O_WRONLY|O_CREAT|O_EXCL", 0o644);
    c.stat("new");
    c.symlink("missing", "dangling");
    // O_EXCL does not follow a final symlink, even a dangling one.
    c.open("dangling", "O_WRONLY|O_CREAT|O_EXCL", 0o644);
    c.lstat("missing");
    // Without O_EXCL, O_CREAT follows the dangling link and creates its target.
    c.open("dangling", "O_WRONLY|O_CREAT", 0o600);
    c.stat("missing");
}

pub fn open_trunc(c: &mut Ctx) {
    c.put("f", b"hello world");
    let before = c.times("f");
    nap();
    if let Some(fd) = c.open("f", "O_WRONLY|O_TRUNC", 0) {
        c.fstat(&fd);
    }
    let after = c.times("f");
    if let (Some(b), Some(a)) = (before, after) {
        c.check("mtime changed by O_TRUNC", a.mtime != b.mtime);
        c.check("ctime changed by O_TRUNC", a.ctime != b.ctime);
    }
    // O_TRUNC on an empty file, and O_RDONLY|O_TRUNC (unspecified by POSIX; Linux truncates).
    c.put("g", b"abc");
    c.open("g", "O_RDONLY|O_TRUNC", 0);
    c.stat("g");
}

pub fn open_append_pwrite(c: &mut Ctx) {
    c.put("f", b"hello");
    let Some(fd) = c.open("f", "O_RDWR|O_APPEND", 0) else { return };
    c.write(&fd, b" world");
    // On Linux pwrite on an O_APPEND descriptor appends, whatever the offset.
    c.pwrite(&fd, b"!", 0);
    c.lseek(&fd, 0, "SEEK_CUR");
    c.lseek(&fd, 0, "SEEK_SET");
    c.write(&fd, b"?");
    c.pread(&fd, 100, 0);
    c.fstat(&fd);
}

pub fn open_directory_and_nofollow(c: &mut Ctx) {
    c.put("f", b"x");
    c.mkdir("d", 0o755);
    c.symlink("f", "l");
    c.symlink("d", "ld");
    c.open("f", "O_RDONLY|O_DIRECTORY", 0);
    c.open("d", "O_RDONLY|O_DIRECTORY", 0);
    c.open("d", "O_WRONLY", 0);
    c.open("d", "O_RDWR", 0);
    c.open("d", "O_RDONLY|O_CREAT", 0o644);
    c.open("l", "O_RDONLY|O_NOFOLLOW", 0);
    c.open("ld", "O_RDONLY|O_DIRECTORY|O_NOFOLLOW", 0);
    c.open("ld", "O_RDONLY|O_DIRECTORY", 0);
    if let Some(fd) = c.open("l", "O_PATH|O_NOFOLLOW", 0) {
        c.fstat(&fd);
    }
}

pub fn open_errors(c: &mut Ctx) {
    c.put("f", b"x");
    c.open("absent", "O_RDONLY", 0);
    c.open("absent/x", "O_RDONLY|O_CREAT", 0o644);
    c.open("f/x", "O_RDONLY", 0);
    c.open("f/", "O_RDONLY", 0);
    let long = "n".repeat(256);
    c.open(&long, "O_RDONLY|O_CREAT", 0o644);
    let max = "m".repeat(255);
    c.open(&max, "O_RDONLY|O_CREAT", 0o644);
    c.symlink("b", "a");
    c.symlink("a", "b");
    c.open("a", "O_RDONLY", 0);
    if let Some(fd) = c.open("f", "O_RDONLY", 0) {
        c.write(&fd, b"no");
    }
    if let Some(fd) = c.open("f", "O_WRONLY", 0) {
        c.read(&fd, 10);
    }
}

pub fn open_create_modes(c: &mut Ctx) {
    // The runner's umask is 022.
    c.open("a", "O_WRONLY|O_CREAT", 0o777);
    c.open("b", "O_WRONLY|O_CREAT", 0o600);
    c.open("c", "O_WRONLY|O_CREAT", 0o4755);
    c.open("d", "O_WRONLY|O_CREAT", 0);
    for n in ["a", "b", "c", "d"] {
        c.stat(n);
    }
    // A file created 0444 can still be written through the descriptor that created it.
    if let Some(fd) = c.open("ro", "O_RDWR|O_CREAT", 0o444) {
        c.write(&fd, b"still writable");
    }
    c.content("ro");
}

pub fn open_tmpfile(c: &mut Ctx) {
    let Some(fd) = c.open("", "O_RDWR|O_TMPFILE", 0o600) else { return };
    c.write(&fd, b"anonymous");
    c.fstat(&fd);
    c.readdir("");
    let proc = format!("/proc/self/fd/{}", fd.0);
    let target = c.path("named");
    let src = crate::sys::cstr(&proc);
    // SAFETY: valid C strings.
    let r = crate::sys::check(unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            src.as_ptr(),
            libc::AT_FDCWD,
            target.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    });
    c.rec("linkat(/proc/self/fd/N, named, AT_SYMLINK_FOLLOW)", r, |_| String::new());
    c.content("named");
    c.stat("named");
}

pub fn read_write_basic(c: &mut Ctx) {
    let Some(fd) = c.open("f", "O_RDWR|O_CREAT", 0o644) else { return };
    c.write(&fd, b"hello");
    c.write(&fd, &pattern(10000, 1));
    c.lseek(&fd, 0, "SEEK_CUR");
    c.read(&fd, 10);
    c.lseek(&fd, 0, "SEEK_SET");
    c.read(&fd, 5);
    c.read(&fd, 20000);
    c.read(&fd, 10);
    c.lseek(&fd, 3, "SEEK_SET");
    c.write(&fd, b"LO");
    c.pread(&fd, 8, 0);
    c.fstat(&fd);
    c.close(fd);
    c.content("f");
}

pub fn pread_pwrite_holes(c: &mut Ctx) {
    let Some(fd) = c.open("f", "O_RDWR|O_CREAT", 0o644) else { return };
    c.pwrite(&fd, b"tail", 100);
    c.fstat(&fd);
    c.pread(&fd, 100, 0);
    c.pread(&fd, 10, 100);
    c.pread(&fd, 10, 104);
    c.pread(&fd, 10, 1 << 20);
    c.lseek(&fd, 0, "SEEK_CUR");
    // A write 1 MiB past the end leaves a hole that reads as zeros.
    c.pwrite(&fd, &pattern(8192, 2), 1 << 20);
    c.fstat(&fd);
    c.pread(&fd, 65536, 4096);
    c.pread(&fd, 8192, 1 << 20);
    c.pwrite(&fd, b"x", -1);
    c.pread(&fd, 1, -1);
}

pub fn seek_data_hole(c: &mut Ctx) {
    let Some(fd) = c.open("f", "O_RDWR|O_CREAT", 0o644) else { return };
    let mb = 1 << 20;
    c.pwrite(&fd, &pattern(4096, 3), 0);
    c.pwrite(&fd, &pattern(4096, 4), mb);
    c.fsync(&fd);
    c.lseek(&fd, 0, "SEEK_DATA");
    c.lseek(&fd, 0, "SEEK_HOLE");
    c.lseek(&fd, 4096, "SEEK_DATA");
    c.lseek(&fd, mb, "SEEK_HOLE");
    c.lseek(&fd, mb + 4096, "SEEK_DATA");
    c.lseek(&fd, mb + 5000, "SEEK_HOLE");
    c.lseek(&fd, -1, "SEEK_DATA");
    c.lseek(&fd, 3 * mb, "SEEK_HOLE");
    // A file with no data at all: the hole runs to the end.
    if let Some(g) = c.open("g", "O_RDWR|O_CREAT", 0o644) {
        c.ftruncate(&g, mb);
        c.lseek(&g, 0, "SEEK_DATA");
        c.lseek(&g, 0, "SEEK_HOLE");
    }
}

pub fn seek_end_cur(c: &mut Ctx) {
    c.put("f", &pattern(1000, 5));
    let Some(fd) = c.open("f", "O_RDONLY", 0) else { return };
    c.lseek(&fd, 0, "SEEK_END");
    c.lseek(&fd, -10, "SEEK_END");
    c.read(&fd, 100);
    c.lseek(&fd, 100, "SEEK_END");
    c.read(&fd, 100);
    c.lseek(&fd, -5, "SEEK_CUR");
    c.lseek(&fd, -5000, "SEEK_CUR");
    c.lseek(&fd, -1, "SEEK_SET");
}

pub fn truncate_grow_shrink(c: &mut Ctx) {
    c.put("f", b"0123456789");
    c.truncate("f", 10000);
    c.stat("f");
    c.content("f");
    c.truncate("f", 3);
    c.content("f");
    c.truncate("f", -1);
    c.truncate("absent", 0);
    c.mkdir("d", 0o755);
    c.truncate("d", 0);
    if let Some(fd) = c.open("f", "O_RDWR", 0) {
        let before = c.times("f");
        nap();
        c.ftruncate(&fd, 0);
        c.fstat(&fd);
        c.ftruncate(&fd, 8192);
        c.pread(&fd, 8192, 0);
        let after = c.times("f");
        if let (Some(b), Some(a)) = (before, after) {
            c.check("mtime changed by ftruncate", a.mtime != b.mtime);
        }
        // Truncating to the current size is allowed and changes nothing visible.
        c.ftruncate(&fd, 8192);
        c.fstat(&fd);
    }
    if let Some(fd) = c.open("f", "O_RDONLY", 0) {
        c.ftruncate(&fd, 0);
    }
    c.stat("f");
}

pub fn unlink_open_file(c: &mut Ctx) {
    c.put("f", b"before");
    let Some(fd) = c.open("f", "O_RDWR", 0) else { return };
    c.unlink("f");
    c.stat("f");
    c.fstat(&fd);
    c.pread(&fd, 100, 0);
    c.pwrite(&fd, b" and after", 6);
    c.pread(&fd, 100, 0);
    c.ftruncate(&fd, 4);
    c.fstat(&fd);
    c.fsync(&fd);
    c.readdir("");
    // The name can be reused at once while the old file is still open.
    c.put("f", b"new");
    c.pread(&fd, 100, 0);
    c.content("f");
    c.close(fd);
}

pub fn rename_open_file(c: &mut Ctx) {
    c.put("a", b"first");
    let Some(fd) = c.open("a", "O_RDWR|O_APPEND", 0) else { return };
    c.rename("a", "b", "0");
    c.write(&fd, b" second");
    c.content("b");
    c.put("c", b"replaced");
    // Replacing the name an open file has keeps the open file alive.
    c.rename("c", "b", "0");
    c.write(&fd, b" third");
    c.pread(&fd, 100, 0);
    c.fstat(&fd);
    c.content("b");
}

pub fn sparse_4gib(c: &mut Ctx) {
    let Some(fd) = c.open("f", "O_RDWR|O_CREAT", 0o644) else { return };
    let at = 4i64 << 30;
    c.pwrite(&fd, b"end", at);
    c.pwrite(&fd, b"start", 0);
    if let Ok(st) = fstat_raw(fd.0) {
        c.check("fewer than 1 MiB allocated", st.st_blocks * 512 < (1 << 20));
    }
    c.fstat(&fd);
    c.pread(&fd, 8, at - 5);
    c.pread(&fd, 4096, 1 << 31);
    c.lseek(&fd, 4096, "SEEK_DATA");
    c.ftruncate(&fd, at + 1);
    c.pread(&fd, 8, at - 5);
}

pub fn mmap_shared_write(c: &mut Ctx) {
    let Some(fd) = c.open("f", "O_RDWR|O_CREAT", 0o644) else { return };
    c.ftruncate(&fd, 8192);
    let len = 8192;
    // SAFETY: a fresh shared mapping of an open file of that size.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.0,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        c.log("mmap(8192, MAP_SHARED)", crate::sys::Errno::last().name());
        return;
    }
    c.log("mmap(8192, MAP_SHARED)", "ok");
    let data = pattern(5000, 6);
    // SAFETY: the mapping is 8192 bytes long.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p.cast::<u8>().add(1000), data.len()) };
    // Before msync, read() sees the page cache the mapping shares.
    c.pread(&fd, 8192, 0);
    // SAFETY: p/len is the mapping.
    let r = crate::sys::check(unsafe { libc::msync(p, len, libc::MS_SYNC) });
    c.rec("msync(MS_SYNC)", r, |_| String::new());
    // SAFETY: unmapping our own mapping.
    unsafe { libc::munmap(p, len) };
    c.close(fd);
    c.content("f");
    c.stat("f");
    // A read-only mapping sees later write()s.
    if let Some(fd) = c.open("f", "O_RDWR", 0) {
        // SAFETY: a fresh shared read-only mapping.
        let q = unsafe {
            libc::mmap(std::ptr::null_mut(), 4096, libc::PROT_READ, libc::MAP_SHARED, fd.0, 0)
        };
        if q != libc::MAP_FAILED {
            c.pwrite(&fd, b"WRITTEN", 0);
            // SAFETY: the mapping is 4096 bytes long.
            let seen = unsafe { std::slice::from_raw_parts(q.cast::<u8>(), 7) }.to_vec();
            c.log("mapping[0..7]", crate::sys::data(&seen));
            // SAFETY: our own mapping.
            unsafe { libc::munmap(q, 4096) };
        }
    }
}

pub fn fsync_fdatasync(c: &mut Ctx) {
    let Some(fd) = c.open("f", "O_RDWR|O_CREAT", 0o644) else { return };
    c.write(&fd, &pattern(100_000, 7));
    c.fsync(&fd);
    c.fdatasync(&fd);
    if let Some(ro) = c.open("f", "O_RDONLY", 0) {
        c.fsync(&ro);
    }
    if let Some(d) = c.open("", "O_RDONLY|O_DIRECTORY", 0) {
        c.fsync(&d);
        c.fdatasync(&d);
    }
    if let Some(s) = c.open("s", "O_RDWR|O_CREAT|O_SYNC", 0o644) {
        c.write(&s, b"synchronous");
    }
    c.content("s");
    c.content("f");
}

pub fn direct_io(c: &mut Ctx) {
    let Some(fd) = c.open("f", "O_RDWR|O_CREAT|O_DIRECT", 0o644) else { return };
    let layout = std::alloc::Layout::from_size_align(8192, 4096).expect("layout");
    // SAFETY: a non-zero-sized layout; freed below.
    let buf = unsafe { std::alloc::alloc_zeroed(layout) };
    let data = pattern(8192, 8);
    // SAFETY: buf is 8192 bytes.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), buf, 8192) };
    // SAFETY: buf is valid for 8192 bytes and 4096-aligned.
    let r = crate::sys::check(unsafe { libc::pwrite(fd.0, buf.cast(), 8192, 4096) } as i64);
    c.rec("pwrite(aligned 8192, @4096)", r, ToString::to_string);
    // SAFETY: as above.
    unsafe { std::ptr::write_bytes(buf, 0, 8192) };
    // SAFETY: as above.
    let r = crate::sys::check(unsafe { libc::pread(fd.0, buf.cast(), 8192, 4096) } as i64);
    // SAFETY: buf is 8192 bytes.
    let got = unsafe { std::slice::from_raw_parts(buf, 8192) }.to_vec();
    c.rec("pread(aligned 8192, @4096)", r, |n| format!("{n} {}", crate::sys::data(&got)));
    // SAFETY: allocated above with this layout.
    unsafe { std::alloc::dealloc(buf, layout) };
    c.fstat(&fd);
    c.close(fd);
    c.content("f");
}

pub fn flock_and_ofd_locks(c: &mut Ctx) {
    c.put("f", b"locked");
    let (Some(a), Some(b)) = (c.open("f", "O_RDWR", 0), c.open("f", "O_RDWR", 0)) else { return };
    c.flock(&a, "LOCK_EX");
    c.flock(&b, "LOCK_EX|LOCK_NB");
    c.flock(&b, "LOCK_SH|LOCK_NB");
    c.flock(&a, "LOCK_UN");
    c.flock(&b, "LOCK_SH|LOCK_NB");
    c.flock(&a, "LOCK_SH|LOCK_NB");
    c.flock(&a, "LOCK_EX|LOCK_NB");
    let lock = |fd: &crate::ctx::Fd, t: i16| {
        // SAFETY: an all-zero flock is valid; fields set below.
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = t;
        fl.l_whence = libc::SEEK_SET as i16;
        fl.l_len = 10;
        // SAFETY: fl is a valid flock.
        crate::sys::check(unsafe { libc::fcntl(fd.0, libc::F_OFD_SETLK, &raw mut fl) })
    };
    let r = lock(&a, libc::F_WRLCK as i16);
    c.rec("fcntl(a, F_OFD_SETLK, F_WRLCK 0..10)", r, |_| String::new());
    let r = lock(&b, libc::F_WRLCK as i16);
    c.rec("fcntl(b, F_OFD_SETLK, F_WRLCK 0..10)", r, |_| String::new());
    let r = lock(&a, libc::F_UNLCK as i16);
    c.rec("fcntl(a, F_OFD_SETLK, F_UNLCK)", r, |_| String::new());
    let r = lock(&b, libc::F_WRLCK as i16);
    c.rec("fcntl(b, F_OFD_SETLK, F_WRLCK 0..10)", r, |_| String::new());
}

/// A pause longer than the kernel's coarse timestamp granularity (one jiffy), so that a time
/// that must change does change.
pub fn nap() {
    std::thread::sleep(std::time::Duration::from_millis(20));
}
