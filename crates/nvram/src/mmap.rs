//! The real region: one file mapped `MAP_SHARED`.
//!
//! Three ways to make stores durable, chosen at open (`PersistChoice::Auto` picks the strongest
//! the file allows):
//! - **DAX** (`MAP_SYNC` accepted: the file is on persistent memory): `flush` writes the cache
//!   lines back with `clwb` (or `clflushopt`, or `clflush` on old CPUs), `fence` is `sfence`.
//!   The CPU caches are the only volatile layer, so this survives power loss.
//! - **Shm** (the file is on tmpfs, the default `/dev/shm` emulation): the page cache *is* the
//!   persistence domain. A store executed by the process is in the page cache at once, so a
//!   process crash (SIGKILL, panic) loses nothing; `flush` does nothing and `fence` only keeps the
//!   compiler and CPU from reordering stores across it. A power cut loses the region: this mode
//!   emulates NVRAM for the daemon, not for the machine.
//! - **Msync** (an ordinary file on a disk): `flush` records the pages, `fence` calls
//!   `msync(MS_SYNC)` on them. Durable across power loss, slow.
//!
//! The file is locked with `flock` while open: exclusively for read-write use (one daemon owns a
//! region), shared for read-only inspection.
//!
//! Write protection (journal mode): `protect` maps pages `PROT_READ` with `mprotect` and records
//! them in a bitmap; `write` / `store_u64` refuse (and count) stores that touch a protected page
//! before they could fault; a store through a wild pointer faults and is trapped by `trap.rs`
//! (the mapping is registered there the first time it is protected). `write_retained` stores
//! into protected pages through the *writer's mapping*: a second `MAP_SHARED` mapping of the
//! same file (the same page cache on tmpfs and disk files, the same persistent memory on DAX),
//! always writable, between two `PROT_NONE` guard pages, made at the first `protect`; its
//! address never leaves this file. So protected pages are never mapped writable where the rest
//! of the process reads them, and a retained store costs a `memcpy`, not a system call (the
//! fallback, if the kernel refuses the second mapping, is `pwrite` on the file). `flush` and
//! `fence` use the main mapping's addresses for both: a cache-line write-back reaches the same
//! physical line by either address, and `msync` writes back the file's dirty pages, whichever
//! mapping dirtied them (docs/design.md 12.6).

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};
use crate::region::{
    CACHE_LINE, PROTECT_PAGE, PersistMode, Region, RegionCounters, check_bounds, check_pages,
    check_word, pages_of,
};
use crate::trap::{self, Exclusion, TrapPolicy};

/// Which persistence mechanism to use; see the module docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum PersistChoice {
    /// DAX if `MAP_SYNC` works, else Shm on tmpfs, else Msync.
    #[default]
    Auto,
    /// Require DAX; fail if the file is not on persistent memory.
    Dax,
    /// Treat the page cache as persistent (process-crash durability only).
    Shm,
    /// `msync(MS_SYNC)` at every fence.
    Msync,
}

/// Options for [`MmapRegion::open`].
#[derive(Clone, Copy, Debug, Default)]
pub struct MmapOptions {
    pub persist: PersistChoice,
    /// Map read-only (offline `check` / `inspect`); stores panic.
    pub read_only: bool,
    /// With `read_only`: take no lock, so a region in use can be inspected (racy snapshot).
    pub unlocked: bool,
    /// A writable mapping that two processes hold by design (a delegation's log area, which
    /// the library appends to and the daemon merges from, with their own handshake:
    /// `direct::control`): no lock is taken.
    pub shared: bool,
    /// What a stray store into a protected page does (`trap.rs`).
    pub trap: TrapPolicy,
    /// How `write_retained` reaches protected pages.
    pub retained: RetainedWrites,
}

/// How `write_retained` stores into protected pages (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum RetainedWrites {
    /// Through the writer's mapping, made at the first `protect` (`pwrite` if the kernel
    /// refuses it).
    #[default]
    Mapping,
    /// With `pwrite` on the region file: a system call per store (what journal mode did before
    /// the writer's mapping; kept to measure and test the fallback).
    Pwrite,
}

