//! The namespace overlay and the operations on temp files (DESIGN section 4).
//!
//! Temp files are named by (lower directory, name) entries in the temp index, consulted before
//! the lower directory. Rules that keep the merged view identical to a plain file system:
//! - O1 a name is either a temp file or a lower object, never both visibly: a temp file
//!   renamed onto a lower file *shadows* it (record flag) until its transform renames onto the
//!   name, which replaces the lower file atomically; a shadowed lower file is unlinked when the
//!   temp file leaves the name (before the NVRAM commit, so a crash in between still shows the
//!   temp file there);
//! - O2 operations that would have to change a lower object and a temp file together (a lower
//!   rename onto a temp name, exchange with a lower object, hard links) transform the temp file
//!   first and then run entirely in the lower file system, whose own atomicity then applies;
//! - O3 a directory holding temp files is not empty (rmdir, rename onto it: ENOTEMPTY);
//! - O4 every volatile change (index, state mirror) happens after the last step of the
//!   operation that can fail, so an aborted transaction leaves nothing to undo in memory.

use std::ffi::OsStr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};

use lower::{Creds, DirEntry, FileKind, LowerFs, SetAttr};
use txn::Tx;

use crate::error::FsResult;
use crate::handles::Handle;
use crate::inodes::TEMP_BASE;
use crate::ops::{Engine, Entry, Listed, OpTx, Open, errno, nvram_full, suidgid_bits};
use crate::stats::Counters;
use crate::tempfs::{self, Fate, Record, State, TempFile, TempState, data};

/// Most entries of a merged directory listing (it is held in memory per open directory).
pub const MAX_LISTING: usize = 1 << 22;

/// The outcome of `tx_truncate`, applied to the mirror after the commit.
struct Truncated {
    rec: Record,
    pages: std::collections::BTreeMap<u64, txn::FrameId>,
    freed: u64,
}

/// The outcome of `tx_unname`.
enum Unnamed {
    Freed(u64),
    Kept(Record),
}

impl<L: LowerFs> Engine<L> {
    pub(crate) fn temp_lookup(&self, dir: &L::Node, name: &OsStr) -> Option<Entry> {
        let key = self.lower.key(dir);
        let idx = self.index.lock().expect("temp index");
        let f = Arc::clone(idx.get(key, name)?);
        let st = f.lock();
        Some(self.temp_entry(&f, &st))
    }

