//! The running group of journal mode: the volatile half of VM-aware journaling (docs/design.md
//! section 12; the persistent half, the group log, is `journal.rs`).
//!
//! Transactions of journal mode do not log per operation: each joins the running *group*.
//! The first time a group changes a committed page, the page's committed content becomes a
//! retained copy in the group log (the paper's copy-on-write of a protected buffer, with the two
//! copies' roles exchanged because a region page cannot move: the committed version moves to
//! the log, the live page is changed in place). The page stays write-protected in the mapping
//! every component reads: the group's stores reach it through the region's writer
//! (`Region::write_retained`; for `MmapRegion` a second mapping of the file that only that
//! function uses, design.md 12.6), so no page is ever unprotected while journal mode runs - no
//! `mprotect`, no TLB shootdown - and a stray store faults on every page, those the running
//! group changes included. A transaction's commit is volatile (its changes join the group);
//! [`Pool::group_commit`](crate::Pool::group_commit) makes the whole group durable at once.
//!
//! Page states within a group (`GroupState::covered`), and the function for each transition:
//!
//! ```text
//!   committed ──cover() / alloc() (a frame freed in this group)──> logged (copy in the log)
//!   committed ──alloc() (a frame free when the group began)──────> fresh  (no copy needed)
//!   logged, fresh ──commit_group()──> committed
//! ```
//!
//! Invariants (numbered as in docs/design.md 12.3; the steps S, A, T, X, G0-G3 are its too):
//! - J1 a page changes in a group only while it is logged or fresh; a logged page's copy is its
//!   content at the start of the group and is durable before the page changes (`log_pages`
//!   fences before it returns, so before any store reaches the page).
//! - J9 every page of the region is write-protected in the mapping from `start` to a clean
//!   close; stores into it go through `write_retained` only, and only to pages the group
//!   covers (R1) or to the log.
//! - J6 a frame is fresh only if its descriptor said free when the group began: it was not
//!   freed by a transaction committed in this group (`freed`), so a rollback of the group
//!   frees it again and its bytes mean nothing.
//! - J4 the group never holds part of an operation when it commits: `commit_group` runs only
//!   with every undo slot free (`Pool::group_commit` quiesces), and an aborted operation's bytes
//!   were restored from its DRAM undo before it released its slot.
//! - J7 log space: every running transaction holds `credit` entries reserved at `begin`, so a
//!   snapshot never waits for a group commit (which would wait for it); a transaction that
//!   needs more pages than its credit gets `TxError::UndoFull`, as it would in undo mode.
//!
//! Lock order: the pool's slots, then `state`, then the pool's free frames.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use nvram::layout::{Layout, PAGE_SIZE};
use nvram::{Error, Region};

use crate::frames::FreeFrames;
use crate::journal::{self, ENTRY_SIZE, GENERATION_OFFSET, LogGeometry};
use crate::ranges::RangeSet;
use crate::tx::TxError;

/// The paper's (and ext3's) maximum transaction size: a group commits at 32 MiB of changed
/// pages.
pub const GROUP_BYTES_MAX_DEFAULT: u64 = 32 << 20;
/// The paper's (and ext3's) commit interval: 5 s.
pub const GROUP_INTERVAL_NS_DEFAULT: u64 = 5_000_000_000;
/// The fewest log pages a transaction may be granted: root, a descriptor page, two frames.
pub const CREDIT_MIN: u64 = 4;

/// Options of a pool, fixed at open. Only journal mode uses them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct OpenOptions {
    /// A group is due for commit when it has changed this many bytes (whole pages; default
    /// 32 MiB). `begin` commits a group that reached it before starting a transaction. The
    /// group log's capacity (the undo area) bounds a group too.
    pub group_bytes_max: u64,
    /// A group is due for commit this long after it was first seen non-empty by `group_due`
    /// (default 5 s).
    pub group_interval_ns: u64,
    /// Write-protect committed pages between group commits (default on; off measures what
    /// protection costs).
    pub protect: bool,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            group_bytes_max: GROUP_BYTES_MAX_DEFAULT,
            group_interval_ns: GROUP_INTERVAL_NS_DEFAULT,
            protect: true,
        }
    }
}

