//! Stray stores into a real region mapping (`MmapRegion` on /dev/shm, journal mode): a child
//! process (`txn-wild`) stores through wild pointers into write-protected pages, bypassing
//! `Region`; every store must be trapped and the region file must not change. With the
//! fail-stop policy each stray store (one child per store) ends its process by SIGSEGV before
//! it lands, and recovery restores the last group commit. Faults that are not stray stores
//! still end the process as they would without the handler.
//!
//! `NVSTACK_SEED=n` replays one seed.

mod common;

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::Arc;

use nvram::{MmapOptions, MmapRegion, Region, SimRegion};
use txn::testkit::{LogicalState, Workload, WorkloadConfig};
use txn::{Consistency, Pool};

/// The tests of this file run one at a time: a child forked by one holds, until it execs,
/// copies of the other's descriptors, with their region locks (then an open fails as in use).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn fresh_region(path: &Path) {
    let params = txn::testkit::journal_sweep_params();
    MmapRegion::create(path, params.region_size).unwrap();
    let region = MmapRegion::open(path, MmapOptions::default()).unwrap();
    Pool::format(&region, params).unwrap();
}

fn wild(path: &Path, seed: u64, stores: u64, what: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_txn-wild"))
        .args([path.to_str().unwrap(), &seed.to_string(), &stores.to_string(), what])
        .output()
        .unwrap()
}

/// The state the child's workload leaves after `steps` transactions with a group commit after
/// the 30th, replayed on a simulated region (the same seed makes the same transactions).
fn replay(seed: u64, steps: u64, group_commit_at_end: bool) -> LogicalState {
    let params = txn::testkit::journal_sweep_params();
    let region = Arc::new(SimRegion::new(params.region_size));
    Pool::format(&*region, params).unwrap();
    let (pool, _) = Pool::open(region, Consistency::Journal).unwrap();
    let mut workload = Workload::new(seed, WorkloadConfig::default());
    for step in 1..=steps {
        workload.step(&pool);
        if step == 30 {
            pool.group_commit();
        }
    }
    if group_commit_at_end {
        pool.group_commit();
    }
    LogicalState::of(&pool)
}

fn recovered(path: &Path) -> LogicalState {
    let region: Arc<dyn Region> = Arc::new(MmapRegion::open(path, MmapOptions::default()).unwrap());
    let (pool, _) = Pool::open(region, Consistency::Journal).unwrap();
    pool.check_invariants().unwrap();
    LogicalState::of(&pool)
}

fn field(stdout: &str, name: &str) -> u64 {
    let key = format!("{name}=");
    let at = stdout.find(&key).unwrap_or_else(|| panic!("no {name} in {stdout:?}")) + key.len();
    stdout[at..].split_whitespace().next().unwrap().parse().unwrap()
}

#[test]
fn every_stray_store_is_diverted_and_the_region_file_is_unchanged() {
    let _one = one_at_a_time();
    let dir = tempfile::Builder::new().prefix("nvstack-wild").tempdir_in("/dev/shm").unwrap();
    let (mut total, mut trapped) = (0, 0);
    for seed in common::seeds(4) {
        let path = dir.path().join(format!("region-{seed}"));
        fresh_region(&path);
        let out = wild(&path, seed, 500, "divert");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "seed {seed}: {:?} {stdout} {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(field(&stdout, "trapped"), 500, "seed {seed}: {stdout}");
        assert_eq!(field(&stdout, "changed"), 0, "seed {seed}: a stray store reached the file");
        assert_eq!(field(&stdout, "view_changed"), 0, "seed {seed}: the mapping was not restored");
        assert!(stdout.contains("closed"), "seed {seed}: {stdout}");
        // The pool worked on after the stray stores: 38 transactions, then a clean close.
        let expected = replay(seed, 38, true);
        let got = recovered(&path);
        assert!(got == expected, "seed {seed}: {}", got.diff(&expected));
        total += 500;
        trapped += field(&stdout, "trapped");
    }
    eprintln!(
        "wild writes (divert): {trapped} of {total} stray stores trapped, region files unchanged"
    );
}

#[test]
fn fail_stop_ends_the_process_before_the_store_and_recovery_restores_the_last_group_commit() {
    let _one = one_at_a_time();
    let dir = tempfile::Builder::new().prefix("nvstack-wild").tempdir_in("/dev/shm").unwrap();
    let mut stopped = 0;
    for seed in common::seeds(6) {
        let path = dir.path().join(format!("region-{seed}"));
        fresh_region(&path);
        let out = wild(&path, seed, 1, "fail-stop");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.signal(),
            Some(libc::SIGSEGV),
            "seed {seed}: {:?} {stderr}",
            out.status
        );
        assert!(stderr.contains("stray store to a write-protected NVRAM page"), "{stderr}");
        // The 3 operations of the running group are lost; the 30 group-committed ones are not.
        let expected = replay(seed, 30, false);
        let got = recovered(&path);
        assert!(got == expected, "seed {seed}: {}", got.diff(&expected));
        stopped += 1;
    }
    eprintln!("wild writes (fail-stop): {stopped} of {stopped} children stopped before the store");
}

#[test]
fn faults_that_are_not_stray_stores_keep_their_usual_ending() {
    let _one = one_at_a_time();
    let dir = tempfile::Builder::new().prefix("nvstack-wild").tempdir_in("/dev/shm").unwrap();
    for (what, signal) in
        [("null", libc::SIGSEGV), ("int3", libc::SIGTRAP), ("overflow", libc::SIGABRT)]
    {
        let path = dir.path().join(format!("region-{what}"));
        fresh_region(&path);
        let out = wild(&path, 1, 0, what);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.signal(), Some(signal), "{what}: {:?} {stderr}", out.status);
        assert!(!stderr.contains("stray store"), "{what}: {stderr}");
        if what == "overflow" {
            assert!(stderr.contains("overflowed its stack"), "Rust's handler ran: {stderr}");
        }
    }
}
