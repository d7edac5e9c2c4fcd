//! The persistent form of the NVRAM block cache: the anchor record in the root area, and the
//! cache frames, each a header slot plus seven 512-byte sector slots (docs/nvcache.md).
//!
//! ```text
//!  root area (4 KiB, region offset 8192)      cache frame (4 KiB, descriptor kind 0x4243_0001)
//!  +------------------------------+           +--------+---------+---------+-----+---------+
//!  | anchor: magic, mode,         |           | header | slot 1  | slot 2  | ... | slot 7  |
//!  | capacity, image identity     |           | 512 B  | 512 B   | 512 B   |     | 512 B   |
//!  +------------------------------+           +--------+---------+---------+-----+---------+
//!                                              header = frame header (64 B) + entries 1..7 (64 B each)
//! ```
//!
//! Frame tag (descriptor, see `txn::frames`): kind [`KIND_FRAME`], owner 0, index 0. A frame is
//! allocated by the first absorb that needs a slot in it (fresh frame: no snapshot, F3) and
//! stays allocated; slots come and go inside it.
//!
//! Frame header (bytes 0..64 of the frame):
//!
//! ```text
//!   0   8  magic "NVSBCF01"
//!   8   8  frame number (its index in the frame area)
//!  16   4  slots per frame: 7
//!  20   4  zero
//!  24   8  XXH3-64 of bytes 0..24
//!  32  32  zero
//! ```
//!
//! Entry of slot `i` (1..=7; 64 bytes at frame offset `64 * i`; the sector is at `512 * i`).
//! A free entry is 64 zero bytes (the slot's data bytes then mean nothing):
//!
//! ```text
//!   0   8  lbn: the 512-byte sector of the device whose content the slot holds
//!   8   8  seq: write sequence number (>= 1), unique in the cache: LRW order
//!  16   4  state: 1 = resident
//!  20   2  class: the classifier's class code when the sector was last written
//!  22   2  zero
//!  24  32  zero
//!  56   8  XXH3-64 of bytes 0..56, the frame number, the slot number and the 512 data bytes
//! ```
//!
//! Anchor (root area offset 0; all zero = no cache yet):
//!
//! ```text
//!   0   8  magic "NVSBLKC1"
//!   8   4  format version: 1
//!  12   4  mode: 1 = metadata, 2 = all
//!  16   8  capacity in sectors (1 ..= 7 x frames)
//!  24   8  image size in bytes
//!  32   8  image device (st_dev)
//!  40   8  image inode (st_ino)
//!  48   4  path length (1..=2048)
//!  52   4  zero
//!  56   8  XXH3-64 of bytes 0..56 and the path
//!  64   n  canonical path of the image
//! ```
//!
//! Every change rewrites a whole entry (with the slot's data) or the whole anchor inside one
//! transaction, after a snapshot: a crash shows the old or the new entry, never a mix. The
//! checksum of an entry covers its data, so a flipped bit in a cached sector is found at
//! recovery (and by `nvstack check`), with the frame named.

use nvram::checksum::checksum;
use nvram::layout::{get_u32, get_u64, put_u32, put_u64};

use crate::classify::Class;

/// Descriptor kind of a cache frame ("BC").
pub const KIND_FRAME: u32 = 0x4243_0001;
/// Bytes of a device sector, and of a slot.
pub(crate) const SECTOR: usize = 512;
/// Sector slots per 4 KiB frame (slot 0 holds the header and the entries).
pub(crate) const SLOTS_PER_FRAME: u8 = 7;
/// Bytes of the frame header.
pub(crate) const FRAME_HEADER_SIZE: usize = 64;
/// Bytes of one entry.
pub(crate) const ENTRY_SIZE: usize = 64;
/// Bytes of the anchor without the path.
pub(crate) const ANCHOR_HEADER_SIZE: usize = 64;
/// Longest image path the anchor holds.
pub(crate) const PATH_MAX_BYTES: usize = 2048;

const FRAME_MAGIC: &[u8; 8] = b"NVSBCF01";
const ANCHOR_MAGIC: &[u8; 8] = b"NVSBLKC1";
const ANCHOR_VERSION: u32 = 1;
const STATE_RESIDENT: u32 = 1;
const ENTRY_SUM: usize = 56;

const _: () = assert!(FRAME_HEADER_SIZE + SLOTS_PER_FRAME as usize * ENTRY_SIZE == SECTOR);
const _: () = assert!((1 + SLOTS_PER_FRAME as usize) * SECTOR == 4096);
const _: () = assert!(ANCHOR_HEADER_SIZE + PATH_MAX_BYTES <= 4096);

