//! The direct path in the engine (docs/direct-path.md): the grant (DG1-DG3), the merge of a
//! delegation log's records, and the take-back (DT1, DT2). The table of delegations and the
//! counters are the `direct/` room's; here they meet the write path.
//!
//! **The merge** applies the records of a log's valid prefix (`direct::scan_area`, which
//! copied each piece into private memory and checked its bounds there) to the delegated file,
//! in order, each as the one FUSE request it stands for - a WRITE or a truncating SETATTR
//! through the holder's open handle, with the same transactions, undo log and NVRAM data path
//! (not counted as requests: the kernel sent none). Crash safety: each record is one
//! operation of the engine, atomic and durable when it returns (undo mode), and re-applying a
//! record is idempotent (an absolute offset, a size), so a crash in the middle of a merge
//! leaves a prefix applied, and merging the whole log again gives the file the log describes
//! (`crates/core/tests/direct_merge.rs`).
//!
//! **Not yet built** (docs/direct-path.md "Steps"): delegation records in the region, so that
//! a daemon killed while a delegation is held merges its log at the next start. Until then a
//! daemon crash loses the writes a library acknowledged since the last merge; the direct path
//! is off unless the mount asks for it (`--direct-path on`).

use std::sync::Arc;

use direct::{Record, RecordKind, control, ioctl::Granted};
use lower::{LowerFs, SetAttr};

use super::Engine;
use crate::base::error::{FsResult, answer};
use crate::base::incidents::Incident;
use crate::base::sync::Rank;
use crate::direct::{Cursor, Delegation, Refusal, TakeBack};
use crate::tempfs::names::Open;

/// What a merge applied.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Merged {
    pub records: u64,
    pub bytes: u64,
}

/// Who asks for a grant (the ioctl's caller, as the kernel names it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

/// What a take-back did, for the front end's kernel notifications.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TakenBack {
    /// The node has no delegation.
    None,
    /// The log was merged; the delegation goes on.
    Kept,
    /// The delegation ended: the kernel's attributes of the node are stale, and so is its size
    /// (the library extended the file without the kernel). `tail` is the file's last byte and
    /// its offset, which the front end stores into the kernel's page cache
    /// (`FUSE_NOTIFY_STORE`) so that the kernel's size is the file's again before anything
    /// uses it (an O_APPEND write takes its offset from it).
    Ended { tail: Option<(u64, u8)> },
}

impl<L: LowerFs> Engine<L> {
    /// Applies `records` to the file open as `fh` (node `node_id`), in order.
    pub fn merge_records(&self, node_id: u64, fh: u64, records: &[Record]) -> FsResult<Merged> {
        let mut merged = Merged::default();
        for r in records {
            match r.kind {
                RecordKind::Write => {
                    let mut done = 0;
                    while done < r.data.len() {
                        // A write may be short (NVRAM pressure moved the file meanwhile): the
                        // rest goes as the next one, as the kernel would send it.
                        let n = self.write_retrying(
                            fh,
                            r.offset + done as u64,
                            &r.data[done..],
                            false,
                        )?;
                        assert!(n > 0, "a write of a non-empty buffer wrote nothing");
                        done += n;
                    }
                    merged.bytes += r.data.len() as u64;
                }
                RecordKind::Truncate => {
                    let set = SetAttr { size: Some(r.offset), ..SetAttr::default() };
                    self.setattr_uncounted(node_id, Some(fh), &set, false)?;
                }
            }
            merged.records += 1;
        }
        Ok(merged)
    }

    /// Whether the direct path is on (`--direct-path on`, undo mode).
    pub fn direct_enabled(&self) -> bool {
        self.direct.enabled() && self.base.pool.consistency() == txn::Consistency::Undo
    }

    /// The kernel cannot mmap direct-IO files (the front end found at init): the direct path is
    /// off for this mount.
    pub fn direct_unavailable(&self) {
        self.direct.disable();
    }

    /// Whether `node_id` is delegated now (one load when nothing is).
    pub fn delegated(&self, node_id: u64) -> bool {
        self.direct.get(node_id).is_some()
    }

    /// Where an O_APPEND write the kernel placed at `offset` goes: the end of the file when
    /// the kernel's size of the node may have missed the library's appends (the kernel takes
    /// an append's offset from its size; nvstack is otherwise the only way the file changes,
    /// so the two agree).
    pub fn append_offset(&self, node_id: u64, offset: u64) -> FsResult<u64> {
        if !self.direct.size_may_be_stale(node_id) {
            return Ok(offset);
        }
        Ok(self.attr_of(node_id)?.size)
    }

    /// The open handle that holds `node_id`'s delegation, if any.
    pub fn delegation_holder(&self, node_id: u64) -> Option<u64> {
        self.direct.get(node_id).map(|d| d.fh)
    }

