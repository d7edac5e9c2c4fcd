//! Operations on temp files (TempFFS; design.md section 10): create, open, release, write,
//! truncate and setattr, atime, unlink. Renames are in `rename.rs`, the transform in
//! `transform.rs`.
//!
//! Each change rewrites the file's record (and data frames) inside the operation's
//! transaction, committed before the file's lock is released (strict two-phase locking); the
//! volatile mirror (state, overlay) changes only after the commit, so an aborted transaction
//! leaves nothing to repair in memory (strict 2PL, ARCHITECTURE.md's rules).

use std::ffi::OsStr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};

use lower::{Attr, Creds, LowerFs, SetAttr};

use crate::base::inodes::{Identity, TEMP_BASE};
use crate::tempfs::names::Obj;
use txn::Tx;

use crate::base::Entry;
use crate::base::Incident;
use crate::base::OpTx;
use crate::base::counters::Counters;
use crate::base::error::{FsError, FsResult, answer};
use crate::base::pages::{self, DataRecord};
use crate::base::slots;
use crate::base::{Base, debug_check, suidgid_bits};
use crate::tempfs::TempFs;
use crate::tempfs::names::Open;
use crate::tempfs::overlay::DirKey;
use crate::tempfs::{self, Fate, Place, Record, State, TempFile, TempState, data};

/// The outcome of `tx_truncate`, applied to the mirror after the commit.
struct Truncated {
    rec: Record,
    pages: std::collections::BTreeMap<u64, txn::FrameId>,
    freed: u64,
}

/// The outcome of `tx_unname`.
pub(super) enum Unnamed {
    Freed(u64),
    Kept(Record),
}

impl<L: LowerFs> TempFs<L> {
    /// Registers a temp file with the kernel (one lookup). Called with the file's state
    /// locked and the file resident, so that a transform cannot re-key it in between.
    pub(crate) fn temp_entry(&self, b: &Base<L>, f: &Arc<TempFile>, st: &TempState) -> Entry {
        let node_id = self.nodes.remember(Obj::Temp(Arc::clone(f)), Identity::Nvram(f.serial));
        Entry { node_id, attr: Self::temp_attr(b, f, st) }
    }

    /// A temp file's attributes, from its record.
    pub(crate) fn temp_attr(b: &Base<L>, f: &TempFile, st: &TempState) -> Attr {
        let r = &st.rec;
        Attr {
            dev: b.root_dev,
            ino: TEMP_BASE + f.serial,
            size: r.size,
            blocks: st.pages.len() as u64 * (data::PAGE / 512),
            atime: r.atime,
            mtime: r.mtime,
            ctime: r.ctime,
            mode: r.mode,
            nlink: r.nlink,
            uid: r.uid,
            gid: r.gid,
            rdev: 0,
            blksize: data::PAGE as u32,
        }
    }

    /// The temp file named `name` in `dir`, registered with the kernel (one lookup).
    pub(crate) fn temp_lookup(&self, b: &Base<L>, dir: &L::Node, name: &OsStr) -> Option<Entry> {
        let key = b.lower.key(dir);
        let mut f = Arc::clone(self.overlay.lock().get(key, name)?);
        loop {
            let st = f.lock();
            // With the file's lock held its name cannot change (O5); the overlay, read again
            // under it, says whether the file read before still has the name.
            let now = self.overlay.lock().get(key, name).cloned();
            match now {
                Some(g) if Arc::ptr_eq(&g, &f) => return Some(self.temp_entry(b, &f, &st)),
                Some(g) => {
                    drop(st);
                    f = g;
                }
                None => return None,
            }
        }
    }

