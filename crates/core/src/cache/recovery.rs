//! The page cache's part of recovery: finding every cached-file record and dirty page in the
//! region (`scan`, also used by `nvstack check` and `inspect`), and rebuilding the volatile
//! mirror at mount (`PageCache::rebuild_cache`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use lower::{Errno, LowerFs};
use txn::FrameId;

use super::PAGE;
use super::PageCache;
use super::patch::{self, KIND_PATCH_V1, KIND_PATCHES, Patch};
use super::patchframe::{PatchFrames, Place};
use super::policy::{Loc, PageKey};
use super::record::{self, Record};
use super::state::{self, PageMeta};
use crate::base::Base;
use crate::base::counters::Counters;
use crate::base::error::StartError;
use crate::base::slots;

/// One cached file found in the region (at mount, by `check` and `inspect`).
#[derive(Debug)]
pub struct Found {
    /// Where its record is.
    pub record: slots::Place,
    pub rec: Record,
    pub pages: BTreeMap<u64, FrameId>,
    /// Patched pages (non-blocking writes): where the patch lies, and the patch.
    pub patches: BTreeMap<u64, (Place, Patch)>,
}

/// Reads every cached-file record, dirty page and patch of the region (after recovery rolled
/// back unfinished transactions) and checks C1-C3, P4 and P5. Damage is reported with the
/// frame named.
pub fn scan(pool: &txn::Pool) -> Result<Vec<Found>, nvram::Error> {
    scan_all(pool).map(|(found, _)| found)
}

/// [`scan`], with every record frame and its taken slots (bit i: slot i), empty ones too.
pub(crate) fn scan_all(pool: &txn::Pool) -> Result<(Vec<Found>, slots::FramesFound), nvram::Error> {
    // By the owner their page and patch frames name (`Place::owner`).
    let mut records: BTreeMap<u64, Found> = BTreeMap::new();
    let mut record_frames = Vec::new();
    let mut pages = Vec::new();
    let found = |record: slots::Place, rec| {
        let (pages, patches) = (BTreeMap::new(), BTreeMap::new());
        (record.owner(), Found { record, rec, pages, patches })
    };
    for (frame, tag) in pool.allocated_frames()? {
        let corrupt = |what| nvram::Error::corrupt(nvram::Area::Frame(frame.0), what);
        match tag.kind {
            record::KIND_RECORD => {
                let record = slots::Place::whole(frame);
                let b = pool.read_vec(record.offset(pool), record::RECORD_SIZE);
                let rec = Record::decode(&b).map_err(|what| slots::damaged(record, what))?;
                let (owner, f) = found(record, rec);
                records.insert(owner, f);
            }
            record::KIND_RECORDS => {
                let in_frame = slots::read_frame(pool, frame, record::RECORD_SIZE)?;
                record_frames.push((frame, slots::taken(&in_frame)));
                for (record, b) in in_frame {
                    let rec = Record::decode(&b).map_err(|what| slots::damaged(record, what))?;
                    let (owner, f) = found(record, rec);
                    records.insert(owner, f);
                }
            }
            record::KIND_PAGE | KIND_PATCHES => pages.push((frame, tag)),
            KIND_PATCH_V1 => {
                return Err(corrupt(
                    "a patch of the unpacked format (0x5043_0003, nvstack before packed patches): \
                     mount this region with the nvstack that wrote it and unmount it (write-back \
                     empties the cache), then use this one",
                ));
            }
            _ => {}
        }
    }
    for (frame, tag) in pages {
        let corrupt = |what| nvram::Error::corrupt(nvram::Area::Frame(frame.0), what);
        let Some(found) = records.get_mut(&tag.owner) else {
            return Err(corrupt("cached page whose owner is not a cached-file record (C2)"));
        };
        let pages = found.rec.size.div_ceil(PAGE);
        if tag.kind == KIND_PATCHES {
            let b = pool.read_vec(pool.frame_offset(frame), PAGE as usize);
            let in_slot = |slot: usize, what: &str| {
                nvram::Error::corrupt(nvram::Area::Frame(frame.0), format!("slot {slot}: {what}"))
            };
            let patches = patch::decode_frame(&b).map_err(|(slot, what)| in_slot(slot, what))?;
            for (slot, p) in patches {
                let corrupt = |what| in_slot(slot, what);
                let end = p.ranges.last().map_or(0, |&(o, n)| u64::from(o) + u64::from(n));
                if p.page >= pages || p.page * PAGE + end > found.rec.size {
                    return Err(corrupt("patch reaching beyond the file size (P5)"));
                }
                if found.pages.contains_key(&p.page) || found.patches.contains_key(&p.page) {
                    return Err(corrupt("two frames for one cached page"));
                }
                let place = Place { frame, slot, slots: p.slots() };
                found.patches.insert(p.page, (place, p));
            }
            continue;
        }
        if tag.index >= pages {
            return Err(corrupt("cached page beyond the file size (C3)"));
        }
        if found.pages.contains_key(&tag.index) || found.patches.contains_key(&tag.index) {
            return Err(corrupt("two frames for one cached page"));
        }
        found.pages.insert(tag.index, frame);
    }
    Ok((records.into_values().collect(), record_frames))
}