/// How DAX flushes a line: the best instruction the CPU has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LineFlush {
    Clwb,
    Clflushopt,
    Clflush,
}

/// A file mapped `MAP_SHARED`. See the module docs.
#[derive(Debug)]
pub struct MmapRegion {
    base: *mut u8,
    len: u64,
    path: PathBuf,
    mode: PersistMode,
    line_flush: LineFlush,
    /// Page ranges flushed since the last fence (Msync mode only).
    msync_pending: Mutex<Vec<(u64, u64)>>,
    flush_calls: AtomicU64,
    fence_calls: AtomicU64,
    bytes_written: AtomicU64,
    protect_calls: AtomicU64,
    unprotect_calls: AtomicU64,
    /// Flags the mapping was made with (the trap handler maps a diverted page back with them).
    map_flags: libc::c_int,
    trap: TrapPolicy,
    retained: RetainedWrites,
    /// One bit per page: set while the page is mapped read-only. Changed only with the trap
    /// exclusion held (inside `protect` / `unprotect`).
    protected: Vec<AtomicU64>,
    /// The mapping's entry in the trap registry, made at the first `protect`; `None` inside
    /// when no entry was free (protection then unavailable).
    trap_entry: std::sync::OnceLock<Option<usize>>,
    /// The writer's mapping (address), made at the first `protect`: a second `MAP_SHARED`
    /// mapping of the same file, always writable, between two `PROT_NONE` guard pages, through
    /// which `write_retained` stores into protected pages. `None` inside when the kernel refused
    /// it (then `write_retained` uses `pwrite`).
    writer: std::sync::OnceLock<Option<usize>>,
    /// Holds the flock for the lifetime of the mapping.
    file: File,
}

// SAFETY: the mapping is plain shared memory; concurrent access rules are those of the `Region`
// contract (no overlapping access when one side stores), which the callers uphold.
unsafe impl Send for MmapRegion {}
// SAFETY: as above.
unsafe impl Sync for MmapRegion {}

const TMPFS_MAGIC: i64 = 0x0102_1994;
const MAP_SHARED_VALIDATE: libc::c_int = 0x03;
const MAP_SYNC: libc::c_int = 0x80000;