/// Journal counters (zero in undo and none modes). Names follow the paper: a *record* is a
/// retained copy of a committed page written to the group log (its copy-on-write).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct JournalStats {
    /// Generation of the running group.
    pub generation: u64,
    /// Group commits that made changes durable (since open).
    pub group_commits: u64,
    /// Of those, commits `begin` forced because the group log or the size limit was full (the
    /// journal's checkpoints: log space reclaimed because it ran out).
    pub group_commits_forced: u64,
    /// Operations committed into the running group, not yet durable.
    pub group_operations: u64,
    /// Pages the running group changed (logged and fresh).
    pub group_pages: u64,
    /// Bytes the running group's committed operations stored.
    pub group_bytes: u64,
    /// Entries of the group log in use, and its capacity (pages).
    pub log_entries: u64,
    pub log_capacity: u64,
    /// Log pages reserved for each transaction.
    pub credit_pages: u64,
    /// Records (page copies) written to the group log since open: copy-on-write of a protected
    /// page.
    pub records: u64,
    /// Bytes written to the group log for them (copies and entries).
    pub record_bytes: u64,
    /// Pages of frames that were free when their group began: changed without a copy.
    pub fresh_pages: u64,
    /// Operations, pages and bytes made durable by group commits since open.
    pub operations_committed: u64,
    pub pages_committed: u64,
    pub bytes_committed: u64,
    /// Whether committed pages are write-protected.
    pub protection: bool,
    /// Protect batches and the pages they protected: one, the whole region, at open (no page
    /// is unprotected again before a clean close, J9).
    pub protect_batches: u64,
    pub pages_protected: u64,
    /// Stores transactions made into the group's protected pages through the region's writer
    /// (`write_retained`).
    pub retained_stores: u64,
    /// Stray stores trapped on protected pages (the region's counter).
    pub trapped_writes: u64,
}

/// What one group commit did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct GroupCommit {
    /// Generation of the group committed (0: nothing to commit, or not journal mode).
    pub generation: u64,
    pub operations: u64,
    pub pages: u64,
    pub bytes: u64,
}

/// How a page may change in the running group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cover {
    /// Its committed content is a live copy in the group log.
    Logged,
    /// It is a frame that was free when the group began.
    Fresh,
}

#[derive(Debug)]
struct GroupState {
    generation: u64,
    /// Log entries in use.
    entries: u64,
    /// Entries reserved by running transactions and not yet used (J7).
    reserved: u64,
    /// Pages this group may change, by region offset (J1).
    covered: BTreeMap<u64, Cover>,
    /// Bytes stored by the group's transactions (committed and aborted): persisted at commit.
    dirty: RangeSet,
    /// Frames freed by transactions committed in this group (J6).
    freed: BTreeSet<u64>,
    operations: u64,
    bytes: u64,
    first_seen_ns: Option<u64>,
}

#[derive(Debug, Default)]
struct Counters {
    group_commits: AtomicU64,
    forced: AtomicU64,
    records: AtomicU64,
    record_bytes: AtomicU64,
    fresh_pages: AtomicU64,
    operations: AtomicU64,
    pages: AtomicU64,
    bytes: AtomicU64,
    protect_batches: AtomicU64,
    pages_protected: AtomicU64,
    retained_stores: AtomicU64,
}

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Journal {
    pub(crate) geo: LogGeometry,
    pub(crate) options: OpenOptions,
    /// Log entries reserved per transaction.
    pub(crate) credit: u64,
    /// Committed pages are write-protected.
    protected: bool,
    /// Bytes of the region protected at open (whole pages).
    protect_len: u64,
    state: Mutex<GroupState>,
    counters: Counters,
}

/// The pages that sorted, disjoint `[start, end)` ranges touch, sorted and unique.
pub(crate) fn pages_of(ranges: &[(u64, u64)]) -> Vec<u64> {
    let mut pages: Vec<u64> = Vec::new();
    for &(s, e) in ranges {
        let mut page = s / PAGE_SIZE * PAGE_SIZE;
        while page < e {
            if pages.last() != Some(&page) {
                pages.push(page);
            }
            page += PAGE_SIZE;
        }
    }
    pages
}

impl Journal {
    /// Checks that journal mode fits the region's undo area: every transaction needs at least
    /// `CREDIT_MIN` log pages.
    pub(crate) fn check_geometry(layout: &Layout) -> Result<(), Error> {
        let geo = LogGeometry::of(layout);
        let credit = geo.capacity / u64::from(layout.undo_slots);
        if credit < CREDIT_MIN {
            return Err(Error::BadParameter(format!(
                "journal mode needs at least {CREDIT_MIN} log pages per undo slot: the undo area \
                 ({} slots of {} bytes) holds {} page copies; format with larger undo slots",
                layout.undo_slots, layout.undo_slot_size, geo.capacity
            )));
        }
        Ok(())
    }

