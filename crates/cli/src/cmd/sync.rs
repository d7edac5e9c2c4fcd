//! `nvstack sync MOUNTPOINT`: the `sync(1)` of one mount. The kernel never sends a FUSE daemon
//! `syncfs(2)` (it sends FUSE_SYNCFS only on virtiofs connections: design.md 13.7), so this is
//! how a script or an operator makes every operation that returned before it durable - journal
//! mode's open group committed, and whatever reached the lower file system outside NVRAM
//! (passthrough files' writes, write-through data, unjournaled changes) synced there.

use std::path::PathBuf;

use super::control;
use crate::error::CliResult;

#[derive(Debug, clap::Args)]
pub struct SyncArgs {
    /// The mount point of a running nvstack mount (root or the user who mounted it).
    pub mountpoint: PathBuf,
}

pub fn run(args: &SyncArgs) -> CliResult {
    control::ask(&args.mountpoint, "sync").map(drop)
}
