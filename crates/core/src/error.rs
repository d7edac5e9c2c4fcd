//! The engine's errors. The front end maps them to errno in exactly one place.

use lower::Errno;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FsError {
    /// The lower file system's own answer, passed through unchanged.
    #[error("lower file system: {0}")]
    Lower(Errno),
    /// A node id or file handle the kernel sent that we do not know (a bug or a stale handle).
    #[error("unknown node or handle {0}")]
    Stale(u64),
    /// The NVRAM ran out of frames or undo-log space for this operation.
    #[error("NVRAM exhausted: {0}")]
    NvramFull(String),
}

impl From<Errno> for FsError {
    fn from(e: Errno) -> Self {
        FsError::Lower(e)
    }
}

impl From<txn::TxError> for FsError {
    fn from(e: txn::TxError) -> Self {
        FsError::NvramFull(e.to_string())
    }
}

pub type FsResult<T> = Result<T, FsError>;
