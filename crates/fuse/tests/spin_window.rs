//! The spinning reader's learned window (vendor/fuser/src/spin.rs, docs/design.md 14.8): the
//! window chosen from recorded gaps is the one that would have cost them least, valuing a miss
//! at `--spin-us`, never more than twice that, and it follows the application when its gaps
//! change.

use std::time::Duration;

use fuser::{BUCKET_US, LEARN_EVERY, SAMPLE_EVERY, SpinReader, WINDOW_MAX_FACTOR, choose_window};

/// Counts for a window of at most `cap_us` with `gaps` (microseconds, each `n` times).
fn counts(cap_us: u64, gaps: &[(u64, u32)]) -> Vec<u32> {
    let mut c = vec![0u32; (cap_us.div_ceil(BUCKET_US) + 1) as usize];
    let last = c.len() - 1;
    for &(g, n) in gaps {
        let i = if g > cap_us { last } else { (g.saturating_sub(1) / BUCKET_US) as usize };
        c[i] += n;
    }
    c
}

/// The cost of window `w` for the gaps, as the rule defines it (brute force, per gap, in half
/// microseconds): a gap the window reaches costs its bucket's midpoint (a gap beyond the cap is
/// never reached), any other the window spun in vain plus the miss.
fn cost(miss_us: u64, cap_us: u64, gaps: &[(u64, u32)], w: u64) -> u64 {
    gaps.iter()
        .map(|&(g, n)| {
            let bucket = g.saturating_sub(1) / BUCKET_US;
            let upper = ((bucket + 1) * BUCKET_US).min(cap_us);
            let mid2 = (2 * bucket * BUCKET_US + BUCKET_US).min(2 * cap_us);
            u64::from(n) * if g <= cap_us && upper <= w { mid2 } else { 2 * (w + miss_us) }
        })
        .sum()
}

