//! What the engine counts, and the `stat.json` document the FUSE front end serves: requests
//! and bytes by kind, the actuator's modeled busy time and positioning, the volatile cache,
//! the power state, and the flash model's and NVRAM cache's own counters when present.
//!
//! Counters only grow while the engine lives (a re-attach starts from zero); a snapshot is
//! taken under the engine's lock, so the document is consistent.

use serde::Serialize;

use super::Engine;
use super::Timing;
use super::power::{ArmedCut, Power};
use crate::cache::CutReport;
use crate::model::SECTOR_BYTES;
use crate::model::flash::FlashStats;
use crate::nvcache::{self, CacheMode};

/// Counters; everything `stat.json` reports.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct Counters {
    pub(crate) reads: u64,
    pub(crate) writes: u64,
    pub(crate) flushes: u64,
    pub(crate) discards: u64,
    pub(crate) bytes_read: u64,
    pub(crate) bytes_written: u64,
    pub(crate) bytes_discarded: u64,
    /// Writes that arrived after a power cut and went nowhere.
    pub(crate) writes_after_cut: u64,
}

/// The `stat.json` document.
#[derive(Debug, Clone, Serialize)]
pub struct Stats {
    pub(crate) model: String,
    pub(crate) timing: Timing,
    pub(crate) size_bytes: u64,
    /// Every request on the device file: reads + writes + flushes + discards.
    pub(crate) requests: u64,
    #[serde(flatten)]
    pub(crate) counters: Counters,
    /// Modeled busy time of the actuator.
    pub(crate) busy_ns: u64,
    pub(crate) busy_ms: f64,
    /// The modeled clock when the last request completed.
    pub(crate) clock_ns: u64,
    pub(crate) seek_distance_sectors: u64,
    /// Requests that needed positioning (seek and/or rotation).
    pub(crate) positionings: u64,
    pub(crate) volatile_bytes: u64,
    pub(crate) volatile_bytes_max: u64,
    pub(crate) forced_writeback_bytes: u64,
    pub(crate) flushed_bytes: u64,
    pub(crate) armed: Option<ArmedCut>,
    pub(crate) cut: Option<CutReport>,
    pub(crate) trace_records: u64,
    /// The flash model's NAND and FTL counters (`--model flash` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) flash: Option<FlashStats>,
    /// The NVRAM block cache's counters (`--nvram` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nvcache: Option<NvCacheStats>,
}

/// The `nvcache` object of `stat.json`. Units: sectors of 512 bytes unless named bytes.
#[derive(Debug, Clone, Serialize)]
pub struct NvCacheStats {
    pub(crate) mode: CacheMode,
    /// The file system the classifier recognized ("ext4", "fat16", "none", ...).
    pub(crate) filesystem: &'static str,
    pub(crate) region: String,
    pub(crate) capacity_sectors: u64,
    /// Sectors read from NVRAM.
    pub(crate) hits: u64,
    /// Sectors written into NVRAM.
    pub(crate) writes_absorbed: u64,
    /// Sectors that left NVRAM for the image.
    pub(crate) destaged: u64,
    pub(crate) bytes_resident: u64,
    pub sectors_resident: u64,
    /// Read requests served from NVRAM entirely (no model time).
    pub(crate) read_requests_hit: u64,
    /// Write requests absorbed entirely (no model time unless a destage was needed).
    pub(crate) write_requests_absorbed: u64,
    /// Write requests absorbed in part (the rest went to the volatile cache and the model).
    pub(crate) write_requests_partly_absorbed: u64,
    /// Volatile sectors moved into NVRAM when the classifier learned they are metadata
    /// (FAT: a directory cluster written before its directory was known).
    pub promoted: u64,
    #[serde(flatten)]
    pub(crate) cache: nvcache::Counters,
    pub(crate) resident_by_class: std::collections::BTreeMap<&'static str, u64>,
    /// Sectors found resident when the cache was opened (recovered from a previous run).
    pub recovered_sectors: u64,
    /// Unfinished transactions rolled back when the cache was opened.
    pub(crate) recovered_rollbacks: u32,
}

impl Engine {
    pub fn stats(&self) -> Stats {
        let c = self.counters.clone();
        #[allow(clippy::cast_precision_loss)]
        let busy_ms = self.actuator.busy_ns() as f64 / 1e6;
        Stats {
            model: self.actuator.model_name().to_string(),
            timing: self.timing,
            size_bytes: self.size_bytes(),
            requests: c.reads + c.writes + c.flushes + c.discards,
            counters: c,
            busy_ns: self.actuator.busy_ns(),
            busy_ms,
            clock_ns: self.actuator.busy_until_ns(),
            seek_distance_sectors: self.actuator.seek_distance_sectors(),
            positionings: self.actuator.positionings(),
            volatile_bytes: self.cache.held_bytes(),
            volatile_bytes_max: self.cache.held_bytes_max(),
            forced_writeback_bytes: self.cache.forced_writebacks_sectors * SECTOR_BYTES,
            flushed_bytes: self.cache.flushed_sectors * SECTOR_BYTES,
            armed: match &self.power {
                Power::Armed(a) => Some(*a),
                _ => None,
            },
            cut: match &self.power {
                Power::Off(r) => Some(r.clone()),
                _ => None,
            },
            trace_records: self.trace.as_ref().map_or(0, |t| t.records),
            flash: self.actuator.flash_stats(),
            nvcache: self.nv_stats(),
        }
    }
}
