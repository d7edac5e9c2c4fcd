//! Journal mode's group log: the persistent half of VM-aware journaling (docs/design.md
//! section 12). The running group's *retained buffers* - the committed content of every page
//! the group changed - are page copies in the undo area, which journal mode uses as one log.
//!
//! Protocol (the proof by cases is in docs/design.md 12.4; the volatile half is `group.rs`):
//! 1. first change of a page P in group g (`Tx::snapshot`, `Tx::alloc_frame` of a frame freed
//!    in g): copy P into log copy i, write entry i = (P, g, i, checksum of the copy, checksum of
//!    the entry) into both entry tables, with `write_retained` (the log stays write-protected);
//!    persist the batch (one fence). Only now may P change. A frame that was free when g began
//!    needs no copy (its bytes mean nothing if g is rolled back: the restored descriptor says
//!    free).
//! 2. group commit: persist every range the group stored to, then store generation g + 1 in
//!    the generation word and persist it: **the commit point** (one atomic store makes every
//!    entry of g dead). Then write-protect the changed pages again in batch.
//! 3. recovery (`Pool::open`): every entry of generation g whose copy is intact is written back
//!    to its page, persisted, then generation g + 1 is stored. Idempotent: it only reads the log.
//!
//! Area format (undo area = `undo_slots x undo_slot_size` bytes at `undo_offset`):
//!
//! ```text
//!  0   40  slot 0's header as format wrote it (magic, index, size, checksum, tail = 0)
//! 40    8  area format word: 0 = undo slots, "NVSJRNL1" = group log      (one atomic store)
//! 48    8  generation word: bits 0..48 generation g, bits 48..64 = XXH3-64(g) & 0xffff
//! 56    8  zero
//! 64   ..  entry table A: `capacity` entries of 40 bytes; entry table B: the same again
//! ...      page copies: copy i at `copies + 4096 i`, page aligned
//!
//! entry (40 bytes)
//!  0    8  target: region offset of the page (a root, descriptor or frame page)
//!  8    8  generation of the group that wrote it
//! 16    8  index i
//! 24    8  XXH3-64 of the 4096 bytes of copy i
//! 32    8  XXH3-64 of bytes 0..32
//! ```
//!
//! Verification at recovery, entry by entry (no order needed): an entry *exists* when table A
//! or B holds it intact (entry checksum) with the running generation and its own index - two
//! intact copies that differ are damage. An existing entry whose copy is intact is *live*: its
//! copy is written back. One whose copy is not intact belongs to the batch a crash tore, if its
//! page still has the copy's checksum (the page has not changed: it changes only after its
//! batch's fence); otherwise its batch was durable, so the copy is damaged, and the open is
//! refused with the area named, like a bad undo record below a tail. A single flip anywhere in
//! the live log is therefore either corrected (the other table) or reported, never skipped.
//!
//! The mode switch (the area's format) is one atomic store of the format word, made after
//! everything the new format needs is durable: a crash during a switch leaves the old format,
//! complete.

use std::collections::BTreeSet;

use nvram::checksum::checksum;
use nvram::layout::{Field, Layout, PAGE_SIZE, contiguous, get_u64, put_u64};
use nvram::{Area, Error, Region};

use crate::undo;

/// Offset of the area format word in slot 0's header.
pub const FORMAT_WORD_OFFSET: u64 = 40;
/// Offset of the generation word in slot 0's header.
pub const GENERATION_OFFSET: u64 = 48;
/// The format word of an area holding the group log.
pub const FORMAT_GROUP_LOG: u64 = u64::from_le_bytes(*b"NVSJRNL1");
/// Offset of entry 0 of table A from the start of the area.
pub const TABLE_OFFSET: u64 = 64;
pub const ENTRY_SIZE: u64 = 40;
/// Entry tables: A, and its mirror B right after it.
const TABLES: u64 = 2;
/// Generations use the low 48 bits of the generation word (2^48 groups: 9000 years at one
/// group commit per millisecond).
const GENERATION_BITS: u32 = 48;
const GENERATION_MASK: u64 = (1 << GENERATION_BITS) - 1;

