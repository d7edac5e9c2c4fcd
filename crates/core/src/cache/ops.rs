//! The page cache, engine side (design.md section 11): writes to lower regular files become
//! dirty pages in NVRAM inside the operation's transaction; reads, attributes, truncates and
//! the operations that touch the lower file directly stay coherent with them. Write-back is in
//! `writeback.rs`.
//!
//! Coherence rules:
//! - write: a page in NVRAM is updated (snapshot); a page the write covers whole is allocated
//!   without reading; a partial page is *fetched* (read from the lower file) first. Size and
//!   times change in the record in the same transaction.
//! - read / getattr: dirty pages and the record's size and times overlay the lower file.
//! - truncate (setattr size): one transaction changes the record (`valid` drops to the new size
//!   when it shrinks) and frees or zeroes pages; the lower file is cut by the next write-back.
//! - unlink / rename: nothing (the record names the file by handle); the pages of a deleted
//!   file are dropped when the kernel forgets its last reference.
//! - fallocate, O_DIRECT IO, copy_file_range, SEEK_DATA/SEEK_HOLE work on the lower file
//!   directly: the file is written back first (or copied through the cache), and they hold the
//!   file's stripe so that no record starts meanwhile.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use lower::{Attr, LowerFs};

use super::Cached;
use super::PageCache;
use super::counters::inc;
#[cfg(debug_assertions)]
use super::policy::ZoneTable;
use super::policy::{Loc, PageKey};
use super::record::{KIND_RECORDS, MAX_HANDLE, RECORD_SIZE, Record};
use super::state::{self, PageMeta};
use super::{PAGE, Reason};
use crate::base::counters::Counters;
use crate::base::error::{FsError, FsResult, answer};
use crate::base::pages::{self, DataRecord};
use crate::base::slots;
use crate::base::{Base, debug_check};
use crate::base::{Committed, OpTx};

/// A cached file's lower file for one call: kept open by the entry, or opened for the call
/// (past `CacheConfig::held_files`).
pub(crate) enum Io<'c, F> {
    Held(&'c F),
    Own(F),
}

impl<F> std::ops::Deref for Io<'_, F> {
    type Target = F;
    fn deref(&self) -> &F {
        match self {
            Io::Held(f) => f,
            Io::Own(f) => f,
        }
    }
}

/// Attempts of a cached read to read the lower file without the file's lock; the last one
/// holds it (a limit: a file written back over and over cannot starve its readers).
const READ_ATTEMPTS: u32 = 4;

/// The part of page `p` a read of `len` bytes at `offset` wants, as offsets in the page.
fn wanted(offset: u64, len: u64, p: u64) -> (usize, usize) {
    let from = (p * PAGE).max(offset) - p * PAGE;
    let to = ((p + 1) * PAGE).min(offset + len) - p * PAGE;
    (from as usize, to as usize)
}

impl<L: LowerFs> PageCache<L> {
    /// The cached file of `key`, if it has a record.
    pub(crate) fn cached(&self, key: (u64, u64)) -> Option<Arc<Cached<L>>> {
        if !self.config.enabled && self.counters.files.load(Ordering::Relaxed) == 0 {
            return None;
        }
        self.get(key)
    }

