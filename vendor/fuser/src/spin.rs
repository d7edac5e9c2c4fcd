//! The spinning reader: nvstack's one change to fuser 0.18.0 (see `PATCHES.md`).
//!
//! A FUSE request costs its daemon thread a sleep in `read(2)` on `/dev/fuse` and a wakeup when
//! the kernel queues the request; on a virtual machine the wakeup (an IPI, the idle exit) is
//! most of the round trip of a short request. An application that waits for durability sends
//! its requests back to back (write, fsync, write, ...), so the next one arrives a few
//! microseconds after the reply. With a [`SpinReader`], a worker that has finished a request
//! first reads its own non-blocking clone of the device in a loop for up to `spin`, and only
//! then blocks as before: ski rental between a spin and a sleep-and-wakeup pair, so a request
//! arriving within the window is taken without the wakeup, and an idle session costs at most
//! one window of CPU.
//!
//! The window is learned (ski rental with a known distribution): the spinning worker records
//! the *gap* of sample windows - how long after its reply the next request came - in
//! `BUCKET_US` buckets, and every `LEARN_EVERY` gaps (or a second after the last choice, with
//! at least `LEARN_MIN` of them) sets the window to the one that would have
//! cost those gaps least ([`choose_window`]): a gap within the window costs the gap (spun), a
//! gap beyond it the window plus a sleep and wakeup, valued at `spin`; the window is at most
//! twice `spin`. Then the counts are halved so that old gaps fade. A *sample* window spins for
//! that most, whatever the window is: every window until the first choice, then one in
//! `SAMPLE_EVERY` (and every one while the window is at its most). Only samples are recorded,
//! because a shorter window sees a longer gap only through the blocking read, which adds the
//! wakeup (20-60 us on a VM) to it: a window learned from those would shrink and then see only
//! inflated gaps. An application whose next request follows each reply after 45 us gets a
//! 45-50 us window; one whose requests come 1 ms apart gets none, and spins only in its samples
//! (at most twice `spin` in `SAMPLE_EVERY` = 64 requests).
//!
//! A worker blocked in `read(2)` is woken for every request the kernel queues, even one the
//! spinning worker takes (the kernel wakes one sleeping reader per request): with four workers
//! that spurious wakeup cost a fifth of the gain. So the workers form a crew: one *reader*
//! reads the device, the others park in user space, and a *watcher* adds a reader when every
//! reader has been busy with the same requests for `STUCK` (a request waiting on the disk), up
//! to all workers; a reader parks again after a request once another reader is idle and no
//! reader was added for `LINGER` (200 ms).
//!
//! Invariants:
//! - At most one worker spins at a time (`spinner`): a second spinner would take the CPU the
//!   application needs to send its next request (measured on two cores: slower than none).
//! - `readers >= 1` while the session runs: a reader parks only by taking `readers` from
//!   r > 1 to r - 1, so a queued request always has a reader or the watcher to add one.
//! - Progress: a request queued while every reader is busy waits at most `STUCK` (plus the
//!   watcher's wakeup) for an added reader, up to the number of workers (upstream's bound).
//! - A request read from the spinning clone is answered on that clone (the kernel keeps a
//!   request on the processing list of the device it was read from).
//! - A window ends after twice `spin` at the latest (the learned window is at most that), so a
//!   worker never spins while its session is idle; `spin == 0` is the unpatched behaviour.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// How long every reader may be busy with the same requests before the watcher adds one.
const STUCK: Duration = Duration::from_micros(500);

/// How long the watcher sleeps when no request ran since its last look (a reader that
/// starts one wakes it early).
const IDLE_NAP: Duration = Duration::from_millis(200);

/// How long after the watcher last added a reader the added readers stay: requests that wait
/// on a disk come in streams (each ~10 ms on a disk), and a reader parked between two of them
/// would make the next fast request behind them wait for the watcher again.
const LINGER: Duration = Duration::from_millis(200);

/// Width of a gap bucket (and the step of the learned window).
pub const BUCKET_US: u64 = 5;

/// Samples recorded between two choices of the window; the counts are halved after each, so a
/// gap weighs half as much one choice later.
pub const LEARN_EVERY: u32 = 128;

/// A choice is also made this long after the last one once `LEARN_MIN` samples came in: at one
/// request a millisecond, 128 samples take 8 s, and a window learned in a burst would spin
/// through all of them.
const LEARN_AFTER: Duration = Duration::from_secs(1);
const LEARN_MIN: u32 = 8;

/// One window in this many is a sample (spins for the most a window may be, and is recorded)
/// once the window has been chosen: where spinning does not pay, the samples cost at most
/// `2 x spin / 64` a request (2 us at nvstack's default of 60 us); where it does, a sample
/// costs the gap it catches. 128 samples: a choice every 8,192 requests (or every second).
pub const SAMPLE_EVERY: u64 = 64;