/// A log entry's byte table (docs/design.md section 12.2).
pub const ENTRY_LAYOUT: &[Field] = &[
    (0, 8, "target"),
    (8, 8, "generation"),
    (16, 8, "index"),
    (24, 8, "copy checksum"),
    (32, 8, "entry checksum"),
];

/// The journal header words in slot 0's header (docs/design.md section 12.2).
pub const HEADER_LAYOUT: &[Field] = &[
    (0, 40, "slot 0 header"),
    (FORMAT_WORD_OFFSET as usize, 8, "area format word"),
    (GENERATION_OFFSET as usize, 8, "generation word"),
    (56, 8, "zero"),
];

const _: () = {
    assert!(contiguous(ENTRY_LAYOUT, ENTRY_SIZE as usize));
    assert!(contiguous(HEADER_LAYOUT, TABLE_OFFSET as usize));
    assert!(TABLE_OFFSET == undo::SLOT_HEADER_SIZE);
};

/// What the undo area holds: the mode of the running transactions or group, as recorded in the
/// area itself (so that an open after a crash knows how to recover, whatever mode it asks for).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AreaFormat {
    /// Per-transaction undo slots (undo and none modes).
    UndoSlots,
    /// One group log (journal mode).
    GroupLog,
}

/// Where the group log's parts are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct LogGeometry {
    /// Region offset of the undo area.
    pub area: u64,
    pub area_len: u64,
    /// Page copies the log holds: the most pages one group can change (besides fresh frames).
    pub capacity: u64,
    /// Region offset of copy 0 (page aligned).
    pub copies: u64,
}

fn table_end(entries: u64) -> u64 {
    (TABLE_OFFSET + TABLES * entries * ENTRY_SIZE).div_ceil(PAGE_SIZE) * PAGE_SIZE
}

impl LogGeometry {
    pub fn of(layout: &Layout) -> LogGeometry {
        let area = layout.undo_offset;
        let area_len = u64::from(layout.undo_slots) * layout.undo_slot_size;
        let mut capacity = (area_len - TABLE_OFFSET) / (PAGE_SIZE + TABLES * ENTRY_SIZE);
        while capacity > 0 && table_end(capacity) + capacity * PAGE_SIZE > area_len {
            capacity -= 1;
        }
        LogGeometry { area, area_len, capacity, copies: area + table_end(capacity) }
    }

    /// Offset of entry `index` in table `table` (0 = A, 1 = B).
    pub fn entry_offset(&self, table: u64, index: u64) -> u64 {
        assert!(index < self.capacity && table < TABLES, "log entry {index} of {}", self.capacity);
        self.area + TABLE_OFFSET + (table * self.capacity + index) * ENTRY_SIZE
    }

    pub fn copy_offset(&self, index: u64) -> u64 {
        assert!(index < self.capacity, "log copy {index} of {}", self.capacity);
        self.copies + index * PAGE_SIZE
    }
}

fn check16(generation: u64) -> u64 {
    checksum(&[&generation.to_le_bytes()]) & 0xffff
}

pub fn encode_generation(generation: u64) -> u64 {
    assert!(
        generation > 0 && generation <= GENERATION_MASK,
        "generation {generation} out of range"
    );
    generation | (check16(generation) << GENERATION_BITS)
}

/// The generation in the word; 0 for a zero word (a region never journaled).
pub fn decode_generation(word: u64) -> Result<u64, Error> {
    if word == 0 {
        return Ok(0);
    }
    let generation = word & GENERATION_MASK;
    if generation == 0 || word >> GENERATION_BITS != check16(generation) {
        return Err(Error::corrupt(
            Area::UndoSlot(0),
            format!("journal generation word fails its check ({word:#018x})"),
        ));
    }
    Ok(generation)
}

pub fn read_generation(region: &dyn Region, layout: &Layout) -> Result<u64, Error> {
    decode_generation(region.load_u64(layout.undo_offset + GENERATION_OFFSET))
}

/// Reads the area format word; anything but the two formats is damage.
pub fn read_format(region: &dyn Region, layout: &Layout) -> Result<AreaFormat, Error> {
    match region.load_u64(layout.undo_offset + FORMAT_WORD_OFFSET) {
        0 => Ok(AreaFormat::UndoSlots),
        FORMAT_GROUP_LOG => Ok(AreaFormat::GroupLog),
        word => Err(Error::corrupt(
            Area::UndoSlot(0),
            format!("unknown undo area format word {word:#018x}"),
        )),
    }
}

