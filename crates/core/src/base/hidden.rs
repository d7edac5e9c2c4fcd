//! nvstack's own names in lower directories: the hidden files of TempFFS's transform and of
//! the metadata journal's replay. Invisible through the mount, never created by an
//! application (a name with either prefix is refused as a temp file and hidden in listings).

use std::ffi::{OsStr, OsString};

/// Names starting with this prefix are nvstack's hidden transform files in the lower
/// directory: invisible through the mount, never created by it.
pub const HIDDEN_PREFIX: &str = ".nvstack-transform-";

pub fn hidden_name(serial: u64) -> OsString {
    OsString::from(format!("{HIDDEN_PREFIX}{serial:016x}"))
}

/// Names of objects the metadata journal's replay makes before it moves them to their name
/// (`journal/replay.rs`): hidden too.
pub const REPLAY_PREFIX: &str = ".nvstack-replay-";

pub(crate) fn replay_name(seq: u64) -> OsString {
    OsString::from(format!("{REPLAY_PREFIX}{seq:016x}"))
}

/// nvstack's own names in lower directories: invisible through the mount, never created by
/// an application.
pub fn is_hidden(name: &OsStr) -> bool {
    let b = name.as_encoded_bytes();
    b.starts_with(HIDDEN_PREFIX.as_bytes()) || b.starts_with(REPLAY_PREFIX.as_bytes())
}
