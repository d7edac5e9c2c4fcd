//! The cache proper: a hash on LBN for lookup, the LRW (least recently written) order, the
//! free slots, and the four persistent operations, each built on `txn` transactions.
//!
//! Protocol (docs/nvcache.md section 3; failpoints of the crash sweep are the region's fences):
//!
//! | operation | steps | durable when |
//! |---|---|---|
//! | [`NvCache::absorb`] | (A1) while the chunk does not fit: destage the LRW sector (below); (A2) one transaction: per sector, snapshot its slot (data + entry) unless the slot lies in a frame allocated by this transaction, write data and entry (new seq); (A3) commit | A3: **the write is acknowledged only after it** |
//! | destage (full cache, shrink) | (D1) read and verify the slot; (D2) write the sector to the image through [`Backing::write_durable`]; (D3) one transaction zeroes the entry | D3; a crash between D2 and D3 leaves the sector resident with the bytes the image already holds: destaging it again writes the same bytes |
//! | [`NvCache::drain`] (device flush, detach) | per batch of up to 256 sectors in LBA order: D2 for each contiguous run, then one transaction zeroes their entries | per batch |
//! | [`NvCache::discard`] | one transaction per batch zeroes the entries (the caller zeroed the image first) | per batch |
//!
//! Invariants (checked by `open` and [`NvCache::check`]):
//! - **N1** every allocated frame of the region is a cache frame whose header verifies;
//! - **N2** every entry is free (64 zero bytes) or resident and verifies with its sector;
//! - **N3** no LBN is resident twice, and no sequence number is used twice;
//! - **N4** the volatile state mirrors the region: `index` holds exactly the resident entries,
//!   `lrw` maps their sequence numbers back to them, `free` holds exactly the free slots of
//!   allocated frames, and `index.len() <= capacity` after every operation;
//! - **N5** a resident sector is the newest copy of that sector on the device: the engine
//!   absorbs every write to a resident sector, and drops an older volatile copy when it absorbs.
//!
//! The volatile state is changed only after a transaction committed (strict two-phase locking
//! is trivial here: the engine's one mutex serializes every call), so an aborted transaction
//! leaves nothing to repair.

//!
//! Code: this file holds the volatile state (the fields that N4 ties to the region), lookups
//! and reads; `open.rs` sizing, creating and opening a region (recovery, binding to an image);
//! `verify.rs` reading a region without writing it (N1-N3 at open, `scan` for `nvstack
//! check`/`inspect`, [`NvCache::check`] for N4); `absorb.rs` A1-A3; `destage.rs` D1-D3, drain,
//! shrink and discard; `tests.rs` the unit tests.

mod absorb;
mod destage;
mod open;
#[cfg(test)]
mod tests;
mod verify;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;

use nvram::Area;
use serde::Serialize;
use txn::slots::{Run, SlotMap};
use txn::{FrameId, Pool, TxError};

use super::record::{self, Anchor, CacheMode, ENTRY_SIZE, Entry, SLOTS_PER_FRAME};
use crate::classify::Class;

pub use self::open::{format_params, open_file};
pub use self::verify::{ResidentSector, Scan, scan};

/// Most sectors one absorbing transaction writes (a larger write is absorbed in chunks).
pub(crate) const CHUNK_SECTORS: usize = 256;
/// Sectors per drain or discard transaction.
pub(crate) const BATCH_SECTORS: usize = 256;
/// Undo slots of a cache region (the engine runs one transaction at a time).
pub(crate) const UNDO_SLOTS: u32 = 2;
/// Bytes per undo slot: a chunk of `CHUNK_SECTORS` sectors, each snapshotting its slot
/// (32 + 512 bytes of record) and entry (32 + 64), plus one descriptor record (32 + 32) per
/// frame it allocates.
pub(crate) const UNDO_SLOT_BYTES: u64 = 256 << 10;
const CHUNK_UNDO_BYTES: u64 = CHUNK_SECTORS as u64 * (32 + 512 + 32 + 64)
    + (CHUNK_SECTORS as u64 / SLOTS_PER_FRAME as u64 + 2) * (32 + 32);
