//! Absorbing writes into the cache: steps A1-A3 of the protocol (module docs of `mod.rs`).
//!
//! A write is split into chunks of at most `CHUNK_SECTORS` sectors (and at most the capacity),
//! one transaction each. Before a chunk, LRW sectors outside it are destaged until it fits
//! (A1: the paper's destage, one sector at a time); the chunk's sectors are then written into
//! their slots - the sector's own slot if it is resident, else the lowest free slot, else a
//! slot of a frame this transaction allocates (no snapshot needed there: F3) - and the
//! transaction commits (A3). The volatile state (hash, LRW order, free slots) changes only after
//! the commit, so a failed chunk leaves nothing to repair, and the cache stops (`fail`).

use std::collections::BTreeSet;

use txn::FrameTag;

use super::{Backing, CHUNK_SECTORS, NvCache, NvCacheError, Resident, Slot};
use crate::classify::Class;
use crate::nvcache::record::{self, ENTRY_SIZE, Entry, KIND_FRAME, SECTOR};

impl NvCache {
    /// Absorbs whole sectors `(lbn, 512 bytes, class)` (distinct LBNs): durable when this
    /// returns. Chunks of at most `CHUNK_SECTORS` (and at most the capacity) are one
    /// transaction each; LRW sectors are destaged one at a time first while a chunk does not
    /// fit (the paper's destage).
    pub fn absorb(
        &mut self,
        sectors: &[(u64, &[u8], Class)],
        backing: &mut dyn Backing,
    ) -> Result<(), NvCacheError> {
        self.ensure_running()?;
        let chunk_len = CHUNK_SECTORS.min(self.anchor.capacity_sectors as usize).max(1);
        for chunk in sectors.chunks(chunk_len) {
            self.make_room(chunk, backing)?;
            if let Err(e) = self.absorb_chunk(chunk) {
                return self.fail(e);
            }
        }
        Ok(())
    }

    /// A1: destage LRW sectors (not of this chunk, when possible) until the chunk fits.
    fn make_room(
        &mut self,
        chunk: &[(u64, &[u8], Class)],
        backing: &mut dyn Backing,
    ) -> Result<(), NvCacheError> {
        let lbns: BTreeSet<u64> = chunk.iter().map(|s| s.0).collect();
        assert_eq!(lbns.len(), chunk.len(), "absorb of one sector twice in a chunk");
        loop {
            let new = lbns.iter().filter(|l| !self.index.contains_key(l)).count() as u64;
            if self.index.len() as u64 + new <= self.anchor.capacity_sectors {
                return Ok(());
            }
            let victim = self
                .lrw
                .values()
                .copied()
                .find(|l| !lbns.contains(l))
                .or_else(|| self.lrw.values().next().copied())
                .expect("a full cache has a least recently written sector");
            self.destage(&[victim], backing, false)?;
        }
    }

    /// A2-A3.
    fn absorb_chunk(&mut self, chunk: &[(u64, &[u8], Class)]) -> Result<(), NvCacheError> {
        let mut tx = self.pool.begin();
        let mut free = self.free.clone();
        let mut fresh: BTreeSet<u64> = BTreeSet::new();
        let mut placed: Vec<(u64, Slot, u64, Class)> = Vec::with_capacity(chunk.len());
        for (i, &(lbn, data, class)) in chunk.iter().enumerate() {
            assert_eq!(data.len(), SECTOR, "absorb of a partial sector");
            let seq = self.next_seq + i as u64;
            let slot = if let Some(r) = self.index.get(&lbn) {
                r.slot
            } else if let Some(run) = free.take_lowest() {
                Self::slot_of(run)
            } else {
                let frame = tx.alloc_frame(FrameTag { kind: KIND_FRAME, owner: 0, index: 0 })?;
                let base = self.pool.frame_offset(frame);
                tx.write(base, &record::encode_frame_header(frame.0));
                // The header slot's entries start free (F3: a fresh frame needs no snapshot).
                tx.write(base + record::FRAME_HEADER_SIZE as u64, &[0u8; ENTRY_SIZE * 7]);
                fresh.insert(frame.0);
                // The header (slot 0) and slot 1, taken now.
                free.add_frame(frame, 0b11);
                Slot { frame: frame.0, slot: 1 }
            };
            let (e, d) = self.slot_offsets(slot);
            if !fresh.contains(&slot.frame) {
                tx.snapshot(d, SECTOR as u64)?;
                tx.snapshot(e, ENTRY_SIZE as u64)?;
            }
            tx.write(d, data);
            tx.write(e, &Entry { lbn, seq, class }.encode(slot.frame, slot.slot, data));
            placed.push((lbn, slot, seq, class));
        }
        tx.commit(); // THE COMMIT POINT: the chunk is durable; the write may be acknowledged.
        self.free = free;
        self.frames.extend(fresh);
        self.next_seq += chunk.len() as u64;
        let c = &mut self.counters;
        c.transactions += 1;
        for (lbn, slot, seq, class) in placed {
            if let Some(old) = self.index.insert(lbn, Resident { slot, seq, class }) {
                self.lrw.remove(&old.seq);
                c.write_hits += 1;
            }
            self.lrw.insert(seq, lbn);
            c.writes_absorbed += 1;
            *c.absorbed_by_class.entry(class.name()).or_insert(0) += 1;
        }
        debug_assert!(self.index.len() as u64 <= self.anchor.capacity_sectors);
        Ok(())
    }
}
