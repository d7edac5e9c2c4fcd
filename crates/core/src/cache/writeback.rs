//! Write-back of dirty pages to the lower file system (thesis 3.1.2, Figure 3.7 (c);
//! design.md section 11).
//!
//! A *round* runs when dirty pages pass the high watermark (until the low one), when a write
//! finds no free frame, on `nvstack flush`, at unmount, for pages older than
//! `--max-dirty-age`, and for one file before an operation that needs its lower file clean.
//! Under pressure it first *ages* the pages (the clock over the active list), then asks the
//! policy for a batch of NR_WB pages at a time.
//!
//! Protocol of one batch (failpoint names in brackets):
//! 1. Under each file's lock: copy the chosen pages and note their versions, the size S and
//!    `valid` V of the record.
//! 2. Without locks, per lower file: ftruncate(V) if the lower file is longer (its bytes
//!    beyond V are logically zero already); the pages in ascending location order over the
//!    whole batch, runs merged into one request, O_DIRECT where the lower file system takes
//!    it; ftruncate(S) and the record's mtime; then durable: fsync of a single file, one
//!    syncfs for several [writeback.written].
//! 3. One transaction with every file of the batch locked: free the pages whose version did
//!    not change (a page rewritten meanwhile stays dirty), V := min(S, smallest size since 1);
//!    a file left with no pages and V = size loses its record [writeback.freed].
//!
//! Crash safety: step 2 never changes the content a record defines (it rewrites bytes that
//! dirty pages cover, and cuts only beyond V), so a crash before step 3 leaves the file as it
//! was and the batch is written again later (same bytes at the same offsets); each step-3
//! commit is one transaction.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use lower::{Errno, LowerFs, SetAttr, TimeSet};

use super::Cached;
use super::PageCache;
use super::counters::inc;
use super::policy::{self, Loc, PageKey};
use super::record::{RECORD_SIZE, Record};
use super::state;
use super::{History, MAX_REMEMBERED, PAGE, Reason};
use crate::base::Committed;
use crate::base::Incident;
use crate::base::counters::Counters;
use crate::base::error::{FsError, FsResult};
use crate::base::slots;
use crate::base::{Base, debug_check};

/// How long a writer waiting for room sleeps before it looks again whether a round still
/// runs (a limit on a missed wake-up, not a pace: a freed batch wakes it at once).
const ROOM_WAIT: std::time::Duration = std::time::Duration::from_millis(50);

/// A page-aligned 4 KiB block (O_DIRECT buffers must be aligned).
#[derive(Clone, Copy)]
#[repr(C, align(4096))]
struct Block([u8; PAGE as usize]);

/// A batch as chosen: files with the page numbers to write.
type Batch<L> = Vec<(Arc<Cached<L>>, Vec<u64>)>;

/// One file's share of a batch.
struct BatchFile<L: LowerFs> {
    cf: Arc<Cached<L>>,
    size: u64,
    valid: u64,
    /// The first job of its file in this write-back call: cuts the lower file to `valid`. (A
    /// later job of the same file must not: the earlier job's pages beyond `valid` are
    /// written and not yet committed.)
    cut: bool,
    mtime: (i64, u32),
    /// The file for `repeated_pages`: a hash of its file handle, which names one file for its
    /// whole life (an inode number is reused by the next file created).
    file_id: u64,
    /// (page index, location, version), ascending by index; `data` holds them in this order
    /// (a zero block for a patched page).
    pages: Vec<(u64, Loc, u64)>,
    data: Vec<Block>,
    /// The patches of the patched pages among `pages`: only their bytes are written.
    patches: BTreeMap<u64, super::patch::Patch>,
}

fn bytes(blocks: &[Block]) -> &[u8] {
    // SAFETY: `Block` is a plain byte array with no padding (size = 4096 = alignment), so a
    // slice of blocks is a contiguous run of initialized bytes.
    unsafe {
        std::slice::from_raw_parts(blocks.as_ptr().cast::<u8>(), blocks.len() * PAGE as usize)
    }
}

fn next(loc: Loc) -> Loc {
    match loc {
        Loc::Physical(b) => Loc::Physical(b + 1),
        Loc::Logical { object, index } => Loc::Logical { object, index: index + 1 },
    }
}

