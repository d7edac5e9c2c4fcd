//! The route profile: the lower files that take the NVRAM path from their first open, kept in
//! NVRAM so that a database file takes it again after a remount (SPFS' per-file profile of
//! synchronous writes, design.md section 14).
//!
//! One *profile record* in a frame of its own, made at the first file learned:
//!
//! | kind | frame | owner | index |
//! |---:|---|---|---|
//! | 0x5250_0001 [`KIND_PROFILE`] ("RP") | the record below | 0 | 0 |
//!
//! Record (little endian, at offset 0 of the frame): the byte table is [`LAYOUT`]. An entry
//! is the XXH3-64 of a file's [`lower::LowerFs::file_handle`] (a handle carries the inode's
//! generation, so a deleted file's entry never names the file that reuses its inode number;
//! 0 = unused); `count` entries are in use; `next` is where the next file is written, over the
//! oldest once all [`CAPACITY`] are in use (a ring: the profile forgets the file learned
//! longest ago). The checksum is XXH3-64 of the bytes before it.
//!
//! Invariants: **R1** the record verifies (magic, checksum, `count <= CAPACITY`, `next <
//! CAPACITY`, exactly `count` non-zero entries); **R2** at most one profile record. The record
//! is only a hint for speed (a lost entry makes one file take passthrough until it is learned
//! again; no data depends on it), but like every NVRAM structure it is rewritten whole inside
//! a transaction and a damaged one is refused with its frame named.

use crate::base::frames;
use nvram::checksum::checksum;
use nvram::layout::{get_u32, get_u64, put_u32, put_u64};

pub const KIND_PROFILE: u32 = frames::PROFILE;

/// Files the profile remembers (the record fills most of one 4 KiB frame).
pub const CAPACITY: usize = 500;
const MAGIC: &[u8; 8] = b"NVSRTP01";
const ENTRIES_OFF: usize = 16;
const SUM_OFF: usize = ENTRIES_OFF + 8 * CAPACITY;
pub const RECORD_SIZE: usize = SUM_OFF + 8;

/// The record's byte table.
pub const LAYOUT: &[nvram::layout::Field] = &[
    (0, 8, "magic"),
    (8, 4, "count"),
    (12, 4, "next"),
    (ENTRIES_OFF, 8 * CAPACITY, "entries"),
    (SUM_OFF, 8, "xxh3-64"),
];

const _: () = {
    assert!(nvram::layout::contiguous(LAYOUT, RECORD_SIZE), "profile record table");
    assert!(RECORD_SIZE <= nvram::layout::FRAME_SIZE as usize, "a record fits its frame");
};

/// The decoded record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Profile {
    pub entries: Vec<u64>,
    pub next: usize,
}

impl Default for Profile {
    fn default() -> Self {
        Profile { entries: vec![0; CAPACITY], next: 0 }
    }
}

/// The entry of a file handle (never 0: 0 marks an unused entry).
pub(crate) fn entry_of(handle: &[u8]) -> u64 {
    checksum(&[b"route", handle]).max(1)
}

impl Profile {
    pub fn count(&self) -> usize {
        self.entries.iter().filter(|&&e| e != 0).count()
    }

    pub(crate) fn contains(&self, entry: u64) -> bool {
        entry != 0 && self.entries.contains(&entry)
    }

    /// Adds `entry` over the oldest when full; false when it was there already.
    pub(crate) fn add(&mut self, entry: u64) -> bool {
        if self.contains(entry) {
            return false;
        }
        self.entries[self.next] = entry;
        self.next = (self.next + 1) % CAPACITY;
        true
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        assert_eq!(self.entries.len(), CAPACITY, "profile entries");
        let mut b = vec![0u8; RECORD_SIZE];
        b[..8].copy_from_slice(MAGIC);
        put_u32(&mut b, 8, self.count() as u32);
        put_u32(&mut b, 12, self.next as u32);
        for (i, &e) in self.entries.iter().enumerate() {
            put_u64(&mut b, ENTRIES_OFF + 8 * i, e);
        }
        let sum = checksum(&[&b[..SUM_OFF]]);
        put_u64(&mut b, SUM_OFF, sum);
        b
    }

