//! The engine's locks and their one total order.
//!
//! Every lock of the engine is a [`Mutex`] or [`RwLock`] from this module, created with its
//! [`Rank`]. A thread may acquire a lock only if its rank is greater than the rank of every
//! lock the thread already holds; locks of one rank that may be held several at once (the
//! states of several files of one write-back batch, the two temp files of a rename) are taken
//! in ascending order of a per-lock number ([`Mutex::lock_nth`]). A total order on every
//! acquisition rules out deadlock. In debug builds (every test run) each acquisition is
//! checked against the locks the thread holds and an out-of-order one panics, naming both
//! ranks; release builds compile the checks away.
//!
//! The order, outermost first (ARCHITECTURE.md repeats this table):
//!
//! | rank | what it guards | may be held across lower IO |
//! |---|---|---|
//! | `Delegation` | one delegation of the direct path: its merges in order (`direct/`); held across the merge's writes | yes: the merge's writes |
//! | `Checkpoint` | one metadata-journal checkpoint at a time | yes: its syncfs |
//! | `Round` | one write-back round at a time, and its history | yes: it *is* the write-back |
//! | `Room` | the count of write-back batches freed, which writers that found NVRAM full wait on | no |
//! | `Stripe` | a stripe of lower files: no cached-file record starts while a file's data changes in the lower FS directly | yes (one file's) |
//! | `Listing` | the merged listing of one open directory | yes (its readdir) |
//! | `TempFile` | one temp file's state; several in serial order | yes (its shadowed name's unlink) |
//! | `CachedFile` | one cached file's state; several in record-frame order | yes (its fetches; a read only on its last attempt, `cache/ops.rs`) |
//! | `Overlay` | the overlay: named temp files by directory, pending directory times | no |
//! | `CacheFiles` | the map of cached files | no |
//! | `Fetches` | patched pages waiting for an asynchronous fetch | no |
//! | `UndoSlot` | an undo slot held by a running transaction (a token, not a lock) | no |
//! | `Journal` | the committed records of the metadata journal and the frames they are packed in; a record is written and committed under it (the transaction begun before) | no |
//! | `RecordSlots` | which slots of the record frames are taken (`slots.rs`; the temp files' list and the page cache's, never held together); held only to reserve or release one; its frame count is read without it (`slots::SlotList`) | no |
//! | `ZoneTables` | the zone information tables | no |
//! | `Inodes` | the inode table | no |
//! | `Inode` | one inode's node and key | no |
//! | `Handles` | the handle table | no |
//! | `Unsynced` | lower objects changed and not yet synced (`base/durability.rs`) | no |
//! | `Routes` | the route of each node with open files (`route/`) | no |
//! | `Profile` | the route profile; its record is written and committed under it (the transaction begun before) | no |
//! | `Delegations` | the table of delegations (`direct/`) | no |
//! | `StaleSizes` | nodes whose kernel size may miss the library's appends (`direct/`) | no |
//!
//! *Short* ranks (the global ones and the undo slot) are never held across a call into the
//! lower file system: every lower call asserts that with [`assert_may_block`]. A cold read on
//! a disk therefore stalls only operations on the same file (or, for `Round`, other
//! write-backs), never an unrelated create or a write to another file.

use std::fmt;

/// A lock's place in the order (see the module docs). Smaller ranks are taken first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Rank {
    Delegation,
    Checkpoint,
    Round,
    Room,
    Stripe,
    Listing,
    TempFile,
    CachedFile,
    Overlay,
    CacheFiles,
    Fetches,
    UndoSlot,
    Journal,
    RecordSlots,
    ZoneTables,
    Inodes,
    Inode,
    Handles,
    Unsynced,
    Routes,
    Profile,
    Delegations,
    StaleSizes,
}

impl Rank {
    /// Short ranks are never held across a lower call or a wait.
    #[cfg(debug_assertions)]
    pub(crate) fn is_short(self) -> bool {
        self >= Rank::Overlay
    }

    /// Ranks of which a thread may hold several locks at once (in `lock_nth` order).
    #[cfg_attr(not(debug_assertions), allow(dead_code, reason = "only the debug checker asks"))]
    fn is_multi(self) -> bool {
        matches!(self, Rank::TempFile | Rank::CachedFile)
    }
}

/// One registered acquisition; unregisters itself when dropped.
#[derive(Debug)]
pub struct Held {
    rank: Rank,
    nth: u64,
}

#[cfg(debug_assertions)]
mod check {
    use super::Rank;
    use std::cell::RefCell;

    thread_local! {
        /// The locks this thread holds, in acquisition order.
        pub static HELD: RefCell<Vec<(Rank, u64)>> = const { RefCell::new(Vec::new()) };
    }