impl MmapRegion {
    /// Creates a new zero-filled region file of `len` bytes with mode 0600. Fails if it exists.
    pub fn create(path: &Path, len: u64) -> Result<()> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| Error::io(path, "create", e))?;
        file.set_len(len).map_err(|e| Error::io(path, "set size of", e))?;
        Ok(())
    }

    /// Zero-fills an existing region file to `len` bytes (reformat with --force) and makes it 0600.
    pub fn recreate(path: &Path, len: u64) -> Result<()> {
        let file =
            OpenOptions::new().write(true).open(path).map_err(|e| Error::io(path, "open", e))?;
        lock(&file, path, libc::LOCK_EX)?;
        file.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(|e| Error::io(path, "chmod", e))?;
        file.set_len(0).map_err(|e| Error::io(path, "truncate", e))?;
        file.set_len(len).map_err(|e| Error::io(path, "set size of", e))?;
        Ok(())
    }

    /// Maps an existing region file.
    pub fn open(path: &Path, options: MmapOptions) -> Result<MmapRegion> {
        let file = OpenOptions::new()
            .read(true)
            .write(!options.read_only)
            .open(path)
            .map_err(|e| Error::io(path, "open", e))?;
        assert!(
            options.read_only || !options.unlocked,
            "only read-only mappings may skip the lock"
        );
        if !options.unlocked && !options.shared {
            lock(&file, path, if options.read_only { libc::LOCK_SH } else { libc::LOCK_EX })?;
        }
        let len = file.metadata().map_err(|e| Error::io(path, "stat", e))?.len();
        if len == 0 {
            return Err(Error::TooSmall { size: 0, min: 1 });
        }
        let fd = file.as_raw_fd();
        let prot =
            if options.read_only { libc::PROT_READ } else { libc::PROT_READ | libc::PROT_WRITE };
        let mut mode = None;
        let mut base = libc::MAP_FAILED;
        let mut map_flags = libc::MAP_SHARED;
        if !options.read_only && matches!(options.persist, PersistChoice::Auto | PersistChoice::Dax)
        {
            // SAFETY: a fresh mapping of a file we hold open; the kernel validates the flags.
            base = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len as usize,
                    prot,
                    MAP_SHARED_VALIDATE | MAP_SYNC,
                    fd,
                    0,
                )
            };
            if base == libc::MAP_FAILED {
                if options.persist == PersistChoice::Dax {
                    return Err(Error::io(
                        path,
                        "map with MAP_SYNC (is it on a DAX file system?)",
                        std::io::Error::last_os_error(),
                    ));
                }
            } else {
                mode = Some(PersistMode::Dax);
                map_flags = MAP_SHARED_VALIDATE | MAP_SYNC;
            }
        }
        if base == libc::MAP_FAILED {
            // SAFETY: as above, ordinary shared mapping.
            base = unsafe {
                libc::mmap(std::ptr::null_mut(), len as usize, prot, libc::MAP_SHARED, fd, 0)
            };
            if base == libc::MAP_FAILED {
                return Err(Error::io(path, "mmap", std::io::Error::last_os_error()));
            }
            mode = Some(if options.read_only {
                PersistMode::ReadOnly
            } else {
                match options.persist {
                    PersistChoice::Shm => PersistMode::Shm,
                    PersistChoice::Msync => PersistMode::Msync,
                    PersistChoice::Auto | PersistChoice::Dax => {
                        if is_tmpfs(&file) {
                            PersistMode::Shm
                        } else {
                            PersistMode::Msync
                        }
                    }
                }
            });
        }
        Ok(MmapRegion {
            base: base.cast::<u8>(),
            len,
            path: path.to_path_buf(),
            mode: mode.expect("mode chosen with the mapping"),
            line_flush: detect_line_flush(),
            msync_pending: Mutex::new(Vec::new()),
            flush_calls: AtomicU64::new(0),
            fence_calls: AtomicU64::new(0),
            bytes_written: AtomicU64::new(0),
            protect_calls: AtomicU64::new(0),
            unprotect_calls: AtomicU64::new(0),
            map_flags,
            trap: options.trap,
            retained: options.retained,
            protected: (0..len.div_ceil(PROTECT_PAGE).div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
            trap_entry: std::sync::OnceLock::new(),
            writer: std::sync::OnceLock::new(),
            file,
        })
    }

    /// The file behind the mapping.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn assert_writable(&self) {
        assert!(self.mode != PersistMode::ReadOnly, "store to a read-only region mapping");
    }

    /// The start of the mapping: for tests that play a buggy component storing through a wild
    /// pointer (every real store goes through `Region`).
    pub fn base_ptr(&self) -> *const u8 {
        self.base
    }

    fn trap_entry(&self) -> Option<usize> {
        *self.trap_entry.get_or_init(|| {
            if self.mode == PersistMode::ReadOnly || page_size() != PROTECT_PAGE {
                return None;
            }
            trap::register(
                self.base as usize,
                self.len as usize,
                self.file.as_raw_fd(),
                self.map_flags,
                self.trap,
            )
        })
    }

    /// The writer's mapping (see the field), made on first use; `None` if the kernel refused.
    fn writer(&self) -> Option<*mut u8> {
        let addr = *self.writer.get_or_init(|| {
            if self.retained == RetainedWrites::Pwrite {
                return None;
            }
            let total = self.writer_reservation();
            // SAFETY: a fresh anonymous reservation; nothing else refers to it.
            let reserve = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    total,
                    libc::PROT_NONE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                    -1,
                    0,
                )
            };
            if reserve == libc::MAP_FAILED {
                return None;
            }
            // SAFETY: inside the reservation just made (its first and last page stay guards).
            let at = unsafe { reserve.cast::<u8>().add(PROTECT_PAGE as usize) };
            // SAFETY: maps our own file over the middle of our own reservation.
            let mapped = unsafe {
                libc::mmap(
                    at.cast(),
                    self.len as usize,
                    libc::PROT_READ | libc::PROT_WRITE,
                    self.map_flags | libc::MAP_FIXED,
                    self.file.as_raw_fd(),
                    0,
                )
            };
            if mapped == libc::MAP_FAILED {
                // SAFETY: the reservation made above, unused.
                unsafe { libc::munmap(reserve, total) };
                return None;
            }
            Some(at as usize)
        });
        addr.map(|a| a as *mut u8)
    }

    /// Bytes of the reservation around the writer's mapping: the region rounded up to whole
    /// pages, and a guard page on each side.
    fn writer_reservation(&self) -> usize {
        (self.len.div_ceil(PROTECT_PAGE) * PROTECT_PAGE + 2 * PROTECT_PAGE) as usize
    }

    fn page_bit(&self, page: u64) -> (&AtomicU64, u64) {
        (&self.protected[(page / 64) as usize], 1 << (page % 64))
    }

    /// True (and the store counted) when `[off, off + len)` touches a protected page.
    fn refuse_stray(&self, off: u64, len: u64) -> bool {
        let Some(Some(entry)) = self.trap_entry.get() else { return false };
        for page in pages_of(off, len) {
            let (word, bit) = self.page_bit(page);
            if word.load(Ordering::Acquire) & bit != 0 {
                trap::count(*entry);
                return true;
            }
        }
        false
    }

    fn any_protected(&self, off: u64, len: u64) -> bool {
        pages_of(off, len).any(|page| {
            let (word, bit) = self.page_bit(page);
            word.load(Ordering::Acquire) & bit != 0
        })
    }

    /// mprotect of a page-aligned range; false (with errno lost) when the kernel refused.
    fn mprotect(&self, off: u64, len: u64, prot: libc::c_int) -> bool {
        // SAFETY: a page-aligned sub-range of our own mapping (checked by the callers).
        unsafe { libc::mprotect(self.base.add(off as usize).cast(), len as usize, prot) == 0 }
    }

    fn set_bits(&self, off: u64, len: u64, protected: bool) {
        for page in pages_of(off, len) {
            let (word, bit) = self.page_bit(page);
            if protected {
                word.fetch_or(bit, Ordering::Release);
            } else {
                word.fetch_and(!bit, Ordering::Release);
            }
        }
    }
}

