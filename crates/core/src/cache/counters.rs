//! Counters of the page cache and of write-back (`nvstack stat --json`: `cache`, `writeback`).
//! Relaxed atomics: observations, not synchronisation.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{CacheConfig, REASONS};

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