const _: () = assert!(CHUNK_UNDO_BYTES + 64 <= UNDO_SLOT_BYTES);
const _: () = assert!(32 + 4096 <= UNDO_SLOT_BYTES, "an anchor update fits a slot");
/// Fewest frames of a region (nvram's minimum).
const FRAMES_MIN: u64 = 16;

/// Where destaged sectors go: the image, durably. The engine's implementation writes the
/// image file past its volatile write cache and charges the device model.
pub trait Backing {
    /// Writes whole sectors `data` at sector `lba`; they are durable when this returns.
    fn write_durable(&mut self, lba: u64, data: &[u8]) -> io::Result<()>;
}

/// Errors of the cache.
#[derive(Debug, thiserror::Error)]
pub enum NvCacheError {
    /// The region is damaged (the area named), unreadable, or not a region.
    #[error("{0}")]
    Region(#[from] nvram::Error),
    /// The region cannot serve this request (another image's cache, too small, foreign data).
    #[error("{0}")]
    Refused(String),
    /// A transaction failed (undo log or frames exhausted: a sizing bug).
    #[error("NVRAM cache transaction failed: {0}")]
    Tx(#[from] TxError),
    /// Destaging to the image failed; the cache refuses writes until it is opened again.
    #[error("NVRAM cache: destage to the image failed: {0}")]
    Io(#[from] io::Error),
    /// An earlier failure stopped the cache.
    #[error("NVRAM cache stopped after an earlier failure ({0}); attach again to recover")]
    Failed(String),
}

/// Slots of a frame in the slot map: the header's (0) and the sectors' (1..=7).
pub(crate) const MAP_SLOTS: usize = SLOTS_PER_FRAME as usize + 1;

/// A slot: frame index and slot number (1..=7).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Slot {
    pub(crate) frame: u64,
    pub(crate) slot: u8,
}

#[derive(Clone, Copy, Debug)]
struct Resident {
    slot: Slot,
    seq: u64,
    class: Class,
}

/// What opening a cache found and did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct OpenReport {
    pub created: bool,
    pub(crate) rebound: bool,
    pub(crate) transactions_rolled_back: u32,
    pub(crate) sectors_recovered: u64,
    pub(crate) frames: u64,
}

/// Counters since open (`device stat --json`: `nvcache`).
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct Counters {
    /// Sectors written into NVRAM (new and rewritten).
    pub(crate) writes_absorbed: u64,
    /// Absorbed sectors that were resident already (rewritten in NVRAM).
    pub(crate) write_hits: u64,
    /// Sectors that left NVRAM for the image (full cache + drain + shrink).
    pub(crate) destaged: u64,
    /// Sectors destaged one at a time because the cache was full (the paper's LRW destage).
    pub(crate) destaged_full: u64,
    /// Sectors destaged by `device flush`, detach or a smaller capacity.
    pub(crate) destaged_drain: u64,
    /// Destage writes to the image (a drain writes contiguous runs as one).
    pub(crate) destage_writes: u64,
    /// Resident sectors dropped by discards.
    pub(crate) discarded: u64,
    /// Committed transactions (absorbs, destages, drains, discards).
    pub(crate) transactions: u64,
    /// Absorbed sectors by class.
    pub(crate) absorbed_by_class: BTreeMap<&'static str, u64>,
}

/// The NVRAM block cache. See the module docs.
#[derive(Debug)]
pub struct NvCache {
    pool: Pool,
    anchor: Anchor,
    /// Allocated cache frames.
    frames: BTreeSet<u64>,
    /// The slots of allocated frames (slot 0, the header, always taken; the one slot
    /// allocator's map, `txn::slots`); the lowest free one is used first (deterministic).
    free: SlotMap,
    /// The hash on LBN: resident sector -> its slot.
    index: HashMap<u64, Resident>,
    /// LRW order: sequence number -> LBN; the first is the least recently written.
    lrw: BTreeMap<u64, u64>,
    next_seq: u64,
    counters: Counters,
    failed: Option<String>,
}

impl NvCache {
    #[cfg(test)]
    pub(crate) fn anchor(&self) -> &Anchor {
        &self.anchor
    }
    pub(crate) fn mode(&self) -> CacheMode {
        self.anchor.mode
    }
    pub(crate) fn capacity_sectors(&self) -> u64 {
        self.anchor.capacity_sectors
    }
    pub fn resident_sectors(&self) -> u64 {
        self.index.len() as u64
    }
    pub(crate) fn counters(&self) -> &Counters {
        &self.counters
    }
    pub(crate) fn is_resident(&self, lbn: u64) -> bool {
        self.index.contains_key(&lbn)
    }
    #[cfg(test)]
    pub(crate) fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Resident sectors by class.
    pub(crate) fn resident_by_class(&self) -> BTreeMap<&'static str, u64> {
        let mut m = BTreeMap::new();
        for r in self.index.values() {
            *m.entry(r.class.name()).or_insert(0) += 1;
        }
        m
    }