/// How many times the value of a miss the learned window may be: a gap longer than the miss
/// is still worth catching when most gaps are shorter (it would cost the window spun in vain
/// plus the miss), but not beyond twice it.
pub const WINDOW_MAX_FACTOR: u64 = 2;

/// The window that would have cost the recorded gaps least, in microseconds (a multiple of
/// `BUCKET_US` or `cap_us`, at most `cap_us`). `miss_us` is what a sleep and wakeup is worth
/// in microseconds of spinning. `counts[i]` holds the gaps in `(i, i + 1] x BUCKET_US`
/// microseconds, for `i < counts.len() - 1`; the last bucket holds every gap beyond `cap_us`.
/// A gap `g` costs a window `w` the spin `g` (its bucket's midpoint) when `g <= w`, and
/// `w + miss_us` when it is longer (the spin in vain, then the sleep and wakeup). Ties go to
/// the shorter window. With no gaps recorded: `miss_us` (the deterministic ski-rental rule,
/// for when nothing is known).
pub fn choose_window(counts: &[u32], miss_us: u64, cap_us: u64) -> u64 {
    let total: u64 = counts.iter().map(|&c| u64::from(c)).sum();
    if total == 0 || counts.len() < 2 {
        return miss_us.min(cap_us);
    }
    let within = counts.len() - 1;
    let bound = |i: usize| ((i as u64 + 1) * BUCKET_US).min(cap_us);
    // A caught gap costs its bucket's midpoint (in half microseconds, to stay in integers): the
    // upper bound would tie a gap just under the miss's worth with not spinning at all.
    let mid2 = |i: usize| (2 * i as u64 * BUCKET_US + BUCKET_US).min(2 * cap_us);
    // Window k (0: none, else bucket k - 1's upper bound, increasing in k) catches buckets
    // 0..k: cost(k) = their spins + every other gap x (window + miss). One pass.
    let (mut spun2, mut caught) = (0u64, 0u64);
    let mut best = (total * 2 * miss_us, 0);
    for k in 1..=within {
        let c = u64::from(counts[k - 1]);
        spun2 += c * mid2(k - 1);
        caught += c;
        let window = bound(k - 1);
        let cost = spun2 + (total - caught) * 2 * (window + miss_us);
        if cost < best.0 {
            best = (cost, window);
        }
    }
    best.1
}

/// The gaps recorded since the last choice (see `choose_window`).
#[derive(Debug)]
struct Gaps {
    counts: Vec<u32>,
    recorded: u32,
    /// When the window was last chosen (microseconds since `base`).
    chosen_at_us: u64,
}

/// Configuration and counters of the spinning reader, shared by a session's workers and the
/// file system that wants to report them.
#[derive(Debug)]
pub struct SpinReader {
    /// What a sleep and wakeup is worth (`--spin-us`): the window until one is learned.
    spin: Duration,
    /// `spin` in microseconds, and the most a window may be (`WINDOW_MAX_FACTOR x` it).
    miss_us: u64,
    cap_us: u64,
    /// The learned window, in microseconds (at most `cap_us`).
    window_us: AtomicU64,
    /// The samples recorded since the last choice.
    gaps: Mutex<Gaps>,
    /// Choices of the window made.
    learned: AtomicU64,
    /// Windows opened (every `SAMPLE_EVERY`-th is a sample).
    opened: AtomicU64,
    /// The clock's origin (`last_added_us` counts from it).
    base: Instant,
    /// When the watcher last added a reader, in microseconds since `base`.
    last_added_us: AtomicU64,
    spinner: AtomicBool,
    hits: AtomicU64,
    expired: AtomicU64,
    /// Workers allowed to read the device (the others are parked).
    readers: AtomicUsize,
    /// Readers processing a request.
    busy: AtomicUsize,
    /// Requests finished (the watcher compares the count across `STUCK`).
    finished: AtomicU64,
    /// Readers added by the watcher.
    added: AtomicU64,
    /// The session ended: parked workers and the watcher return.
    ended: AtomicBool,
    /// The watcher is napping (`IDLE_NAP`): the next request to start wakes it.
    napping: AtomicBool,
    /// Parked workers wait here for `wake` tickets; the watcher naps on `watch`.
    wake: Mutex<usize>,
    parked: Condvar,
    watch: Condvar,
}

