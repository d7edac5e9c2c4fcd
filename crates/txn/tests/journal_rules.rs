//! Journal mode scenario by scenario: abort, stray stores, mode switches, the group triggers,
//! persistence calls per operation, and the engine contract's edges.

mod common;

use std::sync::{Arc, Mutex};

use nvram::layout::PAGE_SIZE;
use nvram::{CrashMode, FormatParams, Region, SimRegion};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use txn::testkit::{self, LogicalState, Workload, WorkloadConfig};
use txn::{AreaFormat, Consistency, FrameTag, OpenOptions, Pool, TxError};

const TAG: FrameTag = FrameTag { kind: 1, owner: 1, index: 0 };

fn journal_pool() -> (Arc<SimRegion>, Pool) {
    let region = common::formatted_sim(testkit::journal_sweep_params());
    let (pool, _) = Pool::open(region.clone(), Consistency::Journal).unwrap();
    (region, pool)
}

/// The bytes of the areas transactions change (root, descriptors, frames).
fn data_bytes(pool: &Pool) -> Vec<u8> {
    let layout = pool.layout();
    let (root, root_len) = pool.root_range();
    let mut bytes = pool.read_vec(root, root_len as usize);
    let end = layout.frames_offset + layout.nr_frames * PAGE_SIZE;
    bytes.extend(pool.read_vec(layout.desc_offset, (end - layout.desc_offset) as usize));
    bytes
}

#[test]
fn abort_restores_every_byte_of_a_transaction_exactly() {
    let (_region, pool) = journal_pool();
    let mut workload = Workload::new(1, WorkloadConfig { big_percent: 0, abort_percent: 0 });
    for _ in 0..6 {
        workload.step(&pool);
    }
    // A transaction that touches pages the group already covers, pages it does not, a frame
    // freed in this group (logged when reused), fresh frames, and frees, then aborts.
    let mut tx = pool.begin();
    let victim = pool.allocated_frames().unwrap()[0].0;
    tx.free_frame(victim).unwrap();
    tx.commit();
    let before = data_bytes(&pool);
    let before_state = LogicalState::of(&pool);
    let mut tx = pool.begin();
    let (root, _) = pool.root_range();
    tx.update(root + 100, &[7; 300]).unwrap();
    let reused = tx.alloc_frame(TAG).unwrap();
    let fresh = tx.alloc_frame(TAG).unwrap();
    tx.write(pool.frame_offset(reused), &[8; 4096]);
    tx.write(pool.frame_offset(fresh), &[9; 4096]);
    let live: Vec<_> = pool.allocated_frames().unwrap();
    let other = live.iter().find(|(f, _)| *f != reused && *f != fresh).unwrap().0;
    tx.update(pool.frame_offset(other) + 10, &[10; 5000 - 10]).unwrap_or_else(|e| panic!("{e}"));
    tx.free_frame(other).unwrap();
    tx.abort();
    let after = data_bytes(&pool);
    // Frames this transaction allocated are free again: their bytes mean nothing.
    let layout = pool.layout();
    let skip = |i: usize| {
        let off = if i < PAGE_SIZE as usize {
            pool.root_range().0 + i as u64
        } else {
            layout.desc_offset + (i as u64 - PAGE_SIZE)
        };
        layout.frame_of(off).is_some_and(|f| f == reused.0 || f == fresh.0)
    };
    let differing: Vec<usize> =
        (0..before.len()).filter(|&i| before[i] != after[i] && !skip(i)).collect();
    assert!(
        differing.is_empty(),
        "{} bytes not restored, first at {}",
        differing.len(),
        differing[0]
    );
    assert_eq!(LogicalState::of(&pool), before_state);
    pool.group_commit();
    pool.check_invariants().unwrap();
    assert_eq!(pool.stats().region.trapped_writes, 0);
}

