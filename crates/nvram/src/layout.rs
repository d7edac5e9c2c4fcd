//! The region's layout: where each area lives, the superblock that records it, and the state
//! word. Every size is fixed at format time and checked at open.
//!
//! ```text
//!  offset 0          4 KiB      8 KiB      12 KiB                                        size
//!  +-----------------+----------+----------+-------------------+----------------+--------------+
//!  | superblock      | state    | root     | undo log          | frame          | frames       |
//!  | (static, hashed)| word     | area     | slots x slot_size | descriptors    | nr x 4 KiB   |
//!  +-----------------+----------+----------+-------------------+----------------+--------------+
//! ```
//!
//! - **Superblock** (4 KiB, written once by `format`, never again): magic, format version,
//!   incompatible-feature flags, uuid, the geometry below, and an XXH3-64 over the page's first
//!   4088 bytes stored in its last 8. The first 16 bytes (magic, version, features) and the
//!   checksum's place and algorithm are the same in every format version, so a newer region is
//!   recognised as such rather than as damaged.
//! - **State word** (one 8-byte word, updated with single atomic stores): bit 0 = clean
//!   shutdown, bits 1..32 = mount count, the high 32 bits = the bitwise complement of the low 32
//!   (a self-check: a flipped bit is detected, an atomic store cannot tear).
//! - **Root area** (4 KiB): the anchor of the layers above (object table roots, the lower
//!   directory this region belongs to); changed only inside transactions. Zero at format.
//! - **Undo log**: one slot per worker thread; format in `txn::undo`.
//! - **Frame descriptors**: 32 bytes per frame; format in `txn::frames`.
//! - **Frames**: 4 KiB each, page aligned.
//!
//! Invariants checked at open (L1-L4):
//! - L1 every area is page aligned, areas are in the order drawn and do not overlap;
//! - L2 the frames end at or before the region's length (the file may not have shrunk);
//! - L3 `undo_slots` and `undo_slot_size` are within `UNDO_SLOTS_MAX` / the slot size limits;
//! - L4 the descriptor area holds exactly `nr_frames` descriptors rounded up to a page.

use crate::checksum::checksum;
use crate::error::{Area, Error, Result};
use crate::region::Region;

pub const MAGIC: [u8; 8] = *b"NVSTACK\0";
/// The format version this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;
pub const PAGE_SIZE: u64 = 4096;
pub const FRAME_SIZE: u64 = 4096;
pub const DESCRIPTOR_SIZE: u64 = 32;
pub const SUPERBLOCK_OFFSET: u64 = 0;
pub const STATE_OFFSET: u64 = PAGE_SIZE;
pub const ROOT_OFFSET: u64 = 2 * PAGE_SIZE;
pub const ROOT_SIZE: u64 = PAGE_SIZE;
pub const UNDO_OFFSET: u64 = 3 * PAGE_SIZE;

pub const UNDO_SLOTS_MAX: u32 = 256;
pub const UNDO_SLOT_SIZE_MIN: u64 = 2 * PAGE_SIZE;
pub const UNDO_SLOT_SIZE_MAX: u64 = 1 << 30;
/// A region with fewer frames than this is refused: it could not hold one file's metadata.
pub const FRAMES_MIN: u64 = 16;
/// 16 TiB: beyond any NVRAM we expect, and it keeps every offset far from u64 overflow.
pub const REGION_SIZE_MAX: u64 = 1 << 44;

/// The default number of undo slots: more than the FUSE worker threads we run.
pub const DEFAULT_UNDO_SLOTS: u32 = 16;
/// The default slot size: a 1 MiB write (FUSE max_write) plus its descriptors fits.
pub const DEFAULT_UNDO_SLOT_SIZE: u64 = (1 << 20) + (64 << 10);