impl<L: LowerFs> PageCache<L> {
    /// After a cached write: a pressure round when dirty pages passed the high watermark
    /// (one round at a time; others go on writing). With `--writeback-background` the
    /// daemon's thread runs the rounds and the writer goes on (it meets write-back only when
    /// NVRAM is full: `writeback_for_room`).
    pub(crate) fn after_cached_write(&self, b: &Base<L>) {
        if !self.config.background {
            self.round_above_high(b, Reason::Pressure);
        } else if self.cache_frames() > self.limits.high_pages {
            self.writer_bell.ring();
        }
    }

    /// Rung when a write leaves the cache above its high watermark (background mode): the
    /// daemon's writer sleeps on it between rounds (`sync::Bell`).
    pub(crate) fn writer_bell(&self) -> &crate::base::sync::Bell {
        &self.writer_bell
    }

    /// `--writeback-background`: the daemon's write-back thread calls this in a loop: the
    /// writer's pressure round, run there instead (counted `writeback.rounds.background`);
    /// returns the pages written. Why: a round in a writer's request made that one write wait
    /// for the whole round - measured on the ssd model, 128-byte random writes at the nbw
    /// experiment's scale 1: one write of 11 s (`--nbw off`, 25,237 pages) and one of 41 s
    /// (`async-bg`, 25,385 pages).
    pub(crate) fn writeback_in_background(&self, b: &Base<L>) -> u64 {
        self.round_above_high(b, Reason::Background)
    }

    /// When the cache holds more frames than the high watermark, one pressure round down to
    /// the low one, counted under `reason`; the pages written (0: nothing due, another round
    /// runs, or the round failed - said on stderr; the next write or look tries again).
    fn round_above_high(&self, b: &Base<L>, reason: Reason) -> u64 {
        let high = self.limits.high_pages;
        if self.cache_frames() <= high {
            return 0;
        }
        let Some(mut history) = self.round.try_lock() else { return 0 };
        let held = self.cache_frames();
        if held <= high {
            return 0;
        }
        let target = held - self.limits.low_pages.min(held);
        self.pressure_round(b, &mut history, reason, target).unwrap_or_else(|e| {
            b.incident(
                Incident::WritebackFailed,
                format_args!("nvstack: {} write-back failed: {e}", reason.name()),
            );
            0
        })
    }

    /// Frames the page cache holds: dirty pages, the frames patches are packed in, and the
    /// frames the records are packed in (the watermarks are about NVRAM). `pages_dirty` counts
    /// patched pages too, which share frames. No lock: called after every cached write.
    pub(super) fn cache_frames(&self) -> u64 {
        let (c, n) = (&self.counters, &self.nbw);
        let pages = c.pages_dirty.load(Ordering::Relaxed);
        let patched = n.patches.load(Ordering::Relaxed).min(pages);
        pages - patched + n.patch_frames.load(Ordering::Relaxed) + self.slots.frames()
    }

    /// A write found no free frame: a round down to the low watermark, at least one batch.
    /// While another round runs (the background writer's, or another writer's) the writer
    /// waits only until that round frees one batch (`writeback.room_waits`), then tries
    /// again: waiting for the whole round made one write wait for it - measured on the ssd
    /// model, 4 KiB random writes at the nbw experiment's scale 1 with
    /// `--writeback-background on`: writes of 14-20 s, against 7-10 s with the round in the
    /// writer. Returns the pages this call wrote (0 after a wait).
    pub(crate) fn writeback_for_room(&self, b: &Base<L>) -> FsResult<u64> {
        loop {
            if let Some(mut history) = self.round.try_lock() {
                let held = self.cache_frames();
                let target = (held - self.limits.low_pages.min(held)).max(self.config.batch_pages);
                return self.pressure_round(b, &mut history, Reason::NvramFull, target);
            }
            // (A batch freed between the failed try and this wait is missed; the timeout
            // bounds what that costs, and a round that ended is found by the next try.)
            let room = self.room.lock();
            let seen = *room;
            let room = self.room_freed.wait_timeout(room, ROOM_WAIT);
            if *room != seen {
                inc(&self.counters.room_waits);
                return Ok(0);
            }
        }
    }

    /// After a batch's pages were freed: wakes the writers waiting for room.
    fn room_freed(&self) {
        *self.room.lock() += 1;
        self.room_freed.notify_all();
    }

