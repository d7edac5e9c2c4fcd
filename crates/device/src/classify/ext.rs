//! ext2/ext3/ext4 metadata: where it lives, from the superblock and the group descriptors, and
//! what it looks like, for the blocks that move (directories, extent trees, xattr blocks).
//!
//! By location (the *static map*, rebuilt when the superblock, a group descriptor block or the
//! inode-table block of a special inode is written):
//!
//! | class | blocks |
//! |---|---|
//! | `ext.superblock` | the superblock (block 0 on 2 KiB+ blocks, block 1 on 1 KiB) and its backups (every group without `sparse_super`; groups 0, 1 and powers of 3, 5, 7 with it; `s_backup_bgs` with `sparse_super2`) |
//! | `ext.group_desc` | group descriptor blocks after each superblock copy, the reserved GDT blocks, and with `meta_bg` the descriptor block at the start of the first, second and last group of each meta group |
//! | `ext.bitmap` | every group's block bitmap and inode bitmap (from its descriptor) |
//! | `ext.inode_table` | every group's inode table (`ceil(inodes_per_group * inode_size / block_size)` blocks) |
//! | `ext.journal` | the blocks of the journal inode (`s_journal_inum`, 8) and its extent-tree or indirect blocks |
//! | `ext.special` | the resize inode's double-indirect block, the orphan file's blocks |
//!
//! By content, when a block outside the static map is written (the content rule):
//!
//! | class | a block is one when |
//! |---|---|
//! | `ext.extent_tree` | it starts with the extent magic 0xF30A, `eh_max = (block_size - 12) / 12`, `eh_entries <= eh_max`, `eh_depth <= 5` |
//! | `ext.xattr` | it starts with 0xEA020000 and `h_blocks = 1` |
//! | `ext.directory` | it parses as a chain of directory entries covering the block exactly: each `rec_len` a multiple of 4, at least 12, holding its name; live entries name an inode `<= s_inodes_count`, have a file type 1..=7 (with `filetype`) and a name without NUL or '/'; an entry of inode 0 is a deleted entry, an htree node's fake entry, or the metadata_csum tail (`rec_len` 12, type 0xDE, last); and at least one entry is live or the first is an empty entry covering the block (but the tail): an empty block or an htree node. htree roots and nodes parse as such blocks by design of the format. |
//!
//! Approximations (each costs speed, never correctness, see `classify`): ext2/ext3 indirect
//! blocks of regular files are not recognized (no magic: they count as data); a data block
//! whose bytes happen to parse as a directory block counts as metadata; a freed directory
//! block keeps its class until it is written with other content; the static map lags a
//! group descriptor change until the descriptor block itself is written.

use std::collections::BTreeMap;

use super::{Class, SECTOR_BYTES, SectorSource, read_bytes};

const MAGIC: u16 = 0xEF53;
const SB_OFFSET: u64 = 1024;
const SB_SIZE: usize = 1024;

const COMPAT_HAS_JOURNAL: u32 = 0x4;
const COMPAT_RESIZE_INODE: u32 = 0x10;
const COMPAT_SPARSE_SUPER2: u32 = 0x200;
const COMPAT_ORPHAN_FILE: u32 = 0x1000;
const INCOMPAT_FILETYPE: u32 = 0x2;
const INCOMPAT_JOURNAL_DEV: u32 = 0x8;
const INCOMPAT_META_BG: u32 = 0x10;
const INCOMPAT_EXTENTS: u32 = 0x40;
const INCOMPAT_64BIT: u32 = 0x80;
const INCOMPAT_FLEX_BG: u32 = 0x200;
const RO_COMPAT_SPARSE_SUPER: u32 = 0x1;

const EXTENT_MAGIC: u16 = 0xF30A;
const XATTR_MAGIC: u32 = 0xEA02_0000;
const EXTENTS_FL: u32 = 0x8_0000;
const INLINE_DATA_FL: u32 = 0x1000_0000;
const RESIZE_INO: u32 = 7;
/// Most blocks followed through one inode's tree (bounds the work on a damaged inode).
const INODE_BLOCKS_MAX: usize = 1 << 20;

