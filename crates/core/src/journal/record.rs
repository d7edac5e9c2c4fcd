//! The persistent form of the metadata journal: *redo records*, each describing one namespace
//! or attribute change of lower objects as it was applied (design.md section 13), packed
//! several to a frame.
//!
//! | kind | frame | owner | index |
//! |---:|---|---|---|
//! | 0x4d4a_0002 [`KIND_REDO`] ("MJ") | 16 slots of 256 bytes; a record is a run of slots | 0 | 0 |
//!
//! A record is a fixed header ([`LAYOUT`]; design.md section 13.2 shows it, a test keeps the
//! two equal), its variable fields packed after it in a fixed order, zero padding, and an
//! XXH3-64 in the last 8 bytes of its run of slots. Creations reserve room for `other` (the
//! handle replay notes when it makes the object again, M5) as long as their own object's
//! handle, at least [`NOTE_ROOM`], so that note nearly always fits the record's slots (a
//! longer one moves the record, `replay.rs`). Objects are named by their file handles (`LowerFs::file_handle`, with the
//! generation: a handle never names another object), directories too; a record names the
//! directories it changed (`dir1`, `dir2`), the names (`name1`, `name2`, or an extended
//! attribute's name in `name2`), the object it created, moved, changed or removed (`object`,
//! and `other` for the second object of an exchange), the attributes it set, and a payload (a
//! symlink's target or an extended attribute's value).
//!
//! Invariants: **M1** every record verifies (magic, slot count, checksum, op, lengths, zero
//! bytes) - anything else is damage, refused with the frame and slot named, never replayed
//! with a guess; **M2** sequence numbers are unique; replay runs in their order; **M6** a slot
//! of a journal frame is either part of a record or all zero (a frame is zeroed when it is
//! allocated, and a record is zeroed when it is freed while others share its frame), so a
//! frame reads as its records, with nothing stale between them.
//!
//! Why packed: a record takes 120-400 bytes for the common changes (a create with two
//! handles and a name, a setattr with one handle). One 4 KiB frame each made the journal's
//! NVRAM budget (a quarter of the region at most) fill after a few thousand changes, and a
//! full journal checkpoints inside the request that filled it; packed, the same NVRAM holds
//! 10-30 times as many.

use crate::base::frames;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};

use nvram::checksum::checksum;
use nvram::layout::{get_u32, get_u64, put_u32, put_u64};

/// The frame kind of packed journal frames.
pub const KIND_REDO: u32 = frames::REDO;
/// The one-record-per-frame format of earlier versions: refused with a clear error (its
/// records are not replayed by this version, and ignoring them would lose changes).
pub const KIND_REDO_V1: u32 = frames::REDO_V1;

pub const FRAME_SIZE: usize = 4096;
/// The unit of allocation inside a journal frame.
pub const SLOT_SIZE: usize = 256;
pub const SLOTS: usize = FRAME_SIZE / SLOT_SIZE;
const MAGIC: &[u8; 8] = b"NVSMJR02";
pub const MAX_HANDLE: usize = lower::MAX_DIR_HANDLE;
pub const MAX_NAME: usize = 255;
/// The fixed header; the variable fields follow it.
pub const HEADER: usize = 96;
/// The least room a creation keeps for M5's note (see `Redo::slots`): a handle that grows
/// by a few bytes when made again (XFS's, once inode numbers pass 32 bits: 16 -> 24 bytes
/// with the type and length) still fits in place.
pub const NOTE_ROOM: usize = 32;
const SUM: usize = 8;
/// Largest payload (symlink target, xattr value) a record holds: a whole frame with every
/// other field at its largest. Larger changes are not journaled (they are synced in the lower
/// file system instead).
pub const MAX_PAYLOAD: usize = FRAME_SIZE - HEADER - 4 * MAX_HANDLE - 2 * MAX_NAME - SUM;

/// The record header's byte table (the variable fields and the checksum follow: design.md).
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
    (88, 1, "slots"),
    (89, 7, "zero"),
];