/// Offset of slot `slot`'s entry inside its frame.
pub(crate) fn entry_offset(slot: u8) -> u64 {
    assert!((1..=SLOTS_PER_FRAME).contains(&slot), "slot {slot} out of 1..=7");
    (ENTRY_SIZE * slot as usize) as u64
}

/// Offset of slot `slot`'s sector inside its frame.
pub(crate) fn data_offset(slot: u8) -> u64 {
    assert!((1..=SLOTS_PER_FRAME).contains(&slot), "slot {slot} out of 1..=7");
    (SECTOR * slot as usize) as u64
}

/// The header of a fresh cache frame.
pub(crate) fn encode_frame_header(frame: u64) -> [u8; FRAME_HEADER_SIZE] {
    let mut b = [0u8; FRAME_HEADER_SIZE];
    b[..8].copy_from_slice(FRAME_MAGIC);
    put_u64(&mut b, 8, frame);
    put_u32(&mut b, 16, u32::from(SLOTS_PER_FRAME));
    let sum = checksum(&[&b[..24]]);
    put_u64(&mut b, 24, sum);
    b
}

/// Verifies a frame header read from frame `frame`.
pub(crate) fn check_frame_header(frame: u64, b: &[u8]) -> Result<(), &'static str> {
    if b.len() < FRAME_HEADER_SIZE || &b[..8] != FRAME_MAGIC {
        return Err("block-cache frame without its magic");
    }
    if checksum(&[&b[..24]]) != get_u64(b, 24) {
        return Err("block-cache frame header checksum mismatch");
    }
    if get_u64(b, 8) != frame {
        return Err("block-cache frame header names another frame");
    }
    if get_u32(b, 16) != u32::from(SLOTS_PER_FRAME) || get_u32(b, 20) != 0 {
        return Err("block-cache frame header with a bad slot count");
    }
    if b[32..FRAME_HEADER_SIZE].iter().any(|&x| x != 0) {
        return Err("block-cache frame header with non-zero padding");
    }
    Ok(())
}

/// A resident slot's entry (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) lbn: u64,
    pub(crate) seq: u64,
    pub(crate) class: Class,
}

fn entry_sum(b: &[u8], frame: u64, slot: u8, data: &[u8]) -> u64 {
    checksum(&[&b[..ENTRY_SUM], &frame.to_le_bytes(), &[slot], data])
}

impl Entry {
    /// Encodes the entry of `frame`/`slot` holding `data`.
    pub(crate) fn encode(&self, frame: u64, slot: u8, data: &[u8]) -> [u8; ENTRY_SIZE] {
        assert_eq!(data.len(), SECTOR, "a slot holds one sector");
        assert!(self.seq >= 1, "sequence numbers start at 1");
        let mut b = [0u8; ENTRY_SIZE];
        put_u64(&mut b, 0, self.lbn);
        put_u64(&mut b, 8, self.seq);
        put_u32(&mut b, 16, STATE_RESIDENT);
        b[20..22].copy_from_slice(&u16::from(self.class.code()).to_le_bytes());
        let sum = entry_sum(&b, frame, slot, data);
        put_u64(&mut b, ENTRY_SUM, sum);
        b
    }

    /// Decodes the entry of `frame`/`slot`: `None` when free, the entry when resident and
    /// verified (with its data), damage otherwise.
    pub(crate) fn decode(
        b: &[u8],
        frame: u64,
        slot: u8,
        data: &[u8],
    ) -> Result<Option<Entry>, &'static str> {
        if b[..ENTRY_SIZE].iter().all(|&x| x == 0) {
            return Ok(None);
        }
        if get_u32(b, 16) != STATE_RESIDENT {
            return Err("block-cache entry neither free (all zero) nor resident");
        }
        if entry_sum(b, frame, slot, data) != get_u64(b, ENTRY_SUM) {
            return Err("block-cache entry or sector checksum mismatch");
        }
        if b[22..ENTRY_SUM].iter().any(|&x| x != 0) {
            return Err("block-cache entry with non-zero padding");
        }
        let seq = get_u64(b, 8);
        if seq == 0 {
            return Err("block-cache entry with sequence number 0");
        }
        let code = u16::from_le_bytes([b[20], b[21]]);
        let class = u8::try_from(code)
            .ok()
            .and_then(Class::from_code)
            .ok_or("block-cache entry with an unknown class")?;
        Ok(Some(Entry { lbn: get_u64(b, 0), seq, class }))
    }
}