    /// Ages, then writes back batches chosen by the policy until `target` pages went.
    fn pressure_round(
        &self,
        b: &Base<L>,
        history: &mut History,
        reason: Reason,
        target: u64,
    ) -> FsResult<u64> {
        inc(&self.counters.rounds[reason as usize]);
        self.age_all();
        let mut written = 0u64;
        let mut idle_passes = 0;
        // A limit on the loop: a batch that frees nothing (every chosen page rewritten
        // meanwhile) counts; three in a row end the round.
        let mut fruitless = 0;
        while written < target && fruitless < 3 {
            let want = (target - written).min(self.config.batch_pages).max(1) as usize;
            let mut chosen = self.select(want);
            if chosen.is_empty() {
                // Every dirty page is active: age again (at most twice: the first pass clears
                // references, the second demotes), then take any dirty page by location.
                idle_passes += 1;
                if idle_passes <= 2 {
                    self.age_all();
                    continue;
                }
                chosen = policy::by_zones(&self.tables().all, want);
                if chosen.is_empty() {
                    break;
                }
            }
            let freed = self.write_pages(b, history, &chosen)?;
            if freed == 0 {
                fruitless += 1;
                if std::env::var_os("NVSTACK_DEBUG_WB").is_some() {
                    self.explain(&chosen);
                }
            } else {
                fruitless = 0;
            }
            written += freed;
        }
        Ok(written)
    }

    /// Why chosen pages were not freed (debugging aid, NVSTACK_DEBUG_WB).
    fn explain(&self, chosen: &[(PageKey, Loc)]) {
        for &(page, loc) in chosen.iter().take(4) {
            let Some(cf) = self.by_object(page.object) else {
                // not an incident: a debugging aid asked for by NVSTACK_DEBUG_WB, not a failure
                eprintln!("nvstack: write-back chose {page:?} at {loc:?}: no such cached file");
                continue;
            };
            let st = cf.lock();
            let meta = st.pages.get(&page.index).copied();
            // not an incident: a debugging aid asked for by NVSTACK_DEBUG_WB, not a failure
            eprintln!(
                "nvstack: write-back chose {page:?} at {loc:?}: gone {}, meta {meta:?}",
                st.gone
            );
        }
    }

    /// The clock over every dirty page (`state::age`).
    fn age_all(&self) {
        for cf in self.all() {
            let mut st = cf.lock();
            let mut t = self.tables();
            for (&index, meta) in &mut st.pages {
                state::age(&mut t, &self.counters, PageKey { object: cf.id(), index }, meta);
            }
        }
    }

    /// The policy's choice of at most about `want` pages.
    fn select(&self, want: usize) -> Vec<(PageKey, Loc)> {
        let policy = &self.policy;
        let mut files = Vec::new();
        let mut lru = Vec::new();
        if policy.uses_files() || policy.uses_lru() {
            let mut all = self.all();
            all.sort_by_key(|cf| cf.lock().rec.serial);
            for cf in all {
                let st = cf.lock();
                if policy.uses_files() {
                    files.push((cf.id(), st.pages.iter().map(|(&i, m)| (i, m.loc)).collect()));
                }
                if policy.uses_lru() {
                    lru.extend(st.pages.iter().filter(|(_, m)| !m.active).map(|(&index, m)| {
                        (m.last_use, PageKey { object: cf.id(), index }, m.loc)
                    }));
                }
            }
            lru.sort_unstable();
        }
        let mut t = self.tables();
        t.files = files;
        t.inactive_lru = lru.into_iter().map(|(_, p, l)| (p, l)).collect();
        let chosen = policy.select(&t, want);
        t.files = Vec::new();
        t.inactive_lru = Vec::new();
        chosen
    }

    /// Writes back the chosen pages in batches of NR_WB; returns pages written.
    ///
    /// A policy may choose more than asked (`file` takes whole files, `location` and `relo`
    /// whole zones, as the thesis does); they are written in location order, NR_WB pages a
    /// batch, so that a batch's copy and its freeing transaction stay bounded.
    fn write_pages(
        &self,
        b: &Base<L>,
        history: &mut History,
        chosen: &[(PageKey, Loc)],
    ) -> FsResult<u64> {
        let batches = chosen
            .chunks(self.config.batch_pages.max(1) as usize)
            .map(|chunk| {
                let mut by_file: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
                for (page, _) in chunk {
                    by_file.entry(page.object).or_default().push(page.index);
                }
                by_file
                    .into_iter()
                    .filter_map(|(object, pages)| self.by_object(object).map(|cf| (cf, pages)))
                    .collect()
            })
            .collect();
        self.write_batches(b, history, batches)
    }

