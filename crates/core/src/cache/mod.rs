//! The NVRAM page cache for lower files (thesis 3.1.2; design.md section 11): writes to lower
//! regular files land in NVRAM as *dirty pages* inside the operation's transaction, reads see
//! them, and write-back (`flusher.rs`, policies in `writeback/`) moves them to the lower file
//! late, the inactive ones of the zone with the longest runs first (`relo`).
//!
//! This module holds the persistent record format (`record.rs`) and the volatile mirror: one
//! [`CachedFile`] per lower file that has a record, with its pages' recency state and where
//! each page is recorded in the zone information tables.
//!
//! Locks and their order: the file map, then a file's state, then the zone tables. The state
//! lock of a file is held across the lower read of `read` and `fetch` (so that a write-back
//! cannot free a page between the lower read and the overlay) but never across a write-back's
//! lower writes: a write-back copies the pages it takes and later frees only those whose
//! `version` did not change meanwhile (a page rewritten during write-back stays dirty).

pub mod record;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use lower::Extent;
use txn::FrameId;

use crate::writeback::{Loc, PageKey, Policy, ZoneTable};
pub use record::Record;

pub const PAGE: u64 = nvram::layout::FRAME_SIZE;

/// Knobs of the page cache, fixed at mount.
#[derive(Clone, Debug)]
pub struct CacheConfig {
    /// Writes to existing lower files are cached in NVRAM (`--cache on`).
    pub enabled: bool,
    /// The write-back policy (`--writeback`).
    pub policy: &'static str,
    /// Blocks (4 KiB) per zone (`--zone-blocks`).
    pub zone_blocks: u64,
    /// Write-back starts when dirty pages exceed this many ...
    pub high_pages: u64,
    /// ... and stops at this many.
    pub low_pages: u64,
    /// NR_WB: pages per write-back batch (one durable sync and one transaction per batch).
    pub batch_pages: u64,
    /// Pages dirty for longer than this many seconds are written back (`--max-dirty-age`;
    /// 0 = never).
    pub max_dirty_age: u64,
    /// Write back every dirty page at unmount (default) or keep them in NVRAM.
    pub writeback_on_unmount: bool,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            enabled: true,
            policy: "relo",
            zone_blocks: 1024,
            high_pages: u64::MAX,
            low_pages: u64::MAX,
            batch_pages: 256,
            max_dirty_age: 0,
            writeback_on_unmount: true,
        }
    }
}

/// Why a write-back round ran (counted per reason).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Dirty pages passed the high watermark (down to the low one).
    Pressure,
    /// A write found no free frame.
    NvramFull,
    /// `nvstack flush`.
    Flush,
    /// Unmount.
    Unmount,
    /// Pages older than `--max-dirty-age`.
    Age,
    /// An operation that works on the lower file directly (fallocate, O_DIRECT IO, a failed
    /// write-through) needed the file clean first.
    Coherence,
}

pub const REASONS: [Reason; 6] = [
    Reason::Pressure,
    Reason::NvramFull,
    Reason::Flush,
    Reason::Unmount,
    Reason::Age,
    Reason::Coherence,
];

impl Reason {
    pub fn name(self) -> &'static str {
        match self {
            Reason::Pressure => "pressure",
            Reason::NvramFull => "nvram_full",
            Reason::Flush => "flush",
            Reason::Unmount => "unmount",
            Reason::Age => "age",
            Reason::Coherence => "coherence",
        }
    }
}

/// The volatile state of one dirty page.
#[derive(Clone, Copy, Debug)]
pub struct PageMeta {
    pub frame: FrameId,
    /// On the active list (accessed twice since it was last aged).
    pub active: bool,
    pub referenced: bool,
    /// The cache clock's tick of the last write to the page, unique across pages and time: a
    /// write-back frees a page only if it is unchanged. (A per-page counter would not do: a
    /// page truncated away and written again would start from the same number, and the
    /// write-back would free data it never wrote.)
    pub version: u64,
    /// Tick of the last access (the `recency` policy's LRU order).
    pub last_use: u64,
    /// Lower-clock seconds when the page became dirty (`--max-dirty-age`).
    pub dirtied_at: i64,
    /// Where the page is recorded in the zone tables.
    pub loc: Loc,
    /// Counted in the engine's reserved pages (no lower block yet).
    pub reserved: bool,
}