    /// The running group of a freshly recovered region in group-log format; protects every
    /// page of the region when asked and possible.
    pub(crate) fn start(
        region: &dyn Region,
        layout: &Layout,
        options: OpenOptions,
    ) -> Result<Journal, Error> {
        Journal::check_geometry(layout)?;
        let geo = LogGeometry::of(layout);
        let generation = journal::read_generation(region, layout)?;
        assert!(generation > 0, "journal started on an area never switched to a group log");
        let protected = options.protect && region.protection_supported();
        let protect_len = region.len() / PAGE_SIZE * PAGE_SIZE;
        let journal = Journal {
            geo,
            options,
            credit: geo.capacity / u64::from(layout.undo_slots),
            protected,
            protect_len,
            state: Mutex::new(GroupState {
                generation,
                entries: 0,
                reserved: 0,
                covered: BTreeMap::new(),
                dirty: RangeSet::new(),
                freed: BTreeSet::new(),
                operations: 0,
                bytes: 0,
                first_seen_ns: None,
            }),
            counters: Counters::default(),
        };
        if protected {
            // Everything is committed state now: superblock, state word, log, data areas.
            region.protect(0, protect_len);
            journal.counters.protect_batches.fetch_add(1, Ordering::Relaxed);
            journal.counters.pages_protected.fetch_add(protect_len / PAGE_SIZE, Ordering::Relaxed);
        }
        Ok(journal)
    }

    /// Makes every page writable again (clean close, drop of the pool).
    pub(crate) fn unprotect_all(&self, region: &dyn Region) {
        if self.protected {
            region.unprotect(0, self.protect_len);
        }
    }

    /// Reserves a transaction's credit (J7); false when the group must commit first: the log
    /// lacks the credit, or the group reached its size limit. Never false for an empty group.
    pub(crate) fn try_reserve(&self) -> bool {
        let mut s = self.state.lock().expect("group lock");
        // With a slot free, at most slots - 1 credits are reserved: an empty group always has
        // room (capacity >= slots x credit).
        let log_ok = s.entries + s.reserved + self.credit <= self.geo.capacity;
        let size_ok = (s.covered.len() as u64) * PAGE_SIZE < self.options.group_bytes_max;
        if log_ok && (size_ok || s.covered.is_empty()) {
            s.reserved += self.credit;
            return true;
        }
        false
    }

    /// Protocol step 1 for `pages` (sorted, unique): copies those not yet covered into the log,
    /// persists the batch, then unprotects them. Charges `credit_left`; fails, changing
    /// nothing, when it does not suffice.
    pub(crate) fn cover(
        &self,
        region: &dyn Region,
        pages: &[u64],
        credit_left: &mut u64,
    ) -> Result<(), TxError> {
        let mut s = self.state.lock().expect("group lock");
        let new: Vec<u64> = pages.iter().copied().filter(|p| !s.covered.contains_key(p)).collect();
        if new.is_empty() {
            return Ok(());
        }
        self.charge(new.len() as u64, credit_left)?;
        self.log_pages(&mut s, region, &new);
        Ok(())
    }

    /// Allocates a frame for a transaction and covers its page: fresh when it was free when the
    /// group began (preferred), else logged like any committed page.
    pub(crate) fn alloc(
        &self,
        region: &dyn Region,
        layout: &Layout,
        frames: &Mutex<FreeFrames>,
        credit_left: &mut u64,
    ) -> Result<u64, TxError> {
        let mut s = self.state.lock().expect("group lock");
        let frame = frames.lock().expect("frames lock").pop().ok_or(TxError::NoFrames)?;
        let page = layout.frame_offset(frame);
        if s.covered.contains_key(&page) {
            return Ok(frame);
        }
        if s.freed.contains(&frame) {
            if let Err(e) = self.charge(1, credit_left) {
                frames.lock().expect("frames lock").push_held(&[frame]);
                return Err(e);
            }
            self.log_pages(&mut s, region, &[page]);
        } else {
            s.covered.insert(page, Cover::Fresh);
            self.counters.fresh_pages.fetch_add(1, Ordering::Relaxed);
        }
        Ok(frame)
    }

    fn charge(&self, pages: u64, credit_left: &mut u64) -> Result<(), TxError> {
        if pages > *credit_left {
            return Err(TxError::UndoFull {
                needed: pages * PAGE_SIZE,
                free: *credit_left * PAGE_SIZE,
                capacity: self.credit * PAGE_SIZE,
            });
        }
        *credit_left -= pages;
        Ok(())
    }

