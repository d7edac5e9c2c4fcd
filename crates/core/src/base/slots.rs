//! The one slot allocator: frames divided into slots, which every packed record kind of the
//! region uses - the temp files' and cached files' records, one to a slot of eight
//! ([`RecordSlots`], below), the metadata journal's redo records, a run of 256-byte slots out of
//! sixteen (`journal/`), and a cached file's patches, a run of 64-byte slots out of 64
//! (`cache/patchframe.rs`) - and the device's NVRAM block cache, a sector to a slot of seven
//! (`crates/device/src/nvcache/`). [`SlotMap`] (`crates/txn/src/slots.rs`, beside the frame
//! allocator) is the volatile occupancy they share: which slots of each frame are taken, which
//! frames have room, which are empty, and the frames by their longest free run; each user
//! keeps its own policy over it (lowest frame first, the open frame first, best fit) and its
//! own invariants of what a free slot holds (zero, or a free entry).
//!
//! Records packed eight to a frame: the temp files' records (`tempfs`, 496 bytes) and the
//! cached files' records (`cache`, 216 bytes), so that a small file costs its data frames and
//! an eighth of a frame, not a whole frame for its record.
//!
//! A *record frame* (each user has its own kind: `tempfs::record::KIND_RECORDS`,
//! `cache::record::KIND_RECORDS`) holds [`SLOTS`] slots of [`SLOT_SIZE`] bytes; a record is
//! written at the start of its slot. Regions written before records were packed hold each
//! record alone at offset 0 of a frame of its own (the users' older kinds); those are read,
//! changed and freed as before ([`WHOLE`]), and new records always go to slots.
//!
//! Invariants (design.md section 10): **T5** every slot of a record frame that no record
//! takes is zero, so that recovery tells a free slot from a damaged record; **T6** a record
//! frame is listed in the volatile [`RecordSlots`] of its user with a taken bit for every slot
//! that holds a committed record or is being written by a running transaction (a
//! *reservation*), so that two transactions never write one slot and a slot is reused only
//! after the transaction that zeroed it committed.
//!
//! Protocol: a new record reserves a free slot (or, when no listed frame has one, allocates a
//! fresh frame inside its transaction, written completely: its record at slot 0, zeros
//! elsewhere) and writes the record there in its transaction; after the commit a fresh frame
//! is listed ([`RecordSlots::add_frame`]), after a rollback the reservation is dropped (the
//! slot is zero again). Removing a record zeroes its slot inside the operation's transaction
//! (T5 holds whether it commits or not); only after the commit is the slot released. A frame
//! left with no record stays listed as room for the next records; a second empty frame is
//! freed (taken off the list first, so nobody reserves in it meanwhile), so at most one empty
//! record frame stays allocated (none after a flush or an unmount that emptied them all). A
//! crash can leave more empty frames: recovery lists them like any other and frees all but
//! one.

use std::sync::atomic::{AtomicU64, Ordering};

use nvram::layout::FRAME_SIZE;
pub use txn::slots::{Run, SlotMap, run_mask};
use txn::{FrameId, FrameTag, Pool, Tx, TxError};

use crate::base::sync::{Mutex, MutexGuard, Rank};

/// Slots a record frame holds.
pub const SLOTS: usize = 8;
/// Bytes a slot takes (a record, then zeros).
pub const SLOT_SIZE: usize = 512;
/// The slot of a record that has a whole frame to itself (regions written before records
/// were packed).
pub const WHOLE: u8 = u8::MAX;
/// Data frames of a record in a slot name it as `PACKED | frame << 3 | slot` (a whole record
/// frame is named by its frame number, below 2^60, as before).
const PACKED: u64 = 1 << 63;

const _: () = {
    assert!(SLOTS * SLOT_SIZE == FRAME_SIZE as usize, "slots fill the frame");
    assert!(SLOTS == 8, "one bit a slot in a u8, three bits of the owner");
};

/// Where a record is. `frame` and `slot` never change for a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Place {
    pub frame: FrameId,
    /// 0..SLOTS, or [`WHOLE`].
    pub slot: u8,
}

impl Place {
    pub(crate) fn whole(frame: FrameId) -> Place {
        Place { frame, slot: WHOLE }
    }