    pub(crate) fn acquire(rank: Rank, nth: u64, ordered: bool) {
        HELD.with_borrow_mut(|held| {
            if ordered {
                for &(r, n) in held.iter() {
                    let fine = rank > r || (rank == r && rank.is_multi() && nth > n);
                    assert!(
                        fine,
                        "lock order violated: taking {rank:?}#{nth} while holding {r:?}#{n} \
                         (see crates/core/src/base/sync.rs); held: {held:?}"
                    );
                }
            }
            held.push((rank, nth));
        });
    }

    pub(crate) fn release(rank: Rank, nth: u64) {
        HELD.with_borrow_mut(|held| {
            if let Some(i) = held.iter().rposition(|&e| e == (rank, nth)) {
                held.remove(i);
            }
        });
    }

    pub(crate) fn assert_may_block(what: &str) {
        HELD.with_borrow(|held| {
            if let Some(&(r, n)) = held.iter().find(|(r, _)| r.is_short()) {
                panic!("{what} while holding the short lock {r:?}#{n} (held: {held:?})");
            }
        });
    }
}

impl Held {
    fn acquire(rank: Rank, nth: u64, ordered: bool) -> Held {
        #[cfg(debug_assertions)]
        check::acquire(rank, nth, ordered);
        #[cfg(not(debug_assertions))]
        let _ = ordered;
        Held { rank, nth }
    }

    /// Registers a resource of `rank` that is not a lock of this module (an undo slot).
    pub(crate) fn token(rank: Rank) -> Held {
        Held::acquire(rank, 0, true)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        #[cfg(debug_assertions)]
        check::release(self.rank, self.nth);
    }
}

/// Runs `f` as if the thread held no lock, and restores its locks after. For one use: a
/// crash-image test that, in the middle of one engine's persist (locks held), recovers a
/// second engine over the crash image on the same thread; the locks of one engine say
/// nothing about the order in the other.
pub fn isolated<T>(f: impl FnOnce() -> T) -> T {
    #[cfg(debug_assertions)]
    {
        let saved = check::HELD.with_borrow_mut(std::mem::take);
        let result = f();
        check::HELD.with_borrow_mut(|held| *held = saved);
        result
    }
    #[cfg(not(debug_assertions))]
    f()
}

/// Panics (debug builds) if the thread holds a short lock: called before every call into the
/// lower file system and before every wait.
pub(crate) fn assert_may_block(what: &str) {
    #[cfg(debug_assertions)]
    check::assert_may_block(what);
    #[cfg(not(debug_assertions))]
    let _ = what;
}

/// A mutex with a rank. Poisoning (a panic while holding it) is a bug and panics again.
pub struct Mutex<T> {
    rank: Rank,
    inner: std::sync::Mutex<T>,
}

impl<T: fmt::Debug> fmt::Debug for Mutex<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mutex").field("rank", &self.rank).finish_non_exhaustive()
    }
}

/// A held [`Mutex`].
pub struct MutexGuard<'a, T> {
    inner: std::sync::MutexGuard<'a, T>,
    _held: Held,
}

impl<T> Mutex<T> {
    pub(crate) fn new(rank: Rank, value: T) -> Self {
        Mutex { rank, inner: std::sync::Mutex::new(value) }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
        self.lock_nth(0)
    }

    /// Locks one of several locks of a multi rank: `nth` orders them (ascending).
    pub(crate) fn lock_nth(&self, nth: u64) -> MutexGuard<'_, T> {
        let held = Held::acquire(self.rank, nth, true);
        let inner = self.inner.lock().unwrap_or_else(|_| panic!("{:?} lock poisoned", self.rank));
        MutexGuard { inner, _held: held }
    }

    /// Never blocks, so it may be taken out of order.
    pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        let inner = self.inner.try_lock().ok()?;
        Some(MutexGuard { inner, _held: Held::acquire(self.rank, 0, false) })
    }
}

impl<T> std::ops::Deref for MutexGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.inner
    }
}

impl<T> std::ops::DerefMut for MutexGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.inner
    }
}

impl<T: fmt::Debug> fmt::Debug for MutexGuard<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.inner, f)
    }
}

/// A condition variable over a [`Mutex`] of a long rank.
#[derive(Debug, Default)]
pub struct Condvar(std::sync::Condvar);

impl Condvar {
    pub(crate) fn new() -> Self {
        Condvar(std::sync::Condvar::new())
    }