/// The mutable part of a cached file.
#[derive(Debug)]
pub struct CacheState {
    pub rec: Record,
    pub pages: BTreeMap<u64, PageMeta>,
    /// FIEMAP of the lower file, fetched on demand, dropped when a write-back changed the
    /// lower file's allocation.
    pub extents: Option<Vec<Extent>>,
    /// The smallest size since the current write-back took its snapshot (a truncate during a
    /// write-back must not let the lower bytes it wrote become valid).
    pub shrunk_to: u64,
    /// The record was freed; holders of this entry must look the file up again.
    pub gone: bool,
    /// Pages with `reserved` set (no lower block yet): they count in st_blocks.
    pub unmapped: u64,
    /// The record's mtime when a read last applied relatime to the lower file's atime.
    pub atime_checked: (i64, u32),
}

/// A lower file with a record in NVRAM. `object` (its record frame) and `key` never change.
#[derive(Debug)]
pub struct CachedFile<N, F> {
    pub key: (u64, u64),
    pub object: FrameId,
    pub node: Arc<N>,
    state: Mutex<CacheState>,
    /// The lower file opened read-write (buffered) for fetches and the fallback write-back.
    pub io: OnceLock<F>,
    /// The lower file opened with O_DIRECT for write-back, or `None` when the lower file
    /// system refuses O_DIRECT (tmpfs).
    pub direct: OnceLock<Option<F>>,
}

impl<N, F> CachedFile<N, F> {
    pub fn new(key: (u64, u64), object: FrameId, node: Arc<N>, rec: Record) -> Self {
        let size = rec.size;
        CachedFile {
            key,
            object,
            node,
            state: Mutex::new(CacheState {
                rec,
                pages: BTreeMap::new(),
                extents: None,
                shrunk_to: size,
                gone: false,
                unmapped: 0,
                atime_checked: (i64::MIN, 0),
            }),
            io: OnceLock::new(),
            direct: OnceLock::new(),
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, CacheState> {
        self.state.lock().expect("cached file lock")
    }
}

/// The cached files, by lower key and by record frame.
#[derive(Debug)]
pub struct Files<N, F> {
    pub by_key: HashMap<(u64, u64), Arc<CachedFile<N, F>>>,
    pub by_object: BTreeMap<u64, Arc<CachedFile<N, F>>>,
}

impl<N, F> Default for Files<N, F> {
    fn default() -> Self {
        Files { by_key: HashMap::new(), by_object: BTreeMap::new() }
    }
}

/// The zone information tables (thesis Figure 3.3): `inactive` over dirty inactive pages (the
/// thesis' table, read by `relo`), `all` over every dirty page (read by `location`; it also
/// keeps two pages from sharing a location). The view's lists (`files`, `inactive_lru`) are
/// filled only for the moment a policy that reads them selects.
pub type Tables = crate::writeback::DirtyView;

/// Counters of the page cache and of write-back (`nvstack stat`: `cache`, `writeback`).
#[derive(Debug, Default)]
pub struct CacheCounters {
    pub hits: AtomicU64,
    pub fetches: AtomicU64,
    pub pages_dirty: AtomicU64,
    pub pages_inactive_dirty: AtomicU64,
    pub files: AtomicU64,
    pub pages_dropped: AtomicU64,
    pub write_through: AtomicU64,
    pub pages_written: AtomicU64,
    pub batches: AtomicU64,
    pub requests: AtomicU64,
    pub repeated_pages: AtomicU64,
    pub inter_request_distance_blocks: AtomicU64,
    pub syncs: AtomicU64,
    pub rounds: [AtomicU64; REASONS.len()],
}

/// Bound of the set that remembers which pages were written back (for `repeated_pages`):
/// 1 Mi pages (4 GiB of file data); beyond it only remembered pages count as repeats.
pub const MAX_REMEMBERED: usize = 1 << 20;

/// Write-back bookkeeping that outlives batches.
#[derive(Debug, Default)]
pub struct History {
    /// (file, page) of every page written back so far (bounded); the file is a hash of its
    /// handle (see `flusher::Job::file_id`).
    pub written: HashSet<(u64, u64)>,
    /// Physical block after the previous write request (inter-request distance).
    pub last_end: Option<u64>,
}

/// Number of stripes of the lower-IO lock.
pub const STRIPES: usize = 64;

/// The page cache of an engine.
#[derive(Debug)]
pub struct PageCache<N, F> {
    pub config: CacheConfig,
    pub policy: Box<dyn Policy>,
    pub files: Mutex<Files<N, F>>,
    pub tables: Mutex<Tables>,
    pub counters: CacheCounters,
    pub next_serial: AtomicU64,
    /// Open handles per lower regular file (a deleted file's pages are dropped, not written,
    /// once nobody has it open).
    pub opens: Mutex<HashMap<(u64, u64), u32>>,
    /// Striped by lower key: held by whatever reads the lower size to create a record and by
    /// operations that change a lower file's data directly (fallocate, copy_file_range, O_DIRECT,
    /// truncate of an uncached file), so that a record never starts from a size that is
    /// changing underneath.
    pub stripes: [Mutex<()>; STRIPES],
    /// One write-back round at a time.
    pub round: Mutex<History>,
    pub clock: AtomicU64,
}

impl<N, F> PageCache<N, F> {
    pub fn new(config: CacheConfig, policy: Box<dyn Policy>) -> Self {
        let zone_blocks = config.zone_blocks;
        PageCache {
            config,
            policy,
            files: Mutex::new(Files::default()),
            tables: Mutex::new(Tables {
                all: ZoneTable::new(zone_blocks),
                inactive: ZoneTable::new(zone_blocks),
                ..Tables::default()
            }),
            counters: CacheCounters::default(),
            next_serial: AtomicU64::new(1),
            opens: Mutex::new(HashMap::new()),
            stripes: std::array::from_fn(|_| Mutex::new(())),
            round: Mutex::new(History::default()),
            clock: AtomicU64::new(1),
        }
    }

    pub fn get(&self, key: (u64, u64)) -> Option<Arc<CachedFile<N, F>>> {
        self.files.lock().expect("cache files").by_key.get(&key).cloned()
    }

    pub fn by_object(&self, object: u64) -> Option<Arc<CachedFile<N, F>>> {
        self.files.lock().expect("cache files").by_object.get(&object).cloned()
    }

    pub fn all(&self) -> Vec<Arc<CachedFile<N, F>>> {
        self.files.lock().expect("cache files").by_object.values().cloned().collect()
    }

    pub fn stripe(&self, key: (u64, u64)) -> MutexGuard<'_, ()> {
        let i = (key.0.wrapping_mul(31) ^ key.1) as usize % STRIPES;
        self.stripes[i].lock().expect("cache stripe")
    }

    pub fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::Relaxed)
    }

    pub fn tables(&self) -> MutexGuard<'_, Tables> {
        self.tables.lock().expect("zone tables")
    }

    pub fn open_count(&self, key: (u64, u64)) -> u32 {
        self.opens.lock().expect("cache opens").get(&key).copied().unwrap_or(0)
    }

    pub fn opened(&self, key: (u64, u64)) {
        *self.opens.lock().expect("cache opens").entry(key).or_default() += 1;
    }

    /// Returns the handles left open.
    pub fn closed(&self, key: (u64, u64)) -> u32 {
        let mut opens = self.opens.lock().expect("cache opens");
        let left = match opens.get_mut(&key) {
            Some(n) => {
                *n -= 1;
                *n
            }
            None => 0,
        };
        if left == 0 {
            opens.remove(&key);
        }
        left
    }
}

