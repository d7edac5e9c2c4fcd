//! An engine's life: start over a recovered region (rebuild the volatile mirrors, finish
//! what a crash interrupted) and shut down (transform, write back, mark the region clean).
//!
//! Start, in order: the temp-file overlay from the temp-file records (`tempfs/recovery.rs`:
//! unlinked-open files freed, interrupted transforms finished), then the page cache from the
//! cached-file records (`cache/recovery.rs`: files found again by handle), then the mount's
//! choices (tempfiles off: every temp file transformed; cache off: every page written back).

use std::sync::Arc;

use lower::LowerFs;
use txn::{Pool, TxError};

use super::durability::Durability;
use super::space::Space;
use super::{Engine, EngineConfig, Obj};
use crate::cache::{PageCache, Reason};
use crate::error::FsError;
use crate::handles::HandleTable;
use crate::inodes::{Identity, InodeTable};
use crate::journal::Journal;
use crate::lowerfs::Lower;
use crate::overlay::Overlay;
use crate::stats::Counters;
use crate::sync::{Mutex, Rank};
use crate::tempfs::{TempStore, Trigger};

/// Why an engine could not start over its region.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{0}")]
    Region(#[from] nvram::Error),
    #[error(
        "{files} temp file(s) of a lower directory that no longer exists (directory handle {handle}): \
         the lower directory was changed behind nvstack's back"
    )]
    MissingDir { files: usize, handle: String },
    #[error("lower file system: {0}")]
    Lower(lower::Errno),
    #[error("finishing an interrupted transform of temp file {serial}: {error}")]
    Redo { serial: u64, error: FsError },
    #[error(
        "finding the lower file of the cached-file record in {record} by its handle: {error} \
         (its dirty pages are kept; mount as root so that file handles can be opened, or raise \
         the walk limit)"
    )]
    CachedFile { record: String, error: lower::Errno },
    #[error(
        "freeing the dirty pages of a file deleted before the crash (record in {record}): \
         {error}"
    )]
    DropDeleted { record: String, error: FsError },
    #[error("settling pending directory times: {0}")]
    Settle(FsError),
    #[error("freeing record frames that hold no record: {0}")]
    RecordFrames(FsError),
    #[error(
        "replaying metadata-journal record {seq} (frame {frame}) onto the lower file system: \
         {error} (the lower directory was changed behind nvstack's back; the region is left as it is)"
    )]
    Replay { seq: u64, frame: u64, error: FsError },
    #[error("NVRAM: {0}")]
    Nvram(#[from] TxError),
    #[error("{0}")]
    Config(String),
    #[error("writing back the page cache with the cache off: {0}")]
    Flush(FsError),
}

impl<L: LowerFs> Engine<L> {
    /// Starts an engine over a recovered region: rebuilds the temp-file overlay, frees temp
    /// files that were unlinked while open, finishes interrupted transforms, and with
    /// tempfiles off moves every temp file to the lower file system.
    pub fn new(lower: L, pool: Pool, config: EngineConfig) -> Result<Engine<L>, StartError> {
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
            inodes: InodeTable::new(Obj::Lower(Arc::new(root)), Identity::lower(root_key)),
            handles: HandleTable::new(config.max_handles),
            counters: Counters::default(),
            space: Space::default(),
            durability: Durability::default(),
            journal: Journal::new(journal_on, config.journal, frames),
            temp: TempStore::new(config.temp, temp_limits),
            overlay: Mutex::new(Rank::Overlay, Overlay::default()),
            cache: PageCache::new(config.cache, cache_limits, policy),
            root_dev: root_key.0,
            max_walk: config.max_walk,
            failpoints: config.failpoints,
            xattrs: config.xattrs,
            routes: crate::route::Routes::new(config.passthrough),
            lower: Lower::new(lower),
            pool,
        };
        // First: records of the other subsystems may name objects replay makes again.
        engine.replay_journal(marker.unwrap_or(0))?;
        engine.rebuild_tempfiles()?;
        engine.rebuild_dir_times()?;
        engine.rebuild_cache()?;
        engine.routes.load(crate::route::profile::scan(&engine.pool)?);
        if !engine.temp.config.enabled {
            engine.transform_all(Trigger::Unmount, &mut |_, _| {});
        }
        if !engine.cache.config().enabled
            && let (_, Some(e)) = engine.flush_cache(Reason::Unmount, &mut |_, _| {})
        {
            return Err(StartError::Flush(e));
        }
        // D1 (durability.rs): what reached the lower file system before this start is durable.
        engine.syncfs_lower().map_err(StartError::Settle)?;
        Ok(engine)
    }

    /// Ends the engine: temp files are transformed (unless configured to stay in NVRAM),
    /// every open handle is closed, the region is marked clean.
    pub fn shutdown(self) {
        if self.temp.config.transform_on_unmount {
            self.transform_all(Trigger::Unmount, &mut |_, _| {});
        }
        if let Err(e) = self.settle_dir_times() {
            eprintln!("nvstack: settling pending directory times at unmount failed: {e}");
        }
        if let Err(e) = self.checkpoint(crate::journal::checkpoint::Why::Unmount) {
            eprintln!("nvstack: journal checkpoint at unmount failed (replayed at mount): {e}");
        }
        if self.cache.config().writeback_on_unmount
            && let (_, Some(e)) = self.flush_cache(Reason::Unmount, &mut |_, _| {})
        {
            eprintln!("nvstack: write-back at unmount failed (the pages stay in NVRAM): {e}");
        }
        let Engine { pool, inodes, handles, overlay, .. } = self;
        drop(handles);
        drop(inodes);
        drop(overlay);
        pool.close();
    }
}
