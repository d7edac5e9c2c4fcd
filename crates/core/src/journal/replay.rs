//! Recovery of the metadata journal: before the engine serves, every record left in the
//! region (not yet checkpointed) is redone on the lower file system, in sequence order, then
//! one checkpoint makes the result durable and frees the records.
//!
//! The lower file system after a crash holds some prefix of the applied changes (assumption
//! K2, design.md section 8: a journaling file system commits its metadata in order), at
//! least up to the last checkpoint. A record is therefore redone only when its effect is
//! missing, judged by the objects' handles (which never name another object):
//! - a creation (create, mknod, mkdir, symlink) is there when its object exists anywhere
//!   (`find_object`); otherwise it is made again at a hidden name, with a new handle, which
//!   the creating record notes in `other` (**M5**, before the object moves to its name; a
//!   note longer than the room the record kept moves the record, `note_remade`); later
//!   records are redone with old handles resolved through these notes, not rewritten. After
//!   the last record one `syncfs` makes every object made again durable, and only then do the
//!   records that outlive the journal (temp-file, directory-times, cached-file) name the new
//!   handles (**M4**: the region never names an object the lower file system cannot find
//!   again);
//! - a link is there when the name holds the object; a removal, when the name does not hold
//!   the object; a rename, when the source name does not hold the moved object;
//! - attribute changes are set again (idempotent: later records set later values).
//!
//! If an interrupted replay made an object already, its name is taken by it: it is adopted.
//! A record that cannot be redone (a directory the lower file system lost although the
//! records say it exists) refuses the mount, naming the record: never a guess.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::Ordering;

use lower::{Creds, Errno, LowerFs, SetAttr, TimeSet};
use txn::TxError;

use super::Journal;
use super::record::{self, Op, Place, Redo};
use crate::base::OpTx;
use crate::base::counters::Counters;
use crate::base::error::StartError;
use crate::base::error::{FsError, FsResult};
use crate::base::optx::rewrite;
use crate::base::{Base, Committed};

impl Journal {
    /// See the module docs. Runs first at start, before the overlay and the page cache are
    /// rebuilt from records that may name recreated objects. Returns the objects made again (old handle -> new handle), durable in the lower file
    /// system: the records of the other mechanisms that name them are re-keyed next (M4).
    pub(crate) fn replay<L: LowerFs>(
        &self,
        b: &Base<L>,
        marker: u64,
    ) -> Result<HashMap<Vec<u8>, Vec<u8>>, StartError> {
        let scan = record::scan_frames(&b.pool)?;
        let found = scan.records;
        let next = found.last().map_or(1, |f| f.redo.seq + 1).max(marker + 1);
        self.next_seq.store(next, Ordering::Relaxed);
        if scan.frames.is_empty() {
            return Ok(HashMap::new());
        }
        let records: Vec<(Place, Redo)> = found.into_iter().map(|f| (f.place, f.redo)).collect();
        {
            // The journal's view of its frames first: every frame is listed (one found empty
            // too: the recovery checkpoint frees it), every record takes its slots (J2: the
            // rest are zero), so a record `note_remade` moves is placed as any new record is.
            let mut pending = self.pending.lock();
            for &frame in &scan.frames {
                pending.add_frame(frame);
            }
            for (place, redo) in &records {
                pending.records.insert(redo.seq, *place);
                pending.take(*place);
            }
        }
        // Objects made again by this replay or an interrupted one: the record that created the
        // object names its old handle in `object` and the one it was made again with in
        // `other` (unused by creations otherwise). Records are redone with handles resolved
        // through this map instead of being rewritten: a directory made again may be named by
        // thousands of records.
        // W1: the records replayed are committed state; one proof covers them until a note
        // (M5) is written, after which it is taken again.
        let mut w1 = b.committed();
        let mut remade: HashMap<Vec<u8>, Vec<u8>> = records
            .iter()
            .filter(|(_, r)| record::is_creation(r.op()) && !r.other.is_empty())
            .map(|(_, r)| (r.object.clone(), r.other.clone()))
            .collect();
        for (place, redo) in &records {
            if redo.seq <= marker {
                continue; // M3: the lower file system has it
            }
            let fail =
                |error: FsError| StartError::Replay { seq: redo.seq, frame: place.frame.0, error };
            let resolved = resolve(redo, &remade);
            if let Some(new) = Self::redo(b, &w1, &resolved).map_err(fail)? {
                // M5: the region names the object made again before it moves to its name, so
                // a crash after that finds it (or makes it again if the lower file system lost
                // it) instead of making a second one.
                self.note_remade(b, *place, redo, &new).map_err(fail)?;
                // W1 (journal mode): that note is durable before the rename.
                w1 = b.committed();
                b.fail("replay.remade");
                remade.insert(redo.object.clone(), new);
                let resolved = resolve(redo, &remade);
                let parent = b.lower.find_object(&resolved.dir1, b.max_walk);
                let parent = parent.map_err(|e| fail(e.into()))?;
                let hidden = crate::base::hidden::replay_name(redo.seq);
                Self::place(b, &w1, &resolved, &parent, &hidden).map_err(fail)?;
            }
            b.lower
                .setxattr(
                    &w1,
                    b.lower.root(),
                    OsStr::new(super::MARKER),
                    &redo.seq.to_le_bytes(),
                    0,
                )
                .map_err(|e| fail(e.into()))?;
            b.fail("replay.applied");
            Counters::add(&self.counters.replayed_at_mount, 1);
        }
        if !remade.is_empty() {
            // M4: every object made again is durable before a record that outlives the
            // journal (temp file, directory times, cached file) names it; the engine re-keys
            // those records (`engine/start.rs`), then checkpoints.
            let settle = |error: FsError| StartError::Replay { seq: 0, frame: 0, error };
            b.syncfs_lower().map_err(settle)?;
        }
        Ok(remade)
    }