#[test]
fn stray_stores_to_committed_pages_are_all_trapped_and_change_nothing() {
    const WILD: u64 = 2000;
    let (region, pool) = journal_pool();
    let mut workload = Workload::new(3, WorkloadConfig::default());
    for _ in 0..20 {
        workload.step(&pool);
    }
    pool.group_commit();
    // A running group with a few committed operations: the pages it changed are protected like
    // the rest (J9), so stray stores into them are trapped too.
    for _ in 0..2 {
        workload.step(&pool);
    }
    let committed_pages: Vec<u64> = (0..region.len() / PAGE_SIZE)
        .map(|p| p * PAGE_SIZE)
        .filter(|&p| region.is_protected(p))
        .collect();
    let group_pages = pool.stats().journal.group_pages;
    assert!(group_pages > 0, "the group changed no page");
    assert_eq!(committed_pages.len() as u64, region.len() / PAGE_SIZE, "a page is writable");
    let current = region.current();
    let durable = region.crash_image(CrashMode::DropAll);
    let trapped_before = region.counters().trapped_writes;
    let mut rng = ChaCha8Rng::seed_from_u64(77);
    for i in 0..WILD {
        let page = committed_pages[rng.random_range(0..committed_pages.len())];
        let len = rng.random_range(1..=64u64);
        let off = page + rng.random_range(0..=PAGE_SIZE - len);
        let junk = vec![0xa5; len as usize];
        if i % 2 == 0 {
            region.write(off, &junk);
        } else {
            region.store_u64(off / 8 * 8, u64::MAX);
        }
    }
    let trapped = region.counters().trapped_writes - trapped_before;
    assert_eq!(trapped, WILD, "{trapped} of {WILD} stray stores trapped");
    assert!(region.current() == current, "a stray store changed a byte");
    assert!(region.crash_image(CrashMode::DropAll) == durable);
    assert_eq!(pool.stats().journal.trapped_writes, trapped_before + WILD);
    // The pool goes on: the group commits and recovers as usual.
    workload.step(&pool);
    pool.group_commit();
    pool.check_invariants().unwrap();
    workload.model().check(&LogicalState::of(&pool)).unwrap();
    let recovered =
        testkit::recover_image_as(region.crash_image(CrashMode::DropAll), Consistency::Journal)
            .unwrap();
    workload.model().check(&recovered).unwrap();
}

#[test]
fn the_group_log_and_superblock_are_protected_too() {
    let (region, pool) = journal_pool();
    let layout = *pool.layout();
    let mut tx = pool.begin();
    let f = tx.alloc_frame(TAG).unwrap();
    tx.write(pool.frame_offset(f), &[1; 4096]);
    tx.commit();
    // The group's retained copies (the log area), the superblock and the state word stay
    // read-only while the group runs; so do the pages it changed once (sealed, J9).
    for off in [0, 4096, layout.undo_offset, layout.undo_offset + 8192, layout.desc_offset - 8] {
        assert!(region.is_protected(off), "offset {off} writable");
    }
    assert!(region.is_protected(pool.frame_offset(f)) && region.is_protected(layout.desc_offset));
    assert_eq!(pool.read_vec(pool.frame_offset(f), 4096), vec![1; 4096]);
    pool.group_commit();
    assert!(region.is_protected(pool.frame_offset(f)) && region.is_protected(layout.desc_offset));
    assert!(region.is_protected(layout.undo_offset), "the commit point opened the log's page");
    pool.check_invariants().unwrap();
    assert_eq!(pool.stats().region.trapped_writes, 0);
}