fn u16_at(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}
fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().expect("4 bytes"))
}

/// The geometry of an ext file system, from its superblock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExtLayout {
    pub block_size: u64,
    pub blocks_count: u64,
    pub(crate) first_data_block: u64,
    pub(crate) blocks_per_group: u64,
    pub(crate) inodes_per_group: u64,
    pub(crate) inodes_count: u64,
    pub(crate) inode_size: u64,
    pub(crate) groups: u64,
    pub(crate) desc_size: u64,
    pub(crate) compat: u32,
    pub(crate) incompat: u32,
    pub(crate) ro_compat: u32,
    pub(crate) reserved_gdt_blocks: u64,
    pub(crate) journal_inum: u32,
    pub(crate) orphan_file_inum: u32,
    pub(crate) backup_bgs: [u32; 2],
    pub(crate) first_meta_bg: u64,
}

impl ExtLayout {
    /// Parses a superblock (the 1024 bytes at byte 1024 of the device); `None` unless it is a
    /// plausible ext superblock.
    pub(crate) fn parse(sb: &[u8]) -> Option<ExtLayout> {
        if sb.len() < SB_SIZE || u16_at(sb, 0x38) != MAGIC {
            return None;
        }
        let log = u32_at(sb, 0x18);
        if log > 6 {
            return None;
        }
        let block_size = 1024u64 << log;
        let incompat = u32_at(sb, 0x60);
        let wide = incompat & INCOMPAT_64BIT != 0;
        let mut blocks_count = u64::from(u32_at(sb, 0x04));
        if wide {
            blocks_count |= u64::from(u32_at(sb, 0x150)) << 32;
        }
        let rev = u32_at(sb, 0x4C);
        let inode_size = if rev == 0 { 128 } else { u64::from(u16_at(sb, 0x58)) };
        let desc_size = if wide { u64::from(u16_at(sb, 0xFE)).max(32) } else { 32 };
        let l = ExtLayout {
            block_size,
            blocks_count,
            first_data_block: u64::from(u32_at(sb, 0x14)),
            blocks_per_group: u64::from(u32_at(sb, 0x20)),
            inodes_per_group: u64::from(u32_at(sb, 0x28)),
            inodes_count: u64::from(u32_at(sb, 0x00)),
            inode_size,
            groups: 0,
            desc_size,
            compat: u32_at(sb, 0x5C),
            incompat,
            ro_compat: u32_at(sb, 0x64),
            reserved_gdt_blocks: u64::from(u16_at(sb, 0xCE)),
            journal_inum: u32_at(sb, 0xE0),
            orphan_file_inum: u32_at(sb, 0x280),
            backup_bgs: [u32_at(sb, 0x24C), u32_at(sb, 0x250)],
            first_meta_bg: u64::from(u32_at(sb, 0x104)),
        };
        let sane = l.blocks_per_group > 0
            && l.blocks_per_group <= 8 * l.block_size
            && l.inodes_per_group > 0
            && l.inode_size >= 128
            && l.inode_size <= l.block_size
            && l.inode_size.is_power_of_two()
            && l.blocks_count > l.first_data_block
            && l.first_data_block == u64::from(block_size == 1024)
            && desc_size.is_power_of_two()
            && desc_size <= 1024;
        if !sane {
            return None;
        }
        let groups = (l.blocks_count - l.first_data_block).div_ceil(l.blocks_per_group);
        if groups == 0 || groups * l.inodes_per_group < l.inodes_count {
            return None;
        }
        Some(ExtLayout { groups, ..l })
    }

    pub(crate) fn sectors_per_block(&self) -> u64 {
        self.block_size / SECTOR_BYTES as u64
    }

    fn group_first_block(&self, g: u64) -> u64 {
        self.first_data_block + g * self.blocks_per_group
    }