/// A case: the value of a miss, the gaps as (us, count), the window expected.
type Case = (u64, &'static [(u64, u32)], u64);

#[test]
fn the_window_is_the_cheapest_for_the_gaps_and_never_above_twice_a_miss() {
    let table: &[Case] = &[
        // Nothing recorded: the classic rule, spin as long as a miss costs.
        (50, &[], 50),
        // sqlite WAL on a 2-core VM: replies followed 40-60 us later; the ones past 50 us are
        // still cheaper to catch than to miss once the window is at 45.
        (50, &[(42, 30), (48, 50), (55, 40), (58, 8)], 60),
        // Back-to-back requests (a write-back burst): a few microseconds.
        (50, &[(2, 90), (4, 10)], 5),
        // Requests 80 us apart: a miss is worth less than the spin.
        (50, &[(80, 128)], 0),
        // Requests 1 ms apart: spinning never pays.
        (50, &[(1000, 128)], 0),
        // Half back to back, half far apart: catch the short ones only.
        (50, &[(3, 64), (5000, 64)], 5),
        // Mostly 30 us and a tail at 70 us: catching the tail (70) is cheaper than missing it
        // (30 + 50) when nothing lies beyond it ...
        (50, &[(30, 120), (70, 8)], 70),
        // ... but not when enough gaps never come within the most a window may be.
        (50, &[(30, 80), (70, 16), (5000, 32)], 30),
        // A value that is not a multiple of the bucket; a gap past the miss's worth is caught
        // when the window would be open anyway for most of it ...
        (23, &[(12, 100)], 15),
        (23, &[(30, 100), (3, 100)], 30),
        // ... and not when it is nearly twice that.
        (23, &[(44, 100), (3, 100)], 5),
    ];
    for &(miss, gaps, want) in table {
        let cap = miss * WINDOW_MAX_FACTOR;
        let got = choose_window(&counts(cap, gaps), miss, cap);
        assert_eq!(got, want, "miss {miss}, gaps {gaps:?}");
        assert!(got <= cap);
        if !gaps.is_empty() {
            // No window (0 or any bucket bound up to the cap) is cheaper.
            let best = cost(miss, cap, gaps, got);
            for w in (0..=cap).step_by(BUCKET_US as usize).chain([cap]) {
                assert!(cost(miss, cap, gaps, w) >= best, "{miss}, {gaps:?}: {w} beats {got}");
            }
        }
    }
}

#[test]
fn the_reader_learns_the_window_from_its_gaps_and_follows_them() {
    let spin = SpinReader::new(Duration::from_micros(50));
    assert_eq!(spin.window(), Duration::from_micros(50), "a miss's worth until it has learned");
    assert_eq!(spin.window_max_us(), 100);
    for _ in 0..LEARN_EVERY {
        spin.record_gap(Duration::from_micros(47));
    }
    assert_eq!(spin.windows_learned(), 1);
    assert_eq!(spin.window(), Duration::from_micros(50));
    // The application slows down: its requests now come 2 ms apart. Old gaps fade (halved at
    // each choice), so within a few rounds the reader stops spinning.
    for _ in 0..4 * LEARN_EVERY {
        spin.record_gap(Duration::from_millis(2));
    }
    assert_eq!(spin.window(), Duration::ZERO);
    // And back: requests 12 us after each reply.
    for _ in 0..4 * LEARN_EVERY {
        spin.record_gap(Duration::from_micros(12));
    }
    assert_eq!(spin.window(), Duration::from_micros(15));
    assert_eq!(spin.windows_learned(), 9);
    // A reader that never spins records nothing and keeps no window.
    let off = SpinReader::new(Duration::ZERO);
    off.record_gap(Duration::from_micros(5));
    assert_eq!(off.window(), Duration::ZERO);
    assert_eq!(off.windows_learned(), 0);
}

/// Only sample windows are recorded, so a short window never learns from gaps the blocking read
/// inflated: every window is a sample until the first choice, then one in `SAMPLE_EVERY`; a
/// sample spins for the most a window may be.
#[test]
fn sample_windows_spin_for_the_most_and_come_one_in_sixty_four() {
    let spin = SpinReader::new(Duration::from_micros(50));
    let max = Duration::from_micros(100);
    for _ in 0..3 * SAMPLE_EVERY {
        assert_eq!(spin.open_window(), (max, true), "before the first choice");
    }
    for _ in 0..LEARN_EVERY {
        spin.record_gap(Duration::from_micros(8));
    }
    assert_eq!(spin.window(), Duration::from_micros(10));
    let windows: Vec<(Duration, bool)> =
        (0..4 * SAMPLE_EVERY).map(|_| spin.open_window()).collect();
    let samples = windows.iter().filter(|w| w.1).count() as u64;
    assert_eq!(samples, 4, "{windows:?}");
    for &(w, sample) in &windows {
        assert_eq!(w, if sample { max } else { Duration::from_micros(10) });
    }
}

/// A slow application gets its window chosen by time too: a window learned in a burst of
/// requests that came 35 us after each reply is dropped within seconds once the requests come
/// 1 ms apart - the choice is made each second with at least 8 samples, and each halves the
/// burst's counts - not after 128 samples each (8 s of samples at that rate).
#[test]
fn a_window_learned_in_a_burst_is_dropped_within_seconds_when_requests_slow_down() {
    let spin = SpinReader::new(Duration::from_micros(100));
    let mut now = 10u64; // microseconds since the reader was made
    for _ in 0..LEARN_EVERY {
        spin.record_gap_at(Duration::from_micros(35), now);
        now += 40;
    }
    assert_eq!((spin.windows_learned(), spin.window()), (1, Duration::from_micros(35)));
    let mut choices = vec![];
    // One sample every 64 ms (one request a millisecond, one window in 64 a sample).
    for _ in 0..LEARN_EVERY {
        now += 64_000;
        spin.record_gap_at(Duration::from_millis(1), now);
        choices.push(spin.window().as_micros());
    }
    let first_zero = choices.iter().position(|&w| w == 0).expect("never dropped");
    assert!(first_zero < 64, "dropped after {first_zero} samples: {choices:?}");
    assert!(choices[first_zero..].iter().all(|&w| w == 0), "{choices:?}");
    assert!(spin.windows_learned() >= 3, "chosen by time: {choices:?}");
}
