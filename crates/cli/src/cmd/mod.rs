//! One module per subcommand; each exposes its clap arguments and a `run`.

pub mod check;
pub mod control;
pub mod daemon;
pub mod demo;
pub mod flush;
pub mod format;
pub mod inspect;
pub mod logs;
pub mod mount;
pub mod mount_helper;
pub mod placement;
pub mod run;
pub mod rundir;
pub mod stat;
pub mod sync;
pub mod umount;

use std::path::Path;
use std::sync::Arc;

use nvram::{MmapOptions, MmapRegion, OverlayRegion, Region};
use txn::{Consistency, Pool, RecoveryReport};

use crate::error::CliResult;

/// Runs recovery on a copy-on-write view of the region file: what `mount` would do, without
/// writing a byte. Returns the pool (over the view) and the report.
pub fn dry_open(path: &Path) -> CliResult<(Pool, RecoveryReport)> {
    let file = MmapRegion::open(path, MmapOptions { read_only: true, ..MmapOptions::default() })?;
    let region: Arc<dyn Region> = Arc::new(OverlayRegion::new(file));
    Ok(Pool::open(region, Consistency::Undo)?)
}

/// A block-cache scan error as a CLI error: damage keeps its area (exit 4).
pub fn block_cache_error(e: device::nvcache::NvCacheError) -> crate::error::CliError {
    match e {
        device::nvcache::NvCacheError::Region(r) => crate::error::CliError::Region(r),
        other => crate::error::CliError::Other(other.to_string()),
    }
}

/// ", LBN a..=b; by class: c n, ..." for a non-empty block cache, "" otherwise.
pub fn block_cache_summary(b: &device::nvcache::Scan) -> String {
    let (Some(first), Some(last)) = (b.sectors.first(), b.sectors.last()) else {
        return String::new();
    };
    let classes: Vec<String> = b.by_class().iter().map(|(c, n)| format!("{c} {n}")).collect();
    format!(", LBN {}..={}; by class: {}", first.lbn, last.lbn, classes.join(", "))
}
