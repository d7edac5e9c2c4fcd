//! The transform: a temp file becomes a lower file (design.md section 10), alone or in groups,
//! and its triggers (size, NVRAM pressure, flush, unmount). Recovery of interrupted transforms
//! is in `recovery.rs`.
//!
//! Protocol (each numbered step is a persistence point; failpoint names in brackets):
//! 1. One transaction marks the record `Transforming` [transform.marked]. From now on the
//!    file's name, size and data are frozen: writers, truncates and namespace changes of this
//!    file wait (the condition variable), readers go on.
//! 2. In the file's lower directory create the hidden file `.nvstack-transform-<serial>`
//!    (an old one from an interrupted attempt is replaced), fallocate the size (one contiguous
//!    allocation where the lower file system can), write the resident pages, set size, owner,
//!    mode and times, fsync it [transform.copied].
//! 3. rename it onto the file's name - atomically replacing a shadowed lower file - and fsync
//!    the directory [transform.renamed].
//! 4. One transaction frees the record and the data frames [transform.freed]; the index
//!    forgets the name, the inode table re-keys the node id to the new lower file.
//!
//! Recovery: a record found `Transforming` is redone from step 2. Every step is idempotent
//! given the record (step 2 recreates the hidden file, step 3 renames the same content onto the
//! same name), so a crash at any point, also during recovery, ends with the file transformed
//! completely, and the only hidden file that can exist belongs to a `Transforming` record (no
//! orphans: it is created after step 1 and gone before step 4). A failure in step 2 or 3 (the
//! lower file system said no) removes the hidden file and returns the record to `Live`.

use std::ffi::OsString;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use lower::{Creds, FileKind, LowerFs, SetAttr, TimeSet};

use crate::base::Committed;
use crate::base::counters::Counters;
use crate::base::error::{FsError, FsResult, answer};
use crate::base::inodes::Identity;
use crate::base::slots::SLOTS;
use crate::engine::Engine;
use crate::tempfs::names::Obj;
use crate::tempfs::overlay::DirKey;
use crate::tempfs::{self, Fate, Record, State, TempFile, Trigger, data};

/// The transform writes runs of resident pages in chunks of at most this many (1 MiB).
const CHUNK_PAGES: u64 = 256;

/// Files transformed together by `transform_group` (bounds how long a file stays frozen).
const GROUP: usize = 256;

/// A background round: at most this many files as one group, and at most
/// `BACKGROUND_BATCHES` x NR_WB frames. Larger than a writer's round because no writer waits
/// for it and the files are the least recently used: the two syncfs of a group are shared by
/// four times the files (on hdd-7200, groups of 1,024 small files transformed 16,384 files in
/// 10 s where groups of 128 transformed 3,079).
const BACKGROUND_GROUP: usize = 1024;
const BACKGROUND_BATCHES: u64 = 8;

/// How a transform makes its lower writes durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sync {
    /// fsync of the file, fsync of the directory (one file alone).
    PerFile,
    /// one syncfs of the lower file system for a whole group.
    Group,
}

/// One file's transform in progress.
struct TransformJob<L: LowerFs> {
    f: Arc<TempFile>,
    rec: Record,
    pages: std::collections::BTreeMap<u64, txn::FrameId>,
    key: DirKey,
    dir: Arc<L::Node>,
    hidden: OsString,
    span: Option<u64>,
    written: u64,
    /// W1: taken after step 1's commit; covers the record and pages this job copies.
    w1: Committed,
}

impl<L: LowerFs> Engine<L> {
    /// Transforms `f` into a lower file (see the module docs). Returns when it is done, also
    /// when another thread did it; a file that is unlinked or freed is left alone.
    pub fn transform(&self, f: &Arc<TempFile>, trigger: Trigger) -> FsResult<()> {
        match self.mark(f)? {
            Some(w1) => self.finish_transform(f, trigger, w1),
            None => Ok(()),
        }
    }

