//! The spinning reader's learned window (vendor/fuser/src/spin.rs, docs/design.md 14.8): the
//! window chosen from recorded gaps is the one that would have cost them least, never more than
//! `--spin-us`, and it follows the application when its gaps change.

use std::time::Duration;

use fuser::{BUCKET_US, LEARN_EVERY, SpinReader, choose_window};

/// Counts for `cap_us` with `gaps` (microseconds, each once per `times`).
fn counts(cap_us: u64, gaps: &[(u64, u32)]) -> Vec<u32> {
    let mut c = vec![0u32; (cap_us.div_ceil(BUCKET_US) + 1) as usize];
    let last = c.len() - 1;
    for &(g, n) in gaps {
        let i = if g > cap_us { last } else { (g.saturating_sub(1) / BUCKET_US) as usize };
        c[i] += n;
    }
    c
}

/// The cost of window `w` for the gaps, as the rule defines it (brute force, per gap).
fn cost(cap_us: u64, gaps: &[(u64, u32)], w: u64) -> u64 {
    gaps.iter()
        .map(|&(g, n)| {
            // A gap costs its bucket's upper bound when the window reaches it (a gap beyond
            // the cap never does).
            let spun = (g.div_ceil(BUCKET_US) * BUCKET_US).min(cap_us);
            u64::from(n) * if g <= cap_us && spun <= w { spun } else { w + cap_us }
        })
        .sum()
}

/// A case: the cap, the gaps as (us, count), the window expected.
type Case = (u64, &'static [(u64, u32)], u64);

#[test]
fn the_window_is_the_cheapest_for_the_gaps_and_never_above_the_cap() {
    let table: &[Case] = &[
        // Nothing recorded: the classic rule, spin as long as a sleep and wakeup is worth.
        (100, &[], 100),
        // sqlite WAL on a 2-core VM: replies followed 40-60 us later.
        (100, &[(42, 30), (48, 50), (55, 40), (58, 8)], 60),
        // Back-to-back requests (a write-back burst): a few microseconds.
        (100, &[(2, 90), (4, 10)], 5),
        // Requests 1 ms apart: spinning never pays.
        (100, &[(1000, 128)], 0),
        // Half back to back, half far apart: catch the short ones only.
        (100, &[(3, 64), (5000, 64)], 5),
        // Gaps just beyond the cap: none.
        (20, &[(45, 128)], 0),
        // A cap that is not a multiple of the bucket: the last bucket ends at the cap, where a
        // gap costs what a sleep is worth - a tie, which goes to not spinning.
        (23, &[(12, 100)], 15),
        (23, &[(22, 100)], 0),
        // A gap within the cap is always worth catching for itself (it costs less than a
        // sleep); what a longer window costs is the spin in vain on gaps beyond it: a tail at
        // 90 us is caught unless enough gaps never come within the cap.
        (100, &[(30, 120), (90, 8)], 90),
        (100, &[(30, 64), (90, 16), (5000, 48)], 30),
    ];
    for &(cap, gaps, want) in table {
        let got = choose_window(&counts(cap, gaps), cap);
        assert_eq!(got, want, "cap {cap}, gaps {gaps:?}");
        assert!(got <= cap);
        if !gaps.is_empty() {
            // No window (0 or any bucket bound up to the cap) is cheaper.
            let best = cost(cap, gaps, got);
            for w in (0..=cap).step_by(BUCKET_US as usize).chain([cap]) {
                assert!(cost(cap, gaps, w) >= best, "cap {cap}, {gaps:?}: {w} beats {got}");
            }
        }
    }
}

#[test]
fn the_reader_learns_the_window_from_its_gaps_and_follows_them() {
    let spin = SpinReader::new(Duration::from_micros(100));
    assert_eq!(spin.window(), Duration::from_micros(100), "the cap until it has learned");
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
