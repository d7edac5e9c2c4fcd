//! The metadata journal (design.md section 13): namespace and attribute changes of lower
//! objects at NVRAM speed. Every such change the engine makes for an application goes through
//! one of the `ns_*` methods here, which apply it to the lower file system at once (through the
//! `lowerfs` facade: the lower tree stays what readers see) and then record an idempotent
//! *redo record* of it in NVRAM in its own transaction: the change is durable when the record
//! commits, and becomes durable in the lower file system later, at a *checkpoint*
//! (`checkpoint.rs`: one syncfs, then the records are freed), as VM-aware journaling retains
//! committed buffers until their checkpoint. Recovery replays the records after the last
//! checkpoint onto the lower file system before anything else (`replay.rs`).
//!
//! Without the journal (`--consistency none`, a lower file system without file handles, a
//! change too large for a record, or no free frame for it) a change is marked *unsynced*
//! (`base/durability.rs`) instead, so a durability call on what it touched syncs the lower
//! file system.
//!
//! Size changes are not journaled: a truncate of a lower file goes through the page cache (an
//! NVRAM transaction; the lower file is cut by write-back) or, with the cache off, straight to
//! the lower file, marked unsynced like any other data written there. Nor is atime (relatime
//! updates are not made durable by file systems either).
//!
//! Protocol of one journaled change (persistence points in brackets): (0) in journal mode, a
//! group commit (W1, design.md section 12.7: no lower change follows a lost operation); (1)
//! the change is applied to the lower file system; (2) the handles of what it touched are
//! read; (3) one transaction allocates a frame and writes the record [the commit; failpoint
//! `journal.committed` after it]; (4) the record joins the committed list and the marker is
//! set (M3). A crash before (3) commits loses a change whose operation never returned; after
//! it, replay redoes it if the lower file system lost it. In journal mode (3) is durable at
//! the next group commit: a crash before it loses the record, and the change with it unless
//! the lower file system kept it - either way a prefix of the operations.
//!
//! A removal of an object's last name annuls the object's creation record, in its own
//! record's transaction, when no record since the creation names the object (M7, J3:
//! `journaled_removal`): short-lived files take one record, not two, until their checkpoint.

pub mod checkpoint;
mod pending;
pub mod record;
mod replay;

use std::ffi::OsStr;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use lower::{Attr, Creds, LowerFs, SetAttr};
use txn::{FrameId, FrameTag, TxError};

use crate::base::OpTx;
use crate::base::counters::Counters;
use crate::base::error::{FsError, FsResult};
use crate::base::sync::{Mutex, Rank};
use crate::base::{Base, Committed, debug_check};
use pending::Pending;
use record::{FRAME_SIZE, KIND_REDO, Op, Place, Redo, SLOT_SIZE, SLOTS, slot_offset};

/// The lower root's extended attribute holding the sequence of the last applied change (M3);
/// hidden from the mount.
pub const MARKER: &str = "user.nvstack.journal";

/// Reads the marker of the lower root: `Some(sequence)` (0 when never set), `None` when the
/// lower file system cannot hold it (then nothing is journaled).
pub(crate) fn read_marker<L: LowerFs>(lower: &L) -> Option<u64> {
    match lower.getxattr(lower.root(), OsStr::new(MARKER), 64) {
        Ok(v) => Some(v.get(..8).and_then(|b| b.try_into().ok()).map_or(0, u64::from_le_bytes)),
        Err(lower::Errno(libc::ENODATA)) => Some(0),
        Err(_) => None,
    }
}

/// Knobs of the metadata journal, fixed at mount. The default is what `nvstack mount` runs with
/// when no flag is given: the mount's flags take their defaults from it (ext3's 32 MiB and 5 s,
/// as the paper's journal).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JournalConfig {
    /// Checkpoint when the records take this many bytes of NVRAM (`--journal-size`; at most a
    /// quarter of the region: `Journal::new`).
    pub size_max: u64,
    /// Checkpoint when records are this many seconds old (`--checkpoint-interval`; 0: only by
    /// size, at unmount, and when a durability call must reach the lower file system).
    pub interval_secs: u64,
}

impl Default for JournalConfig {
    fn default() -> Self {
        JournalConfig { size_max: 32 << 20, interval_secs: 5 }
    }
}