    /// Writes back every page of one file and frees its record (coherence: an operation
    /// needs the lower file as the application sees it).
    pub(crate) fn write_back_file(
        &self,
        b: &Base<L>,
        cf: &Arc<Cached<L>>,
        reason: Reason,
    ) -> FsResult<()> {
        let mut history = self.round.lock();
        inc(&self.counters.rounds[reason as usize]);
        // A limit: the file's pages in batches, then a few passes for a record left by a
        // truncate meanwhile; a file rewritten without pause ends with EAGAIN.
        let batch = self.config.batch_pages.max(1);
        let most = (cf.lock().pages.len() as u64).div_ceil(batch) + 8;
        for _ in 0..most {
            let pages: Vec<u64> = {
                let st = cf.lock();
                if st.gone {
                    return Ok(());
                }
                st.pages.keys().take(batch as usize).copied().collect()
            };
            self.write_batch(b, &mut history, vec![(Arc::clone(cf), pages)])?;
        }
        if cf.lock().gone { Ok(()) } else { Err(FsError::Lower(Errno(libc::EAGAIN))) }
    }

    /// Writes back every dirty page of every file (flush, unmount, cache off at mount), in
    /// batches by location; `progress(done, total)` after each batch.
    pub(crate) fn flush_cache(
        &self,
        b: &Base<L>,
        reason: Reason,
        progress: &mut dyn FnMut(u64, u64),
    ) -> (u64, Option<FsError>) {
        let mut history = self.round.lock();
        inc(&self.counters.rounds[reason as usize]);
        let total = self.pages_dirty();
        let mut done = 0u64;
        let batch = self.config.batch_pages.max(1) as usize;
        // A limit: what was dirty when the flush began, twice over (writers go on meanwhile),
        // and three batches in a row that free nothing end it with an error.
        let most = 2 * total.div_ceil(batch as u64) + 16;
        let mut fruitless = 0;
        for _ in 0..most {
            let chosen = policy::by_zones(&self.tables().all, batch);
            if chosen.is_empty() {
                break;
            }
            match self.write_pages(b, &mut history, &chosen) {
                Ok(0) => {
                    fruitless += 1;
                    if fruitless == 3 {
                        let e = FsError::Lower(Errno(libc::EAGAIN));
                        b.incident(
                            Incident::WritebackStalled,
                            format_args!(
                                "nvstack: write-back made no progress (pages rewritten meanwhile)"
                            ),
                        );
                        return (done, Some(e));
                    }
                }
                Ok(n) => {
                    done += n;
                    fruitless = 0;
                }
                Err(e) => return (done, Some(e)),
            }
            progress(done.min(total), total.max(done));
        }
        // Records left without pages (a truncate, a failed first write): fix the lower size.
        for cf in self.all() {
            if let Err(e) = self.write_batch(b, &mut history, vec![(cf, Vec::new())]) {
                return (done, Some(e));
            }
        }
        // Record frames left without records are not kept as room after a flush.
        match b.free_empty_slots(&self.slots, 0) {
            Ok(_) => (done, None),
            Err(e) => (done, Some(e)),
        }
    }

    /// Writes back the pages dirty for longer than `--max-dirty-age` (called about once a
    /// second by the front end's timer).
    pub(crate) fn writeback_aged(&self, b: &Base<L>) -> FsResult<u64> {
        let age = self.config.max_dirty_age;
        if age == 0 || self.pages_dirty() == 0 {
            return Ok(0);
        }
        let limit = b.lower.now().0.saturating_sub(i64::try_from(age).unwrap_or(i64::MAX));
        let mut old: Vec<(PageKey, Loc)> = Vec::new();
        for cf in self.all() {
            let st = cf.lock();
            old.extend(
                st.pages
                    .iter()
                    .filter(|(_, m)| m.dirtied_at <= limit)
                    .map(|(&index, m)| (PageKey { object: cf.id(), index }, m.loc)),
            );
        }
        if old.is_empty() {
            return Ok(0);
        }
        let mut history = self.round.lock();
        inc(&self.counters.rounds[Reason::Age as usize]);
        policy::sort_by_location(&mut old);
        let mut written = 0;
        for chunk in old.chunks(self.config.batch_pages.max(1) as usize) {
            written += self.write_pages(b, &mut history, chunk)?;
        }
        Ok(written)
    }