/// Encodes entry `index` of generation `generation` for a copy of the page at `target`.
pub fn encode_entry(
    target: u64,
    generation: u64,
    index: u64,
    copy: &[u8],
) -> [u8; ENTRY_SIZE as usize] {
    assert_eq!(copy.len() as u64, PAGE_SIZE);
    let mut e = [0u8; ENTRY_SIZE as usize];
    put_u64(&mut e, 0, target);
    put_u64(&mut e, 8, generation);
    put_u64(&mut e, 16, index);
    put_u64(&mut e, 24, checksum(&[copy]));
    let sum = checksum(&[&e[..32]]);
    put_u64(&mut e, 32, sum);
    e
}

/// An intact entry: (target, copy checksum), if `e` is entry `index` of `generation`.
fn decode_entry(e: &[u8], generation: u64, index: u64) -> Option<(u64, u64)> {
    let intact = checksum(&[&e[..32]]) == get_u64(e, 32);
    (intact && get_u64(e, 8) == generation && get_u64(e, 16) == index)
        .then(|| (get_u64(e, 0), get_u64(e, 24)))
}

/// A live entry of the running group: its copy is intact and is written back by recovery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveEntry {
    pub index: u64,
    pub target: u64,
}

/// True when `target` is a whole page that transactions may change (root, descriptor or frame
/// page).
pub fn is_data_page(layout: &Layout, target: u64) -> bool {
    target % PAGE_SIZE == 0 && undo::is_data_range(layout, target, PAGE_SIZE)
}

/// Reads and verifies the entries of the running group (protocol step 3, and the module docs'
/// verification rule); returns the live ones, by index. Call only on an area in group-log
/// format.
pub fn read_group(region: &dyn Region, layout: &Layout) -> Result<Vec<LiveEntry>, Error> {
    let geo = LogGeometry::of(layout);
    // Slot 0's header stays valid in both formats; its tail is 0 in group-log format.
    if undo::read_slot_used(region, layout, 0)? != 0 {
        return Err(Error::corrupt(Area::UndoSlot(0), "a group log with a non-zero undo tail"));
    }
    let generation = read_generation(region, layout)?;
    if generation == 0 {
        return Err(Error::corrupt(Area::UndoSlot(0), "a group log without a generation"));
    }
    let bytes = (geo.capacity * ENTRY_SIZE) as usize;
    let tables = [
        region.read_vec(geo.entry_offset(0, 0), bytes),
        region.read_vec(geo.entry_offset(1, 0), bytes),
    ];
    let bad =
        |detail: String| Err(Error::corrupt(Area::UndoSlot(0), format!("group log: {detail}")));
    let mut live = Vec::new();
    let mut targets = BTreeSet::new();
    for i in 0..geo.capacity {
        let at = (i * ENTRY_SIZE) as usize..((i + 1) * ENTRY_SIZE) as usize;
        let (a, b) = (
            decode_entry(&tables[0][at.clone()], generation, i),
            decode_entry(&tables[1][at], generation, i),
        );
        let (target, copy_sum) = match (a, b) {
            (Some(a), Some(b)) if a != b => {
                return bad(format!("entry {i}: the two tables differ"));
            }
            (Some(e), _) | (None, Some(e)) => e,
            (None, None) => continue,
        };
        if !is_data_page(layout, target) {
            return bad(format!("entry {i} targets {target}, not a data page"));
        }
        if !targets.insert(target) {
            return bad(format!("page {target} logged twice in one group (entry {i})"));
        }
        let copy = region.read_vec(geo.copy_offset(i), PAGE_SIZE as usize);
        if checksum(&[&copy]) == copy_sum {
            live.push(LiveEntry { index: i, target });
        } else if checksum(&[&region.read_vec(target, PAGE_SIZE as usize)]) != copy_sum {
            // The page changed, so the batch was durable: its copy is damaged.
            return bad(format!("copy {i} (of page {target}) is damaged and its page has changed"));
        }
        // Else a torn batch: the page never changed, nothing to restore.
    }
    Ok(live)
}

/// What a group rollback did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GroupRollback {
    pub pages_restored: u64,
}

