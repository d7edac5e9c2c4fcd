//! The engine's side of packed records (`crate::slots`): what follows a committed removal,
//! and freeing record frames that hold no record, for both users (temp files, cached files),
//! each with its own list of record frames.

use lower::LowerFs;

use super::Engine;
use crate::error::FsResult;
use crate::slots::{Place, Released, SlotList};

impl<L: LowerFs> Engine<L> {
    /// After the removal of the record at `place` committed (`slots::remove`): its slot is
    /// free again (T6); a second empty record frame is freed in a transaction of its own (off
    /// the list first, so nobody reserves in it meanwhile). Returns the frames freed (0 or 1).
    pub(crate) fn release_slot(&self, list: &SlotList, place: Place) -> u64 {
        let released = list.lock().release(place);
        let Released::FreeFrame(frame) = released else { return 0 };
        match self.atomically(|tx| tx.free_frame(frame)) {
            Ok(()) => 1,
            Err(e) => {
                // Still allocated and zero (T5): listed again as room.
                eprintln!("nvstack: an empty record frame was not freed: {e}");
                list.lock().add_frame(frame, 0);
                0
            }
        }
    }

    /// Frees the record frames of `list` that hold no record, all but `keep` (off the list
    /// first); returns how many.
    pub(crate) fn free_empty_slots(&self, list: &SlotList, keep: usize) -> FsResult<u64> {
        let empty = list.lock().take_empty(keep);
        if empty.is_empty() {
            return Ok(0);
        }
        match self.atomically(|tx| empty.iter().try_for_each(|&f| tx.free_frame(f))) {
            Ok(()) => Ok(empty.len() as u64),
            Err(e) => {
                let mut l = list.lock();
                for &f in &empty {
                    l.add_frame(f, 0); // still allocated and zero (T5): room again
                }
                Err(e)
            }
        }
    }
}