/// Records a newly dirty page in the tables (Figure 3.7 (a): `add_to_zone` when it is dirty
/// and inactive).
pub fn add_page(t: &mut Tables, c: &CacheCounters, page: PageKey, meta: &PageMeta) {
    t.all.add_to_zone(page, meta.loc);
    inc(&c.pages_dirty);
    if !meta.active {
        t.inactive.add_to_zone(page, meta.loc);
        inc(&c.pages_inactive_dirty);
    }
}

/// The page is clean (written back, truncated away, dropped): Figure 3.7 (b).
pub fn remove_page(t: &mut Tables, c: &CacheCounters, meta: &PageMeta) {
    t.all.remove_from_zone(meta.loc);
    dec(&c.pages_dirty);
    if !meta.active {
        t.inactive.remove_from_zone(meta.loc);
        dec(&c.pages_inactive_dirty);
    }
}

/// A second access promotes an inactive page (and takes it out of the inactive table); the
/// first only marks it referenced (Linux's mark_page_accessed).
pub fn accessed(t: &mut Tables, c: &CacheCounters, meta: &mut PageMeta, tick: u64) {
    meta.last_use = tick;
    if meta.active {
        meta.referenced = true;
    } else if meta.referenced {
        meta.active = true;
        meta.referenced = false;
        t.inactive.remove_from_zone(meta.loc);
        dec(&c.pages_inactive_dirty);
    } else {
        meta.referenced = true;
    }
}

