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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::path::Path;
use std::sync::Arc;

use nvram::layout::{FRAME_SIZE, UNDO_OFFSET};
use nvram::{Area, FormatParams, MmapOptions, MmapRegion, Region};
use serde::Serialize;
use txn::{Consistency, FrameId, FrameTag, Pool, RecoveryReport, TxError};

use super::record::{
    self, Anchor, CacheMode, ENTRY_SIZE, Entry, ImageId, KIND_FRAME, SECTOR, SLOTS_PER_FRAME,
};
use crate::classify::Class;

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

/// One resident sector, as `check` and `inspect` list it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ResidentSector {
    pub lbn: u64,
    pub seq: u64,
    pub class: &'static str,
    pub frame: u64,
    pub slot: u8,
}

/// What a region holds, read and verified without changing it.
#[derive(Clone, Debug, Serialize)]
pub struct Scan {
    pub mode: CacheMode,
    pub capacity_sectors: u64,
    pub image: ImageId,
    pub frames: u64,
    /// Resident sectors in LBN order.
    pub sectors: Vec<ResidentSector>,
}

impl Scan {
    pub fn by_class(&self) -> BTreeMap<&'static str, u64> {
        let mut m = BTreeMap::new();
        for s in &self.sectors {
            *m.entry(s.class).or_insert(0) += 1;
        }
        m
    }
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
pub struct Counters {
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

/// Bytes of a region for a cache of `capacity_sectors`.
pub fn format_params(capacity_sectors: u64) -> FormatParams {
    let frames = capacity_sectors.div_ceil(u64::from(SLOTS_PER_FRAME)).max(FRAMES_MIN);
    let desc_bytes = (frames * 32).div_ceil(4096) * 4096;
    FormatParams {
        region_size: UNDO_OFFSET
            + u64::from(UNDO_SLOTS) * UNDO_SLOT_BYTES
            + desc_bytes
            + frames * FRAME_SIZE,
        undo_slots: UNDO_SLOTS,
        undo_slot_size: UNDO_SLOT_BYTES,
    }
}

/// The region file at `path` with a cache for `image`: created (sized for
/// `capacity_sectors`) when missing, recovered when it exists. See [`NvCache::open`].
pub fn open_file(
    path: &Path,
    image: &ImageId,
    capacity_sectors: Option<u64>,
    mode: Option<CacheMode>,
) -> Result<(NvCache, OpenReport), NvCacheError> {
    let created = !path.exists();
    let region = if created {
        let capacity = capacity_sectors.ok_or_else(|| {
            NvCacheError::Refused(format!(
                "{} does not exist; --nvram-cache-size is needed to create it",
                path.display()
            ))
        })?;
        let params = format_params(capacity);
        MmapRegion::create(path, params.region_size)?;
        // Formatted and used through one open: closing and reopening would let a forked
        // child of another thread hold the lock in between.
        let region = MmapRegion::open(path, MmapOptions::default())?;
        Pool::format(&region, params)?;
        region
    } else {
        MmapRegion::open(path, MmapOptions::default())?
    };
    let region: Arc<dyn Region> = Arc::new(region);
    let (cache, mut report) = NvCache::open(region, image, capacity_sectors, mode)?;
    report.created = created;
    Ok((cache, report))
}

/// Reads the root area and every cache frame of an open pool, verifying N1-N3. `Ok(None)` when
/// the region holds no cache (no anchor and no cache frame). Nothing is written.
pub fn scan(pool: &Pool) -> Result<Option<Scan>, NvCacheError> {
    let (root_off, root_len) = pool.root_range();
    let root = pool.read_vec(root_off, root_len as usize);
    let frames = pool.allocated_frames()?;
    let has_cache_frames = frames.iter().any(|(_, t)| t.kind == KIND_FRAME);
    if !record::Anchor::is_anchor(&root) {
        if !has_cache_frames {
            return Ok(None);
        }
        return Err(
            nvram::Error::corrupt(Area::Root, "cache frames without a block-cache anchor").into()
        );
    }
    let anchor = Anchor::decode(&root).map_err(|e| nvram::Error::corrupt(Area::Root, e))?;
    let state = read_frames(pool, &frames, &anchor)?;
    let mut sectors: Vec<ResidentSector> = state
        .index
        .iter()
        .map(|(&lbn, r)| ResidentSector {
            lbn,
            seq: r.seq,
            class: r.class.name(),
            frame: r.slot.frame,
            slot: r.slot.slot,
        })
        .collect();
    sectors.sort_by_key(|s| s.lbn);
    Ok(Some(Scan {
        mode: anchor.mode,
        capacity_sectors: anchor.capacity_sectors,
        image: anchor.image,
        frames: state.frames.len() as u64,
        sectors,
    }))
}

/// The anchor of a region that holds a cache, `None` for an unused region; a region holding
/// anything else is refused.
fn existing_anchor(root: &[u8], frames_in_use: usize) -> Result<Option<Anchor>, NvCacheError> {
    if Anchor::is_anchor(root) {
        return Ok(Some(Anchor::decode(root).map_err(|e| nvram::Error::corrupt(Area::Root, e))?));
    }
    if root[..8] == *b"NVSBIND1" {
        return Err(NvCacheError::Refused(
            "the NVRAM region belongs to an nvstack mount (its root area binds a lower \
             directory); use another --nvram path for the block cache"
                .into(),
        ));
    }
    let root_used = root.iter().any(|&b| b != 0);
    if root_used || frames_in_use > 0 {
        return Err(NvCacheError::Refused(format!(
            "the NVRAM region holds other data ({frames_in_use} frames in use, root area {}); \
             use another --nvram path for the block cache",
            if root_used { "in use" } else { "empty" }
        )));
    }
    Ok(None)
}

/// The verified contents of the cache frames.
struct FrameState {
    frames: BTreeSet<u64>,
    free: BTreeSet<Slot>,
    index: HashMap<u64, Resident>,
    lrw: BTreeMap<u64, u64>,
}

fn read_frames(
    pool: &Pool,
    frames: &[(FrameId, FrameTag)],
    anchor: &Anchor,
) -> Result<FrameState, nvram::Error> {
    let image_sectors = anchor.image.size_bytes / SECTOR as u64;
    let mut st = FrameState {
        frames: BTreeSet::new(),
        free: BTreeSet::new(),
        index: HashMap::new(),
        lrw: BTreeMap::new(),
    };
    for &(frame, tag) in frames {
        let bad = |detail: String| nvram::Error::corrupt(Area::Frame(frame.0), detail);
        if tag.kind != KIND_FRAME {
            return Err(bad(format!("frame of kind {:#x} in a block-cache region (N1)", tag.kind)));
        }
        let bytes = pool.read_vec(pool.frame_offset(frame), FRAME_SIZE as usize);
        record::check_frame_header(frame.0, &bytes).map_err(|e| bad(format!("{e} (N1)")))?;
        st.frames.insert(frame.0);
        for slot in 1..=SLOTS_PER_FRAME {
            let e = record::entry_offset(slot) as usize;
            let d = record::data_offset(slot) as usize;
            let entry =
                Entry::decode(&bytes[e..e + ENTRY_SIZE], frame.0, slot, &bytes[d..d + SECTOR])
                    .map_err(|why| bad(format!("slot {slot}: {why} (N2)")))?;
            let here = Slot { frame: frame.0, slot };
            let Some(entry) = entry else {
                st.free.insert(here);
                continue;
            };
            if entry.lbn >= image_sectors {
                return Err(bad(format!(
                    "slot {slot}: sector {} beyond the image ({image_sectors} sectors)",
                    entry.lbn
                )));
            }
            if let Some(other) = st.index.get(&entry.lbn) {
                return Err(bad(format!(
                    "slot {slot}: sector {} is also cached in frame {} slot {} (N3)",
                    entry.lbn, other.slot.frame, other.slot.slot
                )));
            }
            if let Some(lbn) = st.lrw.insert(entry.seq, entry.lbn) {
                return Err(bad(format!(
                    "slot {slot}: sequence number {} also used by sector {lbn} (N3)",
                    entry.seq
                )));
            }
            st.index.insert(entry.lbn, Resident { slot: here, seq: entry.seq, class: entry.class });
        }
    }
    Ok(st)
}

/// The NVRAM block cache. See the module docs.
#[derive(Debug)]
pub struct NvCache {
    pool: Pool,
    anchor: Anchor,
    /// Allocated cache frames.
    frames: BTreeSet<u64>,
    /// Free slots of allocated frames; the lowest is used first (deterministic).
    free: BTreeSet<Slot>,
    /// The hash on LBN: resident sector -> its slot.
    index: HashMap<u64, Resident>,
    /// LRW order: sequence number -> LBN; the first is the least recently written.
    lrw: BTreeMap<u64, u64>,
    next_seq: u64,
    counters: Counters,
    failed: Option<String>,
}

impl NvCache {
    /// Opens the cache in `region`: recovery (`Pool::open` rolls back the unfinished
    /// transaction), then every frame verified (N1-N3) and the hash and LRW order rebuilt from
    /// the entries. A region without a cache becomes one bound to `image` (the root area must
    /// be unused and no frame allocated); a cache of another image is refused while it holds
    /// sectors (an empty one is bound again). `capacity_sectors` and `mode` default to the
    /// anchor's; a changed value is recorded. More resident sectors than the capacity are left
    /// for [`NvCache::shrink`].
    pub fn open(
        region: Arc<dyn Region>,
        image: &ImageId,
        capacity_sectors: Option<u64>,
        mode: Option<CacheMode>,
    ) -> Result<(NvCache, OpenReport), NvCacheError> {
        let (pool, recovery): (Pool, RecoveryReport) = Pool::open(region, Consistency::Undo)?;
        let (root_off, root_len) = pool.root_range();
        let root = pool.read_vec(root_off, root_len as usize);
        let frames = pool.allocated_frames()?;
        let slots_max = pool.layout().nr_frames * u64::from(SLOTS_PER_FRAME);
        let mut report = OpenReport {
            transactions_rolled_back: recovery.transactions_rolled_back,
            ..OpenReport::default()
        };
        let old = existing_anchor(&root, frames.len())?;
        let state = match &old {
            Some(a) => read_frames(&pool, &frames, a)?,
            None => FrameState {
                frames: BTreeSet::new(),
                free: BTreeSet::new(),
                index: HashMap::new(),
                lrw: BTreeMap::new(),
            },
        };
        if let Some(a) = &old {
            if !a.image.same_image(image) {
                if !state.index.is_empty() {
                    return Err(NvCacheError::Refused(format!(
                        "the NVRAM region holds {} cached sector(s) of image {} (device {:#x}, \
                         inode {}, {} bytes), not of {} (device {:#x}, inode {}, {} bytes): \
                         attach that image, or `nvstack device drain` it, before reusing the region",
                        state.index.len(),
                        a.image.path,
                        a.image.dev,
                        a.image.ino,
                        a.image.size_bytes,
                        image.path,
                        image.dev,
                        image.ino,
                        image.size_bytes
                    )));
                }
                report.rebound = true;
            }
        }
        let capacity =
            capacity_sectors.or(old.as_ref().map(|a| a.capacity_sectors)).ok_or_else(|| {
                NvCacheError::Refused("--nvram-cache-size is needed for a new cache".into())
            })?;
        if capacity == 0 || capacity > slots_max {
            return Err(NvCacheError::Refused(format!(
                "a cache of {capacity} sectors does not fit this NVRAM region: it holds at most \
                 {slots_max} sectors ({} frames of 7); choose a smaller --nvram-cache-size or \
                 another --nvram path",
                pool.layout().nr_frames
            )));
        }
        let anchor = Anchor {
            mode: mode.or(old.as_ref().map(|a| a.mode)).unwrap_or(CacheMode::Metadata),
            capacity_sectors: capacity,
            image: image.clone(),
        };
        let image_sectors = image.size_bytes / SECTOR as u64;
        if let Some((&lbn, _)) = state.index.iter().find(|&(&lbn, _)| lbn >= image_sectors) {
            return Err(NvCacheError::Refused(format!(
                "cached sector {lbn} lies beyond the image"
            )));
        }
        report.sectors_recovered = state.index.len() as u64;
        report.frames = state.frames.len() as u64;
        let next_seq = state.lrw.keys().next_back().map_or(1, |s| s + 1);
        let cache = NvCache {
            pool,
            anchor: anchor.clone(),
            frames: state.frames,
            free: state.free,
            index: state.index,
            lrw: state.lrw,
            next_seq,
            counters: Counters::default(),
            failed: None,
        };
        if old.as_ref() != Some(&anchor) {
            let enc = anchor.encode();
            let mut tx = cache.pool.begin();
            let len = (enc.len().max(old.as_ref().map_or(0, |a| a.encode().len()))) as u64;
            tx.snapshot(root_off, len)?;
            let mut bytes = enc;
            bytes.resize(len as usize, 0);
            tx.write(root_off, &bytes);
            tx.commit();
        }
        debug_assert!(cache.check().is_ok());
        Ok((cache, report))
    }

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

