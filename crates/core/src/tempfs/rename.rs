//! rename(2) over the merged namespace (rules O1 and O2, design.md section 10): a temp file
//! renamed within NVRAM, onto a lower file (shadowing it), onto another temp file (replace or
//! exchange); a lower object onto a temp name transforms the temp file first.
//!
//! Locking: the overlay is read briefly to learn what the two names are; lower calls (the
//! target's attributes, the directories' handles, the unlink of a shadowed file) happen under
//! the temp files' own locks only; the overlay is taken again, the names checked (a
//! concurrent operation may have moved them: start over), and the NVRAM change committed and
//! mirrored while it is held.

use std::ffi::OsStr;
use std::sync::Arc;

use lower::{FileKind, LowerFs};
use txn::{Tx, TxError};

use crate::base::Base;
use crate::base::OpTx;
use crate::base::counters::Counters;
use crate::base::error::{FsError, FsResult, answer};
use crate::journal::Journal;
use crate::tempfs::TempFs;
use crate::tempfs::overlay::pending::Written;
use crate::tempfs::overlay::{DirKey, Overlay};
use crate::tempfs::{self, Fate, State, TempFile, data};

const NOREPLACE: u32 = libc::RENAME_NOREPLACE;
const EXCHANGE: u32 = libc::RENAME_EXCHANGE;

/// One side of a rename: the lower directory, its key, the name.
type Side<'a, N> = (&'a Arc<N>, DirKey, &'a OsStr);

impl<L: LowerFs> TempFs<L> {
    /// rename(2) over the merged namespace (see O1, O2).
    pub(crate) fn rename_merged(
        &self,
        b: &Base<L>,
        journal: &Journal,
        otx: &mut OpTx<'_>,
        (p, name): (&Arc<L::Node>, &OsStr),
        (np, newname): (&Arc<L::Node>, &OsStr),
        flags: u32,
    ) -> FsResult<()> {
        let (k1, k2) = (b.lower.key(p), b.lower.key(np));
        if tempfs::is_hidden(name) {
            return Err(answer(libc::ENOENT));
        }
        if tempfs::is_hidden(newname) {
            return Err(answer(libc::EPERM));
        }
        if flags & !(NOREPLACE | EXCHANGE) != 0 || flags == NOREPLACE | EXCHANGE {
            return Err(answer(libc::EINVAL));
        }
        loop {
            let (src, dst) = {
                let idx = self.overlay.lock();
                (idx.get(k1, name).cloned(), idx.get(k2, newname).cloned())
            };
            let done = match (src, dst) {
                (None, None) => {
                    Some(self.rename_lower(b, journal, otx, (p, name), (np, newname), flags)?)
                }
                (None, Some(d)) => {
                    // A lower object onto a temp name.
                    let (_, src_attr) = b.lower.lookup(p, name)?;
                    if flags & NOREPLACE != 0 {
                        return Err(answer(libc::EEXIST));
                    }
                    if src_attr.kind() == FileKind::Directory && flags & EXCHANGE == 0 {
                        return Err(answer(libc::ENOTDIR));
                    }
                    self.transform(b, &d, tempfs::Trigger::LowerRename)?; // O2
                    None
                }
                (Some(s), dst) => {
                    let renamed = match &dst {
                        None => self.rename_temp_to_free(
                            b,
                            otx,
                            &s,
                            (p, k1, name),
                            (np, k2, newname),
                            flags,
                        ),
                        Some(d) => self.rename_temp_onto_temp(
                            b,
                            otx,
                            (&s, p, k1, name),
                            (d, np, k2, newname),
                            flags,
                        ),
                    };
                    match renamed {
                        // No frame for the target directory's pending times: the file
                        // leaves NVRAM and the lower file system renames it.
                        Err(FsError::Nvram(TxError::NoFrames)) => {
                            self.transform(b, &s, tempfs::Trigger::NvramFull)?;
                            None
                        }
                        other => other?,
                    }
                }
            };
            if let Some(()) = done {
                return Ok(());
            }
        }
    }

