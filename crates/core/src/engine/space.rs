//! Space in the lower file system reserved for data that lives only in NVRAM, so that a full
//! lower file system answers ENOSPC to the writer, never to a transform or a write-back.
//!
//! Reserved: every resident page of a temp file, one block per temp file (its inode and
//! directory entry are the lower file system's own business; one block covers a small file's
//! tail), and every dirty cached page that has no lower block yet. [`Space`] counts the pages;
//! only `tempfs` and `cache` change it, when their pages come and go.

use std::sync::atomic::{AtomicU64, Ordering};

use lower::LowerFs;

use super::Engine;
use crate::error::{FsResult, answer};
use crate::tempfs::data::PAGE;

/// Pages reserved in the lower file system (see the module docs).
#[derive(Debug, Default)]
pub struct Space {
    pages: AtomicU64,
}

impl Space {
    pub fn add(&self, pages: u64) {
        self.pages.fetch_add(pages, Ordering::Relaxed);
    }

    pub fn sub(&self, pages: u64) {
        let before = self.pages.fetch_sub(pages, Ordering::Relaxed);
        debug_assert!(before >= pages, "space reservation below zero");
    }

    pub fn pages(&self) -> u64 {
        self.pages.load(Ordering::Relaxed)
    }
}

impl<L: LowerFs> Engine<L> {
    /// Bytes the lower file system must keep free: reserved pages plus one block per temp
    /// file.
    pub(crate) fn reserved_bytes(&self) -> u64 {
        (self.space.pages() + self.temp.files_resident()) * PAGE
    }

    /// ENOSPC now when the lower file system could not take what NVRAM holds plus
    /// `more_pages`. A lower call (statfs): never under a short lock.
    pub(crate) fn reserve(&self, more_pages: u64) -> FsResult<()> {
        if more_pages == 0 {
            return Ok(());
        }
        let s = self.lower.statfs(self.lower.root())?;
        let avail = s.bavail.saturating_mul(u64::from(s.frsize.max(1)));
        if self.reserved_bytes() + more_pages * PAGE > avail {
            return Err(answer(libc::ENOSPC));
        }
        Ok(())
    }
}
