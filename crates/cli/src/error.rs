//! CLI errors and their exit codes (documented in `nvstack --help`):
//! 0 success (for `check`: consistent or recoverable), 1 usage or operating error,
//! 4 the region is damaged (`check`, `inspect`, `mount`).

use std::process::ExitCode;

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{0}")]
    Region(#[from] nvram::Error),
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    Other(String),
}

impl CliError {
    pub fn exit_code(&self) -> ExitCode {
        match self {
            CliError::Region(nvram::Error::Corrupt { .. } | nvram::Error::NotARegion(_)) => {
                ExitCode::from(4)
            }
            _ => ExitCode::from(1),
        }
    }
}

pub type CliResult<T = ()> = Result<T, CliError>;
