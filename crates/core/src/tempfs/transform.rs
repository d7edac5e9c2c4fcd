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

use crate::base::Base;
use crate::base::Committed;
use crate::base::Incident;
use crate::base::counters::Counters;
use crate::base::error::{FsError, FsResult, answer};
use crate::base::inodes::Identity;
use crate::base::slots::SLOTS;
use crate::tempfs::TempFs;
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

impl<L: LowerFs> TempFs<L> {
    /// Transforms `f` into a lower file (see the module docs). Returns when it is done, also
    /// when another thread did it; a file that is unlinked or freed is left alone.
    pub(crate) fn transform(
        &self,
        b: &Base<L>,
        f: &Arc<TempFile>,
        trigger: Trigger,
    ) -> FsResult<()> {
        match Self::mark(b, f)? {
            Some(w1) => self.finish_transform(b, f, trigger, w1),
            None => Ok(()),
        }
    }

    /// Steps 2-4 for a file whose record is `Transforming` (`w1`: taken after that record
    /// committed).
    pub(super) fn finish_transform(
        &self,
        b: &Base<L>,
        f: &Arc<TempFile>,
        trigger: Trigger,
        w1: Committed,
    ) -> FsResult<()> {
        let result = self.prepare(f, w1).and_then(|mut job| {
            Self::copy_step(b, &mut job, Sync::PerFile)?;
            let node = Self::rename_step(b, &job, Sync::PerFile)?;
            self.free_step(b, &job, node, trigger)
        });
        if result.is_err() {
            Self::back_to_live(b, f);
        }
        f.notify();
        result
    }

