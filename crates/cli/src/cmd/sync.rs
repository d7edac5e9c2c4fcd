//! `nvstack sync MOUNTPOINT`: the `sync(1)` of one mount. The kernel never sends a FUSE daemon
//! `syncfs(2)` (it sends FUSE_SYNCFS only on virtiofs connections: design.md 13.7), so this is
//! how a script or an operator makes every operation that returned before it durable - journal
//! mode's open group committed, and whatever reached the lower file system outside NVRAM
//! (passthrough files' writes, write-through data, unjournaled changes) synced there.

use std::path::PathBuf;

use super::control;
use crate::error::{CliError, CliResult};

#[derive(Debug, clap::Args)]
pub struct SyncArgs {
    /// The mount point of a running nvstack mount (root or the user who mounted it).
    pub mountpoint: PathBuf,
}

pub fn run(args: &SyncArgs) -> CliResult {
    let (mut stream, _) = control::connect(&args.mountpoint)?;
    let reply = control::send(&mut stream, "sync")
        .map_err(|e| CliError::Other(format!("control socket: {e}")))?;
    let value: serde_json::Value = serde_json::from_str(&reply)
        .map_err(|e| CliError::Other(format!("bad reply from the daemon: {e}: {reply}")))?;
    match value.get("error").filter(|e| !e.is_null()) {
        Some(err) => Err(CliError::Other(format!("sync: {}", err.as_str().unwrap_or("?")))),
        None => Ok(()),
    }
}
