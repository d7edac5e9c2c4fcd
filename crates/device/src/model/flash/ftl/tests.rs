//! The log-block FTL by hand-computed cases (each merge kind, eviction order, trims) and by a
//! property test of read-after-write through every merge.

use super::*;
use proptest::prelude::*;

/// 4 pages per block, 4 logical blocks, `logs` log blocks: small enough to follow by hand.
fn ftl(logs: u32) -> LogBlockFtl {
    LogBlockFtl::new(Geometry { pages_per_block: 4, logical_blocks: 4, log_blocks: logs })
}

/// Writes the logical pages in order, checking the invariants after each; returns the ops.
fn write_all(f: &mut LogBlockFtl, lpns: &[u64]) -> NandOps {
    let mut ops = NandOps::default();
    for &l in lpns {
        f.write(l, &mut ops);
        f.check();
    }
    ops
}

#[test]
fn first_writes_in_ascending_order_go_in_place_without_merges() {
    let mut f = ftl(2);
    // Block 0 gets logical block 0 (free list in number order), page by page.
    let ops = write_all(&mut f, &[0, 1, 3]);
    assert_eq!(ops, NandOps { host_page_programs: 3, ..NandOps::default() });
    assert_eq!(f.lookup(3), Some(Ppn { pbn: 0, page: 3 }));
    assert_eq!(f.lookup(2), None, "skipped page 2 is unwritten");
    assert_eq!(f.log_blocks_used(), 0);
    // Page 2 is below the write pointer (4): it goes to a log block (block 1).
    let ops = write_all(&mut f, &[2]);
    assert_eq!(ops.merges(), 0);
    assert_eq!(f.lookup(2), Some(Ppn { pbn: 1, page: 0 }));
    assert!(f.has_log(0));
}

#[test]
fn sequential_overwrite_of_a_block_is_one_switch_merge() {
    let mut f = ftl(2);
    write_all(&mut f, &[0, 1, 2, 3]); // in place into block 0
    let ops = write_all(&mut f, &[0, 1, 2, 3]); // log block 1, full -> switch
    assert_eq!(
        ops,
        NandOps { host_page_programs: 4, block_erases: 1, merges_switch: 1, ..NandOps::default() }
    );
    assert_eq!(f.data_block(0), Some(1), "the log block became the data block");
    assert_eq!(f.erase_counts().collect::<Vec<_>>(), vec![1, 0, 0, 0, 0, 0, 0]);
    assert!(!f.has_log(0));
    // The erased block 0 joined the tail of the free list: the next allocation takes
    // block 2, not block 0 (FIFO allocator).
    write_all(&mut f, &[4]);
    assert_eq!(f.data_block(1), Some(2));
}

#[test]
fn evicting_an_in_order_incomplete_log_is_a_partial_merge() {
    let mut f = ftl(1);
    write_all(&mut f, &[0, 1, 2, 3, 4]); // lbn 0 in block 0, lbn 1 page 0 in block 1
    write_all(&mut f, &[0, 1]); // in order, incomplete: log block 2 for lbn 0
    // An overwrite in lbn 1 needs a log block; the only one belongs to lbn 0: it merges.
    // Partial: data pages 2 and 3 are copied back into the log block, block 0 erased.
    let ops = write_all(&mut f, &[4]);
    assert_eq!(
        ops,
        NandOps {
            host_page_programs: 1,
            copy_backs: 2,
            block_erases: 1,
            merges_partial: 1,
            ..NandOps::default()
        }
    );
    assert_eq!(f.data_block(0), Some(2));
    for off in 0..4 {
        assert_eq!(f.lookup(off), Some(Ppn { pbn: 2, page: off as u32 }));
    }
    assert!(f.has_log(1) && !f.has_log(0));
    // Block 0 was erased (tail of the free list), so lbn 1's log came from block 3.
    assert_eq!(f.lookup(4), Some(Ppn { pbn: 3, page: 0 }));
}

