//! Where a running mount keeps its control socket, pid and log: one directory per mount point,
//! `/run/nvstack/mounts/<id>` with id = XXH3 of the canonical mount point path. Mode 0700 and
//! owned by the mounting user, so only that user and root reach the socket.

use std::path::{Path, PathBuf};

pub const BASE: &str = "/run/nvstack/mounts";

pub fn dir_for(mountpoint: &Path) -> PathBuf {
    let id = xxhash_rust::xxh3::xxh3_64(mountpoint.as_os_str().as_encoded_bytes());
    Path::new(BASE).join(format!("{id:016x}"))
}

pub fn socket(dir: &Path) -> PathBuf {
    dir.join("control.sock")
}

pub fn pid_file(dir: &Path) -> PathBuf {
    dir.join("pid")
}

pub fn log_file(dir: &Path) -> PathBuf {
    dir.join("daemon.log")
}

/// The canonical form of a mount point, even when the FUSE mount on it is dead (ENOTCONN):
/// canonicalize the parent and join the name.
pub fn canonical_mountpoint(mp: &Path) -> std::io::Result<PathBuf> {
    match std::fs::canonicalize(mp) {
        Ok(p) => Ok(p),
        Err(e) => {
            let parent =
                mp.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
            let name = mp.file_name().ok_or(e)?;
            Ok(std::fs::canonicalize(parent)?.join(name))
        }
    }
}

/// True when `mp` is a mount point whose FUSE daemon is gone ("Transport endpoint is not
/// connected").
pub fn is_stale(mp: &Path) -> bool {
    if matches!(std::fs::metadata(mp), Err(e) if e.raw_os_error() == Some(libc::ENOTCONN)) {
        return true;
    }
    // stat may be answered from the kernel's attribute cache without asking the (dead)
    // daemon; statfs is never cached, so it reaches the connection and sees it aborted.
    let Ok(c) = std::ffi::CString::new(mp.as_os_str().as_encoded_bytes()) else { return false };
    // SAFETY: statvfs fills the zeroed struct.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::statvfs(c.as_ptr(), &raw mut s) };
    rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOTCONN)
}

/// True when `mp` appears in /proc/self/mountinfo as a mount point (the device layer's parser,
/// which decodes mountinfo's octal escapes).
pub fn is_mounted(mp: &Path) -> bool {
    device::attach::is_mounted(mp)
}
