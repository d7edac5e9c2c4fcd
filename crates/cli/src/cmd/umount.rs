//! `nvstack umount MOUNTPOINT`: unmount and wait until the daemon has shut down cleanly (its
//! region marked clean).
//!
//! States: mounted -> (the kernel refuses while something uses the mount: busy; retried every
//! `BUSY_RETRY_INTERVAL` until `--busy-timeout`, see `unmount_waiting`) -> unmounted (the
//! kernel ended the FUSE session) -> stopped (the daemon has exited: `run` waits for its pid,
//! at most `--timeout`).
//!
//! Why a busy mount is retried: right after the last close of a file on the mount, the kernel
//! can still count a reference for a moment (on a loaded machine, a child forked by another
//! thread holds copies of the parent's descriptors until it execs), so a single unmount attempt
//! fails now and then where a second one a few milliseconds later succeeds. A mount that stays
//! busy (a shell's working directory, an open file) is reported after the bounded wait, with
//! the commands that find the holder.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::rundir;
use crate::error::{CliError, CliResult};

/// Pause between two unmount attempts of a busy mount.
const BUSY_RETRY_INTERVAL: Duration = Duration::from_millis(100);

#[derive(Debug, clap::Args)]
pub struct UmountArgs {
    pub mountpoint: PathBuf,
    /// Seconds to wait for the daemon to finish after the kernel unmounted it (it writes back
    /// what --keep-tempfiles/--keep-dirty do not keep, then marks the region clean).
    #[arg(long, default_value_t = 120, value_name = "SECONDS")]
    pub timeout: u64,
    /// Seconds to keep retrying while the mount is busy (a process has a file open or its
    /// working directory there; right after the last close the kernel may still say busy for
    /// a moment). 0 = try once. After that, fails with the commands that find the holder
    /// (`fuser -vm MOUNTPOINT`, `lsof +f -- MOUNTPOINT`).
    #[arg(long, default_value_t = 10, value_name = "SECONDS")]
    pub busy_timeout: u64,
}

/// The outcome of one unmount attempt.
enum Attempt {
    Done,
    Busy,
    Failed(String),
}

/// One attempt to make the kernel unmount `mountpoint`: umount2 (root), else fusermount3 -u
/// (the setuid helper that lets the mounting user unmount).
fn try_unmount(mountpoint: &Path) -> CliResult<Attempt> {
    let c = std::ffi::CString::new(mountpoint.as_os_str().as_encoded_bytes())
        .map_err(|_| CliError::Usage("mount point contains a NUL byte".into()))?;
    // SAFETY: umount2 of a path.
    if unsafe { libc::umount2(c.as_ptr(), 0) } == 0 {
        return Ok(Attempt::Done);
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EBUSY) {
        return Ok(Attempt::Busy);
    }
    match std::process::Command::new("fusermount3").arg("-u").arg(mountpoint).output() {
        Ok(out) if out.status.success() => Ok(Attempt::Done),
        // fusermount3 reports umount2's EBUSY as "Device or resource busy".
        Ok(out) if String::from_utf8_lossy(&out.stderr).contains("busy") => Ok(Attempt::Busy),
        Ok(out) => Ok(Attempt::Failed(format!(
            "{err}; fusermount3 -u: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))),
        Err(e) => Ok(Attempt::Failed(format!("{err}; fusermount3: {e}"))),
    }
}

/// Asks the kernel to unmount `mountpoint` once (root: umount2; others: fusermount3 -u); a
/// busy mount is an error at once. The daemon's signal handler uses this.
pub fn unmount_path(mountpoint: &Path) -> CliResult {
    unmount_waiting(mountpoint, Duration::ZERO)
}

/// Asks the kernel to unmount `mountpoint`, retrying while it is busy for at most
/// `busy_timeout` (zero: one attempt).
pub fn unmount_waiting(mountpoint: &Path, busy_timeout: Duration) -> CliResult {
    let start = Instant::now();
    loop {
        match try_unmount(mountpoint)? {
            Attempt::Done => return Ok(()),
            Attempt::Busy if start.elapsed() + BUSY_RETRY_INTERVAL <= busy_timeout => {
                std::thread::sleep(BUSY_RETRY_INTERVAL);
            }
            Attempt::Busy => {
                let waited = if busy_timeout.is_zero() {
                    String::new()
                } else {
                    format!(" (still after {:.1} s)", start.elapsed().as_secs_f64())
                };
                let mp = mountpoint.display();
                return Err(CliError::Other(format!(
                    "{mp} is busy{waited}: a process has a file open or its working directory \
                     there. Find it with `fuser -vm {mp}` or `lsof +f -- {mp}`, end or move it, \
                     and run `nvstack umount` again (--busy-timeout SECONDS waits longer)"
                )));
            }
            // Someone else unmounted it meanwhile: what we wanted.
            Attempt::Failed(_) if !rundir::is_mounted(mountpoint) => return Ok(()),
            Attempt::Failed(why) => {
                return Err(CliError::Other(format!(
                    "cannot unmount {}: {why}",
                    mountpoint.display()
                )));
            }
        }
    }
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
    unmount_waiting(&mountpoint, Duration::from_secs(args.busy_timeout))?;
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