/// Aging (the clock over the active list): a referenced active page loses its reference, an
/// unreferenced one is demoted to the inactive list (`add_to_zone`); inactive pages lose
/// their reference.
pub fn age(t: &mut Tables, c: &CacheCounters, page: PageKey, meta: &mut PageMeta) {
    if meta.active {
        if meta.referenced {
            meta.referenced = false;
        } else {
            meta.active = false;
            t.inactive.add_to_zone(page, meta.loc);
            inc(&c.pages_inactive_dirty);
        }
    } else {
        meta.referenced = false;
    }
}

/// Moves a page to another location (FIEMAP changed) in both tables.
pub fn relocate(t: &mut Tables, page: PageKey, meta: &mut PageMeta, loc: Loc) {
    if meta.loc == loc {
        return;
    }
    t.all.remove_from_zone(meta.loc);
    if !meta.active {
        t.inactive.remove_from_zone(meta.loc);
    }
    meta.loc = loc;
    t.all.add_to_zone(page, loc);
    if !meta.active {
        t.inactive.add_to_zone(page, loc);
    }
}

/// FIEMAP extent flags that mean "no physical block yet" (UNKNOWN, DELALLOC, ENCODED,
/// DATA_INLINE, NOT_ALIGNED is fine).
const NO_BLOCK: u32 = 0x2 | 0x4 | 0x8 | 0x200;

/// Where page `index` of the file lives: its physical block when FIEMAP maps the page's
/// first byte, else by (file, page). A physical block already recorded for another page
/// (reflinks, file-system blocks smaller than a page that straddle) falls back to the logical
/// place, so that a location is recorded at most once.
pub fn locate(extents: &[Extent], object: u64, index: u64, all: &ZoneTable) -> Loc {
    let logical = Loc::Logical { object, index };
    let pos = index * PAGE;
    let i = extents.partition_point(|e| e.logical + e.length <= pos);
    let Some(e) = extents.get(i) else { return logical };
    if e.logical > pos || e.flags & NO_BLOCK != 0 {
        return logical;
    }
    let loc = Loc::Physical((e.physical + (pos - e.logical)) / PAGE);
    if all.contains(loc) { logical } else { loc }
}

pub fn inc(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

pub fn dec(c: &AtomicU64) {
    c.fetch_sub(1, Ordering::Relaxed);
}

/// `nvstack stat --json`: `cache`.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct CacheStats {
    pub enabled: bool,
    /// Page accesses served from NVRAM (reads of dirty pages, writes to dirty pages).
    pub hits: u64,
    /// Partial writes to a page not in NVRAM: the page was read from the lower file first.
    pub fetches: u64,
    /// Lower files with a record in NVRAM.
    pub files: u64,
    /// Dirty pages of deleted files, freed without being written.
    pub pages_dropped: u64,
    /// Writes that went straight to the lower file because NVRAM stayed full.
    pub write_through: u64,
}

/// `nvstack stat --json`: `writeback`.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct WritebackStats {
    pub policy: String,
    pub zone_blocks: u64,
    pub pages_written: u64,
    pub batches: u64,
    /// Lower write requests (runs of pages contiguous in the file and on the device).
    pub requests: u64,
    /// Pages written back more than once (thesis Figure 4.12).
    pub repeated_pages: u64,
    /// Sum over consecutive requests of the distance in blocks from the end of one to the
    /// start of the next (thesis Figure 4.11; requests without a physical block skipped).
    pub inter_request_distance_blocks: u64,
    /// Durability points: one fsync (a call that wrote one file) or syncfs (several) per
    /// write-back call.
    pub syncs: u64,
    pub pages_dirty: u64,
    pub pages_inactive_dirty: u64,
    pub high_pages: u64,
    pub low_pages: u64,
    pub rounds: BTreeMap<&'static str, u64>,
}

impl CacheCounters {
    pub fn snapshot(&self, config: &CacheConfig, policy: &str) -> (CacheStats, WritebackStats) {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        (
            CacheStats {
                enabled: config.enabled,
                hits: get(&self.hits),
                fetches: get(&self.fetches),
                files: get(&self.files),
                pages_dropped: get(&self.pages_dropped),
                write_through: get(&self.write_through),
            },
            WritebackStats {
                policy: policy.to_string(),
                zone_blocks: config.zone_blocks,
                pages_written: get(&self.pages_written),
                batches: get(&self.batches),
                requests: get(&self.requests),
                repeated_pages: get(&self.repeated_pages),
                inter_request_distance_blocks: get(&self.inter_request_distance_blocks),
                syncs: get(&self.syncs),
                pages_dirty: get(&self.pages_dirty),
                pages_inactive_dirty: get(&self.pages_inactive_dirty),
                high_pages: config.high_pages,
                low_pages: config.low_pages,
                rounds: REASONS
                    .iter()
                    .map(|&r| (r.name(), get(&self.rounds[r as usize])))
                    .collect(),
            },
        )
    }
}

