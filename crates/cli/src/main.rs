//! The `nvstack` command. Each subcommand lives in `cmd/`; this file only parses and dispatches.

mod cmd;
mod error;
mod size;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// nvstack: non-volatile memory stacked under any Linux file system.
///
/// nvstack keeps a region of NVRAM (real persistent memory, or by default a file in /dev/shm
/// that emulates it) as a durable buffer cache under an existing file system. Every change to
/// the region happens in an undo-log transaction, so whatever instant the process or machine
/// stops, the region recovers to the state after the last completed operation.
///
/// Start with `nvstack demo`. Exit codes: 0 success (for `check`: consistent or recoverable),
/// 1 usage or operating error, 4 the region is damaged.
#[derive(Debug, Parser)]
#[command(name = "nvstack", version, about, long_about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create a region file: `nvstack format --nvram /dev/shm/nv --size 256M`.
    Format(cmd::format::FormatArgs),
    /// Verify a region offline (runs recovery on a copy-on-write view; changes nothing).
    Check(cmd::check::CheckArgs),
    /// Print a region's superblock, areas and usage (`--json` for tools).
    Inspect(cmd::inspect::InspectArgs),
    /// Format, commit, crash a process mid-transaction, recover, and sweep simulated power cuts.
    Demo(cmd::demo::DemoArgs),
    /// Mount nvstack over a lower directory: `nvstack mount /srv/data /mnt/nv --nvram /dev/shm/nv`.
    ///
    /// The mount point must not lie inside the lower directory (the mount would appear in its
    /// own lower tree: refused). It may be the lower directory itself (`nvstack mount /srv/data
    /// /srv/data ...`): the mount then hides the lower directory, which nvstack still reaches
    /// through the descriptor it opened before mounting; the same holds for a mount point above
    /// the lower directory, which hides everything below it.
    Mount(Box<cmd::mount::MountArgs>),
    /// Unmount cleanly: retries while the mount is busy (--busy-timeout, 10 s), then waits
    /// until the daemon has marked the region clean.
    Umount(cmd::umount::UmountArgs),
    /// Counters of a running mount: requests, bytes, NVRAM use (`--json` for tools).
    Stat(cmd::stat::StatArgs),
    /// Transform every temp file of a running mount into the lower directory, write back
    /// every dirty page and checkpoint the metadata journal: the lower directory alone is then
    /// complete and durable (progress bar).
    Flush(cmd::flush::FlushArgs),
    /// Make every operation that returned before it durable: journal mode's open group
    /// committed, and the lower file system synced (passthrough files' writes). The kernel
    /// never sends a FUSE daemon sync(2)/syncfs(2): in journal mode `sync` alone leaves the
    /// group open for up to --group-commit-interval; in undo mode every operation is durable
    /// when it returns, but syncfs(2) of the mount does not reach passthrough files' data.
    Sync(cmd::sync::SyncArgs),
    /// Run a command with the direct path's preload library (docs/direct-path.md): its
    /// writes, fsyncs and fstats of files on mounts with --direct-path on are served in its own
    /// process, durable in NVRAM, with no FUSE request. NVSTACK_DIRECT=off turns the library
    /// off; NVSTACK_DIRECT_AFTER=N (default 1) lets N writes of a file through FUSE before the
    /// library asks for a delegation.
    Run(cmd::run::RunArgs),
    /// Link /sbin/mount.fuse.nvstack to this binary, for `mount -t fuse.nvstack` and fstab.
    InstallMountHelper(cmd::mount_helper::InstallArgs),
    /// The block layer: a modeled disk (HDD/SSD) under a real kernel file system, power cuts.
    #[command(subcommand)]
    Device(Box<device::DeviceCommand>),
    /// (internal) the demo's child process.
    #[command(hide = true)]
    DemoChild(cmd::demo::DemoChildArgs),
}

fn main() -> ExitCode {
    let words: Vec<String> = std::env::args().collect();
    if words.first().is_some_and(|a| cmd::mount_helper::invoked_as_helper(a)) {
        return finish(cmd::mount_helper::run(&words[1..]));
    }
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Format(args) => cmd::format::run(args),
        Command::Check(args) => cmd::check::run(args),
        Command::Inspect(args) => cmd::inspect::run(args),
        Command::Demo(args) => cmd::demo::run(args),
        Command::DemoChild(args) => cmd::demo::run_child(args),
        // The daemon is started with exactly the words given here (`mount ...`).
        Command::Mount(args) => cmd::mount::run(args, &words[1..]),
        Command::Umount(args) => cmd::umount::run(args),
        Command::Stat(args) => cmd::stat::run(args),
        Command::Flush(args) => cmd::flush::run(args),
        Command::Sync(args) => cmd::sync::run(args),
        Command::Run(args) => cmd::run::run(args),
        Command::InstallMountHelper(args) => cmd::mount_helper::install(args),
        Command::Device(command) => {
            device::run(*command.clone()).map_err(|e| error::CliError::Other(e.to_string()))
        }
    };
    finish(result)
}

fn finish(result: error::CliResult) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nvstack: {e}");
            e.exit_code()
        }
    }
}