    /// Creates `name` as a temp file when TempFFS applies: on, a regular file, the directory
    /// on the lower root's file system and without a default ACL (the lower file system would
    /// give the new file an ACL we do not keep). `None`: create it in the lower file system.
    ///
    /// The lower calls (ACL, attributes, the name's absence, the directory's handle, space)
    /// come first, without a lock; the overlay is held only for the name check, the record's
    /// transaction and the insertion. (The name cannot appear in the lower directory
    /// meanwhile: the kernel serializes namespace changes of one directory, assumption K1 of design.md
    /// section 8.)
    pub(crate) fn temp_create(
        &self,
        b: &Base<L>,
        otx: &mut OpTx<'_>,
        creds: &Creds,
        (dir, name): (&Arc<L::Node>, &OsStr),
        mode: u32,
        flags: i32,
    ) -> FsResult<Option<(Entry, u64)>> {
        let key = b.lower.key(dir);
        if !self.config.enabled
            || !matches!(mode & libc::S_IFMT, 0 | libc::S_IFREG)
            || key.0 != b.root_dev
            || tempfs::is_hidden(name)
        {
            return Ok(None);
        }
        if name.len() > tempfs::record::MAX_NAME {
            return Err(answer(libc::ENAMETOOLONG));
        }
        let Some((handle, dir_attr)) = self.temp_create_checks(b, dir, key, name)? else {
            return Ok(None);
        };
        let (gid, perm) = init_owner(creds, &dir_attr, mode);
        let now = b.lower.now();
        let mut idx = self.overlay.lock();
        if idx.get(key, name).is_some() {
            return Err(answer(libc::EEXIST));
        }
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
        // The record in a reserved slot (or a fresh record frame, T6), and the directory's
        // pending times (P3), in one transaction.
        let reserved = self.slots.lock().reserve();
        let attempt = (|| {
            let tx = otx.tx();
            let place = slots::put_new(tx, tempfs::record::KIND_RECORDS, reserved, &rec.encode())?;
            Ok((place, Self::tx_dir_times(b, tx, &idx, key, &handle, now)?))
        })();
        let full = matches!(attempt, Err(txn::TxError::NoFrames));
        let ended = otx.end(attempt.map_err(FsError::from));
        self.slots.lock().settle_new(reserved, ended.as_ref().ok().map(|(p, _)| *p));
        let (place, times) = match ended {
            Ok(done) => done,
            Err(e) => {
                if full {
                    // A full NVRAM: the file goes to the lower file system (never an error
                    // there).
                    Counters::add(&self.counters.created_in_lower_nvram_full, 1);
                    return Ok(None);
                }
                return Err(e);
            }
        };
        Self::apply_dir_times(&mut idx, key, dir, times);
        idx.next_serial += 1;
        let f = Arc::new(TempFile::new(
            place,
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
        idx.temps.insert(serial, Arc::clone(&f));
        drop(idx);
        Counters::add(&self.counters.created, 1);
        b.space.add_file();
        self.open_created(b, otx, &f, key, name, flags).map(Some)
    }

    /// The kernel's lookup and open handle of a temp file just created (its `opens` is 1).
    fn open_created(
        &self,
        b: &Base<L>,
        otx: &mut OpTx<'_>,
        f: &Arc<TempFile>,
        key: DirKey,
        name: &OsStr,
        flags: i32,
    ) -> FsResult<(Entry, u64)> {
        let st = f.lock();
        let entry = self.temp_entry(b, f, &st);
        drop(st);
        let open =
            Open::Temp { file: Arc::clone(f), flags: reopen_flags(flags), lower: OnceLock::new() };
        let Some(fh) = self.handles.insert(entry.node_id, open) else {
            // Too many open files: take the new file back (as a failed open(O_CREAT) would
            // leave it, it may stay; removing it is kinder and is what we do).
            self.nodes.forget(entry.node_id, 1);
            let mut st = f.lock();
            st.opens = 0;
            let r = Self::tx_unname(b, otx.tx(), f, &st);
            if let Ok(u) = otx.end(r) {
                let mut idx = self.overlay.lock();
                self.apply_unname(b, f, &mut st, u);
                idx.remove_name(key, name);
                idx.temps.remove(&f.serial);
            }
            return Err(answer(libc::EMFILE));
        };
        Ok((entry, fh))
    }

    /// The lower side of a temp-file create, before any lock: `None` when the directory has a
    /// default ACL or no handle short enough (create in the lower file system instead), EEXIST
    /// when the lower directory has the name; else the directory's handle and attributes,
    /// with space for the new file reserved.
    fn temp_create_checks(
        &self,
        b: &Base<L>,
        dir: &L::Node,
        key: DirKey,
        name: &OsStr,
    ) -> FsResult<Option<(Vec<u8>, lower::Attr)>> {
        match b.lower.getxattr(dir, OsStr::new("system.posix_acl_default"), 0) {
            Ok(_) => return Ok(None),
            Err(lower::Errno(libc::ENODATA | libc::EOPNOTSUPP)) => {}
            Err(e) => return Err(e.into()),
        }
        let dir_attr = b.lower.getattr(dir)?;
        match b.lower.lookup(dir, name) {
            Ok(_) => return Err(answer(libc::EEXIST)),
            Err(lower::Errno(libc::ENOENT)) => {}
            Err(e) => return Err(e.into()),
        }
        let handle = self.dir_handle_of(b, key, dir)?;
        if handle.len() > tempfs::record::MAX_HANDLE {
            return Ok(None);
        }
        b.reserve(1)?;
        Ok(Some((handle, dir_attr)))
    }

    /// The durable handle of lower directory `dir` (key `key`): the overlay's copy when it
    /// holds temp files there, else asked of the lower file system (no lock held).
    pub(super) fn dir_handle_of(
        &self,
        b: &Base<L>,
        key: DirKey,
        dir: &L::Node,
    ) -> FsResult<Vec<u8>> {
        if let Some(d) = self.overlay.lock().dirs.get(&key) {
            return Ok(d.handle.clone());
        }
        Ok(b.lower.dir_handle(dir)?)
    }

    /// Opens a temp file; `None` when it was transformed meanwhile (open the lower file).
    pub(crate) fn temp_open(
        &self,
        b: &Base<L>,
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
            Fate::Freed => return Err(answer(libc::ENOENT)),
        }
        if flags & libc::O_TRUNC != 0 && st.rec.size > 0 {
            let r = Self::tx_truncate(b, otx.tx(), f, &st, 0);
            let t = otx.end(r)?;
            self.apply_truncate(b, &mut st, t);
        }
        let open =
            Open::Temp { file: Arc::clone(f), flags: reopen_flags(flags), lower: OnceLock::new() };
        let fh = self.handles.insert(node_id, open).ok_or(answer(libc::EMFILE))?;
        st.opens += 1;
        st.last_use = self.lru.tick();
        Ok(Some(fh))
    }

    /// Last close of an unlinked temp file frees it.
    pub(crate) fn temp_release(
        &self,
        b: &Base<L>,
        otx: &mut OpTx<'_>,
        f: &Arc<TempFile>,
    ) -> FsResult<()> {
        let mut st = f.lock();
        if st.opens == 1 && st.rec.nlink == 0 && st.fate == Fate::Resident {
            let r = Self::tx_free(otx.tx(), f, &st);
            let n = otx.end(r)?;
            self.apply_free(b, f, &mut st, n);
            self.overlay.lock().temps.remove(&f.serial);
        }
        st.opens = st.opens.saturating_sub(1);
        Ok(())
    }

    /// Frees every frame of `f` in `tx`; returns the number of data pages freed.
    pub(super) fn tx_free(tx: &mut Tx<'_>, f: &TempFile, st: &TempState) -> FsResult<u64> {
        let mut pages = st.pages.clone();
        data::free_all(tx, f.place, &mut pages).map_err(FsError::from)
    }

    /// After the transaction of `tx_free` committed.
    pub(super) fn apply_free(&self, b: &Base<L>, f: &TempFile, st: &mut TempState, pages: u64) {
        self.release_record(b, f.place);
        st.pages.clear();
        st.fate = Fate::Freed;
        self.counters.pages_resident.fetch_sub(pages, Ordering::Relaxed);
        b.space.sub(pages);
        b.space.sub_file();
    }

    /// After the removal of the record at `place` committed (`data::free_all`): the slot
    /// released (`Base::release_slot`).
    pub(crate) fn release_record(&self, b: &Base<L>, place: Place) {
        let freed = b.release_slot(&self.slots, place);
        Counters::add(&self.counters.record_frames_freed, freed);
    }

    /// Frees the temp files' record frames without a record, all but `keep`.
    pub(crate) fn free_empty_record_frames(&self, b: &Base<L>, keep: usize) -> FsResult<()> {
        let freed = b.free_empty_slots(&self.slots, keep)?;
        Counters::add(&self.counters.record_frames_freed, freed);
        Ok(())
    }

    /// Sets the size of a temp file in `tx` (the caller holds its state, stable); returns the
    /// new record and page map and the number of pages freed, applied by `apply_truncate`.
    fn tx_truncate(
        b: &Base<L>,
        tx: &mut Tx<'_>,
        f: &TempFile,
        st: &TempState,
        size: u64,
    ) -> FsResult<Truncated> {
        let mut rec = st.rec.clone();
        rec.truncated(size, b.lower.now());
        data::put_record(tx, f.place, &rec).map_err(FsError::from)?;
        let mut pages = st.pages.clone();
        let freed = data::truncate(tx, &mut pages, st.rec.size, size).map_err(FsError::from)?;
        Ok(Truncated { rec, pages, freed })
    }

    fn apply_truncate(&self, b: &Base<L>, st: &mut TempState, t: Truncated) {
        st.rec = t.rec;
        st.pages = t.pages;
        self.counters.pages_resident.fetch_sub(t.freed, Ordering::Relaxed);
        b.space.sub(t.freed);
    }

    /// relatime, as the lower file system mounts by default: a read updates atime when it is
    /// not newer than mtime or ctime, or older than a day. (A frozen file is left alone.)
    pub(crate) fn temp_touch_atime(
        b: &Base<L>,
        otx: &mut OpTx<'_>,
        f: &TempFile,
        st: &mut TempState,
    ) -> FsResult<()> {
        const DAY: i64 = 24 * 3600;
        let r = &st.rec;
        let now = b.lower.now();
        if r.state == State::Transforming
            || (r.atime > r.mtime && r.atime > r.ctime && now.0 - r.atime.0 < DAY)
        {
            return Ok(());
        }
        let mut rec = r.clone();
        rec.atime = now;
        let r = data::put_record(otx.tx(), f.place, &rec).map_err(FsError::from);
        otx.end(r)?;
        st.rec = rec;
        Ok(())
    }

    /// Writes to a temp file; `None` when it has been transformed (write to the lower file).
    pub(crate) fn temp_write(
        &self,
        b: &Base<L>,
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
            Fate::Freed => return Err(answer(libc::ESTALE)),
        }
        let end = pages::write_end(offset, buf.len())?;
        let missing = pages::span(offset, end).filter(|p| !st.pages.contains_key(p)).count() as u64;
        b.reserve(missing)?;
        let mut rec = st.rec.clone();
        rec.written(end, b.lower.now());
        if kill_suidgid {
            rec.mode &= !suidgid_bits(rec.mode);
        }
        // The page map is changed in place (no copy per write on this hot path): the pages a
        // rolled-back write added are taken out again while the file lock is still held.
        let tx = otx.tx();
        let r = data::write(tx, f.place, &mut st.pages, offset, buf).and_then(|fresh| {
            data::put_record(tx, f.place, &rec)
                .inspect_err(|_| data::forget_pages(&mut st.pages, &fresh))
        });
        otx.end(r.map(drop).map_err(FsError::from))?;
        st.rec = rec;
        st.last_use = self.lru.tick();
        self.counters.pages_resident.fetch_add(missing, Ordering::Relaxed);
        b.space.add(missing);
        Counters::add(&self.counters.bytes_written_by_apps, buf.len() as u64);
        Counters::add(&b.counters.app_bytes_written, buf.len() as u64);
        debug_check!(st.check());
        Ok(Some(buf.len()))
    }