    /// Absorbs whole sectors `(lbn, 512 bytes, class)` (distinct LBNs): durable when this
    /// returns. Chunks of at most `CHUNK_SECTORS` (and at most the capacity) are one
    /// transaction each; LRW sectors are destaged one at a time first while a chunk does not
    /// fit (the paper's destage).
    pub fn absorb(
        &mut self,
        sectors: &[(u64, &[u8], Class)],
        backing: &mut dyn Backing,
    ) -> Result<(), NvCacheError> {
        self.ensure_running()?;
        let chunk_len = CHUNK_SECTORS.min(self.anchor.capacity_sectors as usize).max(1);
        for chunk in sectors.chunks(chunk_len) {
            self.make_room(chunk, backing)?;
            if let Err(e) = self.absorb_chunk(chunk) {
                return self.fail(e);
            }
        }
        Ok(())
    }

    /// A1: destage LRW sectors (not of this chunk, when possible) until the chunk fits.
    fn make_room(
        &mut self,
        chunk: &[(u64, &[u8], Class)],
        backing: &mut dyn Backing,
    ) -> Result<(), NvCacheError> {
        let lbns: BTreeSet<u64> = chunk.iter().map(|s| s.0).collect();
        assert_eq!(lbns.len(), chunk.len(), "absorb of one sector twice in a chunk");
        loop {
            let new = lbns.iter().filter(|l| !self.index.contains_key(l)).count() as u64;
            if self.index.len() as u64 + new <= self.anchor.capacity_sectors {
                return Ok(());
            }
            let victim = self
                .lrw
                .values()
                .copied()
                .find(|l| !lbns.contains(l))
                .or_else(|| self.lrw.values().next().copied())
                .expect("a full cache has a least recently written sector");
            self.destage(&[victim], backing, false)?;
        }
    }

