//! `nvstack run [--library PATH] -- CMD [ARGS]`: runs CMD with the direct path's preload
//! library (docs/direct-path.md), so that its writes to files of nvstack mounts mounted with
//! `--direct-path on` are served in its own process. The library is `libnvstack.so` beside
//! this binary (where `cargo build` and `scripts/install` put both) unless `--library` names
//! another; it is added to `LD_PRELOAD` (kept if already there), and CMD replaces this process.
//! A static binary, or a mount without `--direct-path on`, runs exactly as without it.
//! The environment tunes the library: `NVSTACK_DIRECT=off` turns it off, `NVSTACK_DIRECT_AFTER=N`
//! lets N writes of a descriptor go through FUSE before it asks for a delegation (default 1: a
//! file written once, like a mail delivery, is not worth a grant).

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;

use crate::error::{CliError, CliResult};

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// The preload library (default: libnvstack.so beside the nvstack binary).
    #[arg(long, value_name = "PATH")]
    pub library: Option<PathBuf>,
    /// The command and its arguments.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    pub command: Vec<OsString>,
}

/// The library beside the running binary.
pub fn default_library() -> CliResult<PathBuf> {
    let exe = std::env::current_exe().map_err(|e| CliError::Other(format!("this binary: {e}")))?;
    Ok(exe.with_file_name("libnvstack.so"))
}

pub fn run(args: &RunArgs) -> CliResult {
    let library = match &args.library {
        Some(p) => p.clone(),
        None => default_library()?,
    };
    if !library.is_file() {
        return Err(CliError::Other(format!(
            "no preload library at {} (build it: cargo build -p nvstack-preload, or name it \
             with --library)",
            library.display()
        )));
    }
    let library = library.canonicalize().map_err(|e| CliError::Other(e.to_string()))?;
    let mut preload = library.into_os_string();
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        preload.push(":");
        preload.push(old);
    }
    let (cmd, rest) = args.command.split_first().expect("clap requires a command");
    let e = std::process::Command::new(cmd).args(rest).env("LD_PRELOAD", preload).exec();
    Err(CliError::Other(format!("cannot run {}: {e}", cmd.to_string_lossy())))
}
