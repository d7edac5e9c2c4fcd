//! The engine's side of routes (`route/`): choosing the route of an open, and learning files
//! into the durable route profile.

use std::os::fd::BorrowedFd;
use std::sync::atomic::Ordering;

use lower::LowerFs;
use txn::FrameTag;

use super::{Engine, Obj, Open};
use crate::base::Incident;
use crate::base::OpTx;
use crate::base::error::FsResult;
use crate::route::profile::{KIND_PROFILE, Profile};
use crate::route::{Keep, Route, Signal};

/// A write smaller than this through the NVRAM path teaches the profile (a page).
pub(crate) const SMALL_WRITE: usize = 4096;

/// O_SYNC includes O_DSYNC's bit.
pub(crate) fn sync_flag(flags: i32) -> bool {
    flags & libc::O_DSYNC != 0
}

pub fn writable(flags: i32) -> bool {
    flags & libc::O_ACCMODE != libc::O_RDONLY
}

impl<L: LowerFs> Engine<L> {
    /// Chooses and registers the route of an open of lower regular file `node` (rule of
    /// `route/`). Lower calls (the file's attributes, its handle) happen before the choice.
    pub(crate) fn choose_route(
        &self,
        node_id: u64,
        node: &L::Node,
        key: (u64, u64),
        mode: u32,
        flags: i32,
    ) -> Route {
        let routes = &self.routes;
        if !routes.enabled() {
            return routes.register(node_id, Some(Keep::State), 0, writable(flags));
        }
        let version = routes.version(node_id);
        let keep = if mode & (libc::S_ISUID | libc::S_ISGID) != 0 {
            Some(Keep::SetId)
        } else if sync_flag(flags) {
            Some(Keep::SyncFlag)
        } else if self.cache.cached(key).is_some() {
            Some(Keep::State)
        } else if self.in_profile(node, key) {
            Some(Keep::Profile)
        } else {
            None
        };
        routes.register(node_id, keep, version, writable(flags))
    }

    fn in_profile(&self, node: &L::Node, key: (u64, u64)) -> bool {
        match self.routes.learned_key(key) {
            Some(known) => known,
            None => match self.base.lower.file_handle(node) {
                Ok(handle) => self.routes.profile_has(key, &handle),
                Err(_) => false,
            },
        }
    }

    /// Adds the lower file behind node `node_id` to the route profile (unless it is there or
    /// is still a temp file; nor while passthrough is off), in its own transaction of `otx` (none may be running: the
    /// file's handle is a lower call). A failure to learn is reported, never the operation's.
    pub(crate) fn learn_route(&self, otx: &mut OpTx<'_>, node_id: u64, why: Signal) {
        // Off, nothing is learned: `--passthrough off` changes nothing in NVRAM.
        if !self.routes.enabled() {
            return;
        }
        let Ok(Obj::Lower(node)) = self.obj(node_id) else { return };
        let key = self.base.lower.key(&node);
        if self.routes.learned_key(key) == Some(true) || otx.is_running() {
            return;
        }
        let Ok(handle) = self.base.lower.file_handle(&node) else { return };
        if handle.is_empty() {
            return;
        }
        let pool = &self.base.pool;
        otx.tx(); // begun before the profile's lock (rank order)
        let learned = self.routes.learn(key, &handle, why, |frame, p: &Profile| {
            let written = (|| -> FsResult<txn::FrameId> {
                let bytes = p.encode();
                let tx = otx.tx();
                if let Some(frame) = frame {
                    tx.update(pool.frame_offset(frame), &bytes)?;
                    return Ok(frame);
                }
                let tag = FrameTag { kind: KIND_PROFILE, owner: 0, index: 0 };
                let frame = tx.alloc_frame(tag)?;
                tx.write(pool.frame_offset(frame), &bytes);
                Ok(frame)
            })();
            otx.end(written)
        });
        // Nothing written when the file was in the profile already: end the empty transaction.
        let _ = otx.end(Ok(()));
        if let Err(e) = learned {
            self.base.incident(
                Incident::RouteLearnFailed,
                format_args!(
                    "nvstack: the route profile could not learn a file ({e}); it stays unlearned"
                ),
            );
        }
    }

    /// The lower descriptor the kernel may serve an open in passthrough from.
    pub fn backing_fd(&self, fh: u64) -> Option<std::os::fd::OwnedFd> {
        let h = self.temp.handles.get(fh)?;
        let Open::Lower { file, passthrough: true, .. } = &h.file else { return None };
        let fd: BorrowedFd<'_> = self.base.lower.backing_fd(file)?;
        fd.try_clone_to_owned().ok()
    }

    /// The kernel refused the backing file of open `fh` (the front end answers the open on
    /// the NVRAM path); `off`: passthrough is not available at all (no privilege, no kernel
    /// support), so it is turned off.
    pub fn passthrough_refused(&self, fh: u64, off: bool) {
        if let Some(h) = self.temp.handles.get(fh) {
            self.routes.refused(h.node_id);
        }
        if off {
            self.routes.disable();
        }
    }

    /// Whether opens may take passthrough now.
    pub fn passthrough_enabled(&self) -> bool {
        self.routes.enabled()
    }

    /// Passthrough is not available (the kernel did not accept it at init).
    pub fn passthrough_unavailable(&self) {
        self.routes.disable();
    }

    /// Whether open `fh` took the NVRAM path and was written in small pieces.
    pub(crate) fn wrote_small(h: &Open<L>) -> bool {
        matches!(h, Open::Lower { small_writes, passthrough: false, .. }
            if small_writes.load(Ordering::Relaxed))
    }
}