    /// A2-A3.
    fn absorb_chunk(&mut self, chunk: &[(u64, &[u8], Class)]) -> Result<(), NvCacheError> {
        let mut tx = self.pool.begin();
        let mut free = self.free.clone();
        let mut fresh: BTreeSet<u64> = BTreeSet::new();
        let mut placed: Vec<(u64, Slot, u64, Class)> = Vec::with_capacity(chunk.len());
        for (i, &(lbn, data, class)) in chunk.iter().enumerate() {
            assert_eq!(data.len(), SECTOR, "absorb of a partial sector");
            let seq = self.next_seq + i as u64;
            let slot = if let Some(r) = self.index.get(&lbn) {
                r.slot
            } else if let Some(s) = free.pop_first() {
                s
            } else {
                let frame = tx.alloc_frame(FrameTag { kind: KIND_FRAME, owner: 0, index: 0 })?;
                let base = self.pool.frame_offset(frame);
                tx.write(base, &record::encode_frame_header(frame.0));
                // The header slot's entries start free (F3: a fresh frame needs no snapshot).
                tx.write(base + record::FRAME_HEADER_SIZE as u64, &[0u8; ENTRY_SIZE * 7]);
                fresh.insert(frame.0);
                for s in 2..=SLOTS_PER_FRAME {
                    free.insert(Slot { frame: frame.0, slot: s });
                }
                Slot { frame: frame.0, slot: 1 }
            };
            let (e, d) = self.slot_offsets(slot);
            if !fresh.contains(&slot.frame) {
                tx.snapshot(d, SECTOR as u64)?;
                tx.snapshot(e, ENTRY_SIZE as u64)?;
            }
            tx.write(d, data);
            tx.write(e, &Entry { lbn, seq, class }.encode(slot.frame, slot.slot, data));
            placed.push((lbn, slot, seq, class));
        }
        tx.commit(); // THE COMMIT POINT: the chunk is durable; the write may be acknowledged.
        self.free = free;
        self.frames.extend(fresh);
        self.next_seq += chunk.len() as u64;
        let c = &mut self.counters;
        c.transactions += 1;
        for (lbn, slot, seq, class) in placed {
            if let Some(old) = self.index.insert(lbn, Resident { slot, seq, class }) {
                self.lrw.remove(&old.seq);
                c.write_hits += 1;
            }
            self.lrw.insert(seq, lbn);
            c.writes_absorbed += 1;
            *c.absorbed_by_class.entry(class.name()).or_insert(0) += 1;
        }
        debug_assert!(self.index.len() as u64 <= self.anchor.capacity_sectors);
        Ok(())
    }