/// The journal's volatile state.
#[derive(Debug)]
pub struct Journal {
    /// Records are written (the consistency mode keeps NVRAM crash-consistent and the lower
    /// file system has file handles).
    enabled: bool,
    config: JournalConfig,
    /// Frames the journal may hold at most (its size limit, or a quarter of the region).
    frames_max: u64,
    next_seq: AtomicU64,
    /// Committed records not yet checkpointed and the frames they are packed in (rank
    /// `Journal`, after `UndoSlot`: a record is written and committed under it, its
    /// transaction begun before, so records and the volatile view of them change together).
    pending: Mutex<Pending>,
    /// One checkpoint at a time (rank `Checkpoint`: held across its syncfs).
    checkpointing: Mutex<()>,
    /// Lower-clock seconds when the oldest record not yet checkpointed was committed (records
    /// committed while a checkpoint ran count from its start); i64::MAX while none waits.
    oldest_at: AtomicI64,
    counters: JournalCounters,
}

/// Writes `redo` into the free slots `room` of a listed frame (`Pending::find_room`; zero by
/// J2, snapshotted, so a crash before the commit leaves them zero again), else into a new
/// frame, zeros after it (M6; a fresh frame needs no snapshot). Returns where it went; the
/// caller lists it (`Pending::placed`) once the transaction commits.
fn put_record(
    tx: &mut txn::Tx<'_>,
    pool: &txn::Pool,
    room: Option<(FrameId, usize)>,
    redo: &Redo,
) -> Result<Place, TxError> {
    let slots = redo.slots();
    if let Some((frame, slot)) = room {
        tx.update(slot_offset(pool, frame, slot), &redo.encode())?;
        return Ok(Place { frame, slot, slots });
    }
    let frame = tx.alloc_frame(FrameTag { kind: KIND_REDO, owner: 0, index: 0 })?;
    let mut bytes = redo.encode();
    bytes.resize(FRAME_SIZE, 0);
    tx.write(pool.frame_offset(frame), &bytes);
    Ok(Place { frame, slot: 0, slots })
}

#[derive(Debug, Default)]
struct JournalCounters {
    records_total: AtomicU64,
    not_journaled: AtomicU64,
    checkpoints: AtomicU64,
    checkpoint_ms_total: AtomicU64,
    replayed_at_mount: AtomicU64,
    frames_freed: AtomicU64,
    records_zeroed: AtomicU64,
    notes_moved: AtomicU64,
    records_annulled: AtomicU64,
}

/// `nvstack stat --json`: `journal`.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct JournalStats {
    pub enabled: bool,
    /// Records in NVRAM now (committed, not yet checkpointed).
    pub records: u64,
    /// NVRAM they take: the frames they are packed in (4 KiB each, 16 slots of 256 bytes).
    pub bytes: u64,
    /// Those frames.
    pub frames: u64,
    pub records_total: u64,
    /// Changes that could not be journaled (too large, no frame) and were marked unsynced.
    pub not_journaled: u64,
    pub checkpoints: u64,
    pub checkpoint_ms_total: u64,
    pub replayed_at_mount: u64,
    /// Frames checkpoints freed (every record in them checkpointed).
    pub frames_freed: u64,
    /// Records checkpoints freed by zeroing their slots (their frame kept newer records).
    pub records_zeroed: u64,
    /// Creation records replay moved to larger slots, because the handle of the object it
    /// made again was longer than the room the record kept for it (M5; rare).
    pub notes_moved: u64,
    /// Creation records annulled by the removal of their object's last name before a
    /// checkpoint (the removal's record stays; design.md 13.3).
    pub records_annulled: u64,
    /// Stores into write-protected committed NVRAM caught (journal consistency mode).
    pub trapped_writes: u64,
    pub size_max: u64,
    pub interval_secs: u64,
    /// `--consistency journal`: the running group and the group commits (design.md section
    /// 12.8; zero in the other modes).
    pub group: txn::JournalStats,
}

impl Journal {
    pub(crate) fn new(enabled: bool, config: JournalConfig, region_frames: u64) -> Journal {
        let by_size = config.size_max / FRAME_SIZE as u64;
        Journal {
            enabled,
            config,
            frames_max: by_size.min(region_frames / 4).max(1),
            next_seq: AtomicU64::new(1),
            pending: Mutex::new(Rank::Journal, Pending::default()),
            checkpointing: Mutex::new(Rank::Checkpoint, ()),
            oldest_at: AtomicI64::new(i64::MAX),
            counters: JournalCounters::default(),
        }
    }