    /// Waits (releasing the lock meanwhile); a thread holding a short lock must not wait.
    pub(crate) fn wait<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
        Self::park(guard, |inner| self.0.wait(inner).map_err(|_| ()))
    }

    /// `wait`, for at most `timeout`.
    pub(crate) fn wait_timeout<'a, T>(
        &self,
        guard: MutexGuard<'a, T>,
        timeout: std::time::Duration,
    ) -> MutexGuard<'a, T> {
        Self::park(guard, |inner| {
            self.0.wait_timeout(inner, timeout).map(|(g, _)| g).map_err(|_| ())
        })
    }

    /// Releases `guard`'s registration, waits with `wait` (which gives the lock back), and
    /// registers the lock again.
    fn park<'a, T>(
        guard: MutexGuard<'a, T>,
        wait: impl FnOnce(std::sync::MutexGuard<'a, T>) -> Result<std::sync::MutexGuard<'a, T>, ()>,
    ) -> MutexGuard<'a, T> {
        let MutexGuard { inner, _held: held } = guard;
        let (rank, nth) = (held.rank, held.nth);
        drop(held);
        assert_may_block("waiting on a condition variable");
        let inner = wait(inner).unwrap_or_else(|()| panic!("{rank:?} lock poisoned"));
        // Re-registered without an order check: it is the lock the thread had.
        MutexGuard { inner, _held: Held::acquire(rank, nth, false) }
    }

    pub(crate) fn notify_all(&self) {
        self.0.notify_all();
    }
}

/// Wakes the one daemon thread that waits for a kind of work (the background writer: the
/// page cache passed its high watermark; the fetcher: a patch was queued), so that thread
/// can sleep while there is none instead of looking every few milliseconds. No lock: a ring
/// is a counter increment and an unpark of the attached thread, safe under any lock.
///
/// Protocol (no lost wakeup): the waiter reads [`Bell::rung`] *before* it looks for work,
/// and parks only if the count is unchanged after finding none; a ring between the two
/// either changed the count or left the thread's unpark token set, so the park returns at
/// once. Parks end spuriously too, and the waiter bounds each park (it looks again anyway),
/// so a missed ring costs at most that bound. The engine only rings; the daemon's thread
/// attaches itself and parks (time and threads stay outside the engine).
#[derive(Debug, Default)]
pub struct Bell {
    rung: std::sync::atomic::AtomicU64,
    waiter: std::sync::OnceLock<std::thread::Thread>,
}

impl Bell {
    pub(crate) fn new() -> Self {
        Bell::default()
    }

    /// Work arrived: wakes the attached thread (if any; a no-op when it is awake).
    pub(crate) fn ring(&self) {
        self.rung.fetch_add(1, std::sync::atomic::Ordering::Release);
        if let Some(thread) = self.waiter.get() {
            thread.unpark();
        }
    }

    /// Rings so far: the waiter's snapshot before it looks for work.
    pub fn rung(&self) -> u64 {
        self.rung.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Makes `thread` the one that rings wake; false if another already is.
    pub fn attach(&self, thread: std::thread::Thread) -> bool {
        self.waiter.set(thread).is_ok()
    }
}

/// A reader-writer lock with a rank.
pub struct RwLock<T> {
    rank: Rank,
    inner: std::sync::RwLock<T>,
}

impl<T: fmt::Debug> fmt::Debug for RwLock<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RwLock").field("rank", &self.rank).finish_non_exhaustive()
    }
}

/// A shared hold of a [`RwLock`].
#[derive(Debug)]
pub struct ReadGuard<'a, T> {
    inner: std::sync::RwLockReadGuard<'a, T>,
    _held: Held,
}

/// An exclusive hold of a [`RwLock`].
#[derive(Debug)]
pub struct WriteGuard<'a, T> {
    inner: std::sync::RwLockWriteGuard<'a, T>,
    _held: Held,
}

impl<T> RwLock<T> {
    pub(crate) fn new(rank: Rank, value: T) -> Self {
        RwLock { rank, inner: std::sync::RwLock::new(value) }
    }

    pub(crate) fn read(&self) -> ReadGuard<'_, T> {
        let held = Held::acquire(self.rank, 0, true);
        let inner = self.inner.read().unwrap_or_else(|_| panic!("{:?} lock poisoned", self.rank));
        ReadGuard { inner, _held: held }
    }

    pub(crate) fn write(&self) -> WriteGuard<'_, T> {
        let held = Held::acquire(self.rank, 0, true);
        let inner = self.inner.write().unwrap_or_else(|_| panic!("{:?} lock poisoned", self.rank));
        WriteGuard { inner, _held: held }
    }
}

impl<T> std::ops::Deref for ReadGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.inner
    }
}

impl<T> std::ops::Deref for WriteGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.inner
    }
}

impl<T> std::ops::DerefMut for WriteGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.inner
    }
}