    /// D1-D3 for `lbns` (resident): their bytes to the image, contiguous runs as one write,
    /// then one transaction frees their slots.
    fn destage(
        &mut self,
        lbns: &[u64],
        backing: &mut dyn Backing,
        drain: bool,
    ) -> Result<(), NvCacheError> {
        self.ensure_running()?;
        let mut sorted: Vec<u64> = lbns.to_vec();
        sorted.sort_unstable();
        let mut run: Vec<u8> = Vec::new();
        let mut run_start = 0;
        let mut buf = [0u8; SECTOR];
        let mut writes = 0;
        for (i, &lbn) in sorted.iter().enumerate() {
            // D1: a damaged slot is never written to the image.
            match self.read(lbn, &mut buf) {
                Ok(found) => assert!(found, "destage of sector {lbn}, which is not resident"),
                Err(e) => return self.fail(e),
            }
            if run.is_empty() {
                run_start = lbn;
            }
            run.extend_from_slice(&buf);
            let next_contiguous = sorted.get(i + 1) == Some(&(lbn + 1));
            if !next_contiguous {
                // D2: durable on the image before the slot is freed.
                if let Err(e) = backing.write_durable(run_start, &run) {
                    return self.fail(e.into());
                }
                writes += 1;
                run.clear();
            }
        }
        // D3.
        let mut tx = self.pool.begin();
        for lbn in &sorted {
            let (e, _) = self.slot_offsets(self.index[lbn].slot);
            if let Err(err) = tx.update(e, &[0u8; ENTRY_SIZE]) {
                drop(tx);
                return self.fail(err.into());
            }
        }
        tx.commit();
        self.forget(&sorted);
        let c = &mut self.counters;
        c.transactions += 1;
        c.destaged += sorted.len() as u64;
        c.destage_writes += writes;
        if drain {
            c.destaged_drain += sorted.len() as u64;
        } else {
            c.destaged_full += sorted.len() as u64;
        }
        Ok(())
    }

