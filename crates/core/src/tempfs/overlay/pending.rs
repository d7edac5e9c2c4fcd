//! The engine side of pending directory times (`times.rs`): recorded in the transaction of
//! every temp-file change of a directory, shown over the lower directory's own times,
//! following explicit changes of them, and *settled* into the lower directory.
//!
//! Settling (at mount, `nvstack flush`, unmount, and when more than `MAX_RECORDS` directories
//! without temp files have pending times): (1) for each record, without a lock, the lower
//! directory's mtime is set to the pending one where that is later (a change made in the
//! lower directory since is newer and stays); (2) one `syncfs`; (3) one transaction frees the
//! records of directories that hold no temp file and whose times did not change since (1).
//! A crash before (3) leaves the records, and the next settle writes the same times again.
//! Directories holding temp files keep their record (P3), so that an unlink or rename there
//! never needs a frame.

use std::sync::Arc;

use lower::{Attr, FileKind, LowerFs, SetAttr, TimeSet};
use txn::{FrameId, FrameTag, Tx, TxError};

use super::times::{self, DirTimes, KIND_DIR_TIMES, MAX_RECORDS};
use super::{DirKey, Overlay};
use crate::base::Base;
use crate::base::Incident;
use crate::base::OpTx;
use crate::base::error::StartError;
use crate::base::error::{FsError, FsResult};
use crate::tempfs::TempFs;

/// A record written by a transaction, mirrored into the overlay after its commit.
pub(crate) type Written = (FrameId, DirTimes);

impl<L: LowerFs> TempFs<L> {
    /// In `tx`, with the overlay held until after the commit: the directory `key` changed
    /// `now` through a temp file. The mirror is `apply_dir_times` after the commit.
    pub(crate) fn tx_dir_times(
        b: &Base<L>,
        tx: &mut Tx<'_>,
        idx: &Overlay<L::Node>,
        key: DirKey,
        handle: &[u8],
        now: (i64, u32),
    ) -> Result<Written, TxError> {
        let times = DirTimes { mtime: now, ctime: now, handle: handle.to_vec() };
        Self::tx_put_dir_times(b, tx, idx, key, times)
    }

    /// In `tx`: the directory's record says `times` (written over its record, or a new one).
    fn tx_put_dir_times(
        b: &Base<L>,
        tx: &mut Tx<'_>,
        idx: &Overlay<L::Node>,
        key: DirKey,
        times: DirTimes,
    ) -> Result<Written, TxError> {
        let frame = if let Some(&(frame, _)) = idx.dirs.get(&key).and_then(|d| d.times.as_ref()) {
            tx.update(b.pool.frame_offset(frame), &times.encode())?;
            frame
        } else {
            let frame = tx.alloc_frame(FrameTag { kind: KIND_DIR_TIMES, owner: 0, index: 0 })?;
            tx.write(b.pool.frame_offset(frame), &times.encode());
            frame
        };
        Ok((frame, times))
    }

    /// The mirror of `tx_dir_times`, after the commit (the overlay still held).
    pub(crate) fn apply_dir_times(
        idx: &mut Overlay<L::Node>,
        key: DirKey,
        node: &Arc<L::Node>,
        written: Written,
    ) {
        let handle = written.1.handle.clone();
        idx.dir_entry(key, node, &handle).times = Some(written);
    }

    /// A lower directory's times as the mount shows them: the later of its own and the
    /// pending ones.
    pub(crate) fn dir_times_over(&self, key: DirKey, attr: &mut Attr) {
        if attr.kind() != FileKind::Directory {
            return;
        }
        if let Some((_, t)) = self.overlay.lock().dirs.get(&key).and_then(|d| d.times.as_ref()) {
            attr.mtime = attr.mtime.max(t.mtime);
            attr.ctime = attr.ctime.max(t.ctime);
        }
    }

    /// An explicit change of a directory's times (utimensat) went to the lower directory,
    /// which now has `attr`: pending times follow it, so that the mount shows what was set.
    pub(crate) fn follow_dir_times(
        &self,
        b: &Base<L>,
        otx: &mut OpTx<'_>,
        key: DirKey,
        attr: &Attr,
    ) -> FsResult<()> {
        let mut idx = self.overlay.lock();
        let Some((frame, old)) = idx.dirs.get(&key).and_then(|d| d.times.clone()) else {
            return Ok(());
        };
        let times = DirTimes { mtime: attr.mtime, ctime: attr.ctime, handle: old.handle };
        let written =
            otx.tx().update(b.pool.frame_offset(frame), &times.encode()).map_err(FsError::from);
        otx.end(written)?;
        if let Some(d) = idx.dirs.get_mut(&key) {
            d.times = Some((frame, times));
        }
        Ok(())
    }

