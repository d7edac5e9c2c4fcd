//! Which sectors of a device hold file-system metadata: a function of the file system's own
//! layout, read from the device (docs/nvcache.md, "Classification").
//!
//! - ext2/ext3/ext4 ([`ext`]): superblocks and their backups, group descriptor blocks (and the
//!   reserved ones), block and inode bitmaps, inode tables and the journal (inode 8) by
//!   location, from the superblock and the group descriptors; directory blocks (linear and
//!   htree), extent-tree blocks and xattr blocks by their content when they are written.
//! - FAT12/16/32 ([`fat`]): the reserved sectors (boot sector, FSInfo, backup), the FAT
//!   copies, the fixed root directory, and every cluster of every directory, found by walking
//!   the directory tree from the root over the FAT and kept current as directory clusters and
//!   FAT sectors are written.
//!
//! A classification is a hint for the cache's admission only: any classification keeps the
//! device correct (a sector in NVRAM is durable, one outside it follows the volatile cache's
//! rules, and the newest copy always wins), so an approximation costs speed, never data.
//!
//! Typical use (the device engine): [`Classifier::probe`] at attach; for each write,
//! [`Classifier::classify`] before it is applied and [`Classifier::wrote`] after, with a
//! [`SectorSource`] that reads the device as it is now (NVRAM over the volatile cache over the
//! image).

pub mod ext;
pub mod fat;

use std::io;

/// Bytes of a device sector.
pub(crate) const SECTOR_BYTES: usize = 512;

/// What a sector holds. Codes are persistent (cache entries record them): never renumber.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Class {
    /// Not metadata (file data, free space, or an unknown file system).
    Data,
    ExtSuperblock,
    ExtGroupDesc,
    ExtBitmap,
    ExtInodeTable,
    ExtJournal,
    ExtDirectory,
    ExtExtentTree,
    ExtXattr,
    /// Blocks of the resize inode (7) and the orphan file.
    ExtSpecial,
    /// FAT reserved sectors: boot sector, FSInfo, backup boot sector.
    FatBoot,
    FatTable,
    /// The fixed root directory of FAT12/16.
    FatRootDir,
    FatDirectory,
}

impl Class {
    pub(crate) const ALL: [Class; 14] = [
        Class::Data,
        Class::ExtSuperblock,
        Class::ExtGroupDesc,
        Class::ExtBitmap,
        Class::ExtInodeTable,
        Class::ExtJournal,
        Class::ExtDirectory,
        Class::ExtExtentTree,
        Class::ExtXattr,
        Class::ExtSpecial,
        Class::FatBoot,
        Class::FatTable,
        Class::FatRootDir,
        Class::FatDirectory,
    ];

    pub fn is_metadata(self) -> bool {
        self != Class::Data
    }

    /// The persistent code (cache entries).
    pub(crate) fn code(self) -> u8 {
        match self {
            Class::Data => 0,
            Class::ExtSuperblock => 1,
            Class::ExtGroupDesc => 2,
            Class::ExtBitmap => 3,
            Class::ExtInodeTable => 4,
            Class::ExtJournal => 5,
            Class::ExtDirectory => 6,
            Class::ExtExtentTree => 7,
            Class::ExtXattr => 8,
            Class::ExtSpecial => 9,
            Class::FatBoot => 16,
            Class::FatTable => 17,
            Class::FatRootDir => 18,
            Class::FatDirectory => 19,
        }
    }

    pub(crate) fn from_code(code: u8) -> Option<Class> {
        Class::ALL.into_iter().find(|c| c.code() == code)
    }

    /// The name used in counters (`nvcache.absorbed_by_class.<name>`) and by `inspect`.
    pub fn name(self) -> &'static str {
        match self {
            Class::Data => "data",
            Class::ExtSuperblock => "ext.superblock",
            Class::ExtGroupDesc => "ext.group_desc",
            Class::ExtBitmap => "ext.bitmap",
            Class::ExtInodeTable => "ext.inode_table",
            Class::ExtJournal => "ext.journal",
            Class::ExtDirectory => "ext.directory",
            Class::ExtExtentTree => "ext.extent_tree",
            Class::ExtXattr => "ext.xattr",
            Class::ExtSpecial => "ext.special",
            Class::FatBoot => "fat.boot",
            Class::FatTable => "fat.table",
            Class::FatRootDir => "fat.root_dir",
            Class::FatDirectory => "fat.directory",
        }
    }
}

/// Reads the device as it is now. Implemented by the engine (NVRAM over volatile cache over
/// image), by image files and by memory buffers in tests.
pub trait SectorSource {
    /// Fills `buf` (a multiple of 512 bytes) with sectors `lba ..`. Reading beyond the device
    /// is an error.
    fn read_sectors(&mut self, lba: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Size of the device in sectors.
    fn sectors(&self) -> u64;
}

impl SectorSource for Vec<u8> {
    fn read_sectors(&mut self, lba: u64, buf: &mut [u8]) -> io::Result<()> {
        let start = lba as usize * SECTOR_BYTES;
        let src = self.get(start..start + buf.len()).ok_or_else(|| {
            io::Error::new(io::ErrorKind::UnexpectedEof, "read beyond the device")
        })?;
        buf.copy_from_slice(src);
        Ok(())
    }
    fn sectors(&self) -> u64 {
        (self.len() / SECTOR_BYTES) as u64
    }
}

/// An image file as a source.
#[derive(Debug)]
pub struct FileSource(pub std::fs::File);

impl SectorSource for FileSource {
    fn read_sectors(&mut self, lba: u64, buf: &mut [u8]) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        self.0.read_exact_at(buf, lba * SECTOR_BYTES as u64)
    }
    fn sectors(&self) -> u64 {
        self.0.metadata().map_or(0, |m| m.len() / SECTOR_BYTES as u64)
    }
}