    /// setattr of a temp file; `None` when it has been transformed (use the lower file).
    pub(crate) fn temp_setattr(
        &self,
        b: &Base<L>,
        otx: &mut OpTx<'_>,
        f: &Arc<TempFile>,
        set: &SetAttr,
        unprivileged: bool,
    ) -> FsResult<Option<lower::Attr>> {
        let mut st = f.wait_stable(f.lock());
        match st.fate {
            Fate::Resident => {}
            Fate::Transformed => return Ok(None),
            Fate::Freed => return Err(answer(libc::ENOENT)),
        }
        if let Some(size) = set.size {
            pages::check_size(size)?;
        }
        let r = (|| {
            let tx = otx.tx();
            let truncated = match set.size {
                Some(size) => Some(Self::tx_truncate(b, tx, f, &st, size)?),
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
                rec.atime = b.time(t);
            }
            if let Some(t) = set.mtime {
                rec.mtime = b.time(t);
            }
            rec.ctime = b.lower.now();
            data::put_record(tx, f.place, &rec).map_err(FsError::from)?;
            Ok((truncated, rec))
        })();
        let (truncated, rec) = otx.end(r)?;
        if let Some(t) = truncated {
            self.apply_truncate(b, &mut st, t);
        }
        st.rec = rec;
        debug_check!(st.check());
        Ok(Some(Self::temp_attr(b, f, &st)))
    }

