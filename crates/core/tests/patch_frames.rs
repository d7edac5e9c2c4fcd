//! The packed patch store (`cache/patchframe.rs`) against a model: seeded puts (new, in
//! place, grown, moved) and removes of patches of one file, some of their transactions rolled
//! back. After every step the region's patch frames decode (P4, P6) to exactly the model's
//! patches, and the volatile map agrees with itself and with the region.

mod common;

use std::collections::BTreeMap;

use engine::cache::patch::{self, KIND_PATCHES, Merged, Patch};
use engine::cache::patchframe::PatchFrames;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use txn::{Consistency, FrameId, Pool};

/// A patch of `page` with one range of `len` bytes of `byte` at `at`.
fn patch(page: u64, at: usize, len: usize, byte: u8) -> Patch {
    match Patch::new(page).merge(at, &vec![byte; len], 4096) {
        Merged::Patch(p) => p,
        other => panic!("{other:?}"),
    }
}

/// Every patch in the region's patch frames of `owner`, by page, with its frame.
fn in_region(pool: &Pool, owner: FrameId) -> BTreeMap<u64, (FrameId, Patch)> {
    let mut out = BTreeMap::new();
    for (frame, tag) in pool.allocated_frames().unwrap() {
        if tag.kind != KIND_PATCHES {
            continue;
        }
        assert_eq!(tag.owner, owner.0);
        let bytes = pool.read_vec(pool.frame_offset(frame), 4096);
        for (_, p) in
            patch::decode_frame(&bytes).unwrap_or_else(|e| panic!("frame {frame:?}: {e:?}"))
        {
            assert!(out.insert(p.page, (frame, p)).is_none(), "a page twice");
        }
    }
    out
}

#[test]
fn puts_and_removes_with_rollbacks_agree_with_a_model() {
    let pool = Pool::open(common::region(64), Consistency::Undo).unwrap().0;
    let owner = FrameId(1_000_000); // a tag only: never dereferenced
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let mut pf = PatchFrames::default();
    let mut model: BTreeMap<u64, Patch> = BTreeMap::new();
    let (mut moved, mut rolled_back, mut max_frames) = (0, 0, 0);
    for step in 0..3000u32 {
        let page = rng.random_range(0..40u64);
        let abort = rng.random_range(0..6) == 0;
        pf.begin();
        let mut tx = pool.begin();
        let next = if model.contains_key(&page) && rng.random_range(0..3) == 0 {
            pf.remove(&mut tx, &pool, page).unwrap();
            None
        } else {
            // Mostly small, sometimes large: runs grow, shrink and move.
            let len = if rng.random_range(0..5) == 0 { 2500 } else { rng.random_range(1..700) };
            let p = patch(page, rng.random_range(0..4096 - len), len, step as u8);
            let at = pf.put(&mut tx, &pool, owner.0, page, &p.encode()).unwrap();
            assert_eq!(pf.place(page), Some(at));
            Some(p)
        };
        if abort {
            tx.abort();
            assert_eq!(pf.settle(false).moved, 0);
            rolled_back += 1;
        } else {
            tx.commit();
            moved += pf.settle(true).moved;
            match next {
                Some(p) => model.insert(page, p),
                None => model.remove(&page),
            };
        }
        pf.check().unwrap_or_else(|e| panic!("step {step}: {e}"));
        let region = in_region(&pool, owner);
        assert_eq!(region.len(), model.len(), "step {step}");
        for (page, (frame, p)) in &region {
            assert_eq!(model.get(page), Some(p), "step {step} page {page}");
            assert_eq!(pf.place(*page).map(|at| at.frame), Some(*frame), "step {step}");
        }
        assert_eq!(pf.frame_count(), pf.frames().count());
        max_frames = max_frames.max(pf.frame_count());
    }
    // Packed: 40 pages of patches mostly under 700 bytes never needed a frame each.
    assert!(max_frames < 30, "{max_frames} frames");
    assert!(moved > 0 && rolled_back > 0, "moved {moved}, rolled back {rolled_back}");
    // Found again from the region alone (recovery's view) it is the same map.
    let found =
        PatchFrames::found(in_region(&pool, owner).into_iter().map(|(page, (frame, p))| {
            let at = pf.place(page).unwrap();
            assert_eq!((at.frame, at.slots), (frame, p.slots()));
            (page, at)
        }));
    found.check().unwrap();
    assert_eq!(found.frame_count(), pf.frame_count());
}
