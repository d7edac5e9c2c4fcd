//! The NVRAM page cache for lower files (thesis 3.1.2; design.md section 11): writes to lower
//! regular files land in NVRAM as *dirty pages* inside the operation's transaction, reads see
//! them, and write-back moves them to the lower file late, the inactive ones of the zone with
//! the longest runs first (`relo`).
//!
//! Files: `record.rs` (the persistent cached-file record), `state.rs` (the volatile mirror:
//! one `CachedFile` per lower file with a record, its pages' recency state, the zone-table
//! bookkeeping), `ops.rs` (write, read, attributes, truncate, seek through the cache, and
//! coherence with operations on the lower file), `writeback.rs` (rounds and batches),
//! `policy/` (the zone information tables and the four policies), `recovery.rs` (the records
//! found again at mount), `patch.rs` (non-blocking writes: patches of pages not in NVRAM),
//! `patchframe.rs` (where they lie: runs of slots in their file's patch frames), `counters.rs`.
//!
//! Locks (ranks in `sync.rs`): a file's state (`CachedFile`) is held across the lower reads of
//! `read` and of a write's fetches (so that a write-back cannot free a page between the lower
//! read and the overlay) but never across a write-back's lower writes: a write-back copies the
//! pages it takes and later frees only those whose `version` did not change meanwhile (a page
//! rewritten during write-back stays dirty). The file map (`CacheFiles`) and the zone tables
//! (`ZoneTables`) are short locks taken after a file's state, never held across a lower call.

pub mod counters;
mod fetchqueue;
mod nbw;
mod ops;
pub mod patch;
pub mod patchframe;
pub mod policy;
pub mod record;
pub mod recovery;
pub mod state;
mod writeback;

use std::collections::HashSet;

use lower::LowerFs;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::base::share::Share;
use crate::base::slots::{Place, SlotList};
use crate::base::sync::{Bell, Condvar, Mutex, MutexGuard, Rank};
use counters::CacheCounters;
use policy::{Policy, ZoneTable};
pub use record::Record;
pub use recovery::{Found, scan};
use state::{CachedFile, Files, Tables};

/// A cached file of the lower file system `L`.
pub type Cached<L> = CachedFile<<L as LowerFs>::Node, <L as LowerFs>::File>;

pub const PAGE: u64 = nvram::layout::FRAME_SIZE;

/// Knobs of the page cache, fixed at mount. The default is what `nvstack mount` runs with when
/// no flag is given: the mount's flags take their defaults from it, so each is written here
/// only.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheConfig {
    /// Writes to existing lower files are cached in NVRAM (`--cache on`).
    pub enabled: bool,
    /// The write-back policy (`--writeback`).
    pub policy: WritebackPolicy,
    /// Blocks (4 KiB) per zone (`--zone-blocks`).
    pub zone_blocks: u64,
    /// Write-back starts when dirty pages exceed this share of the region's frames
    /// (`--dirty-high`) ...
    pub dirty_high: Share,
    /// ... and stops when they are down to this share (`--dirty-low`).
    pub dirty_low: Share,
    /// Pressure rounds run in a background thread (`--writeback-background`, the daemon's
    /// writer calling `Engine::writeback_in_background`), not in the request of the writer that
    /// passed the high watermark; a writer meets write-back only when NVRAM is full.
    pub background: bool,
    /// NR_WB: pages per write-back batch (one durable sync and one transaction per batch).
    pub batch_pages: u64,
    /// Pages dirty for longer than this many seconds are written back (`--max-dirty-age`;
    /// 0 = never).
    pub max_dirty_age: u64,
    /// Write back every dirty page at unmount (default) or keep them in NVRAM.
    pub writeback_on_unmount: bool,
    /// Non-blocking writes (`--nbw`): what a partial write to a page not in NVRAM does.
    pub nbw: Nbw,
    /// NVRAM that may hold patches (`--nbw-patch-limit`; a frame holds several patches of one
    /// file); beyond it a partial write fetches its page, as with `--nbw off`.
    pub patch_limit: PatchLimit,
    /// Cached files that may keep their lower file open between calls (two descriptors each:
    /// buffered and O_DIRECT); the others open it for each fetch and write-back call. Why a
    /// limit: one descriptor pair per file with pages in NVRAM, beside the lower nodes' half
    /// of the open-file limit, took the daemon past that limit - creating the 9,991st file of
    /// Postmark with `--passthrough off` failed with EMFILE. Default: [`default_held_files`].
    pub held_files: usize,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            enabled: true,
            policy: WritebackPolicy::Relo,
            zone_blocks: 1024,
            dirty_high: Share::Percent(80),
            dirty_low: Share::Percent(60),
            background: true,
            batch_pages: 256,
            max_dirty_age: 1800,
            writeback_on_unmount: true,
            nbw: Nbw::AsyncBg,
            patch_limit: PatchLimit::OfRegion,
            held_files: default_held_files(),
        }
    }
}