    /// Whether group `g` holds a superblock copy.
    pub(crate) fn has_super(&self, g: u64) -> bool {
        if g == 0 {
            return true;
        }
        if self.compat & COMPAT_SPARSE_SUPER2 != 0 {
            return self.backup_bgs.iter().any(|&b| u64::from(b) == g);
        }
        if self.ro_compat & RO_COMPAT_SPARSE_SUPER == 0 {
            return true;
        }
        if g == 1 {
            return true;
        }
        [3u64, 5, 7].iter().any(|&base| {
            let mut p = base;
            while p < g {
                p *= base;
            }
            p == g
        })
    }

    fn descs_per_block(&self) -> u64 {
        self.block_size / self.desc_size
    }

    /// Blocks of the group descriptor table (without `meta_bg`).
    fn gdt_blocks(&self) -> u64 {
        self.groups.div_ceil(self.descs_per_block())
    }

    fn meta_bg(&self) -> bool {
        self.incompat & INCOMPAT_META_BG != 0
    }

    /// Byte offset of group `i`'s descriptor (the primary copy).
    fn desc_offset(&self, i: u64) -> u64 {
        let dpb = self.descs_per_block();
        let within = (i % dpb) * self.desc_size;
        if self.meta_bg() && i / dpb >= self.first_meta_bg {
            let g = i / dpb * dpb;
            let block = self.group_first_block(g) + u64::from(self.has_super(g));
            block * self.block_size + within
        } else {
            (self.first_data_block + 1 + i / dpb) * self.block_size + within
        }
    }

    /// (first block, blocks) of the superblock and descriptor copies in group `g`.
    fn sb_and_gdt(&self, g: u64, out: &mut Vec<(u64, u64, Class)>) {
        let first = self.group_first_block(g);
        let sup = self.has_super(g);
        if sup {
            out.push((first, 1, Class::ExtSuperblock));
            let old_style = if self.meta_bg() {
                self.first_meta_bg.min(self.gdt_blocks())
            } else {
                self.gdt_blocks()
            };
            let n = old_style + self.reserved_gdt_blocks;
            if n > 0 {
                out.push((first + 1, n, Class::ExtGroupDesc));
            }
        }
        if self.meta_bg() {
            let dpb = self.descs_per_block();
            let pos = g % dpb;
            if g / dpb >= self.first_meta_bg && (pos == 0 || pos == 1 || pos == dpb - 1) {
                out.push((first + u64::from(sup), 1, Class::ExtGroupDesc));
            }
        }
    }

    /// "ext4", "ext3" or "ext2" by features.
    pub(crate) fn fs_name(&self) -> &'static str {
        if self.incompat & (INCOMPAT_EXTENTS | INCOMPAT_64BIT | INCOMPAT_FLEX_BG) != 0 {
            "ext4"
        } else if self.compat & COMPAT_HAS_JOURNAL != 0 {
            "ext3"
        } else {
            "ext2"
        }
    }
}

/// Block lists of an inode: its data blocks and its tree blocks (extent index/leaf blocks, or
/// indirect blocks).
#[derive(Debug, Default)]
struct InodeBlocks {
    data: Vec<(u64, u64)>,
    tree: Vec<u64>,
}

/// The metadata map of one ext file system. See the module docs.
#[derive(Debug)]
pub struct ExtMeta {
    pub layout: ExtLayout,
    /// Static map: start block -> (blocks, class), disjoint.
    map: BTreeMap<u64, (u64, Class)>,
    /// Blocks whose writes rebuild the static map: the primary descriptor blocks and the
    /// inode-table blocks of the special inodes. Start -> blocks.
    watched: BTreeMap<u64, u64>,
}

impl ExtMeta {
    /// Recognizes an ext file system on `src` and builds its static map.
    pub fn probe(src: &mut dyn SectorSource) -> Option<ExtMeta> {
        let sb = read_bytes(src, SB_OFFSET, SB_SIZE).ok()?;
        let layout = ExtLayout::parse(&sb)?;
        if layout.blocks_count * layout.block_size > src.sectors() * SECTOR_BYTES as u64 {
            return None;
        }
        let mut meta = ExtMeta { layout, map: BTreeMap::new(), watched: BTreeMap::new() };
        meta.rebuild(src);
        Some(meta)
    }

