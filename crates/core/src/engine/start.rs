//! An engine's life: start over a recovered region (rebuild the volatile mirrors, finish
//! what a crash interrupted) and shut down (transform, write back, mark the region clean).
//!
//! Start, in order: the temp-file overlay from the temp-file records (`tempfs/recovery.rs`:
//! unlinked-open files freed, interrupted transforms finished), then the page cache from the
//! cached-file records (`cache/recovery.rs`: files found again by handle), then the mount's
//! choices (tempfiles off: every temp file transformed; cache off: every page written back).

use std::collections::HashMap;
use std::sync::Arc;

use lower::{Errno, LowerFs};
use txn::{Pool, TxError};

use super::{Engine, EngineConfig};
use crate::base::Base;
use crate::base::error::{FsError, FsResult, StartError};
use crate::base::handles::HandleTable;
use crate::base::incidents::{Incident, Incidents};
use crate::base::inodes::{Identity, InodeTable};
use crate::base::optx::rewrite;
use crate::cache::{PageCache, Reason};
use crate::journal::Journal;
use crate::journal::checkpoint::Why;
use crate::tempfs::names::Obj;
use crate::tempfs::{TempFs, Trigger};

impl<L: LowerFs> Engine<L> {
    /// Starts an engine over a recovered region: rebuilds the temp-file overlay, frees temp
    /// files that were unlinked while open, finishes interrupted transforms, and with
    /// tempfiles off moves every temp file to the lower file system.
    pub fn new(lower: L, pool: Pool, config: EngineConfig) -> Result<Engine<L>, StartError> {
        // Every frame is of a kind some room reads (`base/frames.rs`): a region of another
        // kind, or damage, is refused before anything reads or changes it.
        crate::base::frames::check_known(&pool)?;
        let policy = crate::cache::policy::by_name(config.cache.policy.name())
            .expect("an implementation for every write-back policy");
        // The knobs that depend on the region, resolved against its frames once.
        let frames = pool.stats().frames_total;
        let cache_limits = config.cache.limits(frames);
        if cache_limits.low_pages > cache_limits.high_pages {
            return Err(StartError::Config(format!(
                "the low watermark ({} pages) is above the high one ({} pages)",
                cache_limits.low_pages, cache_limits.high_pages
            )));
        }
        let temp_limits = config.temp.limits(frames);
        let spare = config.fsync_requests == crate::base::durability::FsyncRequests::Spare;
        if spare && pool.consistency() != txn::Consistency::Undo {
            // Journal mode's group commit is the work of an fsync; without an undo log an
            // operation cut by a crash is not atomic, so none may claim durability by itself.
            return Err(StartError::Config(format!(
                "--fsync-requests spare needs --consistency undo (this mount is {}): in journal \
                 mode an fsync commits the group, so the kernel must send it",
                format!("{:?}", pool.consistency()).to_lowercase()
            )));
        }
        if config.direct_logs.is_some() && pool.consistency() != txn::Consistency::Undo {
            // The library acknowledges a write when its record is durable and the merge
            // makes it part of the file before the log goes: only undo mode's merges are
            // durable when they return.
            return Err(StartError::Config(format!(
                "--direct-path on needs --consistency undo (this mount is {})",
                format!("{:?}", pool.consistency()).to_lowercase()
            )));
        }
        // The root node is borrowed from the adapter; the table holds its own reference by
        // looking the root up again ("." of the root).
        let root_key = lower.key(lower.root());
        // The journal names objects by file handle; without handles, changes are synced in
        // the lower file system instead.
        let marker = crate::journal::read_marker(&lower);
        let journal_on = pool.consistency() != txn::Consistency::None
            && lower.file_handle(lower.root()).is_ok_and(|h| !h.is_empty())
            && marker.is_some();
        let (root, _) =
            lower.lookup(lower.root(), std::ffi::OsStr::new(".")).map_err(StartError::Lower)?;
        let engine = Engine {
            journal: Journal::new(journal_on, config.journal, frames),
            temp: TempFs::new(
                config.temp,
                temp_limits,
                InodeTable::new(Obj::Lower(Arc::new(root)), Identity::lower(root_key)),
                HandleTable::new(config.max_handles),
            ),
            cache: PageCache::new(config.cache, cache_limits, policy),
            xattrs: config.xattrs,
            routes: crate::route::Routes::new(config.passthrough && !spare),
            direct: crate::direct::Delegations::new(config.direct_logs),
            base: Base::new(lower, pool, config.failpoints, config.max_walk, config.fsync_requests),
        };
        // First: records of the other subsystems may name objects replay makes again.
        let remade = engine.journal.replay(&engine.base, marker.unwrap_or(0))?;
        if !remade.is_empty() {
            let settle = |error: FsError| StartError::Replay { seq: 0, frame: 0, error };
            engine.rekey_refs(&remade).map_err(settle)?;
            engine.base.group_commit();
        }
        engine.journal.checkpoint(&engine.base, Why::Recovery).map_err(StartError::Settle)?;
        engine.temp.rebuild_tempfiles(&engine.base)?;
        engine.temp.rebuild_dir_times(&engine.base)?;
        engine.cache.rebuild_cache(&engine.base)?;
        engine.routes.load(crate::route::profile::scan(&engine.base.pool)?);
        if !engine.temp.config.enabled {
            engine.temp.transform_all(&engine.base, Trigger::Unmount, &mut |_, _| {});
        }
        if !engine.cache.config().enabled
            && let (_, Some(e)) =
                engine.cache.flush_cache(&engine.base, Reason::Unmount, &mut |_, _| {})
        {
            return Err(StartError::Flush(e));
        }
        // E1 (`base/durability.rs`): what reached the lower file system before this start is
        // durable.
        engine.base.syncfs_lower().map_err(StartError::Settle)?;
        Ok(engine)
    }

