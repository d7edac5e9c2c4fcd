//! What the kernel names, over the merged namespace: every node id names a lower object or a
//! temp file ([`Obj`]), every open handle an open lower object, temp file or directory
//! ([`Open`]). The tables themselves are the base's generic ones (`base/inodes.rs`,
//! `base/handles.rs`); TempFFS holds them because its overlay decides what a name is, and its
//! transform changes what a node id names (a temp file becomes a lower file, keeping its id).

use std::sync::{Arc, OnceLock};

use lower::LowerFs;

use super::TempFile;
use super::overlay::{DirKey, Listing};

/// What a node id names.
#[derive(Debug)]
pub enum Obj<N> {
    Lower(Arc<N>),
    Temp(Arc<TempFile>),
}

impl<N> Clone for Obj<N> {
    fn clone(&self) -> Self {
        match self {
            Obj::Lower(n) => Obj::Lower(Arc::clone(n)),
            Obj::Temp(f) => Obj::Temp(Arc::clone(f)),
        }
    }
}

/// An open file or directory.
#[derive(Debug)]
pub enum Open<L: LowerFs> {
    /// An open lower object (not a directory): `key` is its lower identity, `regular` whether
    /// it is a regular file (only those are cached), `direct` whether opened with O_DIRECT
    /// (its IO goes to the lower file, which is written back first), `passthrough` whether
    /// the kernel serves its IO from the lower file (`route/`; a request that still reaches
    /// the engine goes to the lower file like O_DIRECT's), `small_writes` whether it was
    /// written in pieces smaller than a page (the route profile learns the file at release).
    Lower {
        file: L::File,
        key: (u64, u64),
        regular: bool,
        direct: bool,
        passthrough: bool,
        small_writes: std::sync::atomic::AtomicBool,
        /// Opened for writing (a delegation is granted only to such an open).
        writable: bool,
    },
    /// An open temp file. After a transform, `lower` is opened on first use with `flags`.
    Temp { file: Arc<TempFile>, flags: i32, lower: OnceLock<L::File> },
    /// An open lower directory; `listing` is the merged snapshot taken at offset 0 when the
    /// directory held temp files (offsets are then positions in it: stable across changes).
    Dir { file: L::File, key: DirKey, listing: Listing },
}
