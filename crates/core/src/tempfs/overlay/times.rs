//! Pending directory times: the mtime and ctime that temp-file changes gave a lower directory,
//! kept in NVRAM instead of being written to the lower directory at once (a temp-file create,
//! unlink or rename must cost no lower IO: that is TempFFS' promise).
//!
//! One *directory-times record* per lower directory with pending times, in a frame of its own:
//!
//! | kind | frame | owner | index |
//! |---:|---|---|---|
//! | 0x5446_0003 [`KIND_DIR_TIMES`] | the record below | 0 | 0 |
//!
//! Record (little endian, at offset 0 of the frame; the rest of the frame is unused): the
//! byte table is [`LAYOUT`] (design.md section 10 shows it; a test keeps the two equal). Times
//! are seconds (i64), nanoseconds (u32) and 4 zero bytes; the handle (1..=132 bytes) is the
//! directory's (`LowerFs::dir_handle`); the checksum is XXH3-64 of the bytes before it.
//!
//! The directory's times as the mount shows them are the later of the lower directory's own
//! and the record's (a change made in the lower directory since is newer). Invariants: **P1**
//! every record verifies (magic, checksum, handle length); **P2** at most one record per
//! directory. Every change rewrites the whole record inside the transaction of the temp-file
//! operation that changed the directory, so a crash keeps the directory's times with the
//! change. The records are *settled* (the times written to the lower directory where they are
//! later, one `syncfs`, then one transaction frees them) at mount, `nvstack flush`, unmount,
//! and when more than [`MAX_RECORDS`] directories have pending times.

use crate::base::frames;
use nvram::checksum::checksum;
use nvram::layout::{get_u32, get_u64, put_u32, put_u64};

pub const KIND_DIR_TIMES: u32 = frames::DIR_TIMES;

pub const RECORD_SIZE: usize = 192;
const MAGIC: &[u8; 8] = b"NVSDIR01";
pub const MAX_HANDLE: usize = lower::MAX_DIR_HANDLE;
const MTIME_OFF: usize = 16;
const CTIME_OFF: usize = 32;
const HANDLE_OFF: usize = 48;
const SUM_OFF: usize = 184;

/// Directories with pending times before they are settled (each costs one frame).
pub const MAX_RECORDS: usize = 1024;

/// The record's byte table.
pub const LAYOUT: &[nvram::layout::Field] = &[
    (0, 8, "magic"),
    (8, 4, "handle length"),
    (12, 4, "zero"),
    (MTIME_OFF, 16, "mtime"),
    (CTIME_OFF, 16, "ctime"),
    (HANDLE_OFF, MAX_HANDLE, "directory handle"),
    (HANDLE_OFF + MAX_HANDLE, 4, "zero"),
    (SUM_OFF, 8, "xxh3-64"),
];

const _: () = {
    assert!(nvram::layout::contiguous(LAYOUT, RECORD_SIZE), "directory-times record table");
    assert!(RECORD_SIZE <= nvram::layout::FRAME_SIZE as usize, "a record fits its frame");
};

/// The decoded record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirTimes {
    pub mtime: (i64, u32),
    pub ctime: (i64, u32),
    pub handle: Vec<u8>,
}

impl DirTimes {
    #[allow(clippy::cast_sign_loss)] // times: two's complement round trip with decode
    pub(crate) fn encode(&self) -> [u8; RECORD_SIZE] {
        assert!(
            !self.handle.is_empty() && self.handle.len() <= MAX_HANDLE,
            "directory handle of {} bytes",
            self.handle.len()
        );
        let mut b = [0u8; RECORD_SIZE];
        b[..8].copy_from_slice(MAGIC);
        put_u32(&mut b, 8, self.handle.len() as u32);
        for (off, t) in [(MTIME_OFF, self.mtime), (CTIME_OFF, self.ctime)] {
            put_u64(&mut b, off, t.0 as u64);
            put_u32(&mut b, off + 8, t.1);
        }
        b[HANDLE_OFF..HANDLE_OFF + self.handle.len()].copy_from_slice(&self.handle);
        let sum = checksum(&[&b[..SUM_OFF]]);
        put_u64(&mut b, SUM_OFF, sum);
        b
    }

    /// Decodes and verifies a record (P1); the error says what is wrong.
    #[allow(clippy::cast_possible_wrap)] // times: two's complement round trip with encode
    pub(crate) fn decode(b: &[u8]) -> Result<DirTimes, &'static str> {
        if b.len() < RECORD_SIZE || &b[..8] != MAGIC {
            return Err("directory-times record without its magic");
        }
        if checksum(&[&b[..SUM_OFF]]) != get_u64(b, SUM_OFF) {
            return Err("directory-times record checksum mismatch");
        }
        let handle_len = get_u32(b, 8) as usize;
        if handle_len == 0 || handle_len > MAX_HANDLE {
            return Err("directory-times record with a bad handle length");
        }
        let time = |off: usize| (get_u64(b, off) as i64, get_u32(b, off + 8));
        Ok(DirTimes {
            mtime: time(MTIME_OFF),
            ctime: time(CTIME_OFF),
            handle: b[HANDLE_OFF..HANDLE_OFF + handle_len].to_vec(),
        })
    }
}

/// One record found in the region (at mount, by `check` and `inspect`).
#[derive(Debug)]
pub struct Found {
    pub frame: txn::FrameId,
    pub times: DirTimes,
}

/// Reads every directory-times record of the region (after recovery rolled back unfinished
/// transactions) and checks P1 and P2. Damage is reported with the frame named.
pub fn scan(pool: &txn::Pool) -> Result<Vec<Found>, nvram::Error> {
    let mut found: Vec<Found> = Vec::new();
    for (frame, tag) in pool.allocated_frames()? {
        if tag.kind != KIND_DIR_TIMES {
            continue;
        }
        let corrupt = |what| nvram::Error::corrupt(nvram::Area::Frame(frame.0), what);
        let times = DirTimes::decode(&pool.read_vec(pool.frame_offset(frame), RECORD_SIZE))
            .map_err(corrupt)?;
        if found.iter().any(|f| f.times.handle == times.handle) {
            return Err(corrupt("a second directory-times record for one directory (P2)"));
        }
        found.push(Found { frame, times });
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> DirTimes {
        DirTimes {
            mtime: (1_700_000_000, 999_999_999),
            ctime: (-3, 1),
            handle: vec![0xab; MAX_HANDLE],
        }
    }

    #[test]
    fn round_trips() {
        let t = sample();
        assert_eq!(DirTimes::decode(&t.encode()).unwrap(), t);
        let short = DirTimes { handle: vec![1, 2, 3], ..sample() };
        assert_eq!(DirTimes::decode(&short.encode()).unwrap(), short);
    }

    #[test]
    fn every_bit_flip_is_detected() {
        let b = sample().encode();
        for byte in 0..RECORD_SIZE {
            for bit in [0, 4, 7] {
                let mut bad = b;
                bad[byte] ^= 1 << bit;
                assert!(DirTimes::decode(&bad).is_err(), "byte {byte} bit {bit}");
            }
        }
    }
}