/// One cached file found in the region (at mount, by `check` and `inspect`).
#[derive(Debug)]
pub struct Found {
    pub frame: FrameId,
    pub rec: Record,
    pub pages: BTreeMap<u64, FrameId>,
}

/// Reads every cached-file record and dirty page of the region (after recovery rolled back
/// unfinished transactions) and checks C1-C3. Damage is reported with the frame named.
pub fn scan(pool: &txn::Pool) -> Result<Vec<Found>, nvram::Error> {
    let mut records: BTreeMap<u64, Found> = BTreeMap::new();
    let mut pages = Vec::new();
    for (frame, tag) in pool.allocated_frames()? {
        match tag.kind {
            record::KIND_RECORD => {
                let b = pool.read_vec(pool.frame_offset(frame), record::RECORD_SIZE);
                let rec = Record::decode(&b)
                    .map_err(|what| nvram::Error::corrupt(nvram::Area::Frame(frame.0), what))?;
                records.insert(frame.0, Found { frame, rec, pages: BTreeMap::new() });
            }
            record::KIND_PAGE => pages.push((frame, tag)),
            _ => {}
        }
    }
    for (frame, tag) in pages {
        let corrupt = |what| nvram::Error::corrupt(nvram::Area::Frame(frame.0), what);
        let Some(found) = records.get_mut(&tag.owner) else {
            return Err(corrupt("cached page whose owner is not a cached-file record (C2)"));
        };
        if tag.index >= found.rec.size.div_ceil(PAGE) {
            return Err(corrupt("cached page beyond the file size (C3)"));
        }
        found.pages.insert(tag.index, frame);
    }
    Ok(records.into_values().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ext(logical: u64, physical: u64, length: u64, flags: u32) -> Extent {
        Extent { logical, physical, length, flags }
    }

    #[test]
    fn locate_maps_pages_through_extents() {
        let all = ZoneTable::new(16);
        let extents = [ext(0, 40960, 8192, 0), ext(16384, 1 << 20, 4096, 0x4)];
        assert_eq!(locate(&extents, 9, 0, &all), Loc::Physical(10));
        assert_eq!(locate(&extents, 9, 1, &all), Loc::Physical(11));
        // a hole between the extents, a delayed-allocation extent, past the end
        assert_eq!(locate(&extents, 9, 2, &all), Loc::Logical { object: 9, index: 2 });
        assert_eq!(locate(&extents, 9, 4, &all), Loc::Logical { object: 9, index: 4 });
        assert_eq!(locate(&extents, 9, 7, &all), Loc::Logical { object: 9, index: 7 });
    }

    #[test]
    fn a_taken_block_falls_back_to_the_logical_place() {
        let mut all = ZoneTable::new(16);
        all.add_to_zone(PageKey { object: 1, index: 0 }, Loc::Physical(10));
        let extents = [ext(0, 40960, 4096, 0)];
        assert_eq!(locate(&extents, 2, 0, &all), Loc::Logical { object: 2, index: 0 });
    }

    #[test]
    fn recency_promotes_on_the_second_access_and_ages_back() {
        let mut t =
            Tables { all: ZoneTable::new(16), inactive: ZoneTable::new(16), ..Tables::default() };
        let c = CacheCounters::default();
        let page = PageKey { object: 1, index: 3 };
        let mut meta = PageMeta {
            frame: FrameId(5),
            active: false,
            referenced: true,
            version: 0,
            last_use: 0,
            dirtied_at: 0,
            loc: Loc::Physical(7),
            reserved: false,
        };
        add_page(&mut t, &c, page, &meta);
        assert_eq!(c.pages_inactive_dirty.load(Ordering::Relaxed), 1);
        accessed(&mut t, &c, &mut meta, 1);
        assert!(meta.active);
        assert!(!t.inactive.contains(Loc::Physical(7)));
        assert_eq!(c.pages_inactive_dirty.load(Ordering::Relaxed), 0);
        age(&mut t, &c, page, &mut meta); // unreferenced active: demoted
        assert!(!meta.active);
        assert!(t.inactive.contains(Loc::Physical(7)));
        remove_page(&mut t, &c, &meta);
        assert_eq!(c.pages_dirty.load(Ordering::Relaxed), 0);
        assert_eq!(c.pages_inactive_dirty.load(Ordering::Relaxed), 0);
        assert!(!t.all.contains(Loc::Physical(7)));
    }
}
