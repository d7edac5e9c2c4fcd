//! The FAT metadata classifier on images made by `mkfs.fat` and populated by the `fatfs`
//! crate (FAT12, FAT16, FAT32; no root needed).
//!
//! Every write of the fatfs workload passes through a tracking storage that does what the
//! device engine does: completes partial sectors, asks the classifier for the class of each
//! sector before the write, applies it, tells the classifier, and moves the sectors the
//! classifier reports as newly metadata out of the "volatile" set. Checked afterwards:
//! - the incrementally kept map equals a fresh probe of the final image (directories and
//!   their clusters), and the directories it knows are exactly fatfs's (short-name paths);
//! - every allocated cluster is a directory cluster or holds file content (by the file's
//!   tag), and their counts match fatfs's directories and file sizes;
//! - no sector that is metadata in the end was last written as data and never promoted (the
//!   NVFAT guarantee: every metadata write durable when the operation completes);
//! - `fsck.fat -n` is clean.

mod fat_common;

use std::collections::{BTreeMap, BTreeSet};
use std::io;

use device::classify::fat::FatMeta;
use device::classify::{Class, Classifier, SectorSource};
use fat_common::{Disk, Handle, VARIANTS, Variant};

const SECTOR: usize = 512;

/// The image in memory, with the classifier kept current as the engine keeps it.
struct Tracked {
    img: Vec<u8>,
    meta: Classifier,
    /// Sectors whose last write was classified data and that were not promoted since.
    volatile: BTreeSet<u64>,
    writes_meta: u64,
    writes_data: u64,
    promoted: u64,
}

impl Disk for Tracked {
    fn read_at(&mut self, off: u64, buf: &mut [u8]) {
        buf.copy_from_slice(&self.img[off as usize..off as usize + buf.len()]);
    }
    fn write_at(&mut self, off: u64, data: &[u8]) {
        let first = off / SECTOR as u64;
        let last = (off + data.len() as u64).div_ceil(SECTOR as u64);
        let mut whole = self.img[first as usize * SECTOR..last as usize * SECTOR].to_vec();
        let skip = (off - first * SECTOR as u64) as usize;
        whole[skip..skip + data.len()].copy_from_slice(data);
        let classes = self.meta.classify(first, &whole, &mut self.img);
        self.img[first as usize * SECTOR..last as usize * SECTOR].copy_from_slice(&whole);
        for (i, c) in classes.iter().enumerate() {
            let s = first + i as u64;
            if c.is_metadata() {
                self.volatile.remove(&s);
                self.writes_meta += 1;
            } else {
                self.volatile.insert(s);
                self.writes_data += 1;
            }
        }
        for (lba, n) in self.meta.wrote(first, &whole, &mut self.img) {
            for s in lba..lba + n {
                self.promoted += u64::from(self.volatile.remove(&s));
            }
        }
    }
    fn len(&self) -> u64 {
        self.img.len() as u64
    }
}

/// Directories, a 200-entry directory spanning clusters, files of several sizes, removals,
/// renames, and more files afterwards. Returns file id -> path.
fn workload<T: fatfs::ReadWriteSeek, D: Disk>(
    fs: &fatfs::FileSystem<T>,
    raw: &Handle<D>,
) -> BTreeMap<u32, String> {
    let root = fs.root_dir();
    let mut files = BTreeMap::new();
    let mut id = 0u32;
    let mut add = |path: String, len: usize, files: &mut BTreeMap<u32, String>| {
        id += 1;
        fat_common::write_file(fs, &path, &fat_common::content(id, len), id % 3 == 0).unwrap();
        files.insert(id, path);
    };
    for d in ["alpha", "alpha/beta", "alpha/beta/gamma", "many", "tmp", "tmp/sub"] {
        fat_common::mkdir(fs, raw, d).unwrap();
    }
    for i in 0..200 {
        add(format!("many/a long file name number {i:03}.txt"), 100 + i * 37, &mut files);
    }
    for (i, d) in ["alpha", "alpha/beta", "alpha/beta/gamma", "tmp", "tmp/sub"].iter().enumerate() {
        add(format!("{d}/file{i}.bin"), 5000 * (i + 1), &mut files);
    }
    // Remove a file of tmp/sub, then tmp/sub itself, then every third file of many.
    let gone: Vec<u32> =
        files.iter().filter(|(_, p)| p.starts_with("tmp/sub/")).map(|(i, _)| *i).collect();
    for g in gone {
        root.remove(&files.remove(&g).unwrap()).unwrap();
    }
    root.remove("tmp/sub").unwrap();
    let thirds: Vec<u32> = files.keys().copied().filter(|i| i % 3 == 1 && *i < 150).collect();
    for t in thirds {
        root.remove(&files.remove(&t).unwrap()).unwrap();
    }
    // Rename a directory in place, and move a file across directories. (fatfs 0.3.6 does not
    // rewrite ".." when a directory moves to another parent, which fsck.fat reports, so no
    // directory moves across parents here.)
    root.rename("alpha/beta/gamma", &root, "alpha/beta/gamma2").unwrap();
    for p in files.values_mut() {
        if let Some(rest) = p.strip_prefix("alpha/beta/gamma/") {
            *p = format!("alpha/beta/gamma2/{rest}");
        }
    }
    let moved = files.iter().find(|(_, p)| p.starts_with("many/")).map(|(i, _)| *i).unwrap();
    root.rename(&files[&moved], &root, "tmp/moved.txt").unwrap();
    files.insert(moved, "tmp/moved.txt".into());
    fat_common::mkdir(fs, raw, "late").unwrap();
    for i in 0..20 {
        add(format!("late/f{i}"), 3000, &mut files);
    }
    files
}

