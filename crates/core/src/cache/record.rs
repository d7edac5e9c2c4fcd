//! The persistent form of a cached lower file: its record, in a slot of a record frame (eight
//! to a frame, `crate::base::slots`), plus one *dirty page frame* per page that differs from the
//! lower file (design.md section 11).
//!
//! Frame tags (descriptor kind / owner / index, see `txn::frames`):
//!
//! | kind | frame | owner | index |
//! |---:|---|---|---|
//! | 0x5043_0005 [`KIND_RECORDS`] ("PC") | eight record slots of 512 bytes | 0 | 0 |
//! | 0x5043_0001 [`KIND_RECORD`] | one record at offset 0 (regions written before records were packed; read, changed and freed, never made) | 0 | 0 |
//! | 0x5043_0002 [`KIND_PAGE`] | one 4 KiB dirty page | the record's place (`Place::owner`) | page number |
//!
//! Record (little endian, at the start of its slot; the rest of the slot is zero):
//! the byte table is [`LAYOUT`] (design.md section 11.1 shows it; a test keeps the two equal).
//! `size` is the file's logical size; lower bytes at or beyond `valid` are logically zero (a
//! truncate below the lower size is applied to the lower file by the next write-back); times
//! are seconds (i64), nanoseconds (u32) and 4 zero bytes; `serial` orders the files by when
//! they became dirty (the `file` policy's list); the handle (1..=132 bytes) is the lower
//! file's (`LowerFs::file_handle`); the checksum is XXH3-64 of the bytes before it.
//!
//! The file's content is defined by the record, its dirty pages and the lower file:
//! byte `i < size` is the dirty page's byte if page `i / 4096` is dirty, else the lower
//! file's byte if `i < valid`, else zero. Invariants: C1 every record verifies (magic,
//! checksum, lengths) and `valid <= size`; C2 a page frame's owner is a record; C3 no page
//! lies at or beyond `ceil(size / 4096)`, and bytes of a page beyond `size` are zero (so
//! growing the file shows zeros). Every change rewrites the whole record inside the
//! operation's transaction, so a crash shows the old or the new record.

use crate::base::frames;
use nvram::checksum::checksum;
use nvram::layout::{get_u32, get_u64, put_u32, put_u64};

/// A whole frame holding one record (regions written before records were packed).
pub const KIND_RECORD: u32 = frames::CACHE_RECORD;
/// A frame of eight records (`crate::base::slots`).
pub const KIND_RECORDS: u32 = frames::CACHE_RECORDS;
pub const KIND_PAGE: u32 = frames::CACHE_PAGE;

pub const RECORD_SIZE: usize = 216;
const MAGIC: &[u8; 8] = b"NVSPCF01";
pub const MAX_HANDLE: usize = lower::MAX_DIR_HANDLE;
const HANDLE_OFF: usize = 72;
const SUM_OFF: usize = 208;

/// The record's byte table.
pub const LAYOUT: &[nvram::layout::Field] = &[
    (0, 8, "magic"),
    (8, 4, "handle length"),
    (12, 4, "zero"),
    (16, 8, "size"),
    (24, 8, "valid"),
    (32, 16, "mtime"),
    (48, 16, "ctime"),
    (64, 8, "serial"),
    (HANDLE_OFF, MAX_HANDLE, "file handle"),
    (HANDLE_OFF + MAX_HANDLE, 4, "zero"),
    (SUM_OFF, 8, "xxh3-64"),
];

const _: () = {
    assert!(nvram::layout::contiguous(LAYOUT, RECORD_SIZE), "cached-file record table");
    assert!(RECORD_SIZE <= nvram::layout::FRAME_SIZE as usize, "a record fits its frame");
    assert!(RECORD_SIZE <= crate::base::slots::SLOT_SIZE, "a record fits its slot");
};

