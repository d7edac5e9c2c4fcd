//! FAT12/16/32 metadata: a function of the boot sector and the directory tree.
//!
//! The boot sector (BPB) fixes the regions: reserved sectors (boot sector, FSInfo and backup
//! boot sector on FAT32) -> `fat.boot`; the FAT copies -> `fat.table`; the fixed root
//! directory of FAT12/16 -> `fat.root_dir`; the data region, in clusters from 2. A cluster is
//! `fat.directory` when it belongs to a directory: the clusters of the root (FAT32: the chain
//! from `BPB_RootClus`) and, recursively, the chain of every subdirectory named by a live
//! entry of a directory (attribute 0x10, not "." or ".."), followed over the active FAT.
//!
//! Kept current by writes (`FatMeta::wrote`), without reading the whole tree again:
//! - a write to the active FAT updates the in-memory copy of it (the *mirror*) and re-walks
//!   the chains of the known directories; a directory whose chain changed is parsed again;
//! - a write to a directory's cluster (or the fixed root) parses that directory again: new
//!   subdirectories are walked, subdirectories it no longer names are forgotten with their
//!   descendants (a subdirectory renamed elsewhere moves instead: it keeps its clusters);
//! - a write to the boot sector that changes the geometry probes the device again.
//!
//! One content rule covers the window in which a new directory's first cluster is written
//! before its parent names it: a data sector that starts a cluster and whose first entry is
//! "." with the directory attribute is `fat.directory` (`FatMeta::classify`), and the
//! cluster stays a *pending* directory cluster until its parent names it or its first sector
//! is rewritten without the "." entry.
//!
//! `FatMeta::wrote` returns the sectors that became metadata (clusters newly known as a
//! directory's): the engine moves volatile copies of them into NVRAM, so that a directory
//! cluster written before it was recognized (a driver zeroing a new cluster, then linking
//! it) is as durable as one written after. Together with the location rules this makes every
//! metadata write of a completed FAT operation durable - the NVFAT guarantee.
//!
//! Designed for reuse by a user-space FAT server: [`FatLayout::parse`] on the boot sector,
//! `FatMeta::load` with any [`SectorSource`], then [`FatMeta::class_of_fat_sector`] /
//! `FatMeta::wrote`.

use std::collections::{BTreeMap, BTreeSet};

use super::{Class, SECTOR_BYTES, SectorSource, read_bytes};

const ATTR_DIRECTORY: u8 = 0x10;
const ATTR_VOLUME_ID: u8 = 0x08;
const ATTR_LONG_NAME: u8 = 0x0F;
const ENTRY: usize = 32;
/// Key of the fixed root directory of FAT12/16 in the directory map (cluster numbers start
/// at 2, so 0 names no cluster).
pub(crate) const FIXED_ROOT: u32 = 0;

/// FAT12, FAT16 or FAT32, by cluster count (Microsoft's rule).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FatType {
    Fat12,
    Fat16,
    Fat32,
}

/// The geometry in the boot sector. Sector numbers are FAT sectors (`bytes_per_sector`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FatLayout {
    pub bytes_per_sector: u32,
    pub(crate) sectors_per_cluster: u32,
    pub reserved_sectors: u32,
    pub fats: u32,
    pub fat_sectors: u32,
    pub root_entries: u32,
    pub(crate) total_sectors: u32,
    pub root_dir_sectors: u32,
    pub first_data_sector: u32,
    pub clusters: u32,
    pub fat_type: FatType,
    /// FAT32 root directory cluster (0 on FAT12/16).
    pub root_cluster: u32,
    /// Index of the FAT the driver reads (FAT32 with mirroring off), else 0.
    pub(crate) active_fat: u32,
}