#[test]
fn a_page_the_group_changes_stays_protected_and_takes_its_stores_through_the_writer() {
    const STORES: usize = 16;
    let (region, pool) = journal_pool();
    let mut tx = pool.begin();
    let f = tx.alloc_frame(TAG).unwrap();
    tx.write(pool.frame_offset(f), &[0; 4096]);
    tx.commit();
    pool.group_commit();
    let page = pool.frame_offset(f);
    let calls = |r: &SimRegion| (r.counters().protect_calls, r.counters().unprotect_calls);
    let protect_calls = calls(&region);
    let before = pool.stats().journal;
    // One store per transaction, each visible at once, the page protected throughout (J9):
    // however often the group changes it, it is never opened.
    for i in 0..STORES {
        let mut tx = pool.begin();
        tx.update(page + 8 * i as u64, &[i as u8 + 1; 8]).unwrap();
        assert_eq!(pool.read_vec(page + 8 * i as u64, 8), vec![i as u8 + 1; 8]);
        assert!(region.is_protected(page), "writable after {} stores", i + 1);
        tx.commit();
        pool.check_invariants().unwrap();
    }
    // A stray store into the page the group is changing is trapped too, and changes nothing.
    let trapped = region.counters().trapped_writes;
    region.write(page + 8, &[0xa5; 8]);
    assert_eq!(region.counters().trapped_writes, trapped + 1);
    assert_eq!(pool.read_vec(page + 8, 8), vec![2; 8]);
    // One store spanning two pages counts both (and the new frame's descriptor one).
    let mut tx = pool.begin();
    let g = tx.alloc_frame(TAG).unwrap();
    assert_eq!(pool.frame_offset(g), page + PAGE_SIZE, "frames are handed out in order");
    tx.snapshot(page + PAGE_SIZE - 8, 16).unwrap();
    tx.write(page + PAGE_SIZE - 8, &[3; 16]);
    tx.commit();
    let j = pool.stats().journal;
    assert_eq!(j.retained_stores - before.retained_stores, STORES as u64 + 1 + 2);
    // An aborted transaction's bytes are restored through the writer as well.
    let mut tx = pool.begin();
    tx.update(page + 2048, &[7; 8]).unwrap();
    assert_eq!(pool.read_vec(page + 2048, 8), vec![7; 8]);
    tx.abort();
    assert_eq!(pool.read_vec(page + 2048, 8), vec![0; 8]);
    pool.group_commit();
    assert!(region.is_protected(page) && region.is_protected(page + PAGE_SIZE));
    assert_eq!(calls(&region), protect_calls, "no page was unprotected or protected again");
    pool.check_invariants().unwrap();
    let mut expect = vec![0u8; 4096];
    for i in 0..STORES {
        expect[8 * i..8 * i + 8].fill(i as u8 + 1);
    }
    expect[4088..].fill(3);
    assert_eq!(pool.read_vec(page, 4096), expect);
    // Everything the stores through the writer made is in the durable image.
    let image: Arc<dyn Region> =
        Arc::new(SimRegion::from_image(region.crash_image(CrashMode::DropAll)));
    let (recovered, _) = Pool::open(image, Consistency::Journal).unwrap();
    assert_eq!(recovered.read_vec(page, 4096), expect);
}

#[test]
fn a_clean_close_switches_modes_both_ways() {
    let region = common::formatted_sim(testkit::journal_sweep_params());
    // No aborts: none mode cannot restore bytes.
    let mut workload = Workload::new(11, WorkloadConfig { big_percent: 0, abort_percent: 0 });
    let mut modes = [
        Consistency::Undo,
        Consistency::Journal,
        Consistency::None,
        Consistency::Journal,
        Consistency::Undo,
    ]
    .into_iter();
    let mut previous = Consistency::Undo;
    let mut expected = None;
    for mode in &mut modes {
        let (pool, report) = Pool::open(region.clone(), mode).unwrap();
        assert!(report.was_clean);
        assert_eq!(
            report.area_converted,
            (mode == Consistency::Journal) != (previous == Consistency::Journal),
            "{previous:?} -> {mode:?}"
        );
        if let Some(expected) = &expected {
            assert_eq!(LogicalState::of(&pool), *expected, "{previous:?} -> {mode:?}");
        }
        pool.check_invariants().unwrap();
        for _ in 0..15 {
            workload.step(&pool);
        }
        expected = Some(LogicalState::of(&pool));
        pool.close();
        previous = mode;
    }
    let (pool, _) = Pool::open(region, Consistency::Journal).unwrap();
    workload.model().check(&LogicalState::of(&pool)).unwrap();
}

