//! Space in the lower file system reserved for data that lives only in NVRAM, so that a full
//! lower file system answers ENOSPC to the writer, never to a transform or a write-back.
//!
//! Reserved: every resident page of a temp file, one block per temp file (its inode and
//! directory entry are the lower file system's own business; one block covers a small file's
//! tail), and every dirty cached page that has no lower block yet. [`Space`] counts the pages
//! and the temp files; only `tempfs` and `cache` change it, when their pages and files come and
//! go. [`Base::reserve`](super::Base::reserve) asks the lower file system.

use std::sync::atomic::{AtomicU64, Ordering};

/// Pages and temp files reserved in the lower file system (see the module docs).
#[derive(Debug, Default)]
pub struct Space {
    pages: AtomicU64,
    files: AtomicU64,
}

impl Space {
    pub(crate) fn add(&self, pages: u64) {
        self.pages.fetch_add(pages, Ordering::Relaxed);
    }

    pub(crate) fn sub(&self, pages: u64) {
        let before = self.pages.fetch_sub(pages, Ordering::Relaxed);
        debug_assert!(before >= pages, "space reservation below zero");
    }

    pub(crate) fn pages(&self) -> u64 {
        self.pages.load(Ordering::Relaxed)
    }

    /// A temp file came to NVRAM (created, or found at mount): one block reserved for it.
    pub(crate) fn add_file(&self) {
        self.files.fetch_add(1, Ordering::Relaxed);
    }

    /// A temp file left NVRAM (freed or transformed).
    pub(crate) fn sub_file(&self) {
        let before = self.files.fetch_sub(1, Ordering::Relaxed);
        debug_assert!(before >= 1, "temp-file reservation below zero");
    }

    /// Temp files in NVRAM now.
    pub(crate) fn files(&self) -> u64 {
        self.files.load(Ordering::Relaxed)
    }
}