    /// Resident LBNs in `[first, end)`, ascending (by lookup or by a scan of the hash,
    /// whichever is shorter: a discard of a whole device costs the resident count).
    pub(crate) fn resident_in(&self, first: u64, end: u64) -> Vec<u64> {
        let mut v: Vec<u64> = if end.saturating_sub(first) > self.index.len() as u64 {
            self.index.keys().copied().filter(|l| (first..end).contains(l)).collect()
        } else {
            (first..end).filter(|l| self.index.contains_key(l)).collect()
        };
        v.sort_unstable();
        v
    }

    /// The LBNs in LRW order (least recently written first).
    #[cfg(test)]
    pub(crate) fn lrw_order(&self) -> Vec<u64> {
        self.lrw.values().copied().collect()
    }

    fn ensure_running(&self) -> Result<(), NvCacheError> {
        match &self.failed {
            Some(why) => Err(NvCacheError::Failed(why.clone())),
            None => Ok(()),
        }
    }

    fn fail<T>(&mut self, e: NvCacheError) -> Result<T, NvCacheError> {
        if self.failed.is_none() {
            self.failed = Some(e.to_string());
        }
        Err(e)
    }

    /// The slot a slot-map run names.
    fn slot_of(run: Run) -> Slot {
        Slot { frame: run.frame.0, slot: run.slot as u8 }
    }

    /// The slot-map run of a slot.
    fn run_of(s: Slot) -> Run {
        Run { frame: txn::FrameId(s.frame), slot: usize::from(s.slot), slots: 1 }
    }

    fn slot_offsets(&self, s: Slot) -> (u64, u64) {
        let base = self.pool.frame_offset(FrameId(s.frame));
        (base + record::entry_offset(s.slot), base + record::data_offset(s.slot))
    }

    /// Reads and verifies resident sector `lbn` into `buf` (512 bytes). `Ok(false)` when it is
    /// not resident.
    pub fn read(&self, lbn: u64, buf: &mut [u8]) -> Result<bool, NvCacheError> {
        let Some(r) = self.index.get(&lbn) else { return Ok(false) };
        let (e, d) = self.slot_offsets(r.slot);
        self.pool.read(d, buf);
        let entry = self.pool.read_vec(e, ENTRY_SIZE);
        match Entry::decode(&entry, r.slot.frame, r.slot.slot, buf) {
            Ok(Some(got)) if got.lbn == lbn && got.seq == r.seq => Ok(true),
            Ok(_) => Err(nvram::Error::corrupt(
                Area::Frame(r.slot.frame),
                format!("slot {}: entry does not name sector {lbn} (N4)", r.slot.slot),
            )
            .into()),
            Err(why) => Err(nvram::Error::corrupt(
                Area::Frame(r.slot.frame),
                format!("slot {}: {why} (N2)", r.slot.slot),
            )
            .into()),
        }
    }

    /// Marks the region cleanly closed (clean detach).
    pub fn close(self) {
        self.pool.close();
    }
}
