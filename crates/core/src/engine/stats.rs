//! `nvstack stat`: every mechanism's counters in one snapshot (the JSON contract of
//! `nvstack stat --json`: field names are kept).

use std::collections::BTreeMap;

use lower::LowerFs;

use super::Engine;
use crate::base::counters::{ByteCounts, RequestStats};

/// A snapshot of the counters, for `nvstack stat`.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Stats {
    pub requests: BTreeMap<&'static str, u64>,
    /// Requests answered with an error, by operation (each request counted once).
    pub errors: BTreeMap<&'static str, u64>,
    /// Internal attempts that aborted and were tried again (not requests, not answers):
    /// `write` = write attempts that found NVRAM full (`Counters::write_retries`).
    pub retries: BTreeMap<&'static str, u64>,
    /// Failures the engine survived and said on stderr, by kind (`base/incidents.rs`), every
    /// kind listed (zeros included).
    pub incidents: BTreeMap<&'static str, u64>,
    pub app: ByteCounts,
    pub lower: ByteCounts,
    pub inodes: u64,
    pub open_handles: u64,
    /// How the nodes the kernel knows hold their lower descriptors.
    pub lower_nodes: lower::NodeStats,
    pub nvram: NvramStats,
    pub tempfiles: crate::tempfs::TempStats,
    pub cache: crate::cache::counters::CacheStats,
    pub writeback: crate::cache::counters::WritebackStats,
    pub fsync: crate::base::durability::FsyncStats,
    pub journal: crate::journal::JournalStats,
    pub nbw: crate::cache::counters::NbwStats,
    pub passthrough: crate::route::RouteStats,
    /// The direct path (docs/direct-path.md).
    pub direct: crate::direct::DirectStats,
}

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct NvramStats {
    pub frames_total: u64,
    pub frames_used: u64,
    pub frames_free: u64,
    pub undo_bytes_max: u64,
    pub undo_slots: u32,
    pub undo_slots_in_use: u32,
    pub transactions_committed: u64,
    pub transactions_aborted: u64,
    pub persist_mode: String,
    pub consistency: String,
}

impl<L: LowerFs> Engine<L> {
    /// Every counter, for `nvstack stat`.
    pub fn stats(&self) -> Stats {
        let b = &self.base;
        let RequestStats { requests, errors, retries, app, lower } = b.counters.snapshot();
        let mut stats = Stats { requests, errors, retries, app, lower, ..Stats::default() };
        stats.incidents = b.incidents.snapshot().into_iter().collect();
        let pool = b.pool.stats();
        stats.inodes = self.temp.nodes.len() as u64;
        stats.open_handles = self.temp.handles.len() as u64;
        stats.lower_nodes = b.lower.node_stats();
        stats.nvram = NvramStats {
            frames_total: pool.frames_total,
            frames_used: pool.frames_total - pool.frames_free,
            frames_free: pool.frames_free,
            undo_bytes_max: pool.undo_bytes_max,
            undo_slots: pool.undo_slots,
            undo_slots_in_use: pool.undo_slots_in_use,
            transactions_committed: pool.transactions_committed,
            transactions_aborted: pool.transactions_aborted,
            persist_mode: pool
                .persist_mode
                .map(|m| format!("{m:?}").to_lowercase())
                .unwrap_or_default(),
            consistency: format!("{:?}", b.pool.consistency()).to_lowercase(),
        };
        stats.tempfiles = self.temp.stats(b.space.files());
        (stats.cache, stats.writeback) = self.cache.stats();
        stats.fsync = b.fsync_stats();
        stats.nbw = self.cache.nbw_stats();
        stats.journal = self.journal.stats(pool.journal);
        stats.passthrough = self.routes.stats();
        stats.direct = self.direct_stats();
        stats
    }
}