impl SpinReader {
    /// A reader that spins after each request for a window learned from the gaps between
    /// requests, a miss valued at `spin` (zero: never, and every worker reads, as upstream).
    pub fn new(spin: Duration) -> Self {
        let miss_us = u64::try_from(spin.as_micros()).unwrap_or(u64::MAX / 4);
        let cap_us = miss_us * WINDOW_MAX_FACTOR;
        let buckets = usize::try_from(cap_us.div_ceil(BUCKET_US)).unwrap_or(0) + 1;
        Self {
            spin,
            miss_us,
            cap_us,
            window_us: AtomicU64::new(miss_us),
            gaps: Mutex::new(Gaps { counts: vec![0; buckets], recorded: 0, chosen_at_us: 0 }),
            learned: AtomicU64::new(0),
            opened: AtomicU64::new(0),
            base: Instant::now(),
            last_added_us: AtomicU64::new(0),
            spinner: AtomicBool::new(false),
            hits: AtomicU64::new(0),
            expired: AtomicU64::new(0),
            readers: AtomicUsize::new(1),
            busy: AtomicUsize::new(0),
            finished: AtomicU64::new(0),
            added: AtomicU64::new(0),
            ended: AtomicBool::new(false),
            napping: AtomicBool::new(false),
            wake: Mutex::new(0),
            parked: Condvar::new(),
            watch: Condvar::new(),
        }
    }

    /// Microseconds since `base`.
    fn now_us(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// What a sleep and wakeup is worth, in microseconds of spinning (`--spin-us`): the window
    /// reported until one is chosen (every window spins for the most until then, as a sample),
    /// and half the most it may be.
    pub fn spin(&self) -> Duration {
        self.spin
    }

    /// The most the learned window may be, in microseconds.
    pub fn window_max_us(&self) -> u64 {
        self.cap_us
    }

    /// The window the next spinning worker uses (learned from the gaps, at most
    /// `window_max_us`).
    pub fn window(&self) -> Duration {
        Duration::from_micros(self.window_us.load(Ordering::Relaxed))
    }

    /// Times the window was chosen again from the recorded gaps.
    pub fn windows_learned(&self) -> u64 {
        self.learned.load(Ordering::Relaxed)
    }

    /// Opens a window: how long to spin, and whether it is a sample (its gap is to be recorded
    /// with `record_gap`: the time to a request taken while spinning, or a miss as any gap
    /// longer than the window).
    pub fn open_window(&self) -> (Duration, bool) {
        let n = self.opened.fetch_add(1, Ordering::Relaxed);
        let window = self.window_us.load(Ordering::Relaxed);
        let max = self.cap_us;
        let sample =
            self.learned.load(Ordering::Relaxed) == 0 || n % SAMPLE_EVERY == 0 || window >= max;
        (Duration::from_micros(if sample { max } else { window }), sample)
    }

    /// Records the gap of a sample window: how long after it opened the next request was read
    /// (a gap longer than `window_max_us`: the window expired). Every `LEARN_EVERY` gaps, or
    /// `LEARN_AFTER` after the last choice with `LEARN_MIN` gaps, the window is chosen again
    /// and the counts halved.
    pub fn record_gap(&self, gap: Duration) {
        self.record_gap_at(gap, self.now_us());
    }

    /// `record_gap` with the clock given: microseconds since the reader was made (tests).
    pub fn record_gap_at(&self, gap: Duration, now_us: u64) {
        let (miss_us, cap_us) = (self.miss_us, self.cap_us);
        if miss_us == 0 {
            return;
        }
        let gap_us = u64::try_from(gap.as_micros()).unwrap_or(u64::MAX);
        let mut g = self.gaps.lock().unwrap_or_else(|e| e.into_inner());
        let last = g.counts.len() - 1;
        let i = if gap_us > cap_us {
            last
        } else {
            usize::try_from(gap_us.saturating_sub(1) / BUCKET_US).unwrap_or(last).min(last - 1)
        };
        g.counts[i] = g.counts[i].saturating_add(1);
        g.recorded += 1;
        let due = now_us.saturating_sub(g.chosen_at_us) >= LEARN_AFTER.as_micros() as u64;
        if g.recorded >= LEARN_EVERY || (g.recorded >= LEARN_MIN && due) {
            g.chosen_at_us = now_us;
            let window = choose_window(&g.counts, miss_us, cap_us);
            self.window_us.store(window, Ordering::Relaxed);
            self.learned.fetch_add(1, Ordering::Relaxed);
            for c in &mut g.counts {
                *c /= 2;
            }
            g.recorded = 0;
        }
    }

    /// Requests taken while spinning (each one spared the worker a sleep and a wakeup).
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    /// Windows that ended without a request (the worker then blocked as usual).
    pub fn expired(&self) -> u64 {
        self.expired.load(Ordering::Relaxed)
    }

    /// Readers the watcher added because every reader was busy for `STUCK`.
    pub fn readers_added(&self) -> u64 {
        self.added.load(Ordering::Relaxed)
    }

    /// Becomes the one spinning worker, if no other worker is (the session spins only with a
    /// window that is not zero).
    pub(crate) fn claim(&self) -> bool {
        self.spinner.compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed).is_ok()
    }

