//! Shared by the integration tests of this crate; each test crate uses a part of it.

#![allow(dead_code, reason = "every test crate compiles all of it and uses a part")]

use std::path::Path;

#[allow(dead_code, reason = "only the tests that attach a modeled device use it")]
pub mod device;

/// Removes the run directory (`/run/nvstack/mounts/<xxh3 of the canonical mount point>`, see
/// `cmd/rundir.rs`) a test mount left: its daemon log, and after a kill its socket and pid
/// file. Tests mount on fresh temporary directories, so nothing else would ever remove it.
/// With `NVSTACK_KEEP_LOGS=<dir>` the daemon log is copied there first (`<id>.log`).
pub fn remove_run_dir(mountpoint: &Path) {
    let Some(dir) = run_dir(mountpoint) else { return };
    if let Some(keep) = std::env::var_os("NVSTACK_KEEP_LOGS") {
        let name = dir.file_name().expect("an id").to_string_lossy();
        let _ = std::fs::copy(dir.join("daemon.log"), Path::new(&keep).join(format!("{name}.log")));
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// The run directory of a mount on `mountpoint` (which must exist).
pub fn run_dir(mountpoint: &Path) -> Option<std::path::PathBuf> {
    let canonical = std::fs::canonicalize(mountpoint).ok()?;
    let id = xxhash_rust::xxh3::xxh3_64(canonical.as_os_str().as_encoded_bytes());
    Some(Path::new("/run/nvstack/mounts").join(format!("{id:016x}")))
}

/// True (and the test returns early) when not root or without /dev/fuse; under CI that is an
/// error: CI must run `what`.
#[allow(dead_code, reason = "the device tests check their environment with `device`")]
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

/// How long a test keeps retrying an unmount that the kernel refuses as busy. Right after the
/// last close a mount can be busy for a moment (on a loaded machine a child that another test
/// thread forked holds copies of our descriptors until it execs: TESTING-NOTES.md), so a
/// single attempt is a flaky test; a mount still busy after this long is a real failure.
pub const BUSY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// `nvstack umount MOUNTPOINT`, retrying a busy mount for up to `BUSY_TIMEOUT`
/// (`--busy-timeout`): never a single try.
#[allow(dead_code, reason = "not every test crate unmounts nvstack")]
pub fn nvstack_umount(mountpoint: &Path) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_nvstack"))
        .arg("umount")
        .args(["--busy-timeout", &BUSY_TIMEOUT.as_secs().to_string()])
        .arg(mountpoint)
        .output()
        .expect("run nvstack umount")
}

/// Unmounts a kernel file system (umount2), retrying while it is busy for up to
/// `BUSY_TIMEOUT`; false (still mounted) after that or on another error.
#[allow(dead_code, reason = "only the tests with a scratch kernel file system use it")]
pub fn umount_retrying(path: &Path) -> bool {
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else { return false };
    let start = std::time::Instant::now();
    loop {
        // SAFETY: umount2 of a NUL-terminated path.
        if unsafe { libc::umount2(c.as_ptr(), 0) } == 0 {
            return true;
        }
        let busy = std::io::Error::last_os_error().raw_os_error() == Some(libc::EBUSY);
        if !busy || start.elapsed() > BUSY_TIMEOUT {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}