    /// The region offset of the record.
    pub(crate) fn offset(self, pool: &Pool) -> u64 {
        let inside = if self.slot == WHOLE { 0 } else { u64::from(self.slot) * SLOT_SIZE as u64 };
        pool.frame_offset(self.frame) + inside
    }

    /// The owner its data frames' tags name, and the file's identity in volatile maps.
    pub(crate) fn owner(self) -> u64 {
        if self.slot == WHOLE {
            self.frame.0
        } else {
            PACKED | self.frame.0 << 3 | u64::from(self.slot)
        }
    }

    /// The place a data frame's owner names (the inverse of [`Place::owner`]).
    pub(crate) fn from_owner(owner: u64) -> Place {
        if owner & PACKED == 0 {
            Place::whole(FrameId(owner))
        } else {
            Place { frame: FrameId((owner & !PACKED) >> 3), slot: (owner & 7) as u8 }
        }
    }

    /// "frame F" or "frame F slot S": the place a damage report names.
    pub fn describe(self) -> String {
        if self.slot == WHOLE {
            format!("frame {}", self.frame.0)
        } else {
            format!("frame {} slot {}", self.frame.0, self.slot)
        }
    }
}

/// Writes a new record (`bytes`, at most a slot) in `tx`: into `reserved` (a slot
/// [`RecordSlots::reserve`] took), else into slot 0 of a fresh record frame of `kind`. The
/// caller lists a fresh frame after the commit ([`RecordSlots::add_frame`]) or drops the
/// reservation after a rollback.
pub(crate) fn put_new(
    tx: &mut Tx<'_>,
    kind: u32,
    reserved: Option<Place>,
    bytes: &[u8],
) -> Result<Place, TxError> {
    assert!(bytes.len() <= SLOT_SIZE, "a record fits its slot");
    if let Some(place) = reserved {
        let off = place.offset(tx.pool());
        tx.update(off, bytes)?;
        return Ok(place);
    }
    let frame = tx.alloc_frame(FrameTag { kind, owner: 0, index: 0 })?;
    // T5: the whole fresh frame is written now, the other slots zero.
    let mut buf = vec![0u8; FRAME_SIZE as usize];
    buf[..bytes.len()].copy_from_slice(bytes);
    let off = tx.pool().frame_offset(frame);
    tx.write(off, &buf);
    Ok(Place { frame, slot: 0 })
}

/// Rewrites the record at `place` (snapshot first).
pub(crate) fn put(tx: &mut Tx<'_>, place: Place, bytes: &[u8]) -> Result<(), TxError> {
    let off = place.offset(tx.pool());
    tx.update(off, bytes)
}

/// Takes the record of `len` bytes at `place` out of the region in `tx`: a whole frame is
/// freed, a slot is zeroed (T5); its release follows the commit ([`RecordSlots::release`]).
pub(crate) fn remove(tx: &mut Tx<'_>, place: Place, len: usize) -> Result<(), TxError> {
    if place.slot == WHOLE {
        return tx.free_frame(place.frame);
    }
    let off = place.offset(tx.pool());
    tx.update(off, &vec![0u8; len])
}

/// The records of a record frame: the first `len` bytes of every slot that is not all zero
/// (the caller decodes and verifies them), or damage naming the frame and slot: a record of
/// `len` bytes is followed by zeros to the end of its slot (T5).
pub(crate) fn read_frame(
    pool: &Pool,
    frame: FrameId,
    len: usize,
) -> Result<Vec<(Place, Vec<u8>)>, nvram::Error> {
    let mut out = Vec::new();
    for slot in 0..SLOTS as u8 {
        let place = Place { frame, slot };
        let bytes = pool.read_vec(place.offset(pool), SLOT_SIZE);
        if bytes.iter().all(|&b| b == 0) {
            continue; // T5: a free slot
        }
        if bytes[len..].iter().any(|&b| b != 0) {
            return Err(damaged(place, "bytes after the record are not zero (T5)"));
        }
        out.push((place, bytes[..len].to_vec()));
    }
    Ok(out)
}