    pub(crate) fn fs_name(&self) -> &'static str {
        self.layout.fs_name()
    }

    fn rebuild(&mut self, src: &mut dyn SectorSource) {
        let l = self.layout.clone();
        let mut ranges: Vec<(u64, u64, Class)> = Vec::new();
        let mut watched: Vec<(u64, u64)> = Vec::new();
        for g in 0..l.groups {
            l.sb_and_gdt(g, &mut ranges);
        }
        // The primary descriptor blocks.
        let mut desc_blocks: Vec<u64> =
            (0..l.groups).map(|i| l.desc_offset(i) / l.block_size).collect();
        desc_blocks.dedup();
        watched.extend(desc_blocks.iter().map(|&b| (b, 1)));
        let itable_blocks = (l.inodes_per_group * l.inode_size).div_ceil(l.block_size);
        let mut itables = Vec::with_capacity(l.groups as usize);
        for i in 0..l.groups {
            let Ok(d) = read_bytes(src, l.desc_offset(i), l.desc_size as usize) else {
                itables.push(None);
                continue;
            };
            let wide = l.desc_size >= 64;
            let loc = |lo: usize, hi: usize| {
                u64::from(u32_at(&d, lo)) | if wide { u64::from(u32_at(&d, hi)) << 32 } else { 0 }
            };
            let (bb, ib, it) = (loc(0, 0x20), loc(4, 0x24), loc(8, 0x28));
            for (start, n, class) in [
                (bb, 1, Class::ExtBitmap),
                (ib, 1, Class::ExtBitmap),
                (it, itable_blocks, Class::ExtInodeTable),
            ] {
                if start != 0 && start + n <= l.blocks_count {
                    ranges.push((start, n, class));
                }
            }
            itables.push((it != 0 && it + itable_blocks <= l.blocks_count).then_some(it));
        }
        let mut special = |ino: u32, class: Class, only_dind: bool| {
            let Some((offset, home)) = inode_location(&l, &itables, ino) else { return };
            watched.push((home, 1));
            let Ok(inode) = read_bytes(src, offset, l.inode_size as usize) else { return };
            if only_dind {
                let dind = u64::from(u32_at(&inode, 0x28 + 13 * 4));
                if dind != 0 && dind < l.blocks_count {
                    ranges.push((dind, 1, class));
                }
                return;
            }
            let blocks = inode_blocks(&l, &inode, src);
            for (s, n) in blocks.data {
                ranges.push((s, n, class));
            }
            for b in blocks.tree {
                ranges.push((b, 1, class));
            }
        };
        if l.compat & COMPAT_HAS_JOURNAL != 0
            && l.incompat & INCOMPAT_JOURNAL_DEV == 0
            && l.journal_inum != 0
        {
            special(l.journal_inum, Class::ExtJournal, false);
        }
        if l.compat & COMPAT_RESIZE_INODE != 0 {
            special(RESIZE_INO, Class::ExtSpecial, true);
        }
        if l.compat & COMPAT_ORPHAN_FILE != 0 && l.orphan_file_inum != 0 {
            special(l.orphan_file_inum, Class::ExtSpecial, false);
        }
        self.map = disjoint(ranges);
        self.watched = watched.into_iter().collect();
    }

    /// The static class of `block`, if it is in the static map.
    pub(crate) fn static_class(&self, block: u64) -> Option<Class> {
        let (&start, &(n, class)) = self.map.range(..=block).next_back()?;
        (block < start + n).then_some(class)
    }

    /// The class of the sector `lba` by location only.
    pub(crate) fn class_by_location(&self, lba: u64) -> Class {
        self.static_class(lba / self.layout.sectors_per_block()).unwrap_or(Class::Data)
    }

    /// The class of block `block` holding `bytes` (a whole block): static map first, then the
    /// content rule.
    pub fn classify_block(&self, block: u64, bytes: &[u8]) -> Class {
        if block >= self.layout.blocks_count {
            return Class::Data;
        }
        self.static_class(block).unwrap_or_else(|| self.content_class(bytes))
    }

    /// The content rule (module docs) for a whole block.
    pub(crate) fn content_class(&self, b: &[u8]) -> Class {
        let bs = self.layout.block_size as usize;
        if b.len() != bs {
            return Class::Data;
        }
        if u16_at(b, 0) == EXTENT_MAGIC {
            let (entries, max, depth) = (u16_at(b, 2), u16_at(b, 4), u16_at(b, 6));
            if usize::from(max) == (bs - 12) / 12 && entries <= max && depth <= 5 {
                return Class::ExtExtentTree;
            }
        }
        if u32_at(b, 0) == XATTR_MAGIC && u32_at(b, 8) == 1 {
            return Class::ExtXattr;
        }
        if self.is_dir_block(b) {
            return Class::ExtDirectory;
        }
        Class::Data
    }

    fn is_dir_block(&self, b: &[u8]) -> bool {
        let bs = b.len();
        let filetype = self.layout.incompat & INCOMPAT_FILETYPE != 0;
        let mut off = 0;
        let mut live = 0;
        let mut first_empty = false;
        while off < bs {
            if off + 8 > bs {
                return false;
            }
            let ino = u64::from(u32_at(b, off));
            let mut rec_len = usize::from(u16_at(b, off + 4));
            if bs == 65536 && (rec_len == 65535 || rec_len == 0) {
                rec_len = 65536;
            }
            let (name_len, ftype) = if filetype {
                (usize::from(b[off + 6]), b[off + 7])
            } else {
                (usize::from(u16_at(b, off + 6)), 0)
            };
            if rec_len < 12 || rec_len % 4 != 0 || off + rec_len > bs || 8 + name_len > rec_len {
                return false;
            }
            // An empty block: one deleted (or htree fake) entry over the block, or over all
            // of it but the metadata_csum tail.
            if off == 0 && ino == 0 && name_len == 0 && (rec_len == bs || rec_len == bs - 12) {
                first_empty = true;
            }
            if ino != 0 {
                if ino > self.layout.inodes_count || name_len == 0 {
                    return false;
                }
                if filetype && !(1..=7).contains(&ftype) {
                    return false;
                }
                if b[off + 8..off + 8 + name_len].iter().any(|&c| c == 0 || c == b'/') {
                    return false;
                }
                live += 1;
            } else if ftype == 0xDE && (rec_len != 12 || name_len != 0 || off + 12 != bs) {
                return false;
            }
            off += rec_len;
        }
        off == bs && (live > 0 || first_empty)
    }

    /// The class of every sector of a write (see `Classifier::classify`).
    pub(crate) fn classify(&self, lba: u64, data: &[u8], src: &mut dyn SectorSource) -> Vec<Class> {
        let spb = self.layout.sectors_per_block();
        let bs = self.layout.block_size as usize;
        let n = (data.len() / SECTOR_BYTES) as u64;
        let mut out = Vec::with_capacity(n as usize);
        let mut s = lba;
        while s < lba + n {
            let block = s / spb;
            let block_first = block * spb;
            let upto = (block_first + spb).min(lba + n);
            let class = if let Some(c) = self.static_class(block) {
                c
            } else if block >= self.layout.blocks_count {
                Class::Data
            } else if block_first >= lba && block_first + spb <= lba + n {
                let at = ((block_first - lba) as usize) * SECTOR_BYTES;
                self.content_class(&data[at..at + bs])
            } else {
                // A write covering part of the block: judge the block as it will be.
                match read_bytes(src, block * bs as u64, bs) {
                    Ok(mut whole) => {
                        let lo = s.max(lba);
                        let at_block = ((lo - block_first) as usize) * SECTOR_BYTES;
                        let at_data = ((lo - lba) as usize) * SECTOR_BYTES;
                        let len = ((upto - lo) as usize) * SECTOR_BYTES;
                        whole[at_block..at_block + len]
                            .copy_from_slice(&data[at_data..at_data + len]);
                        self.content_class(&whole)
                    }
                    Err(_) => Class::Data,
                }
            };
            for _ in s..upto {
                out.push(class);
            }
            s = upto;
        }
        out
    }

    /// After a write of `sectors` sectors at `lba`: rebuilds the static map if a watched block
    /// (descriptor block, special inode's inode-table block) was written.
    pub(crate) fn wrote(&mut self, lba: u64, sectors: u64, src: &mut dyn SectorSource) {
        let spb = self.layout.sectors_per_block();
        let first = lba / spb;
        let last = (lba + sectors.max(1) - 1) / spb;
        let hit = self.watched.range(..=last).next_back().is_some_and(|(&s, &n)| s + n > first)
            || self.watched.range(first..=last).next().is_some();
        if hit {
            self.rebuild(src);
        }
    }
}