    /// Committed records not yet checkpointed.
    pub(crate) fn len(&self) -> u64 {
        self.pending.lock().records.len() as u64
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// At the size limit with less than a frame's worth of free slots left to take, or past
    /// it (a record found no run of free slots it needed): the next operation checkpoints.
    pub(crate) fn full(&self) -> bool {
        if !self.enabled {
            return false;
        }
        let pending = self.pending.lock();
        let frames = pending.slots.len() as u64;
        frames > self.frames_max
            || (frames == self.frames_max && pending.slots.free_slots() < SLOTS as u64)
    }

    pub(crate) fn stats(&self, group: txn::JournalStats) -> JournalStats {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let (records, frames) = {
            let pending = self.pending.lock();
            (pending.records.len() as u64, pending.slots.len() as u64)
        };
        JournalStats {
            enabled: self.enabled,
            records,
            bytes: frames * FRAME_SIZE as u64,
            frames,
            records_total: get(&self.counters.records_total),
            not_journaled: get(&self.counters.not_journaled),
            checkpoints: get(&self.counters.checkpoints),
            checkpoint_ms_total: get(&self.counters.checkpoint_ms_total),
            replayed_at_mount: get(&self.counters.replayed_at_mount),
            frames_freed: get(&self.counters.frames_freed),
            records_zeroed: get(&self.counters.records_zeroed),
            notes_moved: get(&self.counters.notes_moved),
            records_annulled: get(&self.counters.records_annulled),
            trapped_writes: group.trapped_writes,
            group,
            size_max: self.config.size_max,
            interval_secs: self.config.interval_secs,
        }
    }
}

impl Journal {
    /// The durable identity of a lower object in records (`LowerFs::file_handle`).
    fn object_handle<L: LowerFs>(b: &Base<L>, node: &L::Node) -> FsResult<Vec<u8>> {
        Ok(b.lower.file_handle(node)?)
    }

    /// Steps 2-4 of the protocol (module docs) for a change already applied to the lower file
    /// system: `build` reads the handles and makes the record; `touched` are the lower objects
    /// it changed, marked unsynced when the change cannot be journaled. The operation must not
    /// have a transaction running (its record commits on its own).
    fn journaled<L: LowerFs>(
        &self,
        b: &Base<L>,
        w1: &Committed,
        otx: &mut OpTx<'_>,
        touched: &[(u64, u64)],
        build: impl FnOnce() -> FsResult<Redo>,
    ) -> FsResult<()> {
        self.journaled_removal(b, w1, otx, touched, false, build)
    }

