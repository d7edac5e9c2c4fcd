//! The persistent form of a temp file: its record, in a slot of a record frame (eight to a
//! frame, `crate::base::slots`), plus one *data frame* per resident page.
//!
//! Frame tags (descriptor kind / owner / index, see `txn::frames`):
//!
//! | kind | frame | owner | index |
//! |---:|---|---|---|
//! | 0x5446_0004 [`KIND_RECORDS`] | eight record slots of 512 bytes (`crate::base::slots`) | 0 | 0 |
//! | 0x5446_0001 [`KIND_OBJECT`] | one record at offset 0 (regions written before records were packed; read, changed and freed, never made) | 0 | 0 |
//! | 0x5446_0002 [`KIND_DATA`] | one 4 KiB page of file data | the record's place (`Place::owner`) | page number |
//!
//! (Kinds are distinctive numbers, "TF" in the high half, so that frames of other users of a
//! region - the demo, test workloads - are never read as temp files.)
//!
//! Record (little endian, at the start of its slot; the slot's last 16 bytes are zero): the
//! byte table is [`LAYOUT`] (design.md section 10 shows it; a test keeps the two equal).
//! `state` is 1 = live, 2 = transforming (transform step 1 done, step 4 not); `flags` bit 0 is
//! SHADOWS (a lower entry with the same name exists and is hidden); `nlink` is 1 = named, 0 =
//! unlinked but still open (freed at last close or at mount); times are seconds (i64),
//! nanoseconds (u32) and 4 zero bytes; `serial` is the creation number, unique in the region,
//! which names the hidden transform file; the dir handle (at most 132 bytes) names the lower
//! directory holding the name (`LowerFs::dir_handle`); the name has at most 255 bytes (none
//! when unlinked); the checksum is XXH3-64 of the bytes before it.
//!
//! Invariants: T1 every record in a taken slot (one that is not all zero) or an object frame
//! verifies (magic, checksum, state, lengths) - anything else is damage, reported with the
//! frame and slot named; T2 a data frame's owner names a record; T3 no data frame lies at or
//! beyond `ceil(size / 4096)` pages; T4 named records (nlink 1) have a non-empty name and dir
//! handle, and no two named records share (dir handle, name); T5 and T6 (free slots are zero;
//! the volatile list of taken slots) are in `crate::base::slots`. Every change rewrites the whole record
//! inside the operation's transaction (snapshot first), so a crash shows either the old or the
//! new record.

use crate::base::frames;
use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};

use nvram::checksum::checksum;
use nvram::layout::{get_u32, get_u64, put_u32, put_u64};

/// A whole frame holding one record (regions written before records were packed).
pub const KIND_OBJECT: u32 = frames::TEMP_RECORD;
/// A frame of eight records (`crate::base::slots`).
pub const KIND_RECORDS: u32 = frames::TEMP_RECORDS;
pub const KIND_DATA: u32 = frames::TEMP_DATA;

pub const RECORD_SIZE: usize = 496;
const MAGIC: &[u8; 8] = b"NVSTMP01";
pub const MAX_HANDLE: usize = lower::MAX_DIR_HANDLE;
pub const MAX_NAME: usize = 255;
const HANDLE_OFF: usize = 100;
const NAME_OFF: usize = 232;
const SUM_OFF: usize = 488;

/// The record's byte table.
pub const LAYOUT: &[nvram::layout::Field] = &[
    (0, 8, "magic"),
    (8, 4, "state"),
    (12, 4, "flags"),
    (16, 4, "mode"),
    (20, 4, "uid"),
    (24, 4, "gid"),
    (28, 4, "nlink"),
    (32, 8, "size"),
    (40, 16, "atime"),
    (56, 16, "mtime"),
    (72, 16, "ctime"),
    (88, 8, "serial"),
    (96, 2, "directory handle length"),
    (98, 2, "name length"),
    (HANDLE_OFF, MAX_HANDLE, "directory handle"),
    (NAME_OFF, MAX_NAME, "name"),
    (NAME_OFF + MAX_NAME, 1, "zero"),
    (SUM_OFF, 8, "xxh3-64"),
];

const _: () = {
    assert!(nvram::layout::contiguous(LAYOUT, RECORD_SIZE), "temp-file record table");
    assert!(RECORD_SIZE <= nvram::layout::FRAME_SIZE as usize, "a record fits its frame");
    assert!(SUM_OFF + 8 == RECORD_SIZE, "the checksum ends the record");
    assert!(RECORD_SIZE <= crate::base::slots::SLOT_SIZE, "a record fits its slot");
};

pub const FLAG_SHADOWS: u32 = 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Live,
    Transforming,
}

/// The decoded record (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub state: State,
    pub flags: u32,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub size: u64,
    pub atime: (i64, u32),
    pub mtime: (i64, u32),
    pub ctime: (i64, u32),
    pub serial: u64,
    pub dir: Vec<u8>,
    pub name: OsString,
}

impl crate::base::pages::DataRecord for Record {
    fn data_fields(&mut self) -> (&mut u64, &mut (i64, u32), &mut (i64, u32)) {
        (&mut self.size, &mut self.mtime, &mut self.ctime)
    }
}

impl Record {
    pub fn shadows(&self) -> bool {
        self.flags & FLAG_SHADOWS != 0
    }