    /// One batch (see the module docs). Returns the pages freed.
    fn write_batch(&self, b: &Base<L>, history: &mut History, batch: Batch<L>) -> FsResult<u64> {
        self.write_batches(b, history, vec![batch])
    }

    /// Steps 1 and 2 of every batch, one durability point for all of them (fsync when they
    /// are all one file, else syncfs), then step 3 batch by batch (each its own bounded
    /// transaction). A file met again in a later batch of the same call keeps the
    /// `shrunk_to` of its first snapshot, so every commit sees every truncate since the first.
    fn write_batches(
        &self,
        b: &Base<L>,
        history: &mut History,
        batches: Vec<Batch<L>>,
    ) -> FsResult<u64> {
        let mut seen = std::collections::HashSet::new();
        let mut written: Vec<Vec<BatchFile<L>>> = Vec::new();
        for batch in batches {
            let mut jobs = Self::snapshot(b, batch, &mut seen);
            if jobs.is_empty() {
                continue;
            }
            // W1: the pages copied are committed state, made durable now (journal mode; a
            // no-op otherwise) - after the copy, so that a write committed between a group
            // commit and the copy does not reach the lower file before its group does.
            let w1 = b.committed();
            self.write_lower(b, &w1, history, &jobs)?;
            for job in &mut jobs {
                job.data = Vec::new(); // written: only the versions are needed now
            }
            written.push(jobs);
        }
        let Some(first) = written.first().and_then(|jobs| jobs.first()) else { return Ok(0) };
        if written.iter().flatten().all(|job| Arc::ptr_eq(&job.cf, &first.cf)) {
            b.lower.fsync(&*Self::cache_io(b, &first.cf)?, false)?;
        } else {
            b.syncfs_lower()?;
        }
        inc(&self.counters.syncs);
        b.fail("writeback.written");
        let mut freed = 0;
        for jobs in &written {
            freed += self.commit_batch(b, jobs)?;
            self.room_freed();
            b.fail("writeback.freed");
            inc(&self.counters.batches);
        }
        Ok(freed)
    }

    /// Step 1 for one batch.
    fn snapshot(
        b: &Base<L>,
        mut batch: Batch<L>,
        seen: &mut std::collections::HashSet<u64>,
    ) -> Vec<BatchFile<L>> {
        batch.sort_by_key(|(cf, _)| cf.id());
        let mut jobs: Vec<BatchFile<L>> = Vec::new();
        for (cf, mut indices) in batch {
            indices.sort_unstable();
            indices.dedup();
            let mut st = cf.lock();
            if st.gone {
                continue;
            }
            let mut job = BatchFile {
                cf: Arc::clone(&cf),
                size: st.rec.size,
                valid: st.rec.valid,
                cut: false,
                mtime: st.rec.mtime,
                file_id: {
                    use std::hash::{Hash, Hasher};
                    let mut h = std::hash::DefaultHasher::new();
                    st.rec.handle.hash(&mut h);
                    h.finish()
                },
                pages: Vec::new(),
                data: Vec::new(),
                patches: BTreeMap::new(),
            };
            for index in indices {
                let Some(meta) = st.pages.get(&index) else { continue };
                let mut block = Block([0; PAGE as usize]);
                if let Some(patch) = st.patches.get(&index) {
                    job.patches.insert(index, patch.clone());
                } else {
                    b.pool.read(b.pool.frame_offset(meta.frame), &mut block.0);
                }
                job.pages.push((index, meta.loc, meta.version));
                job.data.push(block);
            }
            job.cut = seen.insert(cf.id());
            if job.cut {
                st.shrunk_to = st.rec.size;
            }
            jobs.push(job);
        }
        jobs
    }