/// Damage at `place`, named ("frame F slot S: what").
pub(crate) fn damaged(place: Place, what: &str) -> nvram::Error {
    nvram::Error::corrupt(
        nvram::Area::Frame(place.frame.0),
        format!("{}: {what}", place.describe()),
    )
}

/// Record frames found in a region, each with its taken slots (bit i: slot i).
pub type FramesFound = Vec<(FrameId, u8)>;

/// The taken slots of the records `read_frame` found (bit i: slot i).
pub(crate) fn taken(records: &[(Place, Vec<u8>)]) -> u8 {
    records.iter().fold(0, |t, (p, _)| t | 1 << p.slot)
}

/// The volatile list of record frames and their taken slots (T6), over the slot map.
#[derive(Debug)]
pub struct RecordSlots {
    /// Every record frame and its taken slots (bit i: slot i).
    map: SlotMap,
    /// Records alone in a frame of their own ([`WHOLE`], regions written before records were
    /// packed): a frame each.
    whole: u64,
}

impl Default for RecordSlots {
    fn default() -> Self {
        RecordSlots { map: SlotMap::new(SLOTS), whole: 0 }
    }
}

/// A user's [`RecordSlots`] behind its lock (rank `RecordSlots`), with the number of frames it
/// lists published for readers that must not take the lock: the page cache's watermark test
/// after every cached write, and the counters.
///
/// Invariant: whenever the lock is free, [`SlotList::frames`] equals the list's
/// [`RecordSlots::frames`] (every guard stores the count when it drops). A reader racing a
/// change sees the count before or after it; the watermarks are a heuristic, one record frame
/// of difference is harmless.
#[derive(Debug)]
pub struct SlotList {
    list: Mutex<RecordSlots>,
    frames: AtomicU64,
}

/// A held [`SlotList`]: the list itself; publishes its frame count when dropped.
#[derive(Debug)]
pub struct SlotGuard<'a> {
    list: MutexGuard<'a, RecordSlots>,
    frames: &'a AtomicU64,
}

impl Default for SlotList {
    fn default() -> Self {
        SlotList {
            list: Mutex::new(Rank::RecordSlots, RecordSlots::default()),
            frames: AtomicU64::new(0),
        }
    }
}

impl SlotList {
    pub(crate) fn lock(&self) -> SlotGuard<'_> {
        SlotGuard { list: self.list.lock(), frames: &self.frames }
    }

    /// The frames the list held when its lock was last released (no lock taken).
    pub(crate) fn frames(&self) -> u64 {
        self.frames.load(Ordering::Relaxed)
    }
}

impl std::ops::Deref for SlotGuard<'_> {
    type Target = RecordSlots;
    fn deref(&self) -> &RecordSlots {
        &self.list
    }
}

impl std::ops::DerefMut for SlotGuard<'_> {
    fn deref_mut(&mut self) -> &mut RecordSlots {
        &mut self.list
    }
}

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        self.frames.store(self.list.frames(), Ordering::Relaxed);
    }
}

/// What [`RecordSlots::release`] asks of the caller.
#[derive(Debug, PartialEq, Eq)]
pub enum Released {
    Kept,
    /// The frame holds no record and another empty one is listed: it is off the list now;
    /// free it in a transaction of its own (on failure, [`RecordSlots::add_frame`] it back,
    /// empty).
    FreeFrame(FrameId),
}

impl RecordSlots {
    /// Lists a record frame with the slots `taken` (a fresh frame after its commit, or one
    /// found at mount).
    pub(crate) fn add_frame(&mut self, frame: FrameId, taken: u8) {
        self.map.add_frame(frame, u64::from(taken));
    }

    /// Takes a free slot of the lowest-numbered frame with one (records gather in few frames
    /// instead of spreading over all); `None` when every listed frame is full.
    pub(crate) fn reserve(&mut self) -> Option<Place> {
        let frame = self.map.lowest_roomy()?;
        let taken = self.map.bits(frame).expect("roomy frames are listed");
        let slot = taken.trailing_ones() as usize;
        self.map.take(Run { frame, slot, slots: 1 });
        Some(Place { frame, slot: slot as u8 })
    }

    /// A reservation whose transaction rolled back (its slot is zero again).
    pub(crate) fn unreserve(&mut self, place: Place) {
        let _ = self.release(place);
    }