#[test]
fn partial_merge_copies_only_valid_data_pages() {
    let mut f = ftl(1);
    write_all(&mut f, &[0, 1, 3, 4]); // lbn 0: pages 0, 1, 3 valid, 2 never written
    f.trim(3); // page 3 trimmed: invalid, nothing to copy
    write_all(&mut f, &[0]); // log for lbn 0: offset 0
    let ops = write_all(&mut f, &[4]); // evicts lbn 0's log: partial, copies page 1 only
    assert_eq!((ops.merges_partial, ops.copy_backs, ops.block_erases), (1, 1, 1));
    assert_eq!(f.lookup(2), None);
    assert_eq!(f.lookup(3), None);
}

#[test]
fn random_overwrites_are_full_merges() {
    let mut f = ftl(2);
    write_all(&mut f, &[0, 1, 2, 3]); // data block 0
    // Log block 1 receives offsets 3, 1, 3, 0: out of order, full after 4 pages. Full
    // merge into new block 2: offset 0 (log page 3), 1 (log page 1), 2 (data page 2),
    // 3 (log page 2) = 4 copies; erase data block 0 and log block 1 = 2 erases.
    let ops = write_all(&mut f, &[3, 1, 3, 0]);
    assert_eq!(
        ops,
        NandOps {
            host_page_programs: 4,
            copy_backs: 4,
            block_erases: 2,
            merges_full: 1,
            ..NandOps::default()
        }
    );
    assert_eq!(f.data_block(0), Some(2));
    assert_eq!(f.erase_counts().take(3).collect::<Vec<_>>(), vec![1, 1, 0]);
    // Again: offsets 2, 2, 2, 2 -> full merge copying 4 pages (3 from the data block).
    let ops = write_all(&mut f, &[2, 2, 2, 2]);
    assert_eq!((ops.merges_full, ops.copy_backs, ops.block_erases), (1, 4, 2));
    // A reverse-order overwrite of a sparse block: data pages 0 and 2 written, log gets
    // 2, 0, 2, 0 -> full merge copies 2 pages (offsets 1 and 3 have no version).
    write_all(&mut f, &[8, 10]);
    let ops = write_all(&mut f, &[10, 8, 10, 8]);
    assert_eq!((ops.merges_full, ops.copy_backs, ops.block_erases), (1, 2, 2));
    assert_eq!(f.lookup(9), None);
}

#[test]
fn log_exhaustion_evicts_the_oldest_log_block() {
    let mut f = ftl(2);
    write_all(&mut f, &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]); // lbn 0, 1, 2 full
    write_all(&mut f, &[1]); // log for lbn 0 (oldest)
    write_all(&mut f, &[5]); // log for lbn 1
    write_all(&mut f, &[2]); // lbn 0's log again: it is still the oldest
    // lbn 2 needs a log: lbn 0's log (allocated first) is merged, though it was written
    // last. Its offsets 1, 2 are not 0.. in order: a full merge of 4 copies, 2 erases.
    let ops = write_all(&mut f, &[9]);
    assert_eq!(
        ops,
        NandOps {
            host_page_programs: 1,
            copy_backs: 4,
            block_erases: 2,
            merges_full: 1,
            ..NandOps::default()
        }
    );
    assert!(!f.has_log(0) && f.has_log(1) && f.has_log(2));
}

#[test]
fn reads_cost_a_page_read_only_for_written_pages() {
    let mut f = ftl(1);
    let mut ops = NandOps::default();
    assert_eq!(f.read(5, &mut ops), None);
    f.write(5, &mut ops);
    assert!(f.read(5, &mut ops).is_some());
    f.trim(5);
    assert_eq!(f.read(5, &mut ops), None);
    assert_eq!((ops.host_page_reads, ops.host_page_programs), (1, 1));
    f.check();
}

