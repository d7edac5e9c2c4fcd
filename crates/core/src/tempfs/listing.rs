//! Merged directory listings (readdir of a lower directory that holds temp files): the
//! overlay's names read *before* the lower directory, so that a name moving from the overlay
//! into the lower directory meanwhile (a transform) is listed in one of the two; a name in
//! both is listed once, as the temp file. See `overlay/mod.rs` for the rules.

use std::sync::Arc;

use lower::{DirEntry, FileKind, LowerFs};

use super::TempFs;
use super::overlay::{DirKey, Listed, Listing, MAX_LISTING};
use crate::base::Base;
use crate::base::error::{FsResult, answer};
use crate::base::hidden::is_hidden;
use crate::base::inodes::TEMP_BASE;

impl<L: LowerFs> TempFs<L> {
    /// Lists an open directory (`file`, key `key`) for readdir: the lower entries (nvstack's
    /// hidden names left out) and, when the directory holds temp files, the merged snapshot
    /// kept in `listing` (see `Open::Dir`).
    pub(crate) fn list_merged(
        &self,
        b: &Base<L>,
        (file, key, listing): (&L::File, &DirKey, &Listing),
        offset: u64,
        emit: &mut dyn FnMut(&Listed) -> bool,
    ) -> FsResult<()> {
        let snapshot = {
            let mut l = listing.lock();
            if offset == 0 {
                *l = if self.overlay.lock().has_entries(*key) {
                    Some(Arc::new(self.snapshot_dir(b, file, *key)?))
                } else {
                    None
                };
            }
            l.clone()
        };
        if let Some(entries) = snapshot {
            for l in entries.iter().skip(offset as usize) {
                if !emit(l) {
                    break;
                }
            }
            return Ok(());
        }
        b.lower.readdir(file, offset, &mut |entry| {
            if is_hidden(&entry.name) {
                return true;
            }
            emit(&Listed { entry, temp: None })
        })?;
        Ok(())
    }

    /// The merged listing: the overlay's names read *before* the lower directory, so that a
    /// name moving from the overlay into the lower directory meanwhile (a transform) is in
    /// one of the two; a name in both is listed once, as the temp file.
    fn snapshot_dir(&self, b: &Base<L>, file: &L::File, key: DirKey) -> FsResult<Vec<Listed>> {
        let temps = self.overlay.lock().dirs.get(&key).map(|d| d.names.clone()).unwrap_or_default();
        let mut lower_entries = Vec::new();
        let mut too_many = false;
        b.lower.readdir(file, 0, &mut |e| {
            if lower_entries.len() >= MAX_LISTING {
                too_many = true;
                return false;
            }
            lower_entries.push(e);
            true
        })?;
        if too_many {
            return Err(answer(libc::EOVERFLOW));
        }
        let mut out = Vec::with_capacity(lower_entries.len() + temps.len());
        for e in lower_entries {
            if is_hidden(&e.name) || temps.contains_key(&e.name) {
                continue; // hidden, or shadowed by a temp file (O1)
            }
            out.push(Listed { entry: e, temp: None });
        }
        for (name, f) in temps {
            out.push(Listed {
                entry: DirEntry {
                    ino: TEMP_BASE + f.serial,
                    offset: 0,
                    kind: Some(FileKind::Regular),
                    name,
                },
                temp: Some(f),
            });
        }
        for (i, l) in out.iter_mut().enumerate() {
            l.entry.offset = i as u64 + 1;
        }
        Ok(out)
    }
}
