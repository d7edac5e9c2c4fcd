//! The undo log: one slot per concurrent transaction, the on-region format of its records, and
//! the rollback that recovery and `abort` share.
//!
//! Slot format (`slot_size` bytes at `layout.slot_offset(slot)`):
//!
//! ```text
//!  0   8  magic "NVSUNDO\0"
//!  8   4  slot index
//! 12   4  zero
//! 16   8  slot size in bytes
//! 24   8  XXH3-64 of bytes 0..24                  (static part: written by format only)
//! 32   8  tail word: low 32 bits = bytes of valid records (`used`), high 32 bits = their
//!         complement. Changed only by single atomic stores.
//! 40   8  area format word (slot 0 only; zero in the others): 0 = undo slots, "NVSJRNL1" =
//!         the undo area holds journal mode's group log (`journal.rs`)
//! 48   8  journal generation word (slot 0 only; zero until the region is first journaled)
//! 56   8  zero
//! 64  ..  records, back to back, each 8-byte aligned
//! ```
//!
//! Record format (32-byte header, then the payload padded to 8 bytes):
//!
//! ```text
//!  0   4  kind: 1 = snapshot (payload = the old bytes of [target, target + len))
//!  4   4  len: payload bytes
//!  8   8  target: region offset of the snapshotted bytes
//! 16   8  index of the record in its transaction (0, 1, ...)
//! 24   8  XXH3-64 of header bytes 0..24 and the payload
//! ```
//!
//! Protocol (the proof by cases is in docs/design.md, "Commit protocol"):
//! 1. append: write records at `64 + used`, persist them; then store the new tail word, persist
//!    it. Only now may the snapshotted bytes change. (Invariant U1: every byte a running
//!    transaction changed outside its fresh frames is covered by a record below the tail.)
//! 2. commit: persist every changed range; then store tail = 0 and persist it: **the commit
//!    point**. (Invariant U2: a tail of 0 means the slot holds no transaction to undo.)
//! 3. rollback (abort, or recovery at open): validate every record below the tail, write the
//!    payloads back in reverse order, persist them, then store tail = 0 and persist it.
//!    Rollback only reads records, so a crash during it is recovered by running it again.
//!
//! A record below the tail that fails its checksum cannot be the victim of a torn append (the
//! tail moves only after the record is durable), so it is damage and is reported, never skipped.

use nvram::checksum::checksum;
use nvram::layout::{Layout, PAGE_SIZE, get_u32, get_u64, put_u32, put_u64};
use nvram::{Area, Error, Region};

pub const SLOT_MAGIC: [u8; 8] = *b"NVSUNDO\0";
/// Bytes before the first record of a slot.
pub const SLOT_HEADER_SIZE: u64 = 64;
pub const TAIL_OFFSET: u64 = 32;
pub const RECORD_HEADER_SIZE: u64 = 32;
pub const KIND_SNAPSHOT: u32 = 1;

/// The slot header's byte table (docs/design.md section 3).
pub const SLOT_HEADER_LAYOUT: &[nvram::layout::Field] = &[
    (0, 8, "magic"),
    (8, 4, "slot index"),
    (12, 4, "zero"),
    (16, 8, "slot size"),
    (24, 8, "checksum"),
    (TAIL_OFFSET as usize, 8, "tail word"),
    (crate::journal::FORMAT_WORD_OFFSET as usize, 8, "area format word"),
    (crate::journal::GENERATION_OFFSET as usize, 8, "journal generation word"),
    (56, 8, "zero"),
];

/// A record's fixed part (its payload of `len` bytes and the padding to 8 follow).
pub const RECORD_HEADER_LAYOUT: &[nvram::layout::Field] =
    &[(0, 4, "kind"), (4, 4, "len"), (8, 8, "target"), (16, 8, "index"), (24, 8, "checksum")];

const _: () = {
    assert!(nvram::layout::contiguous(SLOT_HEADER_LAYOUT, SLOT_HEADER_SIZE as usize));
    assert!(nvram::layout::contiguous(RECORD_HEADER_LAYOUT, RECORD_HEADER_SIZE as usize));
};

/// A decoded, verified record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub target: u64,
    pub old_bytes: Vec<u8>,
}

/// Bytes a record with `len` payload bytes takes in the slot.
pub fn record_size(len: u64) -> u64 {
    RECORD_HEADER_SIZE + len.div_ceil(8) * 8
}

