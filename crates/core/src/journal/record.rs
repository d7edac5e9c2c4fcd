//! The persistent form of the metadata journal: one *redo record* per frame, describing one
//! namespace or attribute change of lower objects as it was applied (design.md section 13).
//!
//! | kind | frame | owner | index |
//! |---:|---|---|---|
//! | 0x4d4a_0001 [`KIND_REDO`] ("MJ") | one record | 0 | 0 |
//!
//! The byte table is [`LAYOUT`] (design.md section 13 shows it; a test keeps the two equal).
//! Objects are named by their file handles (`LowerFs::file_handle`, with the generation: a
//! handle never names another object), directories too; a record names the directories it
//! changed (`dir1`, `dir2`), the names (`name1`, `name2`, or an extended attribute's name in
//! `name2`), the object it created, moved, changed or removed (`object`, and `other` for the
//! second object of an exchange), the attributes it set, and a payload (a symlink's target or
//! an extended attribute's value). Invariants: **M1** every record verifies (magic, checksum,
//! op, lengths) - anything else is damage, refused with the frame named, never replayed with a
//! guess; **M2** sequence numbers are unique; replay runs in their order.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};

use nvram::checksum::checksum;
use nvram::layout::{get_u32, get_u64, put_u32, put_u64};

pub const KIND_REDO: u32 = 0x4d4a_0001;

pub const RECORD_SIZE: usize = 4096;
const MAGIC: &[u8; 8] = b"NVSMJR01";
pub const MAX_HANDLE: usize = lower::MAX_DIR_HANDLE;
pub const MAX_NAME: usize = 255;
/// Largest payload (symlink target, xattr value) a record holds; larger changes are not
/// journaled (they are synced in the lower file system instead).
pub const MAX_PAYLOAD: usize = SUM_OFF - 8 - PAYLOAD_OFF;

const DIR1_OFF: usize = 96;
const DIR2_OFF: usize = DIR1_OFF + MAX_HANDLE;
const OBJECT_OFF: usize = DIR2_OFF + MAX_HANDLE;
const OTHER_OFF: usize = OBJECT_OFF + MAX_HANDLE;
const NAME1_OFF: usize = OTHER_OFF + MAX_HANDLE;
const NAME2_OFF: usize = NAME1_OFF + MAX_NAME;
const PAYLOAD_OFF: usize = NAME2_OFF + MAX_NAME + 2;
const SUM_OFF: usize = RECORD_SIZE - 8;

/// The record's byte table.
pub const LAYOUT: &[nvram::layout::Field] = &[
    (0, 8, "magic"),
    (8, 8, "sequence"),
    (16, 2, "op"),
    (18, 2, "flags"),
    (20, 4, "mode"),
    (24, 4, "uid"),
    (28, 4, "gid"),
    (32, 8, "rdev"),
    (40, 16, "atime"),
    (56, 16, "mtime"),
    (72, 2, "dir1 length"),
    (74, 2, "dir2 length"),
    (76, 2, "object length"),
    (78, 2, "other length"),
    (80, 2, "name1 length"),
    (82, 2, "name2 length"),
    (84, 4, "payload length"),
    (88, 8, "zero"),
    (DIR1_OFF, MAX_HANDLE, "dir1"),
    (DIR2_OFF, MAX_HANDLE, "dir2"),
    (OBJECT_OFF, MAX_HANDLE, "object"),
    (OTHER_OFF, MAX_HANDLE, "other"),
    (NAME1_OFF, MAX_NAME, "name1"),
    (NAME2_OFF, MAX_NAME, "name2"),
    (NAME2_OFF + MAX_NAME, 2, "zero"),
    (PAYLOAD_OFF, MAX_PAYLOAD, "payload"),
    (PAYLOAD_OFF + MAX_PAYLOAD, 8, "zero"),
    (SUM_OFF, 8, "xxh3-64"),
];

const _: () = {
    assert!(nvram::layout::contiguous(LAYOUT, RECORD_SIZE), "redo record table");
    assert!(RECORD_SIZE <= nvram::layout::FRAME_SIZE as usize, "a record fits its frame");
};

/// What a record says was done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub enum Op {
    /// A regular file created: `dir1/name1` is `object`, with mode, uid, gid.
    Create = 1,
    /// A device, FIFO or socket: as `Create`, with `rdev`.
    Mknod = 2,
    Mkdir = 3,
    /// `dir1/name1` is the symlink `object` to `payload`.
    Symlink = 4,
    /// `object` got the name `dir1/name1`.
    Link = 5,
    /// `dir1/name1` (which was `object`) removed.
    Unlink = 6,
    Rmdir = 7,
    /// `dir1/name1` (`object`) moved to `dir2/name2` (flags: the renameat2 flags; with
    /// RENAME_EXCHANGE `other` was at `dir2/name2` and went to `dir1/name1`).
    Rename = 8,
    /// `object`'s attributes set: flags say which of mode, uid, gid, atime, mtime.
    Setattr = 9,
    /// `object`'s extended attribute `name2` set to `payload` (flags: XATTR_CREATE/REPLACE).
    Setxattr = 10,
    /// `object`'s extended attribute `name2` removed.
    Removexattr = 11,
}