/// Short-name paths of the directories the classifier knows.
fn known_dirs(m: &FatMeta) -> Vec<String> {
    let dirs = m.directories();
    let name = |raw: &[u8]| {
        let base = String::from_utf8_lossy(&raw[..8]).trim_end().to_string();
        let ext = String::from_utf8_lossy(&raw[8..11]).trim_end().to_string();
        if ext.is_empty() { base } else { format!("{base}.{ext}") }
    };
    let mut out = Vec::new();
    for (&k, node) in dirs {
        let mut parts = Vec::new();
        let mut cur = (k, node);
        while cur.1.parent != cur.0 {
            parts.push(name(&cur.1.short_name));
            let p = cur.1.parent;
            cur = (p, &dirs[&p]);
        }
        parts.reverse();
        out.push(if parts.is_empty() { "/".into() } else { format!("/{}/", parts.join("/")) });
    }
    out.sort();
    out
}

/// Every allocated cluster is a directory cluster or file data (by tag), and their numbers
/// match fatfs's files and directories. Returns (directory clusters, file clusters).
fn account_clusters(
    v: Variant,
    fresh: &FatMeta,
    img: &[u8],
    files: &BTreeMap<u32, String>,
) -> (usize, u64) {
    let l = &fresh.layout;
    let cb = l.cluster_bytes() as usize;
    let dir_clusters: BTreeSet<u32> =
        fresh.directories().values().flat_map(|d| d.clusters.iter().copied()).collect();
    let mut file_clusters = 0u64;
    let mut allocated = 0u64;
    let bps = u64::from(l.bytes_per_sector);
    for c in 2..l.clusters + 2 {
        if fresh.entry(c) == 0 {
            continue;
        }
        allocated += 1;
        let at = (l.cluster_sector(c) * bps) as usize;
        let head = &img[at..at + 8];
        // A tag, or the start of one in the last cluster of a file (a size of 8k + 1..7).
        let is_file = head[0] == b'F'
            && head[1..].iter().all(|&b| b.is_ascii_digit() || b == b'\n' || b == 0);
        assert!(
            is_file != dir_clusters.contains(&c),
            "{}: cluster {c} is {} a directory cluster and {} file data",
            v.name,
            if dir_clusters.contains(&c) { "" } else { "not" },
            if is_file { "" } else { "not" }
        );
        file_clusters += u64::from(is_file);
    }
    let mut fs_img = io::Cursor::new(img.to_vec());
    let want_file_clusters: u64 = {
        let fs = fatfs::FileSystem::new(&mut fs_img, fatfs::FsOptions::new()).unwrap();
        let sizes = fat_common::tree(&fs);
        for (id, p) in files {
            let data = fat_common::read_file(&fs, p);
            assert_eq!(data, fat_common::content(*id, data.len()), "{}: {p}", v.name);
        }
        sizes.values().map(|&s| s.div_ceil(cb as u64)).sum()
    };
    assert_eq!(file_clusters, want_file_clusters, "{}: file clusters", v.name);
    assert_eq!(allocated, file_clusters + dir_clusters.len() as u64, "{}", v.name);
    (dir_clusters.len(), file_clusters)
}

