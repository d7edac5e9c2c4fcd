//! The C library functions this library stands in for. Each does what the C library's does
//! when the descriptor is not one the library serves (or while the library itself is at work:
//! `real::guarded`), and otherwise serves the call from the delegation (`fds.rs`), falling back
//! to the C library whenever it cannot.
//!
//! `open` and friends are variadic in C; on x86-64 the optional mode travels in the register
//! of a third (or fourth) argument, so a non-variadic definition with that argument reads it
//! (what every preload library does). Not caught, and so served through FUSE as without the
//! library: read and pread (the daemon merges the log first and keeps the delegation), statx,
//! sendfile and copy_file_range (the daemon takes the delegation back), stdio's internal calls.

use std::ffi::{c_char, c_int, c_long, c_void};

use crate::fds;
use crate::real;

/// Runs at load: `NVSTACK_DIRECT=off`, `NVSTACK_DIRECT_AFTER=N`, and the fork handler.
extern "C" fn init() {
    extern "C" fn child() {
        fds::forget_all();
    }
    if std::env::var_os("NVSTACK_DIRECT").is_some_and(|v| v == "off" || v == "0") {
        fds::OFF.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    if let Some(n) = std::env::var("NVSTACK_DIRECT_AFTER").ok().and_then(|v| v.parse().ok()) {
        fds::ASK_AFTER.store(n, std::sync::atomic::Ordering::Relaxed);
    }
    // SAFETY: registers a handler with no preconditions.
    unsafe { libc::pthread_atfork(None, None, Some(child)) };
}

#[used]
#[unsafe(link_section = ".init_array")]
static INIT: extern "C" fn() = init;

fn opened(fd: c_int, flags: c_int) -> c_int {
    if fd >= 0 {
        let _ = real::guarded(|| fds::opened(fd, flags));
    }
    fd
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn open(path: *const c_char, flags: c_int, mode: libc::mode_t) -> c_int {
    // SAFETY: the caller's arguments, passed on.
    opened(unsafe { real::open64(path, flags, mode) }, flags)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn open64(path: *const c_char, flags: c_int, mode: libc::mode_t) -> c_int {
    // SAFETY: as above.
    opened(unsafe { real::open64(path, flags, mode) }, flags)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn __open_2(path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: as above (the fortified open has no mode: no O_CREAT).
    opened(unsafe { real::open64(path, flags, 0) }, flags)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn __open64_2(path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: as above.
    opened(unsafe { real::open64(path, flags, 0) }, flags)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn openat(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mode: libc::mode_t,
) -> c_int {
    // SAFETY: as above.
    opened(unsafe { real::openat64(dirfd, path, flags, mode) }, flags)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn openat64(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mode: libc::mode_t,
) -> c_int {
    // SAFETY: as above.
    opened(unsafe { real::openat64(dirfd, path, flags, mode) }, flags)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn __openat_2(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: as above.
    opened(unsafe { real::openat64(dirfd, path, flags, 0) }, flags)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn __openat64_2(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: as above.
    opened(unsafe { real::openat64(dirfd, path, flags, 0) }, flags)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn creat(path: *const c_char, mode: libc::mode_t) -> c_int {
    let flags = libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC;
    // SAFETY: as above.
    opened(unsafe { real::open64(path, flags, mode) }, flags)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn creat64(path: *const c_char, mode: libc::mode_t) -> c_int {
    let flags = libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC;
    // SAFETY: as above.
    opened(unsafe { real::open64(path, flags, mode) }, flags)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    let _ = real::guarded(|| fds::remove(fd));
    // SAFETY: as above.
    unsafe { real::close(fd) }
}

/// The buffers of an iovec array (empty for a bad count; the C library then answers).
///
/// # Safety
/// `iov` points to `cnt` iovecs describing readable memory (the caller's contract).
unsafe fn slices<'a>(iov: *const libc::iovec, cnt: c_int) -> Option<Vec<&'a [u8]>> {
    if cnt <= 0 || cnt > libc::UIO_MAXIOV || iov.is_null() {
        return None;
    }
    // SAFETY: the caller's contract.
    let iovs = unsafe { std::slice::from_raw_parts(iov, cnt as usize) };
    Some(
        iovs.iter()
            .map(|v| {
                if v.iov_len == 0 {
                    &[][..]
                } else {
                    // SAFETY: the caller's contract.
                    unsafe { std::slice::from_raw_parts(v.iov_base.cast::<u8>(), v.iov_len) }
                }
            })
            .collect(),
    )
}

/// A write served by the library, if it serves it.
fn served_write(fd: c_int, pos: Option<i64>, bufs: &[&[u8]]) -> Option<isize> {
    if pos.is_some_and(|p| p < 0) {
        return None;
    }
    let of = fds::get(fd)?;
    real::guarded(|| of.write(fd, pos.map(|p| p as u64), bufs)).flatten()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, n: usize) -> isize {
    if n > 0 && !buf.is_null() {
        // SAFETY: the caller's buffer of n bytes.
        let data = unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), n) };
        if let Some(r) = served_write(fd, None, &[data]) {
            return r;
        }
    }
    // SAFETY: as above.
    unsafe { real::write(fd, buf, n) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn pwrite(fd: c_int, buf: *const c_void, n: usize, off: i64) -> isize {
    // SAFETY: as above.
    unsafe { pwrite64(fd, buf, n, off) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn pwrite64(fd: c_int, buf: *const c_void, n: usize, off: i64) -> isize {
    if n > 0 && !buf.is_null() {
        // SAFETY: as above.
        let data = unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), n) };
        if let Some(r) = served_write(fd, Some(off), &[data]) {
            return r;
        }
    }
    // SAFETY: as above.
    unsafe { real::pwrite64(fd, buf, n, off) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const libc::iovec, cnt: c_int) -> isize {
    // SAFETY: the caller's iovecs.
    if let Some(bufs) = unsafe { slices(iov, cnt) }
        && bufs.iter().any(|b| !b.is_empty())
        && let Some(r) = served_write(fd, None, &bufs)
    {
        return r;
    }
    // SAFETY: as above.
    unsafe { real::writev(fd, iov, cnt) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn pwritev(
    fd: c_int,
    iov: *const libc::iovec,
    cnt: c_int,
    off: i64,
) -> isize {
    // SAFETY: as above.
    unsafe { pwritev64(fd, iov, cnt, off) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn pwritev64(
    fd: c_int,
    iov: *const libc::iovec,
    cnt: c_int,
    off: i64,
) -> isize {
    // SAFETY: the caller's iovecs.
    if let Some(bufs) = unsafe { slices(iov, cnt) }
        && bufs.iter().any(|b| !b.is_empty())
        && let Some(r) = served_write(fd, Some(off), &bufs)
    {
        return r;
    }
    // SAFETY: as above.
    unsafe { real::pwritev64(fd, iov, cnt, off) }
}

fn served_sync(fd: c_int) -> Option<c_int> {
    let of = fds::get(fd)?;
    real::guarded(|| of.sync()).flatten()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn fsync(fd: c_int) -> c_int {
    if let Some(r) = served_sync(fd) {
        return r;
    }
    // SAFETY: as above.
    unsafe { real::fsync(fd) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn fdatasync(fd: c_int) -> c_int {
    if let Some(r) = served_sync(fd) {
        return r;
    }
    // SAFETY: as above.
    unsafe { real::fdatasync(fd) }
}

fn served_stat(fd: c_int, buf: *mut libc::stat64) -> Option<c_int> {
    let of = fds::get(fd)?;
    let st = real::guarded(|| of.stat()).flatten()?;
    if buf.is_null() {
        return None;
    }
    // SAFETY: the caller's out-buffer of a stat64 (struct stat on x86-64 is the same).
    unsafe { buf.write(st) };
    Some(0)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn fstat(fd: c_int, buf: *mut libc::stat64) -> c_int {
    // SAFETY: as above.
    unsafe { fstat64(fd, buf) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn fstat64(fd: c_int, buf: *mut libc::stat64) -> c_int {
    if let Some(r) = served_stat(fd, buf) {
        return r;
    }
    // SAFETY: as above.
    unsafe { real::fstat64(fd, buf) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn fstatat64(
    dirfd: c_int,
    path: *const c_char,
    buf: *mut libc::stat64,
    flags: c_int,
) -> c_int {
    // SAFETY: path is the caller's C string (read only when non-null).
    if flags & libc::AT_EMPTY_PATH != 0
        && !path.is_null()
        && unsafe { *path } == 0
        && let Some(r) = served_stat(dirfd, buf)
    {
        return r;
    }
    // SAFETY: as above.
    unsafe { real::fstatat64(dirfd, path, buf, flags) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn fstatat(
    dirfd: c_int,
    path: *const c_char,
    buf: *mut libc::stat64,
    flags: c_int,
) -> c_int {
    // SAFETY: as above.
    unsafe { fstatat64(dirfd, path, buf, flags) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn lseek(fd: c_int, off: i64, whence: c_int) -> i64 {
    // SAFETY: as above.
    unsafe { lseek64(fd, off, whence) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn lseek64(fd: c_int, off: i64, whence: c_int) -> i64 {
    // The end of a delegated file is the library's size (the kernel would ask the daemon,
    // which takes the delegation back).
    if whence == libc::SEEK_END
        && let Some(of) = fds::get(fd)
        && let Some(Some(st)) = real::guarded(|| of.stat())
        && let Some(pos) = st.st_size.checked_add(off)
    {
        // SAFETY: as above.
        return unsafe { real::lseek64(fd, pos, libc::SEEK_SET) };
    }
    // SAFETY: as above.
    unsafe { real::lseek64(fd, off, whence) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ftruncate(fd: c_int, len: i64) -> c_int {
    // SAFETY: as above.
    unsafe { ftruncate64(fd, len) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ftruncate64(fd: c_int, len: i64) -> c_int {
    if len >= 0
        && let Some(of) = fds::get(fd)
        && let Some(Some(r)) = real::guarded(|| of.truncate(fd, len as u64))
    {
        return r;
    }
    // SAFETY: as above.
    unsafe { real::ftruncate64(fd, len) }
}

/// A duplicate `new` of `old` names the same open file (the delegation is shared).
fn duplicated(old: c_int, new: c_int) -> c_int {
    if new >= 0 {
        let _ = real::guarded(|| {
            fds::remove(new);
            if let Some(of) = fds::get(old) {
                fds::insert(new, of);
            }
        });
    }
    new
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: c_long) -> c_int {
    // SAFETY: as above.
    let r = unsafe { real::fcntl(fd, cmd, arg) };
    if r >= 0 {
        match cmd {
            libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => return duplicated(fd, r),
            libc::F_SETFL => {
                if let Some(of) = fds::get(fd) {
                    let append = arg as c_int & libc::O_APPEND != 0;
                    of.append.store(append, std::sync::atomic::Ordering::Relaxed);
                }
            }
            _ => {}
        }
    }
    r
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: c_long) -> c_int {
    // SAFETY: as above.
    unsafe { fcntl(fd, cmd, arg) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    // SAFETY: as above.
    duplicated(fd, unsafe { real::dup(fd) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    if old == new {
        // SAFETY: as above.
        return unsafe { real::dup2(old, new) };
    }
    // SAFETY: as above.
    duplicated(old, unsafe { real::dup2(old, new) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    // SAFETY: as above.
    duplicated(old, unsafe { real::dup3(old, new, flags) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mmap(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: i64,
) -> *mut c_void {
    // SAFETY: as above.
    unsafe { mmap64(addr, len, prot, flags, fd, off) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mmap64(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: i64,
) -> *mut c_void {
    // A mapping sees the kernel's pages, not the log: the delegation ends first (merged).
    if flags & libc::MAP_ANONYMOUS == 0
        && let Some(of) = fds::get(fd)
    {
        let _ = real::guarded(|| of.end(fd));
    }
    // SAFETY: as above.
    unsafe { real::mmap64(addr, len, prot, flags, fd, off) }
}