    /// The grant (docs/direct-path.md, DG1-DG3): delegates the file open as `fh` to the
    /// caller, or refuses with the errno the ioctl answers.
    pub fn grant(&self, node_id: u64, fh: u64, caller: Caller) -> FsResult<Granted> {
        let refuse = |why: Refusal| {
            self.direct.counters.refused(why);
            Err(answer(why.errno()))
        };
        let Some(areas) = self.direct.areas().cloned() else { return refuse(Refusal::Off) };
        if !self.direct_enabled() {
            return refuse(Refusal::Off);
        }
        let h = self.handle(fh)?;
        if h.node_id != node_id {
            return Err(answer(libc::EBADF));
        }
        match &h.file {
            Open::Temp { flags, .. } if super::routing::writable(*flags) => {}
            Open::Lower {
                regular: true,
                direct: false,
                passthrough: false,
                writable: true,
                ..
            } => {}
            Open::Temp { .. }
            | Open::Lower { regular: true, direct: false, passthrough: false, .. } => {
                return refuse(Refusal::ReadOnly);
            }
            _ => return refuse(Refusal::Route),
        }
        if self.routes.opens(node_id) != 1 || self.delegated(node_id) {
            return refuse(Refusal::Busy);
        }
        if self.direct.len() >= crate::direct::MAX_DELEGATIONS {
            return refuse(Refusal::Limit);
        }
        let size = self.attr_of(node_id)?.size;
        let grant = self.direct.next_grant();
        let (path, area) = match areas.create(grant, (caller.uid, caller.gid)) {
            Ok(made) => made,
            Err(e) => {
                self.base.incident(
                    Incident::DirectFailed,
                    format_args!("nvstack: no log area for a delegation: {e}"),
                );
                return refuse(Refusal::Area);
            }
        };
        let header = direct::LogHeader { grant, node: node_id, base: 1 };
        if direct::format(&*area, header).is_err() {
            areas.remove(&path);
            return refuse(Refusal::Area);
        }
        control::resume(&*area, 0);
        let log_len = area.len();
        let d = Arc::new(Delegation {
            grant,
            node: node_id,
            fh,
            path: path.clone(),
            area,
            cursor: crate::base::sync::Mutex::new(
                Rank::Delegation,
                Cursor { end: direct::HEADER_BYTES, next_seq: 1, fsyncs_seen: 0, ended: false },
            ),
        });
        if !self.direct.insert(Arc::clone(&d)) {
            areas.remove(&path);
            return refuse(Refusal::Busy);
        }
        // DG1 again, now that the delegation is in the table: an open that registered since
        // the first look either is counted here or finds the delegation and takes it back.
        if self.routes.opens(node_id) != 1 {
            self.direct.remove(node_id, grant);
            control::end(&*d.area, 0);
            areas.remove(&path);
            return refuse(Refusal::Busy);
        }
        self.direct.counters.granted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(Granted {
            grant,
            node: node_id,
            size,
            first_seq: 1,
            log_len,
            path: path.into_os_string().into_encoded_bytes(),
        })
    }

    /// DT1: before a request on `node_id` is served, every record the library committed is
    /// merged; `why` says whether the delegation goes on ([`TakeBack::keeps`]) or ends.
    pub fn take_back(&self, node_id: u64, why: TakeBack) -> FsResult<TakenBack> {
        let Some(d) = self.direct.get(node_id) else { return Ok(TakenBack::None) };
        let mut cursor = d.cursor.lock();
        if cursor.ended {
            return Ok(TakenBack::None);
        }
        self.direct.counters.taken_back(why);
        let clean = self.merge_log(&d, &mut cursor)?;
        if clean && why.keeps() {
            control::resume(&*d.area, cursor.next_seq - 1);
            return Ok(TakenBack::Kept);
        }
        if !clean {
            self.direct.counters.taken_back(TakeBack::RefusedLog);
        }
        Ok(self.end_delegation(&d, &mut cursor))
    }

    /// The library's `MERGE` ioctl through the holder's open `fh`: the log merged and started
    /// over (the answer: the next sequence number and the file's size); with `end`, the
    /// delegation ended after the merge (before an mmap).
    pub fn merge_asked(
        &self,
        node_id: u64,
        fh: u64,
        grant: u64,
        end: bool,
    ) -> FsResult<(u64, u64, TakenBack)> {
        let Some(d) = self.direct.get(node_id) else { return Err(answer(libc::ENOENT)) };
        if d.grant != grant || d.fh != fh {
            return Err(answer(libc::EPERM));
        }
        let mut cursor = d.cursor.lock();
        if cursor.ended {
            return Err(answer(libc::ENOENT));
        }
        let why = if end { TakeBack::Asked } else { TakeBack::Full };
        self.direct.counters.taken_back(why);
        let clean = self.merge_log(&d, &mut cursor)?;
        let size = self.attr_of(node_id)?.size;
        if clean && !end {
            direct::reset(&*d.area, d.grant, d.node, cursor.next_seq);
            cursor.end = direct::HEADER_BYTES;
            control::resume(&*d.area, cursor.next_seq - 1);
            return Ok((cursor.next_seq, size, TakenBack::Kept));
        }
        if !clean {
            self.direct.counters.taken_back(TakeBack::RefusedLog);
        }
        let next = cursor.next_seq;
        let ended = self.end_delegation(&d, &mut cursor);
        Ok((next, size, ended))
    }

