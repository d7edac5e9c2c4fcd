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
#[derive(Debug)]
pub struct FreeFrames {
    /// Free frame indexes; the lowest is handed out first (deterministic allocation).
    free: BTreeSet<u64>,
    total: u64,
}

impl FreeFrames {
    pub fn from_scan(tags: &[Option<FrameTag>]) -> FreeFrames {
        let free = (0..tags.len() as u64).filter(|&i| tags[i as usize].is_none()).collect();
        FreeFrames { free, total: tags.len() as u64 }
    }

    pub fn pop(&mut self) -> Option<u64> {
        self.free.pop_first()
    }

    /// The lowest free frame not in `avoid`, else the lowest free frame (journal mode prefers
    /// frames that were free when the running group began: they need no page copy).
    pub fn pop_avoiding(&mut self, avoid: &BTreeSet<u64>) -> Option<u64> {
        let pick = self.free.iter().copied().find(|f| !avoid.contains(f));
        match pick {
            Some(f) => {
                self.free.remove(&f);
                Some(f)
            }
            None => self.pop(),
        }
    }

    /// Returns frames to the free list (after the transaction that freed them committed, or
    /// after the one that allocated them rolled back).
    pub fn push_all(&mut self, frames: &[u64]) {
        for &f in frames {
            assert!(f < self.total, "frame {f} out of {}", self.total);
            assert!(self.free.insert(f), "frame {f} freed twice");
        }
    }

    pub fn free(&self) -> u64 {
        self.free.len() as u64
    }

    pub fn total(&self) -> u64 {
        self.total
    }

    pub fn contains(&self, frame: u64) -> bool {
        self.free.contains(&frame)
    }

    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        self.free.iter().copied()
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
}