    /// Creates `name` as a temp file when TempFFS applies: on, a regular file, the directory
    /// on the lower root's file system and without a default ACL (the lower file system would
    /// give the new file an ACL we do not keep). `None`: create it in the lower file system.
    pub(crate) fn temp_create(
        &self,
        otx: &mut OpTx<'_>,
        creds: &Creds,
        dir: &Arc<L::Node>,
        name: &OsStr,
        mode: u32,
        flags: i32,
    ) -> FsResult<Option<(Entry, u64)>> {
        let key = self.lower.key(dir);
        if !self.temp.enabled
            || !matches!(mode & libc::S_IFMT, 0 | libc::S_IFREG)
            || key.0 != self.root_dev
            || tempfs::is_hidden(name)
        {
            return Ok(None);
        }
        if name.len() > tempfs::record::MAX_NAME {
            return Err(errno(libc::ENAMETOOLONG));
        }
        match self.lower.getxattr(dir, OsStr::new("system.posix_acl_default"), 0) {
            Ok(_) => return Ok(None),
            Err(lower::Errno(libc::ENODATA | libc::EOPNOTSUPP)) => {}
            Err(e) => return Err(e.into()),
        }
        let dir_attr = self.lower.getattr(dir)?;
        let mut idx = self.index.lock().expect("temp index");
        if idx.get(key, name).is_some() {
            return Err(errno(libc::EEXIST));
        }
        match self.lower.lookup(dir, name) {
            Ok(_) => return Err(errno(libc::EEXIST)),
            Err(lower::Errno(libc::ENOENT)) => {}
            Err(e) => return Err(e.into()),
        }
        let handle = match idx.dirs.get(&key) {
            Some(d) => d.handle.clone(),
            None => self.lower.dir_handle(dir)?,
        };
        if handle.len() > tempfs::record::MAX_HANDLE {
            return Ok(None);
        }
        self.reserve(1)?;
        let (gid, perm) = init_owner(creds, &dir_attr, mode);
        let now = self.lower.now();
        let serial = idx.next_serial;
        let rec = Record {
            state: State::Live,
            flags: 0,
            mode: libc::S_IFREG | perm,
            uid: creds.uid,
            gid,
            nlink: 1,
            size: 0,
            atime: now,
            mtime: now,
            ctime: now,
            serial,
            dir: handle.clone(),
            name: name.to_os_string(),
        };
        let tx = otx.tx();
        let frame = match tx
            .alloc_frame(txn::FrameTag { kind: tempfs::record::KIND_OBJECT, ..Default::default() })
        {
            Ok(frame) => frame,
            // A full NVRAM: the file goes to the lower file system (never an error there).
            Err(txn::TxError::NoFrames) => return Ok(None),
            Err(e) => return Err(nvram_full(e)),
        };
        let r = data::put_record(tx, frame, &rec).map_err(nvram_full);
        let r = r.and_then(|()| self.touch_dir(dir));
        otx.end(r)?;
        idx.next_serial += 1;
        let f = Arc::new(TempFile::new(
            frame,
            TempState {
                rec,
                dir: key,
                pages: std::collections::BTreeMap::new(),
                opens: 1,
                fate: Fate::Resident,
                last_use: self.lru.tick(),
            },
        ));
        idx.insert_name(key, dir, &handle, name, Arc::clone(&f));
        idx.objects.insert(serial, Arc::clone(&f));
        Counters::add(&self.tc.created, 1);
        Counters::add(&self.tc.files_resident, 1);
        let st = f.lock();
        let entry = self.temp_entry(&f, &st);
        drop(st);
        let open =
            Open::Temp { file: Arc::clone(&f), flags: reopen_flags(flags), lower: OnceLock::new() };
        let Some(fh) = self.handles.insert(entry.node_id, open) else {
            // Too many open files: take the new file back (as a failed open(O_CREAT) would
            // leave it, it may stay; removing it is kinder and is what we do).
            self.inodes.forget(entry.node_id, 1);
            let mut st = f.lock();
            st.opens = 0;
            let r = self.tx_unname(otx.tx(), &f, &st);
            if let Ok(u) = otx.end(r) {
                self.apply_unname(&mut st, u);
                idx.remove_name(key, name);
                idx.objects.remove(&serial);
            }
            return Err(errno(libc::EMFILE));
        };
        Ok(Some((entry, fh)))
    }

    /// Opens a temp file; `None` when it was transformed meanwhile (open the lower file).
    pub(crate) fn temp_open(
        &self,
        otx: &mut OpTx<'_>,
        node_id: u64,
        f: &Arc<TempFile>,
        flags: i32,
    ) -> FsResult<Option<u64>> {
        let mut st = f.lock();
        if flags & libc::O_TRUNC != 0 {
            st = f.wait_stable(st);
        }
        match st.fate {
            Fate::Resident => {}
            Fate::Transformed => return Ok(None),
            Fate::Freed => return Err(errno(libc::ENOENT)),
        }
        if flags & libc::O_TRUNC != 0 && st.rec.size > 0 {
            let r = self.tx_truncate(otx.tx(), f, &st, 0);
            let t = otx.end(r)?;
            self.apply_truncate(&mut st, t);
        }
        let open =
            Open::Temp { file: Arc::clone(f), flags: reopen_flags(flags), lower: OnceLock::new() };
        let fh = self.handles.insert(node_id, open).ok_or(errno(libc::EMFILE))?;
        st.opens += 1;
        st.last_use = self.lru.tick();
        Ok(Some(fh))
    }

    /// Last close of an unlinked temp file frees it.
    pub(crate) fn temp_release(&self, otx: &mut OpTx<'_>, f: &Arc<TempFile>) -> FsResult<()> {
        let mut idx = self.index.lock().expect("temp index");
        let mut st = f.lock();
        if st.opens == 1 && st.rec.nlink == 0 && st.fate == Fate::Resident {
            let r = Self::tx_free(otx.tx(), f, &st);
            let n = otx.end(r)?;
            self.apply_free(&mut st, n);
            idx.objects.remove(&f.serial);
        }
        st.opens = st.opens.saturating_sub(1);
        Ok(())
    }