    /// Volatile side of freeing: after the freeing transaction committed.
    fn forget(&mut self, lbns: &[u64]) {
        for lbn in lbns {
            let r = self.index.remove(lbn).expect("forget of a resident sector");
            self.lrw.remove(&r.seq);
            self.free.insert(r.slot);
        }
    }

    /// Destages every resident sector (device flush, clean detach): batches of
    /// `BATCH_SECTORS` in LBA order. Returns the number destaged.
    pub fn drain(&mut self, backing: &mut dyn Backing) -> Result<u64, NvCacheError> {
        let mut all: Vec<u64> = self.index.keys().copied().collect();
        all.sort_unstable();
        for batch in all.chunks(BATCH_SECTORS) {
            self.destage(batch, backing, true)?;
        }
        Ok(all.len() as u64)
    }

    /// Destages LRW sectors until at most `capacity_sectors` are resident (after a re-attach
    /// with a smaller `--nvram-cache-size`).
    pub(crate) fn shrink(&mut self, backing: &mut dyn Backing) -> Result<u64, NvCacheError> {
        let mut n = 0;
        while self.index.len() as u64 > self.anchor.capacity_sectors {
            let victim = *self.lrw.values().next().expect("resident sectors");
            self.destage(&[victim], backing, true)?;
            n += 1;
        }
        Ok(n)
    }

