//! Frames and their descriptors: the bounded allocator of 4 KiB NVRAM frames.
//!
//! Descriptor format (32 bytes at `layout.descriptor_offset(frame)`):
//!
//! ```text
//!  0   4  state: 0 = free, 1 = allocated
//!  4   4  kind: what the frame holds (defined by the layer above; 0 = unspecified)
//!  8   8  owner: the object it belongs to (layer above)
//! 16   8  index: its position in the owner (e.g. page number)
//! 24   8  XXH3-64 of bytes 0..24
//! ```
//! A free descriptor is 32 zero bytes (so a freshly created region file is all free without
//! writing the area). Any other content must carry state 1 and a matching checksum: a flipped
//! bit is reported as damage to that descriptor.
//!
//! The descriptors are the only persistent allocator state; the free list is volatile and is
//! rebuilt from them at open (after rollback), in ascending frame order so that allocation is
//! deterministic for a given history. Allocation and free change the descriptor inside the
//! transaction, after snapshotting it: recovery therefore undoes both (F1). A frame freed by a
//! transaction keeps its contents and is not handed out again until that transaction commits
//! (F2), because a rollback revives it. A frame allocated by a transaction needs no snapshot of
//! its contents (F3): if the transaction rolls back the frame is free and its bytes mean nothing.

use std::collections::BTreeSet;

use nvram::checksum::checksum;
use nvram::layout::{DESCRIPTOR_SIZE, Layout, get_u32, get_u64, put_u32, put_u64};
use nvram::{Area, Error, Region};

/// Index of a frame in the frame area.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct FrameId(pub u64);

/// What a frame holds, recorded in its descriptor so that the layers above can rebuild their
/// volatile indexes at open.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, serde::Serialize)]
pub struct FrameTag {
    pub kind: u32,
    pub owner: u64,
    pub index: u64,
}

const STATE_ALLOCATED: u32 = 1;

/// A frame descriptor's byte table (docs/design.md section 4).
pub const DESCRIPTOR_LAYOUT: &[nvram::layout::Field] =
    &[(0, 4, "state"), (4, 4, "kind"), (8, 8, "owner"), (16, 8, "index"), (24, 8, "checksum")];

const _: () = assert!(nvram::layout::contiguous(DESCRIPTOR_LAYOUT, DESCRIPTOR_SIZE as usize));

/// Encodes the descriptor of an allocated frame.
pub fn encode_allocated(tag: FrameTag) -> [u8; DESCRIPTOR_SIZE as usize] {
    let mut d = [0u8; DESCRIPTOR_SIZE as usize];
    put_u32(&mut d, 0, STATE_ALLOCATED);
    put_u32(&mut d, 4, tag.kind);
    put_u64(&mut d, 8, tag.owner);
    put_u64(&mut d, 16, tag.index);
    let sum = checksum(&[&d[..24]]);
    put_u64(&mut d, 24, sum);
    d
}

/// The descriptor of a free frame.
pub const FREE_DESCRIPTOR: [u8; DESCRIPTOR_SIZE as usize] = [0; DESCRIPTOR_SIZE as usize];

/// Decodes one descriptor: `None` when free, the tag when allocated, damage otherwise.
pub fn decode(frame: u64, d: &[u8]) -> Result<Option<FrameTag>, Error> {
    if d.iter().all(|&b| b == 0) {
        return Ok(None);
    }
    if get_u32(d, 0) != STATE_ALLOCATED || checksum(&[&d[..24]]) != get_u64(d, 24) {
        return Err(Error::corrupt(
            Area::Descriptor(frame),
            "neither free (all zero) nor a valid allocated descriptor (checksum mismatch)",
        ));
    }
    Ok(Some(FrameTag { kind: get_u32(d, 4), owner: get_u64(d, 8), index: get_u64(d, 16) }))
}

/// Reads and verifies every descriptor; returns the tags of allocated frames by frame index.
pub fn scan(region: &dyn Region, layout: &Layout) -> Result<Vec<Option<FrameTag>>, Error> {
    let area = region.read_vec(layout.desc_offset, (layout.nr_frames * DESCRIPTOR_SIZE) as usize);
    area.chunks_exact(DESCRIPTOR_SIZE as usize)
        .enumerate()
        .map(|(i, d)| decode(i as u64, d))
        .collect()
}

/// The volatile free list. Lock rule: one mutex in `Pool` guards it.
///
/// Journal mode splits it in two (docs/design.md 12.3, step A): frames the running group freed
/// (`held`: a fresh allocation must avoid them, J6) and every other free frame (`clean`).
/// Invariant **F4**: `held` is exactly the free frames that a transaction committed in the
/// running group freed; the journal keeps it so (`push_held` for those, `release_held` at the
/// group commit) and every other mode never holds any. So the lowest frame journal mode
/// prefers is `clean`'s first, found in O(log n) however many frames the group freed.
#[derive(Debug)]
pub struct FreeFrames {
    /// Free frame indexes not held; the lowest free frame is handed out first (deterministic
    /// allocation).
    clean: BTreeSet<u64>,
    /// Free frames the running group freed (journal mode only; F4).
    held: BTreeSet<u64>,
    total: u64,
}