    /// Every delegation taken back (the daemon is stopping).
    pub fn take_back_all(&self) {
        for d in self.direct.all() {
            if let Err(e) = self.take_back(d.node, TakeBack::Unmount) {
                self.base.incident(
                    Incident::DirectFailed,
                    format_args!(
                        "nvstack: taking back delegation {} at unmount failed: {e}",
                        d.grant
                    ),
                );
            }
        }
    }

    /// Recall, copy, validate and merge what the library appended since the last merge; false
    /// when the log failed validation (DT2: its valid prefix merged, nothing after it). A
    /// failing merge write leaves the cursor where it was (the records are merged again next
    /// time: idempotent) and is the request's error.
    fn merge_log(&self, d: &Delegation, cursor: &mut Cursor) -> FsResult<bool> {
        let counters = &self.direct.counters;
        let areas = self.direct.areas().expect("a delegation exists only with log areas");
        let mut waited = 0u64;
        let quiet = control::recall(&*d.area, &mut || match areas.pause(waited) {
            Some(us) => {
                waited += us;
                true
            }
            None => false,
        });
        counters.waited(waited);
        if !quiet {
            // A stopped or hostile process inside an append: what it appends now is not
            // merged, and the library writes it again through the descriptor when it leaves
            // (`direct::control`).
            counters.wait_timeouts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let scan =
            match direct::scan_area(&*d.area, d.grant, d.node, Some((cursor.end, cursor.next_seq)))
            {
                Ok(scan) => scan,
                Err(e) => {
                    self.refused_log(d, &e);
                    return Ok(false);
                }
            };
        let merged = self.merge_records(d.node, d.fh, &scan.records).inspect_err(|e| {
            self.base.incident(
                Incident::DirectFailed,
                format_args!(
                    "nvstack: merging delegation {}'s log failed (kept for the next merge): {e}",
                    d.grant
                ),
            );
        })?;
        cursor.end = scan.end;
        cursor.next_seq = scan.next_seq;
        let relaxed = std::sync::atomic::Ordering::Relaxed;
        if merged.records > 0 {
            counters.merges.fetch_add(1, relaxed);
            counters.records.fetch_add(merged.records, relaxed);
            counters.bytes.fetch_add(merged.bytes, relaxed);
        }
        let fsyncs = control::fsyncs(&*d.area);
        counters.fsyncs.fetch_add(fsyncs.wrapping_sub(cursor.fsyncs_seen).min(1 << 32), relaxed);
        cursor.fsyncs_seen = fsyncs;
        if let Some(damage) = scan.damage {
            self.refused_log(d, &damage);
            return Ok(false);
        }
        Ok(true)
    }

    fn refused_log(&self, d: &Delegation, why: &dyn std::fmt::Debug) {
        self.direct.counters.refused_logs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.base.incident(
            Incident::DirectRefusedLog,
            format_args!(
                "nvstack: the log of delegation {} (node {}) failed validation ({why:?}): its \
                 valid prefix is merged, nothing after it; the delegation is taken back",
                d.grant, d.node
            ),
        );
    }

    /// Ends a delegation (its cursor locked): the library serves nothing more, the area goes.
    fn end_delegation(&self, d: &Delegation, cursor: &mut Cursor) -> TakenBack {
        control::end(&*d.area, cursor.next_seq - 1);
        cursor.ended = true;
        self.direct.remove(d.node, d.grant);
        if let Some(areas) = self.direct.areas() {
            areas.remove(&d.path);
        }
        let size = self.attr_of(d.node).map_or(0, |a| a.size);
        let mut tail = None;
        if size > 0 {
            let _ = self.read_uncounted(d.fh, size - 1, 1, |b| {
                tail = b.first().map(|&byte| (size - 1, byte));
            });
        }
        TakenBack::Ended { tail }
    }

    /// `nvstack stat`'s `direct`.
    pub(crate) fn direct_stats(&self) -> crate::direct::DirectStats {
        self.direct.counters.snapshot(self.direct.len(), self.direct_enabled())
    }
}
