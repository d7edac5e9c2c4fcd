//! Errors of the region layer. Damage is reported with the area it was found in, so that
//! `nvstack check` can name it; operating errors carry the path and the failed operation.

use std::fmt;
use std::path::PathBuf;

/// The part of a region in which damage was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Area {
    Superblock,
    StateWord,
    /// The root area (the anchor records of the layers above).
    Root,
    UndoSlot(u32),
    Descriptor(u64),
    /// The contents of a frame (e.g. a temp-file record), by frame index.
    Frame(u64),
}

impl fmt::Display for Area {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Area::Superblock => write!(f, "superblock"),
            Area::StateWord => write!(f, "state word"),
            Area::Root => write!(f, "root area"),
            Area::UndoSlot(slot) => write!(f, "undo log slot {slot}"),
            Area::Descriptor(frame) => write!(f, "frame descriptor {frame}"),
            Area::Frame(frame) => write!(f, "frame {frame}"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot {op} {path}: {source}")]
    Io {
        path: PathBuf,
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is in use by another nvstack process (it holds the region's lock)")]
    InUse { path: PathBuf },
    #[error(
        "region size {size} bytes is too small: the minimum for these parameters is {min} bytes"
    )]
    TooSmall { size: u64, min: u64 },
    #[error("invalid format parameter: {0}")]
    BadParameter(String),
    #[error("not an nvstack region: {0}")]
    NotARegion(String),
    #[error(
        "region was formatted by a newer nvstack (format version {found}); this build reads \
         format version {supported} only: upgrade nvstack, or reformat with --force (destroys its contents)"
    )]
    NewerVersion { found: u32, supported: u32 },
    #[error("region damaged in the {area}: {detail}")]
    Corrupt { area: Area, detail: String },
}

impl Error {
    pub fn io(path: &std::path::Path, op: &'static str, source: std::io::Error) -> Error {
        Error::Io { path: path.to_path_buf(), op, source }
    }

    pub fn corrupt(area: Area, detail: impl Into<String>) -> Error {
        Error::Corrupt { area, detail: detail.into() }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
