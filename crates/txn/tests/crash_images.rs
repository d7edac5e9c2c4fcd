//! Crash-image tests of the undo-log transactions (level 1 of the three crash-test levels, docs/design.md section 9): the sweep itself is
//! `txn::testkit::crash_sweep` (also run by `nvstack demo`); see its docs for what is checked.
//!
//! Replay one seed: `NVSTACK_SEED=7 cargo test -p nvstack-txn --test crash_images -- --nocapture`.

mod common;

use txn::testkit::{self, Decision, LogicalState, Workload, WorkloadConfig};
use txn::{Consistency, Pool};

const TRANSACTIONS_PER_SEED: usize = 80;

#[test]
fn every_crash_image_recovers_to_a_committed_state() {
    let seeds = common::seeds(12);
    let mut total = testkit::SweepReport::default();
    for &seed in &seeds {
        let r =
            testkit::crash_sweep(seed, TRANSACTIONS_PER_SEED, 8).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            r.committed > 0 && r.transactions > r.committed,
            "seed {seed}: no aborts or no commits"
        );
        total.transactions += r.transactions;
        total.committed += r.committed;
        total.crash_points += r.crash_points;
        total.images += r.images;
        total.images_in_commit += r.images_in_commit;
        total.nested_images += r.nested_images;
    }
    eprintln!(
        "crash-image suite: {} seeds, {} transactions ({} committed): {} crash points (fences), \
         {} images recovered and checked ({} showed the transaction being committed), {} more \
         images from crashes during recovery",
        seeds.len(),
        total.transactions,
        total.committed,
        total.crash_points,
        total.images,
        total.images_in_commit,
        total.nested_images
    );
    if seeds.len() > 1 {
        assert!(total.crash_points >= 1000, "only {} crash points exercised", total.crash_points);
        assert!(
            total.images_in_commit > 0,
            "no image showed a commit: commit window not exercised"
        );
    }
}

#[test]
fn image_after_the_commit_point_shows_the_transaction() {
    // Durability: once commit returns, every crash mode keeps the transaction.
    let region = common::formatted_sim(common::small_params());
    let (pool, _) = Pool::open(region.clone(), Consistency::Undo).unwrap();
    let mut workload = Workload::new(99, WorkloadConfig { big_percent: 0, abort_percent: 0 });
    for _ in 0..20 {
        assert_eq!(workload.step(&pool), Decision::Commit);
        let expected = LogicalState::of(&pool);
        for mode in testkit::crash_modes(99, region.fence_seq()) {
            let got = testkit::recover_image(region.crash_image(mode)).unwrap();
            assert!(got == expected, "{mode:?}: {}", got.diff(&expected));
        }
    }
}