    /// After the transaction that wrote a new record (`put_new` into `reserved`) ended:
    /// `made` is its place if it committed. A fresh frame is listed, a reservation that
    /// rolled back dropped.
    pub(crate) fn settle_new(&mut self, reserved: Option<Place>, made: Option<Place>) {
        match (reserved, made) {
            (None, Some(p)) => self.add_frame(p.frame, 1),
            (Some(p), None) => self.unreserve(p),
            _ => {}
        }
    }

    /// A record found alone in a frame of its own (recovery of an earlier region).
    pub(crate) fn add_whole(&mut self) {
        self.whole += 1;
    }

    /// The slot of a record whose removal committed is free again. See [`Released`].
    pub(crate) fn release(&mut self, place: Place) -> Released {
        if place.slot == WHOLE {
            debug_assert!(self.whole > 0, "a whole-frame record was counted when found");
            self.whole = self.whole.saturating_sub(1); // its frame went in the transaction
            return Released::Kept;
        }
        if self.map.bits(place.frame).is_none() {
            debug_assert!(false, "T6: a released slot's frame is listed");
            return Released::Kept;
        }
        // Another empty frame (this one holds the record until now): the one kept as room.
        let another_empty = self.map.empty().next().is_some();
        let left = self.map.release(Run { frame: place.frame, slot: place.slot.into(), slots: 1 });
        if left != 0 || !another_empty {
            return Released::Kept;
        }
        self.map.set(place.frame, None);
        Released::FreeFrame(place.frame)
    }

    /// Listed frames without a record, all but the first `keep`: taken off the list, for the
    /// caller to free (recovery keeps one after a crash left several; a flush or an unmount,
    /// which transformed every temp file, keeps none).
    pub(crate) fn take_empty(&mut self, keep: usize) -> Vec<FrameId> {
        let gone: Vec<FrameId> = self.map.empty().skip(keep).collect();
        for &f in &gone {
            self.map.set(f, None);
        }
        gone
    }

    /// The frames the records take (`nvstack stat`, the watermarks and the share): the
    /// record frames, and a frame for each record still alone in one.
    pub(crate) fn frames(&self) -> u64 {
        self.map.len() as u64 + self.whole
    }