    /// Settles pending directory times (see the module docs); returns how many records were
    /// freed.
    pub(crate) fn settle_dir_times(&self, b: &Base<L>) -> FsResult<u64> {
        let pending: Vec<(DirKey, Arc<L::Node>, Written)> = self
            .overlay
            .lock()
            .dirs
            .iter()
            .filter_map(|(&key, d)| d.times.clone().map(|w| (key, Arc::clone(&d.node), w)))
            .collect();
        if pending.is_empty() {
            return Ok(0);
        }
        let w1 = b.committed(); // the times written are committed state
        for (_, node, (_, t)) in &pending {
            match b.lower.getattr(node) {
                // A directory removed since has nothing to keep.
                Ok(a) if a.nlink == 0 => {}
                Ok(a) if t.mtime > a.mtime => {
                    let set = SetAttr {
                        mtime: Some(TimeSet::At(t.mtime.0, t.mtime.1)),
                        ..SetAttr::default()
                    };
                    match b.lower.setattr(&w1, node, None, &set) {
                        Ok(_) | Err(lower::Errno(libc::ENOENT | libc::ESTALE)) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                Ok(_) | Err(lower::Errno(libc::ENOENT | libc::ESTALE)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        b.syncfs_lower()?;
        let mut idx = self.overlay.lock();
        let done: Vec<(DirKey, FrameId)> = pending
            .into_iter()
            .filter(|(key, _, w)| {
                idx.dirs.get(key).is_some_and(|d| d.names.is_empty() && d.times.as_ref() == Some(w))
            })
            .map(|(key, _, (frame, _))| (key, frame))
            .collect();
        if !done.is_empty() {
            b.atomically(|tx| done.iter().try_for_each(|&(_, frame)| tx.free_frame(frame)))?;
        }
        for (key, _) in &done {
            if let Some(d) = idx.dirs.get_mut(key) {
                d.times = None;
                if d.names.is_empty() {
                    idx.dirs.remove(key);
                }
            }
        }
        Ok(done.len() as u64)
    }

    /// Settles when more than `MAX_RECORDS` directories without temp files have pending times
    /// (each costs a frame). Called after operations that can leave such a directory.
    pub(crate) fn settle_if_many(&self, b: &Base<L>) {
        let many = {
            let idx = self.overlay.lock();
            idx.dirs.len() > MAX_RECORDS && idx.times_only() > MAX_RECORDS
        };
        if many && let Err(e) = self.settle_dir_times(b) {
            b.incident(
                Incident::DirTimesFailed,
                format_args!(
                    "nvstack: settling pending directory times failed (they stay in NVRAM): {e}"
                ),
            );
        }
    }

    /// At start, after the temp files: the pending times of the region, attached to their
    /// directories (found by handle; the record of a directory that is gone is freed), a
    /// record made for every directory holding temp files without one (P3: a region written
    /// before pending times existed), then settled.
    pub(crate) fn rebuild_dir_times(&self, b: &Base<L>) -> Result<(), StartError> {
        let found = times::scan(&b.pool)?;
        let mut gone = Vec::new();
        let mut attach = Vec::new();
        for f in found {
            match b.lower.find_dir(&f.times.handle, b.max_walk) {
                Ok(node) => attach.push((Arc::new(node), f)),
                Err(lower::Errno(libc::ENOENT | libc::ESTALE)) => gone.push(f.frame),
                Err(error) => return Err(StartError::Lower(error)),
            }
        }
        if !gone.is_empty() {
            b.atomically(|tx| gone.iter().try_for_each(|&frame| tx.free_frame(frame)))
                .map_err(StartError::Settle)?;
        }
        let mut idx = self.overlay.lock();
        for (node, f) in attach {
            let key = b.lower.key(&node);
            Self::apply_dir_times(&mut idx, key, &node, (f.frame, f.times));
        }
        let missing: Vec<(DirKey, Arc<L::Node>, Vec<u8>)> = idx
            .dirs
            .iter()
            .filter(|(_, d)| d.times.is_none())
            .map(|(&key, d)| (key, Arc::clone(&d.node), d.handle.clone()))
            .collect();
        drop(idx);
        for (key, node, handle) in missing {
            // The directory's own times: nothing changes for the application.
            let attr = b.lower.getattr(&node).map_err(StartError::Lower)?;
            let mut idx = self.overlay.lock();
            let written = b
                .atomically(|tx| {
                    let times = DirTimes { mtime: attr.mtime, ctime: attr.ctime, handle };
                    Self::tx_put_dir_times(b, tx, &idx, key, times)
                })
                .map_err(StartError::Settle)?;
            Self::apply_dir_times(&mut idx, key, &node, written);
        }
        self.settle_dir_times(b).map_err(StartError::Settle)?;
        Ok(())
    }
}