/// Makes ranges disjoint (the first class pushed for a block wins: superblocks and descriptors
/// before bitmaps before tables before special inodes) and coalesces neighbours of one class.
fn disjoint(ranges: Vec<(u64, u64, Class)>) -> BTreeMap<u64, (u64, Class)> {
    let mut per_block: BTreeMap<u64, Class> = BTreeMap::new();
    let mut map: BTreeMap<u64, (u64, Class)> = BTreeMap::new();
    // Large ranges (journal, inode tables) are inserted as ranges; overlaps are rare (only on
    // a damaged or half-written file system), so resolve them block by block only then.
    let mut sorted = ranges;
    sorted.sort_by_key(|&(s, _, _)| s);
    let mut overlapping = false;
    for w in sorted.windows(2) {
        if w[0].0 + w[0].1 > w[1].0 {
            overlapping = true;
            break;
        }
    }
    if overlapping {
        for (s, n, c) in sorted {
            for b in s..s + n.min(INODE_BLOCKS_MAX as u64) {
                per_block.entry(b).or_insert(c);
            }
        }
        for (b, c) in per_block {
            push_coalesced(&mut map, b, 1, c);
        }
    } else {
        for (s, n, c) in sorted {
            push_coalesced(&mut map, s, n, c);
        }
    }
    map
}

