//! Shared by the mount tests.

use std::path::Path;

/// Removes the run directory (`/run/nvstack/mounts/<xxh3 of the canonical mount point>`, see
/// `cmd/rundir.rs`) a test mount left: its daemon log, and after a kill its socket and pid
/// file. Tests mount on fresh temporary directories, so nothing else would ever remove it.
/// With `NVSTACK_KEEP_LOGS=<dir>` the daemon log is copied there first (`<id>.log`).
pub fn remove_run_dir(mountpoint: &Path) {
    let Ok(canonical) = std::fs::canonicalize(mountpoint) else { return };
    let id = xxhash_rust::xxh3::xxh3_64(canonical.as_os_str().as_encoded_bytes());
    let dir = Path::new("/run/nvstack/mounts").join(format!("{id:016x}"));
    if let Some(keep) = std::env::var_os("NVSTACK_KEEP_LOGS") {
        let _ =
            std::fs::copy(dir.join("daemon.log"), Path::new(&keep).join(format!("{id:016x}.log")));
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// True (and the test returns early) when not root or without /dev/fuse; under CI that is an
/// error: CI must run `what`.
pub fn skip(what: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if root && Path::new("/dev/fuse").exists() {
        return false;
    }
    assert!(std::env::var_os("CI").is_none(), "CI must run {what} (root and /dev/fuse)");
    eprintln!("SKIP: needs root and /dev/fuse");
    true
}
