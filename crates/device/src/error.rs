//! Operating errors of the device layer: one typed enum, messages a user can act on.

use std::io;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("invalid argument: {0}")]
    Invalid(String),
    #[error("`{command}` failed ({status}): {stderr}")]
    Command { command: String, status: String, stderr: String },
    #[error("cannot run `{command}`: {source} (is the package installed?)")]
    Spawn {
        command: String,
        #[source]
        source: io::Error,
    },
    #[error("no nvstack device is attached at {0} (no state under /run/nvstack/device)")]
    NotAttached(PathBuf),
    #[error("an nvstack device is already attached at {0}; detach it first")]
    AlreadyAttached(PathBuf),
    #[error("the device daemon failed to start: {0}")]
    Daemon(String),
    #[error("this needs root (loop devices, mount): {0}")]
    NotRoot(String),
    #[error("NVRAM cache {path}: {detail}")]
    NvCache { path: PathBuf, detail: String },
}

impl DeviceError {
    pub(crate) fn io(what: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        DeviceError::Io { what, path: path.into(), source }
    }
}