impl CacheConfig {
    /// The limits this configuration comes to in a region of `frames` frames: the watermarks
    /// are their shares of the frames ([`Share::of`]), the patch limit [`PatchLimit::frames`].
    pub fn limits(&self, frames: u64) -> CacheLimits {
        CacheLimits {
            high_pages: self.dirty_high.of(frames),
            low_pages: self.dirty_low.of(frames),
            patch_limit: self.patch_limit.frames(frames),
        }
    }
}

/// The page cache's limits in its region (`CacheConfig::limits`, resolved once by
/// `Engine::new`): what write-back and patches run with, and what `nvstack stat --json` shows
/// (`writeback.high_pages`, `writeback.low_pages`, `nbw.patch_limit`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheLimits {
    /// Write-back starts when dirty pages exceed this many ...
    pub high_pages: u64,
    /// ... and stops at this many (at most `high_pages`: `Engine::new` checks).
    pub low_pages: u64,
    /// Frames that may hold patches.
    pub patch_limit: u64,
}

/// The default of `CacheConfig::held_files`: a quarter of the open-file limit's descriptors
/// (two a file: an eighth of the limit in files), at least 16 files. The lower nodes take half
/// the limit by default (`lower::posix::default_node_fds`); the rest is for open files, the
/// region and FUSE. It reads the limit now: the daemon makes its configuration after raising
/// the soft limit to the hard one.
pub(crate) fn default_held_files() -> usize {
    (lower::posix::default_node_fds() / 4).max(16)
}

/// NVRAM that patches may take (`--nbw-patch-limit`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchLimit {
    /// The paper's 64 MiB of patch memory, at most an eighth of the region (the default).
    OfRegion,
    /// This many frames.
    Frames(u64),
}

impl PatchLimit {
    /// The frames patches may take in a region of `region_frames` frames.
    pub(crate) fn frames(self, region_frames: u64) -> u64 {
        match self {
            PatchLimit::OfRegion => (region_frames / 8).min((64 << 20) / PAGE),
            PatchLimit::Frames(n) => n,
        }
    }
}

/// Which dirty pages write-back takes (`--writeback`; thesis 3.1.2): the four policies of
/// `policy/`, one file each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WritebackPolicy {
    /// Dirty files in the order they became dirty, all their pages (Linux).
    File,
    /// Inactive pages only, least recently used first.
    Recency,
    /// The zone whose dirty pages form the longest runs (max ASL), all its pages.
    Location,
    /// Inactive pages of the zone with max ASL, then the next zone.
    Relo,
}

impl WritebackPolicy {
    pub const ALL: [WritebackPolicy; 4] = [
        WritebackPolicy::File,
        WritebackPolicy::Recency,
        WritebackPolicy::Location,
        WritebackPolicy::Relo,
    ];

    /// Its name: on the command line (`--writeback relo`), in `nvstack stat --json`
    /// (`writeback.policy`) and of its implementation (`policy::by_name`).
    pub fn name(self) -> &'static str {
        match self {
            WritebackPolicy::File => "file",
            WritebackPolicy::Recency => "recency",
            WritebackPolicy::Location => "location",
            WritebackPolicy::Relo => "relo",
        }
    }
}

/// Non-blocking writes (the FAST'15 paper; design.md section 11.8): a partial write to a page
/// that is not in NVRAM becomes a *patch* instead of waiting for the page to be read; the modes
/// differ in when the page is fetched and merged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Nbw {
    /// No patches: the page is read first (the blocking baseline).
    Off,
    /// The page is fetched right after the write is answered, by the thread that served it.
    AsyncFg,
    /// The page is fetched by a background fetcher (the daemon's thread).
    AsyncBg,
    /// Never fetched for the patch's sake: reads not covered by it read the lower file, and
    /// write-back writes only the patched bytes.
    Lazy,
}