#[test]
fn a_crash_in_either_mode_recovers_in_either_mode() {
    // Written in journal mode with a group running, crashed; opened in each mode.
    let region = common::formatted_sim(testkit::journal_sweep_params());
    let (pool, _) = Pool::open(region.clone(), Consistency::Journal).unwrap();
    let mut workload = Workload::new(21, WorkloadConfig { big_percent: 0, abort_percent: 0 });
    for _ in 0..5 {
        workload.step(&pool);
    }
    pool.group_commit();
    let committed = LogicalState::of(&pool);
    workload.step(&pool);
    let journal_image = region.crash_image(CrashMode::KeepAll);
    drop(pool);
    // Written in undo mode with a transaction half done (every snapshot and store made).
    let undo_region = common::formatted_sim(testkit::journal_sweep_params());
    let (undo_pool, _) = Pool::open(undo_region.clone(), Consistency::Undo).unwrap();
    let mut undo_workload = Workload::new(21, WorkloadConfig { big_percent: 0, abort_percent: 0 });
    for _ in 0..5 {
        undo_workload.step(&undo_pool);
    }
    let undo_committed = LogicalState::of(&undo_pool);
    let prepared = undo_workload.prepare(&undo_pool);
    let undo_image = undo_region.crash_image(CrashMode::KeepAll);
    std::mem::forget(prepared);

    for (image, expected, written) in [
        (journal_image, &committed, AreaFormat::GroupLog),
        (undo_image, &undo_committed, AreaFormat::UndoSlots),
    ] {
        for mode in [Consistency::Journal, Consistency::Undo, Consistency::None] {
            // Every fence of this recovery (and of the switch of the area's format) is a crash
            // point too: each image must recover, in both modes, to the same state.
            let region = Arc::new(SimRegion::from_image(image.clone()));
            let nested: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
            let sink = Arc::clone(&nested);
            region.set_fence_hook(Some(Box::new(move |point| {
                for crash in testkit::crash_modes(9, point.fence_seq) {
                    sink.lock().unwrap().push(point.image(crash));
                }
            })));
            let (pool, report) = Pool::open(region.clone(), mode).unwrap();
            region.set_fence_hook(None);
            assert_eq!(report.area_format, Some(written));
            assert!(report.transactions_rolled_back > 0, "{written:?} opened as {mode:?}");
            assert_eq!(LogicalState::of(&pool), *expected, "{written:?} opened as {mode:?}");
            pool.check_invariants().unwrap();
            let nested = std::mem::take(&mut *nested.lock().unwrap());
            assert!(nested.len() >= 8);
            for (i, image) in nested.into_iter().enumerate() {
                for again in [Consistency::Journal, Consistency::Undo] {
                    let got = testkit::recover_image_as(image.clone(), again).unwrap();
                    assert!(
                        got == *expected,
                        "{written:?} as {mode:?}, nested image {i} as {again:?}: {}",
                        got.diff(expected)
                    );
                }
            }
        }
    }
}

#[test]
fn group_due_follows_the_interval_the_size_and_the_log() {
    let region = common::formatted_sim(testkit::journal_sweep_params());
    let options = OpenOptions {
        group_interval_ns: 1000,
        group_bytes_max: 6 * PAGE_SIZE,
        ..OpenOptions::default()
    };
    let (pool, _) = Pool::open_with(region, Consistency::Journal, options).unwrap();
    assert!(!pool.group_due(0), "an empty group is never due");
    let (root, _) = pool.root_range();
    let mut tx = pool.begin();
    tx.update(root, b"one").unwrap();
    tx.commit();
    assert!(!pool.group_due(10_000), "the age counts from the first call that saw the group");
    assert!(!pool.group_due(10_999));
    assert!(pool.group_due(11_000));
    pool.group_commit();
    assert!(!pool.group_due(20_000));
    // Size: six changed pages.
    let mut tx = pool.begin();
    for _ in 0..5 {
        tx.alloc_frame(TAG).unwrap();
    }
    tx.commit();
    assert!(pool.group_due(20_001), "6 pages (5 fresh frames and a descriptor page) = the limit");
    // `begin` commits a group at its size limit before starting.
    let before = pool.stats().journal.group_commits;
    pool.begin().abort();
    let stats = pool.stats().journal;
    assert_eq!((stats.group_commits, stats.group_commits_forced), (before + 1, 1));
    assert_eq!(stats.group_pages, 0);
}