/// Superblock byte offsets (see the table in docs/design.md).
mod sb {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 8;
    pub const INCOMPAT: usize = 12;
    pub const UUID: usize = 16;
    pub const REGION_SIZE: usize = 32;
    pub const PAGE_SIZE: usize = 40;
    pub const FRAME_SIZE: usize = 44;
    pub const UNDO_OFFSET: usize = 48;
    pub const UNDO_SLOTS: usize = 56;
    pub const UNDO_SLOT_SIZE: usize = 60;
    pub const DESC_OFFSET: usize = 64;
    pub const DESC_BYTES: usize = 72;
    pub const NR_FRAMES: usize = 80;
    pub const FRAMES_OFFSET: usize = 88;
    pub const ROOT_OFFSET: usize = 96;
    pub const ROOT_SIZE: usize = 104;
    pub const STATE_OFFSET: usize = 112;
    pub const CHECKSUM: usize = 4088;
}

/// One field of an on-media byte table: (offset, size, name). Every persistent structure's
/// table is such a constant next to the code that encodes it; docs/design.md shows the same
/// tables and a test (`crates/core/tests/design_tables.rs`) keeps the two equal.
pub type Field = (usize, usize, &'static str);

/// True when the fields follow each other without gap or overlap and end at `size` (checked
/// at compile time for every table: `const _: () = assert!(contiguous(...))`).
pub const fn contiguous(fields: &[Field], size: usize) -> bool {
    let mut at = 0;
    let mut i = 0;
    while i < fields.len() {
        if fields[i].0 != at {
            return false;
        }
        at += fields[i].1;
        i += 1;
    }
    at == size
}

/// The superblock's byte table.
pub const SUPERBLOCK_LAYOUT: &[Field] = &[
    (sb::MAGIC, 8, "magic"),
    (sb::VERSION, 4, "format_version"),
    (sb::INCOMPAT, 4, "incompat_features"),
    (sb::UUID, 16, "uuid"),
    (sb::REGION_SIZE, 8, "region_size"),
    (sb::PAGE_SIZE, 4, "page_size"),
    (sb::FRAME_SIZE, 4, "frame_size"),
    (sb::UNDO_OFFSET, 8, "undo_offset"),
    (sb::UNDO_SLOTS, 4, "undo_slots"),
    (sb::UNDO_SLOT_SIZE, 4, "undo_slot_size"),
    (sb::DESC_OFFSET, 8, "desc_offset"),
    (sb::DESC_BYTES, 8, "desc_bytes"),
    (sb::NR_FRAMES, 8, "nr_frames"),
    (sb::FRAMES_OFFSET, 8, "frames_offset"),
    (sb::ROOT_OFFSET, 8, "root_offset"),
    (sb::ROOT_SIZE, 8, "root_size"),
    (sb::STATE_OFFSET, 8, "state_offset"),
    (sb::STATE_OFFSET + 8, sb::CHECKSUM - sb::STATE_OFFSET - 8, "zero"),
    (sb::CHECKSUM, 8, "checksum"),
];

const _: () = assert!(contiguous(SUPERBLOCK_LAYOUT, PAGE_SIZE as usize), "superblock table");

/// What `format` is asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FormatParams {
    pub region_size: u64,
    pub undo_slots: u32,
    pub undo_slot_size: u64,
}

impl Default for FormatParams {
    fn default() -> Self {
        FormatParams {
            region_size: 256 << 20,
            undo_slots: DEFAULT_UNDO_SLOTS,
            undo_slot_size: DEFAULT_UNDO_SLOT_SIZE,
        }
    }
}

/// The decoded superblock: the region's geometry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Layout {
    pub version: u32,
    pub uuid: uuid::Uuid,
    pub region_size: u64,
    pub undo_offset: u64,
    pub undo_slots: u32,
    pub undo_slot_size: u64,
    pub desc_offset: u64,
    pub desc_bytes: u64,
    pub nr_frames: u64,
    pub frames_offset: u64,
}