    /// `journaled`, for a change that may remove the last name of its `object`
    /// (`last_name`: an unlink of a file with one link, an rmdir). Such a removal annuls the
    /// object's creation record when that is still in the journal and no record since names
    /// the object (J3): in one transaction the removal's record is written and the
    /// creation's slots are zeroed. Why that is safe (**M7**): the object does not exist
    /// after the removal, so no prefix of the changes the lower file system may keep
    /// (K2) needs its creation redone - if it kept the creation, the removal's record (which
    /// stays) removes the object again; if not, nothing names it (no record since the
    /// creation names it, and a directory that anything was made in is named by that
    /// record). Short-lived files (Postmark's, a compiler's temporaries) then take one
    /// record instead of two until their checkpoint.
    fn journaled_removal<L: LowerFs>(
        &self,
        b: &Base<L>,
        w1: &Committed,
        otx: &mut OpTx<'_>,
        touched: &[(u64, u64)],
        last_name: bool,
        build: impl FnOnce() -> FsResult<Redo>,
    ) -> FsResult<()> {
        assert!(!otx.is_running(), "a journaled change inside a running transaction");
        // E1; with `--fsync-requests spare` also E2: no fsync of the directory will come, so
        // the lower file system syncs the change now (it has no handle here: all of it).
        let unjournaled = || -> FsResult<()> {
            for &key in touched {
                b.unsynced(key);
            }
            if b.durability.eager() {
                Counters::add(&b.durability.counters.eager_syncs, 1);
                b.syncfs_lower()?;
            }
            Ok(())
        };
        if !self.enabled {
            return unjournaled();
        }
        let mut redo = match build() {
            Ok(redo) if redo.fits() => redo,
            // Too large for a record, or no handle: synced in the lower file system instead.
            _ => {
                Counters::add(&self.counters.not_journaled, 1);
                return unjournaled();
            }
        };
        let slots = redo.slots();
        let pool = &b.pool;
        // The transaction first (beginning may wait for an undo slot), then the journal's lock
        // (short): the record is packed, committed and listed under it, so no other record
        // takes its slots and a checkpoint never sees a frame with a record half written.
        otx.tx();
        let mut pending = self.pending.lock();
        redo.seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        // Free slots of a listed frame, not the annulled record's (they are zeroed below).
        let room = pending.find_room(slots);
        let annul: Option<(u64, Place)> = if last_name {
            let seq = pending.creations.get(&redo.object).copied();
            seq.and_then(|seq| pending.records.get(&seq).map(|&p| (seq, p)))
        } else {
            None
        };
        let written = (|| -> Result<Place, TxError> {
            let tx = otx.tx();
            if let Some((_, p)) = annul {
                // M6: a freed record's slots are zero (snapshotted: a crash before the commit
                // keeps the creation, and the removal is lost with the operation).
                tx.update(slot_offset(pool, p.frame, p.slot), &vec![0u8; p.slots * SLOT_SIZE])?;
            }
            put_record(tx, pool, room, &redo)
        })();
        match written {
            Ok(place) => {
                otx.end(Ok(()))?;
                pending.placed(place, room);
                if pending.records.is_empty() {
                    self.oldest_at.store(b.lower.now().0, Ordering::Relaxed);
                }
                pending.records.insert(redo.seq, place);
                for h in [&redo.dir1, &redo.dir2, &redo.object, &redo.other] {
                    pending.named(h);
                }
                if let Some((seq, p)) = annul {
                    // J1: a frame left with no records is freed by the next checkpoint.
                    pending.records.remove(&seq);
                    pending.gone(seq);
                    pending.release(p);
                    Counters::add(&self.counters.records_annulled, 1);
                }
                if record::is_creation(redo.op()) {
                    pending.creations.insert(redo.object.clone(), redo.seq);
                    pending.created.insert(redo.seq, redo.object.clone());
                }
                debug_check!(pending.check());
                drop(pending);
                Counters::add(&self.counters.records_total, 1);
                b.fail("journal.committed");
                self.mark_applied(b, w1);
            }
            Err(TxError::NoFrames) => {
                let _ = otx.end::<()>(Err(FsError::Nvram(TxError::NoFrames)));
                for h in [&redo.dir1, &redo.dir2, &redo.object, &redo.other] {
                    pending.named(h);
                }
                drop(pending);
                Counters::add(&self.counters.not_journaled, 1);
                unjournaled()?;
            }
            Err(e) => return otx.end(Err(e.into())),
        }
        Ok(())
    }

    /// M3: every change with a sequence up to the marker's value (an extended attribute of
    /// the lower root, `MARKER`) was applied before the marker was set. The lower file
    /// system commits its metadata in order (K2), so after a crash the marker it kept says
    /// which records it has for certain: replay starts after it, and at most the changes
    /// applied since the last marker (one per thread in flight) are judged by state. The
    /// marker carries no NVRAM state of its own, only the fact of the change it follows: the
    /// change's own W1 proof covers it.
    fn mark_applied<L: LowerFs>(&self, b: &Base<L>, w1: &Committed) {
        let upto = self.next_seq.load(Ordering::Relaxed) - 1;
        if let Err(e) =
            b.lower.setxattr(w1, b.lower.root(), OsStr::new(MARKER), &upto.to_le_bytes(), 0)
        {
            // Replay would still be right for the change itself, but could judge more than
            // one change by state: make everything durable now instead.
            b.incident(
                crate::base::Incident::MarkerFailed,
                format_args!("nvstack: setting the journal marker failed ({e}): checkpointing"),
            );
            if let Err(e) = self.checkpoint(b, checkpoint::Why::Sync) {
                b.incident(
                    crate::base::Incident::CheckpointFailed,
                    format_args!("nvstack: journal checkpoint failed: {e}"),
                );
            }
        }
    }

