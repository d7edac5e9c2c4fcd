//! The temp-file store's part of recovery: the overlay rebuilt from the temp-file records,
//! temp files unlinked while open freed (nothing is open after a restart), interrupted
//! transforms finished (design.md section 10, the proof's cases 2-6).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use lower::LowerFs;

use crate::base::Base;
use crate::base::error::StartError;
use crate::tempfs::TempFs;
use crate::tempfs::overlay::Overlay;
use crate::tempfs::{self, Fate, State, TempFile, TempState, Trigger, data};

impl<L: LowerFs> TempFs<L> {
    /// See the module docs.
    pub(crate) fn rebuild_tempfiles(&self, b: &Base<L>) -> Result<(), StartError> {
        let scanned = tempfs::scan_all(&b.pool)?;
        {
            // T6: every record frame listed with its records' slots; empty ones beyond the
            // one kept as room (a crash can leave several) freed.
            let mut slots = self.slots.lock();
            *slots = crate::base::slots::RecordSlots::default();
            for &(frame, taken) in &scanned.record_frames {
                slots.add_frame(frame, taken);
            }
            drop(slots);
            self.free_empty_record_frames(b, 1).map_err(StartError::RecordFrames)?;
        }
        let found = scanned.files;
        let mut dirs: HashMap<Vec<u8>, Arc<L::Node>> = HashMap::new();
        let mut redo = Vec::new();
        // Built without a lock (lower calls find the directories), installed at the end.
        let mut idx = Overlay {
            next_serial: found.iter().map(|f| f.rec.serial + 1).max().unwrap_or(1),
            ..Overlay::default()
        };
        for f in found {
            let pages = f.pages.len() as u64;
            let file = Arc::new(TempFile::new(
                f.place,
                TempState {
                    dir: (0, 0),
                    rec: f.rec,
                    pages: f.pages,
                    opens: 0,
                    fate: Fate::Resident,
                    last_use: 0,
                },
            ));
            self.counters.pages_resident.fetch_add(pages, Ordering::Relaxed);
            b.space.add(pages);
            b.space.add_file();
            if file.place.slot == crate::base::slots::WHOLE {
                self.slots.lock().add_whole();
            }
            let mut st = file.lock();
            if st.rec.nlink == 0 {
                // Unlinked while open, and nothing is open after a restart.
                let n = b
                    .atomically(|tx| data::free_all(tx, file.place, &mut st.pages.clone()))
                    .map_err(|error| StartError::Redo { serial: file.serial, error })?;
                self.release_record(b, file.place);
                self.counters.pages_resident.fetch_sub(n, Ordering::Relaxed);
                b.space.sub(n);
                b.space.sub_file();
                st.fate = Fate::Freed;
                continue;
            }
            let dir = if let Some(d) = dirs.get(&st.rec.dir) {
                Arc::clone(d)
            } else {
                let node = b
                    .lower
                    .find_dir(&st.rec.dir, b.max_walk)
                    .map_err(|_| StartError::MissingDir { files: 1, handle: hex(&st.rec.dir) })?;
                let node = Arc::new(node);
                dirs.insert(st.rec.dir.clone(), Arc::clone(&node));
                node
            };
            let key = b.lower.key(&dir);
            st.dir = key;
            let (name, handle) = (st.rec.name.clone(), st.rec.dir.clone());
            if st.rec.state == State::Transforming {
                redo.push(Arc::clone(&file));
            }
            drop(st);
            idx.insert_name(key, &dir, &handle, &name, Arc::clone(&file));
            idx.temps.insert(file.serial, file);
        }
        *self.overlay.lock() = idx;
        for f in redo {
            self.finish_transform(b, &f, Trigger::Recovery, b.committed())
                .map_err(|error| StartError::Redo { serial: f.serial, error })?;
        }
        Ok(())
    }
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}