    /// Steps 2-4 for a file whose record is `Transforming` (`w1`: taken after that record
    /// committed).
    pub(super) fn finish_transform(
        &self,
        f: &Arc<TempFile>,
        trigger: Trigger,
        w1: Committed,
    ) -> FsResult<()> {
        let result = self.prepare(f, w1).and_then(|mut job| {
            self.copy_step(&mut job, Sync::PerFile)?;
            let node = self.rename_step(&job, Sync::PerFile)?;
            self.free_step(&job, node, trigger)
        });
        if result.is_err() {
            self.back_to_live(f);
        }
        f.notify();
        result
    }

    /// After a failed step 2 or 3 the file stays in NVRAM, correct and complete. Its name may
    /// now have a lower file (the rename of step 3 may have happened), so it shadows one from
    /// now on (O1; unlinking a name without a lower file is harmless).
    fn back_to_live(&self, f: &TempFile) {
        let mut st = f.lock();
        if st.fate == Fate::Resident && st.rec.state == State::Transforming {
            let mut rec = st.rec.clone();
            rec.state = State::Live;
            rec.set_shadows(true);
            // On failure (NVRAM full) the record stays Transforming: the next attempt or the
            // next mount finishes the transform.
            if self.base.atomically(|tx| data::put_record(tx, f.place, &rec)).is_ok() {
                st.rec = rec;
            }
        }
    }

    /// What steps 2-4 need, read once: the state is frozen while Transforming.
    fn prepare(&self, f: &Arc<TempFile>, w1: Committed) -> FsResult<TransformJob<L>> {
        let (rec, pages, key) = {
            let st = f.lock();
            (st.rec.clone(), st.pages.clone(), st.dir)
        };
        let dir = {
            let idx = self.temp.overlay.lock();
            Arc::clone(&idx.dirs.get(&key).ok_or(answer(libc::ESTALE))?.node)
        };
        let hidden = tempfs::hidden_name(rec.serial);
        let f = Arc::clone(f);
        Ok(TransformJob { f, rec, pages, key, dir, hidden, span: None, written: 0, w1 })
    }

    /// Step 2; the hidden file is removed again when it fails.
    fn copy_step(&self, job: &mut TransformJob<L>, sync: Sync) -> FsResult<()> {
        let per_file = sync == Sync::PerFile;
        match self.copy_out(&job.w1, &job.dir, &job.hidden, &job.rec, &job.pages, per_file) {
            Ok((span, written)) => {
                (job.span, job.written) = (span, written);
                self.base.fail("transform.copied");
                Ok(())
            }
            Err(e) => {
                let _ = self.base.lower.unlink(&job.w1, &job.dir, &job.hidden);
                Err(e)
            }
        }
    }

    /// Step 3 (the directory fsync only with `Sync::PerFile`; a batch syncs the file system
    /// once). No lock: the name is the overlay's until step 4 removes it, so a lookup (overlay
    /// first, then the lower directory) finds the file in one of the two at every instant.
    fn rename_step(&self, job: &TransformJob<L>, sync: Sync) -> FsResult<L::Node> {
        let renamed = self
            .base
            .lower
            .rename(&job.w1, &job.dir, &job.hidden, &job.dir, &job.rec.name, 0)
            .and_then(|()| {
                if sync == Sync::PerFile { self.base.lower.sync_dir(&job.dir) } else { Ok(()) }
            })
            .and_then(|()| self.base.lower.lookup(&job.dir, &job.rec.name));
        match renamed {
            Ok((node, _)) => {
                if sync == Sync::PerFile {
                    self.base.fail("transform.renamed");
                }
                Ok(node)
            }
            Err(e) => {
                let _ = self.base.lower.unlink(&job.w1, &job.dir, &job.hidden);
                Err(e.into())
            }
        }
    }

