//! `txn-torture PATH SEED`: opens (and recovers) the region file at PATH and runs the seeded
//! testkit workload forever. The process-kill test starts it, waits for "ready", kills it with
//! SIGKILL at a random moment, recovers the region and replays the same seed to check the
//! result. Not installed; a test helper only.

use std::io::Write;
use std::sync::Arc;

use nvram::{MmapOptions, MmapRegion, Region};
use txn::testkit::{Workload, WorkloadConfig};
use txn::{Consistency, Pool};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    assert!(args.len() == 3, "usage: txn-torture PATH SEED");
    let seed: u64 = args[2].parse().expect("SEED is a number");
    let region: Arc<dyn Region> = Arc::new(
        MmapRegion::open(std::path::Path::new(&args[1]), MmapOptions::default()).expect("open"),
    );
    let (pool, _) = Pool::open(region, Consistency::Undo).expect("recover");
    let mut workload = Workload::new(seed, WorkloadConfig::default());
    println!("ready");
    std::io::stdout().flush().expect("stdout");
    loop {
        workload.step(&pool);
    }
}
