//! `txn-torture PATH SEED [journal]`: opens (and recovers) the region file at PATH and runs the
//! seeded testkit workload forever (in journal mode with a group commit where
//! `testkit::journal_schedule` says). The process-kill test starts it, waits for "ready", kills
//! it with SIGKILL at a random moment, recovers the region and replays the same seed to check
//! the result. Not installed; a test helper only.

use std::io::Write;
use std::sync::Arc;

use nvram::{MmapOptions, MmapRegion, Region};
use txn::testkit::{Workload, WorkloadConfig};
use txn::{Consistency, Pool};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    assert!(args.len() == 3 || args.len() == 4, "usage: txn-torture PATH SEED [journal]");
    let seed: u64 = args[2].parse().expect("SEED is a number");
    let journal = args.get(3).is_some_and(|a| a == "journal");
    let mode = if journal { Consistency::Journal } else { Consistency::Undo };
    let region: Arc<dyn Region> = Arc::new(
        MmapRegion::open(std::path::Path::new(&args[1]), MmapOptions::default()).expect("open"),
    );
    let (pool, _) = Pool::open(region, mode).expect("recover");
    let mut workload = Workload::new(seed, WorkloadConfig::default());
    println!("ready");
    std::io::stdout().flush().expect("stdout");
    loop {
        workload.step(&pool);
        if journal && txn::testkit::journal_schedule(workload.steps) {
            pool.group_commit();
        }
    }
}