    /// Appends one batch of copies (step S1): copies and both entry tables stored with
    /// `write_retained` (the log stays protected), one fence, then the pages are covered.
    fn log_pages(&self, s: &mut GroupState, region: &dyn Region, pages: &[u64]) {
        let first = s.entries;
        let n = pages.len() as u64;
        assert!(first + n <= self.geo.capacity && n <= s.reserved, "log credit accounting");
        let mut copies = Vec::with_capacity((n * PAGE_SIZE) as usize);
        let mut entries = Vec::with_capacity((n * ENTRY_SIZE) as usize);
        for (k, &page) in pages.iter().enumerate() {
            let copy = region.read_vec(page, PAGE_SIZE as usize);
            let index = first + k as u64;
            entries.extend_from_slice(&journal::encode_entry(page, s.generation, index, &copy));
            copies.extend_from_slice(&copy);
        }
        let copy_off = self.geo.copy_offset(first);
        region.write_retained(copy_off, &copies);
        region.flush(copy_off, copies.len() as u64);
        for table in 0..2 {
            let entry_off = self.geo.entry_offset(table, first);
            region.write_retained(entry_off, &entries);
            region.flush(entry_off, entries.len() as u64);
        }
        // The copies are durable before any of their pages may change (J1, J2).
        region.fence();
        s.entries += n;
        s.reserved -= n;
        for &page in pages {
            s.covered.insert(page, Cover::Logged);
        }
        self.counters.records.fetch_add(n, Ordering::Relaxed);
        self.counters.record_bytes.fetch_add(n * (PAGE_SIZE + 2 * ENTRY_SIZE), Ordering::Relaxed);
    }

    /// A transaction stores `len` bytes at `off` into the group's protected pages (R1 made the
    /// store legal): counted, per page touched.
    pub(crate) fn count_retained(&self, off: u64, len: u64) {
        if self.protected && len > 0 {
            let pages = (off + len - 1) / PAGE_SIZE - off / PAGE_SIZE + 1;
            self.counters.retained_stores.fetch_add(pages, Ordering::Relaxed);
        }
    }

    /// A transaction committed: its changes join the group (nothing is persisted). Frames it
    /// freed are recorded, then return to the free list as held (J6, F4).
    pub(crate) fn commit_tx(
        &self,
        written: &RangeSet,
        freed: &[u64],
        credit_left: u64,
        frames: &Mutex<FreeFrames>,
    ) {
        let mut s = self.state.lock().expect("group lock");
        for (start, end) in written.iter() {
            s.dirty.insert(start, end);
            s.bytes += end - start;
        }
        s.freed.extend(freed.iter().copied());
        frames.lock().expect("frames lock").push_held(freed);
        s.reserved -= credit_left;
        s.operations += 1;
    }

    /// A transaction aborted after restoring its bytes: they are persisted at the next group
    /// commit like any other (some of its stores may have reached the media).
    pub(crate) fn abort_tx(&self, written: &RangeSet, credit_left: u64) {
        let mut s = self.state.lock().expect("group lock");
        for (start, end) in written.iter() {
            s.dirty.insert(start, end);
        }
        s.reserved -= credit_left;
    }

    /// The frames transactions committed in the running group freed (J6).
    pub(crate) fn freed(&self) -> BTreeSet<u64> {
        self.state.lock().expect("group lock").freed.clone()
    }

    /// Frames a transaction allocated return to the free list (it rolled back, or did not
    /// get to write the descriptor): held if the group freed them (F4).
    pub(crate) fn return_frames(&self, returned: &[u64], frames: &Mutex<FreeFrames>) {
        let s = self.state.lock().expect("group lock");
        let (held, clean): (Vec<u64>, Vec<u64>) =
            returned.iter().partition(|f| s.freed.contains(f));
        let mut free = frames.lock().expect("frames lock");
        free.push_held(&held);
        free.push_all(&clean);
    }