    /// Frees every frame of `f` in `tx`; returns the number of data pages freed.
    fn tx_free(tx: &mut Tx<'_>, f: &TempFile, st: &TempState) -> FsResult<u64> {
        let mut pages = st.pages.clone();
        data::free_all(tx, f.frame, &mut pages).map_err(nvram_full)
    }

    /// After the transaction of `tx_free` committed.
    fn apply_free(&self, st: &mut TempState, pages: u64) {
        st.pages.clear();
        st.fate = Fate::Freed;
        self.tc.pages_resident.fetch_sub(pages, Ordering::Relaxed);
        self.reserved_pages.fetch_sub(pages, Ordering::Relaxed);
        self.tc.files_resident.fetch_sub(1, Ordering::Relaxed);
    }

    /// Sets the size of a temp file in `tx` (the caller holds its state, stable); returns the
    /// new record and page map and the number of pages freed, applied by `apply_truncate`.
    fn tx_truncate(
        &self,
        tx: &mut Tx<'_>,
        f: &TempFile,
        st: &TempState,
        size: u64,
    ) -> FsResult<Truncated> {
        let mut rec = st.rec.clone();
        let now = self.lower.now();
        rec.size = size;
        rec.mtime = now;
        rec.ctime = now;
        data::put_record(tx, f.frame, &rec).map_err(nvram_full)?;
        let mut pages = st.pages.clone();
        let freed = data::truncate(tx, &mut pages, st.rec.size, size).map_err(nvram_full)?;
        Ok(Truncated { rec, pages, freed })
    }

    fn apply_truncate(&self, st: &mut TempState, t: Truncated) {
        st.rec = t.rec;
        st.pages = t.pages;
        self.tc.pages_resident.fetch_sub(t.freed, Ordering::Relaxed);
        self.reserved_pages.fetch_sub(t.freed, Ordering::Relaxed);
    }

    /// relatime, as the lower file system mounts by default: a read updates atime when it is
    /// not newer than mtime or ctime, or older than a day. (A frozen file is left alone.)
    pub(crate) fn temp_touch_atime(
        &self,
        otx: &mut OpTx<'_>,
        f: &TempFile,
        st: &mut TempState,
    ) -> FsResult<()> {
        const DAY: i64 = 24 * 3600;
        let r = &st.rec;
        let now = self.lower.now();
        if r.state == State::Transforming
            || (r.atime > r.mtime && r.atime > r.ctime && now.0 - r.atime.0 < DAY)
        {
            return Ok(());
        }
        let mut rec = r.clone();
        rec.atime = now;
        let r = data::put_record(otx.tx(), f.frame, &rec).map_err(nvram_full);
        otx.end(r)?;
        st.rec = rec;
        Ok(())
    }

    /// Writes to a temp file; `None` when it has been transformed (write to the lower file).
    pub(crate) fn temp_write(
        &self,
        otx: &mut OpTx<'_>,
        f: &Arc<TempFile>,
        offset: u64,
        buf: &[u8],
        kill_suidgid: bool,
    ) -> FsResult<Option<usize>> {
        let mut st = f.wait_stable(f.lock());
        match st.fate {
            Fate::Resident => {}
            Fate::Transformed => return Ok(None),
            Fate::Freed => return Err(errno(libc::ESTALE)),
        }
        let end = offset.checked_add(buf.len() as u64).ok_or(errno(libc::EFBIG))?;
        if end > i64::MAX as u64 {
            return Err(errno(libc::EFBIG));
        }
        let first = offset / data::PAGE;
        let last = end.div_ceil(data::PAGE);
        let missing = (first..last).filter(|p| !st.pages.contains_key(p)).count() as u64;
        self.reserve(missing)?;
        let mut rec = st.rec.clone();
        let now = self.lower.now();
        rec.size = rec.size.max(end);
        rec.mtime = now;
        rec.ctime = now;
        if kill_suidgid {
            rec.mode &= !suidgid_bits(rec.mode);
        }
        // The page map is changed in place (no copy per write on this hot path): the pages a
        // rolled-back write added are taken out again while the file lock is still held.
        let tx = otx.tx();
        let r = data::write(tx, f.frame, &mut st.pages, offset, buf).and_then(|fresh| {
            data::put_record(tx, f.frame, &rec)
                .inspect_err(|_| data::forget_pages(&mut st.pages, &fresh))
        });
        otx.end(r.map(drop).map_err(nvram_full))?;
        st.rec = rec;
        st.last_use = self.lru.tick();
        self.tc.pages_resident.fetch_add(missing, Ordering::Relaxed);
        self.reserved_pages.fetch_add(missing, Ordering::Relaxed);
        Counters::add(&self.tc.bytes_written_by_apps, buf.len() as u64);
        Counters::add(&self.counters.app_bytes_written, buf.len() as u64);
        Ok(Some(buf.len()))
    }

