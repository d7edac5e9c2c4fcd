//! The zone information table (thesis 3.1.2, 3.2.1, Figure 3.7).
//!
//! The lower device is divided into zones of `zone_blocks` blocks. For each zone the table
//! records the dirty pages in it, the number of *segments* (maximal runs of contiguous dirty
//! blocks) and so the *average segment length* ASL = dirty pages / segments. Writing back the
//! zone with the largest ASL gives the disk short seeks (one zone) and long sequential runs
//! (little rotational delay).
//!
//! Pages without a physical block (holes, appends not yet allocated by the lower FS) are placed
//! by (file, page index) instead: `Loc::Logical`, with zones of `zone_blocks` pages per file.
//!
//! Maintenance is incremental, exactly as Figure 3.7:
//! - `add_to_zone(page)`: dirty += 1; if neither neighbour block is in the table the page is a
//!   new segment (segments += 1); if both are, it joins two segments into one (segments -= 1);
//!   with one neighbour it extends a segment (unchanged).
//! - `remove_from_zone(page)`: dirty -= 1; no neighbour: a segment disappears (segments -= 1);
//!   both neighbours: a segment splits in two (segments += 1); one: it shrinks (unchanged).
//!
//! Neighbours count only inside the same zone, so segments never cross zone boundaries.
//! Invariants (checked by the model test): Z1 `dirty` equals the number of pages recorded in
//! the zone; Z2 `segments` equals the number of maximal runs of adjacent locations among them;
//! Z3 an empty zone is not kept.

use std::collections::{BTreeMap, BTreeSet};

use super::PageKey;

/// Where a page lives on the lower device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Loc {
    /// Physical block number (FIEMAP), in blocks of the page size.
    Physical(u64),
    /// No physical block yet: ordered by file and page index.
    Logical { object: u64, index: u64 },
}

impl Loc {
    fn prev(self) -> Option<Loc> {
        match self {
            Loc::Physical(b) => b.checked_sub(1).map(Loc::Physical),
            Loc::Logical { object, index } => {
                index.checked_sub(1).map(|index| Loc::Logical { object, index })
            }
        }
    }

    fn next(self) -> Option<Loc> {
        match self {
            Loc::Physical(b) => b.checked_add(1).map(Loc::Physical),
            Loc::Logical { object, index } => {
                index.checked_add(1).map(|index| Loc::Logical { object, index })
            }
        }
    }
}

/// A zone: a range of `zone_blocks` physical blocks, or of pages of one file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ZoneId {
    Physical(u64),
    Logical { object: u64, zone: u64 },
}

/// One zone's entry: the thesis' zone information table row.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ZoneInfo {
    pub dirty_pages: u64,
    pub segments: u64,
    pub pages: BTreeMap<Loc, PageKey>,
}

impl ZoneInfo {
    /// ASL as a fraction (dirty, segments), compared exactly.
    pub(crate) fn asl(&self) -> (u64, u64) {
        (self.dirty_pages, self.segments.max(1))
    }
}

/// See the module docs.
#[derive(Clone, Debug, Default)]
pub struct ZoneTable {
    zone_blocks: u64,
    zones: BTreeMap<ZoneId, ZoneInfo>,
}

impl ZoneTable {
    pub(crate) fn new(zone_blocks: u64) -> ZoneTable {
        assert!(zone_blocks > 0, "a zone holds at least one block");
        ZoneTable { zone_blocks, zones: BTreeMap::new() }
    }

    pub(crate) fn zone_of(&self, loc: Loc) -> ZoneId {
        match loc {
            Loc::Physical(b) => ZoneId::Physical(b / self.zone_blocks),
            Loc::Logical { object, index } => {
                ZoneId::Logical { object, zone: index / self.zone_blocks }
            }
        }
    }

    fn present_in(&self, zone: ZoneId, loc: Option<Loc>) -> bool {
        loc.is_some_and(|l| {
            self.zone_of(l) == zone
                && self.zones.get(&zone).is_some_and(|z| z.pages.contains_key(&l))
        })
    }

    /// Figure 3.7 (a). Panics if the location is already recorded (a page is dirty once).
    pub(crate) fn add_to_zone(&mut self, page: PageKey, loc: Loc) {
        let zone = self.zone_of(loc);
        let before = self.present_in(zone, loc.prev());
        let after = self.present_in(zone, loc.next());
        let info = self.zones.entry(zone).or_default();
        assert!(info.pages.insert(loc, page).is_none(), "location {loc:?} recorded twice");
        info.dirty_pages += 1;
        match (before, after) {
            (false, false) => info.segments += 1,
            (true, true) => info.segments -= 1,
            _ => {}
        }
    }

    /// Figure 3.7 (b). Returns false if the location was not recorded.
    pub(crate) fn remove_from_zone(&mut self, loc: Loc) -> bool {
        let zone = self.zone_of(loc);
        let before = self.present_in(zone, loc.prev());
        let after = self.present_in(zone, loc.next());
        let Some(info) = self.zones.get_mut(&zone) else { return false };
        if info.pages.remove(&loc).is_none() {
            return false;
        }
        info.dirty_pages -= 1;
        match (before, after) {
            (false, false) => info.segments -= 1,
            (true, true) => info.segments += 1,
            _ => {}
        }
        if info.dirty_pages == 0 {
            debug_assert_eq!(info.segments, 0);
            self.zones.remove(&zone);
        }
        true
    }

    #[cfg(any(test, debug_assertions))]
    pub(crate) fn zone(&self, zone: ZoneId) -> Option<&ZoneInfo> {
        self.zones.get(&zone)
    }