    fn write_lower(
        &self,
        b: &Base<L>,
        w1: &Committed,
        history: &mut History,
        jobs: &[BatchFile<L>],
    ) -> FsResult<()> {
        // Cut what lies beyond `valid` first: those bytes are zero to the application.
        for job in jobs.iter().filter(|job| job.cut) {
            let io = Self::cache_io(b, &job.cf)?;
            let lower_size = b.lower.getattr(&job.cf.node)?.size;
            if lower_size > job.valid {
                let set = SetAttr { size: Some(job.valid), ..SetAttr::default() };
                b.lower.setattr(w1, &job.cf.node, Some(&io), &set)?;
            }
        }
        // Every whole page of the batch in ascending location order; runs become one request.
        let mut order: Vec<(Loc, usize, usize)> = jobs
            .iter()
            .enumerate()
            .flat_map(|(j, job)| {
                job.pages
                    .iter()
                    .enumerate()
                    .filter(|(_, (index, _, _))| !job.patches.contains_key(index))
                    .map(move |(p, &(_, loc, _))| (loc, j, p))
            })
            .collect();
        order.sort_unstable();
        let mut i = 0;
        while i < order.len() {
            let (loc, j, p) = order[i];
            let mut run = 1;
            while i + run < order.len() {
                let (l2, j2, p2) = order[i + run];
                let (prev_loc, _, prev_p) = order[i + run - 1];
                if j2 != j
                    || p2 != prev_p + 1
                    || jobs[j].pages[p2].0 != jobs[j].pages[prev_p].0 + 1
                    || l2 != next(prev_loc)
                {
                    break;
                }
                run += 1;
            }
            self.write_run(b, w1, history, &jobs[j], p..p + run, loc)?;
            i += run;
        }
        // Patched pages: only the patched bytes (the lower file system reads the rest of its
        // block if it does not hold it: the page's fetch, done by the write-back).
        for job in jobs {
            for (&index, patch) in &job.patches {
                self.write_patch(b, w1, history, job, index, patch)?;
            }
        }
        // Size and mtime as the record says, then durable.
        for job in jobs {
            let io = Self::cache_io(b, &job.cf)?;
            let set = SetAttr {
                size: Some(job.size),
                mtime: Some(TimeSet::At(job.mtime.0, job.mtime.1)),
                ..SetAttr::default()
            };
            b.lower.setattr(w1, &job.cf.node, Some(&io), &set)?;
        }
        Ok(())
    }

    /// One lower write request: the pages of `job` at positions `run`, the first at `loc`.
    fn write_run(
        &self,
        b: &Base<L>,
        w1: &Committed,
        history: &mut History,
        job: &BatchFile<L>,
        run: std::ops::Range<usize>,
        loc: Loc,
    ) -> FsResult<()> {
        let (p, run) = (run.start, run.len());
        let cf = &job.cf;
        let offset = job.pages[p].0 * PAGE;
        let data = bytes(&job.data[p..p + run]);
        // (A file past the held files' limit opens it for this request.)
        let own;
        let direct = if cf.may_hold() {
            cf.direct.get_or_init(|| b.lower.open_direct(&cf.node, true).ok().flatten())
        } else {
            own = b.lower.open_direct(&cf.node, true).ok().flatten();
            &own
        };
        let mut done = 0usize;
        let mut use_direct = direct.is_some();
        while done < data.len() {
            let at = offset + done as u64;
            let result = match direct {
                Some(d) if use_direct => b.lower.write(w1, d, at, &data[done..]),
                _ => b.lower.write(w1, &*Self::cache_io(b, cf)?, at, &data[done..]),
            };
            match result {
                Ok(0) => return Err(Errno(libc::EIO).into()),
                Ok(n) => done += n,
                // The lower file system refused this O_DIRECT request (alignment): buffered.
                Err(Errno(libc::EINVAL)) if use_direct => use_direct = false,
                Err(e) => return Err(e.into()),
            }
        }
        let c = &self.counters;
        Counters::add(&b.counters.lower_bytes_written, data.len() as u64);
        inc(&c.requests);
        Counters::add(&c.pages_written, run as u64);
        for &(index, _, _) in &job.pages[p..p + run] {
            let id = (job.file_id, index);
            if history.written.contains(&id) {
                inc(&c.repeated_pages);
            } else if history.written.len() < MAX_REMEMBERED {
                history.written.insert(id);
            }
        }
        if let Loc::Physical(block) = loc {
            if let Some(end) = history.last_end {
                Counters::add(&c.inter_request_distance_blocks, block.abs_diff(end));
            }
            history.last_end = Some(block + run as u64);
        }
        Ok(())
    }