/// Reads `len` bytes at byte `offset` of a source (any alignment).
pub(crate) fn read_bytes(
    src: &mut dyn SectorSource,
    offset: u64,
    len: usize,
) -> io::Result<Vec<u8>> {
    let s = SECTOR_BYTES as u64;
    let first = offset / s;
    let end = offset + len as u64;
    let last = end.div_ceil(s);
    if last > src.sectors() {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "read beyond the device"));
    }
    let mut buf = vec![0u8; ((last - first) * s) as usize];
    src.read_sectors(first, &mut buf)?;
    let skip = (offset - first * s) as usize;
    Ok(buf[skip..skip + len].to_vec())
}

/// The file system found on the device, with its metadata map.
#[derive(Debug)]
pub enum Classifier {
    /// No file system recognized (yet): everything is data.
    None,
    Ext(ext::ExtMeta),
    Fat(fat::FatMeta),
}

impl Classifier {
    /// Recognizes the file system on `src` (ext first, then FAT). Read errors and
    /// inconsistent layouts give `None`: a classifier never fails the device.
    pub fn probe(src: &mut dyn SectorSource) -> Classifier {
        if let Some(meta) = ext::ExtMeta::probe(src) {
            return Classifier::Ext(meta);
        }
        if let Some(meta) = fat::FatMeta::probe(src) {
            return Classifier::Fat(meta);
        }
        Classifier::None
    }

    /// "ext4", "ext3", "ext2", "fat12", "fat16", "fat32" or "none".
    pub fn fs_name(&self) -> &'static str {
        match self {
            Classifier::None => "none",
            Classifier::Ext(m) => m.fs_name(),
            Classifier::Fat(m) => m.fs_name(),
        }
    }

    /// The class of every sector of a write of whole sectors `data` at `lba`, before it is
    /// applied (`src` still shows the old contents).
    pub fn classify(&self, lba: u64, data: &[u8], src: &mut dyn SectorSource) -> Vec<Class> {
        debug_assert_eq!(data.len() % SECTOR_BYTES, 0);
        match self {
            Classifier::None => vec![Class::Data; data.len() / SECTOR_BYTES],
            Classifier::Ext(m) => m.classify(lba, data, src),
            Classifier::Fat(m) => m.classify(lba, data),
        }
    }

    /// The class of one sector by location only (no content): for statistics of reads.
    pub(crate) fn class_of(&self, lba: u64) -> Class {
        match self {
            Classifier::None => Class::Data,
            Classifier::Ext(m) => m.class_by_location(lba),
            Classifier::Fat(m) => m.class_of_lba(lba),
        }
    }

    /// Updates the map after a write of `data` at `lba` became visible in `src`: a write to a
    /// superblock or boot sector probes again (mkfs, resize), other writes update the
    /// file system's own structures (group descriptors, FAT, directories). Returns the sector
    /// ranges `(lba, sectors)` that became metadata through this write (FAT: clusters newly
    /// known as a directory's), whose volatile copies the engine moves into NVRAM.
    pub fn wrote(&mut self, lba: u64, data: &[u8], src: &mut dyn SectorSource) -> Vec<(u64, u64)> {
        let sectors = (data.len() / SECTOR_BYTES) as u64;
        // Sectors 0..4 hold the FAT boot sector and the ext superblock.
        let reprobe = lba < 4;
        match self {
            Classifier::None => {
                if reprobe {
                    *self = Classifier::probe(src);
                }
                Vec::new()
            }
            Classifier::Ext(m) => {
                if reprobe {
                    *self = Classifier::probe(src);
                } else {
                    m.wrote(lba, sectors, src);
                }
                Vec::new()
            }
            Classifier::Fat(m) => {
                if reprobe && !m.layout_unchanged(src) {
                    *self = Classifier::probe(src);
                    Vec::new()
                } else {
                    m.wrote(lba, data, src)
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_codes_round_trip_and_are_unique() {
        let mut seen = std::collections::BTreeSet::new();
        for c in Class::ALL {
            assert!(seen.insert(c.code()), "{c:?}");
            assert_eq!(Class::from_code(c.code()), Some(c));
        }
        assert_eq!(Class::from_code(200), None);
        assert!(!Class::Data.is_metadata() && Class::FatTable.is_metadata());
    }

    #[test]
    fn an_empty_device_has_no_file_system() {
        let mut dev = vec![0u8; 1 << 20];
        let c = Classifier::probe(&mut dev);
        assert_eq!(c.fs_name(), "none");
        assert_eq!(c.classify(0, &[0u8; 1024], &mut dev), vec![Class::Data; 2]);
    }
}