impl Layout {
    /// Computes the geometry for `params`, or says why it is impossible.
    pub fn compute(params: FormatParams) -> Result<Layout> {
        if params.undo_slots == 0 || params.undo_slots > UNDO_SLOTS_MAX {
            return Err(Error::BadParameter(format!(
                "undo slots must be 1..={UNDO_SLOTS_MAX}, got {}",
                params.undo_slots
            )));
        }
        if !(UNDO_SLOT_SIZE_MIN..=UNDO_SLOT_SIZE_MAX).contains(&params.undo_slot_size)
            || params.undo_slot_size % PAGE_SIZE != 0
        {
            return Err(Error::BadParameter(format!(
                "undo slot size must be a multiple of {PAGE_SIZE} in {UNDO_SLOT_SIZE_MIN}..={UNDO_SLOT_SIZE_MAX}, got {}",
                params.undo_slot_size
            )));
        }
        if params.region_size > REGION_SIZE_MAX {
            return Err(Error::BadParameter(format!(
                "region size must be at most {REGION_SIZE_MAX} bytes, got {}",
                params.region_size
            )));
        }
        let desc_offset = UNDO_OFFSET + u64::from(params.undo_slots) * params.undo_slot_size;
        let min = desc_offset + desc_bytes_for(FRAMES_MIN) + FRAMES_MIN * FRAME_SIZE;
        if params.region_size < min {
            return Err(Error::TooSmall { size: params.region_size, min });
        }
        let usable = params.region_size - desc_offset;
        let mut nr_frames = usable / (FRAME_SIZE + DESCRIPTOR_SIZE);
        while desc_bytes_for(nr_frames) + nr_frames * FRAME_SIZE > usable {
            nr_frames -= 1;
        }
        let layout = Layout {
            version: FORMAT_VERSION,
            uuid: uuid::Uuid::new_v4(),
            region_size: params.region_size,
            undo_offset: UNDO_OFFSET,
            undo_slots: params.undo_slots,
            undo_slot_size: params.undo_slot_size,
            desc_offset,
            desc_bytes: desc_bytes_for(nr_frames),
            nr_frames,
            frames_offset: desc_offset + desc_bytes_for(nr_frames),
        };
        layout.validate(params.region_size)?;
        Ok(layout)
    }

    /// Checks invariants L1-L4 against a region of `region_len` bytes.
    pub fn validate(&self, region_len: u64) -> Result<()> {
        let bad = |detail: String| Err(Error::corrupt(Area::Superblock, detail));
        let aligned = [self.undo_offset, self.undo_slot_size, self.desc_offset, self.frames_offset]
            .iter()
            .all(|v| v % PAGE_SIZE == 0);
        if !aligned {
            return bad("an area is not page aligned".into());
        }
        if self.undo_offset != UNDO_OFFSET {
            return bad(format!("undo log at {} instead of {UNDO_OFFSET}", self.undo_offset));
        }
        if self.undo_slots == 0
            || self.undo_slots > UNDO_SLOTS_MAX
            || !(UNDO_SLOT_SIZE_MIN..=UNDO_SLOT_SIZE_MAX).contains(&self.undo_slot_size)
        {
            return bad(format!(
                "undo geometry out of limits: {} slots of {} bytes",
                self.undo_slots, self.undo_slot_size
            ));
        }
        let undo_end = self.undo_offset + u64::from(self.undo_slots) * self.undo_slot_size;
        if self.desc_offset != undo_end {
            return bad(format!(
                "descriptors at {} but undo log ends at {undo_end}",
                self.desc_offset
            ));
        }
        if self.nr_frames < FRAMES_MIN || self.desc_bytes != desc_bytes_for(self.nr_frames) {
            return bad(format!(
                "{} frames with {} descriptor bytes",
                self.nr_frames, self.desc_bytes
            ));
        }
        if self.frames_offset != self.desc_offset + self.desc_bytes {
            return bad("frames do not follow the descriptors".into());
        }
        let end = self.frames_offset + self.nr_frames * FRAME_SIZE;
        if end > self.region_size || self.region_size > REGION_SIZE_MAX {
            return bad(format!(
                "frames end at {end}, past the recorded size {}",
                self.region_size
            ));
        }
        if self.region_size != region_len {
            return Err(Error::corrupt(
                Area::Superblock,
                format!(
                    "the superblock records {} bytes but the region file has {region_len} \
                     (was the file truncated or extended?)",
                    self.region_size
                ),
            ));
        }
        Ok(())
    }

