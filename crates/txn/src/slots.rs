//! Frames divided into slots: the volatile occupancy of every packed record kind (up to 64
//! slots a frame), shared by the engine's packed records, the metadata journal's redo records,
//! a cached file's patches (crate `nvstack-core`, `base/slots.rs`) and the device's NVRAM
//! block cache. Only the occupancy: what a free slot holds on media, and which frame a new run
//! goes to, is each user's.

use std::collections::{BTreeMap, BTreeSet};

use crate::FrameId;

/// A run of `slots` slots from `slot` on, in `frame` (a journal record's or a patch's place).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Run {
    pub frame: FrameId,
    pub slot: usize,
    pub slots: usize,
}

impl Run {
    /// Its bits in the frame's occupancy.
    pub fn mask(self) -> u64 {
        run_mask(self.slot, self.slots)
    }
}

/// The bits of slots `slot..slot + slots` (at most 64 slots a frame).
pub fn run_mask(slot: usize, slots: usize) -> u64 {
    debug_assert!(slots >= 1 && slot + slots <= 64, "a run of 1..=64 slots in the frame");
    (u64::MAX >> (64 - slots)) << slot
}

/// Frames divided into `per_frame` slots (1 to 64), and which slots each has taken: the
/// occupancy every packed record kind keeps (see the module docs). Every change goes through
/// [`SlotMap::set`], which keeps the indexes: S1 `roomy` holds exactly the frames with a free
/// slot, `empty` exactly those with none taken, `by_run` every roomy frame under its longest
/// free run, and `free` counts the free slots of all frames ([`SlotMap::check`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotMap {
    per_frame: usize,
    used: BTreeMap<FrameId, u64>,
    roomy: BTreeSet<FrameId>,
    empty: BTreeSet<FrameId>,
    by_run: BTreeSet<(usize, FrameId)>,
    free: u64,
}

impl SlotMap {
    pub fn new(per_frame: usize) -> SlotMap {
        assert!((1..=64).contains(&per_frame), "1 to 64 slots a frame");
        SlotMap {
            per_frame,
            used: BTreeMap::new(),
            roomy: BTreeSet::new(),
            empty: BTreeSet::new(),
            by_run: BTreeSet::new(),
            free: 0,
        }
    }

    /// Every slot of a frame.
    fn full(&self) -> u64 {
        u64::MAX >> (64 - self.per_frame)
    }

    /// The longest run of free slots in a frame with occupancy `used`.
    pub fn longest_free(&self, used: u64) -> usize {
        let (mut best, mut run) = (0, 0);
        for i in 0..self.per_frame {
            run = if used & (1 << i) == 0 { run + 1 } else { 0 };
            best = best.max(run);
        }
        best
    }

    /// The first run of `slots` free slots in a frame with occupancy `used`.
    pub fn free_run(&self, used: u64, slots: usize) -> Option<usize> {
        (slots <= self.per_frame)
            .then(|| (0..=self.per_frame - slots).find(|&s| used & run_mask(s, slots) == 0))
            .flatten()
    }

    /// The taken slots of `frame`, if it is listed.
    pub fn bits(&self, frame: FrameId) -> Option<u64> {
        self.used.get(&frame).copied()
    }

    /// The one change: `frame` is listed with the taken slots `bits`, or no longer (`None`).
    pub fn set(&mut self, frame: FrameId, bits: Option<u64>) {
        let full = self.full();
        if let Some(old) = self.used.remove(&frame) {
            self.free -= u64::from((full & !old).count_ones());
            self.by_run.remove(&(self.longest_free(old), frame));
            self.roomy.remove(&frame);
            self.empty.remove(&frame);
        }
        if let Some(b) = bits {
            debug_assert_eq!(b & !full, 0, "slots of the frame only");
            self.used.insert(frame, b);
            self.free += u64::from((full & !b).count_ones());
            let run = self.longest_free(b);
            if run > 0 {
                self.by_run.insert((run, frame));
                self.roomy.insert(frame);
            }
            if b == 0 {
                self.empty.insert(frame);
            }
        }
    }

    /// Lists a frame with the slots `taken` (a fresh frame, or one found at mount).
    pub fn add_frame(&mut self, frame: FrameId, taken: u64) {
        debug_assert!(!self.used.contains_key(&frame), "a frame is listed once");
        self.set(frame, Some(taken));
    }

    /// The run is taken (its slots were free).
    pub fn take(&mut self, run: Run) {
        let old = self.used.get(&run.frame).copied().expect("a run's frame is listed");
        debug_assert_eq!(old & run.mask(), 0, "a run goes to free slots");
        self.set(run.frame, Some(old | run.mask()));
    }

    /// The run is free again; returns the slots its frame still has taken.
    pub fn release(&mut self, run: Run) -> u64 {
        let old = self.used.get(&run.frame).copied().expect("a run's frame is listed");
        debug_assert_eq!(old & run.mask(), run.mask(), "a released run was taken");
        let left = old & !run.mask();
        self.set(run.frame, Some(left));
        left
    }

    /// Takes the lowest free slot of the lowest-numbered frame with one (deterministic, and
    /// slots gather in few frames); `None` when every listed frame is full.
    pub fn take_lowest(&mut self) -> Option<Run> {
        let frame = self.lowest_roomy()?;
        let taken = self.bits(frame).expect("roomy frames are listed");
        let run = Run { frame, slot: taken.trailing_ones() as usize, slots: 1 };
        self.take(run);
        Some(run)
    }