    /// A record naming a new object `node` as `parent/name`.
    fn creation<L: LowerFs>(
        b: &Base<L>,
        op: Op,
        parent: &L::Node,
        name: &OsStr,
        node: &L::Node,
        attr: &Attr,
    ) -> FsResult<Redo> {
        let mut redo = Redo::new(op);
        redo.dir1 = Self::object_handle(b, parent)?;
        redo.name1 = name.to_os_string();
        redo.object = Self::object_handle(b, node)?;
        redo.mode = attr.mode;
        redo.uid = attr.uid;
        redo.gid = attr.gid;
        redo.rdev = attr.rdev;
        Ok(redo)
    }

    pub(crate) fn ns_mknod<L: LowerFs>(
        &self,
        b: &Base<L>,
        otx: &mut OpTx<'_>,
        creds: &Creds,
        (parent, name): (&L::Node, &OsStr),
        mode: u32,
        rdev: u64,
    ) -> FsResult<(L::Node, Attr)> {
        let w1 = b.committed();
        let (node, attr) = b.lower.mknod(&w1, creds, parent, name, mode, rdev)?;
        let touched = [b.lower.key(parent), b.lower.key(&node)];
        self.journaled(b, &w1, otx, &touched, || {
            Self::creation(b, Op::Mknod, parent, name, &node, &attr)
        })?;
        Ok((node, attr))
    }

    pub(crate) fn ns_mkdir<L: LowerFs>(
        &self,
        b: &Base<L>,
        otx: &mut OpTx<'_>,
        creds: &Creds,
        (parent, name): (&L::Node, &OsStr),
        mode: u32,
    ) -> FsResult<(L::Node, Attr)> {
        let w1 = b.committed();
        let (node, attr) = b.lower.mkdir(&w1, creds, parent, name, mode)?;
        let touched = [b.lower.key(parent), b.lower.key(&node)];
        self.journaled(b, &w1, otx, &touched, || {
            Self::creation(b, Op::Mkdir, parent, name, &node, &attr)
        })?;
        Ok((node, attr))
    }

    pub(crate) fn ns_symlink<L: LowerFs>(
        &self,
        b: &Base<L>,
        otx: &mut OpTx<'_>,
        creds: &Creds,
        (parent, name): (&L::Node, &OsStr),
        target: &OsStr,
    ) -> FsResult<(L::Node, Attr)> {
        let w1 = b.committed();
        let (node, attr) = b.lower.symlink(&w1, creds, parent, name, target)?;
        let touched = [b.lower.key(parent), b.lower.key(&node)];
        self.journaled(b, &w1, otx, &touched, || {
            let mut redo = Self::creation(b, Op::Symlink, parent, name, &node, &attr)?;
            redo.payload = std::os::unix::ffi::OsStrExt::as_bytes(target).to_vec();
            Ok(redo)
        })?;
        Ok((node, attr))
    }

    /// Creates and opens a regular file in the lower directory.
    pub(crate) fn ns_create<L: LowerFs>(
        &self,
        b: &Base<L>,
        otx: &mut OpTx<'_>,
        creds: &Creds,
        (parent, name): (&L::Node, &OsStr),
        mode: u32,
        flags: i32,
    ) -> FsResult<(L::Node, Attr, L::File)> {
        let w1 = b.committed();
        let (node, attr, file) = b.lower.create(&w1, creds, parent, name, mode, flags)?;
        let touched = [b.lower.key(parent), b.lower.key(&node)];
        self.journaled(b, &w1, otx, &touched, || {
            Self::creation(b, Op::Create, parent, name, &node, &attr)
        })?;
        Ok((node, attr, file))
    }

    pub(crate) fn ns_link<L: LowerFs>(
        &self,
        b: &Base<L>,
        otx: &mut OpTx<'_>,
        node: &L::Node,
        parent: &L::Node,
        name: &OsStr,
    ) -> FsResult<Attr> {
        let w1 = b.committed();
        let attr = b.lower.link(&w1, node, parent, name)?;
        let touched = [b.lower.key(parent), b.lower.key(node)];
        self.journaled(b, &w1, otx, &touched, || {
            Self::creation(b, Op::Link, parent, name, node, &attr)
        })?;
        Ok(attr)
    }