const _: () = {
    assert!(nvram::layout::contiguous(LAYOUT, HEADER), "redo record header table");
    assert!(FRAME_SIZE <= nvram::layout::FRAME_SIZE as usize, "a frame of slots fits its frame");
    assert!(FRAME_SIZE % SLOT_SIZE == 0 && SLOTS <= u8::MAX as usize, "whole slots");
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

    /// True when the change fits a record (handles, names, payload within their limits).
    pub(crate) fn fits(&self) -> bool {
        [&self.dir1, &self.dir2, &self.object, &self.other].iter().all(|h| h.len() <= MAX_HANDLE)
            && self.name1.len() <= MAX_NAME
            && self.name2.len() <= MAX_NAME
            && self.payload.len() <= MAX_PAYLOAD
    }

    pub fn op(&self) -> Op {
        self.op.expect("a record has an op")
    }

    fn fields(&self) -> [&[u8]; 7] {
        [
            &self.dir1,
            &self.dir2,
            &self.object,
            &self.other,
            self.name1.as_bytes(),
            self.name2.as_bytes(),
            &self.payload,
        ]
    }

    /// The slots this record takes: its header, fields and checksum, with room in a creation
    /// for M5's note in `other`: as long as the object's own handle, at least [`NOTE_ROOM`].
    /// A file system gives an object made again a handle of the same form nearly always, so
    /// the note is written into the record's own slots; a longer one moves the record
    /// (`replay.rs`). A creation's room is its own handle, not the largest one: with ext4's
    /// 16-byte handles a create takes 1 slot instead of 2, and a Postmark-like stream of
    /// creates and unlinks packs 16 records to a frame instead of ~11.
    pub fn slots(&self) -> usize {
        let other_room = if is_creation(self.op()) {
            self.object.len().max(NOTE_ROOM).max(self.other.len())
        } else {
            self.other.len()
        };
        let body: usize = self.fields().iter().map(|f| f.len()).sum::<usize>() - self.other.len();
        (HEADER + body + other_room + SUM).div_ceil(SLOT_SIZE)
    }

    /// The record in exactly `slots()` slots.
    pub fn encode(&self) -> Vec<u8> {
        self.encode_in(self.slots())
    }

    /// The record in `slots` slots (at least `slots()`; a rewrite keeps its record's slots).
    #[allow(clippy::cast_sign_loss)] // times: two's complement round trip with decode
    pub(crate) fn encode_in(&self, slots: usize) -> Vec<u8> {
        assert!(self.fits(), "journal record fields too long");
        assert!(
            (self.slots()..=SLOTS).contains(&slots),
            "a record of {} slots encoded in {slots}",
            self.slots()
        );
        let len = slots * SLOT_SIZE;
        let mut b = vec![0u8; len];
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
        let mut at = HEADER;
        for (i, field) in self.fields().into_iter().enumerate() {
            if i < 6 {
                b[72 + 2 * i..74 + 2 * i].copy_from_slice(&(field.len() as u16).to_le_bytes());
            } else {
                put_u32(&mut b, 84, field.len() as u32);
            }
            b[at..at + field.len()].copy_from_slice(field);
            at += field.len();
        }
        b[88] = slots as u8;
        let sum = checksum(&[&b[..len - SUM]]);
        put_u64(&mut b, len - SUM, sum);
        b
    }

    /// Decodes and verifies the record at the start of `b` (a slot boundary up to the end of
    /// its frame; M1); returns it with the slots it takes. The error says what is wrong.
    #[allow(clippy::cast_possible_wrap)] // times: two's complement round trip with encode
    pub(crate) fn decode(b: &[u8]) -> Result<(Redo, usize), &'static str> {
        if b.len() < SLOT_SIZE || &b[..8] != MAGIC {
            return Err("journal record without its magic");
        }
        let slots = usize::from(b[88]);
        if slots == 0 || slots * SLOT_SIZE > b.len() {
            return Err("journal record with a slot count past its frame");
        }
        let len = slots * SLOT_SIZE;
        if checksum(&[&b[..len - SUM]]) != get_u64(b, len - SUM) {
            return Err("journal record checksum mismatch");
        }
        if b[89..HEADER].iter().any(|&x| x != 0) {
            return Err("journal record with nonzero reserved header bytes");
        }
        let u16_at = |off: usize| usize::from(u16::from_le_bytes([b[off], b[off + 1]]));
        let op = Op::from_u16(u16_at(16) as u16).ok_or("journal record with an unknown op")?;
        let lens = [
            (u16_at(72), MAX_HANDLE),
            (u16_at(74), MAX_HANDLE),
            (u16_at(76), MAX_HANDLE),
            (u16_at(78), MAX_HANDLE),
            (u16_at(80), MAX_NAME),
            (u16_at(82), MAX_NAME),
            (get_u32(b, 84) as usize, MAX_PAYLOAD),
        ];
        if lens.iter().any(|&(len, max)| len > max) {
            return Err("journal record field too long");
        }
        let end = HEADER + lens.iter().map(|&(l, _)| l).sum::<usize>();
        if end > len - SUM {
            return Err("journal record fields past its slots");
        }
        if b[end..len - SUM].iter().any(|&x| x != 0) {
            return Err("journal record with nonzero padding");
        }
        let mut at = HEADER;
        let mut next = |n: usize| {
            at += n;
            b[at - n..at].to_vec()
        };
        let time = |off: usize| (get_u64(b, off) as i64, get_u32(b, off + 8));
        let redo = Redo {
            seq: get_u64(b, 8),
            op: Some(op),
            flags: u16_at(18) as u16,
            mode: get_u32(b, 20),
            uid: get_u32(b, 24),
            gid: get_u32(b, 28),
            rdev: get_u64(b, 32),
            atime: time(40),
            mtime: time(56),
            dir1: next(lens[0].0),
            dir2: next(lens[1].0),
            object: next(lens[2].0),
            other: next(lens[3].0),
            name1: OsString::from_vec(next(lens[4].0)),
            name2: OsString::from_vec(next(lens[5].0)),
            payload: next(lens[6].0),
        };
        if redo.slots() > slots {
            return Err("journal record in fewer slots than it needs");
        }
        Ok((redo, slots))
    }

    pub(crate) fn name1(&self) -> &OsStr {
        &self.name1
    }

    pub(crate) fn name2(&self) -> &OsStr {
        &self.name2
    }
}

