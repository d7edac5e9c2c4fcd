//! Crash-image tests of journal mode (level 1 of the crash tests, docs/design.md sections 9 and
//! 12.6): the sweep itself is `txn::testkit::journal_crash_sweep`; see its docs for the oracle
//! (the generation word of each image names the group commit it must recover to).
//!
//! Replay one seed: `NVSTACK_SEED=7 cargo test -p nvstack-txn --test journal_crash_images --
//! --nocapture`.

mod common;

use std::sync::{Arc, Mutex};

use nvram::{CrashMode, Region, SimRegion};
use txn::testkit::{self, Decision, LogicalState, Workload, WorkloadConfig};
use txn::{Consistency, Pool};

const TRANSACTIONS_PER_SEED: usize = 120;

#[test]
fn every_crash_image_recovers_to_the_last_group_commit() {
    let seeds = common::seeds(12);
    let mut total = testkit::JournalSweepReport::default();
    for &seed in &seeds {
        let r = testkit::journal_crash_sweep(seed, TRANSACTIONS_PER_SEED, 8, 5)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(r.committed > 0 && r.transactions > r.committed, "seed {seed}: no aborts");
        total.transactions += r.transactions;
        total.committed += r.committed;
        total.group_commits += r.group_commits;
        total.forced_commits += r.forced_commits;
        total.crash_points += r.crash_points;
        total.images += r.images;
        total.images_past_commit_point += r.images_past_commit_point;
        total.images_recovered_as_undo += r.images_recovered_as_undo;
        total.nested_images += r.nested_images;
        total.records += r.records;
    }
    eprintln!(
        "journal crash-image suite: {} seeds, {} transactions ({} committed) in {} group commits \
         ({} forced by a full log or group), {} page copies: {} crash points (fences), {} images \
         recovered and checked against the last group commit they reached ({} past a commit \
         point), {} also recovered in undo mode, {} more images from crashes during recovery",
        seeds.len(),
        total.transactions,
        total.committed,
        total.group_commits,
        total.forced_commits,
        total.records,
        total.crash_points,
        total.images,
        total.images_past_commit_point,
        total.images_recovered_as_undo,
        total.nested_images
    );
    if seeds.len() > 1 {
        assert!(total.crash_points >= 1000, "only {} crash points exercised", total.crash_points);
        assert!(total.images_past_commit_point > 0, "no image caught a group commit point");
        assert!(total.forced_commits > 0, "the log never filled up");
        assert!(total.nested_images > 0 && total.images_recovered_as_undo > 0);
    }
}

#[test]
fn committed_operations_are_lost_by_a_crash_until_the_group_commits() {
    // The journal contract: atomic at once, durable at the next group commit.
    let region = common::formatted_sim(testkit::journal_sweep_params());
    let (pool, _) = Pool::open(region.clone(), Consistency::Journal).unwrap();
    let mut workload = Workload::new(5, WorkloadConfig { big_percent: 0, abort_percent: 0 });
    let mut durable = LogicalState::of(&pool);
    for round in 0..10 {
        let generation = pool.stats().journal.generation;
        assert_eq!(workload.step(&pool), Decision::Commit);
        assert_eq!(workload.step(&pool), Decision::Commit);
        if pool.stats().journal.generation == generation {
            for mode in testkit::crash_modes(round, region.fence_seq()) {
                let got = testkit::recover_image_as(region.crash_image(mode), Consistency::Journal)
                    .unwrap();
                assert!(got == durable, "round {round} {mode:?}: {}", got.diff(&durable));
            }
        }
        pool.group_commit();
        durable = LogicalState::of(&pool);
        for mode in testkit::crash_modes(round, region.fence_seq()) {
            let got =
                testkit::recover_image_as(region.crash_image(mode), Consistency::Journal).unwrap();
            assert!(got == durable, "after group commit {round} {mode:?}: {}", got.diff(&durable));
        }
    }
}

