//! Routes: which path an open regular file takes (design.md section 14).
//!
//! - **NVRAM path**: every read and write is a FUSE request served by the engine (temp file,
//!   page cache, patches): what makes a write durable at NVRAM speed.
//! - **Passthrough**: the kernel serves read, write, mmap and splice directly against the
//!   lower file (FUSE passthrough, Linux 6.9+); the engine sees only open, fsync, setattr and
//!   release. Nothing of the file is in NVRAM, so a file that is only read or streamed pays
//!   no FUSE round trip per IO, and its bytes are cached once (the lower FS's page cache).
//!
//! **The rule** (per FUSE inode = node id, because the kernel refuses cached and passthrough
//! opens of one inode at once with ETXTBSY):
//! 1. while a node has open files, a new open takes their route;
//! 2. otherwise an open takes passthrough when passthrough is on, the file is a regular lower
//!    file (not a temp file), has no state in NVRAM (no cached-file record: no dirty pages,
//!    no patches), has no set-ID bit (the kernel writes through the backing file with the
//!    daemon's credentials, which would not clear it), is not opened O_SYNC/O_DSYNC, and is
//!    not in the route profile;
//! 3. else the NVRAM path.
//!
//! **Learning** (SPFS profiles synchronous writes per file): a file that is fsynced or
//! fdatasynced, opened O_SYNC/O_DSYNC, or written in pieces smaller than a page through the
//! NVRAM path is added to the durable profile (`profile.rs`), so it takes the NVRAM path from
//! its next open on, also after a remount. Passthrough writes are not seen by the engine, so a
//! file written in small pieces while in passthrough is learned only by its fsyncs.
//!
//! Invariants: **T1** a node's open files all have one route (the registration below is the
//! only place a route is chosen, under the table's lock, before the kernel gets the reply).
//! **T2** a file in passthrough has no NVRAM state: it had none when its route was chosen
//! (checked against the node's `version`, which every NVRAM-path open advances, so a
//! cached-file record made and released in between is seen), and none can be made while it is
//! open, because NVRAM state of a lower file is made only by writes through NVRAM-path handles
//! of its node (T1 excludes them). **T3** after a passthrough open that may write, the next
//! NVRAM-path open of the node is answered without `FOPEN_KEEP_CACHE`, so the kernel drops the
//! FUSE inode's page cache, which the passthrough writes did not update.

pub mod profile;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::base::sync::{Mutex, Rank};
use profile::Profile;

/// Lower keys remembered (in or not in the profile) before the map starts again from the
/// profile alone.
const MAX_LEARNED_KEYS: usize = 1 << 16;

/// What an open was given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Opened {
    pub fh: u64,
    /// The kernel serves this file's IO from the lower file (reply with a backing file).
    pub passthrough: bool,
    /// The kernel may keep the FUSE inode's page cache (false after passthrough writes: T3).
    pub keep_cache: bool,
    /// The file lives in NVRAM (a temp file): its bytes are cached there already, so the
    /// front end may serve it without a second copy in the kernel's page cache.
    pub nvram_resident: bool,
}

#[derive(Debug, Default)]
struct NodeRoute {
    passthrough: bool,
    opens: u32,
    /// Advanced by every NVRAM-path open (T2).
    version: u64,
    /// A passthrough open that may write happened since the last NVRAM-path open (T3).
    stale_page_cache: bool,
}

/// The durable profile and what it is known to say about lower keys.
#[derive(Debug, Default)]
struct Learned {
    /// The record's frame, once made.
    frame: Option<txn::FrameId>,
    profile: Profile,
    /// What the profile says of lower keys already asked (saves computing their file handle
    /// again at every open).
    keys: HashMap<(u64, u64), bool>,
}

/// See the module docs.
#[derive(Debug)]
pub struct Routes {
    /// Passthrough may be chosen (the option, and the kernel accepted it).
    enabled: AtomicBool,
    nodes: Mutex<HashMap<u64, NodeRoute>>,
    learned: Mutex<Learned>,
    pub counters: RouteCounters,
}