    /// Ends this worker's window, counting whether it took a request.
    pub(crate) fn release(&self, hit: bool) {
        if hit {
            self.hits.fetch_add(1, Ordering::Relaxed);
        } else {
            self.expired.fetch_add(1, Ordering::Relaxed);
        }
        self.spinner.store(false, Ordering::Release);
    }

    /// A reader took a request.
    pub(crate) fn start(&self) {
        self.busy.fetch_add(1, Ordering::AcqRel);
        if self.napping.load(Ordering::Relaxed) && self.napping.swap(false, Ordering::AcqRel) {
            let _guard = self.wake.lock().unwrap_or_else(|e| e.into_inner());
            self.watch.notify_one();
        }
    }

    /// A reader answered its request.
    pub(crate) fn finish(&self) {
        self.finished.fetch_add(1, Ordering::Relaxed);
        self.busy.fetch_sub(1, Ordering::AcqRel);
    }

    /// Parks this worker, which has just answered a request, if another reader is idle (not
    /// busy with a request) and no reader was added for `LINGER`: a reader added beside a
    /// stuck one stays while requests keep getting stuck, so the fast requests behind them do
    /// not each wait for the watcher again. Returns at once otherwise; false when the session
    /// ended while parked.
    pub(crate) fn park_if_spare(&self) -> bool {
        let mut readers = self.readers.load(Ordering::Acquire);
        if readers == 1 {
            return true;
        }
        let since = self.now_us().saturating_sub(self.last_added_us.load(Ordering::Relaxed));
        if u128::from(since) < LINGER.as_micros() {
            return true;
        }
        // Another reader is idle: `busy` counts the other readers' requests (this one's was
        // finished). A race with a reader starting one leaves at most one idle reader too
        // many, never none (`readers` stays >= 1: it only goes from r > 1 to r - 1).
        while readers >= self.busy.load(Ordering::Acquire) + 2 {
            match self.readers.compare_exchange(
                readers,
                readers - 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return self.park(),
                Err(now) => readers = now,
            }
        }
        true
    }

    /// Parks a worker that is not a reader until the watcher adds it (true) or the session
    /// ends (false).
    pub(crate) fn park(&self) -> bool {
        let mut tickets = self.wake.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if self.ended.load(Ordering::Acquire) {
                return false;
            }
            if *tickets > 0 {
                *tickets -= 1;
                return true;
            }
            tickets = self.parked.wait(tickets).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// The watcher's loop (its own thread): every `STUCK` while requests run, adds a reader
    /// when every reader is busy and none finished a request since the last look; naps while
    /// the session is idle. `workers` bounds the readers.
    pub(crate) fn watch(&self, workers: usize) {
        let mut last_finished = self.finished.load(Ordering::Relaxed);
        let mut guard = self.wake.lock().unwrap_or_else(|e| e.into_inner());
        while !self.ended.load(Ordering::Acquire) {
            let finished = self.finished.load(Ordering::Relaxed);
            let readers = self.readers.load(Ordering::Acquire);
            let busy = self.busy.load(Ordering::Acquire);
            if busy >= readers && finished == last_finished && readers < workers && busy > 0 {
                // Every reader is stuck: one more reads (its ticket is taken by a parked
                // worker, which then counts as a reader).
                self.readers.fetch_add(1, Ordering::AcqRel);
                self.added.fetch_add(1, Ordering::Relaxed);
                self.last_added_us.store(self.now_us(), Ordering::Relaxed);
                *guard += 1;
                self.parked.notify_one();
            }
            // Idle: nothing running and nothing finished since the last look (a request that
            // started and finished in between counts as finished).
            let nap = if finished == last_finished && busy == 0 {
                self.napping.store(true, Ordering::Release);
                IDLE_NAP
            } else {
                STUCK
            };
            last_finished = finished;
            guard = self.watch.wait_timeout(guard, nap).unwrap_or_else(|e| e.into_inner()).0;
            self.napping.store(false, Ordering::Release);
        }
    }

    /// The session ended: parked workers and the watcher return.
    pub(crate) fn end(&self) {
        self.ended.store(true, Ordering::Release);
        let _guard = self.wake.lock().unwrap_or_else(|e| e.into_inner());
        self.parked.notify_all();
        self.watch.notify_all();
    }
}

impl PartialEq for SpinReader {
    fn eq(&self, other: &Self) -> bool {
        self.spin == other.spin
    }
}

impl Eq for SpinReader {}
