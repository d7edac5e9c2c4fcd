//! Non-blocking writes, engine side (design.md section 11.8; the FAST'15 paper): a write that
//! covers part of a page that is not in NVRAM becomes a *patch* (`patch.rs`) inside the
//! write's transaction instead of waiting for the page to be read from the lower file, so the
//! write returns at NVRAM speed, atomic and durable as every other write.
//!
//! Rules (the content rule of section 11.1 gains the patch layer: a byte a patch covers is
//! the patch's, the others are the lower file's below `valid`, else zero):
//! - a patch is made only for a page that lies wholly below `valid` (a page reaching past it
//!   needs at most a partial read, and its tail is zero by the rule anyway) and while fewer
//!   than `patch_limit` frames hold patches (several patches of a file share a frame:
//!   `patchframe.rs`); otherwise the page is fetched first, as with `--nbw off`, and the
//!   reason is counted (`nbw.writer_waits`);
//! - later writes to the page merge into its patch; one that completes the page turns it into
//!   a dirty page without any read; one that would fragment the patch past a whole frame
//!   fetches;
//! - `async-fg` and `async-bg` fetch patched pages after the write was answered (`fetch_patches`),
//!   merging the patch in one transaction (a new dirty-page frame replaces the patch), in
//!   elevator order (`fetchqueue.rs`); `lazy` never fetches for the patch's sake;
//! - a read the patches cover is served from them; others read the lower file and overlay the
//!   patch (that read is the page's fetch: `nbw.fetches_on_read`);
//! - write-back writes only the patched bytes (`writeback.rs`); truncate drops or clips
//!   patches like pages (P5: nothing at or beyond the size).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use lower::LowerFs;
use txn::{FrameId, FrameTag};

use super::Cached;
use super::PageCache;
use super::counters::{Wait, inc};
use super::patch::{Merged, Patch};
use super::patchframe::PatchFrames;
use super::policy::Loc;
use super::record::KIND_PAGE;
use super::state::{self, CacheState};
use super::{Nbw, PAGE};
use crate::base::Base;
use crate::base::Incident;
use crate::base::error::FsResult;

/// Queued fetches at most (a limit on the queue; a page not queued stays a patch, as in lazy).
pub(super) const MAX_QUEUED: usize = 1 << 16;

/// What a cached write does to one page that is not already a whole dirty page in NVRAM,
/// decided before its transaction (every lower read happens then).
pub(super) enum Plan {
    /// A new dirty page; `patched`: it replaces the page's patch, removed in the same
    /// transaction; `completed`: the write covered the rest of the patched page (no read).
    Page { page: u64, bytes: Box<[u8; PAGE as usize]>, loc: Loc, patched: bool, completed: bool },
    /// A new patch (`new`) or the page's patch rewritten (in place, grown or moved:
    /// `patchframe.rs`).
    Patch { page: u64, patch: Patch, loc: Loc, new: bool },
}

impl Plan {
    pub(super) fn page(&self) -> u64 {
        match self {
            Plan::Page { page, .. } | Plan::Patch { page, .. } => *page,
        }
    }

    pub(super) fn loc(&self) -> Loc {
        match self {
            Plan::Page { loc, .. } | Plan::Patch { loc, .. } => *loc,
        }
    }

    /// A page new to NVRAM (it takes a place in the zone tables).
    pub(super) fn is_new(&self) -> bool {
        matches!(self, Plan::Page { patched: false, .. } | Plan::Patch { new: true, .. })
    }
}