/// Rolls the running group back to its start (protocol step 3): every live copy written back,
/// persisted, then the next generation stored (every entry dead). Idempotent.
pub fn rollback_group(region: &dyn Region, layout: &Layout) -> Result<GroupRollback, Error> {
    let live = read_group(region, layout)?;
    if live.is_empty() {
        return Ok(GroupRollback::default());
    }
    let geo = LogGeometry::of(layout);
    for entry in &live {
        let copy = region.read_vec(geo.copy_offset(entry.index), PAGE_SIZE as usize);
        region.write(entry.target, &copy);
        region.flush(entry.target, PAGE_SIZE);
    }
    region.fence();
    let generation = read_generation(region, layout)?;
    let word = layout.undo_offset + GENERATION_OFFSET;
    region.store_u64(word, encode_generation(generation + 1));
    region.persist(word, 8);
    Ok(GroupRollback { pages_restored: live.len() as u64 })
}

/// Switches an area in undo-slot format with every slot empty to the group-log format: a new
/// generation first (above every entry a previous journal epoch may have left), then the format
/// word, each persisted.
pub fn convert_to_group_log(region: &dyn Region, layout: &Layout) -> Result<(), Error> {
    for slot in 0..layout.undo_slots {
        assert_eq!(undo::read_slot_used(region, layout, slot)?, 0, "slot {slot} not rolled back");
    }
    let generation = read_generation(region, layout)?;
    let word = layout.undo_offset + GENERATION_OFFSET;
    region.store_u64(word, encode_generation(generation + 1));
    region.persist(word, 8);
    // THE SWITCH: from here on the area is a group log (with no live entry).
    region.store_u64(layout.undo_offset + FORMAT_WORD_OFFSET, FORMAT_GROUP_LOG);
    region.persist(layout.undo_offset + FORMAT_WORD_OFFSET, 8);
    Ok(())
}