#[test]
fn a_transaction_beyond_its_log_credit_gets_undo_full_and_can_abort() {
    let (_region, pool) = journal_pool();
    let credit = pool.stats().journal.credit_pages;
    let mut tx = pool.begin();
    let frames: Vec<_> = (0..20).map(|_| tx.alloc_frame(TAG).unwrap()).collect();
    tx.commit();
    pool.group_commit();
    let before = LogicalState::of(&pool);
    let mut tx = pool.begin();
    let mut result = Ok(());
    for f in &frames {
        result = tx.update(pool.frame_offset(*f), &[3; 4096]);
        if result.is_err() {
            break;
        }
    }
    let Err(TxError::UndoFull { capacity, .. }) = result else { panic!("{result:?}") };
    assert_eq!(capacity, credit * PAGE_SIZE);
    tx.abort();
    assert_eq!(LogicalState::of(&pool), before);
    pool.group_commit();
    pool.check_invariants().unwrap();
}

#[test]
fn begin_commits_a_full_log_after_the_running_transactions_end() {
    // Two slots, a log of 31 pages, 15 per transaction. A running transaction holds its credit;
    // a second begin that finds too little log left waits for it, commits the group, starts.
    let (_region, pool) = journal_pool();
    let mut tx = pool.begin();
    let frames: Vec<_> = (0..14).map(|_| tx.alloc_frame(TAG).unwrap()).collect();
    tx.commit();
    pool.group_commit();
    let mut first = pool.begin();
    for f in &frames[..10] {
        first.update(pool.frame_offset(*f), &[1; 8]).unwrap();
    }
    first.commit();
    let started = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let mut holder = pool.begin();
        holder.update(pool.frame_offset(frames[12]), &[2; 8]).unwrap();
        let waiter = s.spawn(|| {
            let tx = pool.begin();
            started.store(true, std::sync::atomic::Ordering::SeqCst);
            tx.commit();
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!started.load(std::sync::atomic::Ordering::SeqCst), "began without log space");
        holder.commit();
        waiter.join().unwrap();
    });
    let stats = pool.stats().journal;
    assert_eq!(stats.group_commits_forced, 1);
    assert_eq!(stats.operations_committed, 1 + 1 + 1, "the first group, then first and holder");
    pool.check_invariants().unwrap();
}

#[test]
#[should_panic(expected = "would wait for itself")]
fn group_commit_from_a_thread_with_a_running_transaction_panics() {
    let (_region, pool) = journal_pool();
    let _tx = pool.begin();
    pool.group_commit();
}

#[test]
fn undo_mode_group_commit_is_a_no_op() {
    let region = common::formatted_sim(common::small_params());
    let (pool, _) = Pool::open(region.clone(), Consistency::Undo).unwrap();
    let fences = region.counters().fence_calls;
    assert_eq!(pool.group_commit(), txn::GroupCommit::default());
    assert!(!pool.group_due(u64::MAX));
    assert_eq!(region.counters().fence_calls, fences);
}

#[test]
fn persistence_calls_per_operation() {
    // Undo mode: 4 fences per transaction (records, tail, data, commit point). Journal mode:
    // one per snapshot that copies pages into the group log, none for pages the group already
    // covers, none at commit; two per group commit (data, commit point).
    let params = FormatParams { region_size: 8 << 20, undo_slots: 4, undo_slot_size: 1 << 20 };
    let mut fences = Vec::new();
    for mode in [Consistency::Undo, Consistency::Journal] {
        let region = common::formatted_sim(params);
        let (pool, _) = Pool::open(region.clone(), mode).unwrap();
        let mut tx = pool.begin();
        let f = tx.alloc_frame(TAG).unwrap();
        tx.commit();
        pool.group_commit();
        let off = pool.frame_offset(f);
        let count = || region.counters().fence_calls;
        let start = count();
        let mut tx = pool.begin();
        tx.update(off, &[1; 64]).unwrap();
        tx.commit();
        let first = count() - start;
        let start = count();
        for i in 0..100u8 {
            let mut tx = pool.begin();
            tx.update(off + 64, &[i; 64]).unwrap();
            tx.commit();
        }
        let hundred = count() - start;
        let start = count();
        pool.group_commit();
        let group = count() - start;
        fences.push((mode, first, hundred, group));
    }
    assert_eq!(fences[0], (Consistency::Undo, 4, 400, 0));
    assert_eq!(fences[1], (Consistency::Journal, 1, 0, 2));
}

