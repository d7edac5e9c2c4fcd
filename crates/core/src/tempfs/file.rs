//! One temp file in memory: the mirror of its record and page map ([`TempState`]) behind its
//! lock (rank `TempFile`), what became of it ([`Fate`]), and the condition variable that
//! writers wait on while it is being transformed.

use std::collections::BTreeMap;
use std::ffi::OsStr;

use txn::FrameId;

use super::record::{Record, State};
use crate::base::inodes::Key as DirKey;
use crate::base::slots::Place;
use crate::base::sync::{Condvar, Mutex, MutexGuard, Rank};

/// What became of a temp file object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// In NVRAM.
    Resident,
    /// Deleted: its frames are free. The node id answers ESTALE/ENOENT.
    Freed,
    /// Now a lower file: handles reopen it, the inode table names its lower node.
    Transformed,
}

/// The volatile state of a temp file (mirror of its record plus the page map).
#[derive(Debug)]
pub struct TempState {
    pub rec: Record,
    pub dir: DirKey,
    pub pages: BTreeMap<u64, FrameId>,
    /// Open handles (an unlinked file lives until the last one closes).
    pub opens: u32,
    pub fate: Fate,
    /// Last use tick (for LRU).
    pub last_use: u64,
}

impl TempState {
    /// The file is in NVRAM, live (not being transformed), and has the name `name` in the
    /// directory `dir`. O5: a temp file's name (state and overlay entry together) changes only
    /// while its lock and the overlay are held, so under its lock this is also what the
    /// overlay says.
    pub(crate) fn is_named(&self, dir: DirKey, name: &OsStr) -> bool {
        self.fate == Fate::Resident
            && self.rec.state == State::Live
            && self.rec.nlink > 0
            && self.dir == dir
            && self.rec.name == name
    }

    /// The invariants of one temp file that every operation on it keeps (checked at the end of
    /// each in debug builds, `debug_check!`): T3 (D3) no page lies at or beyond the size's
    /// last page; T4 a live named file (link count 1) has a name and a directory handle; a
    /// freed file holds no page.
    pub(crate) fn check(&self) -> Result<(), String> {
        let r = &self.rec;
        let first_gone = crate::base::pages::first_gone(r.size);
        if let Some((&page, _)) = self.pages.range(first_gone..).next() {
            return Err(format!(
                "T3: temp file {}: page {page} beyond the size {}",
                r.serial, r.size
            ));
        }
        if self.fate == Fate::Freed && !self.pages.is_empty() {
            return Err(format!("temp file {}: freed with {} pages", r.serial, self.pages.len()));
        }
        if self.fate == Fate::Resident
            && r.state == State::Live
            && r.nlink > 0
            && (r.name.is_empty() || r.dir.is_empty())
        {
            return Err(format!("T4: temp file {}: named without a name or directory", r.serial));
        }
        Ok(())
    }
}

/// A temp file. `place` (where its record is) and `serial` never change.
#[derive(Debug)]
pub struct TempFile {
    pub place: Place,
    pub serial: u64,
    state: Mutex<TempState>,
    changed: Condvar,
}

impl TempFile {
    pub(crate) fn new(place: Place, st: TempState) -> TempFile {
        TempFile {
            place,
            serial: st.rec.serial,
            state: Mutex::new(Rank::TempFile, st),
            changed: Condvar::new(),
        }
    }

    /// Two files are locked in serial order (a rename of one temp file onto another).
    pub(crate) fn lock(&self) -> MutexGuard<'_, TempState> {
        self.state.lock_nth(self.serial)
    }

    /// Waits until the file is not being transformed; returns the guard re-taken.
    pub(crate) fn wait_stable<'a>(
        &'a self,
        mut g: MutexGuard<'a, TempState>,
    ) -> MutexGuard<'a, TempState> {
        while g.rec.state == State::Transforming && g.fate == Fate::Resident {
            g = self.changed.wait(g);
        }
        g
    }

    /// Wakes waiters after a transform ended.
    pub(crate) fn notify(&self) {
        self.changed.notify_all();
    }
}