    /// rename of two lower names (neither is a temp file).
    fn rename_lower(
        &self,
        b: &Base<L>,
        journal: &Journal,
        otx: &mut OpTx<'_>,
        (p, name): (&L::Node, &OsStr),
        (np, newname): (&L::Node, &OsStr),
        flags: u32,
    ) -> FsResult<()> {
        // O3: a lower directory holding temp files is not empty.
        if flags & EXCHANGE == 0
            && let Ok((target, attr)) = b.lower.lookup(np, newname)
            && attr.kind() == FileKind::Directory
            && self.overlay.lock().has_entries(b.lower.key(&target))
        {
            let (_, src_attr) = b.lower.lookup(p, name)?;
            if src_attr.kind() == FileKind::Directory {
                return Err(answer(libc::ENOTEMPTY));
            }
        }
        journal.ns_rename(b, otx, (p, name), (np, newname), flags)
    }

    /// rename of a temp file onto a name that is not a temp file (free, or a lower object).
    /// `None`: something changed meanwhile; the caller starts over.
    fn rename_temp_to_free(
        &self,
        b: &Base<L>,
        otx: &mut OpTx<'_>,
        s: &Arc<TempFile>,
        (p, k1, name): Side<'_, L::Node>,
        (np, k2, newname): Side<'_, L::Node>,
        flags: u32,
    ) -> FsResult<Option<()>> {
        let (target, victim_links) = match b.lower.lookup(np, newname) {
            Ok((_, attr)) => (Some(attr.kind()), attr.nlink),
            Err(lower::Errno(libc::ENOENT)) => (None, 0),
            Err(e) => return Err(e.into()),
        };
        if target.is_some() && flags & NOREPLACE != 0 {
            return Err(answer(libc::EEXIST));
        }
        if target.is_none() && flags & EXCHANGE != 0 {
            return Err(answer(libc::ENOENT));
        }
        if target == Some(FileKind::Directory) && flags & EXCHANGE == 0 {
            return Err(answer(libc::EISDIR));
        }
        // O2, and a regular file with other links: shadowing would leave its link
        // count one too high, so the lower rename does it (after a transform).
        if flags & EXCHANGE != 0 || (target == Some(FileKind::Regular) && victim_links > 1) {
            self.transform(b, s, tempfs::Trigger::LowerRename)?;
            return Ok(None);
        }
        if k1 == k2 && name == newname {
            return Ok(Some(()));
        }
        // Temp files stay on the lower root's file system.
        if k2.0 != b.root_dev {
            return Err(answer(libc::EXDEV));
        }
        let handle = self.dir_handle_of(b, k2, np)?;
        if handle.len() > tempfs::record::MAX_HANDLE {
            return Err(answer(libc::EXDEV));
        }
        let mut st = s.wait_stable(s.lock());
        if !st.is_named(k1, name) {
            return Ok(None);
        }
        // Lower calls under the file's own lock (O1: the shadowed file goes first).
        Self::unlink_shadowed(b, p, &st.rec)?;
        let mut idx = self.overlay.lock();
        if idx.get(k2, newname).is_some() {
            return Ok(None); // a temp file took the target meanwhile
        }
        let now = b.lower.now();
        let mut rec = st.rec.clone();
        rec.dir.clone_from(&handle);
        rec.name = newname.to_os_string();
        rec.set_shadows(target.is_some());
        rec.ctime = now;
        let old_handle = st.rec.dir.clone();
        let r = (|| -> FsResult<_> {
            let tx = otx.tx();
            data::put_record(tx, s.place, &rec)?;
            Ok(Self::tx_renamed_dirs(b, tx, &idx, (k1, &old_handle), (k2, &handle), now)?)
        })();
        let times = otx.end(r)?;
        Self::apply_renamed_dirs(&mut idx, (k1, p), (k2, np), times);
        st.rec = rec;
        st.dir = k2;
        idx.remove_name(k1, name);
        idx.insert_name(k2, np, &handle, newname, Arc::clone(s));
        Ok(Some(()))
    }

