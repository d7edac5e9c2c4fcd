//! The direct path in the front end (docs/direct-path.md): the grant and merge ioctls, and what
//! the kernel is told around a take-back.
//!
//! The kernel caches a file's attributes, size and pages; while a library process writes the
//! file through its log, the kernel knows none of it. So (DG2):
//! - with the direct path on, every open that can write a regular file on the NVRAM path is a
//!   direct-IO open (`handlers.rs`, `opened_flags`): the holder's reads are READ requests,
//!   which the daemon answers after a merge, never pages the kernel cached before a write the
//!   library made; and while a file is delegated it has no other open (DG1), so no one else
//!   reads or fills its pages;
//! - at the grant, the node's pages and attributes are invalidated (`FUSE_NOTIFY_INVAL_INODE`),
//!   after which any stat of it reaches the daemon (the library answers its own process's
//!   fstat);
//! - when a delegation ends, the kernel's size is still the one it knew before the library's
//!   appends, and some of its paths use it without asking (the offset of an O_APPEND write, an
//!   mmap fault): the file's last byte is stored into its page cache (`FUSE_NOTIFY_STORE`,
//!   which sets the size when it grows) and its attributes invalidated, before the request that
//!   ended it is answered - or, for a WRITE (whose pages the kernel holds locked while it waits
//!   for the answer), right after.
//!
//! Notifications are sent with no engine lock held. One that drops pages waits for every page
//! of the node that a request in flight holds locked; none is sent after a READ (a first version
//! did, and a sqlite loop's readahead held pages whose READs no worker was left to serve: every
//! worker was waiting in such a notification).

use std::sync::{Arc, OnceLock};

use ::direct::ioctl as dio;
use engine::{Caller, TakeBack, TakenBack};
use fuser::{INodeNo, Notifier, ReplyIoctl, Request};
use lower::LowerFs;

use crate::errno::errno;
use crate::handlers::FuseFs;

/// Where the daemon puts the session's notifier once the session exists (the file system is
/// made before it).
pub type NotifierSlot = Arc<OnceLock<Notifier>>;

impl<L: LowerFs> FuseFs<L> {
    /// DT1 before a request on `ino`: the library's records merged (and the delegation ended,
    /// unless `why` keeps it). An error is the request's answer.
    pub(crate) fn take_back(&self, ino: u64, why: TakeBack) -> Result<TakenBack, fuser::Errno> {
        self.engine().take_back(ino, why).map_err(|e| errno(&e))
    }

    /// What the kernel must learn after a take-back that ended a delegation (module docs).
    pub(crate) fn settle(&self, ino: u64, t: TakenBack) {
        let Some(n) = self.notifier() else { return };
        if let TakenBack::Ended { tail } = t {
            if let Some((offset, byte)) = tail {
                // ENOENT: the kernel holds no inode for it (nothing cached, nothing stale).
                let _ = n.store(INodeNo(ino), offset, &[byte]);
            }
            // Pages too: an O_APPEND write the kernel placed by its old size filled pages at
            // the wrong offset (the daemon wrote it at the end).
            let _ = n.inval_inode(INodeNo(ino), 0, 0);
        }
    }

    /// The ioctls of `direct::ioctl`; anything else is not a terminal's or a device's ioctl
    /// either (ENOTTY).
    pub(crate) fn direct_ioctl(
        &self,
        req: &Request,
        ino: u64,
        fh: u64,
        cmd: u32,
        in_data: &[u8],
        reply: ReplyIoctl,
    ) {
        match cmd {
            dio::DELEGATE if dio::delegate_request_ok(in_data) => {
                let caller = Caller { uid: req.uid(), gid: req.gid(), pid: req.pid() };
                match self.engine().grant(ino, fh, caller) {
                    Ok(g) => {
                        // DG2: nothing the kernel caches may hide a write the library makes.
                        if let Some(n) = self.notifier() {
                            let _ = n.inval_inode(INodeNo(ino), 0, 0);
                        }
                        if let Some(bytes) = g.encode() {
                            reply.ioctl(0, &bytes);
                        } else {
                            let _ = self.engine().take_back(ino, TakeBack::Asked);
                            reply.error(fuser::Errno::from_i32(libc::ENAMETOOLONG));
                        }
                    }
                    Err(e) => reply.error(errno(&e)),
                }
            }
            dio::MERGE => {
                let Some((grant, flags)) = dio::merge_request_decode(in_data) else {
                    return reply.error(fuser::Errno::from_i32(libc::EINVAL));
                };
                let end = flags & dio::MERGE_END != 0;
                match self.engine().merge_asked(ino, fh, grant, end) {
                    Ok((next_seq, size, t)) => {
                        self.settle(ino, t);
                        reply.ioctl(0, &dio::merge_answer(next_seq, size));
                    }
                    Err(e) => reply.error(errno(&e)),
                }
            }
            dio::DELEGATE => reply.error(fuser::Errno::from_i32(libc::EPROTO)),
            _ => reply.error(fuser::Errno::from_i32(libc::ENOTTY)),
        }
    }
}
