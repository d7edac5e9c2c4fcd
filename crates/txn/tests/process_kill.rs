//! Process-level crash test (level 2 of the three crash-test levels, docs/design.md section 9): a child process runs the seeded workload on a
//! real region file in /dev/shm and is killed with SIGKILL at a random moment; reopening the
//! region must recover it to exactly the state after the child's last committed transaction.
//! The committed-transaction counter in the root area says how many committed; the test replays
//! the same seed on a second region for that many commits and compares byte for byte.
//!
//! `NVSTACK_KILL_ITERATIONS=n` sets the number of kills (default 40);
//! `NVSTACK_SEED=n` replays one.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use nvram::{FormatParams, MmapOptions, MmapRegion, Region};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use txn::testkit::{LogicalState, Workload, WorkloadConfig};
use txn::{Consistency, Pool};

fn fresh_region(path: &Path, params: FormatParams) {
    MmapRegion::create(path, params.region_size).unwrap();
    let region = MmapRegion::open(path, MmapOptions::default()).unwrap();
    Pool::format(&region, params).unwrap();
}

fn open(path: &Path) -> (Pool, txn::RecoveryReport) {
    open_as(path, Consistency::Undo)
}

/// The tests of this file run one at a time: a child forked by one holds, until it execs,
/// copies of the other's descriptors, with their region locks (then an open fails as in use).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn open_as(path: &Path, mode: Consistency) -> (Pool, txn::RecoveryReport) {
    let region: Arc<dyn Region> = Arc::new(MmapRegion::open(path, MmapOptions::default()).unwrap());
    Pool::open(region, mode).unwrap()
}

#[test]
fn sigkill_at_random_moments_always_recovers_to_the_last_commit() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let iterations: u64 =
        std::env::var("NVSTACK_KILL_ITERATIONS").map_or(40, |s| s.parse().expect("a number"));
    let seeds = match std::env::var("NVSTACK_SEED") {
        Ok(_) => common::seeds(1),
        Err(_) => (0..iterations).collect(),
    };
    let params = common::small_params();
    let dir = tempfile::Builder::new().prefix("nvstack-kill").tempdir_in("/dev/shm").unwrap();
    let (mut mid_transaction, mut total_commits) = (0, 0);
    for &seed in &seeds {
        let path = dir.path().join(format!("region-{seed}"));
        fresh_region(&path, params);
        let mut child = Command::new(env!("CARGO_BIN_EXE_txn-torture"))
            .arg(&path)
            .arg(seed.to_string())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready", "seed {seed}");
        let delay_us = ChaCha8Rng::seed_from_u64(seed).random_range(100..30_000);
        std::thread::sleep(Duration::from_micros(delay_us));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();

        let (pool, report) = open(&path);
        pool.check_invariants().unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        let recovered = LogicalState::of(&pool);
        let committed = recovered.counter();
        mid_transaction += u64::from(report.transactions_rolled_back > 0);
        total_commits += committed;

        let replay_path = dir.path().join(format!("replay-{seed}"));
        fresh_region(&replay_path, params);
        let (replay, _) = open(&replay_path);
        let mut workload = Workload::new(seed, WorkloadConfig::default());
        while workload.committed() < committed {
            workload.step(&replay);
        }
        let expected = LogicalState::of(&replay);
        assert!(
            recovered == expected,
            "seed {seed}: killed after {delay_us} us with {committed} commits: {}",
            recovered.diff(&expected)
        );
        workload.model().check(&recovered).unwrap();
        std::fs::remove_file(&path).unwrap();
        std::fs::remove_file(&replay_path).unwrap();
    }
    eprintln!(
        "process-kill: {} kills, {mid_transaction} landed inside a transaction (rolled back), \
         {total_commits} committed transactions verified",
        seeds.len()
    );
    if seeds.len() >= 20 {
        assert!(mid_transaction > 0, "no kill landed inside a transaction");
    }
}

#[test]
fn sigkill_in_journal_mode_recovers_to_the_last_group_commit() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    // The same in journal mode (write-protected mapping, a group commit after every fifth
    // transaction): the recovered region must equal a replay up to the last group commit,
    // whose committed-transaction counter it holds.
    let iterations: u64 =
        std::env::var("NVSTACK_KILL_ITERATIONS").map_or(40, |s| s.parse().expect("a number"));
    let seeds = match std::env::var("NVSTACK_SEED") {
        Ok(_) => common::seeds(1),
        Err(_) => (0..iterations).collect(),
    };
    let params = txn::testkit::journal_sweep_params();
    let dir = tempfile::Builder::new().prefix("nvstack-kill-j").tempdir_in("/dev/shm").unwrap();
    let (mut mid_group, mut total_commits) = (0, 0);
    for &seed in &seeds {
        let path = dir.path().join(format!("region-{seed}"));
        fresh_region(&path, params);
        let mut child = Command::new(env!("CARGO_BIN_EXE_txn-torture"))
            .arg(&path)
            .arg(seed.to_string())
            .arg("journal")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready", "seed {seed}");
        let delay_us = ChaCha8Rng::seed_from_u64(seed).random_range(100..30_000);
        std::thread::sleep(Duration::from_micros(delay_us));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();

        let (pool, report) = open_as(&path, Consistency::Journal);
        pool.check_invariants().unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        let recovered = LogicalState::of(&pool);
        let committed = recovered.counter();
        mid_group += u64::from(report.group_pages_restored > 0);
        total_commits += committed;

        let replay_path = dir.path().join(format!("replay-{seed}"));
        fresh_region(&replay_path, params);
        let (replay, _) = open_as(&replay_path, Consistency::Journal);
        let mut workload = Workload::new(seed, WorkloadConfig::default());
        while workload.committed() < committed {
            workload.step(&replay);
            if txn::testkit::journal_schedule(workload.steps) {
                replay.group_commit();
            }
        }
        let expected = LogicalState::of(&replay);
        assert!(
            recovered == expected,
            "seed {seed}: killed after {delay_us} us with {committed} commits: {}",
            recovered.diff(&expected)
        );
        workload.model().check(&recovered).unwrap();
        std::fs::remove_file(&path).unwrap();
        std::fs::remove_file(&replay_path).unwrap();
    }
    eprintln!(
        "process-kill (journal): {} kills, {mid_group} landed inside a group (rolled back), \
         {total_commits} group-committed transactions verified",
        seeds.len()
    );
    if seeds.len() >= 20 {
        assert!(mid_group > 0, "no kill landed inside a group");
    }
}