impl Op {
    fn from_u16(v: u16) -> Option<Op> {
        Some(match v {
            1 => Op::Create,
            2 => Op::Mknod,
            3 => Op::Mkdir,
            4 => Op::Symlink,
            5 => Op::Link,
            6 => Op::Unlink,
            7 => Op::Rmdir,
            8 => Op::Rename,
            9 => Op::Setattr,
            10 => Op::Setxattr,
            11 => Op::Removexattr,
            _ => return None,
        })
    }
}

/// Which attributes a `Setattr` record sets.
pub const SET_MODE: u16 = 1;
pub const SET_UID: u16 = 2;
pub const SET_GID: u16 = 4;
pub const SET_ATIME: u16 = 8;
pub const SET_MTIME: u16 = 16;

/// A decoded record (see the module docs). Handles and names are empty where the op has none.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Redo {
    pub seq: u64,
    pub op: Option<Op>,
    pub flags: u16,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u64,
    pub atime: (i64, u32),
    pub mtime: (i64, u32),
    pub dir1: Vec<u8>,
    pub dir2: Vec<u8>,
    pub object: Vec<u8>,
    pub other: Vec<u8>,
    pub name1: OsString,
    pub name2: OsString,
    pub payload: Vec<u8>,
}

impl Redo {
    pub fn new(op: Op) -> Redo {
        Redo { op: Some(op), ..Redo::default() }
    }

    /// True when the change fits a record (handles, names, payload within their fields).
    pub fn fits(&self) -> bool {
        [&self.dir1, &self.dir2, &self.object, &self.other].iter().all(|h| h.len() <= MAX_HANDLE)
            && self.name1.len() <= MAX_NAME
            && self.name2.len() <= MAX_NAME
            && self.payload.len() <= MAX_PAYLOAD
    }

    pub fn op(&self) -> Op {
        self.op.expect("a record has an op")
    }

    #[allow(clippy::cast_sign_loss)] // times: two's complement round trip with decode
    pub fn encode(&self) -> Vec<u8> {
        assert!(self.fits(), "journal record fields too long");
        let mut b = vec![0u8; RECORD_SIZE];
        b[..8].copy_from_slice(MAGIC);
        put_u64(&mut b, 8, self.seq);
        b[16..18].copy_from_slice(&(self.op() as u16).to_le_bytes());
        b[18..20].copy_from_slice(&self.flags.to_le_bytes());
        put_u32(&mut b, 20, self.mode);
        put_u32(&mut b, 24, self.uid);
        put_u32(&mut b, 28, self.gid);
        put_u64(&mut b, 32, self.rdev);
        for (off, t) in [(40, self.atime), (56, self.mtime)] {
            put_u64(&mut b, off, t.0 as u64);
            put_u32(&mut b, off + 8, t.1);
        }
        let fields: [(&[u8], usize, usize); 6] = [
            (&self.dir1, 72, DIR1_OFF),
            (&self.dir2, 74, DIR2_OFF),
            (&self.object, 76, OBJECT_OFF),
            (&self.other, 78, OTHER_OFF),
            (self.name1.as_bytes(), 80, NAME1_OFF),
            (self.name2.as_bytes(), 82, NAME2_OFF),
        ];
        for (bytes, len_off, off) in fields {
            b[len_off..len_off + 2].copy_from_slice(&(bytes.len() as u16).to_le_bytes());
            b[off..off + bytes.len()].copy_from_slice(bytes);
        }
        put_u32(&mut b, 84, self.payload.len() as u32);
        b[PAYLOAD_OFF..PAYLOAD_OFF + self.payload.len()].copy_from_slice(&self.payload);
        let sum = checksum(&[&b[..SUM_OFF]]);
        put_u64(&mut b, SUM_OFF, sum);
        b
    }