impl FreeFrames {
    pub fn from_scan(tags: &[Option<FrameTag>]) -> FreeFrames {
        let clean = (0..tags.len() as u64).filter(|&i| tags[i as usize].is_none()).collect();
        FreeFrames { clean, held: BTreeSet::new(), total: tags.len() as u64 }
    }

    /// The lowest free frame that is not held, else the lowest held one: journal mode prefers
    /// frames that were free when its group began (they need no page copy); in the other
    /// modes nothing is held (F4) and this is the lowest free frame.
    pub fn pop(&mut self) -> Option<u64> {
        self.clean.pop_first().or_else(|| self.held.pop_first())
    }

    /// Returns frames to the free list (after the transaction that freed them committed, or
    /// after the one that allocated them rolled back).
    pub fn push_all(&mut self, frames: &[u64]) {
        for &f in frames {
            self.check_new(f);
            self.clean.insert(f);
        }
    }

    /// `push_all` for frames the running group freed (journal mode, F4).
    pub fn push_held(&mut self, frames: &[u64]) {
        for &f in frames {
            self.check_new(f);
            self.held.insert(f);
        }
    }

    /// The running group committed: no free frame is held any more (F4).
    pub fn release_held(&mut self) {
        // One insert each: `BTreeSet::append` rebuilds the whole set (O(free frames)), and this
        // runs at every group commit - an fsync each in a database's journal.
        for f in std::mem::take(&mut self.held) {
            self.clean.insert(f);
        }
    }

    fn check_new(&self, f: u64) {
        assert!(f < self.total, "frame {f} out of {}", self.total);
        assert!(!self.contains(f), "frame {f} freed twice");
    }

    pub fn free(&self) -> u64 {
        (self.clean.len() + self.held.len()) as u64
    }

    pub fn total(&self) -> u64 {
        self.total
    }

    pub fn contains(&self, frame: u64) -> bool {
        self.clean.contains(&frame) || self.held.contains(&frame)
    }

    /// The held free frames (F4), in ascending order.
    pub fn held(&self) -> impl Iterator<Item = u64> + '_ {
        self.held.iter().copied()
    }

    /// Every free frame, in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        self.clean.union(&self.held).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptor_round_trips_and_detects_every_flip() {
        let tag = FrameTag { kind: 3, owner: 99, index: 7 };
        let d = encode_allocated(tag);
        assert_eq!(decode(0, &d).unwrap(), Some(tag));
        for byte in 0..32 {
            for bit in 0..8 {
                let mut bad = d;
                bad[byte] ^= 1 << bit;
                assert!(decode(0, &bad).is_err(), "byte {byte} bit {bit}");
                let mut bad_free = FREE_DESCRIPTOR;
                bad_free[byte] ^= 1 << bit;
                assert!(decode(0, &bad_free).is_err(), "free: byte {byte} bit {bit}");
            }
        }
    }

    #[test]
    fn free_list_hands_out_lowest_first() {
        let tags = vec![None, Some(FrameTag::default()), None, None];
        let mut free = FreeFrames::from_scan(&tags);
        assert_eq!(free.pop(), Some(0));
        free.push_all(&[0]);
        assert_eq!(
            (free.pop(), free.pop(), free.pop(), free.pop()),
            (Some(0), Some(2), Some(3), None)
        );
    }

    /// F4: held frames are handed out only when no other is free, and a group commit makes
    /// them ordinary free frames again.
    #[test]
    fn held_frames_go_last_until_released() {
        let mut free = FreeFrames::from_scan(&[None, None, None, None, None]);
        let all: Vec<u64> = (0..5).map(|_| free.pop().unwrap()).collect();
        assert_eq!(all, [0, 1, 2, 3, 4]);
        free.push_held(&[0, 3]);
        free.push_all(&[4]);
        assert_eq!(free.iter().collect::<Vec<_>>(), [0, 3, 4]);
        assert_eq!(free.free(), 3);
        assert!(free.contains(0) && free.contains(4) && !free.contains(1));
        assert_eq!(free.pop(), Some(4), "the unheld frame first");
        assert_eq!(free.pop(), Some(0), "then the lowest held one");
        free.push_held(&[0]);
        free.push_all(&[2]);
        free.release_held();
        assert_eq!(free.pop(), Some(0), "released: the lowest free frame again");
        assert_eq!(free.pop(), Some(2));
        assert_eq!(free.pop(), Some(3));
        assert_eq!(free.pop(), None);
    }

    #[test]
    #[should_panic(expected = "freed twice")]
    fn a_frame_held_and_pushed_again_is_refused() {
        let mut free = FreeFrames::from_scan(&[Some(FrameTag::default())]);
        free.push_held(&[0]);
        free.push_all(&[0]);
    }
}
