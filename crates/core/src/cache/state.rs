//! The volatile mirror of cached files: one [`CachedFile`] per lower file with a record in
//! NVRAM, its dirty pages' recency state, and the bookkeeping of the zone information tables
//! (thesis Figure 3.7 (a) and (b): `add_to_zone` / `remove_from_zone`).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use lower::Extent;
use txn::FrameId;

use super::PAGE;
use super::counters::{CacheCounters, dec, inc};
use super::patch::Patch;
use super::patchframe::PatchFrames;
use super::policy::{Loc, PageKey, ZoneTable};
use super::record::Record;
use crate::base::slots::Place;
use crate::base::sync::{Mutex, MutexGuard, Rank};

/// The volatile state of one dirty page.
#[derive(Clone, Copy, Debug)]
pub struct PageMeta {
    pub frame: FrameId,
    /// On the active list (accessed twice since it was last aged).
    pub active: bool,
    pub referenced: bool,
    /// The cache clock's tick of the last write to the page, unique across pages and time: a
    /// write-back frees a page only if it is unchanged. (A per-page counter would not do: a
    /// page truncated away and written again would start from the same number, and the
    /// write-back would free data it never wrote.)
    pub version: u64,
    /// Tick of the last access (the `recency` policy's LRU order).
    pub last_use: u64,
    /// Lower-clock seconds when the page became dirty (`--max-dirty-age`).
    pub dirtied_at: i64,
    /// Where the page is recorded in the zone tables.
    pub loc: Loc,
    /// Counted in the engine's reserved pages (no lower block yet).
    pub reserved: bool,
}

/// The mutable part of a cached file.
#[derive(Debug)]
pub struct CacheState {
    pub rec: Record,
    /// Pages in NVRAM: dirty pages and patched pages (a patched page's `frame` is the patch
    /// frame its patch lies in, shared with other patches of the file).
    pub pages: BTreeMap<u64, PageMeta>,
    /// The patches of patched pages (a subset of `pages`' keys), decoded.
    pub patches: BTreeMap<u64, Patch>,
    /// Where those patches lie.
    pub patch_frames: PatchFrames,
    /// FIEMAP of the lower file, fetched on demand, dropped when a write-back changed the
    /// lower file's allocation.
    pub extents: Option<Vec<Extent>>,
    /// The smallest size since the current write-back took its snapshot (a truncate during a
    /// write-back must not let the lower bytes it wrote become valid).
    pub shrunk_to: u64,
    /// The record was freed; holders of this entry must look the file up again.
    pub gone: bool,
    /// Pages with `reserved` set (no lower block yet): they count in st_blocks.
    pub unmapped: u64,
    /// The record's mtime when a read last applied relatime to the lower file's atime.
    pub atime_checked: (i64, u32),
    /// Bumped by every committed write-back (step 3) of the file, the only change to the
    /// lower file's bytes while it has a record: a read that read the lower file without the
    /// lock uses what it read only if this, `valid` and the size are what they were before.
    pub lower_gen: u64,
}

impl CacheState {
    /// The invariants of one cached file that every operation on it keeps (checked at the end
    /// of each in debug builds, `debug_check!`): C1 `valid <= size`; D3 (C3) no page at or
    /// beyond the size's last page; P5 a patch neither covers its whole page nor reaches the
    /// size; P6 (its volatile side) every patch belongs to a page in NVRAM and lies where the
    /// patch frames say, the page's frame is that patch frame, and no other page has a place; `unmapped` counts the
    /// pages whose lower space is reserved.
    pub(crate) fn check(&self, object: u64) -> Result<(), String> {
        let (size, valid) = (self.rec.size, self.rec.valid);
        if valid > size {
            return Err(format!("C1: file {object}: valid {valid} > size {size}"));
        }
        if self.gone {
            return Ok(()); // freed: its pages went with the record
        }
        let first_gone = crate::base::pages::first_gone(size);
        if let Some((&page, _)) = self.pages.range(first_gone..).next() {
            return Err(format!("D3: file {object}: page {page} beyond the size {size}"));
        }
        // P6: a patched page's frame is the patch frame its patch lies in; no other page has a
        // place; the patches placed are the patches decoded.
        for (&page, meta) in &self.pages {
            let place = self.patch_frames.place(page);
            if place.map(|p| p.frame) != self.patches.contains_key(&page).then_some(meta.frame) {
                return Err(format!(
                    "P6: file {object} page {page}: patch at {place:?}, page frame {}",
                    meta.frame.0
                ));
            }
        }
        if self.patch_frames.len() != self.patches.len() {
            return Err(format!("P6: file {object}: patches placed and decoded differ"));
        }
        for (&page, patch) in &self.patches {
            if !self.pages.contains_key(&page) {
                return Err(format!("P6: file {object}: patch of page {page} without its page"));
            }
            let room = size.saturating_sub(page * PAGE).min(PAGE) as usize;
            let end = patch.pieces().map(|(at, bytes)| at + bytes.len()).max().unwrap_or(0);
            if end > room || patch.covers(0, PAGE as usize) {
                return Err(format!(
                    "P5: file {object}: page {page}'s patch reaches {end}, the page holds {room}"
                ));
            }
        }
        let reserved = self.pages.values().filter(|m| m.reserved).count() as u64;
        if self.unmapped != reserved {
            return Err(format!(
                "file {object}: unmapped {} but {reserved} pages reserved",
                self.unmapped
            ));
        }
        Ok(())
    }
}

