//! Helpers shared by the engine's integration tests.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use nvram::{FormatParams, SimRegion};
use txn::Pool;

/// A formatted simulated region with 4 undo slots of 64 KiB and `frames` frames.
#[allow(dead_code)] // not every test file starts an engine
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

/// Every `.rs` file below `dir`, depth first (the source scans of `rooms.rs` and
/// `incidents.rs`).
#[allow(dead_code)] // not every test file scans the sources
pub fn rust_sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}