/// `nvstack stat --json`: `passthrough`.
#[derive(Debug, Default)]
pub struct RouteCounters {
    pub opens_passthrough: AtomicU64,
    pub opens_nvram: AtomicU64,
    /// Opens that took the NVRAM path because of: another open of the node on it, NVRAM
    /// state of the file, the profile, O_SYNC/O_DSYNC, a set-ID bit.
    pub nvram_because_open: AtomicU64,
    pub nvram_because_state: AtomicU64,
    pub nvram_because_profile: AtomicU64,
    pub nvram_because_sync_flag: AtomicU64,
    pub nvram_because_setid: AtomicU64,
    /// Passthrough opens that followed another passthrough open of the node.
    pub passthrough_because_open: AtomicU64,
    /// Files added to the profile, by signal.
    pub learned_fsync: AtomicU64,
    pub learned_sync_flag: AtomicU64,
    pub learned_small_writes: AtomicU64,
    /// fsyncs of passthrough files (each syncs the lower file).
    pub fsyncs: AtomicU64,
    /// Backing files the kernel refused (the open then took the NVRAM path; after a refusal
    /// for want of privilege or support, passthrough is turned off).
    pub refused: AtomicU64,
}

/// A snapshot of [`RouteCounters`] with the state.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct RouteStats {
    pub enabled: bool,
    pub opens_passthrough: u64,
    pub opens_nvram: u64,
    pub nvram_because_open: u64,
    pub nvram_because_state: u64,
    pub nvram_because_profile: u64,
    pub nvram_because_sync_flag: u64,
    pub nvram_because_setid: u64,
    pub passthrough_because_open: u64,
    pub learned_fsync: u64,
    pub learned_sync_flag: u64,
    pub learned_small_writes: u64,
    pub fsyncs: u64,
    pub refused: u64,
    /// Files in the durable profile now.
    pub profile_files: u64,
    /// Nodes with passthrough opens now.
    pub passthrough_nodes: u64,
}

/// Why an open would not take passthrough on its own (rule 2), or `None` when it may.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keep {
    State,
    Profile,
    SyncFlag,
    SetId,
}

/// What learned a file (a counter each).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    Fsync,
    SyncFlag,
    SmallWrites,
}

impl Routes {
    pub(crate) fn new(enabled: bool) -> Self {
        Routes {
            enabled: AtomicBool::new(enabled),
            nodes: Mutex::new(Rank::Routes, HashMap::new()),
            learned: Mutex::new(Rank::Profile, Learned::default()),
            counters: RouteCounters::default(),
        }
    }

    pub(crate) fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// Passthrough is off from now on (the kernel or the privilege is missing); opens already
    /// in passthrough stay so until they close.
    pub(crate) fn disable(&self) {
        self.enabled.store(false, Ordering::Relaxed);
    }

    /// The node's version, read before the caller checks the file's NVRAM state (T2).
    pub(crate) fn version(&self, node: u64) -> u64 {
        self.nodes.lock().get(&node).map_or(0, |r| r.version)
    }

    /// Chooses and registers the route of one open of `node` (rule 1, then `keep` of rule 2
    /// as checked after `version` was read). `writable`: the open may write.
    pub(crate) fn register(
        &self,
        node: u64,
        keep: Option<Keep>,
        version: u64,
        writable: bool,
    ) -> Route {
        let c = &self.counters;
        let mut nodes = self.nodes.lock();
        let r = nodes.entry(node).or_default();
        let passthrough = if r.opens > 0 {
            if r.passthrough {
                c.passthrough_because_open.fetch_add(1, Ordering::Relaxed);
            } else {
                c.nvram_because_open.fetch_add(1, Ordering::Relaxed);
            }
            r.passthrough
        } else if !self.enabled() {
            false
        } else if r.version != version {
            // An NVRAM-path open came and went while the state was checked: check again
            // next time, take the NVRAM path now.
            c.nvram_because_state.fetch_add(1, Ordering::Relaxed);
            false
        } else {
            let counter = match keep {
                None => None,
                Some(Keep::State) => Some(&c.nvram_because_state),
                Some(Keep::Profile) => Some(&c.nvram_because_profile),
                Some(Keep::SyncFlag) => Some(&c.nvram_because_sync_flag),
                Some(Keep::SetId) => Some(&c.nvram_because_setid),
            };
            if let Some(counter) = counter {
                counter.fetch_add(1, Ordering::Relaxed);
            }
            keep.is_none()
        };
        r.opens += 1;
        r.passthrough = passthrough;
        let keep_cache = if passthrough {
            r.stale_page_cache |= writable;
            c.opens_passthrough.fetch_add(1, Ordering::Relaxed);
            true
        } else {
            r.version += 1;
            c.opens_nvram.fetch_add(1, Ordering::Relaxed);
            !std::mem::take(&mut r.stale_page_cache)
        };
        Route { passthrough, keep_cache }
    }