    /// Step 4: one transaction frees the record and the data frames; the index forgets the
    /// name; the node id now names the lower file.
    fn free_step(&self, job: &TransformJob<L>, node: L::Node, trigger: Trigger) -> FsResult<()> {
        let f = &job.f;
        let mut st = f.lock();
        // On failure the lower file is complete; the record stays Transforming and is
        // finished by the next attempt or at the next mount.
        self.base.atomically(|tx| data::free_all(tx, f.place, &mut st.pages.clone()))?;
        self.base.fail("transform.freed");
        self.release_record(f.place);
        let n = st.pages.len() as u64;
        // The name leaves the overlay with the file's lock held (O5).
        let mut idx = self.temp.overlay.lock();
        st.pages.clear();
        st.fate = Fate::Transformed;
        idx.remove_name(job.key, &job.rec.name);
        idx.temps.remove(&f.serial);
        drop(idx);
        let new_key = Identity::lower(self.base.lower.key(&node));
        self.temp.nodes.rekey(
            crate::base::inodes::TEMP_BASE + f.serial,
            new_key,
            Obj::Lower(Arc::new(node)),
        );
        drop(st);
        self.temp.counters.pages_resident.fetch_sub(n, Ordering::Relaxed);
        self.base.space.sub(n);
        self.base.space.sub_file();
        self.temp.counters.transformed(trigger);
        Counters::add(&self.temp.counters.bytes_transformed, job.rec.size);
        Counters::add(&self.base.counters.lower_bytes_written, job.written);
        if let Some(span) = job.span {
            Counters::add(&self.temp.counters.span_files, 1);
            Counters::add(&self.temp.counters.span_blocks_sum, span);
        }
        Ok(())
    }

    /// Step 1 for one file: `Ok(None)` when there is nothing to do (freed, unlinked,
    /// transformed, or being transformed by another thread, which this call waits for), else
    /// the W1 proof for its steps 2 and 3.
    fn mark(&self, f: &Arc<TempFile>) -> FsResult<Option<Committed>> {
        let mut st = f.lock();
        if st.fate != Fate::Resident || st.rec.nlink == 0 {
            return Ok(None);
        }
        if st.rec.state == State::Transforming {
            drop(f.wait_stable(st));
            return Ok(None);
        }
        let mut rec = st.rec.clone();
        rec.state = State::Transforming;
        self.base.atomically(|tx| data::put_record(tx, f.place, &rec))?;
        st.rec = rec;
        drop(st);
        // W1: step 1 and the data step 2 copies are durable before the lower file appears.
        let w1 = self.base.committed();
        self.base.fail("transform.marked");
        Ok(Some(w1))
    }

    /// Transforms many files as one group (flush, unmount, pressure): every file goes through
    /// the same four steps, but the durability of steps 2 and 3 comes from one `syncfs` of the
    /// lower file system each instead of an fsync per file and per directory (groups of
    /// `GROUP` files, so that no file stays frozen for long). The protocol's proof holds per
    /// file: step 4 of any file runs only after its rename is durable.
    pub fn transform_group(
        &self,
        files: &[Arc<TempFile>],
        trigger: Trigger,
        progress: &mut dyn FnMut(u64, u64),
    ) -> (u64, Option<FsError>) {
        self.transform_in_groups(files, GROUP, trigger, progress)
    }

