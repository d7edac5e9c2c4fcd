//! Transactions per second and persistence calls per transaction on a real region, for
//! snapshots of 64 B, 4 KiB and 64 KiB (each transaction: snapshot the range, overwrite it,
//! commit), in undo, none and journal mode. Not a test: numbers for the docs and the issue notes.
//!
//! Journal mode runs in variants: `journal` commits the group only when `group_due` says so
//! (5 s or a full log: never within a row's second when the same pages are rewritten) plus once
//! at the end of the row, counted in the row; `journal/64` and `journal/1` commit the group
//! after every 64th and every transaction (an fsync after each: the worst case); `-np` runs
//! without write protection (what protection costs); `-pw` stores into protected pages with a
//! `pwrite` each instead of through the region's writer mapping (what that mapping saves).
//!
//! Two access patterns: `same` rewrites the same range in every transaction (the group copies
//! its pages once); `distinct` writes 4 KiB into a different frame each time, cycling over
//! 4000 frames (every transaction's page is a first change in its group: a copy, and groups
//! commit because the log fills up).
//!
//! `cargo bench -p nvstack-txn --bench txn` (add `-- --msync-dir DIR` to also measure a region
//! file on a disk file system in msync mode). Each row runs for about one second.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvram::{FormatParams, MmapOptions, MmapRegion, PersistChoice, Region, RetainedWrites};
use txn::{Consistency, FrameTag, OpenOptions, Pool};

const SIZES: [u64; 3] = [64, 4096, 65536];
const DISTINCT_FRAMES: u64 = 4000;

#[derive(Clone, Copy)]
struct Variant {
    consistency: Consistency,
    protect: bool,
    /// Group commit after every n transactions (journal mode).
    commit_every: Option<u64>,
    /// How stores reach protected pages.
    retained: RetainedWrites,
}

impl Variant {
    fn name(self) -> String {
        let mut name = format!("{:?}", self.consistency).to_lowercase();
        if let Some(n) = self.commit_every {
            name = format!("{name}/{n}");
        }
        if self.consistency == Consistency::Journal && !self.protect {
            name += "-np";
        }
        if self.retained == RetainedWrites::Pwrite {
            name += "-pw";
        }
        name
    }
}

const UNDO: Variant = Variant {
    consistency: Consistency::Undo,
    protect: false,
    commit_every: None,
    retained: RetainedWrites::Mapping,
};
const NONE: Variant = Variant { consistency: Consistency::None, ..UNDO };
const fn journal(protect: bool, commit_every: Option<u64>) -> Variant {
    Variant { consistency: Consistency::Journal, protect, commit_every, ..UNDO }
}
const fn pwrite(variant: Variant) -> Variant {
    Variant { retained: RetainedWrites::Pwrite, ..variant }
}

fn bench(
    path: &Path,
    persist: PersistChoice,
    variant: Variant,
    size: u64,
    distinct: bool,
) -> String {
    let params = FormatParams { region_size: 64 << 20, undo_slots: 4, undo_slot_size: 1 << 20 };
    let _ = std::fs::remove_file(path);
    MmapRegion::create(path, params.region_size).unwrap();
    let options = MmapOptions { persist, retained: variant.retained, ..MmapOptions::default() };
    let region: Arc<dyn Region> = Arc::new(MmapRegion::open(path, options).unwrap());
    Pool::format(&*region, params).unwrap();
    let open = OpenOptions { protect: variant.protect, ..OpenOptions::default() };
    let (pool, _) = Pool::open_with(region.clone(), variant.consistency, open).unwrap();
    let frames = if distinct { DISTINCT_FRAMES } else { size.div_ceil(4096) };
    let mut offsets = Vec::new();
    let mut tx = pool.begin();
    for _ in 0..frames {
        offsets.push(pool.frame_offset(tx.alloc_frame(FrameTag::default()).unwrap()));
        if offsets.len() % 64 == 0 {
            tx.commit();
            tx = pool.begin();
        }
    }
    tx.commit();
    pool.group_commit();
    let data: Vec<u8> = (0..size).map(|i| i as u8).collect();
    let before = region.counters();
    let stats_before = pool.stats().journal;
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < Duration::from_secs(1) {
        for _ in 0..64 {
            let off = if distinct { offsets[(n % DISTINCT_FRAMES) as usize] } else { offsets[0] };
            let mut tx = pool.begin();
            tx.update(off, &data).unwrap();
            tx.commit();
            n += 1;
            match variant.commit_every {
                Some(every) if n % every == 0 => {
                    pool.group_commit();
                }
                _ => {
                    let now = start.elapsed().as_nanos() as u64;
                    if pool.group_due(now) {
                        pool.group_commit();
                    }
                }
            }
        }
    }
    pool.group_commit();
    let secs = start.elapsed().as_secs_f64();
    let after = region.counters();
    let stats = pool.stats();
    let per = |a: u64, b: u64| (a - b) as f64 / n as f64;
    let row = format!(
        "| {:>6} | {:<8} | {:<6} | {:<12} | {:>10.0} | {:>9.3} | {:>10.3} | {:>10.3} | {:>8.3} | {:>7} |",
        size,
        if distinct { "distinct" } else { "same" },
        format!("{:?}", region.mode()).to_lowercase(),
        variant.name(),
        n as f64 / secs,
        per(after.fence_calls, before.fence_calls),
        per(after.flush_calls, before.flush_calls),
        per(
            after.protect_calls + after.unprotect_calls,
            before.protect_calls + before.unprotect_calls
        ),
        per(stats.journal.records, stats_before.records),
        stats.journal.group_commits - stats_before.group_commits,
    );
    drop(pool);
    let _ = std::fs::remove_file(path);
    row
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let msync_dir =
        args.iter().position(|a| a == "--msync-dir").map(|i| PathBuf::from(&args[i + 1]));
    println!(
        "| bytes  | pattern  | persist | mode         | tx/s       | fences/tx | flushes/tx | mprotect/tx | copies/tx | groups |"
    );
    println!(
        "|-------:|----------|---------|--------------|-----------:|----------:|-----------:|-----------:|---------:|-------:|"
    );
    let shm = PathBuf::from(format!("/dev/shm/nvstack-bench-{}", std::process::id()));
    let variants = [
        UNDO,
        NONE,
        journal(true, None),
        journal(false, None),
        journal(true, Some(64)),
        journal(true, Some(1)),
        pwrite(journal(true, Some(1))),
    ];
    for size in SIZES {
        for variant in variants {
            println!("{}", bench(&shm, PersistChoice::Auto, variant, size, false));
        }
    }
    for variant in [
        UNDO,
        journal(true, None),
        pwrite(journal(true, None)),
        journal(false, None),
        journal(true, Some(64)),
    ] {
        println!("{}", bench(&shm, PersistChoice::Auto, variant, 4096, true));
    }
    if let Some(dir) = msync_dir {
        let file = dir.join(format!("nvstack-bench-{}", std::process::id()));
        for size in SIZES {
            for variant in [UNDO, journal(true, None), journal(true, Some(64))] {
                println!("{}", bench(&file, PersistChoice::Msync, variant, size, false));
            }
        }
    }
}
