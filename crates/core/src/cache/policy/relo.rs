//! `relo` (recency + location), the thesis' policy: inactive dirty pages only, the zone with the
//! largest ASL first (Figure 3.7 (c), `writeback_segment_zone`), then the next zone until the
//! target is met. Recently used pages stay in NVRAM, where they will likely be written again;
//! the pages that go form long runs in one region of the disk.

use super::{DirtyView, Loc, PageKey, Policy, by_zones};

#[derive(Debug, Clone, Copy)]
pub struct Relo;

impl Policy for Relo {
    fn name(&self) -> &'static str {
        "relo"
    }

    fn select(&self, view: &DirtyView, target: usize) -> Vec<(PageKey, Loc)> {
        by_zones(&view.inactive, target)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::cache::policy::{ZoneTable, by_name};

    fn pk(object: u64, index: u64) -> PageKey {
        PageKey { object, index }
    }

    /// A crafted layout: file 1's pages are scattered over zones 0 and 4 and are hot (active)
    /// in zone 6; file 2 is cold and contiguous in zone 6.
    fn view() -> DirtyView {
        let mut v = DirtyView {
            all: ZoneTable::new(16),
            inactive: ZoneTable::new(16),
            ..DirtyView::default()
        };
        let mut file1 = BTreeMap::new();
        let mut file2 = BTreeMap::new();
        // file 1: inactive scattered pages at blocks 1, 5, 9 (zone 0) and 66, 70 (zone 4)
        for (i, b) in [(0, 1), (1, 5), (2, 9), (3, 66), (4, 70)] {
            v.all.add_to_zone(pk(1, i), Loc::Physical(b));
            v.inactive.add_to_zone(pk(1, i), Loc::Physical(b));
            v.inactive_lru.push((pk(1, i), Loc::Physical(b)));
            file1.insert(i, Loc::Physical(b));
        }
        // file 1: active (hot) contiguous pages at blocks 100..104 (zone 6)
        for (i, b) in [(5, 100), (6, 101), (7, 102), (8, 103)] {
            v.all.add_to_zone(pk(1, i), Loc::Physical(b));
            file1.insert(i, Loc::Physical(b));
        }
        // file 2: inactive contiguous pages at blocks 104..108 (zone 6)
        for (i, b) in [(0, 104), (1, 105), (2, 106), (3, 107)] {
            v.all.add_to_zone(pk(2, i), Loc::Physical(b));
            v.inactive.add_to_zone(pk(2, i), Loc::Physical(b));
            v.inactive_lru.push((pk(2, i), Loc::Physical(b)));
            file2.insert(i, Loc::Physical(b));
        }
        v.files = vec![(1, file1), (2, file2)];
        v
    }

    fn blocks(pages: &[(PageKey, Loc)]) -> Vec<u64> {
        pages
            .iter()
            .map(|(_, l)| match l {
                Loc::Physical(b) => *b,
                Loc::Logical { .. } => u64::MAX,
            })
            .collect()
    }

    #[test]
    fn each_policy_selects_as_the_thesis_defines_it() {
        let v = view();
        let table = [
            // file: all of file 1 (first dirty file), in block order.
            ("file", 4, vec![1, 5, 9, 66, 70, 100, 101, 102, 103]),
            // recency: the 4 least recently used inactive pages, wherever they are.
            ("recency", 4, vec![1, 5, 9, 66]),
            // location: zone 6 has ASL 8 (one run of 8, hot pages included): all of it.
            ("location", 4, vec![100, 101, 102, 103, 104, 105, 106, 107]),
            // relo: among inactive pages zone 6 has ASL 4 (file 2's run): only the cold run.
            ("relo", 4, vec![104, 105, 106, 107]),
            // relo with a larger target continues with the next best zone: zones 0 and 4 both
            // have ASL 1; the tie goes to the zone with more dirty pages (zone 0, 3 pages).
            ("relo", 6, vec![1, 5, 9, 104, 105, 106, 107]),
        ];
        for (name, target, expected) in table {
            let policy = by_name(name).unwrap();
            assert_eq!(policy.name(), name);
            assert_eq!(blocks(&policy.select(&v, target)), expected, "{name} target {target}");
        }
    }

    #[test]
    fn unknown_policy_names_are_refused() {
        assert!(by_name("lru").is_none());
    }
}
