//! `recency`: only inactive dirty pages, least recently used first (location ignored).

use super::{DirtyView, Loc, PageKey, Policy, sort_by_location};

#[derive(Debug, Clone, Copy)]
pub struct Recency;

impl Policy for Recency {
    fn name(&self) -> &'static str {
        "recency"
    }

    fn uses_lru(&self) -> bool {
        true
    }

    fn select(&self, view: &DirtyView, target: usize) -> Vec<(PageKey, Loc)> {
        let mut chosen: Vec<_> = view.inactive_lru.iter().take(target).copied().collect();
        sort_by_location(&mut chosen);
        chosen
    }
}
