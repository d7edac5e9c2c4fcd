//! Acting as the caller: objects created through nvstack must belong to the process that
//! created them, with its groups honoured, exactly as on the lower directory.
//!
//! Linux keeps the file-system uid/gid and the supplementary groups per *thread* at the syscall
//! level (glibc's `setgroups` wrapper broadcasts to every thread, so the raw syscall is used).
//! [`CredsGuard`] switches the calling worker thread to the caller's credentials and switches it
//! back when dropped, so a create runs under the caller's identity and nothing else does.

use crate::types::Errno;

/// Who is asking: the FUSE request's uid/gid and the process's supplementary groups.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Creds {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

impl Creds {
    /// The supplementary groups of `pid`, from /proc (empty if the process is gone).
    pub fn groups_of(pid: u32) -> Vec<u32> {
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
            return Vec::new();
        };
        status
            .lines()
            .find_map(|l| l.strip_prefix("Groups:"))
            .map(|g| g.split_whitespace().filter_map(|x| x.parse().ok()).collect())
            .unwrap_or_default()
    }

    /// Root: acts with the daemon's own credentials, its groups never consulted (`CredsGuard`,
    /// and the set-group-ID rules exempt it).
    pub fn is_root(&self) -> bool {
        self.uid == 0
    }
}

/// Runs the calling thread as `creds` until dropped. See the module docs.
#[derive(Debug)]
pub struct CredsGuard {
    active: bool,
}

/// The daemon's own supplementary groups, captured once.
fn original_groups() -> &'static [u32] {
    static GROUPS: std::sync::OnceLock<Vec<u32>> = std::sync::OnceLock::new();
    GROUPS.get_or_init(|| {
        let mut buf = vec![0 as libc::gid_t; 256];
        // SAFETY: getgroups fills at most buf.len() entries.
        let n = unsafe { libc::getgroups(256, buf.as_mut_ptr()) };
        buf.truncate(usize::try_from(n).unwrap_or(0));
        buf
    })
}

fn setgroups_thread(groups: &[u32]) -> Result<(), Errno> {
    // SAFETY: raw setgroups on this thread with a valid pointer and length.
    let rc = unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) };
    if rc == 0 { Ok(()) } else { Err(Errno::last()) }
}

impl CredsGuard {
    pub fn new(creds: &Creds) -> Result<CredsGuard, Errno> {
        if creds.is_root() {
            return Ok(CredsGuard { active: false });
        }
        original_groups();
        setgroups_thread(&creds.groups)?;
        // SAFETY: setfsgid/setfsuid only change this thread's file-system ids.
        unsafe {
            libc::setfsgid(creds.gid);
            libc::setfsuid(creds.uid);
        }
        Ok(CredsGuard { active: true })
    }
}

impl Drop for CredsGuard {
    fn drop(&mut self) {
        if self.active {
            // SAFETY: back to the daemon's own ids (root) on this thread.
            unsafe {
                libc::setfsuid(0);
                libc::setfsgid(0);
            }
            let _ = setgroups_thread(original_groups());
        }
    }
}