/// Reports once per process that the kernel refused an mprotect (e.g. too many mappings).
fn report_protect_failure(what: &str) {
    static REPORTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !REPORTED.swap(true, Ordering::Relaxed) {
        eprintln!(
            "nvstack: mprotect failed ({what}: {}); NVRAM pages stay writable where it failed",
            std::io::Error::last_os_error()
        );
    }
}

impl Drop for MmapRegion {
    fn drop(&mut self) {
        if let Some(Some(entry)) = self.trap_entry.get() {
            trap::unregister(*entry);
        }
        if let Some(Some(writer)) = self.writer.get() {
            // SAFETY: the reservation `writer()` made around the writer's mapping; nothing
            // refers to it (every access copies).
            unsafe {
                libc::munmap(
                    (*writer - PROTECT_PAGE as usize) as *mut libc::c_void,
                    self.writer_reservation(),
                );
            }
        }
        // SAFETY: unmapping exactly the mapping created in `open`; no references into it remain
        // because every access copies.
        unsafe {
            libc::munmap(self.base.cast(), self.len as usize);
        }
    }
}

impl Region for MmapRegion {
    fn len(&self) -> u64 {
        self.len
    }

    fn read(&self, off: u64, buf: &mut [u8]) {
        check_bounds(self.len, off, buf.len() as u64);
        // SAFETY: bounds checked; no concurrent store to these bytes (Region contract rule 4).
        unsafe {
            std::ptr::copy_nonoverlapping(self.base.add(off as usize), buf.as_mut_ptr(), buf.len());
        }
    }