    /// The byte ranges of one patched page, buffered (they are not block-aligned).
    fn write_patch(
        &self,
        b: &Base<L>,
        w1: &Committed,
        history: &mut History,
        job: &BatchFile<L>,
        index: u64,
        patch: &super::patch::Patch,
    ) -> FsResult<()> {
        let io = Self::cache_io(b, &job.cf)?;
        let c = &self.counters;
        for (o, piece) in patch.pieces() {
            let n = piece.len();
            let mut done = 0;
            while done < n {
                let at = index * PAGE + (o + done) as u64;
                match b.lower.write(w1, &io, at, &piece[done..])? {
                    0 => return Err(Errno(libc::EIO).into()),
                    k => done += k,
                }
            }
            inc(&c.requests);
            Counters::add(&b.counters.lower_bytes_written, n as u64);
        }
        inc(&c.pages_written);
        inc(&self.nbw.fetches_on_writeback);
        let id = (job.file_id, index);
        if history.written.contains(&id) {
            inc(&c.repeated_pages);
        } else if history.written.len() < MAX_REMEMBERED {
            history.written.insert(id);
        }
        Ok(())
    }

    /// Step 3: one transaction over every file of the batch, all locked in object order.
    fn commit_batch(&self, b: &Base<L>, jobs: &[BatchFile<L>]) -> FsResult<u64> {
        // Jobs are in record-frame order (`snapshot`), the order several file locks are taken.
        let mut states: Vec<_> = jobs.iter().map(|j| j.cf.lock()).collect();
        for st in &mut states {
            st.patch_frames.begin();
        }
        let plans = b.atomically(|tx| {
            let mut plans: Vec<(Vec<u64>, Record, bool)> = Vec::new();
            for (job, st) in jobs.iter().zip(states.iter_mut()) {
                if st.gone {
                    plans.push((Vec::new(), st.rec.clone(), false));
                    continue;
                }
                let mut rec = st.rec.clone();
                rec.valid = job.size.min(st.shrunk_to).min(rec.size);
                // A page is clean when it is unchanged since step 1 and every byte of it below
                // the file's size lies below the new `valid` (bytes beyond `valid` are hidden in
                // the lower file: a page written after a truncate stays dirty there).
                let below = |index: u64| ((index + 1) * PAGE).min(rec.size) <= rec.valid;
                let mut clean = Vec::new();
                let state::CacheState { pages, patches, patch_frames, .. } = &mut **st;
                for &(index, _, version) in &job.pages {
                    if let Some(meta) = pages.get(&index)
                        && meta.version == version
                        && below(index)
                    {
                        if patches.contains_key(&index) {
                            patch_frames.remove(tx, &b.pool, index)?;
                        } else {
                            tx.free_frame(meta.frame)?;
                        }
                        clean.push(index);
                    }
                }
                // The record goes only when the lower file is exactly the content: no page
                // left, nothing hidden, and the size step 2 gave the lower file is still the
                // file's (a truncate since step 1 leaves the lower file longer: the record
                // keeps hiding that tail until the next write-back cuts it).
                let free_record =
                    clean.len() == st.pages.len() && rec.valid == rec.size && rec.size == job.size;
                if free_record {
                    slots::remove(tx, job.cf.record, RECORD_SIZE)?;
                } else {
                    slots::put(tx, job.cf.record, &rec.encode())?;
                }
                plans.push((clean, rec, free_record));
            }
            Ok(plans)
        });
        for st in &mut states {
            self.settle_patches(&mut st.patch_frames, plans.is_ok());
        }
        let plans = plans?;
        // Committed: the volatile mirror, still under every file's lock.
        let mut freed = 0u64;
        for ((job, st), (clean, rec, free_record)) in jobs.iter().zip(states.iter_mut()).zip(plans)
        {
            if st.gone {
                continue;
            }
            let mut gone_pages = BTreeMap::new();
            self.patches_gone(st, clean.iter().copied());
            for index in clean {
                let meta = st.pages.remove(&index).expect("page freed above");
                gone_pages.insert(index, meta);
            }
            freed += gone_pages.len() as u64;
            st.rec = rec;
            st.extents = None; // the lower allocation changed
            st.lower_gen += 1; // step 2 wrote the lower file (cached_read)
            if free_record {
                self.forget_cached(b, &job.cf, st, &gone_pages);
            } else {
                self.pages_clean(b, st, gone_pages.values());
            }
            debug_check!(st.check(job.cf.id()));
        }
        Ok(freed)
    }
}