impl Nbw {
    pub fn name(self) -> &'static str {
        match self {
            Nbw::Off => "off",
            Nbw::AsyncFg => "async-fg",
            Nbw::AsyncBg => "async-bg",
            Nbw::Lazy => "lazy",
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
    /// Above the high watermark, in the daemon's write-back thread (`--writeback-background`).
    Background,
}

pub const REASONS: [Reason; 7] = [
    Reason::Pressure,
    Reason::NvramFull,
    Reason::Flush,
    Reason::Unmount,
    Reason::Age,
    Reason::Coherence,
    Reason::Background,
];

impl Reason {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Reason::Pressure => "pressure",
            Reason::NvramFull => "nvram_full",
            Reason::Flush => "flush",
            Reason::Unmount => "unmount",
            Reason::Age => "age",
            Reason::Coherence => "coherence",
            Reason::Background => "background",
        }
    }
}

/// Bound of the set that remembers which pages were written back (for `repeated_pages`):
/// 1 Mi pages (4 GiB of file data); beyond it only remembered pages count as repeats.
const MAX_REMEMBERED: usize = 1 << 20;

/// Write-back bookkeeping that outlives batches.
#[derive(Debug, Default)]
struct History {
    /// (file, page) of every page written back so far (bounded); the file is a hash of its
    /// handle (see `writeback::BatchFile::file_id`).
    written: HashSet<(u64, u64)>,
    /// Physical block after the previous write request (inter-request distance).
    last_end: Option<u64>,
}

/// Number of stripes of the lower-IO lock.
const STRIPES: usize = 64;

/// The page cache of an engine. Its state is private to this module and its children
/// (`ops`, `writeback`, `recovery`); the engine asks through the methods below.
#[derive(Debug)]
pub struct PageCache<L: LowerFs> {
    config: CacheConfig,
    limits: CacheLimits,
    policy: Box<dyn Policy>,
    /// The cached files (rank `CacheFiles`: short, never held while taking a file's state).
    files: Mutex<Files<L::Node, L::File>>,
    /// The zone information tables (rank `ZoneTables`).
    tables: Mutex<Tables>,
    counters: CacheCounters,
    nbw: counters::NbwCounters,
    next_serial: AtomicU64,
    /// Striped by lower key (rank `Stripe`): held by whatever reads the lower size to create a
    /// record and by operations that change a lower file's data directly (fallocate,
    /// copy_file_range, O_DIRECT, truncate of an uncached file), so that a record never starts
    /// from a size that is changing underneath.
    stripes: [Mutex<()>; STRIPES],
    /// One write-back round at a time (rank `Round`).
    round: Mutex<History>,
    /// Write-back batches freed so far (rank `Room`), and `room_freed`, notified after each:
    /// a writer that found NVRAM full while a round runs waits for one batch, not the round
    /// (`PageCache::writeback_for_room`).
    room: Mutex<u64>,
    room_freed: Condvar,
    /// The cache clock: page versions and recency ticks.
    clock: AtomicU64,
    /// Patched pages waiting for an asynchronous fetch, as (file id, page), in elevator
    /// order (rank `Fetches`; bounded: `nbw::MAX_QUEUED`).
    fetches: Mutex<fetchqueue::FetchQueue>,
    /// The record frames and their taken slots (rank `RecordSlots`; T6, `crate::base::slots`).
    slots: SlotList,
    /// Cached files keeping their lower file open now (at most `config.held_files`).
    held: Arc<AtomicUsize>,
    /// Rung when a cached write leaves the cache above its high watermark with
    /// `--writeback-background` (the daemon's writer sleeps on it), and when a patch is queued
    /// for the `async-bg` fetcher: an idle mount's threads sleep instead of polling.
    writer_bell: Bell,
    fetcher_bell: Bell,
}

