//! The cache by hand-made cases: lookup and rewrite, the LRW order and the destage it picks,
//! reopening after a crash, drain runs, refusal of another image's region, damage named,
//! discard and scan.

use std::sync::Arc;

use nvram::{Region, SimRegion};
use txn::Consistency;

use super::*;
use crate::nvcache::record::{ImageId, SECTOR};

/// The image as a destage target: sectors in memory, every write remembered.
#[derive(Debug, Default)]
struct Mem {
    image: Vec<u8>,
    writes: Vec<(u64, u64)>,
}

impl Backing for Mem {
    fn write_durable(&mut self, lba: u64, data: &[u8]) -> io::Result<()> {
        let at = lba as usize * SECTOR;
        self.image[at..at + data.len()].copy_from_slice(data);
        self.writes.push((lba, (data.len() / SECTOR) as u64));
        Ok(())
    }
}

const IMAGE_SECTORS: u64 = 4096;

fn image() -> ImageId {
    ImageId { size_bytes: IMAGE_SECTORS * 512, dev: 1, ino: 2, path: "/img".into() }
}

fn region(capacity: u64) -> Arc<SimRegion> {
    let params = format_params(capacity);
    let r = Arc::new(SimRegion::new(params.region_size));
    Pool::format(&*r, params).unwrap();
    r
}

fn open(r: &Arc<SimRegion>, capacity: Option<u64>) -> NvCache {
    let dynr: Arc<dyn Region> = r.clone();
    NvCache::open(dynr, &image(), capacity, None).unwrap().0
}

fn sector(v: u8) -> Vec<u8> {
    vec![v; SECTOR]
}

fn absorb(c: &mut NvCache, m: &mut Mem, items: &[(u64, u8)]) {
    let data: Vec<(u64, Vec<u8>)> = items.iter().map(|&(l, v)| (l, sector(v))).collect();
    let list: Vec<(u64, &[u8], Class)> =
        data.iter().map(|(l, d)| (*l, &d[..], Class::ExtInodeTable)).collect();
    c.absorb(&list, m).unwrap();
    c.check().unwrap();
}

fn read(c: &NvCache, lbn: u64) -> Option<u8> {
    let mut buf = [0u8; SECTOR];
    c.read(lbn, &mut buf).unwrap().then(|| {
        assert!(buf.iter().all(|&b| b == buf[0]));
        buf[0]
    })
}

#[test]
fn lookup_rewrite_and_the_lrw_order() {
    let r = region(64);
    let mut c = open(&r, Some(64));
    let mut m = Mem { image: vec![0; IMAGE_SECTORS as usize * SECTOR], ..Mem::default() };
    absorb(&mut c, &mut m, &[(10, 1), (20, 2), (30, 3)]);
    assert_eq!((read(&c, 10), read(&c, 20), read(&c, 11)), (Some(1), Some(2), None));
    assert_eq!(c.lrw_order(), vec![10, 20, 30]);
    absorb(&mut c, &mut m, &[(10, 9)]);
    assert_eq!(read(&c, 10), Some(9));
    assert_eq!(c.lrw_order(), vec![20, 30, 10], "a rewrite makes the sector most recent");
    assert_eq!((c.counters().writes_absorbed, c.counters().write_hits), (4, 1));
    assert!(m.writes.is_empty(), "nothing reached the image");
}

#[test]
fn a_full_cache_destages_one_lrw_sector_per_new_sector() {
    let r = region(3);
    let mut c = open(&r, Some(3));
    let mut m = Mem { image: vec![0; IMAGE_SECTORS as usize * SECTOR], ..Mem::default() };
    absorb(&mut c, &mut m, &[(1, 1), (2, 2), (3, 3)]);
    absorb(&mut c, &mut m, &[(1, 11)]);
    assert!(m.writes.is_empty(), "a rewrite needs no room");
    absorb(&mut c, &mut m, &[(4, 4)]);
    assert_eq!(m.writes, vec![(2, 1)], "exactly the least recently written sector");
    assert_eq!(m.image[2 * SECTOR], 2);
    assert_eq!(c.lrw_order(), vec![3, 1, 4]);
    assert_eq!(read(&c, 2), None);
    // A write larger than the whole cache: absorbed chunk by chunk, never an error.
    absorb(&mut c, &mut m, &[(100, 5), (101, 6), (102, 7), (103, 8), (104, 9)]);
    assert_eq!(c.resident_sectors(), 3);
    assert_eq!(c.lrw_order(), vec![102, 103, 104]);
    for (lbn, v) in [(1, 11), (3, 3), (4, 4), (100, 5), (101, 6)] {
        assert_eq!(m.image[lbn * SECTOR], v, "sector {lbn} destaged with its newest content");
    }
    assert_eq!(c.counters().destaged_full, 6);
}