#[test]
fn concurrent_operations_never_tear_a_group() {
    // Four threads each repeat an operation that writes its sequence number into two pages
    // (with a pause between the two stores), while a fifth commits 40 groups.
    // Every crash image of the whole run (taken at a sample of fences, of group commits and of
    // log batches alike) must recover to a state where, for every thread, both pages agree:
    // a group never holds part of an operation.
    const THREADS: u64 = 4;
    const MIN_OPS: u64 = 20;
    const GROUP_COMMITS: u64 = 40;
    let params = nvram::FormatParams {
        region_size: 12288 + 4 * 65536 + 4096 + 32 * 4096,
        undo_slots: 4,
        undo_slot_size: 65536,
    };
    let region = common::formatted_sim(params);
    let (pool, _) = Pool::open(region.clone(), Consistency::Journal).unwrap();
    let frames: Vec<_> = {
        let mut tx = pool.begin();
        let frames = (0..2 * THREADS)
            .map(|i| tx.alloc_frame(txn::FrameTag { kind: 1, owner: i, index: 0 }).unwrap())
            .collect();
        tx.commit();
        frames
    };
    pool.group_commit();
    let images: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
    let sink = Arc::clone(&images);
    region.set_fence_hook(Some(Box::new(move |point| {
        if point.fence_seq % 3 == 0 {
            let mode = if point.fence_seq % 2 == 0 {
                CrashMode::DropAll
            } else {
                CrashMode::Torn { seed: point.fence_seq }
            };
            sink.lock().unwrap().push(point.image(mode));
        }
    })));
    let stop = std::sync::atomic::AtomicBool::new(false);
    let ops = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (pool, frames, stop, ops) = (&pool, &frames, &stop, &ops);
            s.spawn(move || {
                let a = pool.frame_offset(frames[2 * t as usize]) + 8 * t;
                let b = pool.frame_offset(frames[2 * t as usize + 1]) + 4000;
                let mut v = 0u64;
                while !stop.load(std::sync::atomic::Ordering::SeqCst) || v < MIN_OPS {
                    v += 1;
                    let mut tx = pool.begin();
                    tx.update(a, &v.to_le_bytes()).unwrap();
                    std::thread::yield_now();
                    tx.update(b, &v.to_le_bytes()).unwrap();
                    tx.commit();
                    ops.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
            });
        }
        let (pool, stop, ops) = (&pool, &stop, &ops);
        s.spawn(move || {
            for _ in 0..GROUP_COMMITS {
                // Let some operations join each group.
                let seen = ops.load(std::sync::atomic::Ordering::SeqCst);
                while ops.load(std::sync::atomic::Ordering::SeqCst) < seen + 3 {
                    std::thread::yield_now();
                }
                pool.group_commit();
            }
            stop.store(true, std::sync::atomic::Ordering::SeqCst);
        });
    });
    region.set_fence_hook(None);
    let stats = pool.stats().journal;
    let images = std::mem::take(&mut *images.lock().unwrap());
    assert!(stats.group_commits >= GROUP_COMMITS, "{stats:?}");
    assert!(images.len() > 50, "{} images", images.len());
    let read =
        |pool: &Pool, off: u64| u64::from_le_bytes(pool.read_vec(off, 8).try_into().unwrap());
    let mut seen_progress = 0;
    for image in images {
        let region: Arc<dyn Region> = Arc::new(SimRegion::from_image(image));
        let (recovered, _) = Pool::open(region, Consistency::Journal).unwrap();
        recovered.check_invariants().unwrap();
        for t in 0..THREADS {
            let a = read(&recovered, recovered.frame_offset(frames[2 * t as usize]) + 8 * t);
            let b = read(&recovered, recovered.frame_offset(frames[2 * t as usize + 1]) + 4000);
            assert_eq!(a, b, "thread {t}: an operation torn by a group commit");
            seen_progress += u64::from(a > 0);
        }
    }
    assert!(seen_progress > 0, "no image caught the threads mid-run");
    pool.check_invariants().unwrap();
}