impl FatLayout {
    /// Parses a boot sector; `None` unless it holds a plausible BPB.
    pub fn parse(b: &[u8]) -> Option<FatLayout> {
        if b.len() < 512 || b[510] != 0x55 || b[511] != 0xAA || !matches!(b[0], 0xEB | 0xE9) {
            return None;
        }
        let u16_at = |o: usize| u32::from(u16::from_le_bytes([b[o], b[o + 1]]));
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        let bps = u16_at(0x0B);
        let spc = u32::from(b[0x0D]);
        let reserved = u16_at(0x0E);
        let fats = u32::from(b[0x10]);
        let root_entries = u16_at(0x11);
        let total = if u16_at(0x13) != 0 { u16_at(0x13) } else { u32_at(0x20) };
        let fat_sectors = if u16_at(0x16) != 0 { u16_at(0x16) } else { u32_at(0x24) };
        let media = b[0x15];
        let sane = [512, 1024, 2048, 4096].contains(&bps)
            && spc.is_power_of_two()
            && spc <= 128
            && reserved >= 1
            && (1..=4).contains(&fats)
            && fat_sectors > 0
            && total > 0
            && (media == 0xF0 || media >= 0xF8);
        if !sane {
            return None;
        }
        let root_dir_sectors = (root_entries * ENTRY as u32).div_ceil(bps);
        let first_data_sector = reserved + fats * fat_sectors + root_dir_sectors;
        if first_data_sector >= total {
            return None;
        }
        let clusters = (total - first_data_sector) / spc;
        let fat_type = if clusters < 4085 {
            FatType::Fat12
        } else if clusters < 65525 {
            FatType::Fat16
        } else {
            FatType::Fat32
        };
        let (root_cluster, active_fat) = if fat_type == FatType::Fat32 {
            let flags = u16_at(0x28);
            let active = if flags & 0x80 != 0 { flags & 0x0F } else { 0 };
            (u32_at(0x2C), active)
        } else {
            (0, 0)
        };
        if fat_type == FatType::Fat32 && (root_entries != 0 || root_cluster < 2) {
            return None;
        }
        if fat_type != FatType::Fat32 && root_entries == 0 {
            return None;
        }
        if active_fat >= fats {
            return None;
        }
        // The FAT must be able to describe every cluster.
        let entry_bits: u64 = match fat_type {
            FatType::Fat12 => 12,
            FatType::Fat16 => 16,
            FatType::Fat32 => 32,
        };
        if u64::from(fat_sectors) * u64::from(bps) * 8 < (u64::from(clusters) + 2) * entry_bits {
            return None;
        }
        Some(FatLayout {
            bytes_per_sector: bps,
            sectors_per_cluster: spc,
            reserved_sectors: reserved,
            fats,
            fat_sectors,
            root_entries,
            total_sectors: total,
            root_dir_sectors,
            first_data_sector,
            clusters,
            fat_type,
            root_cluster,
            active_fat,
        })
    }

    /// Device sectors (512 B) per FAT sector.
    pub(crate) fn lba_per_sector(&self) -> u64 {
        u64::from(self.bytes_per_sector) / SECTOR_BYTES as u64
    }

    pub fn cluster_bytes(&self) -> u64 {
        u64::from(self.bytes_per_sector) * u64::from(self.sectors_per_cluster)
    }

    /// First FAT sector of cluster `c` (>= 2).
    pub fn cluster_sector(&self, c: u32) -> u64 {
        u64::from(self.first_data_sector) + u64::from(c - 2) * u64::from(self.sectors_per_cluster)
    }

    fn is_cluster(&self, c: u32) -> bool {
        c >= 2 && c < self.clusters + 2
    }

    fn fat_start(&self, copy: u32) -> u64 {
        u64::from(self.reserved_sectors) + u64::from(copy) * u64::from(self.fat_sectors)
    }

    /// The class of FAT sector `s` by region (directory clusters are the tree's business).
    fn region_class(&self, s: u64) -> Option<Class> {
        let fat_end = self.fat_start(self.fats);
        if s < u64::from(self.reserved_sectors) {
            Some(Class::FatBoot)
        } else if s < fat_end {
            Some(Class::FatTable)
        } else if s < u64::from(self.first_data_sector) {
            Some(Class::FatRootDir)
        } else {
            None
        }
    }