    /// Unlinks `name` if it is a temp file: `false` when it is not one.
    pub(crate) fn temp_unlink(
        &self,
        b: &Base<L>,
        otx: &mut OpTx<'_>,
        dir: &Arc<L::Node>,
        name: &OsStr,
    ) -> FsResult<bool> {
        let key = b.lower.key(dir);
        loop {
            let Some(f) = self.overlay.lock().get(key, name).cloned() else {
                return Ok(false);
            };
            let mut st = f.wait_stable(f.lock());
            if !st.is_named(key, name) {
                continue; // renamed, transformed or unlinked meanwhile: look again
            }
            // Lower calls under this file's lock only (O1: the shadowed file goes first).
            Self::unlink_shadowed(b, dir, &st.rec)?;
            let now = b.lower.now();
            let mut idx = self.overlay.lock();
            let handle = st.rec.dir.clone();
            let r = (|| -> FsResult<_> {
                let tx = otx.tx();
                let unnamed = Self::tx_unname(b, tx, &f, &st)?;
                Ok((unnamed, Self::tx_dir_times(b, tx, &idx, key, &handle, now)?))
            })();
            let (unnamed, times) = otx.end(r)?;
            Self::apply_dir_times(&mut idx, key, dir, times);
            self.apply_unname(b, &f, &mut st, unnamed);
            idx.remove_name(key, name);
            if st.fate == Fate::Freed {
                idx.temps.remove(&f.serial);
            }
            drop(idx);
            Counters::add(&self.counters.deleted_in_nvram, 1);
            return Ok(true);
        }
    }