    /// `transform_group` with groups of at most `group_size` files.
    fn transform_in_groups(
        &self,
        files: &[Arc<TempFile>],
        group_size: usize,
        trigger: Trigger,
        progress: &mut dyn FnMut(u64, u64),
    ) -> (u64, Option<FsError>) {
        let total = files.len() as u64;
        let (mut done, mut seen) = (0u64, 0u64);
        let mut first_error: Option<FsError> = None;
        for group in files.chunks(group_size) {
            let mut jobs = Vec::new();
            for f in group {
                match self.mark(f).and_then(|w1| w1.map(|w1| self.prepare(f, w1)).transpose()) {
                    Ok(Some(job)) => jobs.push(job),
                    Ok(None) => {}
                    Err(e) => {
                        self.back_to_live(f);
                        f.notify();
                        first_error.get_or_insert(e);
                    }
                }
            }
            let mut copied = Vec::new();
            for mut job in jobs {
                match self.copy_step(&mut job, Sync::Group) {
                    Ok(()) => copied.push(job),
                    Err(e) => {
                        self.back_to_live(&job.f);
                        job.f.notify();
                        first_error.get_or_insert(e);
                    }
                }
            }
            let mut renamed = Vec::new();
            if let Err(e) = self.base.syncfs_lower() {
                for job in &copied {
                    let _ = self.base.lower.unlink(&job.w1, &job.dir, &job.hidden);
                    self.back_to_live(&job.f);
                    job.f.notify();
                }
                first_error.get_or_insert(e);
                copied.clear();
            }
            for job in copied {
                match self.rename_step(&job, Sync::Group) {
                    Ok(node) => renamed.push((job, node)),
                    Err(e) => {
                        self.back_to_live(&job.f);
                        job.f.notify();
                        first_error.get_or_insert(e);
                    }
                }
            }
            if !renamed.is_empty() {
                if let Err(e) = self.base.syncfs_lower() {
                    // Renamed but maybe not durable: keep them transforming (a later attempt
                    // or the next mount finishes them) - but let waiters see them as live.
                    for (job, _) in &renamed {
                        self.back_to_live(&job.f);
                        job.f.notify();
                    }
                    first_error.get_or_insert(e);
                    renamed.clear();
                } else {
                    self.base.fail("transform.renamed");
                }
            }
            for (job, node) in renamed {
                match self.free_step(&job, node, trigger) {
                    Ok(()) => done += 1,
                    Err(e) => {
                        first_error.get_or_insert(e);
                    }
                }
                job.f.notify();
            }
            seen += group.len() as u64;
            progress(seen, total);
        }
        (done, first_error)
    }

    pub(crate) fn sync_dir(&self, dir: &L::Node) -> lower::Result<()> {
        let d = self.base.lower.opendir(dir)?;
        self.base.lower.fsyncdir(&d, false)
    }