    /// The cluster holding FAT sector `s` of the data region.
    fn cluster_of(&self, s: u64) -> Option<u32> {
        if s < u64::from(self.first_data_sector) || s >= u64::from(self.total_sectors) {
            return None;
        }
        let c = (s - u64::from(self.first_data_sector)) / u64::from(self.sectors_per_cluster) + 2;
        u32::try_from(c).ok().filter(|&c| self.is_cluster(c))
    }
}

/// One directory of the tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirNode {
    /// The directory holding its entry (`FIXED_ROOT` or a start cluster); the root names itself.
    pub parent: u32,
    /// Its 8.3 name as stored (11 bytes), empty for the root.
    pub short_name: Vec<u8>,
    /// Its cluster chain (empty for the fixed root of FAT12/16).
    pub clusters: Vec<u32>,
    /// Start clusters of its subdirectories.
    pub(crate) children: BTreeSet<u32>,
}

/// The metadata map of one FAT file system. See the module docs.
#[derive(Debug)]
pub struct FatMeta {
    pub layout: FatLayout,
    /// The active FAT's bytes, kept equal to the device by `wrote`.
    fat: Vec<u8>,
    /// Directories by start cluster (`FIXED_ROOT` for the fixed root).
    dirs: BTreeMap<u32, DirNode>,
    /// Directory cluster -> start cluster of its directory.
    owner: BTreeMap<u32, u32>,
    /// Clusters whose first sector holds a "." entry but that no directory names yet.
    pending: BTreeSet<u32>,
}

impl FatMeta {
    /// Recognizes a FAT file system on `src` and loads its tree.
    pub(crate) fn probe(src: &mut dyn SectorSource) -> Option<FatMeta> {
        let boot = read_bytes(src, 0, 512).ok()?;
        let layout = FatLayout::parse(&boot)?;
        let dev_bytes = src.sectors() * SECTOR_BYTES as u64;
        if u64::from(layout.total_sectors) * u64::from(layout.bytes_per_sector) > dev_bytes {
            return None;
        }
        FatMeta::load(layout, src).ok()
    }

    /// Reads the active FAT and walks the tree from the root.
    pub(crate) fn load(layout: FatLayout, src: &mut dyn SectorSource) -> std::io::Result<FatMeta> {
        let bps = u64::from(layout.bytes_per_sector);
        let fat = read_bytes(
            src,
            layout.fat_start(layout.active_fat) * bps,
            (u64::from(layout.fat_sectors) * bps) as usize,
        )?;
        let mut meta = FatMeta {
            layout,
            fat,
            dirs: BTreeMap::new(),
            owner: BTreeMap::new(),
            pending: BTreeSet::new(),
        };
        let root = meta.root_key();
        meta.walk(root, root, Vec::new(), src);
        Ok(meta)
    }