impl<L: LowerFs> PageCache<L> {
    /// At start: the cached files of the region, found again by their handles. A record of a
    /// file that no longer exists (deleted while dirty, before its pages were dropped) is
    /// freed with its pages.
    pub(crate) fn rebuild_cache(&self, b: &Base<L>) -> Result<(), StartError> {
        let (found, record_frames) = scan_all(&b.pool)?;
        {
            // T6: every record frame listed with its records' slots; empty ones beyond the
            // one kept as room (a crash can leave several) freed.
            let mut list = self.slots.lock();
            *list = slots::RecordSlots::default();
            for &(frame, taken) in &record_frames {
                list.add_frame(frame, taken);
            }
            for _ in found.iter().filter(|f| f.record.slot == slots::WHOLE) {
                list.add_whole(); // released like any record when its file goes
            }
        }
        b.free_empty_slots(&self.slots, 1).map_err(StartError::RecordFrames)?;
        let now = b.lower.now().0;
        let mut next_serial = 1;
        for Found { record, rec, pages: mut frames, patches } in found {
            let object = record.owner();
            let mut patched = BTreeMap::new();
            let mut places = Vec::new();
            for (index, (place, patch)) in patches {
                frames.insert(index, place.frame);
                patched.insert(index, patch);
                places.push((index, place));
            }
            let patch_frames = PatchFrames::found(places);
            next_serial = next_serial.max(rec.serial + 1);
            let node = match b.lower.find_file(&rec.handle, b.max_walk) {
                Ok(node) => node,
                Err(Errno(libc::ENOENT | libc::ESTALE)) => {
                    // Patched pages share their patch frames: each frame once.
                    let all: std::collections::BTreeSet<FrameId> =
                        frames.values().copied().collect();
                    b.atomically(|tx| {
                        all.iter().try_for_each(|f| tx.free_frame(*f))?;
                        slots::remove(tx, record, record::RECORD_SIZE)
                    })
                    .map_err(|error| StartError::DropDeleted {
                        record: record.describe(),
                        error,
                    })?;
                    b.release_slot(&self.slots, record);
                    Counters::add(&self.counters.pages_dropped, frames.len() as u64);
                    // not an incident: the file was deleted, its pages are of no use; a
                    // recovery outcome, counted by `cache.pages_dropped`, not a failure
                    eprintln!(
                        "nvstack: {} dirty page(s) of a file deleted before the crash were dropped",
                        frames.len()
                    );
                    continue;
                }
                Err(e) => {
                    return Err(StartError::CachedFile { record: record.describe(), error: e });
                }
            };
            let key = b.lower.key(&node);
            let cf = Arc::new(self.new_file(key, record, Arc::new(node), rec));
            if self.get(key).is_some() {
                return Err(
                    slots::damaged(record, "two cached-file records for one lower file").into()
                );
            }
            self.insert(&cf);
            let mut st = cf.lock();
            let extents = Self::cache_io(b, &cf)
                .ok()
                .and_then(|f| b.lower.fiemap(&f).ok())
                .unwrap_or_default();
            let mut t = self.tables();
            let mut reserved = 0;
            for (index, frame) in frames {
                let loc = state::locate(&extents, object, index, &t.all);
                let meta = PageMeta {
                    frame,
                    active: false,
                    referenced: false,
                    version: self.tick(),
                    last_use: 0,
                    dirtied_at: now,
                    loc,
                    reserved: matches!(loc, Loc::Logical { .. }),
                };
                reserved += u64::from(meta.reserved);
                state::add_page(&mut t, &self.counters, PageKey { object, index }, &meta);
                st.pages.insert(index, meta);
            }
            for patch in patched.values() {
                self.nbw.patch_added(patch.len());
            }
            let n = patch_frames.frame_count() as u64;
            self.nbw.patch_frames.fetch_add(n, Ordering::Relaxed);
            st.patch_frames = patch_frames;
            drop(t);
            // The asynchronous modes fetch what they had not fetched before the stop.
            self.queue_fetches(object, patched.keys().copied());
            st.patches = patched;
            st.extents = Some(extents);
            st.unmapped = reserved;
            b.space.add(reserved);
        }
        self.next_serial.store(next_serial, Ordering::Relaxed);
        Ok(())
    }
}