/// A creation: the record that names an object made again by replay (M5, in `other`).
pub(crate) fn is_creation(op: Op) -> bool {
    matches!(op, Op::Create | Op::Mknod | Op::Mkdir | Op::Symlink)
}

/// Where a record lies: a run of slots in a journal frame (the one slot allocator's `Run`).
pub use crate::base::slots::Run as Place;

/// One record found in the region (at mount, by `check` and `inspect`).
#[derive(Debug)]
pub struct Found {
    pub place: Place,
    pub redo: Redo,
}

/// The journal's frames as found in the region.
#[derive(Debug, Default)]
pub struct Scan {
    /// Every record, in sequence order.
    pub records: Vec<Found>,
    /// Every journal frame, records or not (a frame whose records were all freed while it
    /// took new ones stays allocated, empty, until a checkpoint frees it).
    pub frames: Vec<txn::FrameId>,
}

/// Reads every journal frame of the region (after recovery rolled back unfinished
/// transactions), checks M1, M2 and M6, and returns the records in sequence order. Damage is
/// reported with the frame and slot named.
pub(crate) fn scan_frames(pool: &txn::Pool) -> Result<Scan, nvram::Error> {
    let mut scan = Scan::default();
    for (frame, tag) in pool.allocated_frames()? {
        if tag.kind == KIND_REDO_V1 {
            return Err(nvram::Error::corrupt(
                nvram::Area::Frame(frame.0),
                "a metadata-journal record of the earlier one-record-per-frame format: mount \
                 the region with the nvstack version that wrote it (it replays and frees its \
                 records at mount and unmount), then with this one",
            ));
        }
        if tag.kind != KIND_REDO {
            continue;
        }
        scan.frames.push(frame);
        let b = pool.read_vec(pool.frame_offset(frame), FRAME_SIZE);
        let mut slot = 0;
        while slot < SLOTS {
            let at = &b[slot * SLOT_SIZE..];
            if at[..SLOT_SIZE].iter().all(|&x| x == 0) {
                slot += 1; // M6: free
                continue;
            }
            let (redo, slots) = Redo::decode(at).map_err(|what| {
                nvram::Error::corrupt(nvram::Area::Frame(frame.0), format!("slot {slot}: {what}"))
            })?;
            scan.records.push(Found { place: Place { frame, slot, slots }, redo });
            slot += slots;
        }
    }
    scan.records.sort_by_key(|f| f.redo.seq);
    if let Some(w) = scan.records.windows(2).find(|w| w[0].redo.seq == w[1].redo.seq) {
        return Err(nvram::Error::corrupt(
            nvram::Area::Frame(w[1].place.frame.0),
            format!("slot {}: two journal records with one sequence number (M2)", w[1].place.slot),
        ));
    }
    Ok(scan)
}

/// The records of [`scan_frames`].
pub fn scan(pool: &txn::Pool) -> Result<Vec<Found>, nvram::Error> {
    Ok(scan_frames(pool)?.records)
}