    /// The cached file of `node`, creating its record (in `otx`, committed at once; so this
    /// must be the operation's first change) from the lower file's size and times. `None`
    /// when the file has no usable handle (it is then written through).
    pub(crate) fn cache_entry(
        &self,
        b: &Base<L>,
        otx: &mut OpTx<'_>,
        node: &Arc<L::Node>,
        key: (u64, u64),
    ) -> FsResult<Option<Arc<Cached<L>>>> {
        if let Some(cf) = self.get(key) {
            return Ok(Some(cf));
        }
        // The file's stripe keeps other creators of its record, and direct changes of its
        // lower data, out while its size is read; only this file waits for the lower calls.
        let _stripe = self.stripe(key);
        if let Some(cf) = self.get(key) {
            return Ok(Some(cf));
        }
        let attr = b.lower.getattr(node)?;
        // No durable identity (a file system without file handles): written through.
        let handle = match b.lower.file_handle(node) {
            Ok(h) if !h.is_empty() && h.len() <= MAX_HANDLE => h,
            Ok(_) | Err(lower::Errno(libc::EOPNOTSUPP)) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let rec = Record {
            size: attr.size,
            valid: attr.size,
            mtime: attr.mtime,
            ctime: attr.ctime,
            serial: self.next_serial.fetch_add(1, Ordering::Relaxed),
            handle,
        };
        // The record in a reserved slot, or a fresh record frame listed after the commit (T6).
        let reserved = self.slots.lock().reserve();
        let made = slots::put_new(otx.tx(), KIND_RECORDS, reserved, &rec.encode());
        let ended = otx.end(made.map_err(FsError::from));
        self.slots.lock().settle_new(reserved, ended.as_ref().ok().copied());
        let place = ended?;
        let cf = Arc::new(self.new_file(key, place, Arc::clone(node), rec));
        self.insert(&cf);
        Ok(Some(cf))
    }

    /// The lower file opened read-write for fetches and buffered write-back.
    pub(crate) fn cache_io<'c>(b: &Base<L>, cf: &'c Cached<L>) -> FsResult<Io<'c, L::File>> {
        if let Some(f) = cf.io.get() {
            return Ok(Io::Held(f));
        }
        let f = b.lower.open(&cf.node, libc::O_RDWR)?;
        if !cf.may_hold() {
            return Ok(Io::Own(f)); // closed after this call (the held files' limit)
        }
        let _ = cf.io.set(f); // (another thread's won: ours is closed)
        Ok(Io::Held(cf.io.get().expect("set above")))
    }

    /// FIEMAP of the lower file, cached in the state until a write-back changes it.
    pub(super) fn extents<'s>(
        b: &Base<L>,
        cf: &Cached<L>,
        st: &'s mut state::CacheState,
    ) -> &'s [lower::Extent] {
        if st.extents.is_none() {
            // A file system without FIEMAP (tmpfs answers EOPNOTSUPP) places every page by
            // (file, page): location-aware policies then work on logical runs.
            let found = Self::cache_io(b, cf).ok().and_then(|f| b.lower.fiemap(&f).ok());
            st.extents = Some(found.unwrap_or_default());
        }
        st.extents.as_deref().unwrap_or_default()
    }

    /// A cached write of `data` at `offset` (see the module docs). On error nothing changed.
    ///
    /// Three phases under the file's lock: (1) without a transaction, the pages the write
    /// adds are planned (`nbw.rs`: new dirty pages - partial ones fetched from the lower file -
    /// or patches), located, their lower space reserved (every lower call happens here: no
    /// undo slot is held while a disk works); (2) one transaction writes NVRAM only and
    /// commits; (3) the volatile mirror.
    pub(crate) fn cached_write(
        &self,
        b: &Base<L>,
        otx: &mut OpTx<'_>,
        cf: &Arc<Cached<L>>,
        offset: u64,
        data: &[u8],
    ) -> FsResult<Option<usize>> {
        let mut st = cf.lock();
        if st.gone {
            return Ok(None); // written back and freed meanwhile: look it up again
        }
        let end = pages::write_end(offset, data.len())?;
        let plans = self.plan_write(b, cf, &mut st, offset, data)?;
        let unmapped =
            plans.iter().filter(|p| p.is_new() && matches!(p.loc(), Loc::Logical { .. })).count();
        b.reserve(unmapped as u64)?;
        // Phase 2: NVRAM only.
        let now = b.lower.now();
        let mut rec = st.rec.clone();
        rec.written(end, now);
        let mut touched: Vec<u64> = Vec::new();
        let state::CacheState { pages: dirty, patches, patch_frames, .. } = &mut *st;
        let frames = self.patch_tx(patch_frames, |pf| {
            let written = (|| -> Result<Vec<txn::FrameId>, txn::TxError> {
                let tx = otx.tx();
                for (page, in_page, done, n) in pages::pieces(offset, data.len()) {
                    if let Some(meta) = dirty.get(&page)
                        && !patches.contains_key(&page)
                    {
                        pages::store(tx, meta.frame, in_page, &data[done..done + n])?;
                        touched.push(page);
                    }
                }
                let frames = Self::write_plans(b, tx, cf.id(), &plans, pf)?;
                slots::put(tx, cf.record, &rec.encode())?;
                Ok(frames)
            })();
            // Commit (or roll back) before the file's lock is released (strict 2PL), then mirror.
            otx.end(written.map_err(FsError::from))
        })?;
        st.rec = rec;
        b.space.add(unmapped as u64);
        self.mirror_write(cf, &mut st, touched, plans, frames, now.0);
        debug_check!(st.check(cf.id()));
        Ok(Some(data.len()))
    }

    /// Phase 3 of a cached write: the volatile mirror of what its transaction committed.
    fn mirror_write(
        &self,
        cf: &Cached<L>,
        st: &mut state::CacheState,
        touched: Vec<u64>,
        plans: Vec<super::nbw::Plan>,
        frames: Vec<txn::FrameId>,
        now: i64,
    ) {
        use super::nbw::Plan;
        let c = &self.counters;
        let tick = self.tick();
        let mut queued = Vec::new();
        let mut t = self.tables();
        for page in touched {
            let meta = st.pages.get_mut(&page).expect("touched page is dirty");
            meta.version = tick;
            state::accessed(&mut t, c, meta, tick);
            inc(&c.hits);
        }
        for (plan, frame) in plans.into_iter().zip(frames) {
            let page = plan.page();
            if !plan.is_new() {
                // The page's patch, rewritten (perhaps moved) or replaced by a whole page.
                let meta = st.pages.get_mut(&page).expect("a patched page is in NVRAM");
                meta.version = tick;
                meta.frame = frame;
                state::accessed(&mut t, c, meta, tick);
                let old = st.patches.remove(&page).map_or(0, |p| p.len());
                match plan {
                    Plan::Page { completed, .. } => {
                        if completed {
                            inc(&self.nbw.pages_completed_without_fetch);
                        }
                        self.nbw.patch_removed(old);
                    }
                    Plan::Patch { patch, .. } => {
                        self.nbw.patch_resized(old, patch.len());
                        st.patches.insert(page, patch);
                        queued.push(page);
                    }
                }
                continue;
            }
            // Another file's write may have taken this block meanwhile (its location came from
            // an older FIEMAP: blocks move when a write-back cuts a file): one page per
            // location, so this one goes to its logical place. (The space was reserved by
            // the location seen in phase 1; only placement changes.)
            let reserved = matches!(plan.loc(), Loc::Logical { .. });
            let loc = if t.all.contains(plan.loc()) {
                Loc::Logical { object: cf.id(), index: page }
            } else {
                plan.loc()
            };
            let meta = PageMeta {
                frame,
                active: false,
                referenced: true,
                version: tick,
                last_use: tick,
                dirtied_at: now,
                loc,
                reserved,
            };
            state::add_page(&mut t, c, PageKey { object: cf.id(), index: page }, &meta);
            st.unmapped += u64::from(meta.reserved);
            st.pages.insert(page, meta);
            if let Plan::Patch { patch, .. } = plan {
                inc(&self.nbw.patches_created);
                self.nbw.patch_added(patch.len());
                st.patches.insert(page, patch);
                queued.push(page);
            }
        }
        drop(t);
        self.queue_fetches(cf.id(), queued);
    }

    /// Reads through the cache: the lower file's bytes below `valid`, zeros up to the size,
    /// dirty pages and patches over both. `None` when the record was freed meanwhile.
    ///
    /// The lower file is read without the file's lock (a cold read waits for the disk, and a
    /// writer of the same file - a patch, at NVRAM speed - must not wait behind it). What was
    /// read is used only if the size, `valid` and `lower_gen` are unchanged when the lock is
    /// taken again: then nothing changed the lower bytes below `valid` meanwhile (only a
    /// committed write-back does, and it bumps `lower_gen`), and every page written since is
    /// in NVRAM and laid over them. Otherwise it reads again; the last attempt holds the lock.
    pub(crate) fn cached_read(
        &self,
        b: &Base<L>,
        cf: &Cached<L>,
        file: &L::File,
        offset: u64,
        buf: &mut [u8],
    ) -> FsResult<Option<usize>> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let st = cf.lock();
            if st.gone {
                return Ok(None);
            }
            let seen = |st: &state::CacheState| (st.rec.size, st.rec.valid, st.lower_gen);
            let before = seen(&st);
            let Some(lower) = Self::lower_part(&st, offset, buf.len()) else {
                return self.read_nvram(b, cf, st, offset, buf, 0).map(Some);
            };
            // The last attempt keeps the lock across the lower read.
            let held = (attempt >= READ_ATTEMPTS).then_some(st);
            let from_lower = b.lower.read_full(file, offset, &mut buf[..lower])?;
            Counters::add(&b.counters.lower_bytes_read, from_lower as u64);
            let st = if let Some(st) = held {
                st
            } else {
                b.fail("cache.read_unlocked"); // (writers and write-back of the file go on)
                let st = cf.lock();
                if st.gone {
                    return Ok(None);
                }
                if seen(&st) != before {
                    continue;
                }
                st
            };
            return self.read_nvram(b, cf, st, offset, buf, from_lower).map(Some);
        }
    }

    /// How many bytes from `offset` a read of `len` must take from the lower file (below
    /// `valid`, and not every page in NVRAM over what it wants); `None` for none.
    fn lower_part(st: &state::CacheState, offset: u64, len: usize) -> Option<usize> {
        let size = st.rec.size;
        if offset >= size || offset >= st.rec.valid {
            return None;
        }
        let len = (len as u64).min(size - offset);
        let (first, last) = (offset / PAGE, (offset + len - 1) / PAGE);
        let in_nvram = |p: u64| {
            st.pages.contains_key(&p)
                && st.patches.get(&p).is_none_or(|patch| {
                    let (from, to) = wanted(offset, len, p);
                    patch.covers(from, to)
                })
        };
        if (first..=last).all(in_nvram) {
            return None;
        }
        Some(((st.rec.valid - offset).min(len)) as usize)
    }

    /// The rest of a cached read, under the file's lock: `buf[..from_lower]` holds the lower
    /// file's bytes; zeros up to the size, then the pages and patches in NVRAM over them.
    /// Returns the length read.
    fn read_nvram(
        &self,
        b: &Base<L>,
        cf: &Cached<L>,
        mut st: crate::base::sync::MutexGuard<'_, state::CacheState>,
        offset: u64,
        buf: &mut [u8],
        from_lower: usize,
    ) -> FsResult<usize> {
        let size = st.rec.size;
        if offset >= size {
            return Ok(0);
        }
        let len = (buf.len() as u64).min(size - offset) as usize;
        let buf = &mut buf[..len];
        let first = offset / PAGE;
        let last = (offset + len as u64 - 1) / PAGE;
        let nbw = &self.nbw;
        for (&p, patch) in st.patches.range(first..=last) {
            let (from, to) = wanted(offset, len as u64, p);
            inc(if patch.covers(from, to) {
                &nbw.reads_served_from_patches
            } else {
                &nbw.fetches_on_read
            });
        }
        buf[from_lower.min(len)..].fill(0);
        if st.atime_checked != st.rec.mtime {
            // relatime against the cached mtime (the lower file's own is older): the lower
            // file system would update atime on this read.
            st.atime_checked = st.rec.mtime;
            let a = b.lower.getattr(&cf.node)?;
            if a.atime <= st.rec.mtime || a.atime <= st.rec.ctime {
                b.lower.touch_atime(&cf.node)?;
            }
        }
        let tick = self.tick();
        let c = &self.counters;
        let mut t = None;
        let state::CacheState { pages: dirty, patches, .. } = &mut *st;
        for (&page, meta) in dirty.range_mut(first..=last) {
            let (lo, hi) = wanted(offset, len as u64, page);
            let at = (page * PAGE + lo as u64 - offset) as usize;
            let out = &mut buf[at..at + (hi - lo)];
            if let Some(patch) = patches.get(&page) {
                // The patched bytes over the lower ones read above.
                let mut whole = [0u8; PAGE as usize];
                whole[lo..hi].copy_from_slice(out);
                patch.apply(&mut whole);
                out.copy_from_slice(&whole[lo..hi]);
            } else {
                pages::load(&b.pool, meta.frame, lo as u64, out);
            }
            let t = t.get_or_insert_with(|| self.tables());
            state::accessed(t, c, meta, tick);
            inc(&c.hits);
        }
        Ok(len)
    }

    /// SEEK_DATA / SEEK_HOLE of a cached file: data is a dirty page or lower data below
    /// `valid`; everything else below the size is a hole. `None` when the record was freed.
    pub(crate) fn cached_seek(
        b: &Base<L>,
        cf: &Cached<L>,
        file: &L::File,
        offset: i64,
        whence: i32,
    ) -> FsResult<Option<i64>> {
        let st = cf.lock();
        if st.gone {
            return Ok(None);
        }
        let size = st.rec.size;
        let Ok(from) = u64::try_from(offset) else { return Err(answer(libc::ENXIO)) };
        if from >= size {
            return Err(answer(libc::ENXIO));
        }
        let valid = st.rec.valid;
        // The lower file's answer below `valid`, or None (ENXIO or beyond `valid`).
        let lower_seek = |at: u64, how: i32| -> FsResult<Option<u64>> {
            if at >= valid {
                return Ok(None);
            }
            match b.lower.lseek(file, i64::try_from(at).unwrap_or(i64::MAX), how) {
                Ok(x) => Ok(u64::try_from(x).ok()),
                Err(lower::Errno(libc::ENXIO)) => Ok(None),
                Err(e) => Err(e.into()),
            }
        };
        let found = if whence == libc::SEEK_DATA {
            let dirty = st.pages.range(from / PAGE..).next().map(|(&p, _)| (p * PAGE).max(from));
            let below = lower_seek(from, libc::SEEK_DATA)?.filter(|&x| x < valid);
            match (dirty, below) {
                (Some(a), Some(b)) => a.min(b),
                (Some(a), None) | (None, Some(a)) => a,
                (None, None) => return Err(answer(libc::ENXIO)),
            }
        } else {
            let mut pos = from;
            loop {
                if pos >= size {
                    break size;
                }
                if st.pages.contains_key(&(pos / PAGE)) {
                    pos = (pos / PAGE + 1) * PAGE;
                    continue;
                }
                match lower_seek(pos, libc::SEEK_HOLE)? {
                    // Lower data up to its next hole, but only below `valid` (pos < valid here).
                    Some(hole) if hole > pos => pos = hole.min(valid),
                    _ => break pos,
                }
            }
        };
        if found >= size && whence == libc::SEEK_DATA {
            return Err(answer(libc::ENXIO));
        }
        let found = found.min(size);
        Ok(Some(i64::try_from(found).map_err(|_| answer(libc::EOVERFLOW))?))
    }

    /// The record's size and times over the lower attributes of a cached file.
    pub(crate) fn cached_attr(&self, key: (u64, u64), attr: &mut Attr) {
        if let Some(cf) = self.cached(key) {
            let st = cf.lock();
            if !st.gone {
                attr.size = st.rec.size;
                attr.mtime = st.rec.mtime;
                attr.ctime = attr.ctime.max(st.rec.ctime);
                // Dirty pages without a lower block will take one at write-back.
                attr.blocks += st.unmapped * (PAGE / 512);
            }
        }
    }

    /// Truncate of a cached file (one transaction; the lower file is cut by the next
    /// write-back). `None` when the record was freed meanwhile.
    pub(crate) fn cached_truncate(
        &self,
        b: &Base<L>,
        otx: &mut OpTx<'_>,
        cf: &Cached<L>,
        size: u64,
    ) -> FsResult<Option<()>> {
        let mut st = cf.lock();
        if st.gone {
            return Ok(None);
        }
        pages::check_size(size)?;
        let pool = &b.pool;
        let old = st.rec.size;
        let now = b.lower.now();
        let mut gone: Vec<u64> =
            st.pages.range(pages::first_gone(size)..).map(|(&p, _)| p).collect();
        // The last page's patch loses what lies at or beyond the new size (P5): rewritten, or
        // freed when nothing is left of it.
        let cut = pages::tail(old, size);
        let tail = size / PAGE;
        let clipped = match (st.patches.get(&tail), cut) {
            (Some(p), Some((_, from, _))) => match p.merge(0, &[], from as usize) {
                super::patch::Merged::Patch(q) if !q.is_empty() => Some(Some(q)),
                _ => {
                    gone.push(tail);
                    Some(None)
                }
            },
            _ => None,
        };
        let mut rec = st.rec.clone();
        let state::CacheState { pages: dirty, patches, patch_frames, .. } = &mut *st;
        self.patch_tx(patch_frames, |pf| {
            let result = (|| -> Result<(), txn::TxError> {
                if let Some(Some(q)) = &clipped {
                    // Smaller than before: rewritten in its run.
                    pf.put(otx.tx(), pool, cf.id(), tail, &q.encode())?;
                } else if let Some((page, from, to)) = cut
                    && clipped.is_none()
                    && let Some(meta) = dirty.get(&page)
                {
                    // D2: the tail of the last page reads as zeros if the file grows again.
                    pages::zero_tail(otx.tx(), meta.frame, from, to)?;
                }
                for p in &gone {
                    if patches.contains_key(p) {
                        pf.remove(otx.tx(), pool, *p)?;
                    } else {
                        otx.tx().free_frame(dirty[p].frame)?;
                    }
                }
                rec.truncated(size, now);
                slots::put(otx.tx(), cf.record, &rec.encode())?;
                Ok(())
            })()
            .map_err(FsError::from);
            otx.end(result)
        })?;
        st.rec = rec;
        st.shrunk_to = st.shrunk_to.min(size);
        if let Some(Some(q)) = clipped {
            let old = st.patches.insert(tail, q.clone()).map_or(0, |p| p.len());
            self.nbw.patch_resized(old, q.len());
            st.pages.get_mut(&tail).expect("patched page").version = self.tick();
        }
        self.patches_gone(&mut st, gone.iter().copied());
        let gone: Vec<PageMeta> =
            gone.iter().map(|p| st.pages.remove(p).expect("page listed above")).collect();
        self.pages_clean(b, &mut st, &gone);
        debug_check!(st.check(cf.id()));
        Ok(Some(()))
    }

    /// The volatile side of pages that are no longer dirty (their transaction committed, they
    /// are out of `st.pages`): out of the zone tables, their lower-space reservation released.
    pub(crate) fn pages_clean<'m>(
        &self,
        b: &Base<L>,
        st: &mut state::CacheState,
        pages: impl IntoIterator<Item = &'m PageMeta>,
    ) {
        let mut unreserve = 0;
        let mut t = self.tables();
        for meta in pages {
            state::remove_page(&mut t, &self.counters, meta);
            unreserve += u64::from(meta.reserved);
        }
        st.unmapped -= unreserve;
        b.space.sub(unreserve);
    }

    /// An mtime set explicitly on a cached file (setattr; the lower file has it too, `attr`
    /// is what it says now): kept in the record, whose times the mount shows. `None` when the
    /// record was freed meanwhile.
    pub(crate) fn set_times(
        otx: &mut OpTx<'_>,
        cf: &Cached<L>,
        attr: &Attr,
    ) -> FsResult<Option<()>> {
        let mut st = cf.lock();
        if st.gone {
            return Ok(None);
        }
        let mut rec = st.rec.clone();
        rec.mtime = attr.mtime;
        rec.ctime = rec.ctime.max(attr.ctime);
        let r = slots::put(otx.tx(), cf.record, &rec.encode()).map_err(FsError::from);
        otx.end(r)?;
        st.rec = rec;
        debug_check!(st.check(cf.id()));
        Ok(Some(()))
    }

    /// Frees the record and pages of a deleted file without writing them (the kernel forgot
    /// its last reference and the lower file has no links left).
    pub(crate) fn drop_if_deleted(&self, b: &Base<L>, key: (u64, u64)) {
        let Some(cf) = self.cached(key) else { return };
        match b.lower.getattr(&cf.node) {
            Ok(a) if a.nlink == 0 => {}
            _ => return,
        }
        if let Err(e) = self.drop_cached(b, &cf) {
            b.incident(
                crate::base::Incident::FreeFailed,
                format_args!("nvstack: freeing the cached pages of a deleted file: {e}"),
            );
        }
    }

    /// Frees a file's record and dirty pages (one transaction) and forgets it.
    pub(crate) fn drop_cached(&self, b: &Base<L>, cf: &Cached<L>) -> FsResult<()> {
        let mut st = cf.lock();
        if st.gone {
            return Ok(());
        }
        let state::CacheState { pages, patches, patch_frames, .. } = &mut *st;
        self.patch_tx(patch_frames, |pf| {
            b.atomically(|tx| {
                for (page, meta) in pages.iter() {
                    if !patches.contains_key(page) {
                        tx.free_frame(meta.frame)?;
                    }
                }
                pf.free_all(tx)?;
                slots::remove(tx, cf.record, RECORD_SIZE)
            })
        })?;
        let pages = std::mem::take(&mut st.pages);
        Counters::add(&self.counters.pages_dropped, pages.len() as u64);
        self.forget_cached(b, cf, &mut st, &pages);
        Ok(())
    }

    /// The volatile side of freeing a record (its transaction committed): tables, counters,
    /// reservation, maps. Called with the file's state locked (the map's rank is later).
    pub(crate) fn forget_cached(
        &self,
        b: &Base<L>,
        cf: &Cached<L>,
        st: &mut state::CacheState,
        pages: &std::collections::BTreeMap<u64, PageMeta>,
    ) {
        self.pages_clean(b, st, pages.values());
        let patched: Vec<u64> = st.patches.keys().copied().collect();
        self.patches_gone(st, patched);
        st.gone = true;
        self.remove(cf);
        // Its record's removal committed: the slot is free again.
        b.release_slot(&self.slots, cf.record);
    }

    /// Checks the volatile mirror against itself (debug builds: the tests, and the engine at
    /// shutdown): every cached file's own invariants (`CacheState::check`), every dirty page of
    /// every cached file in the `all` table at its location, inactive ones in `inactive`,
    /// nothing else in either table, and the maps agree. Returns the pages whose lower space is
    /// reserved. Call it while no operation runs.
    #[cfg(debug_assertions)]
    pub(crate) fn check_cache(&self) -> Result<u64, String> {
        let files: Vec<_> = {
            let f = self.files.lock();
            if f.by_key.len() != f.by_object.len() {
                return Err(format!(
                    "{} files by key, {} by object",
                    f.by_key.len(),
                    f.by_object.len()
                ));
            }
            for (key, cf) in &f.by_key {
                if cf.key != *key || !f.by_object.get(&cf.id()).is_some_and(|o| Arc::ptr_eq(o, cf))
                {
                    return Err(format!("file {key:?} is not the same in both maps"));
                }
            }
            f.by_object.values().cloned().collect()
        };
        // Every file's pages first (file locks), then the tables (a later rank).
        let mut pages: Vec<(PageKey, PageMeta)> = Vec::new();
        let mut patch_frames = 0u64;
        let mut unmapped = 0u64;
        for cf in files {
            let st = cf.lock();
            if st.gone {
                return Err(format!("a freed file (frame {}) is still mapped", cf.id()));
            }
            // The file's own invariants (with where its patches lie), then its patch frames'
            // slot bookkeeping (every frame of them: here only, not after every operation).
            st.check(cf.id())?;
            unmapped += st.unmapped;
            st.patch_frames.check().map_err(|e| format!("frame {}: {e}", cf.id()))?;
            patch_frames += st.patch_frames.frame_count() as u64;
            pages.extend(
                st.pages.iter().map(|(&index, m)| (PageKey { object: cf.id(), index }, *m)),
            );
        }
        let counted = self.nbw.patch_frames.load(Ordering::Relaxed);
        if counted != patch_frames {
            return Err(format!("nbw.patch_frames {counted} but files hold {patch_frames}"));
        }
        let t = self.tables();
        let (mut all, mut inactive) = (0u64, 0u64);
        for (page, meta) in pages {
            let zone = |table: &ZoneTable| {
                table.zone(table.zone_of(meta.loc)).and_then(|z| z.pages.get(&meta.loc).copied())
            };
            if zone(&t.all) != Some(page) {
                return Err(format!("{page:?} at {:?} missing from the all table", meta.loc));
            }
            all += 1;
            let in_inactive = zone(&t.inactive) == Some(page);
            if in_inactive == meta.active {
                return Err(format!(
                    "{page:?}: active {} but in the inactive table {in_inactive}",
                    meta.active
                ));
            }
            inactive += u64::from(!meta.active);
        }
        if t.all.dirty_pages() != all || t.inactive.dirty_pages() != inactive {
            return Err(format!(
                "tables hold {} / {} pages, files {all} / {inactive}",
                t.all.dirty_pages(),
                t.inactive.dirty_pages()
            ));
        }
        let c = &self.counters;
        let (d, i) =
            (c.pages_dirty.load(Ordering::Relaxed), c.pages_inactive_dirty.load(Ordering::Relaxed));
        if (d, i) != (all, inactive) {
            return Err(format!(
                "counters say {d} / {i} dirty / inactive, files {all} / {inactive}"
            ));
        }
        Ok(unmapped)
    }

    /// Runs `f` on the lower file of `key` with no record in NVRAM and none able to start
    /// (the file's stripe held): the file is written back first if it has one. `f` gets the
    /// W1 proof for its lower changes.
    pub(crate) fn with_clean_lower<T>(
        &self,
        b: &Base<L>,
        key: (u64, u64),
        f: impl FnOnce(&Committed) -> FsResult<T>,
    ) -> FsResult<T> {
        let w1 = b.committed();
        // A limit: a file that writers keep dirtying between its write-back and the stripe
        // gets EAGAIN after a few attempts.
        for _ in 0..8 {
            if let Some(cf) = self.cached(key) {
                self.write_back_file(b, &cf, Reason::Coherence)?;
            }
            let stripe = self.stripe(key);
            if self.cached(key).is_none() {
                let r = f(&w1);
                drop(stripe);
                return r;
            }
        }
        Err(answer(libc::EAGAIN))
    }
}