fn check_variant(v: Variant) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join(format!("{}.img", v.name));
    fat_common::mkfs(&path, v);
    let mut img = std::fs::read(&path).unwrap();
    let meta = Classifier::probe(&mut img);
    assert_eq!(meta.fs_name(), v.name);
    let handle = Handle::new(Tracked {
        img,
        meta,
        volatile: BTreeSet::new(),
        writes_meta: 0,
        writes_data: 0,
        promoted: 0,
    });
    let raw = handle.clone_handle();
    let (files, tree) = {
        let fs = fatfs::FileSystem::new(handle, fatfs::FsOptions::new()).unwrap();
        let files = workload(&fs, &raw);
        let tree = fat_common::short_dirs(&fs);
        fs.unmount().unwrap();
        (files, tree)
    };
    let t = std::rc::Rc::try_unwrap(raw.disk).ok().expect("fatfs released the disk").into_inner();
    let Classifier::Fat(incremental) = &t.meta else {
        panic!("lost the FAT: {}", t.meta.fs_name())
    };
    let mut img = t.img.clone();
    let Classifier::Fat(fresh) = Classifier::probe(&mut img) else { panic!("no FAT") };
    // 1. Incremental map == fresh probe; directories == fatfs's.
    let chains = |m: &FatMeta| {
        m.directories().iter().map(|(k, d)| (*k, d.clusters.clone())).collect::<BTreeMap<_, _>>()
    };
    assert_eq!(
        chains(incremental),
        chains(&fresh),
        "{}: incremental map differs from a fresh probe",
        v.name
    );
    assert_eq!(known_dirs(&fresh), tree, "{}: directories differ from fatfs's", v.name);
    // 2. Every allocated cluster: a directory's or a file's (by tag).
    let (dir_clusters, file_clusters) = account_clusters(v, &fresh, &t.img, &files);
    let l = &fresh.layout;
    let cb = l.cluster_bytes() as usize;
    // 3. No metadata sector left volatile.
    let gaps: Vec<u64> =
        t.volatile.iter().copied().filter(|&s| fresh.class_of_lba(s) != Class::Data).collect();
    assert!(
        gaps.is_empty(),
        "{}: metadata sectors last written as data, never promoted: {gaps:?}",
        v.name
    );
    // 4. fsck.
    std::fs::write(&path, &t.img).unwrap();
    let (code, text) = fat_common::fsck(&path);
    assert_eq!(code, 0, "{}: fsck.fat -n:\n{text}", v.name);
    let root_dir = if l.root_entries > 0 {
        format!(", fixed root {} sectors", l.root_dir_sectors)
    } else {
        String::new()
    };
    format!(
        "{}: {} clusters of {} B, {} directories in {} clusters{root_dir}, {} file clusters; \
         writes classified metadata/data {}/{} sectors, {} promoted; fsck.fat clean",
        v.name,
        l.clusters,
        cb,
        fresh.directories().len(),
        dir_clusters,
        file_clusters,
        t.writes_meta,
        t.writes_data,
        t.promoted
    )
}

#[test]
fn fat_metadata_is_the_boot_sector_the_fats_and_the_directory_tree() {
    if fat_common::skip() {
        return;
    }
    for v in VARIANTS {
        eprintln!("{}", check_variant(v));
    }
}

#[test]
fn regions_by_location_on_a_fresh_fat16() {
    if fat_common::skip() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("f.img");
    fat_common::mkfs(&path, VARIANTS[1]);
    let mut img = std::fs::read(&path).unwrap();
    let Classifier::Fat(m) = Classifier::probe(&mut img) else { panic!("not FAT") };
    let l = &m.layout;
    let fat_end = u64::from(l.reserved_sectors + l.fats * l.fat_sectors);
    assert_eq!(m.class_of_fat_sector(0), Class::FatBoot);
    assert_eq!(m.class_of_fat_sector(u64::from(l.reserved_sectors)), Class::FatTable);
    assert_eq!(m.class_of_fat_sector(fat_end - 1), Class::FatTable);
    assert_eq!(m.class_of_fat_sector(fat_end), Class::FatRootDir);
    assert_eq!(m.class_of_fat_sector(u64::from(l.first_data_sector)), Class::Data);
    assert_eq!(img.sectors(), 32 << 11);
}
