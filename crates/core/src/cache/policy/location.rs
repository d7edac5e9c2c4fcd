//! `location`: the zone with the largest ASL over all dirty pages (active ones too), all of its
//! pages, then the next zone until the target is met (recency ignored).

use super::{DirtyView, Loc, PageKey, Policy, by_zones};

#[derive(Debug, Clone, Copy)]
pub struct Location;

impl Policy for Location {
    fn name(&self) -> &'static str {
        "location"
    }

    fn select(&self, view: &DirtyView, target: usize) -> Vec<(PageKey, Loc)> {
        by_zones(&view.all, target)
    }
}