/// A lower file with a record in NVRAM. `record` (where its record is: a slot of a record
/// frame, `crate::base::slots`) and `key` never change.
#[derive(Debug)]
pub struct CachedFile<N, F> {
    pub key: (u64, u64),
    pub record: Place,
    pub node: Arc<N>,
    state: Mutex<CacheState>,
    /// The lower file opened read-write (buffered) for fetches and the fallback write-back;
    /// set only if `may_hold` (otherwise each call opens it).
    pub io: OnceLock<F>,
    /// The lower file opened with O_DIRECT for write-back, or `None` when the lower file
    /// system refuses O_DIRECT (tmpfs); set only if `may_hold`.
    pub direct: OnceLock<Option<F>>,
    /// Whether this file keeps `io` and `direct` open: decided at its first lower call, true
    /// while fewer than `limit` files hold (`held` counts them; this entry's drop gives its
    /// place back). H1: `held` = the live entries whose `holds` is true <= `limit`.
    holds: OnceLock<bool>,
    held: Arc<AtomicUsize>,
    limit: usize,
}

impl<N, F> CachedFile<N, F> {
    pub(crate) fn new(
        key: (u64, u64),
        record: Place,
        node: Arc<N>,
        rec: Record,
        held: Arc<AtomicUsize>,
        limit: usize,
    ) -> Self {
        let size = rec.size;
        CachedFile {
            key,
            record,
            node,
            state: Mutex::new(
                Rank::CachedFile,
                CacheState {
                    rec,
                    pages: BTreeMap::new(),
                    patches: BTreeMap::new(),
                    patch_frames: PatchFrames::default(),
                    extents: None,
                    shrunk_to: size,
                    gone: false,
                    unmapped: 0,
                    atime_checked: (i64::MIN, 0),
                    lower_gen: 0,
                },
            ),
            io: OnceLock::new(),
            direct: OnceLock::new(),
            holds: OnceLock::new(),
            held,
            limit,
        }
    }

    /// Whether the file may keep its lower file open (see `holds`).
    pub(crate) fn may_hold(&self) -> bool {
        *self.holds.get_or_init(|| {
            self.held
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                    (n < self.limit).then_some(n + 1)
                })
                .is_ok()
        })
    }

    /// Several files are locked in the order of their ids (a write-back batch).
    pub(crate) fn lock(&self) -> MutexGuard<'_, CacheState> {
        self.state.lock_nth(self.id())
    }

    /// The file's identity in the cache's maps, zone tables and fetch queue, and the owner
    /// its page and patch frames name (`Place::owner`; a whole record frame's number for a
    /// record written before records were packed).
    pub(crate) fn id(&self) -> u64 {
        self.record.owner()
    }
}