    /// Offset of frame `index`'s 4 KiB.
    pub fn frame_offset(&self, index: u64) -> u64 {
        assert!(index < self.nr_frames, "frame {index} out of {}", self.nr_frames);
        self.frames_offset + index * FRAME_SIZE
    }

    /// Offset of frame `index`'s descriptor.
    pub fn descriptor_offset(&self, index: u64) -> u64 {
        assert!(index < self.nr_frames, "descriptor {index} out of {}", self.nr_frames);
        self.desc_offset + index * DESCRIPTOR_SIZE
    }

    /// Offset of undo slot `slot`.
    pub fn slot_offset(&self, slot: u32) -> u64 {
        assert!(slot < self.undo_slots, "undo slot {slot} out of {}", self.undo_slots);
        self.undo_offset + u64::from(slot) * self.undo_slot_size
    }

    /// The frame that contains region offset `off`, if any.
    pub fn frame_of(&self, off: u64) -> Option<u64> {
        (off >= self.frames_offset && off < self.frames_offset + self.nr_frames * FRAME_SIZE)
            .then(|| (off - self.frames_offset) / FRAME_SIZE)
    }

    /// Serialises the superblock page.
    pub fn encode(&self) -> Vec<u8> {
        let mut page = vec![0u8; PAGE_SIZE as usize];
        page[sb::MAGIC..sb::MAGIC + 8].copy_from_slice(&MAGIC);
        put_u32(&mut page, sb::VERSION, self.version);
        put_u32(&mut page, sb::INCOMPAT, 0);
        page[sb::UUID..sb::UUID + 16].copy_from_slice(self.uuid.as_bytes());
        put_u64(&mut page, sb::REGION_SIZE, self.region_size);
        put_u32(&mut page, sb::PAGE_SIZE, PAGE_SIZE as u32);
        put_u32(&mut page, sb::FRAME_SIZE, FRAME_SIZE as u32);
        put_u64(&mut page, sb::UNDO_OFFSET, self.undo_offset);
        put_u32(&mut page, sb::UNDO_SLOTS, self.undo_slots);
        put_u32(&mut page, sb::UNDO_SLOT_SIZE, self.undo_slot_size as u32);
        put_u64(&mut page, sb::DESC_OFFSET, self.desc_offset);
        put_u64(&mut page, sb::DESC_BYTES, self.desc_bytes);
        put_u64(&mut page, sb::NR_FRAMES, self.nr_frames);
        put_u64(&mut page, sb::FRAMES_OFFSET, self.frames_offset);
        put_u64(&mut page, sb::ROOT_OFFSET, ROOT_OFFSET);
        put_u64(&mut page, sb::ROOT_SIZE, ROOT_SIZE);
        put_u64(&mut page, sb::STATE_OFFSET, STATE_OFFSET);
        let sum = checksum(&[&page[..sb::CHECKSUM]]);
        put_u64(&mut page, sb::CHECKSUM, sum);
        page
    }

