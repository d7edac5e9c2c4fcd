//! The one place where engine errors become errno values.

use engine::FsError;
use fuser::Errno;

pub fn errno(e: &FsError) -> Errno {
    match e {
        // The lower file system's answer is passed through unchanged.
        FsError::Lower(lower::Errno(code)) => Errno::from_i32(*code),
        // A node id or handle we do not know: the kernel's reference is stale.
        FsError::Stale(_) => Errno::from_i32(libc::ESTALE),
        // Running out of NVRAM for an operation is, to the application, running out of space.
        FsError::NvramFull(_) => Errno::from_i32(libc::ENOSPC),
    }
}
