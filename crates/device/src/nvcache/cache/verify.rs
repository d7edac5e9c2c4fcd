//! Reading a cache region without writing it: the verification that [`NvCache::open`] runs
//! before anything is served (N1-N3), [`scan`] for `nvstack check` and `inspect` (on a
//! copy-on-write view of a region that may be in use), and [`NvCache::check`], which also
//! compares the region with the volatile state (N4).
//!
//! Every entry is decoded with its sector (the checksum covers both), so a flipped bit in a
//! cached sector is reported with its frame and slot named, never served or destaged.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use nvram::Area;
use nvram::layout::FRAME_SIZE;
use serde::Serialize;
use txn::{FrameId, FrameTag, Pool};

use super::{MAP_SLOTS, NvCache, NvCacheError, Resident, Slot};
use crate::nvcache::record::{
    self, Anchor, CacheMode, ENTRY_SIZE, Entry, ImageId, KIND_FRAME, SECTOR, SLOTS_PER_FRAME,
};
use txn::slots::SlotMap;

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

/// The verified contents of the cache frames.
pub(super) struct FrameState {
    pub(super) frames: BTreeSet<u64>,
    pub(super) free: SlotMap,
    pub(super) index: HashMap<u64, Resident>,
    pub(super) lrw: BTreeMap<u64, u64>,
}

pub(super) fn read_frames(
    pool: &Pool,
    frames: &[(FrameId, FrameTag)],
    anchor: &Anchor,
) -> Result<FrameState, nvram::Error> {
    let image_sectors = anchor.image.size_bytes / SECTOR as u64;
    let mut st = FrameState {
        frames: BTreeSet::new(),
        free: SlotMap::new(MAP_SLOTS),
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
        // The header's slot (0) and every resident sector's: the frame's taken slots.
        let mut taken = 1u64;
        for slot in 1..=SLOTS_PER_FRAME {
            let e = record::entry_offset(slot) as usize;
            let d = record::data_offset(slot) as usize;
            let entry =
                Entry::decode(&bytes[e..e + ENTRY_SIZE], frame.0, slot, &bytes[d..d + SECTOR])
                    .map_err(|why| bad(format!("slot {slot}: {why} (N2)")))?;
            let here = Slot { frame: frame.0, slot };
            let Some(entry) = entry else { continue };
            taken |= 1 << slot;
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
        st.free.add_frame(frame, taken);
    }
    Ok(st)
}

impl NvCache {
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
}
