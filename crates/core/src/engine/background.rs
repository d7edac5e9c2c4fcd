//! What the daemon's threads and tools call between requests: the page cache's write-back and
//! fetches, TempFFS's background transforms and flush, the bells its sleeping threads wait on, and the consistency checks of the tests.
//! Each is the mechanism's own, reached through the engine that holds it and the base.

use lower::LowerFs;

use super::Engine;
use crate::base::error::{FsError, FsResult};
use crate::base::sync::Bell;
use crate::cache::Reason;
use crate::tempfs::Trigger;

impl<L: LowerFs> Engine<L> {
    /// Writes back every dirty page (`nvstack flush`, unmount); returns the pages written and
    /// the first error (`progress(done, total)` after each batch).
    pub fn flush_cache(
        &self,
        reason: Reason,
        progress: &mut dyn FnMut(u64, u64),
    ) -> (u64, Option<FsError>) {
        self.cache.flush_cache(&self.base, reason, progress)
    }

    /// Writes back the pages dirty for longer than `--max-dirty-age`; returns how many.
    pub fn writeback_aged(&self) -> FsResult<u64> {
        self.cache.writeback_aged(&self.base)
    }

    /// `--writeback-background`: the daemon's write-back thread calls this in a loop
    /// (`cache/writeback.rs`); returns the pages written.
    pub fn writeback_in_background(&self) -> u64 {
        self.cache.writeback_in_background(&self.base)
    }

    /// Rung when a write leaves the cache above its high watermark (background write-back).
    pub fn writer_bell(&self) -> &Bell {
        self.cache.writer_bell()
    }

    /// Rung when a patched page is queued for the `async-bg` fetcher.
    pub fn fetcher_bell(&self) -> &Bell {
        self.cache.fetcher_bell()
    }

    /// `async-fg`: the serving thread fetches the queued patches after it answered a write.
    pub fn after_write_answered(&self) {
        self.cache.after_write_answered(&self.base);
    }

    /// Fetches and merges up to `max` queued patched pages; returns how many were merged.
    pub fn fetch_patches(&self, max: usize) -> usize {
        self.cache.fetch_patches(&self.base, max)
    }

    /// Patched pages waiting for an asynchronous fetch.
    pub fn fetches_queued(&self) -> usize {
        self.cache.fetches_queued()
    }

    /// Checks the page cache's volatile mirror against itself (debug builds; no operation may
    /// run). Returns the pages whose lower space it holds reserved.
    #[cfg(debug_assertions)]
    pub fn check_cache(&self) -> Result<u64, String> {
        self.cache.check_cache()
    }

    /// Every mechanism's invariants and the one between them (debug builds; no operation may
    /// run): the lower-FS space reserved for NVRAM data is the temp files' pages plus the
    /// cached pages with no lower block (`space.rs`: ENOSPC at write time counts on it).
    #[cfg(debug_assertions)]
    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        let unmapped = self.cache.check_cache()?;
        let temp_pages = self.temp.check()?;
        let reserved = self.base.space.pages();
        if reserved != temp_pages + unmapped {
            return Err(format!(
                "{reserved} pages reserved, temp files hold {temp_pages}, cached pages without \
                 a lower block {unmapped}"
            ));
        }
        Ok(())
    }

    /// `--tempfile-background`: the daemon's transformer thread calls this in a loop
    /// (`tempfs/transform.rs`); returns the files transformed.
    pub fn transform_in_background(&self) -> u64 {
        self.temp.transform_in_background(&self.base)
    }

    /// `nvstack flush`: transforms every temp file, then settles pending directory times.
    pub fn flush_tempfiles(&self, progress: &mut dyn FnMut(u64, u64)) -> (u64, Option<FsError>) {
        self.temp.flush_tempfiles(&self.base, progress)
    }

    /// Transforms temp file `f` into a lower file now (tests, tools; `tempfs/transform.rs`).
    pub fn transform(
        &self,
        f: &std::sync::Arc<crate::tempfs::TempFile>,
        trigger: Trigger,
    ) -> FsResult<()> {
        self.temp.transform(&self.base, f, trigger)
    }

    /// Settles pending directory times into the lower directories; returns the records freed.
    pub fn settle_dir_times(&self) -> FsResult<u64> {
        self.temp.settle_dir_times(&self.base)
    }
}