    /// Drops resident sectors `lbns` without writing them (a discard: the caller zeroed the
    /// image range first). Non-resident LBNs are ignored.
    pub fn discard(&mut self, lbns: &[u64]) -> Result<u64, NvCacheError> {
        self.ensure_running()?;
        let resident: Vec<u64> =
            lbns.iter().copied().filter(|l| self.index.contains_key(l)).collect();
        for batch in resident.chunks(BATCH_SECTORS) {
            let mut tx = self.pool.begin();
            for lbn in batch {
                let (e, _) = self.slot_offsets(self.index[lbn].slot);
                if let Err(err) = tx.update(e, &[0u8; ENTRY_SIZE]) {
                    drop(tx);
                    return self.fail(err.into());
                }
            }
            tx.commit();
            self.forget(batch);
            self.counters.transactions += 1;
            self.counters.discarded += batch.len() as u64;
        }
        Ok(resident.len() as u64)
    }

    /// Verifies the region against the volatile state (N1-N4). For tests and debug builds.
    pub fn check(&self) -> Result<(), String> {
        let frames = self.pool.allocated_frames().map_err(|e| e.to_string())?;
        let st = read_frames(&self.pool, &frames, &self.anchor).map_err(|e| e.to_string())?;
        if st.frames != self.frames || st.free != self.free {
            return Err("frames or free slots differ from the region".into());
        }
        if st.index.len() != self.index.len() || st.lrw != self.lrw {
            return Err("resident sectors or LRW order differ from the region".into());
        }
        for (lbn, r) in &st.index {
            let mine = self.index.get(lbn).ok_or(format!("sector {lbn} not indexed"))?;
            if mine.slot != r.slot || mine.seq != r.seq {
                return Err(format!("sector {lbn}: index differs from the region"));
            }
        }
        if self.lrw.keys().next_back().is_some_and(|&s| s >= self.next_seq) {
            return Err("a sequence number at or beyond next_seq".into());
        }
        Ok(())
    }