impl<N, F> Drop for CachedFile<N, F> {
    fn drop(&mut self) {
        if self.holds.get() == Some(&true) {
            self.held.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// The cached files, by lower key and by record frame.
#[derive(Debug)]
pub struct Files<N, F> {
    pub by_key: HashMap<(u64, u64), Arc<CachedFile<N, F>>>,
    pub by_object: BTreeMap<u64, Arc<CachedFile<N, F>>>,
}

impl<N, F> Default for Files<N, F> {
    fn default() -> Self {
        Files { by_key: HashMap::new(), by_object: BTreeMap::new() }
    }
}

/// The zone information tables (thesis Figure 3.3): `inactive` over dirty inactive pages (the
/// thesis' table, read by `relo`), `all` over every dirty page (read by `location`; it also
/// keeps two pages from sharing a location). The view's lists (`files`, `inactive_lru`) are
/// filled only for the moment a policy that reads them selects.
pub type Tables = crate::cache::policy::DirtyView;

/// Records a newly dirty page in the tables (Figure 3.7 (a): `add_to_zone` when it is dirty
/// and inactive).
pub(crate) fn add_page(t: &mut Tables, c: &CacheCounters, page: PageKey, meta: &PageMeta) {
    t.all.add_to_zone(page, meta.loc);
    inc(&c.pages_dirty);
    if !meta.active {
        t.inactive.add_to_zone(page, meta.loc);
        inc(&c.pages_inactive_dirty);
    }
}

/// The page is clean (written back, truncated away, dropped): Figure 3.7 (b).
pub(crate) fn remove_page(t: &mut Tables, c: &CacheCounters, meta: &PageMeta) {
    t.all.remove_from_zone(meta.loc);
    dec(&c.pages_dirty);
    if !meta.active {
        t.inactive.remove_from_zone(meta.loc);
        dec(&c.pages_inactive_dirty);
    }
}

/// A second access promotes an inactive page (and takes it out of the inactive table); the
/// first only marks it referenced (Linux's mark_page_accessed).
pub(crate) fn accessed(t: &mut Tables, c: &CacheCounters, meta: &mut PageMeta, tick: u64) {
    meta.last_use = tick;
    if meta.active {
        meta.referenced = true;
    } else if meta.referenced {
        meta.active = true;
        meta.referenced = false;
        t.inactive.remove_from_zone(meta.loc);
        dec(&c.pages_inactive_dirty);
    } else {
        meta.referenced = true;
    }
}

/// Aging (the clock over the active list): a referenced active page loses its reference, an
/// unreferenced one is demoted to the inactive list (`add_to_zone`); inactive pages lose
/// their reference.
pub(crate) fn age(t: &mut Tables, c: &CacheCounters, page: PageKey, meta: &mut PageMeta) {
    if meta.active {
        if meta.referenced {
            meta.referenced = false;
        } else {
            meta.active = false;
            t.inactive.add_to_zone(page, meta.loc);
            inc(&c.pages_inactive_dirty);
        }
    } else {
        meta.referenced = false;
    }
}

/// FIEMAP extent flags that mean "no physical block yet" (UNKNOWN, DELALLOC, ENCODED,
/// DATA_INLINE, NOT_ALIGNED is fine).
const NO_BLOCK: u32 = 0x2 | 0x4 | 0x8 | 0x200;

/// Where page `index` of the file lives: its physical block when FIEMAP maps the page's
/// first byte, else by (file, page). A physical block already recorded for another page
/// (reflinks, file-system blocks smaller than a page that straddle) falls back to the logical
/// place, so that a location is recorded at most once.
pub(crate) fn locate(extents: &[Extent], object: u64, index: u64, all: &ZoneTable) -> Loc {
    let logical = Loc::Logical { object, index };
    let pos = index * PAGE;
    let i = extents.partition_point(|e| e.logical + e.length <= pos);
    let Some(e) = extents.get(i) else { return logical };
    if e.logical > pos || e.flags & NO_BLOCK != 0 {
        return logical;
    }
    let loc = Loc::Physical((e.physical + (pos - e.logical)) / PAGE);
    if all.contains(loc) { logical } else { loc }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    fn ext(logical: u64, physical: u64, length: u64, flags: u32) -> Extent {
        Extent { logical, physical, length, flags }
    }

    #[test]
    fn locate_maps_pages_through_extents() {
        let all = ZoneTable::new(16);
        let extents = [ext(0, 40960, 8192, 0), ext(16384, 1 << 20, 4096, 0x4)];
        assert_eq!(locate(&extents, 9, 0, &all), Loc::Physical(10));
        assert_eq!(locate(&extents, 9, 1, &all), Loc::Physical(11));
        // a hole between the extents, a delayed-allocation extent, past the end
        assert_eq!(locate(&extents, 9, 2, &all), Loc::Logical { object: 9, index: 2 });
        assert_eq!(locate(&extents, 9, 4, &all), Loc::Logical { object: 9, index: 4 });
        assert_eq!(locate(&extents, 9, 7, &all), Loc::Logical { object: 9, index: 7 });
    }

    #[test]
    fn a_taken_block_falls_back_to_the_logical_place() {
        let mut all = ZoneTable::new(16);
        all.add_to_zone(PageKey { object: 1, index: 0 }, Loc::Physical(10));
        let extents = [ext(0, 40960, 4096, 0)];
        assert_eq!(locate(&extents, 2, 0, &all), Loc::Logical { object: 2, index: 0 });
    }

    #[test]
    fn recency_promotes_on_the_second_access_and_ages_back() {
        let mut t =
            Tables { all: ZoneTable::new(16), inactive: ZoneTable::new(16), ..Tables::default() };
        let c = CacheCounters::default();
        let page = PageKey { object: 1, index: 3 };
        let mut meta = PageMeta {
            frame: FrameId(5),
            active: false,
            referenced: true,
            version: 0,
            last_use: 0,
            dirtied_at: 0,
            loc: Loc::Physical(7),
            reserved: false,
        };
        add_page(&mut t, &c, page, &meta);
        assert_eq!(c.pages_inactive_dirty.load(Ordering::Relaxed), 1);
        accessed(&mut t, &c, &mut meta, 1);
        assert!(meta.active);
        assert!(!t.inactive.contains(Loc::Physical(7)));
        assert_eq!(c.pages_inactive_dirty.load(Ordering::Relaxed), 0);
        age(&mut t, &c, page, &mut meta); // unreferenced active: demoted
        assert!(!meta.active);
        assert!(t.inactive.contains(Loc::Physical(7)));
        remove_page(&mut t, &c, &meta);
        assert_eq!(c.pages_dirty.load(Ordering::Relaxed), 0);
        assert_eq!(c.pages_inactive_dirty.load(Ordering::Relaxed), 0);
        assert!(!t.all.contains(Loc::Physical(7)));
    }
}
