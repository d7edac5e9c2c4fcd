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

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};
use crate::region::{CACHE_LINE, PersistMode, Region, RegionCounters, check_bounds, check_word};

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
    /// Holds the flock for the lifetime of the mapping.
    _file: File,
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
        if !options.unlocked {
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
            _file: file,
        })
    }

    /// The file behind the mapping.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn assert_writable(&self) {
        assert!(self.mode != PersistMode::ReadOnly, "store to a read-only region mapping");
    }
}

impl Drop for MmapRegion {
    fn drop(&mut self) {
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
        // SAFETY: bounds checked; writable mapping; no concurrent access (Region contract rule 4).
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.base.add(off as usize), data.len());
        }
        self.bytes_written.fetch_add(data.len() as u64, Ordering::Relaxed);
    }

    fn store_u64(&self, off: u64, value: u64) {
        self.assert_writable();
        check_word(self.len, off);
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
        }
    }
}

fn lock(file: &File, path: &Path, how: libc::c_int) -> Result<()> {
    // SAFETY: flock on a descriptor we own.
    let rc = unsafe { libc::flock(file.as_raw_fd(), how | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(());
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Err(Error::InUse { path: path.to_path_buf() })
    } else {
        Err(Error::io(path, "lock", err))
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
    fn creating_over_an_existing_file_fails() {
        let dir = shm_dir();
        let path = dir.path().join("r");
        MmapRegion::create(&path, 4096).unwrap();
        assert!(MmapRegion::create(&path, 4096).is_err());
    }
}
