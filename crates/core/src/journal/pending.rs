//! The metadata journal's volatile index of its committed records not yet checkpointed
//! ([`Pending`], behind the journal's lock): where each record lies, the slots of every
//! journal frame, the records in each frame, and the creation records a removal may annul;
//! with the journal's invariants J1-J3 over them ([`Pending::check`]).

use std::collections::{BTreeMap, HashMap};

use txn::FrameId;

use super::record::{Place, SLOTS};
use crate::base::slots::SlotMap;

/// The committed records not yet checkpointed (see `Journal::pending`).
#[derive(Debug)]
pub(super) struct Pending {
    /// Sequence -> where its record is.
    pub(super) records: BTreeMap<u64, Place>,
    /// Every journal frame and the slots its records take (J2: a slot not taken is zero, M6);
    /// freed records' slots are taken again (an annulled creation's, those a checkpoint
    /// zeroed), so a journal of short-lived files does not grow by them.
    pub(super) slots: SlotMap,
    /// Every journal frame -> its records in `records` (J1: a frame is freed when its count
    /// reaches 0, by the next checkpoint; a frame found empty at mount has 0 until the
    /// recovery checkpoint frees it). Its keys are the slot map's frames.
    pub(super) records_in: BTreeMap<FrameId, u32>,
    /// The frame the last record went to: tried first (records of one burst share frames).
    pub(super) open: Option<FrameId>,
    /// Creation records in `records` whose object no later record names (J3): object handle
    /// -> sequence, and back. The removal of such an object's last name annuls its creation
    /// record (see `Journal::journaled_removal`). Bounded by `records`: an entry goes when a
    /// record names its object, when its record is annulled, and when a checkpoint frees it.
    pub(super) creations: HashMap<Vec<u8>, u64>,
    pub(super) created: HashMap<u64, Vec<u8>>,
}

impl Default for Pending {
    fn default() -> Self {
        Pending {
            records: BTreeMap::new(),
            slots: SlotMap::new(SLOTS),
            records_in: BTreeMap::new(),
            open: None,
            creations: HashMap::new(),
            created: HashMap::new(),
        }
    }
}

/// Frames with room looked at for a record that does not fit the open frame, at most (then
/// a new frame): a record of several slots may find no run of them in frames with one free.
const ROOM_SEARCH: usize = 64;

impl Pending {
    /// Free slots for a record of `slots` slots in a frame the journal has: the open frame's,
    /// else those of the first frame with room that has a run of them.
    pub(super) fn find_room(&self, slots: usize) -> Option<(FrameId, usize)> {
        let open = self.open.into_iter();
        open.chain(self.slots.roomy().take(ROOM_SEARCH)).find_map(|f| {
            let taken = self.slots.bits(f)?;
            self.slots.free_run(taken, slots).map(|s| (f, s))
        })
    }

    /// A new journal frame, no slot taken (J2: all zero).
    pub(super) fn add_frame(&mut self, frame: FrameId) {
        self.slots.add_frame(frame, 0);
        self.records_in.insert(frame, 0);
    }

    /// A frame the journal lists no longer (freed).
    pub(super) fn drop_frame(&mut self, frame: FrameId) {
        self.slots.set(frame, None);
        self.records_in.remove(&frame);
        if self.open == Some(frame) {
            self.open = None;
        }
    }

    /// A record now at `place` (its frame is listed).
    pub(super) fn take(&mut self, place: Place) {
        self.slots.take(place);
        *self.records_in.get_mut(&place.frame).expect("a record's frame is listed") += 1;
        self.open = Some(place.frame);
    }

    /// A record `put_record` wrote into `room` (`None`: a new frame) is at `place`.
    pub(super) fn placed(&mut self, place: Place, room: Option<(FrameId, usize)>) {
        if room.is_none() {
            self.add_frame(place.frame);
        }
        self.take(place);
    }

    /// The record at `place` left the journal and its slots were zeroed (M6).
    pub(super) fn release(&mut self, place: Place) {
        if let Some(n) = self.records_in.get_mut(&place.frame) {
            *n -= 1;
            self.slots.release(place);
        }
    }

    /// Frames holding no record (a checkpoint frees them).
    pub(super) fn idle_frames(&self) -> impl Iterator<Item = FrameId> + '_ {
        self.records_in.iter().filter(|&(_, &n)| n == 0).map(|(&f, _)| f)
    }

    /// Records in `frame` (0 for one not listed).
    pub(super) fn records_in(&self, frame: FrameId) -> u32 {
        self.records_in.get(&frame).copied().unwrap_or(0)
    }

    /// `handle` is named by a record after its creation's: that creation can no longer be
    /// annulled.
    pub(super) fn named(&mut self, handle: &[u8]) {
        if let Some(seq) = self.creations.remove(handle) {
            self.created.remove(&seq);
        }
    }

    /// Record `seq` left the journal (checkpointed or annulled).
    pub(super) fn gone(&mut self, seq: u64) {
        if let Some(handle) = self.created.remove(&seq) {
            self.creations.remove(&handle);
        }
    }

    /// The invariants of the volatile journal (checked after every record and checkpoint in
    /// debug builds, `debug_check!`): J1 each listed frame's count is the number of records in
    /// it, and every record's frame is listed; J2 (its volatile side) the slot map lists the
    /// same frames and takes exactly the records' slots (S1 of the map holding too); J3
    /// `creations` and `created` are each other's inverse and name records still pending;
    /// the open frame is listed.
    pub(super) fn check(&self) -> Result<(), String> {
        let mut count: BTreeMap<FrameId, u32> = BTreeMap::new();
        let mut taken: BTreeMap<FrameId, u64> = BTreeMap::new();
        for (seq, p) in &self.records {
            *count.entry(p.frame).or_default() += 1;
            let bits = taken.entry(p.frame).or_default();
            if *bits & p.mask() != 0 {
                return Err(format!("J2: record {seq} overlaps another in frame {}", p.frame.0));
            }
            *bits |= p.mask();
        }
        for (frame, &n) in &self.records_in {
            if count.get(frame).copied().unwrap_or(0) != n {
                return Err(format!(
                    "J1: frame {} counts {n} records, holds {:?}",
                    frame.0,
                    count.get(frame)
                ));
            }
            if self.slots.bits(*frame) != Some(taken.get(frame).copied().unwrap_or(0)) {
                return Err(format!("J2: frame {}'s slots are not its records'", frame.0));
            }
        }
        if let Some(f) = count.keys().find(|f| !self.records_in.contains_key(f)) {
            return Err(format!("J1: a record in frame {} the journal does not list", f.0));
        }
        if self.slots.len() != self.records_in.len() {
            return Err("J2: the slot map and the counts list different frames".into());
        }
        self.slots.check()?;
        if self.creations.len() != self.created.len()
            || self
                .creations
                .iter()
                .any(|(h, seq)| self.created.get(seq) != Some(h) || !self.records.contains_key(seq))
        {
            return Err("J3: the creations and their records disagree".into());
        }
        if self.open.is_some_and(|f| !self.records_in.contains_key(&f)) {
            return Err("the open frame is not listed".into());
        }
        Ok(())
    }
}