    pub(crate) fn set_shadows(&mut self, on: bool) {
        if on {
            self.flags |= FLAG_SHADOWS;
        } else {
            self.flags &= !FLAG_SHADOWS;
        }
    }

    #[allow(clippy::cast_sign_loss)] // times: two's complement round trip with decode
    pub fn encode(&self) -> [u8; RECORD_SIZE] {
        assert!(self.dir.len() <= MAX_HANDLE, "dir handle of {} bytes", self.dir.len());
        assert!(self.name.len() <= MAX_NAME, "name of {} bytes", self.name.len());
        let mut b = [0u8; RECORD_SIZE];
        b[..8].copy_from_slice(MAGIC);
        put_u32(
            &mut b,
            8,
            match self.state {
                State::Live => 1,
                State::Transforming => 2,
            },
        );
        put_u32(&mut b, 12, self.flags);
        put_u32(&mut b, 16, self.mode);
        put_u32(&mut b, 20, self.uid);
        put_u32(&mut b, 24, self.gid);
        put_u32(&mut b, 28, self.nlink);
        put_u64(&mut b, 32, self.size);
        for (off, t) in [(40, self.atime), (56, self.mtime), (72, self.ctime)] {
            put_u64(&mut b, off, t.0 as u64); // two's complement round trip with decode
            put_u32(&mut b, off + 8, t.1);
        }
        put_u64(&mut b, 88, self.serial);
        b[96..98].copy_from_slice(&(self.dir.len() as u16).to_le_bytes());
        b[98..100].copy_from_slice(&(self.name.len() as u16).to_le_bytes());
        b[HANDLE_OFF..HANDLE_OFF + self.dir.len()].copy_from_slice(&self.dir);
        b[NAME_OFF..NAME_OFF + self.name.len()].copy_from_slice(self.name.as_bytes());
        let sum = checksum(&[&b[..SUM_OFF]]);
        put_u64(&mut b, SUM_OFF, sum);
        b
    }

    /// Decodes and verifies a record (T1); the error says what is wrong.
    #[allow(clippy::cast_possible_wrap)] // times: two's complement round trip with encode
    pub(crate) fn decode(b: &[u8]) -> Result<Record, &'static str> {
        if b.len() < RECORD_SIZE || &b[..8] != MAGIC {
            return Err("temp-file record without its magic");
        }
        if checksum(&[&b[..SUM_OFF]]) != get_u64(b, SUM_OFF) {
            return Err("temp-file record checksum mismatch");
        }
        let state = match get_u32(b, 8) {
            1 => State::Live,
            2 => State::Transforming,
            _ => return Err("temp-file record with an unknown state"),
        };
        let dir_len = u16::from_le_bytes([b[96], b[97]]) as usize;
        let name_len = u16::from_le_bytes([b[98], b[99]]) as usize;
        if dir_len > MAX_HANDLE || name_len > MAX_NAME {
            return Err("temp-file record with an oversized handle or name");
        }
        let nlink = get_u32(b, 28);
        if nlink > 1 || (nlink == 1 && (name_len == 0 || dir_len == 0)) {
            return Err("temp-file record with a bad link count or an empty name (T4)");
        }
        let time = |off: usize| (get_u64(b, off) as i64, get_u32(b, off + 8));
        Ok(Record {
            state,
            flags: get_u32(b, 12),
            mode: get_u32(b, 16),
            uid: get_u32(b, 20),
            gid: get_u32(b, 24),
            nlink,
            size: get_u64(b, 32),
            atime: time(40),
            mtime: time(56),
            ctime: time(72),
            serial: get_u64(b, 88),
            dir: b[HANDLE_OFF..HANDLE_OFF + dir_len].to_vec(),
            name: OsString::from_vec(b[NAME_OFF..NAME_OFF + name_len].to_vec()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Record {
        Record {
            state: State::Transforming,
            flags: FLAG_SHADOWS,
            mode: libc::S_IFREG | 0o4755,
            uid: 1000,
            gid: 100,
            nlink: 1,
            size: 123_456,
            atime: (-5, 7),
            mtime: (1_700_000_000, 999_999_999),
            ctime: (1, 2),
            serial: 42,
            dir: vec![1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12],
            name: OsString::from("postmark.file"),
        }
    }

    #[test]
    fn round_trips() {
        let r = sample();
        assert_eq!(Record::decode(&r.encode()).unwrap(), r);
        let mut long = sample();
        long.name = OsString::from_vec(vec![b'x'; MAX_NAME]);
        long.dir = vec![0xab; MAX_HANDLE];
        assert_eq!(Record::decode(&long.encode()).unwrap(), long);
    }

    #[test]
    fn every_bit_flip_is_detected() {
        let b = sample().encode();
        for byte in 0..RECORD_SIZE {
            for bit in [0, 3, 7] {
                let mut bad = b;
                bad[byte] ^= 1 << bit;
                assert!(Record::decode(&bad).is_err(), "byte {byte} bit {bit}");
            }
        }
    }

    #[test]
    fn a_named_record_needs_a_name() {
        let mut r = sample();
        r.name = OsString::new();
        assert!(Record::decode(&r.encode()).is_err());
        r.nlink = 0;
        assert!(Record::decode(&r.encode()).is_ok(), "unlinked records have no name");
    }
}