    /// Marks the region cleanly closed (clean detach).
    pub fn close(self) {
        self.pool.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvram::SimRegion;

    /// The image as a destage target: sectors in memory, every write remembered.
    #[derive(Debug, Default)]
    struct Mem {
        image: Vec<u8>,
        writes: Vec<(u64, u64)>,
    }

    impl Backing for Mem {
        fn write_durable(&mut self, lba: u64, data: &[u8]) -> io::Result<()> {
            let at = lba as usize * SECTOR;
            self.image[at..at + data.len()].copy_from_slice(data);
            self.writes.push((lba, (data.len() / SECTOR) as u64));
            Ok(())
        }
    }

    const IMAGE_SECTORS: u64 = 4096;

    fn image() -> ImageId {
        ImageId { size_bytes: IMAGE_SECTORS * 512, dev: 1, ino: 2, path: "/img".into() }
    }

    fn region(capacity: u64) -> Arc<SimRegion> {
        let params = format_params(capacity);
        let r = Arc::new(SimRegion::new(params.region_size));
        Pool::format(&*r, params).unwrap();
        r
    }

    fn open(r: &Arc<SimRegion>, capacity: Option<u64>) -> NvCache {
        let dynr: Arc<dyn Region> = r.clone();
        NvCache::open(dynr, &image(), capacity, None).unwrap().0
    }

    fn sector(v: u8) -> Vec<u8> {
        vec![v; SECTOR]
    }

    fn absorb(c: &mut NvCache, m: &mut Mem, items: &[(u64, u8)]) {
        let data: Vec<(u64, Vec<u8>)> = items.iter().map(|&(l, v)| (l, sector(v))).collect();
        let list: Vec<(u64, &[u8], Class)> =
            data.iter().map(|(l, d)| (*l, &d[..], Class::ExtInodeTable)).collect();
        c.absorb(&list, m).unwrap();
        c.check().unwrap();
    }

    fn read(c: &NvCache, lbn: u64) -> Option<u8> {
        let mut buf = [0u8; SECTOR];
        c.read(lbn, &mut buf).unwrap().then(|| {
            assert!(buf.iter().all(|&b| b == buf[0]));
            buf[0]
        })
    }

    #[test]
    fn lookup_rewrite_and_the_lrw_order() {
        let r = region(64);
        let mut c = open(&r, Some(64));
        let mut m = Mem { image: vec![0; IMAGE_SECTORS as usize * SECTOR], ..Mem::default() };
        absorb(&mut c, &mut m, &[(10, 1), (20, 2), (30, 3)]);
        assert_eq!((read(&c, 10), read(&c, 20), read(&c, 11)), (Some(1), Some(2), None));
        assert_eq!(c.lrw_order(), vec![10, 20, 30]);
        absorb(&mut c, &mut m, &[(10, 9)]);
        assert_eq!(read(&c, 10), Some(9));
        assert_eq!(c.lrw_order(), vec![20, 30, 10], "a rewrite makes the sector most recent");
        assert_eq!((c.counters().writes_absorbed, c.counters().write_hits), (4, 1));
        assert!(m.writes.is_empty(), "nothing reached the image");
    }

    #[test]
    fn a_full_cache_destages_one_lrw_sector_per_new_sector() {
        let r = region(3);
        let mut c = open(&r, Some(3));
        let mut m = Mem { image: vec![0; IMAGE_SECTORS as usize * SECTOR], ..Mem::default() };
        absorb(&mut c, &mut m, &[(1, 1), (2, 2), (3, 3)]);
        absorb(&mut c, &mut m, &[(1, 11)]);
        assert!(m.writes.is_empty(), "a rewrite needs no room");
        absorb(&mut c, &mut m, &[(4, 4)]);
        assert_eq!(m.writes, vec![(2, 1)], "exactly the least recently written sector");
        assert_eq!(m.image[2 * SECTOR], 2);
        assert_eq!(c.lrw_order(), vec![3, 1, 4]);
        assert_eq!(read(&c, 2), None);
        // A write larger than the whole cache: absorbed chunk by chunk, never an error.
        absorb(&mut c, &mut m, &[(100, 5), (101, 6), (102, 7), (103, 8), (104, 9)]);
        assert_eq!(c.resident_sectors(), 3);
        assert_eq!(c.lrw_order(), vec![102, 103, 104]);
        for (lbn, v) in [(1, 11), (3, 3), (4, 4), (100, 5), (101, 6)] {
            assert_eq!(m.image[lbn * SECTOR], v, "sector {lbn} destaged with its newest content");
        }
        assert_eq!(c.counters().destaged_full, 6);
    }

    #[test]
    fn reopen_restores_contents_and_lrw_order() {
        let r = region(20);
        let mut m = Mem { image: vec![0; IMAGE_SECTORS as usize * SECTOR], ..Mem::default() };
        {
            let mut c = open(&r, Some(20));
            absorb(
                &mut c,
                &mut m,
                &[(7, 7), (5, 5), (9, 9), (1, 1), (2, 2), (3, 3), (4, 4), (8, 8)],
            );
            absorb(&mut c, &mut m, &[(5, 55)]);
            // Dropped without close: a crash of the process after the last commit.
        }
        let again = Arc::new(SimRegion::from_image(r.crash_image(nvram::CrashMode::DropAll)));
        let c = open(&again, None);
        assert_eq!(c.capacity_sectors(), 20, "capacity from the anchor");
        assert_eq!(c.lrw_order(), vec![7, 9, 1, 2, 3, 4, 8, 5]);
        assert_eq!(read(&c, 5), Some(55));
        c.check().unwrap();
    }

    #[test]
    fn drain_writes_runs_in_lba_order_and_empties_the_cache() {
        let r = region(16);
        let mut c = open(&r, Some(16));
        let mut m = Mem { image: vec![0; IMAGE_SECTORS as usize * SECTOR], ..Mem::default() };
        absorb(&mut c, &mut m, &[(12, 1), (10, 2), (11, 3), (40, 4), (13, 5)]);
        assert_eq!(c.drain(&mut m).unwrap(), 5);
        assert_eq!(m.writes, vec![(10, 4), (40, 1)]);
        assert_eq!(c.resident_sectors(), 0);
        assert_eq!(c.counters().destaged_drain, 5);
        c.check().unwrap();
    }

    #[test]
    fn another_image_is_refused_while_sectors_are_resident() {
        let r = region(8);
        let mut c = open(&r, Some(8));
        let mut m = Mem { image: vec![0; IMAGE_SECTORS as usize * SECTOR], ..Mem::default() };
        absorb(&mut c, &mut m, &[(1, 1)]);
        drop(c);
        let other = ImageId { ino: 3, ..image() };
        let dynr: Arc<dyn Region> = r.clone();
        let e = NvCache::open(dynr, &other, None, None).unwrap_err();
        assert!(e.to_string().contains("holds 1 cached sector(s) of image /img"), "{e}");
        let mut c = open(&r, None);
        c.drain(&mut m).unwrap();
        drop(c);
        let dynr: Arc<dyn Region> = r.clone();
        let (c, report) = NvCache::open(dynr, &other, None, None).unwrap();
        assert!(report.rebound && c.anchor().image.ino == 3);
        // A region too small for the capacity asked.
        drop(c);
        let dynr: Arc<dyn Region> = r.clone();
        let e = NvCache::open(dynr, &other, Some(10_000), None).unwrap_err();
        assert!(e.to_string().contains("does not fit this NVRAM region"), "{e}");
    }

    #[test]
    fn damage_is_reported_with_the_place_named() {
        let r = region(8);
        let mut c = open(&r, Some(8));
        let mut m = Mem { image: vec![0; IMAGE_SECTORS as usize * SECTOR], ..Mem::default() };
        absorb(&mut c, &mut m, &[(1, 1), (2, 2)]);
        let frame = c.index[&2].slot.frame;
        let data_at = c.slot_offsets(c.index[&2].slot).1;
        drop(c);
        let flipped = SimRegion::from_image(r.current());
        flipped.flip_bit(data_at + 100, 3);
        let dynr: Arc<dyn Region> = Arc::new(flipped);
        let e = NvCache::open(dynr, &image(), None, None).unwrap_err();
        assert!(e.to_string().contains(&format!("frame {frame}")), "{e}");
        assert!(e.to_string().contains("checksum"), "{e}");
        let flipped = SimRegion::from_image(r.current());
        flipped.flip_bit(8192 + 20, 0);
        let dynr: Arc<dyn Region> = Arc::new(flipped);
        let e = NvCache::open(dynr, &image(), None, None).unwrap_err();
        assert!(e.to_string().contains("root area"), "{e}");
    }

    #[test]
    fn discard_frees_without_writing() {
        let r = region(8);
        let mut c = open(&r, Some(8));
        let mut m = Mem { image: vec![0; IMAGE_SECTORS as usize * SECTOR], ..Mem::default() };
        absorb(&mut c, &mut m, &[(1, 1), (2, 2), (3, 3)]);
        assert_eq!(c.resident_in(2, 5), vec![2, 3]);
        assert_eq!(c.resident_in(0, u64::MAX), vec![1, 2, 3], "by a scan of the hash");
        assert_eq!(c.discard(&[2, 3, 4]).unwrap(), 2);
        assert_eq!(c.lrw_order(), vec![1]);
        assert!(m.writes.is_empty());
        c.check().unwrap();
    }

    #[test]
    fn scan_lists_resident_sectors_and_ignores_other_regions() {
        let r = region(8);
        let mut c = open(&r, Some(8));
        let mut m = Mem { image: vec![0; IMAGE_SECTORS as usize * SECTOR], ..Mem::default() };
        absorb(&mut c, &mut m, &[(9, 1), (3, 2)]);
        let s = scan(c.pool()).unwrap().unwrap();
        assert_eq!(s.sectors.iter().map(|s| s.lbn).collect::<Vec<_>>(), vec![3, 9]);
        assert_eq!(s.by_class()["ext.inode_table"], 2);
        let plain = region(8);
        let dynr: Arc<dyn Region> = plain;
        let (pool, _) = Pool::open(dynr, Consistency::Undo).unwrap();
        assert!(scan(&pool).unwrap().is_none());
    }
}