/// Switches an area in group-log format with no live entry back to undo slots: the headers of
/// slots 1.. (which the log overwrote) rewritten and persisted, then the format word cleared.
pub fn convert_to_undo_slots(region: &dyn Region, layout: &Layout) -> Result<(), Error> {
    assert!(read_group(region, layout)?.is_empty(), "group log not rolled back");
    for slot in 1..layout.undo_slots {
        undo::write_slot_header(region, layout, slot);
    }
    region.fence();
    // THE SWITCH: from here on the area is undo slots, every one empty.
    region.store_u64(layout.undo_offset + FORMAT_WORD_OFFSET, 0);
    region.persist(layout.undo_offset + FORMAT_WORD_OFFSET, 8);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvram::{FormatParams, SimRegion};

    fn formatted(slots: u32, slot_size: u64) -> (SimRegion, Layout) {
        let params =
            FormatParams { region_size: 2 << 20, undo_slots: slots, undo_slot_size: slot_size };
        let region = SimRegion::new(params.region_size);
        let layout = crate::Pool::format(&region, params).unwrap();
        (region, layout)
    }

    #[test]
    fn geometry_fills_the_area_with_page_aligned_copies() {
        for (slots, size) in [(1, 8192), (2, 32768), (16, 1_114_112), (3, 65536)] {
            let params =
                FormatParams { region_size: 64 << 20, undo_slots: slots, undo_slot_size: size };
            let layout = Layout::compute(params).unwrap();
            let geo = LogGeometry::of(&layout);
            assert_eq!(geo.copies % PAGE_SIZE, 0);
            let end = geo.copies + geo.capacity * PAGE_SIZE;
            assert!(end <= layout.desc_offset, "{slots} x {size}: log past the area");
            assert!(layout.desc_offset - end < PAGE_SIZE + 2 * ENTRY_SIZE + PAGE_SIZE, "wasted");
        }
        let layout = Layout::compute(FormatParams::default()).unwrap();
        assert_eq!(LogGeometry::of(&layout).capacity, 4268);
    }

    #[test]
    fn generation_word_detects_every_single_bit_flip() {
        let word = encode_generation(12345);
        assert_eq!(decode_generation(word).unwrap(), 12345);
        for bit in 0..64 {
            let flipped = word ^ (1 << bit);
            assert!(decode_generation(flipped).is_err(), "bit {bit}");
        }
    }

    fn log_page(region: &SimRegion, layout: &Layout, index: u64, target: u64) {
        let geo = LogGeometry::of(layout);
        let generation = read_generation(region, layout).unwrap();
        let copy = region.read_vec(target, PAGE_SIZE as usize);
        region.write(geo.copy_offset(index), &copy);
        let entry = encode_entry(target, generation, index, &copy);
        region.write(geo.entry_offset(0, index), &entry);
        region.write(geo.entry_offset(1, index), &entry);
    }

    #[test]
    fn rollback_restores_logged_pages_and_is_idempotent() {
        let (region, layout) = formatted(2, 32768);
        convert_to_group_log(&region, &layout).unwrap();
        let (a, b) = (layout.frame_offset(0), layout.frame_offset(3));
        region.write(a, &[1; 4096]);
        log_page(&region, &layout, 0, a);
        log_page(&region, &layout, 1, b);
        region.write(a, &[2; 4096]);
        region.write(b, &[3; 100]);
        let image = region.current();
        assert_eq!(rollback_group(&region, &layout).unwrap().pages_restored, 2);
        assert_eq!(region.read_vec(a, 4096), vec![1; 4096]);
        assert_eq!(region.read_vec(b, 100), vec![0; 100]);
        assert!(read_group(&region, &layout).unwrap().is_empty(), "the entries are dead");
        // A crash after the copies were written back, before the new generation was stored:
        let again = SimRegion::from_image(image);
        again.write(a, &[1; 4096]);
        assert_eq!(rollback_group(&again, &layout).unwrap().pages_restored, 2);
        assert_eq!(again.read_vec(a, 4096), vec![1; 4096]);
    }

    #[test]
    fn a_damaged_entry_is_read_from_its_mirror_and_a_damaged_copy_is_reported() {
        let (region, layout) = formatted(2, 32768);
        convert_to_group_log(&region, &layout).unwrap();
        let (a, b) = (layout.frame_offset(0), layout.frame_offset(1));
        region.write(a, &[1; 4096]);
        log_page(&region, &layout, 0, a);
        log_page(&region, &layout, 1, b);
        region.write(a, &[2; 4096]);
        let geo = LogGeometry::of(&layout);
        // Entry 0 damaged in table A: table B still has it.
        region.flip_bit(geo.entry_offset(0, 0) + 3, 1);
        let live = read_group(&region, &layout).unwrap();
        assert_eq!(live.iter().map(|e| e.target).collect::<Vec<_>>(), vec![a, b]);
        // Copy 1 bad while its page is unchanged: a torn batch, nothing to restore.
        region.flip_bit(geo.copy_offset(1) + 100, 1);
        assert_eq!(read_group(&region, &layout).unwrap().len(), 1);
        // Copy 0 bad while its page changed: the batch was durable, so this is damage.
        region.flip_bit(geo.copy_offset(0) + 100, 1);
        let err = read_group(&region, &layout).unwrap_err().to_string();
        assert!(err.contains("copy 0") && err.contains("undo log slot 0"), "{err}");
    }

    #[test]
    fn switching_formats_both_ways_keeps_the_slots_valid() {
        let (region, layout) = formatted(3, 16384);
        assert_eq!(read_format(&region, &layout).unwrap(), AreaFormat::UndoSlots);
        convert_to_group_log(&region, &layout).unwrap();
        assert_eq!(read_format(&region, &layout).unwrap(), AreaFormat::GroupLog);
        // The log overwrites the headers of slots 1..
        let geo = LogGeometry::of(&layout);
        region.write(layout.slot_offset(1), &[0xee; 64]);
        assert!(undo::read_slot_used(&region, &layout, 1).is_err());
        assert_eq!(read_generation(&region, &layout).unwrap(), 1);
        convert_to_undo_slots(&region, &layout).unwrap();
        assert_eq!(read_format(&region, &layout).unwrap(), AreaFormat::UndoSlots);
        for slot in 0..3 {
            assert_eq!(undo::read_slot_used(&region, &layout, slot).unwrap(), 0);
        }
        convert_to_group_log(&region, &layout).unwrap();
        assert_eq!(read_generation(&region, &layout).unwrap(), 2, "generations never repeat");
        assert!(geo.capacity > 0);
    }
}