fn push_coalesced(map: &mut BTreeMap<u64, (u64, Class)>, s: u64, n: u64, c: Class) {
    if n == 0 {
        return;
    }
    if let Some((&ps, &mut (ref mut pn, pc))) = map.range_mut(..s).next_back() {
        if pc == c && ps + *pn == s {
            *pn += n;
            return;
        }
    }
    map.insert(s, (n, c));
}

/// Byte offset of inode `ino` and the block holding it.
fn inode_location(l: &ExtLayout, itables: &[Option<u64>], ino: u32) -> Option<(u64, u64)> {
    let ino = u64::from(ino);
    if ino == 0 || ino > l.inodes_count {
        return None;
    }
    let g = (ino - 1) / l.inodes_per_group;
    let idx = (ino - 1) % l.inodes_per_group;
    let table = (*itables.get(g as usize)?)?;
    let offset = table * l.block_size + idx * l.inode_size;
    Some((offset, offset / l.block_size))
}

/// The blocks of an inode (extent tree or block map), reading tree blocks from `src`.
fn inode_blocks(l: &ExtLayout, inode: &[u8], src: &mut dyn SectorSource) -> InodeBlocks {
    let mut out = InodeBlocks::default();
    let mode = u16_at(inode, 0);
    let flags = u32_at(inode, 0x20);
    if mode == 0 || flags & INLINE_DATA_FL != 0 {
        return out;
    }
    let i_block = &inode[0x28..0x28 + 60];
    if flags & EXTENTS_FL != 0 {
        extent_node(l, i_block, 0, src, &mut out);
    } else {
        for i in 0..12 {
            let b = u64::from(u32_at(i_block, i * 4));
            if b != 0 && b < l.blocks_count {
                out.data.push((b, 1));
            }
        }
        for (i, depth) in [(12, 1), (13, 2), (14, 3)] {
            let b = u64::from(u32_at(i_block, i * 4));
            indirect(l, b, depth, src, &mut out);
        }
    }
    out
}

