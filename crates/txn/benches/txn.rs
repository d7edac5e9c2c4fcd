//! Transactions per second and persistence calls per transaction on a real region, for
//! snapshots of 64 B, 4 KiB and 64 KiB (each transaction: snapshot the range, overwrite it,
//! commit). Not a test: numbers for the docs and the issue notes.
//!
//! `cargo bench -p nvstack-txn --bench txn` (add `-- --msync-dir DIR` to also measure a region
//! file on a disk file system in msync mode). Each row runs for about one second.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvram::{FormatParams, MmapOptions, MmapRegion, PersistChoice, Region};
use txn::{Consistency, FrameTag, Pool};

const SIZES: [u64; 3] = [64, 4096, 65536];

fn bench(path: &Path, persist: PersistChoice, consistency: Consistency, size: u64) -> String {
    let params = FormatParams { region_size: 64 << 20, undo_slots: 4, undo_slot_size: 1 << 20 };
    let _ = std::fs::remove_file(path);
    MmapRegion::create(path, params.region_size).unwrap();
    let options = MmapOptions { persist, ..MmapOptions::default() };
    let region: Arc<dyn Region> = Arc::new(MmapRegion::open(path, options).unwrap());
    Pool::format(&*region, params).unwrap();
    let (pool, _) = Pool::open(region.clone(), consistency).unwrap();
    let frames = size.div_ceil(4096);
    let mut tx = pool.begin();
    let first = tx.alloc_frame(FrameTag::default()).unwrap();
    for _ in 1..frames {
        tx.alloc_frame(FrameTag::default()).unwrap();
    }
    tx.commit();
    let off = pool.frame_offset(first);
    let data: Vec<u8> = (0..size).map(|i| i as u8).collect();
    let before = region.counters();
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < Duration::from_secs(1) {
        for _ in 0..64 {
            let mut tx = pool.begin();
            tx.update(off, &data).unwrap();
            tx.commit();
        }
        n += 64;
    }
    let secs = start.elapsed().as_secs_f64();
    let after = region.counters();
    let stats = pool.stats();
    let row = format!(
        "| {:>6} | {:<7} | {:<5} | {:>10.0} | {:>9.2} | {:>9.2} | {:>10} |",
        size,
        format!("{:?}", region.mode()).to_lowercase(),
        format!("{consistency:?}").to_lowercase(),
        n as f64 / secs,
        (after.fence_calls - before.fence_calls) as f64 / n as f64,
        (after.flush_calls - before.flush_calls) as f64 / n as f64,
        stats.undo_bytes_max,
    );
    drop(pool);
    let _ = std::fs::remove_file(path);
    row
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let msync_dir =
        args.iter().position(|a| a == "--msync-dir").map(|i| PathBuf::from(&args[i + 1]));
    println!("| bytes  | persist | mode  | tx/s       | fences/tx | flushes/tx | undo max B |");
    println!("|-------:|---------|-------|-----------:|----------:|-----------:|-----------:|");
    let shm = PathBuf::from(format!("/dev/shm/nvstack-bench-{}", std::process::id()));
    for size in SIZES {
        println!("{}", bench(&shm, PersistChoice::Auto, Consistency::Undo, size));
        println!("{}", bench(&shm, PersistChoice::Auto, Consistency::None, size));
    }
    if let Some(dir) = msync_dir {
        let file = dir.join(format!("nvstack-bench-{}", std::process::id()));
        for size in SIZES {
            println!("{}", bench(&file, PersistChoice::Msync, Consistency::Undo, size));
        }
    }
}
