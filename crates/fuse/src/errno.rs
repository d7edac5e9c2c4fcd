//! The one place where engine errors become errno values.

use engine::FsError;
use fuser::Errno;

pub fn errno(e: &FsError) -> Errno {
    match e {
        // The lower file system's answer is passed through unchanged; the engine's own answers
        // are already the errno the lower file system would give.
        FsError::Lower(lower::Errno(code)) | FsError::Answer(lower::Errno(code)) => {
            Errno::from_i32(*code)
        }
        // A node id or handle we do not know: the kernel's reference is stale.
        FsError::Stale(_) => Errno::from_i32(libc::ESTALE),
        // The NVRAM refusing a change (no frame, or more undo log than a slot holds) is, to
        // the application, running out of space. (The write path moves files out of NVRAM
        // before it ever gives this answer.)
        FsError::Nvram(_) => Errno::from_i32(libc::ENOSPC),
    }
}

/// The answer to a request the daemon wants the kernel to stop sending: "not implemented",
/// after which the kernel remembers it for the connection (`fc->no_fsync`, `no_fsyncdir`)
/// and returns success to the application itself (`--fsync-requests spare`).
pub const SPARED: Errno = Errno::ENOSYS;