/// What the cache absorbs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum CacheMode {
    /// Only writes the classifier says are file-system metadata (and rewrites of resident
    /// sectors).
    Metadata,
    /// Every write.
    All,
}

impl CacheMode {
    pub fn as_str(self) -> &'static str {
        match self {
            CacheMode::Metadata => "metadata",
            CacheMode::All => "all",
        }
    }
    fn code(self) -> u32 {
        match self {
            CacheMode::Metadata => 1,
            CacheMode::All => 2,
        }
    }
    fn from_code(c: u32) -> Option<CacheMode> {
        match c {
            1 => Some(CacheMode::Metadata),
            2 => Some(CacheMode::All),
            _ => None,
        }
    }
}

/// The image a cache belongs to.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ImageId {
    pub size_bytes: u64,
    pub dev: u64,
    pub ino: u64,
    pub path: String,
}

impl ImageId {
    /// The identity of the image file at `path` (canonicalized).
    pub fn of(path: &std::path::Path) -> std::io::Result<ImageId> {
        use std::os::unix::fs::MetadataExt;
        let canonical = path.canonicalize()?;
        let m = std::fs::metadata(&canonical)?;
        Ok(ImageId {
            size_bytes: m.len(),
            dev: m.dev(),
            ino: m.ino(),
            path: canonical.to_string_lossy().into_owned(),
        })
    }

    /// Whether `other` is the same image: same size and inode, and the same device or path
    /// (device numbers can change across reboots; an image can be moved).
    pub(crate) fn same_image(&self, other: &ImageId) -> bool {
        self.size_bytes == other.size_bytes
            && self.ino == other.ino
            && (self.dev == other.dev || self.path == other.path)
    }
}

/// The anchor (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Anchor {
    pub(crate) mode: CacheMode,
    pub(crate) capacity_sectors: u64,
    pub(crate) image: ImageId,
}

