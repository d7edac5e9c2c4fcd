//! Write-back of dirty NVRAM pages to the lower file system: the zone information tables and
//! the four policies of the thesis (section 3.1.2, Figure 3.7), as deterministic data
//! structures. The page cache (a later step) feeds them; they only decide *which* pages go.
//!
//! - `zones.rs`: the zone information table, maintained incrementally by `add_to_zone` /
//!   `remove_from_zone` exactly as Figure 3.7 (a) and (b).
//! - `file.rs`, `recency.rs`, `location.rs`, `relo.rs`: the policies, one per file, named as in
//!   the thesis. Each selects at least `target` pages (or all candidates) and returns them in
//!   ascending location order, the order in which a batch is written.

pub mod file;
pub mod location;
pub mod recency;
pub mod relo;
pub mod zones;

use std::collections::{BTreeMap, BTreeSet};

pub use zones::{Loc, ZoneId, ZoneTable};

/// A cached page: the object it belongs to and its page index in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PageKey {
    pub object: u64,
    pub index: u64,
}

/// What a policy sees of the dirty pages.
#[derive(Debug, Default)]
pub struct DirtyView {
    /// Zone table over every dirty page (active and inactive): `location` uses it.
    pub all: ZoneTable,
    /// Zone table over inactive dirty pages only: `relo` uses it (the thesis' table).
    pub inactive: ZoneTable,
    /// Dirty files in the order they first became dirty, with their dirty pages and locations:
    /// `file` uses it (Linux's per-inode write-back).
    pub files: Vec<(u64, BTreeMap<u64, Loc>)>,
    /// Inactive dirty pages, least recently used first: `recency` uses it.
    pub inactive_lru: Vec<(PageKey, Loc)>,
}

/// A write-back policy.
pub trait Policy: std::fmt::Debug + Send + Sync {
    fn name(&self) -> &'static str;
    /// Reads `DirtyView::files` (filled for it before each selection).
    fn uses_files(&self) -> bool {
        false
    }
    /// Reads `DirtyView::inactive_lru`.
    fn uses_lru(&self) -> bool {
        false
    }
    /// Pages to write back now: at least `target` if there are that many candidates, sorted by
    /// location (ascending physical block, then unmapped pages by file and offset).
    fn select(&self, view: &DirtyView, target: usize) -> Vec<(PageKey, Loc)>;
}

/// The policy named on the command line (`--writeback`).
pub(crate) fn by_name(name: &str) -> Option<Box<dyn Policy>> {
    match name {
        "file" => Some(Box::new(file::File)),
        "recency" => Some(Box::new(recency::Recency)),
        "location" => Some(Box::new(location::Location)),
        "relo" => Some(Box::new(relo::Relo)),
        _ => None,
    }
}

/// Takes whole zones, best ASL first, until `target` pages are chosen (shared by `location`
/// and `relo`, which differ only in the table they read).
pub(crate) fn by_zones(table: &ZoneTable, target: usize) -> Vec<(PageKey, Loc)> {
    let mut chosen = Vec::new();
    let mut taken: BTreeSet<ZoneId> = BTreeSet::new();
    while chosen.len() < target {
        let Some(zone) = table.best_zone_excluding(&taken) else { break };
        taken.insert(zone);
        chosen.extend(table.pages_of(zone).map(|(loc, page)| (page, loc)));
    }
    sort_by_location(&mut chosen);
    chosen
}

pub(crate) fn sort_by_location(pages: &mut [(PageKey, Loc)]) {
    pages.sort_by_key(|&(page, loc)| (loc, page));
}
