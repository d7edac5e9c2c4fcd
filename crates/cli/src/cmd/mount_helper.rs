//! The mount(8) helper: `mount -t fuse.nvstack LOWER MOUNTPOINT -o nvram=PATH[,...]` and fstab
//! lines such as
//!
//! ```text
//! /srv/data  /mnt/nv  fuse.nvstack  nvram=/dev/shm/nv,size=1G,consistency=undo  0  0
//! ```
//!
//! mount(8) runs `/sbin/mount.fuse.nvstack LOWER MOUNTPOINT -o OPTIONS`; that file is a link to
//! the `nvstack` binary (`nvstack install-mount-helper` makes it), which recognises the name and
//! comes here. Options are those of `nvstack mount` with `_` or `-` in their names; generic
//! mount options that have no meaning here (rw, defaults, auto, _netdev, nofail, x-*) are
//! accepted and ignored.

use std::path::{Path, PathBuf};

use clap::Parser;

use super::mount::{self, MountArgs};
use crate::error::{CliError, CliResult};

/// Options that mount(8) or fstab may pass and that nvstack accepts without effect.
const IGNORED: [&str; 12] = [
    "rw", "defaults", "auto", "noauto", "user", "nouser", "_netdev", "nofail", "dev", "suid",
    "exec", "async",
];

/// Builds the `nvstack mount` arguments from mount(8)'s `SOURCE DIR [-o OPTS] [-n|-s|-f|-v]`.
pub fn translate(args: &[String]) -> CliResult<Vec<String>> {
    let mut positional = Vec::new();
    let mut options = Vec::new();
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        match arg.as_str() {
            "-o" => options.push(
                iter.next().ok_or_else(|| CliError::Usage("-o needs a value".into()))?.clone(),
            ),
            "-n" | "-s" | "-v" | "-f" => {}
            other if other.starts_with("-o") => options.push(other[2..].to_string()),
            other => positional.push(other.to_string()),
        }
    }
    let [lower, mountpoint] = positional.as_slice() else {
        return Err(CliError::Usage(format!(
            "usage: mount.fuse.nvstack LOWER MOUNTPOINT -o nvram=PATH[,size=SIZE,consistency=undo|none,...] (got {positional:?})"
        )));
    };
    let mut out = vec!["mount".to_string(), lower.clone(), mountpoint.clone()];
    for option in options.iter().flat_map(|o| o.split(',')).filter(|o| !o.is_empty()) {
        let (key, value) = option.split_once('=').map_or((option, None), |(k, v)| (k, Some(v)));
        if IGNORED.contains(&key) || key.starts_with("x-") {
            continue;
        }
        let flag = format!("--{}", key.replace('_', "-"));
        out.push(flag);
        if let Some(value) = value {
            out.push(value.to_string());
        }
    }
    if !out.iter().any(|a| a == "--nvram") {
        return Err(CliError::Usage("the nvram=PATH option is required".into()));
    }
    Ok(out)
}

#[derive(Debug, Parser)]
#[command(name = "mount.fuse.nvstack", no_binary_name = true)]
struct HelperCli {
    #[command(subcommand)]
    command: HelperCommand,
}

#[derive(Debug, clap::Subcommand)]
enum HelperCommand {
    Mount(MountArgs),
}

/// Entry point when the binary runs as `mount.fuse.nvstack`.
pub fn run(args: &[String]) -> CliResult {
    let translated = translate(args)?;
    let cli = HelperCli::try_parse_from(&translated).map_err(|e| CliError::Usage(e.to_string()))?;
    let HelperCommand::Mount(args) = cli.command;
    mount::run(&args, &translated)
}

/// `nvstack install-mount-helper`: links DIR/mount.fuse.nvstack to this binary.
#[derive(Debug, clap::Args)]
pub struct InstallArgs {
    /// Where mount(8) looks for helpers.
    #[arg(long, default_value = "/sbin")]
    pub dir: PathBuf,
}

pub fn install(args: &InstallArgs) -> CliResult {
    let exe = std::env::current_exe().map_err(|e| CliError::Other(e.to_string()))?;
    let link = args.dir.join("mount.fuse.nvstack");
    if std::fs::read_link(&link).is_ok_and(|target| target == exe) {
        println!("{} already links to {}", link.display(), exe.display());
        return Ok(());
    }
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&exe, &link)
        .map_err(|e| CliError::Other(format!("cannot create {}: {e}", link.display())))?;
    println!("{} -> {}", link.display(), exe.display());
    Ok(())
}

/// True when the binary was started under a mount helper's name.
pub fn invoked_as_helper(argv0: &str) -> bool {
    let name = Path::new(argv0).file_name().and_then(|n| n.to_str()).unwrap_or("");
    name == "mount.fuse.nvstack" || name == "mount.nvstack"
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<String> {
        s.split(' ').map(String::from).collect()
    }

    #[test]
    fn fstab_options_become_mount_flags() {
        let got = translate(&words(
            "/srv /mnt -o rw,nvram=/dev/shm/nv,size=1G,attr_timeout=0,_netdev,x-systemd.automount",
        ))
        .unwrap();
        assert_eq!(got, words("mount /srv /mnt --nvram /dev/shm/nv --size 1G --attr-timeout 0"));
    }

    #[test]
    fn a_missing_nvram_option_is_a_clear_error() {
        let err = translate(&words("/srv /mnt -o rw")).unwrap_err().to_string();
        assert!(err.contains("nvram=PATH"), "{err}");
        assert!(translate(&words("/srv -o nvram=x")).is_err());
    }

    #[test]
    fn translated_arguments_parse_as_a_mount() {
        let got = translate(&words("/srv /mnt -o nvram=/x,consistency=none -n")).unwrap();
        let cli = HelperCli::try_parse_from(&got).unwrap();
        let HelperCommand::Mount(m) = cli.command;
        assert_eq!(m.nvram, PathBuf::from("/x"));
        assert_eq!(m.consistency, mount::ConsistencyArg::None);
    }
}
