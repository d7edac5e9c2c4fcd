//! The one place errors become errno values, and the checks a name passes before `fatfs`
//! sees it.
//!
//! `fatfs` reports most of its errors as `io::ErrorKind::Other` with a message, so the mapping
//! matches the messages of fatfs 0.3.6; an unknown one is EIO (a new message is a bug to fix
//! here, never a wrong errno). Raw OS errors (from the device file) pass through.

use std::ffi::OsStr;
use std::io;

use fuser::Errno;

use super::NAME_MAX;

/// The one place errors become errno values.
pub(super) fn errno_of(e: &io::Error) -> Errno {
    if let Some(n) = e.raw_os_error() {
        return Errno::from_i32(n);
    }
    match e.kind() {
        io::ErrorKind::NotFound => Errno::ENOENT,
        io::ErrorKind::AlreadyExists => Errno::EEXIST,
        io::ErrorKind::InvalidInput => Errno::EINVAL,
        io::ErrorKind::UnexpectedEof => Errno::EIO,
        // fatfs reports these as `Other` with a message.
        _ => match e.to_string().as_str() {
            "No space left on device" => Errno::ENOSPC,
            "Directory not empty" => Errno::ENOTEMPTY,
            "Is a directory" => Errno::EISDIR,
            "Not a directory" => Errno::ENOTDIR,
            "File name too long" => Errno::ENAMETOOLONG,
            "File name is empty" | "File name contains unsupported characters" => Errno::EINVAL,
            _ => Errno::EIO,
        },
    }
}

#[allow(clippy::needless_pass_by_value)] // the shape `map_err` wants
pub(super) fn io_err(e: io::Error) -> Errno {
    errno_of(&e)
}

pub(super) fn name_str(name: &OsStr) -> Result<&str, Errno> {
    let n = name.to_str().ok_or(Errno::EINVAL)?;
    if n.len() > NAME_MAX {
        return Err(Errno::ENAMETOOLONG);
    }
    if n.is_empty() || n == "." || n == ".." || n.contains('/') {
        return Err(Errno::EINVAL);
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fatfs_errors_map_to_the_errno_a_fat_driver_gives() {
        let other = |m: &str| io::Error::other(m.to_string());
        let table = [
            (io::Error::new(io::ErrorKind::NotFound, "x"), Errno::ENOENT),
            (io::Error::new(io::ErrorKind::AlreadyExists, "x"), Errno::EEXIST),
            (other("No space left on device"), Errno::ENOSPC),
            (other("Directory not empty"), Errno::ENOTEMPTY),
            (other("Is a directory"), Errno::EISDIR),
            (other("Not a directory"), Errno::ENOTDIR),
            (other("File name too long"), Errno::ENAMETOOLONG),
            (other("File name contains unsupported characters"), Errno::EINVAL),
            (other("something new"), Errno::EIO),
            (io::Error::from_raw_os_error(libc::EROFS), Errno::EROFS),
        ];
        for (e, want) in table {
            assert_eq!(errno_of(&e), want, "{e}");
        }
    }

    #[test]
    fn names_are_checked_before_fatfs_sees_them() {
        assert_eq!(name_str(OsStr::new("ok name.txt")), Ok("ok name.txt"));
        assert_eq!(name_str(OsStr::new(&"n".repeat(256))), Err(Errno::ENAMETOOLONG));
        assert_eq!(name_str(OsStr::new("..")), Err(Errno::EINVAL));
    }
}