/// The decoded record (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub size: u64,
    pub valid: u64,
    pub mtime: (i64, u32),
    pub ctime: (i64, u32),
    pub serial: u64,
    pub handle: Vec<u8>,
}

impl crate::base::pages::DataRecord for Record {
    fn data_fields(&mut self) -> (&mut u64, &mut (i64, u32), &mut (i64, u32)) {
        (&mut self.size, &mut self.mtime, &mut self.ctime)
    }

    /// The lower file's bytes beyond the new size are no longer the file's (C1).
    fn truncated(&mut self, size: u64, now: (i64, u32)) {
        (self.size, self.mtime, self.ctime) = (size, now, now);
        self.valid = self.valid.min(size);
    }
}

impl Record {
    #[allow(clippy::cast_sign_loss)] // times: two's complement round trip with decode
    pub fn encode(&self) -> [u8; RECORD_SIZE] {
        assert!(
            !self.handle.is_empty() && self.handle.len() <= MAX_HANDLE,
            "file handle of {} bytes",
            self.handle.len()
        );
        assert!(self.valid <= self.size, "C1: valid {} > size {}", self.valid, self.size);
        let mut b = [0u8; RECORD_SIZE];
        b[..8].copy_from_slice(MAGIC);
        put_u32(&mut b, 8, self.handle.len() as u32);
        put_u64(&mut b, 16, self.size);
        put_u64(&mut b, 24, self.valid);
        for (off, t) in [(32, self.mtime), (48, self.ctime)] {
            put_u64(&mut b, off, t.0 as u64);
            put_u32(&mut b, off + 8, t.1);
        }
        put_u64(&mut b, 64, self.serial);
        b[HANDLE_OFF..HANDLE_OFF + self.handle.len()].copy_from_slice(&self.handle);
        let sum = checksum(&[&b[..SUM_OFF]]);
        put_u64(&mut b, SUM_OFF, sum);
        b
    }

    /// Decodes and verifies a record (C1); the error says what is wrong.
    #[allow(clippy::cast_possible_wrap)] // times: two's complement round trip with encode
    pub(crate) fn decode(b: &[u8]) -> Result<Record, &'static str> {
        if b.len() < RECORD_SIZE || &b[..8] != MAGIC {
            return Err("cached-file record without its magic");
        }
        if checksum(&[&b[..SUM_OFF]]) != get_u64(b, SUM_OFF) {
            return Err("cached-file record checksum mismatch");
        }
        let handle_len = get_u32(b, 8) as usize;
        if handle_len == 0 || handle_len > MAX_HANDLE {
            return Err("cached-file record with a bad handle length");
        }
        let (size, valid) = (get_u64(b, 16), get_u64(b, 24));
        if valid > size {
            return Err("cached-file record with valid > size (C1)");
        }
        let time = |off: usize| (get_u64(b, off) as i64, get_u32(b, off + 8));
        Ok(Record {
            size,
            valid,
            mtime: time(32),
            ctime: time(48),
            serial: get_u64(b, 64),
            handle: b[HANDLE_OFF..HANDLE_OFF + handle_len].to_vec(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Record {
        Record {
            size: 1 << 33,
            valid: 4097,
            mtime: (1_700_000_000, 999_999_999),
            ctime: (-3, 1),
            serial: 77,
            handle: vec![0xab; MAX_HANDLE],
        }
    }

    #[test]
    fn round_trips() {
        let r = sample();
        assert_eq!(Record::decode(&r.encode()).unwrap(), r);
        let short = Record { handle: vec![1, 2, 3], ..sample() };
        assert_eq!(Record::decode(&short.encode()).unwrap(), short);
    }

    #[test]
    fn every_bit_flip_is_detected() {
        let b = sample().encode();
        for byte in 0..RECORD_SIZE {
            for bit in [0, 4, 7] {
                let mut bad = b;
                bad[byte] ^= 1 << bit;
                assert!(Record::decode(&bad).is_err(), "byte {byte} bit {bit}");
            }
        }
    }
}
