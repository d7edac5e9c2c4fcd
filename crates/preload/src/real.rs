//! The C library's own functions, found past this library (`dlsym(RTLD_NEXT)`), and the guard
//! that sends this library's own calls (and any call made while it works) straight to them.

use std::ffi::{CStr, c_char, c_int, c_long, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

/// One C library function, resolved at its first call.
pub struct Sym {
    name: &'static CStr,
    addr: AtomicUsize,
}

impl Sym {
    pub const fn new(name: &'static CStr) -> Sym {
        Sym { name, addr: AtomicUsize::new(0) }
    }

    /// The function's address (the process aborts if the C library lacks it: every caller is
    /// a wrapper of that very function, so it was linked against it).
    pub fn get(&self) -> usize {
        let a = self.addr.load(Ordering::Relaxed);
        if a != 0 {
            return a;
        }
        // SAFETY: dlsym with a NUL-terminated name; RTLD_NEXT is the documented handle.
        let a = unsafe { libc::dlsym(libc::RTLD_NEXT, self.name.as_ptr()) } as usize;
        if a == 0 {
            // SAFETY: abort has no preconditions.
            unsafe { libc::abort() };
        }
        self.addr.store(a, Ordering::Relaxed);
        a
    }
}

macro_rules! real {
    ($($name:ident: fn($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {
        /// The resolved addresses, one per function.
        #[allow(non_upper_case_globals)]
        mod syms {
            use super::{CStr, Sym};
            $(
                pub static $name: Sym = Sym::new({
                    // (the C string of the function's name, checked at compile time)
                    match CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes()) {
                        Ok(s) => s,
                        Err(_) => panic!("a function name"),
                    }
                });
            )*
        }
        $(
            /// The C library's function of this name.
            ///
            /// # Safety
            /// As the C function's.
            pub unsafe fn $name($($arg: $ty),*) -> $ret {
                // SAFETY: the symbol is the C library's function of exactly this signature.
                let f: unsafe extern "C" fn($($ty),*) -> $ret =
                    unsafe { std::mem::transmute(syms::$name.get()) };
                // SAFETY: the caller's.
                unsafe { f($($arg),*) }
            }
        )*
    };
}

real! {
    open64: fn(path: *const c_char, flags: c_int, mode: libc::mode_t) -> c_int;
    openat64: fn(dirfd: c_int, path: *const c_char, flags: c_int, mode: libc::mode_t) -> c_int;
    close: fn(fd: c_int) -> c_int;
    write: fn(fd: c_int, buf: *const c_void, n: usize) -> isize;
    pwrite64: fn(fd: c_int, buf: *const c_void, n: usize, off: i64) -> isize;
    writev: fn(fd: c_int, iov: *const libc::iovec, cnt: c_int) -> isize;
    pwritev64: fn(fd: c_int, iov: *const libc::iovec, cnt: c_int, off: i64) -> isize;
    pwritev64v2: fn(fd: c_int, iov: *const libc::iovec, cnt: c_int, off: i64, flags: c_int) -> isize;
    fsync: fn(fd: c_int) -> c_int;
    fdatasync: fn(fd: c_int) -> c_int;
    fstat64: fn(fd: c_int, buf: *mut libc::stat64) -> c_int;
    fstatat64: fn(dirfd: c_int, path: *const c_char, buf: *mut libc::stat64, flags: c_int) -> c_int;
    lseek64: fn(fd: c_int, off: i64, whence: c_int) -> i64;
    ftruncate64: fn(fd: c_int, len: i64) -> c_int;
    fcntl: fn(fd: c_int, cmd: c_int, arg: c_long) -> c_int;
    dup: fn(fd: c_int) -> c_int;
    dup2: fn(old: c_int, new: c_int) -> c_int;
    dup3: fn(old: c_int, new: c_int, flags: c_int) -> c_int;
    mmap64: fn(addr: *mut c_void, len: usize, prot: c_int, flags: c_int, fd: c_int, off: i64) -> *mut c_void;
    ioctl: fn(fd: c_int, req: libc::c_ulong, arg: *mut c_void) -> c_int;
}

thread_local! {
    /// Set while this library works on a call: every call it makes then (its own opens of
    /// /proc and of log files, Rust's standard library) goes straight to the C library.
    static INSIDE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with the guard set; `None` when the guard was set already (the caller then passes
/// its call straight on).
pub fn guarded<T>(f: impl FnOnce() -> T) -> Option<T> {
    let entered = INSIDE.try_with(|i| !i.replace(true)).unwrap_or(false);
    if !entered {
        return None;
    }
    let out = f();
    let _ = INSIDE.try_with(|i| i.set(false));
    Some(out)
}

/// The calling thread's errno.
pub fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns the calling thread's errno.
    unsafe { *libc::__errno_location() = e };
}