#[test]
fn every_flip_in_the_live_group_log_is_corrected_or_reported() {
    // A crash with a running group of several batches; then one bit flipped anywhere in the
    // format word, the generation word, both entry tables, and (sampled) the copies. Recovery
    // must give exactly the last group commit, or refuse naming the area: never another state.
    let region = common::formatted_sim(testkit::journal_sweep_params());
    let (pool, _) = Pool::open(region.clone(), Consistency::Journal).unwrap();
    let mut workload = Workload::new(8, WorkloadConfig { big_percent: 0, abort_percent: 0 });
    for _ in 0..6 {
        workload.step(&pool);
    }
    pool.group_commit();
    let committed = LogicalState::of(&pool);
    for _ in 0..2 {
        workload.step(&pool);
    }
    let entries = pool.stats().journal.log_entries;
    assert!(entries >= 2, "{entries} entries");
    let layout = *pool.layout();
    // Dropped: the group's page changes never reached the media (a bad copy is then harmless);
    // kept: they did (a bad copy must be reported).
    let images = [region.crash_image(CrashMode::DropAll), region.crash_image(CrashMode::KeepAll)];
    drop(pool);
    let geo = txn::journal::LogGeometry::of(&layout);
    let mut offsets: Vec<u64> = (40..56).map(|b| layout.undo_offset + b).collect();
    for table in 0..2 {
        let start = geo.entry_offset(table, 0);
        offsets.extend(start..start + entries * txn::journal::ENTRY_SIZE);
    }
    for i in 0..entries {
        offsets.extend((0..PAGE_SIZE).step_by(97).map(|b| geo.copy_offset(i) + b));
    }
    let (mut reported, mut corrected) = (0, 0);
    for (off, image) in offsets.iter().flat_map(|&off| images.iter().map(move |i| (off, i))) {
        let bit = (off % 8) as u8;
        let damaged = SimRegion::from_image(image.clone());
        damaged.flip_bit(off, bit);
        let damaged: Arc<dyn Region> = Arc::new(damaged);
        match Pool::open(damaged, Consistency::Journal) {
            Err(e) => {
                assert!(e.to_string().contains("undo log slot 0"), "offset {off}: {e}");
                reported += 1;
            }
            Ok((pool, _)) => {
                let got = LogicalState::of(&pool);
                assert!(got == committed, "offset {off} bit {bit}: {}", got.diff(&committed));
                corrected += 1;
            }
        }
    }
    assert!(reported > 0 && corrected > 0);
    eprintln!(
        "group log flips: {reported} reported, {corrected} recovered to the last group commit"
    );
}

