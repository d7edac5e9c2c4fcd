//! `nvstack umount MOUNTPOINT`: unmount and wait until the daemon has shut down cleanly (its
//! region marked clean).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::rundir;
use crate::error::{CliError, CliResult};

#[derive(Debug, clap::Args)]
pub struct UmountArgs {
    pub mountpoint: PathBuf,
    /// Seconds to wait for the daemon to finish.
    #[arg(long, default_value_t = 120)]
    pub timeout: u64,
}

/// Asks the kernel to unmount `mountpoint` (root: umount2; others: fusermount3 -u).
pub fn unmount_path(mountpoint: &Path) -> CliResult {
    let c = std::ffi::CString::new(mountpoint.as_os_str().as_encoded_bytes())
        .map_err(|_| CliError::Usage("mount point contains a NUL byte".into()))?;
    // SAFETY: umount2 of a path.
    if unsafe { libc::umount2(c.as_ptr(), 0) } == 0 {
        return Ok(());
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EBUSY) {
        return Err(CliError::Other(format!(
            "{} is busy (a process has a file open or its working directory there)",
            mountpoint.display()
        )));
    }
    let status = std::process::Command::new("fusermount3").arg("-u").arg(mountpoint).status();
    if status.is_ok_and(|s| s.success()) {
        return Ok(());
    }
    Err(CliError::Other(format!("cannot unmount {}: {err}", mountpoint.display())))
}

pub fn run(args: &UmountArgs) -> CliResult {
    let mountpoint = rundir::canonical_mountpoint(&args.mountpoint)
        .map_err(|e| CliError::Usage(format!("{}: {e}", args.mountpoint.display())))?;
    let run_dir = rundir::dir_for(&mountpoint);
    let pid: Option<i32> = std::fs::read_to_string(rundir::pid_file(&run_dir))
        .ok()
        .and_then(|s| s.trim().parse().ok());
    if !rundir::is_mounted(&mountpoint) {
        return Err(CliError::Usage(format!("{} is not mounted", mountpoint.display())));
    }
    unmount_path(&mountpoint)?;
    if let Some(pid) = pid {
        let deadline = Instant::now() + Duration::from_secs(args.timeout);
        while Path::new(&format!("/proc/{pid}")).exists() && !is_zombie(pid) {
            if Instant::now() > deadline {
                return Err(CliError::Other(format!(
                    "unmounted, but the daemon (pid {pid}) has not finished after {} s",
                    args.timeout
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    Ok(())
}

fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| s.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')))
}