    /// O1: a temp file leaves a name under which it hid a lower file: unlink that file first,
    /// durably (fsync of the directory), because once the NVRAM commit has taken the temp file
    /// away nothing would hide the lower file after a crash any more.
    pub(super) fn unlink_shadowed(b: &Base<L>, dir: &L::Node, rec: &Record) -> FsResult<()> {
        if rec.shadows() {
            let w1 = b.committed(); // the temp file that hid it was committed
            match b.lower.unlink(&w1, dir, &rec.name) {
                Ok(()) => Self::sync_dir(b, dir)?,
                Err(lower::Errno(libc::ENOENT)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Takes the name away from a temp file (unlink, or replaced by a rename): frees it or,
    /// while open, keeps it unnamed. Applied by `apply_unname` after the commit.
    pub(super) fn tx_unname(
        b: &Base<L>,
        tx: &mut Tx<'_>,
        f: &TempFile,
        st: &TempState,
    ) -> FsResult<Unnamed> {
        if st.opens == 0 {
            return Ok(Unnamed::Freed(Self::tx_free(tx, f, st)?));
        }
        let mut rec = st.rec.clone();
        rec.nlink = 0;
        rec.name = std::ffi::OsString::new();
        rec.set_shadows(false);
        rec.ctime = b.lower.now();
        data::put_record(tx, f.place, &rec).map_err(FsError::from)?;
        Ok(Unnamed::Kept(rec))
    }

    pub(super) fn apply_unname(&self, b: &Base<L>, f: &TempFile, st: &mut TempState, u: Unnamed) {
        match u {
            Unnamed::Freed(pages) => self.apply_free(b, f, st, pages),
            Unnamed::Kept(rec) => st.rec = rec,
        }
        debug_check!(st.check());
    }

    /// After a write to a temp file committed: the size trigger (NVRAM pressure follows,
    /// `engine/pressure.rs`).
    pub(crate) fn after_write(&self, b: &Base<L>, f: &Arc<TempFile>) {
        let too_big = {
            let st = f.lock();
            st.fate == Fate::Resident && st.rec.nlink > 0 && st.rec.size > self.config.max_size
        };
        if too_big {
            // Failure leaves the file in NVRAM, which is still correct; it is retried on the
            // next write.
            if let Err(e) = self.transform(b, f, tempfs::Trigger::Size) {
                b.incident(
                    Incident::TransformFailed,
                    format_args!("nvstack: size-triggered transform failed: {e}"),
                );
            }
        }
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