/// F4 (design.md section 4): a frame the running group freed is held - handed out only when no
/// other frame is free, and then logged, not fresh (J6) - a rolled-back allocation of it
/// holds it again, and the group commit releases it.
#[test]
fn frames_the_group_freed_are_allocated_last_and_released_by_its_commit() {
    let (_region, pool) = journal_pool();
    let mut tx = pool.begin();
    let (a, b) = (tx.alloc_frame(TAG).unwrap(), tx.alloc_frame(TAG).unwrap());
    tx.commit();
    pool.group_commit();
    let forced = pool.stats().journal.group_commits_forced;
    let mut tx = pool.begin();
    tx.free_frame(a).unwrap();
    tx.commit();
    pool.check_invariants().unwrap();
    let free = pool.stats().frames_free;
    // Every other free frame goes first, each fresh (no page copy); they are higher than `a`.
    let mut handed = Vec::new();
    for _ in 1..free {
        let before = pool.stats().journal;
        let mut tx = pool.begin();
        let f = tx.alloc_frame(TAG).unwrap();
        tx.commit();
        assert_ne!(f, a, "a held frame while {} others were free", free - 1 - handed.len() as u64);
        assert!(f > b);
        assert_eq!(pool.stats().journal.fresh_pages, before.fresh_pages + 1);
        handed.push(f);
    }
    assert!(handed.windows(2).all(|w| w[0] < w[1]), "lowest first: {handed:?}");
    pool.check_invariants().unwrap();
    // Only `a` is left: it is handed out, logged (its committed page is copied).
    let before = pool.stats().journal;
    let mut tx = pool.begin();
    assert_eq!(tx.alloc_frame(TAG).unwrap(), a);
    assert_eq!(pool.stats().journal.records, before.records + 1, "logged, not fresh");
    assert_eq!(pool.stats().journal.fresh_pages, before.fresh_pages);
    // Rolled back: held again.
    tx.abort();
    pool.check_invariants().unwrap();
    // One more frame the group frees, rolled back after its allocation too; then the commit.
    let mut tx = pool.begin();
    tx.free_frame(handed[0]).unwrap();
    tx.commit();
    let mut tx = pool.begin();
    assert_eq!(tx.alloc_frame(TAG).unwrap(), a, "the lowest held frame");
    assert_eq!(tx.alloc_frame(TAG).unwrap(), handed[0]);
    tx.abort();
    pool.check_invariants().unwrap();
    assert_eq!(pool.stats().journal.group_commits_forced, forced, "one group throughout");
    pool.group_commit();
    pool.check_invariants().unwrap();
    // Released: ordinary free frames, fresh in the new group.
    let before = pool.stats().journal;
    let mut tx = pool.begin();
    assert_eq!(tx.alloc_frame(TAG).unwrap(), a);
    tx.commit();
    assert_eq!(pool.stats().journal.fresh_pages, before.fresh_pages + 1);
    pool.check_invariants().unwrap();
}

#[test]
fn threads_waiting_for_slots_and_group_commits_are_all_woken() {
    // More threads than slots (2), and group commits back to back from another thread: every
    // `begin` that waits for a slot or a group commit, and every group commit that waits for the
    // running transactions, must be woken (a notify is skipped only when nobody waits). A lost
    // wakeup hangs a thread: the watchdog, outside the threads, fails the test instead.
    const THREADS: u64 = 6;
    const EACH: u64 = 300;
    let (_region, pool) = journal_pool();
    let mut tx = pool.begin();
    let frames: Vec<u64> =
        (0..THREADS).map(|_| pool.frame_offset(tx.alloc_frame(TAG).unwrap())).collect();
    tx.commit();
    pool.group_commit();
    let pool = Arc::new(pool);
    let (done, finished) = std::sync::mpsc::channel();
    let worker = {
        let pool = pool.clone();
        let frames = frames.clone();
        std::thread::spawn(move || {
            let stop = std::sync::atomic::AtomicBool::new(false);
            let commits = std::thread::scope(|s| {
                let (pool, stop) = (&*pool, &stop);
                let committer = s.spawn(move || {
                    let mut commits = 0u64;
                    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                        pool.group_commit();
                        commits += 1;
                        std::thread::yield_now();
                    }
                    commits
                });
                let writers: Vec<_> = frames
                    .iter()
                    .map(|&frame| {
                        s.spawn(move || {
                            for i in 0..EACH {
                                let mut tx = pool.begin();
                                tx.update(frame + 8 * (i % 512), &i.to_le_bytes()).unwrap();
                                tx.commit();
                            }
                        })
                    })
                    .collect();
                for writer in writers {
                    writer.join().unwrap();
                }
                stop.store(true, std::sync::atomic::Ordering::SeqCst);
                committer.join().unwrap()
            });
            done.send(commits).unwrap();
        })
    };
    let commits = finished
        .recv_timeout(std::time::Duration::from_secs(120))
        .expect("a thread was never woken (lost wakeup)");
    worker.join().unwrap();
    assert!(commits > 0);
    pool.group_commit();
    for &frame in &frames {
        let last = EACH - 1;
        assert_eq!(pool.read_vec(frame + 8 * (last % 512), 8), last.to_le_bytes());
    }
    assert_eq!(pool.stats().journal.group_operations, 0);
    pool.check_invariants().unwrap();
}
