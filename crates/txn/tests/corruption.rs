//! Bad input: damaged region images are detected by open (and so by `nvstack check`, which runs
//! the same code on a copy-on-write view), with an error naming the damaged area, and never
//! accepted with a wrong state. A flip is either reported, or provably harmless: the recovered
//! state equals the undamaged one (e.g. a flip in a descriptor that rollback overwrites, or in
//! undo-log bytes past the tail).
//!
//! The image used is a crash in the middle of a transaction, so the undo log holds live records.

mod common;

use std::sync::Arc;

use nvram::layout::{FORMAT_VERSION, Layout, PAGE_SIZE, STATE_OFFSET};
use nvram::{Region, SimRegion};
use txn::testkit::{LogicalState, Workload, WorkloadConfig};
use txn::undo::{self, SLOT_HEADER_SIZE};
use txn::{Consistency, Pool};

struct Fixture {
    image: Vec<u8>,
    layout: Layout,
    expected: LogicalState,
    /// Slot with live records and its used bytes.
    live_slot: (u32, u64),
    /// Descriptor offsets the in-flight transaction snapshotted (rollback rewrites them).
    rewritten: Vec<(u64, u64)>,
}

fn fixture() -> Fixture {
    let params = common::small_params();
    let region = common::formatted_sim(params);
    let (pool, _) = Pool::open(region.clone(), Consistency::Undo).unwrap();
    let mut workload = Workload::new(5, WorkloadConfig { big_percent: 0, abort_percent: 0 });
    for _ in 0..30 {
        workload.step(&pool);
    }
    let expected = LogicalState::of(&pool);
    let mut tx = pool.begin();
    // An in-flight transaction: change a live frame, free one, allocate one.
    let frames: Vec<_> = expected.frames.keys().copied().collect();
    let first = pool.frame_offset(txn::FrameId(frames[0]));
    tx.update(first + 100, &[0xAB; 300]).unwrap();
    tx.free_frame(txn::FrameId(frames[1])).unwrap();
    let fresh = tx.alloc_frame(txn::FrameTag { kind: 9, owner: 9999, index: 0 }).unwrap();
    tx.write(pool.frame_offset(fresh), &[0xCD; 4096]);
    let image = region.current();
    let layout = *pool.layout();
    let slot = (0..layout.undo_slots)
        .find(|&s| undo::read_slot_used(&*region, &layout, s).unwrap() > 0)
        .unwrap();
    let used = undo::read_slot_used(&*region, &layout, slot).unwrap();
    let rewritten = undo::read_records(&*region, &layout, slot)
        .unwrap()
        .iter()
        .map(|r| (r.target, r.target + r.old_bytes.len() as u64))
        .collect();
    tx.abort();
    Fixture { image, layout, expected, live_slot: (slot, used), rewritten }
}

/// Flips `bit` of byte `off` and recovers: Ok(true) = detected with `area` named, Ok(false) =
/// accepted with the right state, Err = accepted with a wrong state or wrong error.
fn flip(f: &Fixture, off: u64, bit: u8, area: &str) -> Result<bool, String> {
    let mut image = f.image.clone();
    image[off as usize] ^= 1 << bit;
    let region: Arc<dyn Region> = Arc::new(SimRegion::from_image(image));
    match Pool::open(region, Consistency::Undo) {
        Err(e) => {
            let msg = e.to_string();
            if msg.contains(area) {
                Ok(true)
            } else {
                Err(format!("byte {off}: wrong area: {msg}"))
            }
        }
        Ok((pool, _)) => {
            let state = LogicalState::of(&pool);
            if state == f.expected {
                Ok(false)
            } else {
                Err(format!("byte {off} bit {bit}: silently accepted: {}", state.diff(&f.expected)))
            }
        }
    }
}

#[test]
fn the_fixture_recovers_to_the_committed_state() {
    let f = fixture();
    assert_eq!(common::recover(f.image.clone()).unwrap(), f.expected);
    assert!(f.live_slot.1 > 0);
}

#[test]
fn every_flip_in_the_superblock_is_detected() {
    let f = fixture();
    for off in 0..PAGE_SIZE {
        for bit in [0, 3, 7] {
            // A flip in the magic says "not an nvstack region ... magic": it names the superblock.
            let detected = flip(&f, off, bit, "superblock").unwrap();
            assert!(detected, "superblock byte {off} bit {bit} accepted");
        }
    }
}

#[test]
fn every_flip_in_the_state_word_is_detected() {
    let f = fixture();
    for off in STATE_OFFSET..STATE_OFFSET + 8 {
        for bit in 0..8 {
            assert!(flip(&f, off, bit, "state word").unwrap(), "state byte {off} bit {bit}");
        }
    }
}

#[test]
fn every_flip_in_live_undo_records_is_detected_and_dead_bytes_are_harmless() {
    let f = fixture();
    let (slot, used) = f.live_slot;
    let base = f.layout.slot_offset(slot);
    let area = format!("undo log slot {slot}");
    // Header (static part and tail word) and every live record byte.
    let live: Vec<u64> =
        (base..base + 40).chain(base + SLOT_HEADER_SIZE..base + SLOT_HEADER_SIZE + used).collect();
    for &off in &live {
        let bit = (off % 8) as u8;
        assert!(flip(&f, off, bit, &area).unwrap(), "live undo byte {off} accepted");
    }
    // Bytes past the tail hold nothing: a flip there must change nothing.
    let dead = base + SLOT_HEADER_SIZE + used;
    for off in (dead..dead + 4096).step_by(7) {
        assert!(!flip(&f, off, 1, &area).unwrap());
    }
    // The other slot's header is checked even though it is empty.
    let other = f.layout.slot_offset(1 - slot);
    assert!(flip(&f, other + 3, 0, &format!("undo log slot {}", 1 - slot)).unwrap());
}

#[test]
fn flips_in_descriptors_are_detected_unless_rollback_rewrites_them() {
    let f = fixture();
    let (mut detected, mut harmless) = (0, 0);
    for off in f.layout.desc_offset..f.layout.desc_offset + f.layout.nr_frames * 32 {
        let rewritten = f.rewritten.iter().any(|&(s, e)| s <= off && off < e);
        if flip(&f, off, (off % 8) as u8, "frame descriptor").unwrap() {
            detected += 1;
        } else {
            assert!(rewritten, "descriptor byte {off} flip accepted");
            harmless += 1;
        }
    }
    assert!(detected > 0 && harmless > 0, "{detected} detected, {harmless} harmless");
}

#[test]
fn a_region_from_a_newer_format_version_is_refused_clearly() {
    let f = fixture();
    let mut image = f.image.clone();
    let newer = Layout { version: FORMAT_VERSION + 1, ..f.layout };
    image[..PAGE_SIZE as usize].copy_from_slice(&newer.encode());
    let region: Arc<dyn Region> = Arc::new(SimRegion::from_image(image));
    let err = Pool::open(region, Consistency::Undo).unwrap_err().to_string();
    assert!(err.contains("newer nvstack") && err.contains("format version 2"), "{err}");
}

#[test]
fn a_truncated_region_file_is_refused() {
    let f = fixture();
    let image = f.image[..f.image.len() - 4096].to_vec();
    let region: Arc<dyn Region> = Arc::new(SimRegion::from_image(image));
    let err = Pool::open(region, Consistency::Undo).unwrap_err().to_string();
    assert!(err.contains("superblock") && err.contains("truncated"), "{err}");
}