    /// Parses and verifies a superblock page, in the order that gives the clearest error:
    /// magic, checksum, version, fixed fields, geometry.
    pub fn decode(page: &[u8], region_len: u64) -> Result<Layout> {
        assert_eq!(page.len() as u64, PAGE_SIZE);
        if page[sb::MAGIC..sb::MAGIC + 8] != MAGIC {
            return Err(Error::NotARegion(if page.iter().all(|&b| b == 0) {
                "the superblock is all zeroes (never formatted?)".into()
            } else {
                "the superblock has a bad magic number".into()
            }));
        }
        let sum = get_u64(page, sb::CHECKSUM);
        if checksum(&[&page[..sb::CHECKSUM]]) != sum {
            return Err(Error::corrupt(Area::Superblock, "checksum mismatch"));
        }
        let version = get_u32(page, sb::VERSION);
        if version > FORMAT_VERSION {
            return Err(Error::NewerVersion { found: version, supported: FORMAT_VERSION });
        }
        if version == 0 || get_u32(page, sb::INCOMPAT) != 0 {
            return Err(Error::corrupt(Area::Superblock, "unknown version or feature flags"));
        }
        let fixed = [
            (get_u32(page, sb::PAGE_SIZE) as u64, PAGE_SIZE, "page size"),
            (get_u32(page, sb::FRAME_SIZE) as u64, FRAME_SIZE, "frame size"),
            (get_u64(page, sb::ROOT_OFFSET), ROOT_OFFSET, "root offset"),
            (get_u64(page, sb::ROOT_SIZE), ROOT_SIZE, "root size"),
            (get_u64(page, sb::STATE_OFFSET), STATE_OFFSET, "state offset"),
        ];
        for (found, expected, what) in fixed {
            if found != expected {
                return Err(Error::corrupt(
                    Area::Superblock,
                    format!("{what} is {found}, expected {expected}"),
                ));
            }
        }
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&page[sb::UUID..sb::UUID + 16]);
        let layout = Layout {
            version,
            uuid: uuid::Uuid::from_bytes(uuid),
            region_size: get_u64(page, sb::REGION_SIZE),
            undo_offset: get_u64(page, sb::UNDO_OFFSET),
            undo_slots: get_u32(page, sb::UNDO_SLOTS),
            undo_slot_size: get_u32(page, sb::UNDO_SLOT_SIZE) as u64,
            desc_offset: get_u64(page, sb::DESC_OFFSET),
            desc_bytes: get_u64(page, sb::DESC_BYTES),
            nr_frames: get_u64(page, sb::NR_FRAMES),
            frames_offset: get_u64(page, sb::FRAMES_OFFSET),
        };
        layout.validate(region_len)?;
        Ok(layout)
    }

    /// Reads and verifies the superblock of `region`.
    pub fn read(region: &dyn Region) -> Result<Layout> {
        if region.len() < UNDO_OFFSET {
            return Err(Error::NotARegion(format!(
                "{} bytes is smaller than the fixed areas ({UNDO_OFFSET} bytes)",
                region.len()
            )));
        }
        Layout::decode(&region.read_vec(SUPERBLOCK_OFFSET, PAGE_SIZE as usize), region.len())
    }

    /// Writes the superblock and the initial state word, and persists them. Only `format` calls
    /// this; the rest of the region must already be zero.
    pub fn write_new(&self, region: &dyn Region) {
        region.write(SUPERBLOCK_OFFSET, &self.encode());
        region.store_u64(STATE_OFFSET, RegionState { clean: true, mount_count: 0 }.encode());
        region.persist(SUPERBLOCK_OFFSET, UNDO_OFFSET);
    }
}

fn desc_bytes_for(nr_frames: u64) -> u64 {
    (nr_frames * DESCRIPTOR_SIZE).div_ceil(PAGE_SIZE) * PAGE_SIZE
}

/// The mutable part of the region's header: see the state word in the module docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct RegionState {
    /// True when the last user closed the region cleanly (informational: recovery always runs).
    pub clean: bool,
    /// Times the region was opened for read-write use (wraps at 2^31).
    pub mount_count: u32,
}

impl RegionState {
    pub fn encode(self) -> u64 {
        let low = u32::from(self.clean) | ((self.mount_count & 0x7fff_ffff) << 1);
        u64::from(low) | (u64::from(!low) << 32)
    }

    pub fn decode(word: u64) -> Result<RegionState> {
        let low = word as u32;
        if (word >> 32) as u32 != !low {
            return Err(Error::corrupt(
                Area::StateWord,
                format!("self-check failed ({word:#018x})"),
            ));
        }
        Ok(RegionState { clean: low & 1 == 1, mount_count: low >> 1 })
    }