fn extent_node(
    l: &ExtLayout,
    node: &[u8],
    level: u32,
    src: &mut dyn SectorSource,
    out: &mut InodeBlocks,
) {
    if node.len() < 12 || u16_at(node, 0) != EXTENT_MAGIC || level > 5 {
        return;
    }
    let entries = usize::from(u16_at(node, 2));
    let depth = u16_at(node, 6);
    for e in 0..entries {
        let at = 12 + e * 12;
        if at + 12 > node.len() || out.data.len() + out.tree.len() > INODE_BLOCKS_MAX {
            return;
        }
        if depth == 0 {
            let len = u64::from(u16_at(node, at + 4));
            let len = if len > 32768 { len - 32768 } else { len };
            let start = u64::from(u32_at(node, at + 8)) | (u64::from(u16_at(node, at + 6)) << 32);
            if len > 0 && start + len <= l.blocks_count {
                out.data.push((start, len));
            }
        } else {
            let child = u64::from(u32_at(node, at + 4)) | (u64::from(u16_at(node, at + 8)) << 32);
            if child == 0 || child >= l.blocks_count {
                continue;
            }
            out.tree.push(child);
            if let Ok(bytes) = read_bytes(src, child * l.block_size, l.block_size as usize) {
                extent_node(l, &bytes, level + 1, src, out);
            }
        }
    }
}

