//! Helpers shared by the transaction-layer integration tests.
#![allow(dead_code)]

use std::sync::Arc;

use nvram::{FormatParams, SimRegion};
use txn::Pool;
use txn::testkit::LogicalState;

pub fn small_params() -> FormatParams {
    txn::testkit::sweep_params()
}

pub fn formatted_sim(params: FormatParams) -> Arc<SimRegion> {
    let region = Arc::new(SimRegion::new(params.region_size));
    Pool::format(&*region, params).expect("format");
    region
}

pub fn recover(image: Vec<u8>) -> Result<LogicalState, String> {
    txn::testkit::recover_image(image)
}

/// Seeds to run: `NVSTACK_SEED=n` replays one, else `0..default`.
pub fn seeds(default: u64) -> Vec<u64> {
    match std::env::var("NVSTACK_SEED") {
        Ok(s) => vec![s.parse().expect("NVSTACK_SEED is a number")],
        Err(_) => (0..default).collect(),
    }
}