    /// How many opens of `node` are registered (DG1 of the direct path: a delegation only for
    /// the only one).
    pub(crate) fn opens(&self, node: u64) -> u32 {
        self.nodes.lock().get(&node).map_or(0, |r| r.opens)
    }

    /// One open of `node` closed.
    pub(crate) fn release(&self, node: u64) {
        let mut nodes = self.nodes.lock();
        if let Some(r) = nodes.get_mut(&node) {
            r.opens = r.opens.saturating_sub(1);
        }
    }

    /// The kernel refused the backing file of the only open of `node`: it takes the NVRAM
    /// path (its reply then asks the kernel to drop the page cache: T3).
    pub(crate) fn refused(&self, node: u64) {
        self.counters.refused.fetch_add(1, Ordering::Relaxed);
        let mut nodes = self.nodes.lock();
        if let Some(r) = nodes.get_mut(&node)
            && r.passthrough
            && r.opens == 1
        {
            r.passthrough = false;
            r.version += 1;
            r.stale_page_cache = false;
            self.counters.opens_passthrough.fetch_sub(1, Ordering::Relaxed);
            self.counters.opens_nvram.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The kernel forgot `node`: its page cache went with it.
    pub(crate) fn forget(&self, node: u64) {
        let mut nodes = self.nodes.lock();
        if nodes.get(&node).is_some_and(|r| r.opens == 0) {
            nodes.remove(&node);
        }
    }

    /// Whether lower key `key` is in the profile, when known; `None` when not asked yet (the
    /// caller then asks [`Routes::profile_has`] with the file's handle). A key answered "no"
    /// stays "no" until it is learned: learning adds only the learned file's entry.
    pub(crate) fn learned_key(&self, key: (u64, u64)) -> Option<bool> {
        let l = self.learned.lock();
        match l.keys.get(&key) {
            Some(&known) => Some(known),
            None if l.profile.count() == 0 => Some(false),
            None => None,
        }
    }

    /// Whether the file with lower key `key` and file handle `handle` is in the profile
    /// (remembering the answer for the key).
    pub(crate) fn profile_has(&self, key: (u64, u64), handle: &[u8]) -> bool {
        let mut l = self.learned.lock();
        let has = l.profile.contains(profile::entry_of(handle));
        Self::remember_key(&mut l, key, has);
        has
    }

    /// Adds the file with lower key `key` and file handle `handle` to the profile: `write`
    /// writes the new record (into the given frame, or a new one when `None`) in the caller's
    /// transaction and commits it, under the profile's lock so that two files learned at once
    /// both stay. Returns false when the file was in the profile already.
    pub(crate) fn learn<E>(
        &self,
        key: (u64, u64),
        handle: &[u8],
        why: Signal,
        write: impl FnOnce(Option<txn::FrameId>, &Profile) -> Result<txn::FrameId, E>,
    ) -> Result<bool, E> {
        let mut l = self.learned.lock();
        let mut p = l.profile.clone();
        if !p.add(profile::entry_of(handle)) {
            Self::remember_key(&mut l, key, true);
            return Ok(false);
        }
        let frame = write(l.frame, &p)?;
        l.frame = Some(frame);
        l.profile = p;
        Self::remember_key(&mut l, key, true);
        let c = &self.counters;
        match why {
            Signal::Fsync => &c.learned_fsync,
            Signal::SyncFlag => &c.learned_sync_flag,
            Signal::SmallWrites => &c.learned_small_writes,
        }
        .fetch_add(1, Ordering::Relaxed);
        Ok(true)
    }

    fn remember_key(l: &mut Learned, key: (u64, u64), in_profile: bool) {
        if l.keys.len() >= MAX_LEARNED_KEYS {
            l.keys.clear();
        }
        l.keys.insert(key, in_profile);
    }

    /// At start: the profile found in the region.
    pub(crate) fn load(&self, found: Option<profile::Found>) {
        if let Some(f) = found {
            let mut l = self.learned.lock();
            l.frame = Some(f.frame);
            l.profile = f.profile;
        }
    }

    pub(crate) fn stats(&self) -> RouteStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let passthrough_nodes =
            self.nodes.lock().values().filter(|r| r.opens > 0 && r.passthrough).count();
        RouteStats {
            enabled: self.enabled(),
            opens_passthrough: get(&c.opens_passthrough),
            opens_nvram: get(&c.opens_nvram),
            nvram_because_open: get(&c.nvram_because_open),
            nvram_because_state: get(&c.nvram_because_state),
            nvram_because_profile: get(&c.nvram_because_profile),
            nvram_because_sync_flag: get(&c.nvram_because_sync_flag),
            nvram_because_setid: get(&c.nvram_because_setid),
            passthrough_because_open: get(&c.passthrough_because_open),
            learned_fsync: get(&c.learned_fsync),
            learned_sync_flag: get(&c.learned_sync_flag),
            learned_small_writes: get(&c.learned_small_writes),
            fsyncs: get(&c.fsyncs),
            refused: get(&c.refused),
            profile_files: self.learned.lock().profile.count() as u64,
            passthrough_nodes: passthrough_nodes as u64,
        }
    }
}

/// The route [`Routes::register`] chose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route {
    pub passthrough: bool,
    pub keep_cache: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_of_one_node_share_a_route_and_a_free_node_is_decided_again() {
        let r = Routes::new(true);
        let first = r.register(7, None, r.version(7), true);
        assert!(first.passthrough);
        // Rule 1: a second open follows, even one that alone would keep the NVRAM path.
        assert!(r.register(7, Some(Keep::SyncFlag), r.version(7), false).passthrough);
        r.release(7);
        r.release(7);
        // Free again: the NVRAM path for a file with state; its reply drops the page cache
        // the passthrough writes made stale (T3), the next one keeps it.
        let fresh = r.register(7, Some(Keep::State), r.version(7), true);
        assert_eq!(fresh, Route { passthrough: false, keep_cache: false });
        let second = r.register(7, None, r.version(7), false);
        assert_eq!(second, Route { passthrough: false, keep_cache: true }, "rule 1 again");
        r.release(7);
        r.release(7);
        assert!(r.register(7, None, r.version(7), false).passthrough);
        let s = r.stats();
        assert_eq!((s.opens_passthrough, s.opens_nvram), (3, 2));
        assert_eq!((s.passthrough_because_open, s.nvram_because_open), (1, 1));
        assert_eq!(s.nvram_because_state, 1);
        assert_eq!(s.passthrough_nodes, 1);
    }