fn indirect(
    l: &ExtLayout,
    block: u64,
    depth: u32,
    src: &mut dyn SectorSource,
    out: &mut InodeBlocks,
) {
    if block == 0 || block >= l.blocks_count || out.data.len() + out.tree.len() > INODE_BLOCKS_MAX {
        return;
    }
    out.tree.push(block);
    let Ok(bytes) = read_bytes(src, block * l.block_size, l.block_size as usize) else { return };
    for i in 0..bytes.len() / 4 {
        let b = u64::from(u32_at(&bytes, i * 4));
        if b == 0 || b >= l.blocks_count {
            continue;
        }
        if depth == 1 {
            out.data.push((b, 1));
        } else {
            indirect(l, b, depth - 1, src, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout_1k() -> ExtLayout {
        let mut sb = vec![0u8; 1024];
        sb[0x38..0x3A].copy_from_slice(&MAGIC.to_le_bytes());
        sb[0x04..0x08].copy_from_slice(&32768u32.to_le_bytes());
        sb[0x00..0x04].copy_from_slice(&8192u32.to_le_bytes());
        sb[0x14..0x18].copy_from_slice(&1u32.to_le_bytes());
        sb[0x20..0x24].copy_from_slice(&8192u32.to_le_bytes());
        sb[0x28..0x2C].copy_from_slice(&2048u32.to_le_bytes());
        sb[0x4C..0x50].copy_from_slice(&1u32.to_le_bytes());
        sb[0x58..0x5A].copy_from_slice(&128u16.to_le_bytes());
        sb[0x60..0x64].copy_from_slice(&INCOMPAT_FILETYPE.to_le_bytes());
        sb[0x64..0x68].copy_from_slice(&RO_COMPAT_SPARSE_SUPER.to_le_bytes());
        ExtLayout::parse(&sb).expect("a valid superblock")
    }

    fn meta() -> ExtMeta {
        ExtMeta { layout: layout_1k(), map: BTreeMap::new(), watched: BTreeMap::new() }
    }

    fn dirent(b: &mut [u8], off: usize, ino: u32, rec_len: u16, name: &[u8], ftype: u8) {
        b[off..off + 4].copy_from_slice(&ino.to_le_bytes());
        b[off + 4..off + 6].copy_from_slice(&rec_len.to_le_bytes());
        b[off + 6] = name.len() as u8;
        b[off + 7] = ftype;
        b[off + 8..off + 8 + name.len()].copy_from_slice(name);
    }

    #[test]
    fn sparse_super_groups() {
        let l = layout_1k();
        let with: Vec<u64> = (0..60).filter(|&g| l.has_super(g)).collect();
        assert_eq!(with, vec![0, 1, 3, 5, 7, 9, 25, 27, 49]);
        assert_eq!((l.groups, l.block_size, l.fs_name()), (4, 1024, "ext2"));
    }

    #[test]
    fn directory_blocks_parse_and_data_does_not() {
        let m = meta();
        let mut b = vec![0u8; 1024];
        dirent(&mut b, 0, 2, 12, b".", 2);
        dirent(&mut b, 12, 2, 12, b"..", 2);
        dirent(&mut b, 24, 11, 1000, b"lost+found", 2);
        assert_eq!(m.content_class(&b), Class::ExtDirectory);
        // The metadata_csum tail.
        let mut t = b.clone();
        dirent(&mut t, 24, 11, 988, b"lost+found", 2);
        dirent(&mut t, 1012, 0, 12, b"", 0xDE);
        assert_eq!(m.content_class(&t), Class::ExtDirectory);
        // An htree node: one fake entry of inode 0 over the whole block.
        let mut node = vec![0u8; 1024];
        dirent(&mut node, 0, 0, 1024, b"", 0);
        node[8..16].copy_from_slice(&[0x7c, 0, 1, 0, 1, 0, 0, 0]);
        assert_eq!(m.content_class(&node), Class::ExtDirectory);
        for bad in [
            vec![0u8; 1024],
            vec![0xabu8; 1024],
            (0..1024u32).map(|i| (i % 251) as u8).collect::<Vec<u8>>(),
        ] {
            assert_eq!(m.content_class(&bad), Class::Data);
        }
        let mut wrong_ino = b.clone();
        dirent(&mut wrong_ino, 24, 9999, 1000, b"x", 1);
        assert_eq!(m.content_class(&wrong_ino), Class::Data, "inode beyond s_inodes_count");
        let mut short = b.clone();
        short[28..30].copy_from_slice(&900u16.to_le_bytes());
        assert_eq!(m.content_class(&short), Class::Data, "entries do not cover the block");
    }

    #[test]
    fn extent_and_xattr_blocks_by_magic() {
        let m = meta();
        let mut e = vec![0u8; 1024];
        e[0..2].copy_from_slice(&EXTENT_MAGIC.to_le_bytes());
        e[2..4].copy_from_slice(&3u16.to_le_bytes());
        e[4..6].copy_from_slice(&84u16.to_le_bytes());
        assert_eq!(m.content_class(&e), Class::ExtExtentTree);
        e[4..6].copy_from_slice(&4u16.to_le_bytes());
        assert_eq!(m.content_class(&e), Class::Data, "eh_max of an in-inode root");
        let mut x = vec![0u8; 1024];
        x[0..4].copy_from_slice(&XATTR_MAGIC.to_le_bytes());
        x[8..12].copy_from_slice(&1u32.to_le_bytes());
        assert_eq!(m.content_class(&x), Class::ExtXattr);
    }

    #[test]
    fn static_map_is_disjoint_and_coalesced() {
        let map = disjoint(vec![
            (10, 5, Class::ExtInodeTable),
            (1, 1, Class::ExtSuperblock),
            (2, 3, Class::ExtGroupDesc),
            (15, 2, Class::ExtInodeTable),
        ]);
        let v: Vec<_> = map.iter().map(|(&s, &(n, c))| (s, n, c)).collect();
        assert_eq!(
            v,
            vec![
                (1, 1, Class::ExtSuperblock),
                (2, 3, Class::ExtGroupDesc),
                (10, 7, Class::ExtInodeTable)
            ]
        );
        let over = disjoint(vec![(0, 4, Class::ExtBitmap), (2, 4, Class::ExtJournal)]);
        let v: Vec<_> = over.iter().map(|(&s, &(n, c))| (s, n, c)).collect();
        assert_eq!(v, vec![(0, 4, Class::ExtBitmap), (4, 2, Class::ExtJournal)]);
    }
}