    /// setattr of a temp file; `None` when it has been transformed (use the lower file).
    pub(crate) fn temp_setattr(
        &self,
        otx: &mut OpTx<'_>,
        f: &Arc<TempFile>,
        set: &SetAttr,
        unprivileged: bool,
    ) -> FsResult<Option<lower::Attr>> {
        let mut st = f.wait_stable(f.lock());
        match st.fate {
            Fate::Resident => {}
            Fate::Transformed => return Ok(None),
            Fate::Freed => return Err(errno(libc::ENOENT)),
        }
        if set.size.is_some_and(|size| size > i64::MAX as u64) {
            return Err(errno(libc::EFBIG));
        }
        let r = (|| {
            let tx = otx.tx();
            let truncated = match set.size {
                Some(size) => Some(self.tx_truncate(tx, f, &st, size)?),
                None => None,
            };
            let mut rec = truncated.as_ref().map_or_else(|| st.rec.clone(), |t| t.rec.clone());
            if let Some(mode) = set.mode {
                rec.mode = libc::S_IFREG | (mode & 0o7777);
            }
            if set.uid.is_some() || set.gid.is_some() {
                rec.uid = set.uid.unwrap_or(rec.uid);
                rec.gid = set.gid.unwrap_or(rec.gid);
                // chown of a regular file removes set-ID bits, even for root (notify_change
                // with ATTR_KILL_SUID/SGID); the kernel leaves it to us (handle_killpriv_v2).
                if set.mode.is_none() {
                    rec.mode &= !suidgid_bits(rec.mode);
                }
            }
            if set.size.is_some() && set.mode.is_none() && unprivileged {
                rec.mode &= !suidgid_bits(rec.mode);
            }
            if let Some(t) = set.atime {
                rec.atime = self.time(t);
            }
            if let Some(t) = set.mtime {
                rec.mtime = self.time(t);
            }
            rec.ctime = self.lower.now();
            data::put_record(tx, f.frame, &rec).map_err(nvram_full)?;
            Ok((truncated, rec))
        })();
        let (truncated, rec) = otx.end(r)?;
        if let Some(t) = truncated {
            self.apply_truncate(&mut st, t);
        }
        st.rec = rec;
        Ok(Some(self.temp_attr(f, &st)))
    }

    /// Unlinks `name` if it is a temp file: `false` when it is not one.
    pub(crate) fn temp_unlink(
        &self,
        otx: &mut OpTx<'_>,
        dir: &L::Node,
        name: &OsStr,
    ) -> FsResult<bool> {
        let key = self.lower.key(dir);
        loop {
            let mut idx = self.index.lock().expect("temp index");
            let Some(f) = idx.get(key, name).cloned() else { return Ok(false) };
            let mut st = f.lock();
            if st.rec.state == State::Transforming {
                drop(idx);
                drop(f.wait_stable(st));
                continue;
            }
            self.touch_dir(dir)?;
            self.unlink_shadowed(dir, &st.rec)?;
            let r = self.tx_unname(otx.tx(), &f, &st);
            let unnamed = otx.end(r)?;
            self.apply_unname(&mut st, unnamed);
            idx.remove_name(key, name);
            if st.fate == Fate::Freed {
                idx.objects.remove(&f.serial);
            }
            Counters::add(&self.tc.deleted_in_nvram, 1);
            return Ok(true);
        }
    }