/// The region offset of `slot` of journal frame `frame`.
pub(crate) fn slot_offset(pool: &txn::Pool, frame: txn::FrameId, slot: usize) -> u64 {
    pool.frame_offset(frame) + (slot * SLOT_SIZE) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every field at its largest: a whole frame.
    fn largest() -> Redo {
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
            dir2: vec![2; MAX_HANDLE],
            object: vec![3; MAX_HANDLE],
            other: vec![4; MAX_HANDLE],
            name1: OsString::from("a".repeat(MAX_NAME)),
            name2: OsString::from("b".repeat(MAX_NAME)),
            payload: vec![9; MAX_PAYLOAD],
        }
    }

    /// What ext4 gives: 8-byte handles plus the 8-byte type and length header.
    fn create() -> Redo {
        Redo {
            seq: 5,
            mode: 0o100_644,
            dir1: vec![7; 16],
            object: vec![8; 16],
            name1: OsString::from("file-000123.c"),
            ..Redo::new(Op::Create)
        }
    }

    #[test]
    fn round_trips_in_their_slots() {
        for v in 1..=11 {
            let r = Redo { op: Op::from_u16(v), ..largest() };
            let bytes = r.encode();
            assert_eq!(bytes.len(), SLOTS * SLOT_SIZE, "op {v}: the largest record is a frame");
            assert_eq!(Redo::decode(&bytes).unwrap(), (r, SLOTS), "op {v}");
        }
        let c = create();
        assert_eq!(Redo::decode(&c.encode()).unwrap(), (c.clone(), c.slots()));
        // A record in more slots than it needs (a rewrite keeps its slots) reads the same.
        assert_eq!(Redo::decode(&c.encode_in(5)).unwrap(), (c, 5));
    }

    #[test]
    fn common_changes_pack_many_to_a_frame() {
        // A create keeps room for a note as long as its handle, at least NOTE_ROOM:
        // 96 + 16 + 16 + 13 + 32 + 8 = 181 bytes.
        assert_eq!(create().slots(), 1);
        // Names up to 88 bytes keep it one slot.
        let long = Redo { name1: OsString::from("n".repeat(88)), ..create() };
        assert_eq!(
            (long.slots(), Redo { name1: OsString::from("n".repeat(89)), ..long }.slots()),
            (1, 2)
        );
        let setattr = Redo { object: vec![8; 16], ..Redo::new(Op::Setattr) };
        assert_eq!(setattr.slots(), 1);
        let unlink = Redo { object: vec![8; 16], ..create() };
        let unlink = Redo { op: Some(Op::Unlink), ..unlink };
        assert_eq!(unlink.slots(), 1, "a removal needs no room for `other`");
    }

    #[test]
    fn a_note_as_long_as_the_room_fits_the_creation_record_and_a_longer_one_needs_more_slots() {
        let c = create();
        let noted = Redo { other: vec![6; NOTE_ROOM], ..c.clone() };
        assert_eq!(noted.slots(), c.slots());
        let bytes = noted.encode_in(c.slots());
        assert_eq!(Redo::decode(&bytes).unwrap(), (noted, c.slots()));
        // A creation with a long handle keeps room for a note as long.
        let wide = Redo { object: vec![8; 100], ..c.clone() };
        assert_eq!(Redo { other: vec![6; 100], ..wide.clone() }.slots(), wide.slots());
        // A note longer than the room: the record needs more slots (replay moves it).
        let long = Redo { other: vec![6; MAX_HANDLE], ..c.clone() };
        assert_eq!(long.slots(), 2);
        assert!(long.slots() > c.slots());
    }

    #[test]
    fn every_bit_flip_of_a_record_is_refused() {
        for r in [largest(), create()] {
            let b = r.encode();
            for byte in 0..b.len() {
                let mut bad = b.clone();
                bad[byte] ^= 0x10;
                assert!(Redo::decode(&bad).is_err(), "byte {byte} of a {}-slot record", r.slots());
            }
        }
    }

    #[test]
    fn damage_that_keeps_the_checksum_is_still_refused() {
        let reseal = |mut b: Vec<u8>| {
            let n = b.len();
            let sum = checksum(&[&b[..n - SUM]]);
            put_u64(&mut b, n - SUM, sum);
            b
        };
        let c = create();
        let mut padded = c.encode_in(3);
        padded[HEADER + 60] = 1;
        assert_eq!(Redo::decode(&reseal(padded)), Err("journal record with nonzero padding"));
        let mut header = c.encode();
        header[90] = 1;
        assert!(Redo::decode(&reseal(header)).unwrap_err().contains("reserved"));
        let mut long = c.encode();
        long[88] = (SLOTS + 1) as u8;
        let mut frame = long.clone();
        frame.resize(FRAME_SIZE, 0);
        assert!(Redo::decode(&frame).unwrap_err().contains("past its frame"));
        let mut short = Redo { other: vec![6; MAX_HANDLE], ..c }.encode_in(2);
        short[88] = 1;
        assert!(Redo::decode(&short).is_err(), "a record must not claim fewer slots");
    }

    #[test]
    fn oversized_changes_do_not_fit() {
        let r = Redo { payload: vec![0; MAX_PAYLOAD + 1], ..largest() };
        assert!(!r.fits());
        let r = Redo { name1: OsString::from("n".repeat(MAX_NAME + 1)), ..create() };
        assert!(!r.fits());
    }
}