    /// Step 2: the hidden file with the data and attributes, durable. Returns the file span
    /// in blocks (FIEMAP: first to last physical block) when the lower file system maps it,
    /// and the bytes written.
    fn copy_out(
        &self,
        w1: &Committed,
        dir: &L::Node,
        hidden: &OsString,
        rec: &Record,
        pages: &std::collections::BTreeMap<u64, txn::FrameId>,
        fsync: bool,
    ) -> FsResult<(Option<u64>, u64)> {
        let root = Creds { uid: 0, gid: 0, groups: Vec::new() };
        let created = match self.base.lower.create(w1, &root, dir, hidden, 0o600, libc::O_RDWR) {
            Err(lower::Errno(libc::EEXIST)) => {
                // Left by an interrupted attempt: start over.
                self.base.lower.unlink(w1, dir, hidden)?;
                self.base.lower.create(w1, &root, dir, hidden, 0o600, libc::O_RDWR)?
            }
            other => other?,
        };
        let (node, _, file) = created;
        if rec.size > 0 {
            match self.base.lower.fallocate(w1, &file, 0, 0, rec.size) {
                Ok(()) | Err(lower::Errno(libc::EOPNOTSUPP | libc::ENOSYS)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        // Runs of consecutive resident pages, written in chunks of at most 1 MiB.
        let mut buf = Vec::with_capacity((CHUNK_PAGES * data::PAGE) as usize);
        let mut run_start = None::<u64>;
        let written = std::cell::Cell::new(0u64);
        let flush = |start: u64, buf: &mut Vec<u8>| -> FsResult<()> {
            let offset = start * data::PAGE;
            let len = (buf.len() as u64).min(rec.size.saturating_sub(offset)) as usize;
            let mut done = 0;
            while done < len {
                done += self.base.lower.write(w1, &file, offset + done as u64, &buf[done..len])?;
            }
            written.set(written.get() + done as u64);
            buf.clear();
            Ok(())
        };
        let mut expected = 0u64;
        for (&page, &frame) in pages {
            if run_start.is_some()
                && (page != expected || buf.len() as u64 >= CHUNK_PAGES * data::PAGE)
            {
                flush(run_start.take().expect("run"), &mut buf)?;
            }
            if run_start.is_none() {
                run_start = Some(page);
            }
            let at = buf.len();
            buf.resize(at + data::PAGE as usize, 0);
            self.base.pool.read(self.base.pool.frame_offset(frame), &mut buf[at..]);
            expected = page + 1;
        }
        if let Some(start) = run_start {
            flush(start, &mut buf)?;
        }
        // Size (trailing holes), owner, then mode (chown clears set-ID bits), then times.
        let size = SetAttr { size: Some(rec.size), ..SetAttr::default() };
        self.base.lower.setattr(w1, &node, Some(&file), &size)?;
        let owner = SetAttr { uid: Some(rec.uid), gid: Some(rec.gid), ..SetAttr::default() };
        match self.base.lower.setattr(w1, &node, Some(&file), &owner) {
            // An unprivileged daemon cannot give files away; its lower creates cannot either.
            Ok(_) | Err(lower::Errno(libc::EPERM)) => {}
            Err(e) => return Err(e.into()),
        }
        let rest = SetAttr {
            mode: Some(rec.mode & 0o7777),
            atime: Some(TimeSet::At(rec.atime.0, rec.atime.1)),
            mtime: Some(TimeSet::At(rec.mtime.0, rec.mtime.1)),
            ..SetAttr::default()
        };
        self.base.lower.setattr(w1, &node, Some(&file), &rest)?;
        if fsync {
            self.base.lower.fsync(&file, false)?;
        }
        let span = match self.base.lower.fiemap(&file) {
            Ok(extents) if !extents.is_empty() => {
                let attr = self.base.lower.getattr(&node)?;
                let block = u64::from(attr.blksize.max(512));
                let first = extents.iter().map(|e| e.physical).min().unwrap_or(0);
                let last = extents.iter().map(|e| e.physical + e.length).max().unwrap_or(0);
                Some((last.saturating_sub(first)).div_ceil(block).saturating_sub(1))
            }
            _ => None,
        };
        debug_assert!(self.base.lower.getattr(&node).is_ok_and(|a| a.kind() == FileKind::Regular));
        Ok((span, written.get()))
    }

    /// Transforms every named temp file (flush, unmount) as groups; `progress(done, total)`
    /// after each group. Returns how many were transformed and the first error (the others
    /// were still tried).
    pub fn transform_all(
        &self,
        trigger: Trigger,
        progress: &mut dyn FnMut(u64, u64),
    ) -> (u64, Option<FsError>) {
        let files: Vec<Arc<TempFile>> = self.temp.overlay.lock().temps.values().cloned().collect();
        let (done, error) = self.transform_group(&files, trigger, progress);
        // Every temp file went: no record frame is kept as room either.
        match self.free_empty_record_frames(0) {
            Ok(()) => (done, error),
            Err(e) => (done, error.or(Some(e))),
        }
    }

    /// NVRAM pressure (thesis 3.1.1): when temp files hold more than their share of frames, or
    /// `force` (a write found no free frame), transform the least recently used temp files
    /// until N = NR_WB * NR_TempFFS / NR_Dirty pages are freed, NR_Dirty counting the page
    /// cache's dirty pages too (the rest of the room comes from write-back).
    pub(crate) fn relieve_pressure(&self, force: bool) {
        if !force && self.temp_frames() <= self.temp.limits.max_frames {
            return;
        }
        let nr_tempffs = self.temp.pages_resident();
        let nr_dirty = (nr_tempffs + self.cache.pages_dirty()).max(1);
        let target = (self.temp.config.writeback_batch * nr_tempffs / nr_dirty).max(1);
        // None: another thread is at it.
        let _ = self.lru_round(target, usize::MAX, GROUP, Trigger::Pressure);
    }

    /// One round of the background transformer (`--tempfile-background`, design.md section
    /// 10): above `background_frames`, the least recently used temp files worth
    /// `BACKGROUND_BATCHES` x NR_WB frames (at most `BACKGROUND_GROUP` files) are transformed as
    /// one group, by the daemon's own thread, so that the writers' requests rarely meet the
    /// share and its pressure transforms (a syncfs of the lower file system in a writer's
    /// request). Returns the files transformed: 0 when under the mark, when another round
    /// runs, or when nothing could be transformed (the caller then waits before it looks
    /// again).
    pub fn transform_in_background(&self) -> u64 {
        if self.temp_frames() <= self.temp.limits.background_frames {
            return 0;
        }
        let frames = BACKGROUND_BATCHES * self.temp.config.writeback_batch.max(1);
        self.lru_round(frames, BACKGROUND_GROUP, BACKGROUND_GROUP, Trigger::Background).unwrap_or(0)
    }

    /// One round of least-recently-used transforms (pressure, background): the oldest named
    /// temp files worth `frames` frames, at most `max_files` of them, in groups of `group`
    /// files, with the same protocol as every trigger. One round at a time (`relieving`):
    /// `None` when another runs, else the files transformed.
    fn lru_round(
        &self,
        frames: u64,
        max_files: usize,
        group: usize,
        trigger: Trigger,
    ) -> Option<u64> {
        if self.temp.relieving.swap(true, Ordering::AcqRel) {
            return None;
        }
        let chosen = self.least_recently_used(frames, max_files);
        let (done, error) = self.transform_in_groups(&chosen, group, trigger, &mut |_, _| {});
        if let Some(e) = error {
            eprintln!("nvstack: {} transform failed: {e}", trigger.name());
        }
        self.temp.relieving.store(false, Ordering::Release);
        Some(done)
    }

    /// Frames temp files hold: their pages and the record frames (eight records a frame).
    pub(crate) fn temp_frames(&self) -> u64 {
        self.temp.pages_resident() + self.temp.slots.frames()
    }

    /// The least recently used named, resident temp files, oldest first, until their frames
    /// (pages + an eighth of a record frame each) reach `frames` or there are `max_files` of
    /// them.
    fn least_recently_used(&self, frames: u64, max_files: usize) -> Vec<Arc<TempFile>> {
        // The files first (the overlay), then each one's state (a rank before the overlay).
        let files: Vec<Arc<TempFile>> = self.temp.overlay.lock().temps.values().cloned().collect();
        let mut candidates: Vec<(u64, Arc<TempFile>)> = files
            .iter()
            .filter_map(|f| {
                let st = f.lock();
                (st.fate == Fate::Resident && st.rec.nlink > 0)
                    .then(|| (st.last_use, Arc::clone(f)))
            })
            .collect();
        candidates.sort_by_key(|(t, f)| (*t, f.serial));
        let mut chosen = Vec::new();
        // In eighths of a frame: a record takes one slot of a record frame.
        let (want, mut got) = (frames.saturating_mul(SLOTS as u64), 0u64);
        for (_, f) in candidates {
            if got >= want || chosen.len() >= max_files {
                break;
            }
            got += f.lock().pages.len() as u64 * SLOTS as u64 + 1;
            chosen.push(f);
        }
        chosen
    }

    /// `nvstack flush`: transforms every temp file, then settles pending directory times.
    pub fn flush_tempfiles(&self, progress: &mut dyn FnMut(u64, u64)) -> (u64, Option<FsError>) {
        let (done, error) = self.transform_all(Trigger::Flush, progress);
        match self.settle_dir_times() {
            Ok(_) => (done, error),
            Err(e) => (done, error.or(Some(e))),
        }
    }

    /// The temp file behind a node id, if it is one and still in NVRAM (tests, tools).
    pub fn temp_file(&self, node_id: u64) -> Option<Arc<TempFile>> {
        match self.obj(node_id) {
            Ok(Obj::Temp(f)) if f.lock().fate == Fate::Resident => Some(f),
            _ => None,
        }
    }
}
