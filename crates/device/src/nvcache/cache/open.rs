//! Sizing, creating and opening a cache region: [`format_params`] sizes a region for a
//! capacity, [`open_file`] creates (formats) or opens the region file, and [`NvCache::open`]
//! recovers it and binds it to an image.
//!
//! Opening is recovery: `Pool::open` rolls back the transaction a crash left unfinished,
//! `verify::read_frames` checks N1-N3 on every frame and rebuilds the hash and the LRW order,
//! and only then is the anchor (mode, capacity, image) rewritten, in one transaction and only
//! if it changed. A region that holds anything but a block cache is refused, and so is a cache
//! holding sectors of another image (they would be lost or written into the wrong image).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::Arc;

use nvram::layout::{FRAME_SIZE, UNDO_OFFSET};
use nvram::{Area, FormatParams, MmapOptions, MmapRegion, Region};
use txn::slots::SlotMap;
use txn::{Consistency, Pool, RecoveryReport};

use super::verify::{FrameState, read_frames};
use super::{
    Counters, FRAMES_MIN, MAP_SLOTS, NvCache, NvCacheError, OpenReport, UNDO_SLOT_BYTES, UNDO_SLOTS,
};
use crate::nvcache::record::{Anchor, CacheMode, ImageId, SECTOR, SLOTS_PER_FRAME};

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

impl NvCache {
    /// Opens the cache in `region`: recovery (`Pool::open` rolls back the unfinished
    /// transaction), then every frame verified (N1-N3) and the hash and LRW order rebuilt from
    /// the entries. A region without a cache becomes one bound to `image` (the root area must
    /// be unused and no frame allocated); a cache of another image is refused while it holds
    /// sectors (an empty one is bound again). `capacity_sectors` and `mode` default to the
    /// anchor's; a changed value is recorded. More resident sectors than the capacity are left
    /// for `NvCache::shrink`.
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
                free: SlotMap::new(MAP_SLOTS),
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
}