impl<L: LowerFs> PageCache<L> {
    /// Phase 1 of a cached write (`ops.rs`): the plan of every page of `offset..+data` that is
    /// not a whole dirty page already. Partial pages not in NVRAM become patches where the
    /// rules allow, else are fetched (`cache.fetches`).
    pub(super) fn plan_write(
        &self,
        b: &Base<L>,
        cf: &Cached<L>,
        st: &mut CacheState,
        offset: u64,
        data: &[u8],
    ) -> FsResult<Vec<Plan>> {
        let size_after = st.rec.size.max(offset + data.len() as u64);
        let mode = self.config.nbw;
        let mut plans = Vec::new();
        for (page, in_page, done, n) in crate::base::pages::pieces(offset, data.len()) {
            let piece = &data[done..done + n];
            let base = page * PAGE;
            let limit = (size_after - base).min(PAGE) as usize;
            if let Some(p) = st.patches.get(&page) {
                let loc = st.pages[&page].loc;
                // A patch that grows out of its run needs room elsewhere: at the limit, with
                // none in the file's frames, the page is fetched instead (the limit holds).
                let wait = match p.merge(in_page, piece, limit) {
                    Merged::Patch(patch) if self.patch_room(st, page, patch.slots()) => {
                        plans.push(Plan::Patch { page, patch, loc, new: false });
                        continue;
                    }
                    Merged::Patch(_) => Wait::PatchLimit,
                    Merged::Page(bytes) => {
                        plans.push(Plan::Page { page, bytes, loc, patched: true, completed: true });
                        continue;
                    }
                    Merged::TooLarge => Wait::Fragmented,
                };
                self.wait_for(wait);
                let mut bytes = self.fetch_page(b, cf, st, page)?;
                p.apply(&mut bytes[..]);
                bytes[in_page..in_page + n].copy_from_slice(piece);
                plans.push(Plan::Page { page, bytes, loc, patched: true, completed: false });
                continue;
            }
            if st.pages.contains_key(&page) {
                continue; // a whole dirty page: updated in place
            }
            let loc = {
                let extents = Self::extents(b, cf, st);
                state::locate(extents, cf.id(), page, &self.tables().all)
            };
            let mut bytes = Box::new([0u8; PAGE as usize]);
            if n < PAGE as usize && base < st.rec.valid {
                let below = base + PAGE <= st.rec.valid;
                // (A write of nearly a whole page does not fit a patch frame: it fetches.)
                let merged = (mode != Nbw::Off && below)
                    .then(|| Patch::new(page).merge(in_page, piece, limit));
                // The limit is on NVRAM, frames holding patches: a new patch needs room in one
                // of its file's patch frames or a frame below the limit. (The pages of one
                // write are checked before any is placed: a write may take one frame more.)
                let room = match &merged {
                    Some(Merged::Patch(p)) => self.patch_room(st, page, p.slots()),
                    _ => true,
                };
                if room && let Some(Merged::Patch(patch)) = merged {
                    plans.push(Plan::Patch { page, patch, loc, new: true });
                    continue;
                }
                self.wait_for(match (mode, below, room) {
                    (Nbw::Off, _, _) => Wait::Off,
                    (_, false, _) => Wait::PastValid,
                    (_, _, false) => Wait::PatchLimit,
                    _ => Wait::Fragmented,
                });
                bytes = self.fetch_page(b, cf, st, page)?;
            }
            bytes[in_page..in_page + n].copy_from_slice(piece);
            plans.push(Plan::Page { page, bytes, loc, patched: false, completed: false });
        }
        Ok(plans)
    }

    /// Whether page `page` may have a patch of `slots` slots: it fits where the page's patch
    /// is (or would be put) in the file's patch frames, or fewer than `patch_limit` frames
    /// hold patches.
    fn patch_room(&self, st: &CacheState, page: u64, slots: usize) -> bool {
        let frames = self.nbw.patch_frames.load(Ordering::Relaxed);
        frames < self.limits.patch_limit || st.patch_frames.holds(page, slots)
    }

    fn wait_for(&self, why: Wait) {
        inc(&self.nbw.writer_waits[why as usize]);
    }

    /// The page as the lower file holds it: bytes below `valid`, zeros beyond
    /// (`cache.fetches`).
    pub(super) fn fetch_page(
        &self,
        b: &Base<L>,
        cf: &Cached<L>,
        st: &CacheState,
        page: u64,
    ) -> FsResult<Box<[u8; PAGE as usize]>> {
        self.fetch_below(b, cf, st.rec.valid, page)
    }

    /// `fetch_page` for a given valid size (the caller may not hold the file's lock).
    fn fetch_below(
        &self,
        b: &Base<L>,
        cf: &Cached<L>,
        valid: u64,
        page: u64,
    ) -> FsResult<Box<[u8; PAGE as usize]>> {
        let mut bytes = Box::new([0u8; PAGE as usize]);
        let base = page * PAGE;
        if base < valid {
            let want = (valid - base).min(PAGE) as usize;
            let io = Self::cache_io(b, cf)?;
            b.lower.read_full(&io, base, &mut bytes[..want])?;
            inc(&self.counters.fetches);
        }
        Ok(bytes)
    }