#[test]
fn reopen_restores_contents_and_lrw_order() {
    let r = region(20);
    let mut m = Mem { image: vec![0; IMAGE_SECTORS as usize * SECTOR], ..Mem::default() };
    {
        let mut c = open(&r, Some(20));
        absorb(&mut c, &mut m, &[(7, 7), (5, 5), (9, 9), (1, 1), (2, 2), (3, 3), (4, 4), (8, 8)]);
        absorb(&mut c, &mut m, &[(5, 55)]);
        // Dropped without close: a crash of the process after the last commit.
    }
    let again = Arc::new(SimRegion::from_image(r.crash_image(nvram::CrashMode::DropAll)));
    let c = open(&again, None);
    assert_eq!(c.capacity_sectors(), 20, "capacity from the anchor");
    assert_eq!(c.lrw_order(), vec![7, 9, 1, 2, 3, 4, 8, 5]);
    assert_eq!(read(&c, 5), Some(55));
    c.check().unwrap();
}

#[test]
fn drain_writes_runs_in_lba_order_and_empties_the_cache() {
    let r = region(16);
    let mut c = open(&r, Some(16));
    let mut m = Mem { image: vec![0; IMAGE_SECTORS as usize * SECTOR], ..Mem::default() };
    absorb(&mut c, &mut m, &[(12, 1), (10, 2), (11, 3), (40, 4), (13, 5)]);
    assert_eq!(c.drain(&mut m).unwrap(), 5);
    assert_eq!(m.writes, vec![(10, 4), (40, 1)]);
    assert_eq!(c.resident_sectors(), 0);
    assert_eq!(c.counters().destaged_drain, 5);
    c.check().unwrap();
}

#[test]
fn another_image_is_refused_while_sectors_are_resident() {
    let r = region(8);
    let mut c = open(&r, Some(8));
    let mut m = Mem { image: vec![0; IMAGE_SECTORS as usize * SECTOR], ..Mem::default() };
    absorb(&mut c, &mut m, &[(1, 1)]);
    drop(c);
    let other = ImageId { ino: 3, ..image() };
    let dynr: Arc<dyn Region> = r.clone();
    let e = NvCache::open(dynr, &other, None, None).unwrap_err();
    assert!(e.to_string().contains("holds 1 cached sector(s) of image /img"), "{e}");
    let mut c = open(&r, None);
    c.drain(&mut m).unwrap();
    drop(c);
    let dynr: Arc<dyn Region> = r.clone();
    let (c, report) = NvCache::open(dynr, &other, None, None).unwrap();
    assert!(report.rebound && c.anchor().image.ino == 3);
    // A region too small for the capacity asked.
    drop(c);
    let dynr: Arc<dyn Region> = r.clone();
    let e = NvCache::open(dynr, &other, Some(10_000), None).unwrap_err();
    assert!(e.to_string().contains("does not fit this NVRAM region"), "{e}");
}

#[test]
fn damage_is_reported_with_the_place_named() {
    let r = region(8);
    let mut c = open(&r, Some(8));
    let mut m = Mem { image: vec![0; IMAGE_SECTORS as usize * SECTOR], ..Mem::default() };
    absorb(&mut c, &mut m, &[(1, 1), (2, 2)]);
    let frame = c.index[&2].slot.frame;
    let data_at = c.slot_offsets(c.index[&2].slot).1;
    drop(c);
    let flipped = SimRegion::from_image(r.current());
    flipped.flip_bit(data_at + 100, 3);
    let dynr: Arc<dyn Region> = Arc::new(flipped);
    let e = NvCache::open(dynr, &image(), None, None).unwrap_err();
    assert!(e.to_string().contains(&format!("frame {frame}")), "{e}");
    assert!(e.to_string().contains("checksum"), "{e}");
    let flipped = SimRegion::from_image(r.current());
    flipped.flip_bit(8192 + 20, 0);
    let dynr: Arc<dyn Region> = Arc::new(flipped);
    let e = NvCache::open(dynr, &image(), None, None).unwrap_err();
    assert!(e.to_string().contains("root area"), "{e}");
}

#[test]
fn discard_frees_without_writing() {
    let r = region(8);
    let mut c = open(&r, Some(8));
    let mut m = Mem { image: vec![0; IMAGE_SECTORS as usize * SECTOR], ..Mem::default() };
    absorb(&mut c, &mut m, &[(1, 1), (2, 2), (3, 3)]);
    assert_eq!(c.resident_in(2, 5), vec![2, 3]);
    assert_eq!(c.resident_in(0, u64::MAX), vec![1, 2, 3], "by a scan of the hash");
    assert_eq!(c.discard(&[2, 3, 4]).unwrap(), 2);
    assert_eq!(c.lrw_order(), vec![1]);
    assert!(m.writes.is_empty());
    c.check().unwrap();
}

#[test]
fn scan_lists_resident_sectors_and_ignores_other_regions() {
    let r = region(8);
    let mut c = open(&r, Some(8));
    let mut m = Mem { image: vec![0; IMAGE_SECTORS as usize * SECTOR], ..Mem::default() };
    absorb(&mut c, &mut m, &[(9, 1), (3, 2)]);
    let s = scan(c.pool()).unwrap().unwrap();
    assert_eq!(s.sectors.iter().map(|s| s.lbn).collect::<Vec<_>>(), vec![3, 9]);
    assert_eq!(s.by_class()["ext.inode_table"], 2);
    let plain = region(8);
    let dynr: Arc<dyn Region> = plain;
    let (pool, _) = Pool::open(dynr, Consistency::Undo).unwrap();
    assert!(scan(&pool).unwrap().is_none());
}
