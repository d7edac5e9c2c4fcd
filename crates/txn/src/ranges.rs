//! A set of half-open byte ranges, kept merged. Used by a transaction to know which bytes it
//! may store to (snapshotted or freshly allocated) and which it must flush at commit.

use std::collections::BTreeMap;

/// Disjoint, non-adjacent `[start, end)` ranges keyed by start.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RangeSet {
    ranges: BTreeMap<u64, u64>,
}

impl RangeSet {
    pub fn new() -> Self {
        RangeSet::default()
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    pub fn clear(&mut self) {
        self.ranges.clear();
    }

    /// Adds `[start, end)`, merging with overlapping or adjacent ranges.
    pub fn insert(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let (mut start, mut end) = (start, end);
        // The range that starts at or before `start` may overlap or touch it.
        if let Some((&s, &e)) = self.ranges.range(..=start).next_back()
            && e >= start
        {
            start = s;
            end = end.max(e);
        }
        let absorbed: Vec<(u64, u64)> =
            self.ranges.range(start..=end).map(|(&s, &e)| (s, e)).collect();
        for (s, e) in absorbed {
            self.ranges.remove(&s);
            end = end.max(e);
        }
        self.ranges.insert(start, end);
    }

    /// True when every byte of `[start, end)` is in the set.
    pub fn covers(&self, start: u64, end: u64) -> bool {
        if start >= end {
            return true;
        }
        matches!(self.ranges.range(..=start).next_back(), Some((_, &e)) if e >= end)
    }

    /// True when some byte of `[start, end)` is in the set.
    pub fn intersects(&self, start: u64, end: u64) -> bool {
        if start >= end {
            return false;
        }
        if let Some((_, &e)) = self.ranges.range(..=start).next_back()
            && e > start
        {
            return true;
        }
        self.ranges.range(start..end).next().is_some()
    }

    /// The parts of `[start, end)` not in the set, in ascending order.
    pub fn gaps(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        let mut gaps = Vec::new();
        let mut pos = start;
        if let Some((_, &e)) = self.ranges.range(..=start).next_back()
            && e > pos
        {
            pos = e;
        }
        for (&s, &e) in self.ranges.range(start..end) {
            if s > pos {
                gaps.push((pos, s.min(end)));
            }
            pos = pos.max(e);
            if pos >= end {
                break;
            }
        }
        if pos < end {
            gaps.push((pos, end));
        }
        gaps
    }

    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.ranges.iter().map(|(&s, &e)| (s, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// Random inserts and queries against a bitmap model.
    #[test]
    fn range_set_matches_a_bitmap_model() {
        for seed in 0..50 {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let mut set = RangeSet::new();
            let mut model = [false; 200];
            for _ in 0..40 {
                let a = rng.random_range(0..200u64);
                let b = rng.random_range(a..=200u64);
                set.insert(a, b);
                model[a as usize..b as usize].fill(true);
                let q0 = rng.random_range(0..200u64);
                let q1 = rng.random_range(q0..=200u64);
                let slice = &model[q0 as usize..q1 as usize];
                assert_eq!(set.covers(q0, q1), slice.iter().all(|&x| x), "seed {seed}");
                assert_eq!(set.intersects(q0, q1), slice.iter().any(|&x| x), "seed {seed}");
                let mut from_gaps = vec![true; (q1 - q0) as usize];
                for (s, e) in set.gaps(q0, q1) {
                    assert!(q0 <= s && s < e && e <= q1);
                    from_gaps[(s - q0) as usize..(e - q0) as usize].fill(false);
                }
                assert_eq!(from_gaps, slice, "seed {seed}");
                let pairs: Vec<_> = set.iter().collect();
                for w in pairs.windows(2) {
                    assert!(w[0].1 < w[1].0, "not merged: {pairs:?}");
                }
            }
        }
    }
}
