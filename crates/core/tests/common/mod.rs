//! Helpers shared by the engine's integration tests.

use std::sync::Arc;

use nvram::{FormatParams, SimRegion};
use txn::Pool;

/// A formatted simulated region with 4 undo slots of 64 KiB and `frames` frames.
pub fn region(frames: u64) -> Arc<SimRegion> {
    let params = FormatParams {
        region_size: 12288 + 4 * 65536 + 4096 + frames * 4096,
        undo_slots: 4,
        undo_slot_size: 65536,
    };
    let region = Arc::new(SimRegion::new(params.region_size));
    Pool::format(&*region, params).unwrap();
    region
}