    /// Protocol step 2 (G1-G2). The caller guarantees that no transaction runs (G0, J4).
    pub(crate) fn commit_group(
        &self,
        region: &dyn Region,
        layout: &Layout,
        frames: &Mutex<FreeFrames>,
        forced: bool,
    ) -> GroupCommit {
        let mut s = self.state.lock().expect("group lock");
        assert_eq!(s.reserved, 0, "group commit while transactions run");
        let report = GroupCommit {
            generation: s.generation,
            operations: s.operations,
            pages: s.covered.len() as u64,
            bytes: s.bytes,
        };
        if s.entries == 0 && s.dirty.is_empty() && s.covered.is_empty() {
            s.first_seen_ns = None;
            return GroupCommit::default();
        }
        // (G1) every byte the group stored is durable ...
        for (start, end) in s.dirty.iter() {
            region.flush(start, end - start);
        }
        if !s.dirty.is_empty() {
            region.fence();
        }
        if s.entries > 0 {
            let word = layout.undo_offset + GENERATION_OFFSET;
            // (G2) THE COMMIT POINT: once this store is durable, every entry of the group is
            // dead and recovery keeps the group. Through the region's writer, so the log's first
            // page stays read-only: an aligned 8-byte `write_retained` is one store of the word
            // (`MmapRegion`: one aligned atomic store through its writer's mapping, or one
            // `pwrite` the kernel copies whole; `SimRegion` models it word-atomic like
            // `store_u64`).
            region
                .write_retained(word, &journal::encode_generation(s.generation + 1).to_le_bytes());
            region.persist(word, 8);
            s.generation += 1;
        }
        let c = &self.counters;
        c.group_commits.fetch_add(1, Ordering::Relaxed);
        c.forced.fetch_add(u64::from(forced), Ordering::Relaxed);
        c.operations.fetch_add(s.operations, Ordering::Relaxed);
        c.pages.fetch_add(report.pages, Ordering::Relaxed);
        c.bytes.fetch_add(s.bytes, Ordering::Relaxed);
        s.entries = 0;
        s.covered.clear();
        s.dirty.clear();
        s.freed.clear();
        frames.lock().expect("frames lock").release_held();
        s.operations = 0;
        s.bytes = 0;
        s.first_seen_ns = None;
        report
    }

    /// True when the running group should commit: older than the interval (measured from the
    /// first call that saw it non-empty), or at its size limit, or with three quarters of the
    /// log in use.
    pub(crate) fn due(&self, now_ns: u64) -> bool {
        let mut s = self.state.lock().expect("group lock");
        if s.covered.is_empty() && s.operations == 0 {
            s.first_seen_ns = None;
            return false;
        }
        let first = *s.first_seen_ns.get_or_insert(now_ns);
        now_ns.saturating_sub(first) >= self.options.group_interval_ns
            || (s.covered.len() as u64) * PAGE_SIZE >= self.options.group_bytes_max
            || s.entries * 4 >= self.geo.capacity * 3
    }

    pub(crate) fn stats(&self, region: &dyn Region) -> JournalStats {
        let s = self.state.lock().expect("group lock");
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        JournalStats {
            generation: s.generation,
            group_commits: get(&c.group_commits),
            group_commits_forced: get(&c.forced),
            group_operations: s.operations,
            group_pages: s.covered.len() as u64,
            group_bytes: s.bytes,
            log_entries: s.entries,
            log_capacity: self.geo.capacity,
            credit_pages: self.credit,
            records: get(&c.records),
            record_bytes: get(&c.record_bytes),
            fresh_pages: get(&c.fresh_pages),
            operations_committed: get(&c.operations),
            pages_committed: get(&c.pages),
            bytes_committed: get(&c.bytes),
            protection: self.protected,
            protect_batches: get(&c.protect_batches),
            pages_protected: get(&c.pages_protected),
            retained_stores: get(&c.retained_stores),
            trapped_writes: region.counters().trapped_writes,
        }
    }

    /// The durable log agrees with the running group: its live entries are exactly the logged
    /// pages, in order; every page of the data areas and the log's first page are protected
    /// (J9).
    pub(crate) fn check(&self, region: &dyn Region, layout: &Layout) -> Result<(), String> {
        let s = self.state.lock().expect("group lock");
        let live = journal::read_group(region, layout).map_err(|e| e.to_string())?;
        if journal::read_generation(region, layout).map_err(|e| e.to_string())? != s.generation {
            return Err("the generation word differs from the running group's".into());
        }
        if live.len() as u64 != s.entries {
            return Err(format!("{} live log entries, {} expected", live.len(), s.entries));
        }
        let logged: BTreeSet<u64> =
            s.covered.iter().filter(|(_, c)| **c == Cover::Logged).map(|(p, _)| *p).collect();
        let targets: BTreeSet<u64> = live.iter().map(|e| e.target).collect();
        if logged != targets {
            return Err("the live log entries are not the group's logged pages".into());
        }
        if self.protected {
            let data = (layout.desc_offset..layout.frames_offset + layout.nr_frames * PAGE_SIZE)
                .step_by(PAGE_SIZE as usize);
            for page in std::iter::once(nvram::layout::ROOT_OFFSET).chain(data) {
                if !region.is_protected(page) {
                    return Err(format!("page {page} is writable (J9)"));
                }
            }
            if !region.is_protected(layout.undo_offset) {
                return Err("the group log's first page is writable (J9)".into());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_of_ranges() {
        let p = PAGE_SIZE;
        assert_eq!(pages_of(&[(10, 20), (4000, 4200), (9000, 9001)]), vec![0, p, 2 * p]);
    }
}