    pub(crate) fn fs_name(&self) -> &'static str {
        match self.layout.fat_type {
            FatType::Fat12 => "fat12",
            FatType::Fat16 => "fat16",
            FatType::Fat32 => "fat32",
        }
    }

    fn root_key(&self) -> u32 {
        if self.layout.fat_type == FatType::Fat32 { self.layout.root_cluster } else { FIXED_ROOT }
    }

    /// Every known directory by start cluster (`FIXED_ROOT` for the fixed root).
    pub fn directories(&self) -> &BTreeMap<u32, DirNode> {
        &self.dirs
    }

    /// Whether the boot sector on `src` still describes this layout.
    pub(crate) fn layout_unchanged(&self, src: &mut dyn SectorSource) -> bool {
        read_bytes(src, 0, 512).ok().and_then(|b| FatLayout::parse(&b)).as_ref()
            == Some(&self.layout)
    }

    /// The FAT entry of cluster `c` from the mirror.
    pub fn entry(&self, c: u32) -> u32 {
        let c = c as usize;
        let f = &self.fat;
        match self.layout.fat_type {
            FatType::Fat12 => {
                let at = c + c / 2;
                if at + 1 >= f.len() {
                    return 0;
                }
                let v = u32::from(u16::from_le_bytes([f[at], f[at + 1]]));
                if c % 2 == 0 { v & 0xFFF } else { v >> 4 }
            }
            FatType::Fat16 => {
                let at = c * 2;
                if at + 1 >= f.len() {
                    return 0;
                }
                u32::from(u16::from_le_bytes([f[at], f[at + 1]]))
            }
            FatType::Fat32 => {
                let at = c * 4;
                if at + 3 >= f.len() {
                    return 0;
                }
                u32::from_le_bytes(f[at..at + 4].try_into().expect("4 bytes")) & 0x0FFF_FFFF
            }
        }
    }

    /// The chain starting at `start`: stops at end-of-chain, a free or bad entry, a value that
    /// is no cluster, or a loop.
    pub(crate) fn chain(&self, start: u32) -> Vec<u32> {
        let mut out = Vec::new();
        let mut seen = BTreeSet::new();
        let mut c = start;
        while self.layout.is_cluster(c) && seen.insert(c) {
            out.push(c);
            c = self.entry(c);
        }
        out
    }

    fn dir_bytes(&self, key: u32, src: &mut dyn SectorSource) -> Vec<u8> {
        let l = &self.layout;
        let bps = u64::from(l.bytes_per_sector);
        if key == FIXED_ROOT {
            let start = l.fat_start(l.fats) * bps;
            return read_bytes(src, start, (u64::from(l.root_dir_sectors) * bps) as usize)
                .unwrap_or_default();
        }
        let mut out = Vec::new();
        for &c in &self.dirs[&key].clusters {
            match read_bytes(src, l.cluster_sector(c) * bps, l.cluster_bytes() as usize) {
                Ok(b) => out.extend_from_slice(&b),
                Err(_) => break,
            }
        }
        out
    }

    /// Subdirectories named by live entries: (start cluster, 8.3 name).
    fn subdirs(&self, bytes: &[u8]) -> Vec<(u32, Vec<u8>)> {
        let mut out = Vec::new();
        for e in bytes.chunks_exact(ENTRY) {
            match e[0] {
                0x00 => break,
                0xE5 => continue,
                _ => {}
            }
            let attr = e[11];
            if attr == ATTR_LONG_NAME || attr & ATTR_VOLUME_ID != 0 || attr & ATTR_DIRECTORY == 0 {
                continue;
            }
            if &e[..11] == b".          " || &e[..11] == b"..         " {
                continue;
            }
            let lo = u32::from(u16::from_le_bytes([e[26], e[27]]));
            let hi = if self.layout.fat_type == FatType::Fat32 {
                u32::from(u16::from_le_bytes([e[20], e[21]]))
            } else {
                0
            };
            let start = (hi << 16) | lo;
            if self.layout.is_cluster(start) {
                out.push((start, e[..11].to_vec()));
            }
        }
        out
    }

    /// Adds directory `key` (and, recursively, its subdirectories) to the tree.
    fn walk(&mut self, key: u32, parent: u32, short_name: Vec<u8>, src: &mut dyn SectorSource) {
        let mut stack = vec![(key, parent, short_name)];
        while let Some((key, parent, name)) = stack.pop() {
            if self.dirs.contains_key(&key) {
                continue;
            }
            let clusters = if key == FIXED_ROOT { Vec::new() } else { self.chain(key) };
            // A cluster already owned by another directory means a damaged or half-written
            // tree: keep the first owner.
            let clusters: Vec<u32> =
                clusters.into_iter().filter(|c| !self.owner.contains_key(c)).collect();
            if key != FIXED_ROOT && clusters.first() != Some(&key) {
                continue;
            }
            for &c in &clusters {
                self.owner.insert(c, key);
            }
            self.dirs.insert(
                key,
                DirNode { parent, short_name: name, clusters, children: BTreeSet::new() },
            );
            let bytes = self.dir_bytes(key, src);
            for (child, child_name) in self.subdirs(&bytes) {
                self.dirs.get_mut(&key).expect("just inserted").children.insert(child);
                if !self.dirs.contains_key(&child) {
                    stack.push((child, key, child_name));
                }
            }
        }
    }

    /// Forgets directory `key` and its descendants.
    fn forget(&mut self, key: u32) {
        let mut stack = vec![key];
        while let Some(k) = stack.pop() {
            if let Some(node) = self.dirs.remove(&k) {
                for c in &node.clusters {
                    self.owner.remove(c);
                }
                stack.extend(
                    node.children
                        .iter()
                        .copied()
                        .filter(|c| self.dirs.get(c).is_some_and(|child| child.parent == k)),
                );
            }
        }
    }

    /// Parses directory `key` again: walks new subdirectories, forgets vanished ones.
    fn refresh(&mut self, key: u32, src: &mut dyn SectorSource) {
        if !self.dirs.contains_key(&key) {
            return;
        }
        let bytes = self.dir_bytes(key, src);
        let now: Vec<(u32, Vec<u8>)> = self.subdirs(&bytes);
        let now_set: BTreeSet<u32> = now.iter().map(|(c, _)| *c).collect();
        let before = std::mem::take(&mut self.dirs.get_mut(&key).expect("known").children);
        for gone in before.difference(&now_set) {
            if self.dirs.get(gone).is_some_and(|d| d.parent == key) {
                self.forget(*gone);
            }
        }
        self.dirs.get_mut(&key).expect("known").children = now_set;
        for (child, name) in now {
            match self.dirs.get_mut(&child) {
                // Renamed from elsewhere: it moves with its clusters.
                Some(node) => {
                    node.parent = key;
                    node.short_name = name;
                }
                None => self.walk(child, key, name, src),
            }
        }
    }

    /// Re-walks every directory's chain after the FAT changed; directories whose chain
    /// changed are parsed again.
    fn rechain(&mut self, src: &mut dyn SectorSource) {
        let keys: Vec<u32> = self.dirs.keys().copied().filter(|&k| k != FIXED_ROOT).collect();
        let mut changed = Vec::new();
        for k in keys {
            let Some(node) = self.dirs.get(&k) else { continue };
            let chain = self.chain(k);
            if chain != node.clusters {
                for c in &node.clusters {
                    self.owner.remove(c);
                }
                let chain: Vec<u32> = chain
                    .into_iter()
                    .filter(|c| self.owner.get(c).is_none_or(|&o| o == k))
                    .collect();
                for &c in &chain {
                    self.owner.insert(c, k);
                }
                self.dirs.get_mut(&k).expect("known").clusters = chain;
                changed.push(k);
            }
        }
        for k in changed {
            self.refresh(k, src);
        }
    }

    /// The class of FAT sector `s`.
    pub fn class_of_fat_sector(&self, s: u64) -> Class {
        if let Some(c) = self.layout.region_class(s) {
            return c;
        }
        match self.layout.cluster_of(s) {
            Some(c) if self.owner.contains_key(&c) || self.pending.contains(&c) => {
                Class::FatDirectory
            }
            _ => Class::Data,
        }
    }

    /// The class of device sector `lba` by location.
    pub fn class_of_lba(&self, lba: u64) -> Class {
        self.class_of_fat_sector(lba / self.layout.lba_per_sector())
    }

    /// The class of every device sector of a write (location, then the "." content rule).
    pub(crate) fn classify(&self, lba: u64, data: &[u8]) -> Vec<Class> {
        data.chunks_exact(SECTOR_BYTES)
            .enumerate()
            .map(|(i, sector)| {
                let d = lba + i as u64;
                let class = self.class_of_lba(d);
                if class != Class::Data {
                    return class;
                }
                if self.dot_cluster(d, sector).is_some() {
                    Class::FatDirectory
                } else {
                    Class::Data
                }
            })
            .collect()
    }

    /// The cluster whose first sector is device sector `lba`, if `sector` (its content) starts
    /// with a "." directory entry.
    fn dot_cluster(&self, lba: u64, sector: &[u8]) -> Option<u32> {
        let per = self.layout.lba_per_sector();
        if lba % per != 0 {
            return None;
        }
        let s = lba / per;
        let c = self.layout.cluster_of(s).filter(|&c| self.layout.cluster_sector(c) == s)?;
        let dot = &sector[..11] == b".          " && sector[11] & ATTR_DIRECTORY != 0;
        dot.then_some(c)
    }

    /// Clusters of directories, known or pending.
    fn dir_clusters(&self) -> BTreeSet<u32> {
        self.owner.keys().chain(self.pending.iter()).copied().collect()
    }

    /// Updates the map after a write of `data` at device sector `lba` became visible in `src`.
    /// Returns the device sector ranges `(lba, sectors)` that became directory sectors.
    pub(crate) fn wrote(
        &mut self,
        lba: u64,
        data: &[u8],
        src: &mut dyn SectorSource,
    ) -> Vec<(u64, u64)> {
        let before = self.dir_clusters();
        self.apply(lba, data, src);
        // Pending directories: a "." entry written at a cluster start; gone when rewritten.
        for (i, sector) in data.chunks_exact(SECTOR_BYTES).enumerate() {
            let d = lba + i as u64;
            let per = self.layout.lba_per_sector();
            let Some(c) = self.layout.cluster_of(d / per) else { continue };
            if self.layout.cluster_sector(c) * per != d {
                continue;
            }
            if self.dot_cluster(d, sector).is_some() && !self.owner.contains_key(&c) {
                self.pending.insert(c);
            } else if self.dot_cluster(d, sector).is_none() {
                self.pending.remove(&c);
            }
        }
        let owner = &self.owner;
        self.pending.retain(|c| !owner.contains_key(c));
        let per = self.layout.lba_per_sector();
        let n = u64::from(self.layout.sectors_per_cluster) * per;
        self.dir_clusters()
            .difference(&before)
            .map(|&c| (self.layout.cluster_sector(c) * per, n))
            .collect()
    }

    fn apply(&mut self, lba: u64, data: &[u8], src: &mut dyn SectorSource) {
        let l = self.layout.clone();
        let bps = u64::from(l.bytes_per_sector);
        let start = lba * SECTOR_BYTES as u64;
        let end = start + data.len() as u64;
        // The active FAT: copy the overlapping bytes into the mirror.
        let fat_lo = l.fat_start(l.active_fat) * bps;
        let fat_hi = fat_lo + self.fat.len() as u64;
        let mut fat_changed = false;
        if start < fat_hi && end > fat_lo {
            let lo = start.max(fat_lo);
            let hi = end.min(fat_hi);
            let src_at = (lo - start) as usize;
            let dst_at = (lo - fat_lo) as usize;
            let len = (hi - lo) as usize;
            if self.fat[dst_at..dst_at + len] != data[src_at..src_at + len] {
                self.fat[dst_at..dst_at + len].copy_from_slice(&data[src_at..src_at + len]);
                fat_changed = true;
            }
        }
        // Directories written.
        let mut touched = BTreeSet::new();
        let per = l.lba_per_sector();
        let first = lba / per;
        let last = (lba + (data.len() / SECTOR_BYTES) as u64).div_ceil(per);
        for s in first..last {
            match l.region_class(s) {
                Some(Class::FatRootDir) => {
                    touched.insert(FIXED_ROOT);
                }
                Some(_) => {}
                None => {
                    if let Some(&k) = l.cluster_of(s).and_then(|c| self.owner.get(&c)) {
                        touched.insert(k);
                    }
                }
            }
        }
        if fat_changed {
            self.rechain(src);
        }
        for k in touched {
            self.refresh(k, src);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A FAT16 boot sector: 512 B sectors, 1 sector per cluster, 1 reserved, 2 FATs of 64
    /// sectors, 512 root entries, 16384 sectors (8 MiB): 16,223 clusters.
    fn boot16() -> Vec<u8> {
        let mut b = vec![0u8; 512];
        b[0] = 0xEB;
        b[0x0B..0x0D].copy_from_slice(&512u16.to_le_bytes());
        b[0x0D] = 1;
        b[0x0E..0x10].copy_from_slice(&1u16.to_le_bytes());
        b[0x10] = 2;
        b[0x11..0x13].copy_from_slice(&512u16.to_le_bytes());
        b[0x13..0x15].copy_from_slice(&16384u16.to_le_bytes());
        b[0x15] = 0xF8;
        b[0x16..0x18].copy_from_slice(&64u16.to_le_bytes());
        b[510] = 0x55;
        b[511] = 0xAA;
        b
    }

    fn dir_entry(name: &[u8; 11], attr: u8, cluster: u16) -> [u8; 32] {
        let mut e = [0u8; 32];
        e[..11].copy_from_slice(name);
        e[11] = attr;
        e[26..28].copy_from_slice(&cluster.to_le_bytes());
        e
    }

    fn set_fat16(dev: &mut [u8], l: &FatLayout, c: u32, v: u16) {
        for copy in 0..l.fats {
            let at = (l.fat_start(copy) * 512) as usize + c as usize * 2;
            dev[at..at + 2].copy_from_slice(&v.to_le_bytes());
        }
    }

    #[test]
    fn regions_and_the_directory_tree_of_a_hand_made_fat16() {
        let l = FatLayout::parse(&boot16()).unwrap();
        assert_eq!(l.fat_type, FatType::Fat16);
        assert_eq!((l.root_dir_sectors, l.first_data_sector), (32, 1 + 128 + 32));
        let mut dev = vec![0u8; 16384 * 512];
        dev[..512].copy_from_slice(&boot16());
        // /A (cluster 2 -> 3), /A/B (cluster 5), file /F at cluster 4.
        set_fat16(&mut dev, &l, 2, 3);
        set_fat16(&mut dev, &l, 3, 0xFFFF);
        set_fat16(&mut dev, &l, 4, 0xFFFF);
        set_fat16(&mut dev, &l, 5, 0xFFFF);
        let root = (l.fat_start(2) * 512) as usize;
        dev[root..root + 32].copy_from_slice(&dir_entry(b"A          ", ATTR_DIRECTORY, 2));
        dev[root + 32..root + 64].copy_from_slice(&dir_entry(b"F       TXT", 0x20, 4));
        let a = (l.cluster_sector(2) * 512) as usize;
        dev[a..a + 32].copy_from_slice(&dir_entry(b".          ", ATTR_DIRECTORY, 2));
        dev[a + 32..a + 64].copy_from_slice(&dir_entry(b"..         ", ATTR_DIRECTORY, 0));
        // Fill cluster 2 (an entry starting with 0 ends a directory), B lives in cluster 3.
        for i in 2..16 {
            let name = format!("F{i:<7}TXT");
            let at = a + 32 * i;
            dev[at..at + 32].copy_from_slice(&dir_entry(
                name.as_bytes().try_into().unwrap(),
                0x20,
                0,
            ));
        }
        let a2 = (l.cluster_sector(3) * 512) as usize;
        dev[a2..a2 + 32].copy_from_slice(&dir_entry(b"B          ", ATTR_DIRECTORY, 5));
        let mut m = FatMeta::probe(&mut dev).expect("fat16");
        let keys: Vec<u32> = m.directories().keys().copied().collect();
        assert_eq!(keys, vec![FIXED_ROOT, 2, 5]);
        assert_eq!(m.directories()[&2].clusters, vec![2, 3]);
        let class = |m: &FatMeta, s: u64| m.class_of_fat_sector(s);
        assert_eq!(class(&m, 0), Class::FatBoot);
        assert_eq!(class(&m, 1), Class::FatTable);
        assert_eq!(class(&m, 128), Class::FatTable);
        assert_eq!(class(&m, 129), Class::FatRootDir);
        assert_eq!(class(&m, 160), Class::FatRootDir);
        for c in [2u32, 3, 5] {
            assert_eq!(class(&m, l.cluster_sector(c)), Class::FatDirectory, "cluster {c}");
        }
        assert_eq!(class(&m, l.cluster_sector(4)), Class::Data);
        // Delete /A: its entry is marked 0xE5 in the root; A and A/B are forgotten.
        let mut w = dev[root..root + 512].to_vec();
        w[0] = 0xE5;
        dev[root..root + 512].copy_from_slice(&w);
        assert!(m.wrote((root / 512) as u64, &w, &mut dev).is_empty());
        let keys: Vec<u32> = m.directories().keys().copied().collect();
        assert_eq!(keys, vec![FIXED_ROOT]);
        assert_eq!(class(&m, l.cluster_sector(3)), Class::Data);
        // A new directory at cluster 6 whose first sector is written before its parent names
        // it: the content rule; then the root names it and the FAT extends it to 7.
        let d6 = (l.cluster_sector(6) * 512) as usize;
        let mut s6 = vec![0u8; 512];
        s6[..32].copy_from_slice(&dir_entry(b".          ", ATTR_DIRECTORY, 6));
        assert_eq!(m.classify((d6 / 512) as u64, &s6), vec![Class::FatDirectory]);
        m.layout.sectors_per_cluster = 2;
        assert_eq!(
            m.classify((d6 / 512) as u64 + 1, &s6),
            vec![Class::Data],
            "not a cluster start"
        );
        m.layout.sectors_per_cluster = 1;
        dev[d6..d6 + 512].copy_from_slice(&s6);
        let became = m.wrote((d6 / 512) as u64, &s6, &mut dev);
        assert_eq!(became, vec![(l.cluster_sector(6), 1)], "a pending directory cluster");
        assert_eq!(class(&m, l.cluster_sector(6)), Class::FatDirectory);
        set_fat16(&mut dev, &l, 6, 0xFFFF);
        let mut w = dev[root..root + 512].to_vec();
        w[64..96].copy_from_slice(&dir_entry(b"NEW        ", ATTR_DIRECTORY, 6));
        dev[root..root + 512].copy_from_slice(&w);
        assert!(m.wrote((root / 512) as u64, &w, &mut dev).is_empty(), "known already");
        assert_eq!(m.directories()[&6].clusters, vec![6]);
        assert!(m.pending.is_empty());
        let fat = (l.fat_start(0) * 512) as usize;
        set_fat16(&mut dev, &l, 6, 7);
        set_fat16(&mut dev, &l, 7, 0xFFFF);
        let sector = dev[fat..fat + 512].to_vec();
        let became = m.wrote((fat / 512) as u64, &sector, &mut dev);
        assert_eq!(became, vec![(l.cluster_sector(7), 1)], "the cluster linked to the directory");
        assert_eq!(m.directories()[&6].clusters, vec![6, 7]);
        // Cluster 9 gets a "." entry and is then overwritten with data: no longer pending.
        let d9 = l.cluster_sector(9);
        m.wrote(d9, &s6, &mut dev);
        assert_eq!(class(&m, d9), Class::FatDirectory);
        m.wrote(d9, &[0x41u8; 512], &mut dev);
        assert_eq!(class(&m, d9), Class::Data);
        assert_eq!(class(&m, l.cluster_sector(7)), Class::FatDirectory);
    }

    #[test]
    fn implausible_boot_sectors_are_refused() {
        let good = boot16();
        assert!(FatLayout::parse(&good).is_some());
        for (at, v) in [(510usize, 0u8), (0, 0), (0x0D, 3), (0x10, 0), (0x15, 0x12)] {
            let mut bad = good.clone();
            bad[at] = v;
            assert!(FatLayout::parse(&bad).is_none(), "byte {at:#x} = {v:#x}");
        }
    }

    #[test]
    fn fat12_entries_unpack() {
        let mut m = FatMeta {
            layout: FatLayout::parse(&boot16()).unwrap(),
            fat: vec![0; 64],
            dirs: BTreeMap::new(),
            owner: BTreeMap::new(),
            pending: BTreeSet::new(),
        };
        m.layout.fat_type = FatType::Fat12;
        m.layout.clusters = 100;
        // Entries 2 = 0x003, 3 = 0xFFF packed in bytes 3..6.
        m.fat[3] = 0x03;
        m.fat[4] = 0xF0;
        m.fat[5] = 0xFF;
        assert_eq!((m.entry(2), m.entry(3)), (0x003, 0xFFF));
        assert_eq!(m.chain(2), vec![2, 3]);
    }
}