impl<L: LowerFs> PageCache<L> {
    pub(crate) fn new(config: CacheConfig, limits: CacheLimits, policy: Box<dyn Policy>) -> Self {
        let zone_blocks = config.zone_blocks;
        PageCache {
            config,
            limits,
            policy,
            files: Mutex::new(Rank::CacheFiles, Files::default()),
            tables: Mutex::new(
                Rank::ZoneTables,
                Tables {
                    all: ZoneTable::new(zone_blocks),
                    inactive: ZoneTable::new(zone_blocks),
                    ..Tables::default()
                },
            ),
            counters: CacheCounters::default(),
            nbw: counters::NbwCounters::default(),
            next_serial: AtomicU64::new(1),
            stripes: std::array::from_fn(|_| Mutex::new(Rank::Stripe, ())),
            round: Mutex::new(Rank::Round, History::default()),
            room: Mutex::new(Rank::Room, 0),
            room_freed: Condvar::new(),
            clock: AtomicU64::new(1),
            fetches: Mutex::new(Rank::Fetches, fetchqueue::FetchQueue::new(nbw::MAX_QUEUED)),
            slots: SlotList::default(),
            held: Arc::new(AtomicUsize::new(0)),
            writer_bell: Bell::new(),
            fetcher_bell: Bell::new(),
        }
    }

    /// A new cached file's entry, sharing the count of files that keep descriptors.
    pub(crate) fn new_file(
        &self,
        key: (u64, u64),
        record: Place,
        node: Arc<L::Node>,
        rec: Record,
    ) -> Cached<L> {
        CachedFile::new(key, record, node, rec, Arc::clone(&self.held), self.config.held_files)
    }

    pub(crate) fn config(&self) -> &CacheConfig {
        &self.config
    }

    /// Dirty pages in NVRAM now.
    pub(crate) fn pages_dirty(&self) -> u64 {
        self.counters.pages_dirty.load(Ordering::Relaxed)
    }

    /// A write went straight to the lower file because NVRAM stayed full.
    pub(crate) fn count_write_through(&self) {
        counters::inc(&self.counters.write_through);
    }

    /// `nvstack stat`: the `cache` and `writeback` objects.
    pub(crate) fn stats(&self) -> (counters::CacheStats, counters::WritebackStats) {
        let (mut cache, wb) =
            self.counters.snapshot(&self.config, &self.limits, self.policy.name());
        cache.record_frames = self.slots.frames();
        (cache, wb)
    }

    /// `nvstack stat`: the `nbw` object.
    pub(crate) fn nbw_stats(&self) -> counters::NbwStats {
        self.nbw.snapshot(&self.config, &self.limits)
    }

    /// A record was created for `cf` (its transaction committed).
    fn insert(&self, cf: &Arc<Cached<L>>) {
        let mut files = self.files.lock();
        files.by_key.insert(cf.key, Arc::clone(cf));
        files.by_object.insert(cf.id(), Arc::clone(cf));
        drop(files);
        counters::inc(&self.counters.files);
    }

    /// `cf`'s record was freed (its transaction committed). Only this file's entries go:
    /// another thread may have created a record in the same frame (or for the same file)
    /// since.
    fn remove(&self, cf: &Cached<L>) {
        let mut files = self.files.lock();
        if files.by_key.get(&cf.key).is_some_and(|f| std::ptr::eq(Arc::as_ptr(f), cf)) {
            files.by_key.remove(&cf.key);
        }
        if files.by_object.get(&cf.id()).is_some_and(|f| std::ptr::eq(Arc::as_ptr(f), cf)) {
            files.by_object.remove(&cf.id());
        }
        drop(files);
        counters::dec(&self.counters.files);
    }

    fn get(&self, key: (u64, u64)) -> Option<Arc<Cached<L>>> {
        self.files.lock().by_key.get(&key).cloned()
    }

    fn by_object(&self, object: u64) -> Option<Arc<Cached<L>>> {
        self.files.lock().by_object.get(&object).cloned()
    }

    fn all(&self) -> Vec<Arc<Cached<L>>> {
        self.files.lock().by_object.values().cloned().collect()
    }

    fn stripe(&self, key: (u64, u64)) -> MutexGuard<'_, ()> {
        let i = (key.0.wrapping_mul(31) ^ key.1) as usize % STRIPES;
        self.stripes[i].lock()
    }

    fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::Relaxed)
    }

    fn tables(&self) -> MutexGuard<'_, Tables> {
        self.tables.lock()
    }
}

#[cfg(test)]
mod tests {
    use super::{WritebackPolicy, policy};

    /// `Engine::new` finds each policy's implementation by its name, the name `stat` shows.
    #[test]
    fn every_write_back_policy_has_an_implementation_of_its_name() {
        for p in WritebackPolicy::ALL {
            assert_eq!(policy::by_name(p.name()).expect("implemented").name(), p.name());
        }
    }
}