    /// Ends the engine: temp files are transformed (unless configured to stay in NVRAM),
    /// every open handle is closed, the region is marked clean.
    pub fn shutdown(self) {
        // The library's acknowledged writes first: they are part of the files from now on.
        self.take_back_all();
        #[cfg(debug_assertions)]
        if let Err(why) = self.check_invariants() {
            panic!("invariant broken at shutdown: {why}");
        }
        if self.temp.config.transform_on_unmount {
            self.temp.transform_all(&self.base, Trigger::Unmount, &mut |_, _| {});
        }
        if let Err(e) = self.temp.settle_dir_times(&self.base) {
            self.base.incident(
                Incident::DirTimesFailed,
                format_args!("nvstack: settling pending directory times at unmount failed: {e}"),
            );
        }
        if let Err(e) =
            self.journal.checkpoint(&self.base, crate::journal::checkpoint::Why::Unmount)
        {
            self.base.incident(
                Incident::CheckpointFailed,
                format_args!(
                    "nvstack: journal checkpoint at unmount failed (replayed at mount): {e}"
                ),
            );
        }
        if self.cache.config().writeback_on_unmount
            && let (_, Some(e)) =
                self.cache.flush_cache(&self.base, Reason::Unmount, &mut |_, _| {})
        {
            self.base.incident(
                Incident::WritebackFailed,
                format_args!(
                    "nvstack: write-back at unmount failed (the pages stay in NVRAM): {e}"
                ),
            );
        }
        // The open handles, the nodes and the overlay hold lower descriptors and temp files:
        // gone before the region is marked clean.
        let Engine { base, temp, .. } = self;
        drop(temp);
        base.pool.close();
    }
}

/// Frames re-keyed per transaction at most (see `rekey_refs`; fewer where a transaction
/// cannot hold them).
const REKEY_BATCH: usize = 64;

impl<L: LowerFs> Engine<L> {
    /// M4: every temp-file, directory-times and cached-file record that names an object made
    /// again names its new handle, in transactions of at most `REKEY_BATCH` frames, halved
    /// while one does not fit (an undo slot, journal mode's log credit). Idempotent: a crash
    /// in between leaves some records re-keyed and the map in the journal records, and the
    /// next replay finishes.
    fn rekey_refs(&self, remade: &HashMap<Vec<u8>, Vec<u8>>) -> FsResult<()> {
        let pool = &self.base.pool;
        let incidents = &self.base.incidents;
        let corrupt = |e: nvram::Error| FsError::Answer(corrupt(incidents, &e));
        let mut writes: Vec<(u64, Vec<u8>, Vec<u8>)> = Vec::new();
        let swap = |h: &mut Vec<u8>| match remade.get(h) {
            Some(new) => {
                h.clone_from(new);
                true
            }
            None => false,
        };
        for mut t in crate::tempfs::scan(pool).map_err(corrupt)? {
            let before = t.rec.encode().to_vec();
            if swap(&mut t.rec.dir) {
                writes.push((t.place.offset(pool), before, t.rec.encode().to_vec()));
            }
        }
        for mut t in crate::tempfs::overlay::times::scan(pool).map_err(corrupt)? {
            let before = t.times.encode().to_vec();
            if swap(&mut t.times.handle) {
                writes.push((pool.frame_offset(t.frame), before, t.times.encode().to_vec()));
            }
        }
        for mut c in crate::cache::scan(pool).map_err(corrupt)? {
            let before = c.rec.encode().to_vec();
            if swap(&mut c.rec.handle) {
                writes.push((c.record.offset(pool), before, c.rec.encode().to_vec()));
            }
        }
        let (mut size, mut rest) = (REKEY_BATCH, &writes[..]);
        while !rest.is_empty() {
            let batch = &rest[..size.min(rest.len())];
            let done = self.base.atomically(|tx| {
                batch.iter().try_for_each(|(off, before, after)| rewrite(tx, *off, before, after))
            });
            match done {
                Ok(()) => {
                    rest = &rest[batch.len()..];
                    self.base.fail("replay.rekeyed");
                }
                Err(FsError::Nvram(TxError::UndoFull { .. })) if batch.len() > 1 => {
                    size = batch.len() / 2;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// A damaged record met while rewriting: reported as EIO (the mount then refuses the region
/// through the scan of the subsystem that owns it).
fn corrupt(incidents: &Incidents, e: &nvram::Error) -> Errno {
    incidents.report(
        Incident::RekeyFailed,
        format_args!("nvstack: journal replay, re-keying records: {e}"),
    );
    Errno(libc::EIO)
}
