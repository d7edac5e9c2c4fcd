//! Where a file's patches lie: runs of slots in the file's patch frames (`patch.rs` has the
//! format). Every change happens inside the caller's transaction and under the file's lock,
//! so only one transaction at a time changes a file's patch frames (strict 2PL, `optx.rs`);
//! the volatile map here follows it: [`PatchFrames::begin`] before the transaction's first
//! change, [`PatchFrames::settle`] after it committed or rolled back.
//!
//! Protocol (keeps P6, `patch.rs`):
//! - a new patch goes into the first free run of the frame of the file whose longest free run
//!   is the shortest that fits it (best fit, one lookup in an index by longest free run), else
//!   into a new frame written whole (its patch, then zeros: a fresh frame's bytes are
//!   undefined);
//! - a patch rewritten in place keeps its run if it still fits (the slots it no longer needs
//!   are zeroed), grows into the free slots after it if they are free, else moves;
//! - a patch that leaves NVRAM has its run zeroed, unless it is the frame's last: then the
//!   frame is freed, in the same transaction.
//!
//! Every store is snapshotted first (or lands in a frame this transaction allocated), so a
//! crash before the commit leaves the frame as it was.

use std::collections::BTreeMap;

use txn::{FrameId, FrameTag, Pool, Tx, TxError};

use super::patch::{KIND_PATCHES, SLOT, SLOTS};
use crate::base::slots::{SlotMap, run_mask};

/// Where a patch lies: `slots` slots from `slot` on, in `frame` (the one slot allocator's run).
pub use crate::base::slots::Run as Place;

/// What to restore on rollback, newest last.
#[derive(Debug)]
enum Undo {
    At(u64, Option<Place>),
    Used(FrameId, Option<u64>),
}

/// The patch frames of one file: where each patched page's patch lies and which slots of each
/// frame are taken.
#[derive(Debug)]
pub struct PatchFrames {
    at: BTreeMap<u64, Place>,
    /// Occupied slots per frame (bit i = slot i); never 0 (an empty frame is freed).
    used: SlotMap,
    /// Changes of the running transaction (`begin` .. `settle`).
    undo: Vec<Undo>,
    frames_at_begin: usize,
    /// Patches of the running transaction that outgrew their run and moved.
    moved: u64,
}

/// What a settled transaction did to a file's patch frames (for the `nbw` counters).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Settled {
    /// Change in the number of patch frames.
    pub frames: i64,
    /// Patches moved to another run (0 when rolled back).
    pub moved: u64,
}

impl Default for PatchFrames {
    fn default() -> Self {
        PatchFrames {
            at: BTreeMap::new(),
            used: SlotMap::new(SLOTS),
            undo: Vec::new(),
            frames_at_begin: 0,
            moved: 0,
        }
    }
}

/// Stores `new` (whole slots) at `off` like `tx.update`, but snapshots and writes only the
/// runs of slots whose bytes change. A patch growing by a small write is re-encoded whole,
/// yet only its header's slot, its last range and the slots of the new bytes differ: a
/// 128-byte sequential write to a half-covered page changed ~3 slots and re-wrote ~32.
/// Slot granularity keeps the comparison a `memcmp` per 64 bytes, the size of a cache line
/// flushed anyway. The bytes at `off` are `new` afterwards either way.
fn update_changed_slots(tx: &mut Tx<'_>, pool: &Pool, off: u64, new: &[u8]) -> Result<(), TxError> {
    debug_assert!(new.len() % SLOT == 0 && new.len() <= SLOTS * SLOT);
    let mut old = [0u8; SLOTS * SLOT];
    let old = &mut old[..new.len()];
    pool.read(off, old);
    let differs = |i: usize| old[i * SLOT..(i + 1) * SLOT] != new[i * SLOT..(i + 1) * SLOT];
    let slots = new.len() / SLOT;
    let mut i = 0;
    while i < slots {
        if !differs(i) {
            i += 1;
            continue;
        }
        let start = i;
        while i < slots && differs(i) {
            i += 1;
        }
        tx.update(off + (start * SLOT) as u64, &new[start * SLOT..i * SLOT])?;
    }
    Ok(())
}