impl Anchor {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let path = self.image.path.as_bytes();
        assert!(
            !path.is_empty() && path.len() <= PATH_MAX_BYTES,
            "image path of {} bytes",
            path.len()
        );
        assert!(self.capacity_sectors >= 1, "a cache of no sectors");
        let mut b = vec![0u8; ANCHOR_HEADER_SIZE + path.len()];
        b[..8].copy_from_slice(ANCHOR_MAGIC);
        put_u32(&mut b, 8, ANCHOR_VERSION);
        put_u32(&mut b, 12, self.mode.code());
        put_u64(&mut b, 16, self.capacity_sectors);
        put_u64(&mut b, 24, self.image.size_bytes);
        put_u64(&mut b, 32, self.image.dev);
        put_u64(&mut b, 40, self.image.ino);
        put_u32(&mut b, 48, path.len() as u32);
        b[ANCHOR_HEADER_SIZE..].copy_from_slice(path);
        let sum = checksum(&[&b[..56], path]);
        put_u64(&mut b, 56, sum);
        b
    }

    /// Whether the root area starts with an anchor's magic (else it is free or another
    /// layer's).
    pub(crate) fn is_anchor(root: &[u8]) -> bool {
        root.len() >= 8 && &root[..8] == ANCHOR_MAGIC
    }

    /// Decodes the anchor at the start of the root area `root` (4 KiB).
    pub(crate) fn decode(root: &[u8]) -> Result<Anchor, &'static str> {
        if !Anchor::is_anchor(root) || root.len() < ANCHOR_HEADER_SIZE {
            return Err("block-cache anchor without its magic");
        }
        let len = get_u32(root, 48) as usize;
        if len == 0 || len > PATH_MAX_BYTES || ANCHOR_HEADER_SIZE + len > root.len() {
            return Err("block-cache anchor with a bad path length");
        }
        let path = &root[ANCHOR_HEADER_SIZE..ANCHOR_HEADER_SIZE + len];
        if checksum(&[&root[..56], path]) != get_u64(root, 56) {
            return Err("block-cache anchor checksum mismatch");
        }
        if get_u32(root, 8) != ANCHOR_VERSION {
            return Err("block-cache anchor of an unknown format version");
        }
        if get_u32(root, 52) != 0 {
            return Err("block-cache anchor with non-zero padding");
        }
        let mode = CacheMode::from_code(get_u32(root, 12)).ok_or("block-cache anchor mode")?;
        let capacity_sectors = get_u64(root, 16);
        if capacity_sectors == 0 {
            return Err("block-cache anchor with a capacity of 0 sectors");
        }
        let path = String::from_utf8(path.to_vec()).map_err(|_| "anchor path not UTF-8")?;
        Ok(Anchor {
            mode,
            capacity_sectors,
            image: ImageId {
                size_bytes: get_u64(root, 24),
                dev: get_u64(root, 32),
                ino: get_u64(root, 40),
                path,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn anchor() -> Anchor {
        Anchor {
            mode: CacheMode::Metadata,
            capacity_sectors: 256,
            image: ImageId {
                size_bytes: 32 << 20,
                dev: 0x803,
                ino: 77,
                path: "/srv/disk.img".into(),
            },
        }
    }

    #[test]
    fn frame_header_round_trips_and_detects_every_flip() {
        let h = encode_frame_header(9);
        assert_eq!(check_frame_header(9, &h), Ok(()));
        assert!(check_frame_header(8, &h).is_err(), "a header read from another frame");
        for byte in 0..FRAME_HEADER_SIZE {
            for bit in 0..8 {
                let mut bad = h;
                bad[byte] ^= 1 << bit;
                assert!(check_frame_header(9, &bad).is_err(), "byte {byte} bit {bit}");
            }
        }
    }

    #[test]
    fn entry_round_trips_and_detects_every_flip_in_entry_and_data() {
        let data: Vec<u8> = (0..SECTOR).map(|i| (i * 7) as u8).collect();
        let e = Entry { lbn: 123_456, seq: 42, class: Class::ExtInodeTable };
        let b = e.encode(5, 3, &data);
        assert_eq!(Entry::decode(&b, 5, 3, &data), Ok(Some(e)));
        assert!(Entry::decode(&b, 5, 4, &data).is_err(), "entry moved to another slot");
        assert!(Entry::decode(&b, 6, 3, &data).is_err(), "entry moved to another frame");
        for byte in 0..ENTRY_SIZE {
            for bit in 0..8 {
                let mut bad = b;
                bad[byte] ^= 1 << bit;
                assert!(Entry::decode(&bad, 5, 3, &data).is_err(), "entry byte {byte} bit {bit}");
            }
        }
        for byte in (0..SECTOR).step_by(7) {
            let mut bad = data.clone();
            bad[byte] ^= 0x10;
            assert!(Entry::decode(&b, 5, 3, &bad).is_err(), "data byte {byte}");
        }
        // A free entry is all zero; a flip there is damage too.
        let free = [0u8; ENTRY_SIZE];
        assert_eq!(Entry::decode(&free, 5, 3, &data), Ok(None));
        for byte in 0..ENTRY_SIZE {
            let mut bad = free;
            bad[byte] ^= 0x80;
            assert!(Entry::decode(&bad, 5, 3, &data).is_err(), "free entry byte {byte}");
        }
    }

    #[test]
    fn anchor_round_trips_and_detects_every_flip() {
        let a = anchor();
        let b = a.encode();
        let mut root = vec![0u8; 4096];
        root[..b.len()].copy_from_slice(&b);
        assert_eq!(Anchor::decode(&root), Ok(a.clone()));
        for byte in 0..b.len() {
            for bit in [0, 3, 7] {
                let mut bad = root.clone();
                bad[byte] ^= 1 << bit;
                assert!(Anchor::decode(&bad).is_err(), "byte {byte} bit {bit}");
            }
        }
        let all = Anchor { mode: CacheMode::All, ..a };
        let mut root = vec![0u8; 4096];
        let enc = all.encode();
        root[..enc.len()].copy_from_slice(&enc);
        assert_eq!(Anchor::decode(&root).unwrap().mode, CacheMode::All);
    }

    #[test]
    fn image_identity_matches_by_inode_and_device_or_path() {
        let a = anchor().image;
        let moved = ImageId { path: "/elsewhere.img".into(), ..a.clone() };
        let rebooted = ImageId { dev: 1, ..a.clone() };
        let other = ImageId { ino: 78, ..a.clone() };
        let resized = ImageId { size_bytes: 1 << 20, ..a.clone() };
        assert!(a.same_image(&moved) && a.same_image(&rebooted));
        assert!(!a.same_image(&other) && !a.same_image(&resized));
        assert!(!a.same_image(&ImageId { dev: 1, path: "/x".into(), ..a.clone() }));
    }
}