    /// O1: a temp file leaves a name under which it hid a lower file: unlink that file first,
    /// durably (fsync of the directory), because once the NVRAM commit has taken the temp file
    /// away nothing would hide the lower file after a crash any more.
    fn unlink_shadowed(&self, dir: &L::Node, rec: &Record) -> FsResult<()> {
        if rec.shadows() {
            match self.lower.unlink(dir, &rec.name) {
                Ok(()) => self.sync_dir(dir)?,
                Err(lower::Errno(libc::ENOENT)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Takes the name away from a temp file (unlink, or replaced by a rename): frees it or,
    /// while open, keeps it unnamed. Applied by `apply_unname` after the commit.
    fn tx_unname(&self, tx: &mut Tx<'_>, f: &TempFile, st: &TempState) -> FsResult<Unnamed> {
        if st.opens == 0 {
            return Ok(Unnamed::Freed(Self::tx_free(tx, f, st)?));
        }
        let mut rec = st.rec.clone();
        rec.nlink = 0;
        rec.name = std::ffi::OsString::new();
        rec.set_shadows(false);
        rec.ctime = self.lower.now();
        data::put_record(tx, f.frame, &rec).map_err(nvram_full)?;
        Ok(Unnamed::Kept(rec))
    }

    fn apply_unname(&self, st: &mut TempState, u: Unnamed) {
        match u {
            Unnamed::Freed(pages) => self.apply_free(st, pages),
            Unnamed::Kept(rec) => st.rec = rec,
        }
    }

    /// rename(2) over the merged namespace (see O1, O2).
    pub(crate) fn rename_merged(
        &self,
        otx: &mut OpTx<'_>,
        p: &Arc<L::Node>,
        name: &OsStr,
        np: &Arc<L::Node>,
        newname: &OsStr,
        flags: u32,
    ) -> FsResult<()> {
        const NOREPLACE: u32 = libc::RENAME_NOREPLACE;
        const EXCHANGE: u32 = libc::RENAME_EXCHANGE;
        let (k1, k2) = (self.lower.key(p), self.lower.key(np));
        if tempfs::is_hidden(name) {
            return Err(errno(libc::ENOENT));
        }
        if tempfs::is_hidden(newname) {
            return Err(errno(libc::EPERM));
        }
        if flags & !(NOREPLACE | EXCHANGE) != 0 || flags == NOREPLACE | EXCHANGE {
            return Err(errno(libc::EINVAL));
        }
        loop {
            let idx = self.index.lock().expect("temp index");
            let src = idx.get(k1, name).cloned();
            let dst = idx.get(k2, newname).cloned();
            match (src, dst) {
                (None, None) => {
                    drop(idx);
                    // O3: a lower directory holding temp files is not empty.
                    if flags & EXCHANGE == 0
                        && let Ok((target, attr)) = self.lower.lookup(np, newname)
                        && attr.kind() == FileKind::Directory
                        && self
                            .index
                            .lock()
                            .expect("temp index")
                            .has_entries(self.lower.key(&target))
                    {
                        let (_, src_attr) = self.lower.lookup(p, name)?;
                        if src_attr.kind() == FileKind::Directory {
                            return Err(errno(libc::ENOTEMPTY));
                        }
                    }
                    return Ok(self.lower.rename(p, name, np, newname, flags)?);
                }
                (None, Some(d)) => {
                    // A lower object onto a temp name.
                    let (_, src_attr) = self.lower.lookup(p, name)?;
                    if flags & NOREPLACE != 0 {
                        return Err(errno(libc::EEXIST));
                    }
                    if src_attr.kind() == FileKind::Directory && flags & EXCHANGE == 0 {
                        return Err(errno(libc::ENOTDIR));
                    }
                    drop(idx);
                    self.transform(&d, tempfs::Trigger::LowerRename)?; // O2
                }
                (Some(s), None) => {
                    if let Some(done) = self.rename_temp_to_free(
                        otx,
                        idx,
                        &s,
                        (p, k1, name),
                        (np, k2, newname),
                        flags,
                    )? {
                        return Ok(done);
                    }
                }
                (Some(s), Some(d)) => {
                    if let Some(done) = self.rename_temp_onto_temp(
                        otx,
                        idx,
                        (&s, p, k1, name),
                        (&d, np, k2, newname),
                        flags,
                    )? {
                        return Ok(done);
                    }
                }
            }
        }
    }

    /// rename of a temp file onto a name that is not a temp file (free, or a lower object).
    /// `None`: the state changed while waiting; the caller starts over.
    #[allow(clippy::too_many_lines)]
    fn rename_temp_to_free(
        &self,
        otx: &mut OpTx<'_>,
        mut idx: std::sync::MutexGuard<'_, tempfs::Index<L::Node>>,
        s: &Arc<TempFile>,
        (p, k1, name): (&Arc<L::Node>, tempfs::DirKey, &OsStr),
        (np, k2, newname): (&Arc<L::Node>, tempfs::DirKey, &OsStr),
        flags: u32,
    ) -> FsResult<Option<()>> {
        const NOREPLACE: u32 = libc::RENAME_NOREPLACE;
        const EXCHANGE: u32 = libc::RENAME_EXCHANGE;
        let (target, victim_links) = match self.lower.lookup(np, newname) {
            Ok((_, attr)) => (Some(attr.kind()), attr.nlink),
            Err(lower::Errno(libc::ENOENT)) => (None, 0),
            Err(e) => return Err(e.into()),
        };
        if target.is_some() && flags & NOREPLACE != 0 {
            return Err(errno(libc::EEXIST));
        }
        if target.is_none() && flags & EXCHANGE != 0 {
            return Err(errno(libc::ENOENT));
        }
        if target == Some(FileKind::Directory) && flags & EXCHANGE == 0 {
            return Err(errno(libc::EISDIR));
        }
        // O2, and a regular file with other links: shadowing would leave its link
        // count one too high, so the lower rename does it (after a transform).
        if flags & EXCHANGE != 0 || (target == Some(FileKind::Regular) && victim_links > 1) {
            drop(idx);
            self.transform(s, tempfs::Trigger::LowerRename)?;
            return Ok(None);
        }
        if k1 == k2 && name == newname {
            return Ok(Some(()));
        }
        let mut st = s.lock();
        if st.rec.state == State::Transforming {
            drop(idx);
            drop(s.wait_stable(st));
            return Ok(None);
        }
        let handle = self.handle_of(&idx, k2, np)?;
        self.unlink_shadowed(p, &st.rec)?;
        self.touch_dirs(p, k1, np, k2)?;
        let mut rec = st.rec.clone();
        rec.dir.clone_from(&handle);
        rec.name = newname.to_os_string();
        rec.set_shadows(target.is_some());
        rec.ctime = self.lower.now();
        let r = data::put_record(otx.tx(), s.frame, &rec).map_err(nvram_full);
        otx.end(r)?;
        st.rec = rec;
        st.dir = k2;
        idx.remove_name(k1, name);
        idx.insert_name(k2, np, &handle, newname, Arc::clone(s));
        Ok(Some(()))
    }

    /// rename of a temp file onto another temp file (replace or exchange). `None`: the state
    /// changed while waiting; the caller starts over.
    #[allow(clippy::too_many_lines)]
    fn rename_temp_onto_temp(
        &self,
        otx: &mut OpTx<'_>,
        mut idx: std::sync::MutexGuard<'_, tempfs::Index<L::Node>>,
        (s, p, k1, name): (&Arc<TempFile>, &Arc<L::Node>, tempfs::DirKey, &OsStr),
        (d, np, k2, newname): (&Arc<TempFile>, &Arc<L::Node>, tempfs::DirKey, &OsStr),
        flags: u32,
    ) -> FsResult<Option<()>> {
        const NOREPLACE: u32 = libc::RENAME_NOREPLACE;
        const EXCHANGE: u32 = libc::RENAME_EXCHANGE;
        if Arc::ptr_eq(s, d) {
            return Ok(Some(()));
        }
        if flags & NOREPLACE != 0 {
            return Err(errno(libc::EEXIST));
        }
        // Two files: lock in serial order (the only place two are held).
        let (first, second) = if s.serial < d.serial { (s, d) } else { (d, s) };
        let g1 = first.lock();
        let g2 = second.lock();
        let (mut ss, mut ds) = if s.serial < d.serial { (g1, g2) } else { (g2, g1) };
        if ss.rec.state == State::Transforming || ds.rec.state == State::Transforming {
            let busy = if ss.rec.state == State::Transforming { s } else { d };
            drop(ss);
            drop(ds);
            drop(idx);
            drop(busy.wait_stable(busy.lock()));
            return Ok(None);
        }
        let h1 = self.handle_of(&idx, k1, p)?;
        let h2 = self.handle_of(&idx, k2, np)?;
        self.touch_dirs(p, k1, np, k2)?;
        let now = self.lower.now();
        if flags & EXCHANGE != 0 {
            let mut rs = ss.rec.clone();
            let mut rd = ds.rec.clone();
            let (s_shadows, d_shadows) = (rs.shadows(), rd.shadows());
            (rs.dir, rs.name) = (h2.clone(), newname.to_os_string());
            (rd.dir, rd.name) = (h1.clone(), name.to_os_string());
            rs.set_shadows(d_shadows);
            rd.set_shadows(s_shadows);
            rs.ctime = now;
            rd.ctime = now;
            let r = (|| {
                let tx = otx.tx();
                data::put_record(tx, s.frame, &rs)?;
                data::put_record(tx, d.frame, &rd)
            })()
            .map_err(nvram_full);
            otx.end(r)?;
            ss.rec = rs;
            ds.rec = rd;
            (ss.dir, ds.dir) = (k2, k1);
            idx.remove_name(k1, name);
            idx.remove_name(k2, newname);
            idx.insert_name(k2, np, &h2, newname, Arc::clone(s));
            idx.insert_name(k1, p, &h1, name, Arc::clone(d));
            return Ok(Some(()));
        }
        // s replaces d: d loses its name (its shadowed lower file, if any, stays
        // shadowed by s); s leaves its old name (unlinking what it shadowed there).
        let mut rs = ss.rec.clone();
        let inherited = ds.rec.shadows();
        self.unlink_shadowed(p, &ss.rec)?;
        (rs.dir, rs.name) = (h2.clone(), newname.to_os_string());
        rs.set_shadows(inherited);
        rs.ctime = now;
        let r = (|| {
            let tx = otx.tx();
            let unnamed = self.tx_unname(tx, d, &ds)?;
            data::put_record(tx, s.frame, &rs).map_err(nvram_full)?;
            Ok(unnamed)
        })();
        let unnamed = otx.end(r)?;
        self.apply_unname(&mut ds, unnamed);
        ss.rec = rs;
        ss.dir = k2;
        idx.remove_name(k2, newname);
        if ds.fate == Fate::Freed {
            idx.objects.remove(&d.serial);
        }
        idx.remove_name(k1, name);
        idx.insert_name(k2, np, &h2, newname, Arc::clone(s));
        Counters::add(&self.tc.deleted_in_nvram, 1);
        Ok(Some(()))
    }

    fn touch_dirs(
        &self,
        p: &L::Node,
        k1: tempfs::DirKey,
        np: &L::Node,
        k2: tempfs::DirKey,
    ) -> FsResult<()> {
        self.touch_dir(p)?;
        if k1 != k2 {
            self.touch_dir(np)?;
        }
        Ok(())
    }

    fn handle_of(
        &self,
        idx: &tempfs::Index<L::Node>,
        key: tempfs::DirKey,
        dir: &L::Node,
    ) -> FsResult<Vec<u8>> {
        if let Some(d) = idx.dirs.get(&key) {
            return Ok(d.handle.clone());
        }
        if key.0 != self.root_dev {
            // Temp files stay on the lower root's file system.
            return Err(errno(libc::EXDEV));
        }
        let h = self.lower.dir_handle(dir)?;
        if h.len() > tempfs::record::MAX_HANDLE {
            return Err(errno(libc::EXDEV));
        }
        Ok(h)
    }

    /// Lists a directory for readdir: the lower entries (nvstack's hidden names left out) and,
    /// when the directory holds temp files, the merged snapshot (see `Open::Dir`).
    pub(crate) fn list_merged(
        &self,
        h: &Handle<Open<L>>,
        offset: u64,
        emit: &mut dyn FnMut(&Listed) -> bool,
    ) -> FsResult<()> {
        let Open::Dir { file, key, listing } = &h.file else {
            return Err(errno(libc::ENOTDIR));
        };
        let snapshot = {
            let mut l = listing.lock().expect("listing lock");
            if offset == 0 {
                *l = if self.index.lock().expect("temp index").has_entries(*key) {
                    Some(Arc::new(self.snapshot_dir(file, *key)?))
                } else {
                    None
                };
            }
            l.clone()
        };
        if let Some(entries) = snapshot {
            for l in entries.iter().skip(offset as usize) {
                if !emit(l) {
                    break;
                }
            }
            return Ok(());
        }
        self.lower.readdir(file, offset, &mut |entry| {
            if tempfs::is_hidden(&entry.name) {
                return true;
            }
            emit(&Listed { entry, temp: None })
        })?;
        Ok(())
    }

    fn snapshot_dir(&self, file: &L::File, key: tempfs::DirKey) -> FsResult<Vec<Listed>> {
        let mut lower_entries = Vec::new();
        let mut too_many = false;
        self.lower.readdir(file, 0, &mut |e| {
            if lower_entries.len() >= MAX_LISTING {
                too_many = true;
                return false;
            }
            lower_entries.push(e);
            true
        })?;
        if too_many {
            return Err(errno(libc::EOVERFLOW));
        }
        let idx = self.index.lock().expect("temp index");
        let temps = idx.dirs.get(&key).map(|d| d.names.clone()).unwrap_or_default();
        drop(idx);
        let mut out = Vec::with_capacity(lower_entries.len() + temps.len());
        for e in lower_entries {
            if tempfs::is_hidden(&e.name) || temps.contains_key(&e.name) {
                continue; // hidden, or shadowed by a temp file (O1)
            }
            out.push(Listed { entry: e, temp: None });
        }
        for (name, f) in temps {
            out.push(Listed {
                entry: DirEntry {
                    ino: TEMP_BASE + f.serial,
                    offset: 0,
                    kind: Some(FileKind::Regular),
                    name,
                },
                temp: Some(f),
            });
        }
        for (i, l) in out.iter_mut().enumerate() {
            l.entry.offset = i as u64 + 1;
        }
        Ok(out)
    }

    /// After a write to a temp file committed: the size trigger, then NVRAM pressure.
    pub(crate) fn after_temp_write(&self, f: &Arc<TempFile>) {
        let too_big = {
            let st = f.lock();
            st.fate == Fate::Resident && st.rec.nlink > 0 && st.rec.size > self.temp.max_size
        };
        if too_big {
            // Failure leaves the file in NVRAM, which is still correct; it is retried on the
            // next write.
            if let Err(e) = self.transform(f, tempfs::Trigger::Size) {
                eprintln!("nvstack: size-triggered transform failed: {e}");
            }
        }
        self.relieve_pressure(false);
    }

    /// A name was added to or removed from a lower directory through the overlay: its mtime
    /// and ctime change as if the lower file system had done it (POSIX; the kernel drops its
    /// cached attributes of the directory and asks again).
    pub(crate) fn touch_dir(&self, dir: &L::Node) -> FsResult<()> {
        let set = SetAttr { mtime: Some(lower::TimeSet::Now), ..SetAttr::default() };
        self.lower.setattr(dir, None, &set)?;
        Ok(())
    }
}

/// Group and permission bits of a new file as the kernel's inode_init_owner sets them in the
/// lower directory: the group of a set-group-ID directory; S_ISGID kept only for a member.
fn init_owner(creds: &Creds, dir: &lower::Attr, mode: u32) -> (u32, u32) {
    let gid = if dir.mode & libc::S_ISGID != 0 { dir.gid } else { creds.gid };
    let mut perm = mode & 0o7777;
    if perm & libc::S_ISGID != 0
        && creds.uid != 0
        && gid != creds.gid
        && !creds.groups.contains(&gid)
    {
        perm &= !libc::S_ISGID;
    }
    (gid, perm)
}

/// The flags a transformed temp file is reopened with: the access mode and the flags that
/// change IO semantics, never those of creation (O_CREAT, O_EXCL, O_TRUNC).
fn reopen_flags(flags: i32) -> i32 {
    flags & (libc::O_ACCMODE | libc::O_SYNC | libc::O_DSYNC | libc::O_NOATIME)
}
