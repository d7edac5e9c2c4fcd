//! The page cache's part of recovery: finding every cached-file record and dirty page in the
//! region (`scan`, also used by `nvstack check` and `inspect`), and rebuilding the volatile
//! mirror at mount (`Engine::rebuild_cache`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use lower::{Errno, LowerFs};
use txn::FrameId;

use super::PAGE;
use super::policy::{Loc, PageKey};
use super::record::{self, Record};
use super::state::{self, CachedFile, PageMeta};
use crate::engine::Engine;
use crate::engine::start::StartError;
use crate::stats::Counters;

/// One cached file found in the region (at mount, by `check` and `inspect`).
#[derive(Debug)]
pub struct Found {
    pub frame: FrameId,
    pub rec: Record,
    pub pages: BTreeMap<u64, FrameId>,
}

/// Reads every cached-file record and dirty page of the region (after recovery rolled back
/// unfinished transactions) and checks C1-C3. Damage is reported with the frame named.
pub fn scan(pool: &txn::Pool) -> Result<Vec<Found>, nvram::Error> {
    let mut records: BTreeMap<u64, Found> = BTreeMap::new();
    let mut pages = Vec::new();
    for (frame, tag) in pool.allocated_frames()? {
        match tag.kind {
            record::KIND_RECORD => {
                let b = pool.read_vec(pool.frame_offset(frame), record::RECORD_SIZE);
                let rec = Record::decode(&b)
                    .map_err(|what| nvram::Error::corrupt(nvram::Area::Frame(frame.0), what))?;
                records.insert(frame.0, Found { frame, rec, pages: BTreeMap::new() });
            }
            record::KIND_PAGE => pages.push((frame, tag)),
            _ => {}
        }
    }
    for (frame, tag) in pages {
        let corrupt = |what| nvram::Error::corrupt(nvram::Area::Frame(frame.0), what);
        let Some(found) = records.get_mut(&tag.owner) else {
            return Err(corrupt("cached page whose owner is not a cached-file record (C2)"));
        };
        if tag.index >= found.rec.size.div_ceil(PAGE) {
            return Err(corrupt("cached page beyond the file size (C3)"));
        }
        found.pages.insert(tag.index, frame);
    }
    Ok(records.into_values().collect())
}

impl<L: LowerFs> Engine<L> {
    /// At start: the cached files of the region, found again by their handles. A record of a
    /// file that no longer exists (deleted while dirty, before its pages were dropped) is
    /// freed with its pages.
    pub(crate) fn rebuild_cache(&self) -> Result<(), StartError> {
        let found = scan(&self.pool)?;
        let now = self.lower.now().0;
        let mut next_serial = 1;
        for Found { frame: object, rec, pages: frames } in found {
            next_serial = next_serial.max(rec.serial + 1);
            let node = match self.lower.find_file(&rec.handle, self.max_walk) {
                Ok(node) => node,
                Err(Errno(libc::ENOENT | libc::ESTALE)) => {
                    self.atomically(|tx| {
                        for f in frames.values().chain(std::iter::once(&object)) {
                            tx.free_frame(*f)?;
                        }
                        Ok(())
                    })
                    .map_err(|error| StartError::DropDeleted { object: object.0, error })?;
                    Counters::add(&self.cache.counters.pages_dropped, frames.len() as u64);
                    eprintln!(
                        "nvstack: {} dirty page(s) of a file deleted before the crash were dropped",
                        frames.len()
                    );
                    continue;
                }
                Err(e) => return Err(StartError::CachedFile { object: object.0, error: e }),
            };
            let key = self.lower.key(&node);
            let cf = Arc::new(CachedFile::new(key, object, Arc::new(node), rec));
            if self.cache.get(key).is_some() {
                return Err(nvram::Error::corrupt(
                    nvram::Area::Frame(object.0),
                    "two cached-file records for one lower file",
                )
                .into());
            }
            self.cache.insert(&cf);
            let mut st = cf.lock();
            let extents =
                self.cache_io(&cf).ok().and_then(|f| self.lower.fiemap(f).ok()).unwrap_or_default();
            let mut t = self.cache.tables();
            let mut reserved = 0;
            for (index, frame) in frames {
                let loc = state::locate(&extents, object.0, index, &t.all);
                let meta = PageMeta {
                    frame,
                    active: false,
                    referenced: false,
                    version: self.cache.tick(),
                    last_use: 0,
                    dirtied_at: now,
                    loc,
                    reserved: matches!(loc, Loc::Logical { .. }),
                };
                reserved += u64::from(meta.reserved);
                state::add_page(
                    &mut t,
                    &self.cache.counters,
                    PageKey { object: object.0, index },
                    &meta,
                );
                st.pages.insert(index, meta);
            }
            st.extents = Some(extents);
            st.unmapped = reserved;
            self.space.add(reserved);
        }
        self.cache.next_serial.store(next_serial, Ordering::Relaxed);
        Ok(())
    }
}