    /// After a write's commit: its new and changed patches wait for an asynchronous fetch
    /// (`async-fg`, `async-bg`).
    pub(super) fn queue_fetches(&self, object: u64, pages: impl IntoIterator<Item = u64>) {
        if !matches!(self.config.nbw, Nbw::AsyncFg | Nbw::AsyncBg) {
            return;
        }
        let mut q = self.fetches.lock();
        let before = q.len();
        for page in pages {
            q.push(object, page);
        }
        if q.len() > before {
            drop(q);
            self.fetcher_bell.ring();
        }
    }

    /// Rung when a patched page is queued for a fetch: the `async-bg` fetcher sleeps on it
    /// while the queue is empty (`sync::Bell`).
    pub(crate) fn fetcher_bell(&self) -> &crate::base::sync::Bell {
        &self.fetcher_bell
    }

    /// `async-fg`: called by the thread that served a write, after it answered: the patches
    /// queued so far are fetched now (the writer does not wait for them).
    pub(crate) fn after_write_answered(&self, b: &Base<L>) {
        if self.config.nbw == Nbw::AsyncFg {
            self.fetch_patches(b, usize::MAX);
        }
    }

    /// Fetches and merges up to `max` queued patched pages (the asynchronous modes; the
    /// background fetcher of `async-bg` calls it in a loop); returns how many were merged.
    ///
    /// No fetch starts while the page cache holds more frames than its high watermark
    /// (`nbw.fetches_paused` counts the calls that stopped there): a fetch turns a patch of a
    /// few 64-byte slots into a 4 KiB dirty page, so above the mark it only drives NVRAM to
    /// full, where its own transaction fails after the disk read was paid (measured on the
    /// ssd model, 128-byte random writes at scale 1: 33,766 fetches read a page and then found
    /// no frame) and writers meet write-back sooner. The queue keeps the pages (each once);
    /// the patches stay correct and write-back writes their bytes anyway.
    /// A failed fetch leaves the patch (it is still correct), counts `nbw.fetches_failed`,
    /// and is said on stderr the first time and at every power of two after.
    pub(crate) fn fetch_patches(&self, b: &Base<L>, max: usize) -> usize {
        let mut merged = 0;
        for _ in 0..max {
            if self.cache_frames() > self.limits.high_pages {
                inc(&self.nbw.fetches_paused);
                break;
            }
            let Some((object, page)) = self.fetches.lock().pop() else { break };
            let Some(cf) = self.by_object(object) else { continue };
            match self.complete_patch(b, &cf, page) {
                Ok(true) => {
                    merged += 1;
                    inc(&self.nbw.fetches_async);
                }
                Ok(false) => {}
                Err(e) => {
                    let n = self.nbw.fetches_failed.fetch_add(1, Ordering::Relaxed) + 1;
                    b.incidents.report_if(
                        n.is_power_of_two(),
                        Incident::FetchFailed,
                        format_args!(
                            "nvstack: fetching a patched page (failure {n}; the patch stays): {e}"
                        ),
                    );
                }
            }
        }
        merged
    }

    /// Patched pages waiting for an asynchronous fetch.
    pub(crate) fn fetches_queued(&self) -> usize {
        self.fetches.lock().len()
    }