    /// rename of a temp file onto another temp file (replace or exchange). `None`:
    /// something changed meanwhile; the caller starts over.
    fn rename_temp_onto_temp(
        &self,
        b: &Base<L>,
        otx: &mut OpTx<'_>,
        (src, p, k1, name): (&Arc<TempFile>, &Arc<L::Node>, DirKey, &OsStr),
        (dst, np, k2, newname): (&Arc<TempFile>, &Arc<L::Node>, DirKey, &OsStr),
        flags: u32,
    ) -> FsResult<Option<()>> {
        if Arc::ptr_eq(src, dst) {
            return Ok(Some(()));
        }
        if flags & NOREPLACE != 0 {
            return Err(answer(libc::EEXIST));
        }
        let h1 = self.dir_handle_of(b, k1, p)?;
        let h2 = self.dir_handle_of(b, k2, np)?;
        // Two files: locked in serial order (`TempFile::lock`; the only place two are held).
        let (first, second) = if src.serial < dst.serial { (src, dst) } else { (dst, src) };
        let g1 = first.lock();
        let g2 = second.lock();
        let (mut ss, mut ds) = if src.serial < dst.serial { (g1, g2) } else { (g2, g1) };
        if ss.rec.state == State::Transforming || ds.rec.state == State::Transforming {
            let busy = if ss.rec.state == State::Transforming { src } else { dst };
            drop(ss);
            drop(ds);
            drop(busy.wait_stable(busy.lock()));
            return Ok(None);
        }
        if !ss.is_named(k1, name) || !ds.is_named(k2, newname) {
            return Ok(None);
        }
        let now = b.lower.now();
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
            let mut idx = self.overlay.lock();
            let r = (|| -> FsResult<_> {
                let tx = otx.tx();
                data::put_record(tx, src.place, &rs)?;
                data::put_record(tx, dst.place, &rd)?;
                Ok(Self::tx_renamed_dirs(b, tx, &idx, (k1, &h1), (k2, &h2), now)?)
            })();
            let times = otx.end(r)?;
            Self::apply_renamed_dirs(&mut idx, (k1, p), (k2, np), times);
            ss.rec = rs;
            ds.rec = rd;
            (ss.dir, ds.dir) = (k2, k1);
            idx.remove_name(k1, name);
            idx.remove_name(k2, newname);
            idx.insert_name(k2, np, &h2, newname, Arc::clone(src));
            idx.insert_name(k1, p, &h1, name, Arc::clone(dst));
            return Ok(Some(()));
        }
        // src replaces d: dst loses its name (its shadowed lower file, if any, stays
        // shadowed by src); src leaves its old name (unlinking what it shadowed there).
        let mut rs = ss.rec.clone();
        let inherited = ds.rec.shadows();
        Self::unlink_shadowed(b, p, &ss.rec)?;
        (rs.dir, rs.name) = (h2.clone(), newname.to_os_string());
        rs.set_shadows(inherited);
        rs.ctime = now;
        let mut idx = self.overlay.lock();
        let r = (|| -> FsResult<_> {
            let tx = otx.tx();
            let unnamed = Self::tx_unname(b, tx, dst, &ds)?;
            data::put_record(tx, src.place, &rs)?;
            Ok((unnamed, Self::tx_renamed_dirs(b, tx, &idx, (k1, &h1), (k2, &h2), now)?))
        })();
        let (unnamed, times) = otx.end(r)?;
        Self::apply_renamed_dirs(&mut idx, (k1, p), (k2, np), times);
        self.apply_unname(b, dst, &mut ds, unnamed);
        ss.rec = rs;
        ss.dir = k2;
        idx.remove_name(k2, newname);
        if ds.fate == Fate::Freed {
            idx.temps.remove(&dst.serial);
        }
        idx.remove_name(k1, name);
        idx.insert_name(k2, np, &h2, newname, Arc::clone(src));
        drop(idx);
        Counters::add(&self.counters.deleted_in_nvram, 1);
        Ok(Some(()))
    }

    /// The pending times of both directories of a rename (one when they are the same).
    fn tx_renamed_dirs(
        b: &Base<L>,
        tx: &mut Tx<'_>,
        idx: &Overlay<L::Node>,
        (k1, h1): (DirKey, &[u8]),
        (k2, h2): (DirKey, &[u8]),
        now: (i64, u32),
    ) -> Result<(Written, Option<Written>), TxError> {
        let first = Self::tx_dir_times(b, tx, idx, k1, h1, now)?;
        let second =
            if k1 == k2 { None } else { Some(Self::tx_dir_times(b, tx, idx, k2, h2, now)?) };
        Ok((first, second))
    }

    fn apply_renamed_dirs(
        idx: &mut Overlay<L::Node>,
        (k1, p): (DirKey, &Arc<L::Node>),
        (k2, np): (DirKey, &Arc<L::Node>),
        (first, second): (Written, Option<Written>),
    ) {
        Self::apply_dir_times(idx, k1, p, first);
        if let Some(second) = second {
            Self::apply_dir_times(idx, k2, np, second);
        }
    }
}