    /// After a failed step 2 or 3 the file stays in NVRAM, correct and complete. Its name may
    /// now have a lower file (the rename of step 3 may have happened), so it shadows one from
    /// now on (O1; unlinking a name without a lower file is harmless).
    fn back_to_live(b: &Base<L>, f: &TempFile) {
        let mut st = f.lock();
        if st.fate == Fate::Resident && st.rec.state == State::Transforming {
            let mut rec = st.rec.clone();
            rec.state = State::Live;
            rec.set_shadows(true);
            // On failure (NVRAM full) the record stays Transforming: the next attempt or the
            // next mount finishes the transform.
            if b.atomically(|tx| data::put_record(tx, f.place, &rec)).is_ok() {
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
            let idx = self.overlay.lock();
            Arc::clone(&idx.dirs.get(&key).ok_or(answer(libc::ESTALE))?.node)
        };
        let hidden = tempfs::hidden_name(rec.serial);
        let f = Arc::clone(f);
        Ok(TransformJob { f, rec, pages, key, dir, hidden, span: None, written: 0, w1 })
    }

    /// Step 2; the hidden file is removed again when it fails.
    fn copy_step(b: &Base<L>, job: &mut TransformJob<L>, sync: Sync) -> FsResult<()> {
        let per_file = sync == Sync::PerFile;
        match Self::copy_out(b, &job.w1, &job.dir, &job.hidden, &job.rec, &job.pages, per_file) {
            Ok((span, written)) => {
                (job.span, job.written) = (span, written);
                b.fail("transform.copied");
                Ok(())
            }
            Err(e) => {
                let _ = b.lower.unlink(&job.w1, &job.dir, &job.hidden);
                Err(e)
            }
        }
    }

    /// Step 3 (the directory fsync only with `Sync::PerFile`; a batch syncs the file system
    /// once). No lock: the name is the overlay's until step 4 removes it, so a lookup (overlay
    /// first, then the lower directory) finds the file in one of the two at every instant.
    fn rename_step(b: &Base<L>, job: &TransformJob<L>, sync: Sync) -> FsResult<L::Node> {
        let renamed = b
            .lower
            .rename(&job.w1, &job.dir, &job.hidden, &job.dir, &job.rec.name, 0)
            .and_then(|()| if sync == Sync::PerFile { b.lower.sync_dir(&job.dir) } else { Ok(()) })
            .and_then(|()| b.lower.lookup(&job.dir, &job.rec.name));
        match renamed {
            Ok((node, _)) => {
                if sync == Sync::PerFile {
                    b.fail("transform.renamed");
                }
                Ok(node)
            }
            Err(e) => {
                let _ = b.lower.unlink(&job.w1, &job.dir, &job.hidden);
                Err(e.into())
            }
        }
    }

    /// Step 4: one transaction frees the record and the data frames; the index forgets the
    /// name; the node id now names the lower file.
    fn free_step(
        &self,
        b: &Base<L>,
        job: &TransformJob<L>,
        node: L::Node,
        trigger: Trigger,
    ) -> FsResult<()> {
        let f = &job.f;
        let mut st = f.lock();
        // On failure the lower file is complete; the record stays Transforming and is
        // finished by the next attempt or at the next mount.
        b.atomically(|tx| data::free_all(tx, f.place, &mut st.pages.clone()))?;
        b.fail("transform.freed");
        self.release_record(b, f.place);
        let n = st.pages.len() as u64;
        // The name leaves the overlay with the file's lock held (O5).
        let mut idx = self.overlay.lock();
        st.pages.clear();
        st.fate = Fate::Transformed;
        idx.remove_name(job.key, &job.rec.name);
        idx.temps.remove(&f.serial);
        drop(idx);
        let new_key = Identity::lower(b.lower.key(&node));
        self.nodes.rekey(
            crate::base::inodes::TEMP_BASE + f.serial,
            new_key,
            Obj::Lower(Arc::new(node)),
        );
        drop(st);
        self.counters.pages_resident.fetch_sub(n, Ordering::Relaxed);
        b.space.sub(n);
        b.space.sub_file();
        self.counters.transformed(trigger);
        Counters::add(&self.counters.bytes_transformed, job.rec.size);
        Counters::add(&b.counters.lower_bytes_written, job.written);
        if let Some(span) = job.span {
            Counters::add(&self.counters.span_files, 1);
            Counters::add(&self.counters.span_blocks_sum, span);
        }
        Ok(())
    }

    /// Step 1 for one file: `Ok(None)` when there is nothing to do (freed, unlinked,
    /// transformed, or being transformed by another thread, which this call waits for), else
    /// the W1 proof for its steps 2 and 3.
    fn mark(b: &Base<L>, f: &Arc<TempFile>) -> FsResult<Option<Committed>> {
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
        b.atomically(|tx| data::put_record(tx, f.place, &rec))?;
        st.rec = rec;
        drop(st);
        // W1: step 1 and the data step 2 copies are durable before the lower file appears.
        let w1 = b.committed();
        b.fail("transform.marked");
        Ok(Some(w1))
    }

    /// Transforms many files as one group (flush, unmount, pressure): every file goes through
    /// the same four steps, but the durability of steps 2 and 3 comes from one `syncfs` of the
    /// lower file system each instead of an fsync per file and per directory (groups of
    /// `GROUP` files, so that no file stays frozen for long). The protocol's proof holds per
    /// file: step 4 of any file runs only after its rename is durable.
    pub(crate) fn transform_group(
        &self,
        b: &Base<L>,
        files: &[Arc<TempFile>],
        trigger: Trigger,
        progress: &mut dyn FnMut(u64, u64),
    ) -> (u64, Option<FsError>) {
        self.transform_in_groups(b, files, GROUP, trigger, progress)
    }

    /// `transform_group` with groups of at most `group_size` files.
    fn transform_in_groups(
        &self,
        b: &Base<L>,
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
                match Self::mark(b, f).and_then(|w1| w1.map(|w1| self.prepare(f, w1)).transpose()) {
                    Ok(Some(job)) => jobs.push(job),
                    Ok(None) => {}
                    Err(e) => {
                        Self::back_to_live(b, f);
                        f.notify();
                        first_error.get_or_insert(e);
                    }
                }
            }
            let mut copied = Vec::new();
            for mut job in jobs {
                match Self::copy_step(b, &mut job, Sync::Group) {
                    Ok(()) => copied.push(job),
                    Err(e) => {
                        Self::back_to_live(b, &job.f);
                        job.f.notify();
                        first_error.get_or_insert(e);
                    }
                }
            }
            let mut renamed = Vec::new();
            if let Err(e) = b.syncfs_lower() {
                for job in &copied {
                    let _ = b.lower.unlink(&job.w1, &job.dir, &job.hidden);
                    Self::back_to_live(b, &job.f);
                    job.f.notify();
                }
                first_error.get_or_insert(e);
                copied.clear();
            }
            for job in copied {
                match Self::rename_step(b, &job, Sync::Group) {
                    Ok(node) => renamed.push((job, node)),
                    Err(e) => {
                        Self::back_to_live(b, &job.f);
                        job.f.notify();
                        first_error.get_or_insert(e);
                    }
                }
            }
            if !renamed.is_empty() {
                if let Err(e) = b.syncfs_lower() {
                    // Renamed but maybe not durable: keep them transforming (a later attempt
                    // or the next mount finishes them) - but let waiters see them as live.
                    for (job, _) in &renamed {
                        Self::back_to_live(b, &job.f);
                        job.f.notify();
                    }
                    first_error.get_or_insert(e);
                    renamed.clear();
                } else {
                    b.fail("transform.renamed");
                }
            }
            for (job, node) in renamed {
                match self.free_step(b, &job, node, trigger) {
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

    pub(crate) fn sync_dir(b: &Base<L>, dir: &L::Node) -> lower::Result<()> {
        let d = b.lower.opendir(dir)?;
        b.lower.fsyncdir(&d, false)
    }

    /// Step 2: the hidden file with the data and attributes, durable. Returns the file span
    /// in blocks (FIEMAP: first to last physical block) when the lower file system maps it,
    /// and the bytes written.
    fn copy_out(
        b: &Base<L>,
        w1: &Committed,
        dir: &L::Node,
        hidden: &OsString,
        rec: &Record,
        pages: &std::collections::BTreeMap<u64, txn::FrameId>,
        fsync: bool,
    ) -> FsResult<(Option<u64>, u64)> {
        let root = Creds { uid: 0, gid: 0, groups: Vec::new() };
        let created = match b.lower.create(w1, &root, dir, hidden, 0o600, libc::O_RDWR) {
            Err(lower::Errno(libc::EEXIST)) => {
                // Left by an interrupted attempt: start over.
                b.lower.unlink(w1, dir, hidden)?;
                b.lower.create(w1, &root, dir, hidden, 0o600, libc::O_RDWR)?
            }
            other => other?,
        };
        let (node, _, file) = created;
        if rec.size > 0 {
            match b.lower.fallocate(w1, &file, 0, 0, rec.size) {
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
                done += b.lower.write(w1, &file, offset + done as u64, &buf[done..len])?;
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
            b.pool.read(b.pool.frame_offset(frame), &mut buf[at..]);
            expected = page + 1;
        }
        if let Some(start) = run_start {
            flush(start, &mut buf)?;
        }
        // Size (trailing holes), owner, then mode (chown clears set-ID bits), then times.
        let size = SetAttr { size: Some(rec.size), ..SetAttr::default() };
        b.lower.setattr(w1, &node, Some(&file), &size)?;
        let owner = SetAttr { uid: Some(rec.uid), gid: Some(rec.gid), ..SetAttr::default() };
        match b.lower.setattr(w1, &node, Some(&file), &owner) {
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
        b.lower.setattr(w1, &node, Some(&file), &rest)?;
        if fsync {
            b.lower.fsync(&file, false)?;
        }
        let span = match b.lower.fiemap(&file) {
            Ok(extents) if !extents.is_empty() => {
                let attr = b.lower.getattr(&node)?;
                let block = u64::from(attr.blksize.max(512));
                let first = extents.iter().map(|e| e.physical).min().unwrap_or(0);
                let last = extents.iter().map(|e| e.physical + e.length).max().unwrap_or(0);
                Some((last.saturating_sub(first)).div_ceil(block).saturating_sub(1))
            }
            _ => None,
        };
        debug_assert!(b.lower.getattr(&node).is_ok_and(|a| a.kind() == FileKind::Regular));
        Ok((span, written.get()))
    }

    /// Transforms every named temp file (flush, unmount) as groups; `progress(done, total)`
    /// after each group. Returns how many were transformed and the first error (the others
    /// were still tried).
    pub(crate) fn transform_all(
        &self,
        b: &Base<L>,
        trigger: Trigger,
        progress: &mut dyn FnMut(u64, u64),
    ) -> (u64, Option<FsError>) {
        let files: Vec<Arc<TempFile>> = self.overlay.lock().temps.values().cloned().collect();
        let (done, error) = self.transform_group(b, &files, trigger, progress);
        // Every temp file went: no record frame is kept as room either.
        match self.free_empty_record_frames(b, 0) {
            Ok(()) => (done, error),
            Err(e) => (done, error.or(Some(e))),
        }
    }

    /// Whether temp files hold more than their share of the region's frames.
    pub(crate) fn over_share(&self) -> bool {
        self.temp_frames() > self.limits.max_frames
    }

    /// A pressure round (`engine/pressure.rs` decides when and how much): the least recently
    /// used temp files worth `pages` pages are transformed. Does nothing while another round
    /// runs.
    pub(crate) fn pressure_round(&self, b: &Base<L>, pages: u64) {
        let _ = self.lru_round(b, pages, usize::MAX, GROUP, Trigger::Pressure);
    }

    /// One round of the background transformer (`--tempfile-background`, design.md section
    /// 10): above `background_frames`, the least recently used temp files worth
    /// `BACKGROUND_BATCHES` x NR_WB frames (at most `BACKGROUND_GROUP` files) are transformed as
    /// one group, by the daemon's own thread, so that the writers' requests rarely meet the
    /// share and its pressure transforms (a syncfs of the lower file system in a writer's
    /// request). Returns the files transformed: 0 when under the mark, when another round
    /// runs, or when nothing could be transformed (the caller then waits before it looks
    /// again).
    pub(crate) fn transform_in_background(&self, b: &Base<L>) -> u64 {
        if self.temp_frames() <= self.limits.background_frames {
            return 0;
        }
        let frames = BACKGROUND_BATCHES * self.config.writeback_batch.max(1);
        self.lru_round(b, frames, BACKGROUND_GROUP, BACKGROUND_GROUP, Trigger::Background)
            .unwrap_or(0)
    }

    /// One round of least-recently-used transforms (pressure, background): the oldest named
    /// temp files worth `frames` frames, at most `max_files` of them, in groups of `group`
    /// files, with the same protocol as every trigger. One round at a time (`relieving`):
    /// `None` when another runs, else the files transformed.
    fn lru_round(
        &self,
        b: &Base<L>,
        frames: u64,
        max_files: usize,
        group: usize,
        trigger: Trigger,
    ) -> Option<u64> {
        if self.relieving.swap(true, Ordering::AcqRel) {
            return None;
        }
        let chosen = self.least_recently_used(frames, max_files);
        let (done, error) = self.transform_in_groups(b, &chosen, group, trigger, &mut |_, _| {});
        if let Some(e) = error {
            b.incident(
                Incident::TransformFailed,
                format_args!("nvstack: {} transform failed: {e}", trigger.name()),
            );
        }
        self.relieving.store(false, Ordering::Release);
        Some(done)
    }

    /// Frames temp files hold: their pages and the record frames (eight records a frame).
    pub(crate) fn temp_frames(&self) -> u64 {
        self.pages_resident() + self.slots.frames()
    }

    /// Checks every named temp file's invariants (`TempState::check`; debug builds, no
    /// operation running) and returns the pages the temp files hold, as counted.
    #[cfg(debug_assertions)]
    pub(crate) fn check(&self) -> Result<u64, String> {
        let files: Vec<Arc<TempFile>> = self.overlay.lock().temps.values().cloned().collect();
        for f in files {
            f.lock().check()?;
        }
        Ok(self.pages_resident())
    }

    /// The least recently used named, resident temp files, oldest first, until their frames
    /// (pages + an eighth of a record frame each) reach `frames` or there are `max_files` of
    /// them.
    fn least_recently_used(&self, frames: u64, max_files: usize) -> Vec<Arc<TempFile>> {
        // The files first (the overlay), then each one's state (a rank before the overlay).
        let files: Vec<Arc<TempFile>> = self.overlay.lock().temps.values().cloned().collect();
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
    pub(crate) fn flush_tempfiles(
        &self,
        b: &Base<L>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> (u64, Option<FsError>) {
        let (done, error) = self.transform_all(b, Trigger::Flush, progress);
        match self.settle_dir_times(b) {
            Ok(_) => (done, error),
            Err(e) => (done, error.or(Some(e))),
        }
    }
}