    /// Reads page `page` of `cf` from the lower file, applies its patch and makes it a dirty
    /// page (one transaction: a new page frame, the patch removed). `false` when the page
    /// has no patch (any more), or when the page or the file's valid size changed during the
    /// read (the patch stays: it is still correct; the write that changed it queued it again).
    ///
    /// The read runs without the file's lock, so writers of the file - the asynchronous
    /// modes' point - are not held up by a disk read. It is used only if the page's version
    /// (bumped by every write, merge and replacement of the page) and `valid` are what they
    /// were before the read: then the patch is the one the read was for, and while a page is
    /// patched nothing writes the lower file's bytes of that page except write-back, which
    /// writes exactly the patched ranges, over which the patch is applied.
    pub(super) fn complete_patch(
        &self,
        b: &Base<L>,
        cf: &Arc<Cached<L>>,
        page: u64,
    ) -> FsResult<bool> {
        let seen = |st: &CacheState| (st.rec.valid, st.pages.get(&page).map(|m| m.version));
        let before = {
            let st = cf.lock();
            if st.gone || !st.patches.contains_key(&page) {
                return Ok(false);
            }
            seen(&st)
        };
        let mut bytes = self.fetch_below(b, cf, before.0, page)?;
        b.fail("nbw.fetched"); // (unlocked: writers of the file go on)
        let mut st = cf.lock();
        if st.gone || seen(&st) != before {
            return Ok(false);
        }
        let Some(patch) = st.patches.get(&page).cloned() else { return Ok(false) };
        patch.apply(&mut bytes[..]);
        let tag = FrameTag { kind: KIND_PAGE, owner: cf.id(), index: page };
        let frame = self.patch_tx(&mut st.patch_frames, |pf| {
            b.atomically(|tx| {
                let frame = crate::base::pages::fresh_page(tx, tag, &bytes[..])?;
                pf.remove(tx, &b.pool, page)?;
                Ok(frame)
            })
        })?;
        let tick = self.tick();
        let meta = st.pages.get_mut(&page).expect("a patched page is in NVRAM");
        meta.frame = frame;
        // The content did not change, but a write-back that copied the patch must not free
        // the page it no longer knows.
        meta.version = tick;
        st.patches.remove(&page);
        self.nbw.patch_removed(patch.len());
        crate::base::debug_check!(st.check(cf.id()));
        b.fail("nbw.merged");
        Ok(true)
    }

    /// Runs `f`, which changes `pf` in a transaction that it also ends (`Ok` = committed),
    /// between `pf.begin()` and the settling of those changes: kept if `f` succeeded, undone if
    /// not. The one way a file's patch map follows a transaction.
    pub(super) fn patch_tx<T>(
        &self,
        pf: &mut PatchFrames,
        f: impl FnOnce(&mut PatchFrames) -> FsResult<T>,
    ) -> FsResult<T> {
        pf.begin();
        let result = f(pf);
        self.settle_patches(pf, result.is_ok());
        result
    }

    /// After a transaction that may have changed `pf` (begun with `pf.begin()`) ended.
    pub(super) fn settle_patches(&self, pf: &mut PatchFrames, committed: bool) {
        let done = pf.settle(committed);
        let nbw = &self.nbw;
        if done.frames >= 0 {
            nbw.patch_frames.fetch_add(done.frames.unsigned_abs(), Ordering::Relaxed);
        } else {
            nbw.patch_frames.fetch_sub(done.frames.unsigned_abs(), Ordering::Relaxed);
        }
        nbw.patches_moved.fetch_add(done.moved, Ordering::Relaxed);
    }

    /// The patches of pages that left NVRAM (their transaction committed).
    pub(super) fn patches_gone(&self, st: &mut CacheState, pages: impl IntoIterator<Item = u64>) {
        for page in pages {
            if let Some(p) = st.patches.remove(&page) {
                self.nbw.patch_removed(p.len());
            }
        }
    }

    /// Phase 2 of a cached write for its plans (inside the write's transaction, `pf` begun):
    /// for each plan in order, the frame its page or patch now lies in.
    pub(super) fn write_plans(
        b: &Base<L>,
        tx: &mut txn::Tx<'_>,
        object: u64,
        plans: &[Plan],
        pf: &mut PatchFrames,
    ) -> Result<Vec<FrameId>, txn::TxError> {
        let pool = &b.pool;
        let mut frames = Vec::with_capacity(plans.len());
        for plan in plans {
            match plan {
                Plan::Page { page, bytes, patched, .. } => {
                    let tag = FrameTag { kind: KIND_PAGE, owner: object, index: *page };
                    let frame = crate::base::pages::fresh_page(tx, tag, &bytes[..])?;
                    if *patched {
                        pf.remove(tx, pool, *page)?;
                    }
                    frames.push(frame);
                }
                Plan::Patch { page, patch, .. } => {
                    frames.push(pf.put(tx, pool, object, *page, &patch.encode())?.frame);
                }
            }
        }
        Ok(frames)
    }
}
