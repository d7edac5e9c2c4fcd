//! The direct path's merge (docs/direct-path.md, "Take-back", step 3): the records of a
//! delegation log's valid prefix (`direct::scan`, which checked their bounds) applied to the
//! delegated file, in order, each as the one FUSE request it stands for - a WRITE or a
//! truncating SETATTR through the holder's open handle, with the same transactions, undo log and
//! NVRAM data path. Not yet reached by a grant (the grant and the take-back are the next step).
//!
//! Crash safety: each record is one operation of the engine, atomic and durable when it
//! returns (undo mode), and re-applying a record is idempotent (an absolute offset, a size), so
//! a crash in the middle of a merge leaves a prefix applied, and merging the whole log again
//! gives the file the log describes (`crates/core/tests/direct_merge.rs` crashes every merge
//! step and merges again).

use direct::{Record, RecordKind};
use lower::{LowerFs, SetAttr};

use super::Engine;
use crate::base::error::FsResult;

/// What a merge applied.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Merged {
    pub records: u64,
    pub bytes: u64,
}

impl<L: LowerFs> Engine<L> {
    /// Applies `records` to the file open as `fh` (node `node_id`), in order.
    pub fn merge_records(&self, node_id: u64, fh: u64, records: &[Record]) -> FsResult<Merged> {
        let mut merged = Merged::default();
        for r in records {
            match r.kind {
                RecordKind::Write => {
                    let mut done = 0;
                    while done < r.data.len() {
                        // A write may be short (NVRAM pressure moved the file meanwhile): the
                        // rest goes as the next one, as the kernel would send it.
                        let n = self.write(fh, r.offset + done as u64, &r.data[done..], false)?;
                        assert!(n > 0, "a write of a non-empty buffer wrote nothing");
                        done += n;
                    }
                    merged.bytes += r.data.len() as u64;
                }
                RecordKind::Truncate => {
                    let set = SetAttr { size: Some(r.offset), ..SetAttr::default() };
                    self.setattr(node_id, Some(fh), &set, false)?;
                }
            }
            merged.records += 1;
        }
        Ok(merged)
    }
}
