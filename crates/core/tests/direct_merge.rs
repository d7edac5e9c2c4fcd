//! The direct path's merge (`engine/direct.rs`, docs/direct-path.md): a delegation log's records,
//! merged into a temp file and into a cached lower file, give the file that the same writes and
//! truncates through the FUSE path give; and a crash at every fence of a merge, recovered and
//! merged again from the start, gives that file too (records are idempotent).

use std::ffi::OsStr;
use std::sync::{Arc, Mutex};

use direct::{LogHeader, LogWriter, Record, RecordKind, format, scan};
use engine::{CacheConfig, Engine, EngineConfig, Nbw, Share, TempConfig};
use lower::{Creds, LowerFs, MemLower};
use nvram::{CrashMode, FormatParams, SimRegion};
use rand::{Rng, SeedableRng};
use txn::{Consistency, Pool};

const ROOT: Creds = Creds { uid: 0, gid: 0, groups: Vec::new() };
const GRANT: u64 = 7;

fn name(s: &str) -> &OsStr {
    OsStr::new(s)
}

fn params() -> FormatParams {
    FormatParams {
        region_size: 12288 + 4 * 65536 + 4096 + 512 * 4096,
        undo_slots: 4,
        undo_slot_size: 65536,
    }
}

fn config() -> EngineConfig {
    EngineConfig {
        temp: TempConfig { share: Share::Percent(100), ..TempConfig::default() },
        cache: CacheConfig { background: false, nbw: Nbw::Lazy, ..CacheConfig::default() },
        passthrough: false,
        ..EngineConfig::default()
    }
}

fn start(lower: &MemLower, region: &Arc<SimRegion>) -> Engine<MemLower> {
    let (pool, _) = Pool::open(region.clone(), Consistency::Undo).unwrap();
    Engine::new(lower.clone(), pool, config()).unwrap()
}

/// A seeded mix of writes (up to 9 KiB within the first 64 KiB) and truncates, through the
/// library's log: what `scan` gives the daemon.
fn logged(seed: u64, n: usize) -> Vec<Record> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let area = SimRegion::new(1 << 20);
    format(&area, LogHeader { grant: GRANT, node: 1, base: 1 }).unwrap();
    let mut w = LogWriter::resume(&area, GRANT, direct::HEADER_BYTES, 1);
    for i in 0..n {
        if rng.random_range(0..6) == 0 {
            w.append(RecordKind::Truncate, rng.random_range(0..40_000), &[]).unwrap();
        } else {
            let len = rng.random_range(1..9000);
            let data: Vec<u8> = (0..len).map(|j| (i * 31 + j) as u8).collect();
            w.append(RecordKind::Write, rng.random_range(0..56_000), &data).unwrap();
        }
    }
    let s = scan(&area.current(), GRANT, 1).unwrap();
    assert_eq!((s.records.len(), s.damage), (n, None));
    s.records
}

/// The file the records describe (the model).
fn model(records: &[Record]) -> Vec<u8> {
    let mut f = Vec::new();
    for r in records {
        match r.kind {
            RecordKind::Write => {
                let end = r.offset as usize + r.data.len();
                if f.len() < end {
                    f.resize(end, 0);
                }
                f[r.offset as usize..end].copy_from_slice(&r.data);
            }
            RecordKind::Truncate => f.resize(r.offset as usize, 0),
        }
    }
    f
}

fn read(e: &Engine<MemLower>, n: &str) -> Vec<u8> {
    let entry = e.lookup(e.root_id(), name(n)).unwrap();
    let fh = e.open(entry.node_id, libc::O_RDONLY).unwrap();
    let mut out = Vec::new();
    e.read(fh, 0, 1 << 20, |d| out.extend_from_slice(d)).unwrap();
    e.release(fh).unwrap();
    assert_eq!(out.len() as u64, entry.attr.size, "{n}: size and contents agree");
    out
}

fn open_rw(e: &Engine<MemLower>, n: &str) -> (u64, u64) {
    let node = e.lookup(e.root_id(), name(n)).unwrap().node_id;
    (node, e.open(node, libc::O_RDWR).unwrap())
}

#[test]
fn merged_records_give_the_file_the_fuse_path_gives() {
    for seed in 1..=3 {
        let records = logged(seed, 40);
        let want = model(&records);
        let lower = MemLower::default();
        // A lower file with contents (the page cache takes it) and a temp file.
        let (_, _, f) =
            lower.create(&ROOT, lower.root(), name("cached"), 0o644, libc::O_RDWR).unwrap();
        lower.write(&f, 0, &vec![0x55u8; 70_000]).unwrap();
        lower.sync_all();
        let region = Arc::new(SimRegion::new(params().region_size));
        Pool::format(&*region, params()).unwrap();
        let e = start(&lower, &region);
        e.create(&ROOT, e.root_id(), name("temp"), 0o644, libc::O_RDWR).unwrap();
        for file in ["temp", "cached"] {
            let (node, fh) = open_rw(&e, file);
            if file == "cached" {
                let set = lower::SetAttr { size: Some(0), ..lower::SetAttr::default() };
                e.setattr(node, Some(fh), &set, false).unwrap();
            }
            let merged = e.merge_records(node, fh, &records).unwrap();
            assert_eq!(merged.records, 40);
            e.release(fh).unwrap();
            assert_eq!(read(&e, file), want, "seed {seed}: {file}");
        }
        assert!(e.temp_file(e.lookup(e.root_id(), name("temp")).unwrap().node_id).is_some());
    }
}

#[test]
fn a_crash_at_every_fence_of_a_merge_then_merging_again_gives_the_same_file() {
    let records = logged(9, 12);
    let want = model(&records);
    let lower = MemLower::default();
    let region = Arc::new(SimRegion::new(params().region_size));
    Pool::format(&*region, params()).unwrap();
    let e = start(&lower, &region);
    e.create(&ROOT, e.root_id(), name("f"), 0o644, libc::O_RDWR).unwrap();
    let (node, fh) = open_rw(&e, "f");
    let images: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
    let sink = Arc::clone(&images);
    region.set_fence_hook(Some(Box::new(move |point| {
        let mode = if point.fence_seq % 2 == 0 {
            CrashMode::DropAll
        } else {
            CrashMode::Torn { seed: point.fence_seq }
        };
        sink.lock().unwrap().push(point.image(mode));
    })));
    e.merge_records(node, fh, &records).unwrap();
    region.set_fence_hook(None);
    e.release(fh).unwrap();
    assert_eq!(read(&e, "f"), want);
    let images = std::mem::take(&mut *images.lock().unwrap());
    assert!(images.len() > 20, "{} fences", images.len());
    for (i, image) in images.into_iter().enumerate() {
        let after = start(&lower.crash(), &Arc::new(SimRegion::from_image(image)));
        let (node, fh) = open_rw(&after, "f");
        after.merge_records(node, fh, &records).unwrap();
        after.release(fh).unwrap();
        assert_eq!(read(&after, "f"), want, "image {i}");
    }
}
