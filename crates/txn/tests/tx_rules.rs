//! The transaction API's rules and limits, scenario by scenario.

mod common;

use std::sync::Arc;

use nvram::{FormatParams, Region, SimRegion};
use txn::testkit::LogicalState;
use txn::{Consistency, FrameTag, Pool, TxError};

fn pool(consistency: Consistency) -> (Arc<SimRegion>, Pool) {
    let region = common::formatted_sim(common::small_params());
    let (pool, _) = Pool::open(region.clone(), consistency).unwrap();
    (region, pool)
}

const TAG: FrameTag = FrameTag { kind: 1, owner: 1, index: 0 };

#[test]
#[should_panic(expected = "R1: snapshot before modify")]
fn store_without_snapshot_panics() {
    let (_region, pool) = pool(Consistency::Undo);
    let mut tx = pool.begin();
    let frame = tx.alloc_frame(TAG).unwrap();
    tx.commit();
    let mut tx = pool.begin();
    tx.write(pool.frame_offset(frame), b"x");
}

#[test]
#[should_panic(expected = "R2")]
fn store_to_a_frame_freed_in_the_transaction_panics() {
    let (_region, pool) = pool(Consistency::Undo);
    let mut tx = pool.begin();
    let frame = tx.alloc_frame(TAG).unwrap();
    tx.free_frame(frame).unwrap();
    tx.write(pool.frame_offset(frame), b"x");
}

#[test]
#[should_panic(expected = "R4")]
fn snapshot_of_the_superblock_panics() {
    let (_region, pool) = pool(Consistency::Undo);
    pool.begin().snapshot(0, 8).unwrap();
}

#[test]
#[should_panic(expected = "not allocated")]
fn freeing_a_free_frame_panics() {
    let (_region, pool) = pool(Consistency::Undo);
    pool.begin().free_frame(txn::FrameId(3)).unwrap();
}

#[test]
fn a_freed_frame_is_not_reused_before_commit() {
    let (_region, pool) = pool(Consistency::Undo);
    let mut tx = pool.begin();
    let a = tx.alloc_frame(TAG).unwrap();
    tx.commit();
    let mut tx = pool.begin();
    tx.free_frame(a).unwrap();
    let b = tx.alloc_frame(TAG).unwrap();
    assert_ne!(a, b, "F2: a frame freed by a running transaction was handed out again");
    tx.commit();
    let mut tx = pool.begin();
    assert_eq!(tx.alloc_frame(TAG).unwrap(), a, "after commit the freed frame is reusable");
    tx.abort();
}

#[test]
fn undo_full_leaves_the_transaction_usable_and_abort_restores_everything() {
    let (_region, pool) = pool(Consistency::Undo);
    let mut tx = pool.begin();
    let frames: Vec<_> = (0..20).map(|_| tx.alloc_frame(TAG).unwrap()).collect();
    for &f in &frames {
        tx.write(pool.frame_offset(f), &[1; 4096]);
    }
    tx.commit();
    let before = LogicalState::of(&pool);
    let mut tx = pool.begin();
    let mut full = None;
    for &f in &frames {
        match tx.update(pool.frame_offset(f), &[2; 4096]) {
            Ok(()) => {}
            Err(e) => {
                full = Some(e);
                break;
            }
        }
    }
    let Some(TxError::UndoFull { capacity, .. }) = full else { panic!("no UndoFull: {full:?}") };
    assert_eq!(capacity, 32768 - 64);
    assert!(tx.undo_bytes() <= capacity);
    tx.abort();
    assert_eq!(LogicalState::of(&pool), before);
    assert_eq!(pool.stats().transactions_aborted, 1);
    pool.check_invariants().unwrap();
}

#[test]
fn full_nvram_is_an_error_and_the_allocator_recovers_after_abort() {
    let (_region, pool) = pool(Consistency::Undo);
    let total = pool.stats().frames_total;
    let mut tx = pool.begin();
    // Keep the undo log small: one descriptor snapshot (48 bytes + header) per frame fits.
    let mut got = 0;
    loop {
        match tx.alloc_frame(TAG) {
            Ok(_) => got += 1,
            Err(TxError::NoFrames) => break,
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(got, total);
    tx.abort();
    assert_eq!(pool.stats().frames_free, total);
    pool.check_invariants().unwrap();
}

#[test]
fn dropping_a_running_transaction_aborts_it() {
    let (_region, pool) = pool(Consistency::Undo);
    let before = LogicalState::of(&pool);
    {
        let mut tx = pool.begin();
        let (root, _) = pool.root_range();
        tx.update(root, b"scratch").unwrap();
    }
    assert_eq!(LogicalState::of(&pool), before);
    assert_eq!(pool.stats().undo_slots_in_use, 0);
}

#[test]
fn undo_bytes_max_tracks_the_largest_transaction() {
    let (_region, pool) = pool(Consistency::Undo);
    let (root, _) = pool.root_range();
    let mut tx = pool.begin();
    tx.update(root, &[1; 100]).unwrap();
    tx.commit();
    let mut tx = pool.begin();
    tx.update(root, &[1; 10]).unwrap();
    tx.commit();
    assert_eq!(pool.stats().undo_bytes_max, 32 + 104);
}

#[test]
fn none_mode_writes_without_logging() {
    let (region, pool) = pool(Consistency::None);
    let (root, _) = pool.root_range();
    let fences = region.counters().fence_calls;
    let mut tx = pool.begin();
    tx.write(root, b"direct");
    tx.commit();
    assert_eq!(pool.read_vec(root, 6), b"direct");
    assert_eq!(pool.stats().snapshot_records, 0);
    assert_eq!(region.counters().fence_calls - fences, 1, "one fence: the data persist");
}

#[test]
fn concurrent_transactions_on_disjoint_frames_all_commit() {
    let params = FormatParams { region_size: 8 << 20, undo_slots: 4, undo_slot_size: 65536 };
    let region: Arc<dyn Region> = Arc::new(SimRegion::new(params.region_size));
    Pool::format(&*region, params).unwrap();
    let (pool, _) = Pool::open(region, Consistency::Undo).unwrap();
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let pool = &pool;
            s.spawn(move || {
                for i in 0..50u64 {
                    let mut tx = pool.begin();
                    let f = tx.alloc_frame(FrameTag { kind: 1, owner: t, index: i }).unwrap();
                    tx.write(pool.frame_offset(f), &[t as u8; 4096]);
                    tx.commit();
                }
            });
        }
    });
    let frames = pool.allocated_frames().unwrap();
    assert_eq!(frames.len(), 400);
    for (f, tag) in frames {
        assert_eq!(pool.read_vec(pool.frame_offset(f), 4096), vec![tag.owner as u8; 4096]);
    }
    pool.check_invariants().unwrap();
}

#[test]
fn close_marks_the_region_clean_and_reopen_reports_it() {
    let region = common::formatted_sim(common::small_params());
    let (pool, report) = Pool::open(region.clone(), Consistency::Undo).unwrap();
    assert!(report.was_clean, "a fresh format is clean");
    assert_eq!(report.mount_count, 1);
    drop(pool); // no close: like a crash
    let (pool, report) = Pool::open(region.clone(), Consistency::Undo).unwrap();
    assert!(!report.was_clean);
    pool.close();
    let (_pool, report) = Pool::open(region, Consistency::Undo).unwrap();
    assert!(report.was_clean);
    assert_eq!(report.mount_count, 3);
}