#[test]
fn trim_of_a_log_page_keeps_it_out_of_the_merge() {
    let mut f = ftl(1);
    write_all(&mut f, &[0, 1, 2, 3]);
    write_all(&mut f, &[1, 0]); // log: offsets 1, 0 (out of order)
    f.trim(1); // newest version of offset 1 is log page 0: dropped
    f.check();
    assert_eq!(f.lookup(1), None);
    let ops = write_all(&mut f, &[3, 3]); // log full -> full merge: offsets 0, 2, 3
    assert_eq!((ops.merges_full, ops.copy_backs, ops.block_erases), (1, 3, 2));
    assert_eq!(f.lookup(1), None);
}

#[test]
fn geometry_limits_are_enforced() {
    let ok = Geometry { pages_per_block: 32, logical_blocks: 2048, log_blocks: 64 };
    assert!(ok.validate().is_ok());
    assert_eq!(ok.physical_blocks(), 2048 + 64 + 1);
    for bad in [
        Geometry { log_blocks: 0, ..ok },
        Geometry { log_blocks: LOG_BLOCKS_MAX + 1, ..ok },
        Geometry { pages_per_block: 0, ..ok },
        Geometry { logical_blocks: 0, ..ok },
        Geometry { logical_blocks: 1 << 20, ..ok },
    ] {
        assert!(bad.validate().is_err(), "{bad:?}");
    }
}

/// One step of the property test: a write or a trim of a logical page.
#[derive(Debug, Clone)]
enum Step {
    Write(u64),
    Trim(u64),
}

fn steps(logical_pages: u64) -> impl Strategy<Value = Vec<Step>> {
    let step = prop_oneof![
        // Mostly writes, clustered on few pages sometimes (hot metadata) and spread
        // otherwise.
        6 => (0..logical_pages).prop_map(Step::Write),
        2 => (0..4u64).prop_map(Step::Write),
        1 => (0..logical_pages).prop_map(Step::Trim),
    ];
    proptest::collection::vec(step, 1..400)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Read-after-write through every merge: a model "logical page -> version tag of its
    /// last write" (None after a trim) matches the tag of the physical page the FTL maps,
    /// after every step; the invariants hold after every step; the counters add up.
    #[test]
    fn reads_always_find_the_newest_version(
        ppb in 1u32..6,
        logical_blocks in 1u32..6,
        log_blocks in 1u32..4,
        seq in steps(36),
    ) {
        let geo = Geometry { pages_per_block: ppb, logical_blocks, log_blocks };
        let mut f = LogBlockFtl::new(geo);
        let pages = geo.logical_pages();
        let mut model: Vec<Option<u64>> = vec![None; pages as usize];
        let mut ops = NandOps::default();
        for (i, step) in seq.iter().enumerate() {
            let tag = i as u64 + 1;
            match *step {
                Step::Write(l) => {
                    let l = l % pages;
                    f.tag_next = tag;
                    f.write(l, &mut ops);
                    model[l as usize] = Some(tag);
                }
                Step::Trim(l) => {
                    let l = l % pages;
                    f.trim(l);
                    model[l as usize] = None;
                }
            }
            f.check();
            for (l, want) in model.iter().enumerate() {
                let got = f.lookup(l as u64).map(|p| f.tag(p));
                prop_assert_eq!(got, *want, "logical page {} after step {}", l, i);
            }
        }
        let programs: u64 = f.page_program_counts().iter().map(|&c| u64::from(c)).sum();
        prop_assert_eq!(programs, ops.page_programs());
        let erases: u64 = f.erase_counts().map(u64::from).sum();
        prop_assert_eq!(erases, ops.block_erases);
        prop_assert_eq!(f.lbn_write_counts().iter().sum::<u64>(), ops.host_page_programs);
        // A switch or partial merge erases 1 block, a full merge 2.
        prop_assert_eq!(
            ops.block_erases,
            ops.merges_switch + ops.merges_partial + 2 * ops.merges_full
        );
    }
}