impl PatchFrames {
    /// The map of patches found at start (`recovery.rs`), already verified (P6).
    pub fn found(patches: impl IntoIterator<Item = (u64, Place)>) -> PatchFrames {
        let mut pf = PatchFrames::default();
        let mut used: BTreeMap<FrameId, u64> = BTreeMap::new();
        for (page, place) in patches {
            pf.at.insert(page, place);
            *used.entry(place.frame).or_insert(0) |= place.mask();
        }
        for (frame, bits) in used {
            pf.used.add_frame(frame, bits);
        }
        pf
    }

    pub fn place(&self, page: u64) -> Option<Place> {
        self.at.get(&page).copied()
    }

    /// The frames holding patches.
    pub fn frames(&self) -> impl Iterator<Item = FrameId> + '_ {
        self.used.frames()
    }

    /// The frame with the shortest longest free run that still holds `slots` slots.
    fn best_fit(&self, slots: usize) -> Option<FrameId> {
        self.used.best_fit(slots)
    }

    /// Whether `put` of a patch of `slots` slots for `page` needs no new frame: it stays in
    /// (or grows into the free slots after) the page's run, or fits a frame the file has.
    pub(crate) fn holds(&self, page: u64, slots: usize) -> bool {
        self.place(page).is_some_and(|old| self.in_place(old, slots))
            || self.best_fit(slots).is_some()
    }

    /// Whether a patch at `old` rewritten to `slots` slots stays in its run or grows into the
    /// free slots after it.
    fn in_place(&self, old: Place, slots: usize) -> bool {
        let used = self.used.bits(old.frame).expect("a patch's frame is listed");
        slots <= old.slots
            || (old.slot + slots <= SLOTS && used & run_mask(old.slot, slots) & !old.mask() == 0)
    }

    /// Patches placed.
    pub(crate) fn len(&self) -> usize {
        self.at.len()
    }

    pub fn frame_count(&self) -> usize {
        self.used.len()
    }

    /// Before the first change of a transaction.
    pub fn begin(&mut self) {
        debug_assert!(self.undo.is_empty(), "a transaction left its changes unsettled");
        self.undo.clear();
        self.frames_at_begin = self.used.len();
        self.moved = 0;
    }

    /// After the transaction ended: its changes stay (`committed`) or are undone.
    pub fn settle(&mut self, committed: bool) -> Settled {
        if !committed {
            while let Some(u) = self.undo.pop() {
                match u {
                    Undo::At(page, Some(p)) => {
                        self.at.insert(page, p);
                    }
                    Undo::At(page, None) => {
                        self.at.remove(&page);
                    }
                    Undo::Used(f, old) => self.set_used(f, old),
                }
            }
        }
        self.undo.clear();
        let (now, before) = (self.used.len(), self.frames_at_begin);
        // A file holds far fewer frames than i64::MAX.
        let frames = i64::try_from(now).expect("frames") - i64::try_from(before).expect("frames");
        Settled { frames, moved: if committed { std::mem::take(&mut self.moved) } else { 0 } }
    }

    fn set_used(&mut self, frame: FrameId, bits: Option<u64>) {
        self.used.set(frame, bits);
    }

    fn change_used(&mut self, frame: FrameId, bits: Option<u64>) {
        self.undo.push(Undo::Used(frame, self.used.bits(frame)));
        self.set_used(frame, bits);
    }

    fn change_at(&mut self, page: u64, place: Option<Place>) {
        let old = match place {
            Some(p) => self.at.insert(page, p),
            None => self.at.remove(&page),
        };
        self.undo.push(Undo::At(page, old));
    }

    /// Stores `entry` (an encoded patch of `page`, a whole number of slots) as the page's
    /// patch: in place, grown, moved or new (see the module docs). `owner` is the file's
    /// record frame.
    pub fn put(
        &mut self,
        tx: &mut Tx<'_>,
        pool: &Pool,
        owner: u64,
        page: u64,
        entry: &[u8],
    ) -> Result<Place, TxError> {
        debug_assert!(entry.len() % SLOT == 0 && !entry.is_empty() && entry.len() <= SLOTS * SLOT);
        let slots = entry.len() / SLOT;
        let at = |p: Place| pool.frame_offset(p.frame) + (p.slot * SLOT) as u64;
        if let Some(old) = self.place(page) {
            let used = self.used.bits(old.frame).expect("a patch's frame is listed");
            let grown = Place { slots, ..old };
            if self.in_place(old, slots) {
                // Over the old run (and the free slots it grows into): the entry, then zeros
                // for the slots it no longer needs.
                let mut bytes = entry.to_vec();
                bytes.resize(slots.max(old.slots) * SLOT, 0);
                update_changed_slots(tx, pool, at(old), &bytes)?;
                self.change_used(old.frame, Some(used & !old.mask() | grown.mask()));
                self.change_at(page, Some(grown));
                return Ok(grown);
            }
            self.remove(tx, pool, page)?;
            self.moved += 1;
        }
        let candidate = self.best_fit(slots).map(|f| {
            let bits = self.used.bits(f).expect("a fitting frame is listed");
            let slot = self.used.free_run(bits, slots).expect("the index says it fits");
            (f, slot)
        });
        let place = if let Some((frame, slot)) = candidate {
            let place = Place { frame, slot, slots };
            // The run is zero (P6): snapshotted, so a crash leaves it zero.
            tx.update(at(place), entry)?;
            place
        } else {
            let tag = FrameTag { kind: KIND_PATCHES, owner, index: 0 };
            let frame = tx.alloc_frame(tag)?;
            let mut bytes = entry.to_vec();
            bytes.resize(SLOTS * SLOT, 0);
            tx.write(pool.frame_offset(frame), &bytes);
            Place { frame, slot: 0, slots }
        };
        let used = self.used.bits(place.frame).unwrap_or(0);
        self.change_used(place.frame, Some(used | place.mask()));
        self.change_at(page, Some(place));
        Ok(place)
    }

    /// The page's patch leaves NVRAM: its run zeroed, or its frame freed if it was the last.
    pub fn remove(&mut self, tx: &mut Tx<'_>, pool: &Pool, page: u64) -> Result<(), TxError> {
        let place = self.place(page).expect("removing a patch that is not there");
        let left = self.used.bits(place.frame).expect("a patch's frame is listed") & !place.mask();
        if left == 0 {
            tx.free_frame(place.frame)?;
            self.change_used(place.frame, None);
        } else {
            let off = pool.frame_offset(place.frame) + (place.slot * SLOT) as u64;
            tx.update(off, &vec![0u8; place.slots * SLOT])?;
            self.change_used(place.frame, Some(left));
        }
        self.change_at(page, None);
        Ok(())
    }

    /// Frees every patch frame (the file's record goes, `drop_cached`).
    pub(crate) fn free_all(&mut self, tx: &mut Tx<'_>) -> Result<(), TxError> {
        let frames: Vec<FrameId> = self.frames().collect();
        for f in frames {
            tx.free_frame(f)?;
            self.change_used(f, None);
        }
        let pages: Vec<u64> = self.at.keys().copied().collect();
        for page in pages {
            self.change_at(page, None);
        }
        Ok(())
    }

    /// Checks the map against itself (tests): every place's bits are set in its frame's
    /// occupancy, no two places overlap, and every occupied bit belongs to a place.
    pub fn check(&self) -> Result<(), String> {
        let mut seen: BTreeMap<FrameId, u64> = BTreeMap::new();
        for (&page, p) in &self.at {
            let bits = seen.entry(p.frame).or_insert(0);
            if *bits & p.mask() != 0 {
                return Err(format!(
                    "patch of page {page} overlaps another in frame {}",
                    p.frame.0
                ));
            }
            *bits |= p.mask();
        }
        let used: BTreeMap<FrameId, u64> =
            self.used.frames().map(|f| (f, self.used.bits(f).unwrap_or(0))).collect();
        if seen != used {
            return Err(format!("patch frame occupancy {used:?} but places {seen:?}"));
        }
        self.used.check()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_and_masks() {
        let m = SlotMap::new(SLOTS);
        assert_eq!(run_mask(0, 64), u64::MAX);
        assert_eq!(run_mask(3, 2), 0b11000);
        assert_eq!(m.free_run(0b111, 2), Some(3));
        assert_eq!(m.free_run(u64::MAX >> 1, 1), Some(63));
        assert_eq!(m.free_run(u64::MAX >> 1, 2), None);
        assert_eq!(m.free_run(0, 64), Some(0));
        assert_eq!(m.longest_free(0), 64);
        assert_eq!(m.longest_free(u64::MAX), 0);
        assert_eq!(m.longest_free(0b1000_0001), 56);
        assert_eq!(m.longest_free(!0b0111_1110), 6);
        assert_eq!(m.longest_free(!(0b111 << 40)), 3);
    }
}
