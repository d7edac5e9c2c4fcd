//! The engine's errors. The front end maps them to errno in exactly one place
//! (`fuse/src/errno.rs`).
//!
//! The variants keep apart who said no: the lower file system ([`FsError::Lower`], passed
//! through unchanged so that applications see what the lower directory would have told them),
//! the engine itself answering as a file system would ([`FsError::Answer`]: a name taken by a
//! temp file, a directory that holds temp files, too many open files), the kernel naming
//! something we do not know ([`FsError::Stale`]), and the NVRAM refusing a change
//! ([`FsError::Nvram`], with the reason: no free frame, or the operation does not fit its undo
//! slot; the write path reacts differently to each).

use lower::Errno;
use txn::TxError;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FsError {
    /// The lower file system's own answer, passed through unchanged.
    #[error("lower file system: {0}")]
    Lower(Errno),
    /// The engine's own answer, given as the lower file system would give it.
    #[error("{0}")]
    Answer(Errno),
    /// A node id or file handle the kernel sent that we do not know (a bug or a stale handle).
    #[error("unknown node or handle {0}")]
    Stale(u64),
    /// The NVRAM refused a change: no free frame, or more undo log than a slot holds.
    #[error("NVRAM: {0}")]
    Nvram(TxError),
}

impl From<Errno> for FsError {
    fn from(e: Errno) -> Self {
        FsError::Lower(e)
    }
}

impl From<TxError> for FsError {
    fn from(e: TxError) -> Self {
        FsError::Nvram(e)
    }
}

/// The engine's own answer `code` (an errno value).
pub(crate) fn answer(code: i32) -> FsError {
    FsError::Answer(Errno(code))
}

pub type FsResult<T> = Result<T, FsError>;

/// Why an engine could not start over its region.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{0}")]
    Region(#[from] nvram::Error),
    #[error(
        "{files} temp file(s) of a lower directory that no longer exists (directory handle {handle}): \
         the lower directory was changed behind nvstack's back"
    )]
    MissingDir { files: usize, handle: String },
    #[error("lower file system: {0}")]
    Lower(lower::Errno),
    #[error("finishing an interrupted transform of temp file {serial}: {error}")]
    Redo { serial: u64, error: FsError },
    #[error(
        "finding the lower file of the cached-file record in {record} by its handle: {error} \
         (its dirty pages are kept; mount as root so that file handles can be opened, or raise \
         the walk limit)"
    )]
    CachedFile { record: String, error: lower::Errno },
    #[error(
        "freeing the dirty pages of a file deleted before the crash (record in {record}): \
         {error}"
    )]
    DropDeleted { record: String, error: FsError },
    #[error("settling pending directory times: {0}")]
    Settle(FsError),
    #[error("freeing record frames that hold no record: {0}")]
    RecordFrames(FsError),
    #[error(
        "replaying metadata-journal record {seq} (frame {frame}) onto the lower file system: \
         {error} (the lower directory was changed behind nvstack's back; the region is left as it is)"
    )]
    Replay { seq: u64, frame: u64, error: FsError },
    #[error("NVRAM: {0}")]
    Nvram(#[from] TxError),
    #[error("{0}")]
    Config(String),
    #[error("writing back the page cache with the cache off: {0}")]
    Flush(FsError),
}