    /// The lowest-numbered frame with a free slot.
    pub fn lowest_roomy(&self) -> Option<FrameId> {
        self.roomy.iter().next().copied()
    }

    /// Frames with a free slot, lowest first.
    pub fn roomy(&self) -> impl Iterator<Item = FrameId> + '_ {
        self.roomy.iter().copied()
    }

    /// Frames with no slot taken, lowest first.
    pub fn empty(&self) -> impl Iterator<Item = FrameId> + '_ {
        self.empty.iter().copied()
    }

    /// The frame whose longest free run is the shortest that holds `slots` (best fit).
    pub fn best_fit(&self, slots: usize) -> Option<FrameId> {
        self.by_run.range((slots, FrameId(0))..).next().map(|&(_, f)| f)
    }

    /// Every listed frame, lowest first.
    pub fn frames(&self) -> impl Iterator<Item = FrameId> + '_ {
        self.used.keys().copied()
    }

    pub fn len(&self) -> usize {
        self.used.len()
    }

    pub fn is_empty(&self) -> bool {
        self.used.is_empty()
    }

    /// Free slots in all listed frames.
    pub fn free_slots(&self) -> u64 {
        self.free
    }

    /// S1 (see the type): the indexes agree with the occupancy.
    pub fn check(&self) -> Result<(), String> {
        let full = self.full();
        let roomy: BTreeSet<FrameId> =
            self.used.iter().filter(|&(_, &u)| u != full).map(|(&f, _)| f).collect();
        let empty: BTreeSet<FrameId> =
            self.used.iter().filter(|&(_, &u)| u == 0).map(|(&f, _)| f).collect();
        let by_run: BTreeSet<(usize, FrameId)> = self
            .used
            .iter()
            .map(|(&f, &u)| (self.longest_free(u), f))
            .filter(|&(r, _)| r > 0)
            .collect();
        let free: u64 = self.used.values().map(|&u| u64::from((full & !u).count_ones())).sum();
        if roomy != self.roomy || empty != self.empty || by_run != self.by_run || free != self.free
        {
            return Err(format!("slot map indexes disagree with the occupancy {:?}", self.used));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Any sequence of takes, releases and frame changes leaves the indexes equal to the
    /// occupancy (S1), against a model of plain bit sets.
    #[test]
    fn the_indexes_follow_every_change() {
        for per_frame in [7usize, 8, 16, 64] {
            for seed in 0..20u64 {
                let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
                let mut m = SlotMap::new(per_frame);
                let mut model: BTreeMap<FrameId, u64> = BTreeMap::new();
                for _ in 0..300 {
                    let frame = FrameId(rng.random_range(0..6));
                    match rng.random_range(0..4) {
                        0 if !model.contains_key(&frame) => {
                            m.add_frame(frame, 0);
                            model.insert(frame, 0);
                        }
                        1 if model.contains_key(&frame) => {
                            let slots = rng.random_range(1..=per_frame.min(5));
                            if let Some(slot) = m.free_run(model[&frame], slots) {
                                let run = Run { frame, slot, slots };
                                m.take(run);
                                *model.get_mut(&frame).unwrap() |= run.mask();
                            }
                        }
                        2 if model.get(&frame).is_some_and(|&b| b != 0) => {
                            let slot = model[&frame].trailing_zeros() as usize;
                            let left = m.release(Run { frame, slot, slots: 1 });
                            *model.get_mut(&frame).unwrap() &= !(1 << slot);
                            assert_eq!(left, model[&frame]);
                        }
                        3 => {
                            m.set(frame, None);
                            model.remove(&frame);
                        }
                        _ => {}
                    }
                    m.check().unwrap_or_else(|e| panic!("{per_frame} slots, seed {seed}: {e}"));
                    let full = u64::MAX >> (64 - per_frame);
                    let free: u64 =
                        model.values().map(|&b| u64::from((full & !b).count_ones())).sum();
                    assert_eq!(m.free_slots(), free);
                    assert_eq!(
                        m.empty().collect::<Vec<_>>(),
                        model.iter().filter(|&(_, &b)| b == 0).map(|(&f, _)| f).collect::<Vec<_>>()
                    );
                }
            }
        }
    }

    #[test]
    fn the_lowest_free_slot_of_the_lowest_roomy_frame_is_taken_first() {
        let mut m = SlotMap::new(8);
        m.add_frame(FrameId(9), 0b1);
        m.add_frame(FrameId(4), 0b1111_1111);
        m.add_frame(FrameId(6), 0b101);
        assert_eq!(m.take_lowest(), Some(Run { frame: FrameId(6), slot: 1, slots: 1 }));
        assert_eq!(m.take_lowest(), Some(Run { frame: FrameId(6), slot: 3, slots: 1 }));
        assert_eq!(m.best_fit(4), Some(FrameId(6)), "slots 4..8 free: the shortest run that fits");
        assert_eq!(m.best_fit(5), Some(FrameId(9)));
        assert_eq!(m.best_fit(7), Some(FrameId(9)));
        assert_eq!(m.best_fit(8), None);
    }
}