    fn write(&self, off: u64, data: &[u8]) {
        self.assert_writable();
        check_bounds(self.len, off, data.len() as u64);
        if self.refuse_stray(off, data.len() as u64) {
            return;
        }
        // SAFETY: bounds checked; writable mapping; no concurrent access (Region contract rule 4).
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.base.add(off as usize), data.len());
        }
        self.bytes_written.fetch_add(data.len() as u64, Ordering::Relaxed);
    }

    fn store_u64(&self, off: u64, value: u64) {
        self.assert_writable();
        check_word(self.len, off);
        if self.refuse_stray(off, 8) {
            return;
        }
        // SAFETY: aligned (check_word, and the mapping is page aligned), in bounds, writable;
        // AtomicU64 has the layout of u64.
        #[allow(clippy::cast_ptr_alignment)]
        unsafe {
            (*self.base.add(off as usize).cast::<AtomicU64>()).store(value, Ordering::Release);
        };
        self.bytes_written.fetch_add(8, Ordering::Relaxed);
    }

    fn load_u64(&self, off: u64) -> u64 {
        check_word(self.len, off);
        // SAFETY: aligned (check_word, and the mapping is page aligned) and in bounds.
        #[allow(clippy::cast_ptr_alignment)]
        unsafe {
            (*self.base.add(off as usize).cast::<AtomicU64>()).load(Ordering::Acquire)
        }
    }

    fn flush(&self, off: u64, len: u64) {
        check_bounds(self.len, off, len);
        self.flush_calls.fetch_add(1, Ordering::Relaxed);
        if len == 0 {
            return;
        }
        match self.mode {
            PersistMode::Dax => {
                let first = off / CACHE_LINE * CACHE_LINE;
                let mut line = first;
                while line < off + len {
                    // SAFETY: the line lies inside the mapping (bounds checked above).
                    unsafe { flush_line(self.line_flush, self.base.add(line as usize)) };
                    line += CACHE_LINE;
                }
            }
            PersistMode::Msync => {
                let page = page_size();
                let start = off / page * page;
                let end = (off + len).div_ceil(page) * page;
                self.msync_pending
                    .lock()
                    .expect("msync list lock")
                    .push((start, end.min(self.len.div_ceil(page) * page)));
            }
            PersistMode::Shm | PersistMode::Simulated | PersistMode::ReadOnly => {}
        }
    }

    fn fence(&self) {
        self.fence_calls.fetch_add(1, Ordering::Relaxed);
        match self.mode {
            PersistMode::Dax => {
                // SAFETY: sfence has no preconditions.
                #[cfg(target_arch = "x86_64")]
                unsafe {
                    std::arch::x86_64::_mm_sfence();
                }
            }
            PersistMode::Msync => {
                let pending = std::mem::take(&mut *self.msync_pending.lock().expect("msync lock"));
                for (start, end) in pending {
                    // SAFETY: a page-aligned sub-range of our mapping.
                    let rc = unsafe {
                        libc::msync(
                            self.base.add(start as usize).cast(),
                            (end - start) as usize,
                            libc::MS_SYNC,
                        )
                    };
                    // An msync failure means the durability promise is broken: this is an IO
                    // error that may have lost data, so stop rather than continue.
                    assert!(rc == 0, "msync failed: {}", std::io::Error::last_os_error());
                }
            }
            PersistMode::Shm | PersistMode::Simulated | PersistMode::ReadOnly => {
                std::sync::atomic::fence(Ordering::SeqCst);
            }
        }
    }

    fn mode(&self) -> PersistMode {
        self.mode
    }

    fn counters(&self) -> RegionCounters {
        RegionCounters {
            flush_calls: self.flush_calls.load(Ordering::Relaxed),
            fence_calls: self.fence_calls.load(Ordering::Relaxed),
            bytes_written: self.bytes_written.load(Ordering::Relaxed),
            protect_calls: self.protect_calls.load(Ordering::Relaxed),
            unprotect_calls: self.unprotect_calls.load(Ordering::Relaxed),
            trapped_writes: match self.trap_entry.get() {
                Some(Some(entry)) => trap::trapped(*entry),
                _ => 0,
            },
        }
    }

    fn protection_supported(&self) -> bool {
        self.trap_entry().is_some()
    }

    fn protect(&self, off: u64, len: u64) {
        check_pages(self.len, off, len);
        assert!(self.trap_entry().is_some(), "protect on a mapping that cannot be protected");
        // Before any page is protected, so that `write_retained` finds it for every one.
        self.writer();
        self.protect_calls.fetch_add(1, Ordering::Relaxed);
        if len == 0 {
            return;
        }
        let _exclusion = Exclusion::take();
        if self.mprotect(off, len, libc::PROT_READ) {
            self.set_bits(off, len, true);
        } else {
            // Less protection, never less data: the pages stay writable and unmarked.
            report_protect_failure("protect");
        }
    }

    fn unprotect(&self, off: u64, len: u64) {
        check_pages(self.len, off, len);
        self.unprotect_calls.fetch_add(1, Ordering::Relaxed);
        if len == 0 || self.trap_entry().is_none() {
            return;
        }
        let _exclusion = Exclusion::take();
        if self.mprotect(off, len, libc::PROT_READ | libc::PROT_WRITE) {
            self.set_bits(off, len, false);
            return;
        }
        // The range must become writable (a transaction is about to store there): open the
        // whole mapping, one range that the kernel can always merge into a single mapping.
        report_protect_failure("unprotect");
        assert!(
            self.mprotect(
                0,
                self.len.div_ceil(PROTECT_PAGE) * PROTECT_PAGE,
                libc::PROT_READ | libc::PROT_WRITE
            ),
            "mprotect of the whole region failed: {}",
            std::io::Error::last_os_error()
        );
        self.set_bits(0, self.len, false);
    }

    fn is_protected(&self, off: u64) -> bool {
        check_bounds(self.len, off, 1);
        self.any_protected(off, 1)
    }

    fn write_retained(&self, off: u64, data: &[u8]) {
        self.assert_writable();
        check_bounds(self.len, off, data.len() as u64);
        // Protected pages through the writer's mapping (`None`: the kernel refused it, or
        // `RetainedWrites::Pwrite`), the others through ours.
        let base = if self.any_protected(off, data.len() as u64) {
            self.writer()
        } else {
            Some(self.base)
        };
        if let Some(base) = base {
            // SAFETY: in bounds (checked) of a writable mapping as long as the region.
            let to = unsafe { base.add(off as usize) };
            if data.len() == 8 && off % 8 == 0 {
                // One store of the word (the group commit point, persistence rule 3).
                let value = u64::from_le_bytes(data.try_into().expect("8 bytes"));
                // SAFETY: aligned, in bounds, writable (above).
                #[allow(clippy::cast_ptr_alignment)]
                unsafe {
                    (*to.cast::<AtomicU64>()).store(value, Ordering::Release);
                }
            } else {
                // SAFETY: in bounds, writable (above); no concurrent access to these bytes
                // (rule 4).
                unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), to, data.len()) };
            }
        } else {
            // Through the kernel into the same pages, which stay read-only in the mapping.
            let mut done = 0usize;
            while done < data.len() {
                let at =
                    libc::off_t::try_from(off + done as u64).expect("region offsets fit off_t");
                // SAFETY: pwrite from a live buffer into our own file, inside its length.
                let n = unsafe {
                    libc::pwrite(
                        self.file.as_raw_fd(),
                        data[done..].as_ptr().cast(),
                        data.len() - done,
                        at,
                    )
                };
                if n < 0
                    && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
                {
                    continue;
                }
                // A failed store to the region file is an IO error that may have lost data:
                // stop, as msync failures do.
                let n = usize::try_from(n).ok().filter(|&n| n > 0).unwrap_or_else(|| {
                    panic!("pwrite to the region failed: {}", std::io::Error::last_os_error())
                });
                done += n;
            }
        }
        self.bytes_written.fetch_add(data.len() as u64, Ordering::Relaxed);
    }
}