    /// Removes `parent/name` (`dir`: rmdir); the record names what it was.
    fn ns_remove<L: LowerFs>(
        &self,
        b: &Base<L>,
        otx: &mut OpTx<'_>,
        parent: &L::Node,
        name: &OsStr,
        dir: bool,
    ) -> FsResult<()> {
        // The victim's handle is read first (after the removal it has no name to read it by).
        // Its link count too: only the removal of the last name may annul its creation.
        let (victim, last_name) = if self.enabled {
            match b.lower.lookup(parent, name) {
                Ok((n, attr)) => (Self::object_handle(b, &n).ok(), dir || attr.nlink == 1),
                Err(_) => (None, false),
            }
        } else {
            (None, false)
        };
        let w1 = b.committed();
        if dir {
            b.lower.rmdir(&w1, parent, name)?;
        } else {
            b.lower.unlink(&w1, parent, name)?;
        }
        self.journaled_removal(b, &w1, otx, &[b.lower.key(parent)], last_name, || {
            let mut redo = Redo::new(if dir { Op::Rmdir } else { Op::Unlink });
            redo.dir1 = Self::object_handle(b, parent)?;
            redo.name1 = name.to_os_string();
            redo.object = victim.ok_or(FsError::Answer(lower::Errno(libc::EOPNOTSUPP)))?;
            Ok(redo)
        })
    }

    pub(crate) fn ns_unlink<L: LowerFs>(
        &self,
        b: &Base<L>,
        otx: &mut OpTx<'_>,
        parent: &L::Node,
        name: &OsStr,
    ) -> FsResult<()> {
        self.ns_remove(b, otx, parent, name, false)
    }

    pub(crate) fn ns_rmdir<L: LowerFs>(
        &self,
        b: &Base<L>,
        otx: &mut OpTx<'_>,
        parent: &L::Node,
        name: &OsStr,
    ) -> FsResult<()> {
        self.ns_remove(b, otx, parent, name, true)
    }

    pub(crate) fn ns_rename<L: LowerFs>(
        &self,
        b: &Base<L>,
        otx: &mut OpTx<'_>,
        (parent, name): (&L::Node, &OsStr),
        (newparent, newname): (&L::Node, &OsStr),
        flags: u32,
    ) -> FsResult<()> {
        // What moves (and, for an exchange, what comes back), read before the rename.
        let handle_at = |p: &L::Node, n: &OsStr| {
            b.lower.lookup(p, n).ok().and_then(|(node, _)| Self::object_handle(b, &node).ok())
        };
        let (moved, other) = if self.enabled {
            let other = if flags & libc::RENAME_EXCHANGE != 0 {
                handle_at(newparent, newname)
            } else {
                None
            };
            (handle_at(parent, name), other)
        } else {
            (None, None)
        };
        let w1 = b.committed();
        b.lower.rename(&w1, parent, name, newparent, newname, flags)?;
        let touched = [b.lower.key(parent), b.lower.key(newparent)];
        self.journaled(b, &w1, otx, &touched, || {
            let mut redo = Redo::new(Op::Rename);
            // RENAME_NOREPLACE, RENAME_EXCHANGE, RENAME_WHITEOUT: the low bits.
            redo.flags = u16::try_from(flags & 0xffff).unwrap_or(0);
            redo.dir1 = Self::object_handle(b, parent)?;
            redo.name1 = name.to_os_string();
            redo.dir2 = Self::object_handle(b, newparent)?;
            redo.name2 = newname.to_os_string();
            redo.object = moved.ok_or(FsError::Answer(lower::Errno(libc::EOPNOTSUPP)))?;
            redo.other = other.unwrap_or_default();
            Ok(redo)
        })
    }