/// Encodes a snapshot record of `old_bytes` taken from `target`.
pub fn encode_record(target: u64, index: u64, old_bytes: &[u8]) -> Vec<u8> {
    let len = old_bytes.len() as u64;
    let mut rec = vec![0u8; record_size(len) as usize];
    put_u32(&mut rec, 0, KIND_SNAPSHOT);
    put_u32(&mut rec, 4, u32::try_from(len).expect("record payload below 4 GiB"));
    put_u64(&mut rec, 8, target);
    put_u64(&mut rec, 16, index);
    rec[32..32 + old_bytes.len()].copy_from_slice(old_bytes);
    let sum = checksum(&[&rec[..24], old_bytes]);
    put_u64(&mut rec, 24, sum);
    rec
}

pub fn encode_tail(used: u64) -> u64 {
    let low = u32::try_from(used).expect("undo slot below 4 GiB");
    u64::from(low) | (u64::from(!low) << 32)
}

pub fn decode_tail(word: u64, slot: u32) -> Result<u64, Error> {
    let low = word as u32;
    if (word >> 32) as u32 != !low {
        return Err(Error::corrupt(
            Area::UndoSlot(slot),
            format!("tail word self-check failed ({word:#018x})"),
        ));
    }
    Ok(u64::from(low))
}

/// Writes the static header and an empty tail of every slot (format only).
pub fn format_slots(region: &dyn Region, layout: &Layout) {
    for slot in 0..layout.undo_slots {
        write_slot_header(region, layout, slot);
    }
    region.fence();
}

/// Writes slot `slot`'s header (static part, empty tail, zero format and generation words) and
/// flushes it; the caller fences. Format writes every slot; leaving journal mode rewrites the
/// headers of slots 1.. that the group log overwrote (never slot 0's: it carries the format
/// and generation words).
pub fn write_slot_header(region: &dyn Region, layout: &Layout, slot: u32) {
    let mut header = vec![0u8; SLOT_HEADER_SIZE as usize];
    header[..8].copy_from_slice(&SLOT_MAGIC);
    put_u32(&mut header, 8, slot);
    put_u64(&mut header, 16, layout.undo_slot_size);
    let sum = checksum(&[&header[..24]]);
    put_u64(&mut header, 24, sum);
    put_u64(&mut header, TAIL_OFFSET as usize, encode_tail(0));
    let off = layout.slot_offset(slot);
    region.write(off, &header);
    region.flush(off, SLOT_HEADER_SIZE);
}

/// Usable record bytes of a slot.
pub fn slot_capacity(layout: &Layout) -> u64 {
    layout.undo_slot_size - SLOT_HEADER_SIZE
}

/// True when `[target, target + len)` lies in the areas transactions may change: the root area,
/// the descriptors and the frames (everything after the undo log, and the root page).
pub fn is_data_range(layout: &Layout, target: u64, len: u64) -> bool {
    let Some(end) = target.checked_add(len) else { return false };
    let root = nvram::layout::ROOT_OFFSET..nvram::layout::ROOT_OFFSET + PAGE_SIZE;
    let data = layout.desc_offset..layout.frames_offset + layout.nr_frames * PAGE_SIZE;
    (root.start <= target && end <= root.end) || (data.start <= target && end <= data.end)
}

/// Verifies the slot's static header and returns `used` from its tail word.
pub fn read_slot_used(region: &dyn Region, layout: &Layout, slot: u32) -> Result<u64, Error> {
    let off = layout.slot_offset(slot);
    let header = region.read_vec(off, 32);
    let bad = |detail: &str| Err(Error::corrupt(Area::UndoSlot(slot), detail.to_string()));
    if header[..8] != SLOT_MAGIC {
        return bad("bad magic number in the slot header");
    }
    if checksum(&[&header[..24]]) != get_u64(&header, 24) {
        return bad("slot header checksum mismatch");
    }
    if get_u32(&header, 8) != slot || get_u64(&header, 16) != layout.undo_slot_size {
        return bad("slot header does not match the superblock");
    }
    let used = decode_tail(region.load_u64(off + TAIL_OFFSET), slot)?;
    if used > slot_capacity(layout) || used % 8 != 0 {
        return bad("tail beyond the slot or unaligned");
    }
    Ok(used)
}