/// How long a lock that is held is asked for again before the region counts as in use. A
/// process that forks copies our descriptors, and with them the lock of a region we just
/// closed, until its child execs (microseconds to milliseconds; CI's test threads fork all the
/// time: TESTING-NOTES.md). A real user - a running daemon - holds it far longer.
const LOCK_PATIENCE: std::time::Duration = std::time::Duration::from_millis(300);

fn lock(file: &File, path: &Path, how: libc::c_int) -> Result<()> {
    let start = std::time::Instant::now();
    loop {
        // SAFETY: flock on a descriptor we own.
        let rc = unsafe { libc::flock(file.as_raw_fd(), how | libc::LOCK_NB) };
        if rc == 0 {
            return Ok(());
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(Error::io(path, "lock", err));
        }
        if start.elapsed() >= LOCK_PATIENCE {
            return Err(Error::InUse { path: path.to_path_buf() });
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// True when `path`'s region file is locked by a read-write user (a running daemon).
pub fn is_in_use(path: &Path) -> Result<bool> {
    let file = File::open(path).map_err(|e| Error::io(path, "open", e))?;
    match lock(&file, path, libc::LOCK_SH) {
        Ok(()) => Ok(false),
        Err(Error::InUse { .. }) => Ok(true),
        Err(e) => Err(e),
    }
}

fn is_tmpfs(file: &File) -> bool {
    // SAFETY: fstatfs fills the zeroed struct for a descriptor we own.
    let mut buf: libc::statfs = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::fstatfs(file.as_raw_fd(), &raw mut buf) };
    rc == 0 && buf.f_type == TMPFS_MAGIC
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size).unwrap_or(4096)
}

#[cfg(target_arch = "x86_64")]
fn detect_line_flush() -> LineFlush {
    // CPUID leaf 7 sub-leaf 0, EBX: bit 24 = CLWB, bit 23 = CLFLUSHOPT.
    let leaf = std::arch::x86_64::__cpuid_count(7, 0);
    if leaf.ebx & (1 << 24) != 0 {
        LineFlush::Clwb
    } else if leaf.ebx & (1 << 23) != 0 {
        LineFlush::Clflushopt
    } else {
        LineFlush::Clflush
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detect_line_flush() -> LineFlush {
    LineFlush::Clflush
}

/// Writes one cache line back towards the persistence domain.
///
/// # Safety
/// `line` must point into a live mapping.
#[cfg(target_arch = "x86_64")]
unsafe fn flush_line(how: LineFlush, line: *mut u8) {
    // SAFETY: the caller guarantees `line` is mapped; the instructions only write back caches.
    unsafe {
        match how {
            LineFlush::Clwb => std::arch::asm!("clwb [{0}]", in(reg) line, options(nostack)),
            LineFlush::Clflushopt => {
                std::arch::asm!("clflushopt [{0}]", in(reg) line, options(nostack));
            }
            LineFlush::Clflush => std::arch::x86_64::_mm_clflush(line),
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn flush_line(_how: LineFlush, _line: *mut u8) {
    unreachable!("DAX mappings are only used on x86_64");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shm_dir() -> tempfile::TempDir {
        tempfile::Builder::new().prefix("nvstack-mmap-test").tempdir_in("/dev/shm").unwrap()
    }

    #[test]
    fn region_on_tmpfs_uses_the_page_cache_as_persistence_domain() {
        let dir = shm_dir();
        let path = dir.path().join("r");
        MmapRegion::create(&path, 1 << 16).unwrap();
        let region = MmapRegion::open(&path, MmapOptions::default()).unwrap();
        assert_eq!(region.mode(), PersistMode::Shm);
        region.write(10, b"hello");
        region.store_u64(64, 42);
        region.persist(10, 5);
        drop(region);
        let region = MmapRegion::open(&path, MmapOptions::default()).unwrap();
        assert_eq!(region.read_vec(10, 5), b"hello");
        assert_eq!(region.load_u64(64), 42);
    }

    #[test]
    fn created_file_is_private_to_its_owner() {
        use std::os::unix::fs::PermissionsExt;
        let dir = shm_dir();
        let path = dir.path().join("r");
        MmapRegion::create(&path, 4096).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn second_writer_is_refused_while_the_first_holds_the_region() {
        let dir = shm_dir();
        let path = dir.path().join("r");
        MmapRegion::create(&path, 4096).unwrap();
        let _first = MmapRegion::open(&path, MmapOptions::default()).unwrap();
        assert!(is_in_use(&path).unwrap());
        let second = MmapRegion::open(&path, MmapOptions::default());
        assert!(matches!(second, Err(Error::InUse { .. })), "{second:?}");
    }

    #[test]
    fn msync_mode_persists_through_msync() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r");
        MmapRegion::create(&path, 1 << 16).unwrap();
        let options = MmapOptions { persist: PersistChoice::Msync, ..MmapOptions::default() };
        let region = MmapRegion::open(&path, options).unwrap();
        assert_eq!(region.mode(), PersistMode::Msync);
        region.write(5000, b"durable");
        region.persist(5000, 7);
        assert_eq!(region.counters().fence_calls, 1);
        drop(region);
        assert_eq!(&std::fs::read(&path).unwrap()[5000..5007], b"durable");
    }

    #[test]
    fn protected_pages_refuse_stores_and_take_retained_ones_through_the_file() {
        // Each way a retained store can go, with each way the region persists.
        for (persist, retained) in [
            (PersistChoice::Auto, RetainedWrites::Mapping),
            (PersistChoice::Auto, RetainedWrites::Pwrite),
            (PersistChoice::Msync, RetainedWrites::Mapping),
            (PersistChoice::Msync, RetainedWrites::Pwrite),
        ] {
            let case = format!("{persist:?} {retained:?}");
            let dir = shm_dir();
            let path = dir.path().join("r");
            MmapRegion::create(&path, 4 * 4096).unwrap();
            let options = MmapOptions { persist, retained, ..MmapOptions::default() };
            let region = MmapRegion::open(&path, options).unwrap();
            assert!(region.protection_supported());
            region.write(4096, &[1; 4096]);
            region.protect(4096, 2 * 4096);
            let mapped = retained == RetainedWrites::Mapping;
            assert_eq!(region.writer().is_some(), mapped, "{case}");
            assert!(region.is_protected(4096) && region.is_protected(8191));
            assert!(!region.is_protected(0) && !region.is_protected(12288));
            region.write(4090, &[9; 20]); // straddles into a protected page: refused whole
            region.store_u64(8192, 5);
            assert_eq!(region.counters().trapped_writes, 2);
            assert_eq!(region.read_vec(4090, 20), [vec![0; 6], vec![1; 14]].concat());
            // The file holds retained bytes at once (the same page cache), an aligned word too
            // (one atomic store), and a store may span protected pages.
            region.write_retained(4096 + 4090, &[6; 12]);
            region.write_retained(4096 + 16, &0x1122_3344_5566_7788_u64.to_le_bytes());
            region.persist(4096, 2 * 4096);
            let bytes = std::fs::read(&path).unwrap();
            assert_eq!(&bytes[8186..8198], &[6; 12], "{case}");
            assert_eq!(region.load_u64(4096 + 16), 0x1122_3344_5566_7788);
            assert_eq!(&bytes[4112..4120], &0x1122_3344_5566_7788_u64.to_le_bytes());
            assert_eq!(region.counters().trapped_writes, 2, "retained stores are not stray");
            region.write_retained(8192, b"retained");
            assert_eq!(region.read_vec(8192, 8), b"retained");
            assert!(region.is_protected(8192), "a retained store leaves the page protected");
            region.unprotect(4096, 4096);
            region.write(4096, &[2; 8]);
            assert_eq!(region.read_vec(4096, 8), [2; 8]);
            let counters = region.counters();
            assert_eq!((counters.protect_calls, counters.unprotect_calls), (1, 1));
            drop(region);
            let bytes = std::fs::read(&path).unwrap();
            assert_eq!(&bytes[8192..8200], b"retained", "{case}");
            assert_eq!(&bytes[4096..4104], &[2; 8]);
            assert_eq!(&bytes[8186..8192], &[6; 6]);
        }
    }

    #[test]
    fn a_read_only_mapping_cannot_be_protected() {
        let dir = shm_dir();
        let path = dir.path().join("r");
        MmapRegion::create(&path, 4096).unwrap();
        let options = MmapOptions { read_only: true, ..MmapOptions::default() };
        assert!(!MmapRegion::open(&path, options).unwrap().protection_supported());
    }

    #[test]
    fn creating_over_an_existing_file_fails() {
        let dir = shm_dir();
        let path = dir.path().join("r");
        MmapRegion::create(&path, 4096).unwrap();
        assert!(MmapRegion::create(&path, 4096).is_err());
    }
}