    /// Decodes and verifies a record (R1); the error says what is wrong.
    pub(crate) fn decode(b: &[u8]) -> Result<Profile, &'static str> {
        if b.len() < RECORD_SIZE || &b[..8] != MAGIC {
            return Err("route-profile record without its magic");
        }
        if checksum(&[&b[..SUM_OFF]]) != get_u64(b, SUM_OFF) {
            return Err("route-profile record checksum mismatch");
        }
        let (count, next) = (get_u32(b, 8) as usize, get_u32(b, 12) as usize);
        if count > CAPACITY || next >= CAPACITY {
            return Err("route-profile record with count or next out of range");
        }
        let entries: Vec<u64> = (0..CAPACITY).map(|i| get_u64(b, ENTRIES_OFF + 8 * i)).collect();
        let p = Profile { entries, next };
        if p.count() != count {
            return Err("route-profile record whose count disagrees with its entries");
        }
        Ok(p)
    }
}

/// The record found in the region (at mount, by `check` and `inspect`).
#[derive(Debug)]
pub struct Found {
    pub frame: txn::FrameId,
    pub profile: Profile,
}

/// Reads the profile record of the region, if any, and checks R1 and R2. Damage is reported
/// with the frame named.
pub fn scan(pool: &txn::Pool) -> Result<Option<Found>, nvram::Error> {
    let mut found: Option<Found> = None;
    for (frame, tag) in pool.allocated_frames()? {
        if tag.kind != KIND_PROFILE {
            continue;
        }
        let corrupt = |what| nvram::Error::corrupt(nvram::Area::Frame(frame.0), what);
        if found.is_some() {
            return Err(corrupt("a second route-profile record (R2)"));
        }
        let profile = Profile::decode(&pool.read_vec(pool.frame_offset(frame), RECORD_SIZE))
            .map_err(corrupt)?;
        found = Some(Found { frame, profile });
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_wraps_over_the_oldest() {
        let mut p = Profile::default();
        assert_eq!(Profile::decode(&p.encode()).unwrap(), p);
        for i in 1..=CAPACITY as u64 + 3 {
            assert!(p.add(i));
        }
        assert!(!p.add(CAPACITY as u64), "present already");
        assert_eq!(p.count(), CAPACITY);
        assert!(!p.contains(1) && !p.contains(3), "the three oldest were overwritten");
        assert!(p.contains(4) && p.contains(CAPACITY as u64 + 3));
        assert_eq!(p.next, 3);
        assert_eq!(Profile::decode(&p.encode()).unwrap(), p);
    }

    #[test]
    fn damage_is_refused_with_what_is_wrong() {
        let mut p = Profile::default();
        p.add(entry_of(b"handle"));
        let good = p.encode();
        let cases: [(usize, &str); 4] =
            [(0, "magic"), (ENTRIES_OFF + 8, "checksum"), (SUM_OFF, "checksum"), (100, "checksum")];
        for (at, what) in cases {
            let mut b = good.clone();
            b[at] ^= 0x40;
            let e = Profile::decode(&b).unwrap_err();
            assert!(e.contains(what), "byte {at}: {e}");
        }
        // A count that disagrees, with a valid checksum (a bug, not a torn write).
        let mut b = good.clone();
        put_u32(&mut b, 8, 2);
        let sum = checksum(&[&b[..SUM_OFF]]);
        put_u64(&mut b, SUM_OFF, sum);
        assert!(Profile::decode(&b).unwrap_err().contains("count disagrees"));
        put_u32(&mut b, 12, CAPACITY as u32);
        let sum = checksum(&[&b[..SUM_OFF]]);
        put_u64(&mut b, SUM_OFF, sum);
        assert!(Profile::decode(&b).unwrap_err().contains("out of range"));
    }

    #[test]
    fn entries_are_never_zero_and_differ_by_handle() {
        assert_ne!(entry_of(b""), 0);
        assert_ne!(entry_of(b"a"), entry_of(b"b"));
    }
}