    #[cfg(test)]
    pub(crate) fn zones(&self) -> impl Iterator<Item = (&ZoneId, &ZoneInfo)> {
        self.zones.iter()
    }

    /// Whether `loc` is recorded.
    pub(crate) fn contains(&self, loc: Loc) -> bool {
        self.zones.get(&self.zone_of(loc)).is_some_and(|z| z.pages.contains_key(&loc))
    }

    #[cfg(any(test, debug_assertions))]
    pub(crate) fn dirty_pages(&self) -> u64 {
        self.zones.values().map(|z| z.dirty_pages).sum()
    }

    /// The zone with the largest ASL not in `exclude`; ties go to the zone with more dirty
    /// pages, then the lowest zone (deterministic).
    pub(crate) fn best_zone_excluding(&self, exclude: &BTreeSet<ZoneId>) -> Option<ZoneId> {
        self.zones
            .iter()
            .filter(|(id, _)| !exclude.contains(id))
            .max_by(|(ida, a), (idb, b)| {
                let (da, sa) = a.asl();
                let (db, sb) = b.asl();
                (u128::from(da) * u128::from(sb))
                    .cmp(&(u128::from(db) * u128::from(sa)))
                    .then(a.dirty_pages.cmp(&b.dirty_pages))
                    .then(idb.cmp(ida))
            })
            .map(|(id, _)| *id)
    }

    pub(crate) fn pages_of(&self, zone: ZoneId) -> impl Iterator<Item = (Loc, PageKey)> + '_ {
        self.zones.get(&zone).into_iter().flat_map(|z| z.pages.iter().map(|(l, p)| (*l, *p)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn page(i: u64) -> PageKey {
        PageKey { object: 1, index: i }
    }

    /// The straightforward model: recompute dirty pages and segments from the set of blocks.
    fn model(blocks: &BTreeSet<u64>, zone_blocks: u64) -> BTreeMap<u64, (u64, u64)> {
        let mut zones: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
        for &b in blocks {
            let z = b / zone_blocks;
            let e = zones.entry(z).or_default();
            e.0 += 1;
            let starts_run = b % zone_blocks == 0 || !blocks.contains(&(b - 1));
            if starts_run {
                e.1 += 1;
            }
        }
        zones
    }

    #[test]
    fn random_adds_and_removes_match_the_model() {
        for seed in 0..40 {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let zone_blocks = rng.random_range(1..=16);
            let mut table = ZoneTable::new(zone_blocks);
            let mut blocks = BTreeSet::new();
            for _ in 0..400 {
                let b = rng.random_range(0..120u64);
                if blocks.contains(&b) {
                    assert!(table.remove_from_zone(Loc::Physical(b)));
                    blocks.remove(&b);
                } else {
                    table.add_to_zone(page(b), Loc::Physical(b));
                    blocks.insert(b);
                }
                let expected = model(&blocks, zone_blocks);
                let got: BTreeMap<u64, (u64, u64)> = table
                    .zones()
                    .map(|(id, z)| {
                        let ZoneId::Physical(n) = id else { panic!("logical zone") };
                        (*n, (z.dirty_pages, z.segments))
                    })
                    .collect();
                assert_eq!(got, expected, "seed {seed}, zone_blocks {zone_blocks}");
                for (_, z) in table.zones() {
                    assert_eq!(z.dirty_pages, z.pages.len() as u64, "Z1");
                }
            }
        }
    }

    #[test]
    fn thesis_figure_3_4_zone_6_beats_zone_4() {
        // Two zones of 16 blocks with 7 dirty pages each: zone 4 scattered in 4 segments,
        // zone 6 in 2 segments. Zone 6 has the larger ASL (3.5 > 1.75) and is chosen.
        let mut table = ZoneTable::new(16);
        for b in [64, 66, 67, 70, 71, 75, 76] {
            table.add_to_zone(page(b), Loc::Physical(b));
        }
        for b in [96, 97, 98, 99, 104, 105, 106] {
            table.add_to_zone(page(b), Loc::Physical(b));
        }
        assert_eq!(table.zone(ZoneId::Physical(4)).unwrap().segments, 4);
        assert_eq!(table.zone(ZoneId::Physical(6)).unwrap().segments, 2);
        assert_eq!(table.best_zone_excluding(&BTreeSet::new()), Some(ZoneId::Physical(6)));
    }

    #[test]
    fn unmapped_pages_form_segments_by_file_and_offset() {
        let mut table = ZoneTable::new(8);
        for i in [0, 1, 2, 5] {
            table
                .add_to_zone(PageKey { object: 9, index: i }, Loc::Logical { object: 9, index: i });
        }
        table.add_to_zone(PageKey { object: 8, index: 3 }, Loc::Logical { object: 8, index: 3 });
        let z = table.zone(ZoneId::Logical { object: 9, zone: 0 }).unwrap();
        assert_eq!((z.dirty_pages, z.segments), (4, 2));
        assert!(table.remove_from_zone(Loc::Logical { object: 9, index: 1 }));
        let z = table.zone(ZoneId::Logical { object: 9, zone: 0 }).unwrap();
        assert_eq!((z.dirty_pages, z.segments), (3, 3), "removing the middle splits a segment");
    }

    #[test]
    fn segments_do_not_cross_zone_boundaries() {
        let mut table = ZoneTable::new(4);
        table.add_to_zone(page(3), Loc::Physical(3));
        table.add_to_zone(page(4), Loc::Physical(4));
        assert_eq!(table.zone(ZoneId::Physical(0)).unwrap().segments, 1);
        assert_eq!(table.zone(ZoneId::Physical(1)).unwrap().segments, 1);
    }
}