    #[test]
    fn an_nvram_open_between_the_check_and_the_choice_keeps_the_nvram_path() {
        let r = Routes::new(true);
        let seen = r.version(3);
        // Another open took the NVRAM path, wrote (state made) and closed meanwhile.
        r.register(3, Some(Keep::State), r.version(3), true);
        r.release(3);
        assert!(!r.register(3, None, seen, false).passthrough, "T2");
    }

    #[test]
    fn disabled_or_refused_means_the_nvram_path() {
        let r = Routes::new(false);
        assert!(!r.register(1, None, 0, true).passthrough);
        let r = Routes::new(true);
        assert!(r.register(2, None, 0, true).passthrough);
        r.refused(2);
        assert!(!r.register(2, None, r.version(2), false).passthrough, "follows the refused");
        assert_eq!(r.stats().refused, 1);
    }

    #[test]
    fn learned_files_are_known_by_key_after_their_handle_was_seen() {
        let r = Routes::new(true);
        assert_eq!(r.learned_key((1, 2)), Some(false), "empty profile: no handle needed");
        let mut made = None;
        let learn = |frame: Option<txn::FrameId>, p: &Profile| {
            assert!(frame.is_none(), "first record: a new frame");
            made = Some(p.count());
            Ok::<_, ()>(txn::FrameId(9))
        };
        assert_eq!(r.learn((1, 2), b"h1", Signal::Fsync, learn), Ok(true));
        assert_eq!(made, Some(1));
        let again = |_: Option<txn::FrameId>, _: &Profile| -> Result<txn::FrameId, ()> {
            panic!("in it already: nothing written")
        };
        assert_eq!(r.learn((1, 2), b"h1", Signal::Fsync, again), Ok(false));
        // A failed write leaves the profile as it was.
        assert_eq!(r.learn((1, 4), b"h3", Signal::Fsync, |_, _| Err(())), Err(()));
        assert!(!r.profile_has((1, 4), b"h3"));
        assert_eq!(r.learned_key((1, 2)), Some(true));
        assert_eq!(r.learned_key((1, 3)), None, "ask with the handle");
        assert!(!r.profile_has((1, 3), b"h2"));
        assert_eq!(r.learned_key((1, 3)), Some(false), "the answer is remembered");
        assert!(r.profile_has((5, 5), b"h1"), "the same file under another key");
        assert_eq!(r.learned_key((5, 5)), Some(true));
        assert_eq!(r.stats().learned_fsync, 1);
    }
}