/// Reads and verifies every record below the slot's tail, oldest first.
pub fn read_records(region: &dyn Region, layout: &Layout, slot: u32) -> Result<Vec<Record>, Error> {
    let used = read_slot_used(region, layout, slot)?;
    let base = layout.slot_offset(slot) + SLOT_HEADER_SIZE;
    let log = region.read_vec(base, used as usize);
    let mut records = Vec::new();
    let mut pos = 0u64;
    while pos < used {
        let bad = |detail: String| {
            Err(Error::corrupt(Area::UndoSlot(slot), format!("record at byte {pos}: {detail}")))
        };
        if used - pos < RECORD_HEADER_SIZE {
            return bad("truncated header below the tail".into());
        }
        let h = &log[pos as usize..(pos + RECORD_HEADER_SIZE) as usize];
        let (kind, len, target) = (get_u32(h, 0), u64::from(get_u32(h, 4)), get_u64(h, 8));
        if kind != KIND_SNAPSHOT {
            return bad(format!("unknown kind {kind}"));
        }
        if record_size(len) > used - pos {
            return bad(format!("length {len} runs past the tail"));
        }
        let payload =
            &log[(pos + RECORD_HEADER_SIZE) as usize..(pos + RECORD_HEADER_SIZE + len) as usize];
        if checksum(&[&h[..24], payload]) != get_u64(h, 24) {
            return bad("checksum mismatch".into());
        }
        let padding = (pos + RECORD_HEADER_SIZE + len) as usize..(pos + record_size(len)) as usize;
        if log[padding].iter().any(|&b| b != 0) {
            return bad("non-zero padding".into());
        }
        if get_u64(h, 16) != records.len() as u64 {
            return bad(format!("index {} where {} was expected", get_u64(h, 16), records.len()));
        }
        if !is_data_range(layout, target, len) {
            return bad(format!("target [{target}, +{len}) outside the data areas"));
        }
        records.push(Record { target, old_bytes: payload.to_vec() });
        pos += record_size(len);
    }
    Ok(records)
}

/// What a rollback did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rollback {
    pub records: u64,
    pub bytes_restored: u64,
}

/// Undoes the slot's transaction (protocol step 3). Idempotent.
pub fn rollback(region: &dyn Region, layout: &Layout, slot: u32) -> Result<Rollback, Error> {
    let records = read_records(region, layout, slot)?;
    if records.is_empty() {
        return Ok(Rollback::default());
    }
    let mut done = Rollback::default();
    // Newest first, so that when a range was snapshotted twice the oldest bytes win.
    for record in records.iter().rev() {
        region.write(record.target, &record.old_bytes);
        done.records += 1;
        done.bytes_restored += record.old_bytes.len() as u64;
    }
    for record in &records {
        region.flush(record.target, record.old_bytes.len() as u64);
    }
    region.fence();
    let tail = layout.slot_offset(slot) + TAIL_OFFSET;
    region.store_u64(tail, encode_tail(0));
    region.persist(tail, 8);
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvram::{FormatParams, SimRegion};

    fn formatted() -> (SimRegion, Layout) {
        let params = FormatParams { region_size: 1 << 20, undo_slots: 2, undo_slot_size: 16384 };
        let region = SimRegion::new(params.region_size);
        let layout = crate::Pool::format(&region, params).unwrap();
        (region, layout)
    }

    fn append(region: &SimRegion, layout: &Layout, records: &[(u64, &[u8])]) {
        let base = layout.slot_offset(0);
        let mut pos = base + SLOT_HEADER_SIZE;
        for (i, (target, old)) in records.iter().enumerate() {
            let rec = encode_record(*target, i as u64, old);
            region.write(pos, &rec);
            pos += rec.len() as u64;
        }
        region.store_u64(base + TAIL_OFFSET, encode_tail(pos - base - SLOT_HEADER_SIZE));
    }

    #[test]
    fn rollback_restores_the_oldest_snapshot_of_overlapping_records() {
        // The transaction layer never logs a byte twice, but recovery must not depend on that.
        let (region, layout) = formatted();
        let target = layout.frame_offset(0);
        region.write(target, b"CCCC");
        append(&region, &layout, &[(target, b"AAAA"), (target + 2, b"BB")]);
        let done = rollback(&region, &layout, 0).unwrap();
        assert_eq!(done, Rollback { records: 2, bytes_restored: 6 });
        assert_eq!(region.read_vec(target, 4), b"AAAA");
        assert_eq!(read_slot_used(&region, &layout, 0).unwrap(), 0);
    }

    #[test]
    fn rollback_is_idempotent() {
        let (region, layout) = formatted();
        let target = layout.frame_offset(1);
        region.write(target, b"new!");
        append(&region, &layout, &[(target, b"old.")]);
        let image = region.current();
        rollback(&region, &layout, 0).unwrap();
        // A crash right after the data was written back, before the tail was cleared:
        let again = SimRegion::from_image(image);
        again.write(target, b"old.");
        rollback(&again, &layout, 0).unwrap();
        assert_eq!(again.read_vec(target, 4), b"old.");
    }

    #[test]
    fn a_record_aimed_outside_the_data_areas_is_damage() {
        let (region, layout) = formatted();
        append(&region, &layout, &[(0, b"superblock!")]);
        let err = read_records(&region, &layout, 0).unwrap_err().to_string();
        assert!(err.contains("outside the data areas"), "{err}");
    }
}