    /// mode, owner and times (never the size: see the module docs). The record holds the
    /// values the lower object has afterwards, so that replay sets exactly those.
    pub(crate) fn ns_setattr<L: LowerFs>(
        &self,
        b: &Base<L>,
        otx: &mut OpTx<'_>,
        node: &L::Node,
        file: Option<&L::File>,
        set: &SetAttr,
    ) -> FsResult<Attr> {
        assert!(set.size.is_none(), "size changes are data, not journaled attributes");
        let w1 = b.committed();
        let attr = b.lower.setattr(&w1, node, file, set)?;
        self.journaled(b, &w1, otx, &[b.lower.key(node)], || {
            let mut redo = Redo::new(Op::Setattr);
            redo.object = Self::object_handle(b, node)?;
            let mut mask = 0;
            for (wanted, bit) in [
                (set.mode.is_some(), record::SET_MODE),
                (set.uid.is_some(), record::SET_UID),
                (set.gid.is_some(), record::SET_GID),
                (set.atime.is_some(), record::SET_ATIME),
                (set.mtime.is_some(), record::SET_MTIME),
            ] {
                if wanted {
                    mask |= bit;
                }
            }
            redo.flags = mask;
            (redo.mode, redo.uid, redo.gid) = (attr.mode, attr.uid, attr.gid);
            (redo.atime, redo.mtime) = (attr.atime, attr.mtime);
            Ok(redo)
        })?;
        Ok(attr)
    }

    pub(crate) fn ns_setxattr<L: LowerFs>(
        &self,
        b: &Base<L>,
        otx: &mut OpTx<'_>,
        node: &L::Node,
        name: &OsStr,
        value: &[u8],
        flags: i32,
    ) -> FsResult<()> {
        let w1 = b.committed();
        b.lower.setxattr(&w1, node, name, value, flags)?;
        self.journaled(b, &w1, otx, &[b.lower.key(node)], || {
            let mut redo = Redo::new(Op::Setxattr);
            redo.object = Self::object_handle(b, node)?;
            redo.name2 = name.to_os_string();
            redo.payload = value.to_vec();
            // XATTR_CREATE/XATTR_REPLACE: the lower call above already
            // checked them; replay sets the value whatever it finds.
            redo.flags = u16::try_from(flags).unwrap_or(0);
            Ok(redo)
        })
    }

    pub(crate) fn ns_removexattr<L: LowerFs>(
        &self,
        b: &Base<L>,
        otx: &mut OpTx<'_>,
        node: &L::Node,
        name: &OsStr,
    ) -> FsResult<()> {
        let w1 = b.committed();
        b.lower.removexattr(&w1, node, name)?;
        self.journaled(b, &w1, otx, &[b.lower.key(node)], || {
            let mut redo = Redo::new(Op::Removexattr);
            redo.object = Self::object_handle(b, node)?;
            redo.name2 = name.to_os_string();
            Ok(redo)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn place(frame: u64, slot: usize, slots: usize) -> Place {
        Place { frame: FrameId(frame), slot, slots }
    }

    /// Free slots are taken again (first the open frame's, then another frame's with a run
    /// long enough), and the size limit counts them: at the limit with a frame's worth free
    /// the journal is not full; past it, it is whatever is free.
    #[test]
    fn records_take_freed_slots_and_the_limit_counts_them() {
        let j = Journal::new(true, JournalConfig { size_max: 2 * 4096, interval_secs: 0 }, 64);
        let mut p = j.pending.lock();
        p.add_frame(FrameId(1));
        for slot in 0..SLOTS {
            p.take(place(1, slot, 1));
        }
        assert_eq!(p.find_room(1), None, "frame 1 is full");
        p.add_frame(FrameId(2));
        for slot in (0..SLOTS).step_by(2) {
            p.take(place(2, slot, 1));
        }
        // Frame 2 has every other slot: a 1-slot record fits, a 2-slot one does not.
        assert_eq!(p.find_room(1), Some((FrameId(2), 1)));
        assert_eq!(p.find_room(2), None);
        drop(p);
        assert!(j.full(), "at the limit with 8 free slots, less than a frame's worth");
        let mut p = j.pending.lock();
        for slot in 0..8 {
            p.release(place(1, slot, 1));
        }
        assert_eq!((p.slots.free_slots(), p.records_in(FrameId(1))), (16, 8));
        // Not in the open frame (2): in frame 1, whose first 8 slots are free again.
        assert_eq!(p.find_room(2), Some((FrameId(1), 0)));
        drop(p);
        assert!(!j.full(), "at the limit with a frame's worth free");
        j.pending.lock().add_frame(FrameId(3));
        assert!(j.full(), "past the limit");
        let mut p = j.pending.lock();
        p.drop_frame(FrameId(3));
        p.drop_frame(FrameId(2));
        assert_eq!((p.slots.free_slots(), p.slots.roomy().count(), p.open), (8, 1, None));
    }
}