    /// T6's bookkeeping agrees with itself (the slot map's indexes).
    #[cfg(test)]
    pub(crate) fn check(&self) -> Result<(), String> {
        self.map.check()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_round_trip_and_never_collide() {
        for frame in [0u64, 1, 7, 8, 12_345, (1 << 60) - 1] {
            let whole = Place::whole(FrameId(frame));
            assert_eq!(Place::from_owner(whole.owner()), whole);
            for slot in 0..SLOTS as u8 {
                let p = Place { frame: FrameId(frame), slot };
                assert_eq!(Place::from_owner(p.owner()), p);
                assert_ne!(p.owner(), whole.owner());
            }
        }
    }

    #[test]
    fn slots_are_packed_and_reused_after_release() {
        let mut s = RecordSlots::default();
        assert_eq!(s.reserve(), None, "no frame listed: a fresh one is needed");
        s.add_frame(FrameId(10), 1);
        let got: Vec<u8> = (1..SLOTS).map(|_| s.reserve().unwrap().slot).collect();
        assert_eq!(got, vec![1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(s.reserve(), None, "full");
        assert_eq!(s.release(Place { frame: FrameId(10), slot: 4 }), Released::Kept);
        assert_eq!(s.reserve(), Some(Place { frame: FrameId(10), slot: 4 }));
        s.unreserve(Place { frame: FrameId(10), slot: 4 });
        assert_eq!(
            s.reserve(),
            Some(Place { frame: FrameId(10), slot: 4 }),
            "a dropped reservation"
        );
    }

    #[test]
    fn the_published_frame_count_follows_every_change_once_the_lock_is_released() {
        let list = SlotList::default();
        {
            let mut l = list.lock();
            l.add_frame(FrameId(1), 1);
            l.add_frame(FrameId(2), 0);
            l.add_whole();
            assert_eq!(list.frames(), 0, "published when the guard drops, not before");
        }
        assert_eq!(list.frames(), 3);
        let taken = list.lock().take_empty(0);
        assert_eq!(taken, vec![FrameId(2)]);
        assert_eq!(list.frames(), 2);
        *list.lock() = RecordSlots::default();
        assert_eq!(list.frames(), 0, "a list replaced whole (recovery) is published too");
    }

    #[test]
    fn the_lowest_roomy_frame_fills_first() {
        let mut s = RecordSlots::default();
        s.add_frame(FrameId(30), 0b1111_1110);
        s.add_frame(FrameId(20), 0b0000_0001);
        assert_eq!(s.reserve().unwrap().frame, FrameId(20));
    }

    #[test]
    fn at_most_one_empty_frame_is_kept() {
        let mut s = RecordSlots::default();
        s.add_frame(FrameId(1), 1);
        s.add_frame(FrameId(2), 1);
        assert_eq!(s.release(Place { frame: FrameId(1), slot: 0 }), Released::Kept, "the one kept");
        assert_eq!(
            s.release(Place { frame: FrameId(2), slot: 0 }),
            Released::FreeFrame(FrameId(2)),
            "a second empty frame goes"
        );
        assert_eq!(s.frames(), 1);
        assert_eq!(
            s.reserve(),
            Some(Place { frame: FrameId(1), slot: 0 }),
            "nobody reserves in a frame being freed"
        );
    }

    #[test]
    fn recovery_frees_all_empty_frames_but_one() {
        let mut s = RecordSlots::default();
        for f in 1..=4 {
            s.add_frame(FrameId(f), 0);
        }
        s.add_frame(FrameId(5), 0b10);
        assert_eq!(s.take_empty(1), vec![FrameId(2), FrameId(3), FrameId(4)]);
        assert_eq!(s.frames(), 2);
        assert!(s.take_empty(1).is_empty());
        assert_eq!(s.take_empty(0), vec![FrameId(1)], "a flush keeps none");
        assert_eq!(s.reserve(), Some(Place { frame: FrameId(5), slot: 0 }));
    }

    #[test]
    fn the_lists_agree_with_the_slots_through_any_sequence() {
        use rand::{Rng, SeedableRng};
        for seed in 0..50u64 {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            let mut s = RecordSlots::default();
            let mut taken: Vec<Place> = Vec::new();
            let mut next = 100u64;
            for _ in 0..400 {
                match rng.random_range(0..3) {
                    0 | 1 => {
                        if let Some(p) = s.reserve() {
                            taken.push(p);
                        } else {
                            s.add_frame(FrameId(next), 1); // a fresh frame, committed
                            taken.push(Place { frame: FrameId(next), slot: 0 });
                            next += 1;
                        }
                    }
                    _ if !taken.is_empty() => {
                        let p = taken.swap_remove(rng.random_range(0..taken.len()));
                        if let Released::FreeFrame(f) = s.release(p) {
                            assert!(taken.iter().all(|t| t.frame != f), "a freed frame held none");
                        }
                    }
                    _ => {}
                }
                assert!(s.check().is_ok(), "seed {seed}");
                assert!(s.map.empty().count() <= 1, "at most one empty frame kept");
                let mut seen = std::collections::HashSet::new();
                assert!(taken.iter().all(|p| seen.insert(*p)), "no slot given twice");
            }
        }
    }

    #[test]
    fn whole_frames_are_counted_not_listed() {
        let mut s = RecordSlots::default();
        s.add_whole();
        assert_eq!(s.frames(), 1);
        assert_eq!(s.reserve(), None, "no slot in a whole frame");
        assert_eq!(s.release(Place::whole(FrameId(9))), Released::Kept);
        assert_eq!(s.frames(), 0);
    }

    #[test]
    fn a_new_record_settles_as_its_transaction_ended() {
        let mut s = RecordSlots::default();
        s.settle_new(None, Some(Place { frame: FrameId(4), slot: 0 }));
        let p = s.reserve().unwrap();
        assert_eq!(p, Place { frame: FrameId(4), slot: 1 });
        s.settle_new(Some(p), None); // rolled back
        assert_eq!(s.reserve(), Some(p));
        s.settle_new(None, None); // a fresh frame that rolled back: nothing to list
        assert_eq!(s.frames(), 1);
    }
}