    /// Decodes and verifies a record (M1); the error says what is wrong.
    #[allow(clippy::cast_possible_wrap)] // times: two's complement round trip with encode
    pub fn decode(b: &[u8]) -> Result<Redo, &'static str> {
        if b.len() < RECORD_SIZE || &b[..8] != MAGIC {
            return Err("journal record without its magic");
        }
        if checksum(&[&b[..SUM_OFF]]) != get_u64(b, SUM_OFF) {
            return Err("journal record checksum mismatch");
        }
        let u16_at = |off: usize| usize::from(u16::from_le_bytes([b[off], b[off + 1]]));
        let op = Op::from_u16(u16_at(16) as u16).ok_or("journal record with an unknown op")?;
        let field = |len_off: usize, off: usize, max: usize| {
            let len = u16_at(len_off);
            (len <= max).then(|| b[off..off + len].to_vec()).ok_or("journal record field too long")
        };
        let payload_len = get_u32(b, 84) as usize;
        if payload_len > MAX_PAYLOAD {
            return Err("journal record payload too long");
        }
        let time = |off: usize| (get_u64(b, off) as i64, get_u32(b, off + 8));
        Ok(Redo {
            seq: get_u64(b, 8),
            op: Some(op),
            flags: u16_at(18) as u16,
            mode: get_u32(b, 20),
            uid: get_u32(b, 24),
            gid: get_u32(b, 28),
            rdev: get_u64(b, 32),
            atime: time(40),
            mtime: time(56),
            dir1: field(72, DIR1_OFF, MAX_HANDLE)?,
            dir2: field(74, DIR2_OFF, MAX_HANDLE)?,
            object: field(76, OBJECT_OFF, MAX_HANDLE)?,
            other: field(78, OTHER_OFF, MAX_HANDLE)?,
            name1: OsString::from_vec(field(80, NAME1_OFF, MAX_NAME)?),
            name2: OsString::from_vec(field(82, NAME2_OFF, MAX_NAME)?),
            payload: b[PAYLOAD_OFF..PAYLOAD_OFF + payload_len].to_vec(),
        })
    }

    pub fn name1(&self) -> &OsStr {
        &self.name1
    }

    pub fn name2(&self) -> &OsStr {
        &self.name2
    }
}

/// One record found in the region (at mount, by `check` and `inspect`).
#[derive(Debug)]
pub struct Found {
    pub frame: txn::FrameId,
    pub redo: Redo,
}

/// Reads every journal record of the region (after recovery rolled back unfinished
/// transactions), checks M1 and M2, and returns them in sequence order. Damage is reported
/// with the frame named.
pub fn scan(pool: &txn::Pool) -> Result<Vec<Found>, nvram::Error> {
    let mut found = Vec::new();
    for (frame, tag) in pool.allocated_frames()? {
        if tag.kind != KIND_REDO {
            continue;
        }
        let corrupt = |what| nvram::Error::corrupt(nvram::Area::Frame(frame.0), what);
        let redo =
            Redo::decode(&pool.read_vec(pool.frame_offset(frame), RECORD_SIZE)).map_err(corrupt)?;
        found.push(Found { frame, redo });
    }
    found.sort_by_key(|f| f.redo.seq);
    if let Some(w) = found.windows(2).find(|w| w[0].redo.seq == w[1].redo.seq) {
        return Err(nvram::Error::corrupt(
            nvram::Area::Frame(w[1].frame.0),
            "two journal records with one sequence number (M2)",
        ));
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Redo {
        Redo {
            seq: 77,
            op: Some(Op::Rename),
            flags: 2,
            mode: 0o40755,
            uid: 1000,
            gid: 100,
            rdev: 0x0801,
            atime: (1_700_000_000, 5),
            mtime: (-3, 999_999_999),
            dir1: vec![1; MAX_HANDLE],
            dir2: vec![2; 16],
            object: vec![3; 16],
            other: vec![4; 8],
            name1: OsString::from("a".repeat(MAX_NAME)),
            name2: OsString::from("b"),
            payload: vec![9; MAX_PAYLOAD],
        }
    }

    #[test]
    fn round_trips() {
        for v in 1..=11 {
            let r = Redo { op: Op::from_u16(v), ..sample() };
            assert_eq!(Redo::decode(&r.encode()).unwrap(), r, "op {v}");
        }
        let small = Redo { payload: Vec::new(), name1: OsString::from("x"), ..sample() };
        assert_eq!(Redo::decode(&small.encode()).unwrap(), small);
    }

    #[test]
    fn bit_flips_are_detected() {
        let b = sample().encode();
        for byte in 0..RECORD_SIZE {
            let mut bad = b.clone();
            bad[byte] ^= 0x10;
            assert!(Redo::decode(&bad).is_err(), "byte {byte}");
        }
    }

    #[test]
    fn oversized_changes_do_not_fit() {
        let r = Redo { payload: vec![0; MAX_PAYLOAD + 1], ..sample() };
        assert!(!r.fits());
    }
}