    /// Redoes one record if its effect is missing; for an object made again (still at its
    /// hidden name) its new handle.
    fn redo<L: LowerFs>(b: &Base<L>, w1: &Committed, r: &Redo) -> FsResult<Option<Vec<u8>>> {
        let exists = |h: &[u8]| b.lower.find_object(h, b.max_walk);
        let holds = |dir: &L::Node, name: &OsStr, h: &[u8]| {
            b.lower
                .lookup(dir, name)
                .ok()
                .is_some_and(|(n, _)| b.lower.file_handle(&n).is_ok_and(|x| x == h))
        };
        match r.op() {
            Op::Create | Op::Mknod | Op::Mkdir | Op::Symlink => {
                let parent = exists(&r.dir1)?;
                let hidden = crate::base::hidden::replay_name(r.seq);
                if holds(&parent, &hidden, &r.object) {
                    // Made and renamed in the record by an interrupted replay: place it.
                    Self::place(b, w1, r, &parent, &hidden)?;
                    return Ok(None);
                }
                if exists(&r.object).is_ok() {
                    return Ok(None);
                }
                return Self::recreate(b, w1, r, &parent, &hidden).map(Some);
            }
            Op::Link => {
                let parent = exists(&r.dir1)?;
                if !holds(&parent, r.name1(), &r.object)
                    && let Ok(node) = exists(&r.object)
                {
                    match b.lower.link(w1, &node, &parent, r.name1()) {
                        // Taken: under the prefix assumption the name was free until the link
                        // was done, so it was done and the name has gone to another object.
                        Ok(_) | Err(Errno(libc::EEXIST)) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
            }
            Op::Unlink | Op::Rmdir => {
                let parent = exists(&r.dir1)?;
                if holds(&parent, r.name1(), &r.object) {
                    if r.op() == Op::Rmdir {
                        b.lower.rmdir(w1, &parent, r.name1())?;
                    } else {
                        b.lower.unlink(w1, &parent, r.name1())?;
                    }
                }
            }
            Op::Rename => {
                let (from, to) = (exists(&r.dir1)?, exists(&r.dir2)?);
                if holds(&from, r.name1(), &r.object) {
                    let flags = u32::from(r.flags) & libc::RENAME_EXCHANGE;
                    b.lower.rename(w1, &from, r.name1(), &to, r.name2(), flags)?;
                }
            }
            Op::Setattr => {
                if let Ok(node) = exists(&r.object) {
                    b.lower.setattr(w1, &node, None, &attributes(r))?;
                }
            }
            Op::Setxattr => {
                if let Ok(node) = exists(&r.object) {
                    b.lower.setxattr(w1, &node, r.name2(), &r.payload, 0)?;
                }
            }
            Op::Removexattr => {
                if let Ok(node) = exists(&r.object) {
                    match b.lower.removexattr(w1, &node, r.name2()) {
                        Ok(()) | Err(Errno(libc::ENODATA)) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
            }
        }
        Ok(None)
    }

    /// Makes a created object again as its record says (owner, mode), at the hidden name
    /// `hidden` (an interrupted replay's object there is adopted: the name is ours); the
    /// caller notes its handle in the record (M5), then `place` moves it to its name. Returns
    /// the new handle.
    fn recreate<L: LowerFs>(
        b: &Base<L>,
        w1: &Committed,
        r: &Redo,
        parent: &L::Node,
        hidden: &OsStr,
    ) -> FsResult<Vec<u8>> {
        let creds = Creds { uid: r.uid, gid: r.gid, groups: Vec::new() };
        let perm = r.mode & 0o7777;
        let made = match r.op() {
            Op::Create => b
                .lower
                .create(w1, &creds, parent, hidden, perm, libc::O_RDWR)
                .map(|(node, _, _)| node),
            Op::Mknod => {
                b.lower.mknod(w1, &creds, parent, hidden, r.mode, r.rdev).map(|(node, _)| node)
            }
            Op::Mkdir => b.lower.mkdir(w1, &creds, parent, hidden, perm).map(|(node, _)| node),
            _ => {
                let target = OsStr::from_bytes(&r.payload);
                b.lower.symlink(w1, &creds, parent, hidden, target).map(|(node, _)| node)
            }
        };
        let node = match made {
            Ok(node) => node,
            Err(Errno(libc::EEXIST)) => b.lower.lookup(parent, hidden)?.0,
            Err(e) => return Err(e.into()),
        };
        if r.op() != Op::Symlink {
            // The creator's owner and mode exactly (umask and setgid inheritance applied the
            // first time are in the recorded values).
            let set = SetAttr {
                mode: Some(perm),
                uid: Some(r.uid),
                gid: Some(r.gid),
                ..SetAttr::default()
            };
            match b.lower.setattr(w1, &node, None, &set) {
                Ok(_) | Err(Errno(libc::EPERM)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(b.lower.file_handle(&node)?)
    }

    /// Moves a recreated object from its hidden name to its name. A name taken means the
    /// creation was done and superseded (under the prefix assumption the name was free until
    /// then): the recreated object goes again.
    fn place<L: LowerFs>(
        b: &Base<L>,
        w1: &Committed,
        r: &Redo,
        parent: &L::Node,
        hidden: &OsStr,
    ) -> FsResult<()> {
        match b.lower.rename(w1, parent, hidden, parent, r.name1(), libc::RENAME_NOREPLACE) {
            Ok(()) => Ok(()),
            Err(Errno(libc::EEXIST)) => {
                if r.op() == Op::Mkdir {
                    b.lower.rmdir(w1, parent, hidden)?;
                } else {
                    b.lower.unlink(w1, parent, hidden)?;
                }
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Stores the handle an object was made again with in the record that created it (M5).
    /// Nearly always in the record's own slots (a creation keeps room for a handle as long as
    /// its own, `Redo::slots`); a longer handle moves the record, with its sequence, to free
    /// slots found as for any new record (`Pending::find_room`, else a new frame): one
    /// transaction writes it there and zeroes its old slots (M6), so the region holds it in
    /// exactly one place whether the move commits or not, and the journal's view follows.
    /// A frame left without records is freed by the recovery checkpoint.
    fn note_remade<L: LowerFs>(
        &self,
        b: &Base<L>,
        place: Place,
        redo: &Redo,
        new: &[u8],
    ) -> FsResult<()> {
        let pool = &b.pool;
        let off = record::slot_offset(pool, place.frame, place.slot);
        let before = redo.encode_in(place.slots);
        let noted = Redo { other: new.to_vec(), ..redo.clone() };
        if noted.slots() <= place.slots {
            let after = noted.encode_in(place.slots);
            return b.atomically(|tx| rewrite(tx, off, &before, &after));
        }
        // As `journaled_removal`: the transaction first, then the journal's lock.
        let mut otx = OpTx::new(pool);
        otx.tx();
        let mut pending = self.pending.lock();
        let room = pending.find_room(noted.slots());
        let written = (|| -> Result<Place, TxError> {
            let tx = otx.tx();
            let to = super::put_record(tx, pool, room, &noted)?;
            tx.update(off, &vec![0; before.len()])?;
            Ok(to)
        })();
        let to = otx.end(written.map_err(FsError::from))?;
        pending.release(place);
        pending.placed(to, room);
        pending.records.insert(redo.seq, to);
        Counters::add(&self.counters.notes_moved, 1);
        Ok(())
    }
}

/// The record with every handle of an object made again replaced by its new one (a creation
/// keeps its note in `other`; its `object` resolves like any handle).
fn resolve(r: &Redo, remade: &HashMap<Vec<u8>, Vec<u8>>) -> Redo {
    let mut r = r.clone();
    let creation = record::is_creation(r.op());
    for h in [&mut r.dir1, &mut r.dir2, &mut r.object] {
        if let Some(new) = remade.get(h.as_slice()) {
            h.clone_from(new);
        }
    }
    if !creation && let Some(new) = remade.get(r.other.as_slice()) {
        r.other.clone_from(new);
    }
    r
}

/// The attributes a `Setattr` record sets, as explicit values.
fn attributes(r: &Redo) -> SetAttr {
    let has = |bit| r.flags & bit != 0;
    SetAttr {
        mode: has(record::SET_MODE).then_some(r.mode & 0o7777),
        uid: has(record::SET_UID).then_some(r.uid),
        gid: has(record::SET_GID).then_some(r.gid),
        atime: has(record::SET_ATIME).then_some(TimeSet::At(r.atime.0, r.atime.1)),
        mtime: has(record::SET_MTIME).then_some(TimeSet::At(r.mtime.0, r.mtime.1)),
        ..SetAttr::default()
    }
}
