//! Counters of the page cache, of write-back and of non-blocking writes (`nvstack stat --json`:
//! `cache`, `writeback`, `nbw`).
//! Relaxed atomics: observations, not synchronisation.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{CacheConfig, CacheLimits, REASONS};

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
    pub room_waits: AtomicU64,
    pub rounds: [AtomicU64; REASONS.len()],
}

pub(crate) fn inc(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

pub(crate) fn dec(c: &AtomicU64) {
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
    /// Frames their records are packed in, eight to a frame (one may be empty, kept as room;
    /// a record written before records were packed has a frame of its own).
    pub record_frames: u64,
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
    /// Writes that found NVRAM full while a round ran (the background writer's or another
    /// writer's) and waited for it to free one batch, not for its end.
    pub room_waits: u64,
    pub pages_dirty: u64,
    pub pages_inactive_dirty: u64,
    pub high_pages: u64,
    pub low_pages: u64,
    pub rounds: BTreeMap<&'static str, u64>,
}

impl CacheCounters {
    pub(crate) fn snapshot(
        &self,
        config: &CacheConfig,
        limits: &CacheLimits,
        policy: &str,
    ) -> (CacheStats, WritebackStats) {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        (
            CacheStats {
                enabled: config.enabled,
                hits: get(&self.hits),
                fetches: get(&self.fetches),
                files: get(&self.files),
                record_frames: 0, // `PageCache::stats` fills it in
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
                room_waits: get(&self.room_waits),
                pages_dirty: get(&self.pages_dirty),
                pages_inactive_dirty: get(&self.pages_inactive_dirty),
                high_pages: limits.high_pages,
                low_pages: limits.low_pages,
                rounds: REASONS
                    .iter()
                    .map(|&r| (r.name(), get(&self.rounds[r as usize])))
                    .collect(),
            },
        )
    }
}

/// Why a partial write to a page not in NVRAM still read the page first (`nbw.writer_waits`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// `--nbw off`.
    Off,
    /// The patch limit was reached.
    PatchLimit,
    /// The page's patch would not fit its frame (too many fragments).
    Fragmented,
    /// The page reaches past `valid` (the last page below a truncate): only a part of it is
    /// read, and no patch rule covers the part beyond.
    PastValid,
}

pub const WAITS: [Wait; 4] = [Wait::Off, Wait::PatchLimit, Wait::Fragmented, Wait::PastValid];

impl Wait {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Wait::Off => "off",
            Wait::PatchLimit => "patch_limit",
            Wait::Fragmented => "fragmented",
            Wait::PastValid => "past_valid",
        }
    }
}

/// Counters of non-blocking writes (`nvstack stat --json`: `nbw`).
#[derive(Debug, Default)]
pub struct NbwCounters {
    pub patches_created: AtomicU64,
    /// Patches in NVRAM now, and the bytes they hold.
    pub patches: AtomicU64,
    pub patch_bytes: AtomicU64,
    /// Frames holding patches now (what `patch_limit` bounds).
    pub patch_frames: AtomicU64,
    pub patches_moved: AtomicU64,
    pub pages_completed_without_fetch: AtomicU64,
    pub fetches_async: AtomicU64,
    pub fetches_paused: AtomicU64,
    pub fetches_failed: AtomicU64,
    pub fetches_on_read: AtomicU64,
    pub fetches_on_writeback: AtomicU64,
    pub reads_served_from_patches: AtomicU64,
    pub writer_waits: [AtomicU64; WAITS.len()],
}

/// `nvstack stat --json`: `nbw`.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct NbwStats {
    pub mode: String,
    /// Frames that may hold patches (`--nbw-patch-limit`).
    pub patch_limit: u64,
    /// Partial writes to pages not in NVRAM that became patches (no read).
    pub patches_created: u64,
    /// Patches in NVRAM now and the bytes they hold.
    pub patches: u64,
    pub patch_bytes: u64,
    /// Frames holding those patches (several patches of a file share one).
    pub patch_frames: u64,
    /// Patches that outgrew their run of slots and moved to another (`patchframe.rs`).
    pub patches_moved: u64,
    /// Patches that later writes completed to a whole page: never read at all.
    pub pages_completed_without_fetch: u64,
    /// Pages fetched and merged by the asynchronous modes (foreground or background).
    pub fetches_async: u64,
    /// Calls of the asynchronous fetcher that started no fetch because the page cache held
    /// more frames than its high watermark (a fetched page takes a frame; see `fetch_patches`).
    pub fetches_paused: u64,
    /// Asynchronous fetches that failed (the patch stays; the first error is on stderr).
    pub fetches_failed: u64,
    /// Reads of a patched page not covered by its patch (they read the lower file).
    pub fetches_on_read: u64,
    /// Patched pages written back (only the patched bytes are written; the lower file system
    /// reads the rest of its block if it does not hold it).
    pub fetches_on_writeback: u64,
    /// Reads of patched pages served from the patch alone.
    pub reads_served_from_patches: u64,
    /// Partial writes that still read their page first, and why.
    pub writer_waits: u64,
    pub writer_wait_reasons: BTreeMap<&'static str, u64>,
}

impl NbwCounters {
    pub(crate) fn snapshot(&self, config: &CacheConfig, limits: &CacheLimits) -> NbwStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let reasons: BTreeMap<&'static str, u64> =
            WAITS.iter().map(|&w| (w.name(), get(&self.writer_waits[w as usize]))).collect();
        NbwStats {
            mode: config.nbw.name().to_string(),
            patch_limit: limits.patch_limit,
            patches_created: get(&self.patches_created),
            patches: get(&self.patches),
            patch_bytes: get(&self.patch_bytes),
            patch_frames: get(&self.patch_frames),
            patches_moved: get(&self.patches_moved),
            pages_completed_without_fetch: get(&self.pages_completed_without_fetch),
            fetches_async: get(&self.fetches_async),
            fetches_paused: get(&self.fetches_paused),
            fetches_failed: get(&self.fetches_failed),
            fetches_on_read: get(&self.fetches_on_read),
            fetches_on_writeback: get(&self.fetches_on_writeback),
            reads_served_from_patches: get(&self.reads_served_from_patches),
            writer_waits: reasons.values().sum(),
            writer_wait_reasons: reasons,
        }
    }

    /// A patch of `bytes` joined (`+`) or left NVRAM.
    pub(crate) fn patch_added(&self, bytes: usize) {
        inc(&self.patches);
        self.patch_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    pub(crate) fn patch_removed(&self, bytes: usize) {
        dec(&self.patches);
        self.patch_bytes.fetch_sub(bytes as u64, Ordering::Relaxed);
    }

    pub(crate) fn patch_resized(&self, old: usize, new: usize) {
        self.patch_bytes.fetch_add(new as u64, Ordering::Relaxed);
        self.patch_bytes.fetch_sub(old as u64, Ordering::Relaxed);
    }
}
