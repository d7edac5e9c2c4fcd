//! The one narrow interface through which every byte of the NVRAM region is read and stored.
//!
//! Persistence model (the contract every implementation honours, and the one the crash tests
//! simulate):
//!
//! 1. `write` / `store_u64` change the region's *visible* contents at once, but a store is
//!    *durable* (survives a crash) only after the cache lines it touched were flushed with
//!    `flush` and a later `fence` completed. `persist(range)` = `flush(range)` + `fence()`.
//! 2. Until then a crash may keep or lose each aligned 8-byte word of an unpersisted store
//!    independently (8-byte stores are the largest the hardware makes atomic); a store that
//!    straddles words can therefore tear.
//! 3. `store_u64` at an 8-byte aligned offset is a single atomic store: after a crash the word
//!    holds either its old or its new value, never a mix. Commit points are such stores.
//! 4. Callers never access overlapping byte ranges concurrently when one of the accesses is a
//!    store: the layers above serialise conflicting accesses with their own locks (strict
//!    two-phase locking in the transaction layer). Disjoint ranges may be used from many threads.
//!
//! 5. Write protection (journal mode, docs/design.md section 12) is page granular
//!    ([`PROTECT_PAGE`]) and volatile: it never changes what is durable or what a crash image
//!    holds. A store through `write` / `store_u64` that touches a protected page is a *stray
//!    store*: it is refused whole (no byte changes) and counted in `trapped_writes`. With
//!    `MmapRegion` the protected pages are also mapped read-only, so a store that bypasses this
//!    trait (a wild pointer into the mapping) faults and is trapped by the handler in
//!    `trap.rs`. `write_retained` is the one way to store into a protected page without opening
//!    it (`MmapRegion`: through a second mapping of the file that only it uses): journal mode
//!    makes every store of its protocol with it - the group log's retained copies and entries,
//!    the commit word, the group's stores into the pages it covers. An aligned 8-byte
//!    `write_retained` is one atomic store of the word, like `store_u64` (rule 3).
//!
//! Typical use, the undo-log append of `txn`: `write(record)`, `persist(record)`, then
//! `store_u64(tail, new_tail)`, `persist(tail)`; only then may the snapshotted bytes change.

use std::fmt::Debug;

/// Size of a cache line: the granularity of `flush` and of crash tracking.
pub const CACHE_LINE: u64 = 64;
/// Size of the largest store the hardware performs atomically (and the tearing granularity).
pub const WORD: u64 = 8;
/// The granularity of write protection: the MMU's page (checked at open: other page sizes
/// disable protection).
pub const PROTECT_PAGE: u64 = 4096;

/// How stores are made durable by an implementation; reported by `inspect` and `stat`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PersistMode {
    /// Real persistent memory mapped with MAP_SYNC: flush = clwb/clflushopt, fence = sfence.
    Dax,
    /// A file on tmpfs (/dev/shm): the page cache is the persistence domain for process crashes,
    /// so flush is free and fence only orders stores. A power cut loses the region.
    Shm,
    /// A file on an ordinary file system: fence = msync(MS_SYNC) of the flushed pages.
    Msync,
    /// The in-memory simulation used by tests (crash images on demand).
    Simulated,
    /// A read-only view (offline `check` / `inspect`): stores are refused.
    ReadOnly,
}

/// Counters of persistence and protection calls, for benchmarks (persist calls per
/// transaction) and `stat`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct RegionCounters {
    pub flush_calls: u64,
    pub fence_calls: u64,
    pub bytes_written: u64,
    /// `protect` calls (each one range: an mprotect with `MmapRegion`).
    pub protect_calls: u64,
    /// `unprotect` calls.
    pub unprotect_calls: u64,
    /// Stray stores to protected pages: refused by `write` / `store_u64`, or faulted and
    /// trapped (`MmapRegion`).
    pub trapped_writes: u64,
}

/// The region: a fixed-size byte array with explicit durability. See the module docs.
pub trait Region: Send + Sync + Debug {
    /// Length in bytes; fixed for the region's lifetime.
    fn len(&self) -> u64;
    /// Copies `buf.len()` bytes at `off` into `buf`. Panics when out of bounds.
    fn read(&self, off: u64, buf: &mut [u8]);
    /// Stores `data` at `off` (visible at once, durable after flush + fence).
    fn write(&self, off: u64, data: &[u8]);
    /// One atomic 8-byte store at an 8-byte aligned `off`.
    fn store_u64(&self, off: u64, value: u64);
    /// One atomic 8-byte load at an 8-byte aligned `off`.
    fn load_u64(&self, off: u64) -> u64;
    /// Starts writing back the cache lines that overlap `[off, off + len)`.
    fn flush(&self, off: u64, len: u64);
    /// Waits until every line flushed before this call is durable.
    fn fence(&self);
    /// How durability is achieved.
    fn mode(&self) -> PersistMode;
    /// Persistence call counters since the region was opened.
    fn counters(&self) -> RegionCounters;

    /// Makes `[off, off + len)` durable: flush + fence.
    fn persist(&self, off: u64, len: u64) {
        self.flush(off, len);
        self.fence();
    }

    /// Never true for a valid region; present because `len` is.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True when `protect` really protects (the simulation models it; `MmapRegion` maps pages
    /// read-only). Views that cannot protect keep the default no-ops.
    fn protection_supported(&self) -> bool {
        false
    }

    /// Write-protects the pages of `[off, off + len)` (page aligned): see rule 5 of the module
    /// docs. Batch callers coalesce adjacent pages into one range.
    fn protect(&self, off: u64, len: u64) {
        check_pages(self.len(), off, len);
    }

    /// Makes the pages of `[off, off + len)` (page aligned) writable again.
    fn unprotect(&self, off: u64, len: u64) {
        check_pages(self.len(), off, len);
    }

    /// True when the page holding `off` is write-protected.
    fn is_protected(&self, off: u64) -> bool {
        check_bounds(self.len(), off, 1);
        false
    }

    /// Stores `data` at `off` like `write`, but into pages that may be protected, leaving them
    /// protected (a retained copy is filled without ever becoming writable to stray stores).
    fn write_retained(&self, off: u64, data: &[u8]) {
        self.write(off, data);
    }

    /// Reads an owned copy of `[off, off + len)`.
    fn read_vec(&self, off: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        self.read(off, &mut buf);
        buf
    }
}

/// Panics unless `[off, off + len)` lies inside a region of `region_len` bytes.
pub(crate) fn check_bounds(region_len: u64, off: u64, len: u64) {
    let end = off.checked_add(len).expect("region range overflows u64");
    assert!(end <= region_len, "region access [{off}, {end}) beyond region length {region_len}");
}

/// Panics unless `[off, off + len)` is a whole number of protection pages inside the region.
pub(crate) fn check_pages(region_len: u64, off: u64, len: u64) {
    assert!(
        off % PROTECT_PAGE == 0 && len % PROTECT_PAGE == 0,
        "protection range [{off}, +{len}) is not page aligned"
    );
    check_bounds(region_len, off, len);
}

/// The protection pages `[off, off + len)` touches, as page indexes.
pub(crate) fn pages_of(off: u64, len: u64) -> std::ops::Range<u64> {
    if len == 0 {
        return 0..0;
    }
    off / PROTECT_PAGE..(off + len - 1) / PROTECT_PAGE + 1
}

/// Panics unless `off` is 8-byte aligned and inside the region.
pub(crate) fn check_word(region_len: u64, off: u64) {
    assert!(off % WORD == 0, "8-byte atomic access at unaligned offset {off}");
    check_bounds(region_len, off, WORD);
}