    pub fn read(region: &dyn Region) -> Result<RegionState> {
        RegionState::decode(region.load_u64(STATE_OFFSET))
    }

    /// One atomic store, persisted.
    pub fn write(self, region: &dyn Region) {
        region.store_u64(STATE_OFFSET, self.encode());
        region.persist(STATE_OFFSET, 8);
    }
}

pub fn put_u32(buf: &mut [u8], off: usize, v: u32) {
    buf[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

pub fn put_u64(buf: &mut [u8], off: usize, v: u64) {
    buf[off..off + 8].copy_from_slice(&v.to_le_bytes());
}

pub fn get_u32(buf: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(buf[off..off + 4].try_into().expect("4 bytes"))
}

pub fn get_u64(buf: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(buf[off..off + 8].try_into().expect("8 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::SimRegion;

    fn small() -> FormatParams {
        FormatParams { region_size: 1 << 20, undo_slots: 2, undo_slot_size: 16 << 10 }
    }

    #[test]
    fn geometry_fits_the_region_and_uses_it() {
        for size in [1 << 20, (1 << 20) + 123, 64 << 20, 1 << 30] {
            let layout = Layout::compute(FormatParams { region_size: size, ..small() }).unwrap();
            let end = layout.frames_offset + layout.nr_frames * FRAME_SIZE;
            assert!(end <= size);
            assert!(size - end < FRAME_SIZE + DESCRIPTOR_SIZE + PAGE_SIZE, "wasted {}", size - end);
        }
    }

    #[test]
    fn superblock_round_trips() {
        let layout = Layout::compute(small()).unwrap();
        assert_eq!(Layout::decode(&layout.encode(), 1 << 20).unwrap(), layout);
    }

    #[test]
    fn every_bit_flip_in_the_superblock_is_detected() {
        let layout = Layout::compute(small()).unwrap();
        let page = layout.encode();
        for byte in 0..PAGE_SIZE as usize {
            for bit in [0, 5] {
                let mut bad = page.clone();
                bad[byte] ^= 1 << bit;
                let result = Layout::decode(&bad, 1 << 20);
                assert!(result.is_err(), "flip of bit {bit} in byte {byte} accepted");
            }
        }
    }

    #[test]
    fn newer_version_is_refused_with_its_own_error() {
        let layout = Layout { version: FORMAT_VERSION + 1, ..Layout::compute(small()).unwrap() };
        let err = Layout::decode(&layout.encode(), 1 << 20).unwrap_err();
        assert!(matches!(err, Error::NewerVersion { found: 2, supported: 1 }), "{err}");
        assert!(err.to_string().contains("newer nvstack"));
    }

    #[test]
    fn too_small_region_is_refused_with_the_minimum() {
        let err = Layout::compute(FormatParams { region_size: 64 << 10, ..small() }).unwrap_err();
        let Error::TooSmall { min, .. } = err else { panic!("{err}") };
        assert!(Layout::compute(FormatParams { region_size: min, ..small() }).is_ok());
        assert!(Layout::compute(FormatParams { region_size: min - 1, ..small() }).is_err());
    }

    #[test]
    fn truncated_region_file_is_detected() {
        let layout = Layout::compute(small()).unwrap();
        let err = Layout::decode(&layout.encode(), (1 << 20) - 4096).unwrap_err();
        assert!(err.to_string().contains("truncated"), "{err}");
    }

    #[test]
    fn state_word_detects_every_single_bit_flip() {
        let word = RegionState { clean: false, mount_count: 77 }.encode();
        assert_eq!(RegionState::decode(word).unwrap().mount_count, 77);
        for bit in 0..64 {
            assert!(RegionState::decode(word ^ (1 << bit)).is_err(), "bit {bit}");
        }
    }

    #[test]
    fn unformatted_region_is_not_a_region() {
        let region = SimRegion::new(1 << 20);
        let err = Layout::read(&region).unwrap_err();
        assert!(err.to_string().contains("never formatted"), "{err}");
    }
}