#[cfg(all(test, debug_assertions))]
mod tests {
    use super::*;

    fn panics(f: impl FnOnce() + std::panic::UnwindSafe) -> String {
        let err = std::panic::catch_unwind(f).expect_err("should panic");
        err.downcast_ref::<String>().cloned().unwrap_or_default()
    }

    #[test]
    fn locks_in_rank_order_are_fine_and_out_of_order_panics() {
        let outer = Mutex::new(Rank::TempFile, ());
        let inner = Mutex::new(Rank::Overlay, ());
        {
            let _a = outer.lock();
            let _b = inner.lock();
        }
        let msg = panics(|| {
            let _b = inner.lock();
            let _a = outer.lock();
        });
        assert!(msg.contains("taking TempFile#0 while holding Overlay#0"), "{msg}");
        // The panic unwound both guards: the thread holds nothing now.
        let _a = outer.lock();
    }

    #[test]
    fn several_locks_of_a_multi_rank_go_in_ascending_order() {
        let (a, b) = (Mutex::new(Rank::CachedFile, ()), Mutex::new(Rank::CachedFile, ()));
        {
            let _x = a.lock_nth(1);
            let _y = b.lock_nth(2);
        }
        let msg = panics(|| {
            let _y = b.lock_nth(2);
            let _x = a.lock_nth(1);
        });
        assert!(msg.contains("lock order violated"), "{msg}");
        // A single-instance rank never twice.
        let o = Mutex::new(Rank::Overlay, ());
        let p = Mutex::new(Rank::Overlay, ());
        let msg = panics(|| {
            let _x = o.lock();
            let _y = p.lock();
        });
        assert!(msg.contains("taking Overlay#0 while holding Overlay#0"), "{msg}");
    }

    #[test]
    fn a_lower_call_or_a_wait_under_a_short_lock_panics_and_under_a_long_one_does_not() {
        let long = Mutex::new(Rank::CachedFile, ());
        {
            let _g = long.lock();
            assert_may_block("lower read");
        }
        let short = Mutex::new(Rank::Overlay, ());
        let msg = panics(|| {
            let _g = short.lock();
            assert_may_block("lower read");
        });
        assert!(msg.contains("lower read while holding the short lock Overlay"), "{msg}");
        let msg = panics(|| {
            let _slot = Held::token(Rank::UndoSlot);
            assert_may_block("lower pread");
        });
        assert!(msg.contains("UndoSlot"), "{msg}");
    }

    #[test]
    fn isolated_runs_with_a_clean_slate_and_restores_the_held_locks() {
        let short = Mutex::new(Rank::Overlay, ());
        let g = short.lock();
        isolated(|| {
            let again = Mutex::new(Rank::TempFile, ());
            let _x = again.lock(); // out of order for the outer engine, fine in isolation
            assert_may_block("lower read");
        });
        let msg = panics(std::panic::AssertUnwindSafe(|| assert_may_block("lower read")));
        assert!(msg.contains("Overlay"), "{msg}");
        drop(g);
    }

    #[test]
    fn a_ring_wakes_the_attached_thread_and_one_before_its_park_is_not_lost() {
        use std::sync::Arc;
        use std::time::{Duration, Instant};
        // A park bounded by a minute: a lost ring shows as the waiter timing out.
        const BOUND: Duration = Duration::from_secs(60);
        let bell = Arc::new(Bell::new());
        let (b, ready) = (Arc::clone(&bell), Arc::new(std::sync::Barrier::new(2)));
        let r = Arc::clone(&ready);
        let waiter = std::thread::spawn(move || {
            let fresh = Bell::new();
            assert!(fresh.attach(std::thread::current()));
            assert!(!fresh.attach(std::thread::current()), "one waiter per bell");
            // Rung between the snapshot and the park: the park returns at once.
            let seen = fresh.rung();
            fresh.ring();
            let start = Instant::now();
            while fresh.rung() == seen && start.elapsed() < BOUND {
                std::thread::park_timeout(BOUND);
            }
            let early = fresh.rung() != seen && start.elapsed() < BOUND;
            // Parked first (usually), rung later by another thread.
            assert!(b.attach(std::thread::current()));
            let seen = b.rung();
            r.wait();
            let start = Instant::now();
            while b.rung() == seen && start.elapsed() < BOUND {
                std::thread::park_timeout(BOUND);
            }
            (early, b.rung() != seen && start.elapsed() < BOUND)
        });
        ready.wait();
        bell.ring();
        let (early, woken) = waiter.join().unwrap();
        assert!(early, "a ring before the park was lost");
        assert!(woken, "the ring did not wake the parked thread");
    }
}
