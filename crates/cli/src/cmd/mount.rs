//! `nvstack mount LOWER MOUNTPOINT --nvram PATH`: recover (or format) the region, bind it to the
//! lower directory, and serve the FUSE file system until unmounted.
//!
//! Mount states: starting (region opened = recovered, binding checked) -> mounted (FUSE session
//! up, "ready" reported, control socket listening) -> unmounting (the kernel ended the session:
//! `nvstack umount`, `umount`, or SIGTERM/SIGINT to the daemon) -> stopped (engine shut down:
//! the region is marked clean). A killed daemon skips the last step; the next mount recovers.
//!
//! Without `--foreground` the command starts itself again as the daemon (in a new session),
//! waits until the daemon reports "ready" or fails, and returns; the daemon's output then goes
//! to `/run/nvstack/mounts/<id>/daemon.log`.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use engine::binding::{self, Binding};
use engine::{Engine, EngineConfig};
use fusefs::{FuseFs, Timeouts};
use lower::LowerFs;
use lower::posix::PosixLower;
use nvram::{FormatParams, MmapOptions, MmapRegion, Region};
use txn::{Consistency, Pool};

use super::rundir;
use crate::error::{CliError, CliResult};
use crate::size::{human, parse_size};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ConsistencyArg {
    /// Every completed operation is atomic and durable (per-operation undo log in NVRAM).
    Undo,
    /// No undo log: the ext2-like baseline for benchmarks.
    None,
}

/// Every option of `nvstack mount`. The daemon gets the words the user typed, not a copy of
/// these fields (`start_daemon`), and `nvstack stat --json` reports them as the mount runs
/// with them (`mount.options`, `effective_options`).
#[derive(Clone, Debug, clap::Args, serde::Serialize)]
#[allow(clippy::struct_excessive_bools)] // command-line switches
pub struct MountArgs {
    /// The directory to stack on (any file system). It belongs to nvstack while mounted.
    pub lower: PathBuf,
    /// Where to mount.
    pub mountpoint: PathBuf,
    /// The NVRAM region file; created (formatted) if missing, recovered if it was not unmounted
    /// cleanly. A region belongs to the first lower directory it was mounted over.
    #[arg(long, value_name = "PATH")]
    pub nvram: PathBuf,
    /// Size of a region created by this mount (ignored for an existing region).
    #[arg(long, value_parser = parse_size, default_value = "256M", value_name = "SIZE")]
    pub size: u64,
    /// Undo-log slots of a region created by this mount (at most this many operations change
    /// NVRAM at once; others wait). Default: a quarter of the region's size in slots, 2 to 16.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=256), value_name = "N")]
    pub undo_slots: Option<u32>,
    /// Size of each undo slot of a region created by this mount: the most NVRAM one operation
    /// may change (a 1 MiB write needs a little over 1 MiB).
    #[arg(long, value_parser = parse_size, default_value = "1088K", value_name = "SIZE")]
    pub undo_slot_size: u64,
    /// How operations are made crash-consistent.
    #[arg(long, value_enum, default_value = "undo")]
    pub consistency: ConsistencyArg,
    /// Stay in the foreground (log to stderr) instead of starting a daemon.
    #[arg(long, short = 'f')]
    pub foreground: bool,
    /// FUSE worker threads (default: 4, or one per CPU when there are more). Postmark-like
    /// metadata workloads gain from more threads than cores (the kernel queues requests while
    /// workers wait in syscalls); single-stream 4 KiB writes prefer one per core
    /// (bench/results/fuse-tax/analysis).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub threads: Option<u32>,
    /// Seconds the kernel may cache attributes (0 = ask every time; strict atime).
    #[arg(long, default_value_t = 86_400.0, value_name = "SECONDS")]
    pub attr_timeout: f64,
    /// Seconds the kernel may cache name lookups.
    #[arg(long, default_value_t = 86_400.0, value_name = "SECONDS")]
    pub entry_timeout: f64,
    /// Largest write the kernel sends in one request.
    #[arg(long, value_parser = parse_size, default_value = "1M", value_name = "SIZE")]
    pub max_write: u64,
    /// New regular files live only in NVRAM (TempFFS) until they are transformed into the
    /// lower directory: when they grow beyond --tempfile-max-size, when temp files exceed
    /// their share of the region (least recently used first), on `nvstack flush`, and at
    /// unmount. Short-lived files never cost lower-FS IO. `off`: every file is created in the
    /// lower directory (temp files left in the region are transformed at mount).
    #[arg(long, value_enum, default_value = "on", value_name = "on|off")]
    pub tempfiles: OnOff,
    /// A temp file growing beyond this size is transformed into the lower directory.
    #[arg(long, value_parser = parse_size, default_value = "1M", value_name = "SIZE")]
    pub tempfile_max_size: u64,
    /// Percent of the region's frames temp files may hold before the least recently used are
    /// transformed (NVRAM pressure).
    #[arg(long, default_value_t = 90, value_parser = clap::value_parser!(u64).range(1..=100), value_name = "PERCENT")]
    pub tempfile_share: u64,
    /// NR_WB of the thesis' pressure rule: pages of temp files transformed per pressure round
    /// (N = NR_WB x NR_TempFFS / NR_Dirty); each round ends with one syncfs of the lower FS.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..), value_name = "PAGES")]
    pub tempfile_writeback_batch: u64,
    /// Extended attributes (and with them ACLs set through the mount). `off` answers every
    /// xattr request with "not supported" once, after which the kernel stops asking: it
    /// otherwise asks for security.capability before every write(2) (one FUSE round trip per
    /// write; Postmark: ~2 per file).
    #[arg(long, value_enum, default_value = "on", value_name = "on|off")]
    pub xattrs: OnOff,
    /// Keep temp files in NVRAM across unmount instead of transforming them (the lower
    /// directory alone then lacks them until the next mount).
    #[arg(long)]
    pub keep_tempfiles: bool,
    /// The NVRAM page cache: writes to existing lower files land in NVRAM as dirty pages
    /// (durable and atomic when the write returns; no lower IO) and are written back late, by
    /// the --writeback policy. `off`: writes go straight to the lower file (pages left in the
    /// region are written back at mount).
    #[arg(long, value_enum, default_value = "on", value_name = "on|off")]
    pub cache: OnOff,
    /// Which dirty pages go when write-back runs (thesis 3.1.2): `file` - dirty files in order,
    /// all their pages (Linux); `recency` - inactive pages only, least recently used first;
    /// `location` - the zone whose dirty pages form the longest runs (max ASL), all pages;
    /// `relo` - inactive pages of the zone with max ASL, then the next zone.
    #[arg(long, value_enum, default_value = "relo")]
    pub writeback: WritebackArg,
    /// Blocks (4 KiB) per zone of the lower device for the location-aware policies.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..), value_name = "BLOCKS")]
    pub zone_blocks: u64,
    /// Write-back starts when dirty pages exceed this percent of the region's frames ...
    #[arg(long, default_value_t = 80, value_parser = clap::value_parser!(u64).range(1..=100), value_name = "PERCENT")]
    pub dirty_high: u64,
    /// ... and stops when they are down to this percent.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(0..=100), value_name = "PERCENT")]
    pub dirty_low: u64,
    /// NR_WB: dirty pages per write-back batch (each batch: one sync of the lower file system,
    /// one NVRAM transaction).
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=4096), value_name = "PAGES")]
    pub writeback_batch: u64,
    /// Dirty pages older than this are written back even without pressure, so that the lower
    /// directory alone is never older than this (0 = never).
    #[arg(long, default_value_t = 1800, value_name = "SECONDS")]
    pub max_dirty_age: u64,
    /// Keep dirty pages in NVRAM across unmount instead of writing them back (the lower
    /// directory alone then lacks those writes until the next mount).
    #[arg(long)]
    pub keep_dirty: bool,
    /// (internal) report readiness on stdout and then write to the log file.
    #[arg(long, hide = true)]
    #[serde(skip)]
    pub daemon: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WritebackArg {
    File,
    Recency,
    Location,
    Relo,
}

impl WritebackArg {
    fn name(self) -> &'static str {
        match self {
            WritebackArg::File => "file",
            WritebackArg::Recency => "recency",
            WritebackArg::Location => "location",
            WritebackArg::Relo => "relo",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OnOff {
    On,
    Off,
}

/// The kill switch of process-level crash tests: `NVSTACK_FAILPOINT=<point>:<n>` SIGKILLs the
/// daemon at the n-th time it reaches `<point>` (names in core/src/transform.rs).
#[derive(Debug)]
struct EnvFailpoint {
    point: String,
    remaining: std::sync::atomic::AtomicU64,
}

impl engine::Failpoints for EnvFailpoint {
    fn hit(&self, point: &'static str) {
        use std::sync::atomic::Ordering;
        if point == self.point && self.remaining.fetch_sub(1, Ordering::SeqCst) == 1 {
            // SAFETY: raising a signal at ourselves.
            unsafe { libc::raise(libc::SIGKILL) };
        }
    }
}

fn failpoints() -> Option<Arc<dyn engine::Failpoints>> {
    let spec = std::env::var("NVSTACK_FAILPOINT").ok()?;
    let (point, n) = spec.rsplit_once(':')?;
    let n: u64 = n.parse().ok()?;
    Some(Arc::new(EnvFailpoint { point: point.to_string(), remaining: n.into() }))
}

fn engine_config(args: &MountArgs, pool: &Pool) -> CliResult<EngineConfig> {
    // A transform frees every frame of a file in one transaction (64 bytes of undo log per
    // frame); refuse a maximum the undo log cannot take.
    let layout = pool.layout();
    let frames = (args.tempfile_max_size + args.max_write).div_ceil(nvram::layout::FRAME_SIZE);
    if frames * 64 + 4096 > layout.undo_slot_size {
        let most = (layout.undo_slot_size - 4096) / 64 * nvram::layout::FRAME_SIZE;
        return Err(CliError::Usage(format!(
            "--tempfile-max-size {} is too large for this region's undo slots ({} each): at most \
             about {} (less --max-write), or format the region with larger slots",
            human(args.tempfile_max_size),
            human(layout.undo_slot_size),
            human(most.saturating_sub(args.max_write))
        )));
    }
    if args.dirty_low > args.dirty_high {
        return Err(CliError::Usage(format!(
            "--dirty-low {} is above --dirty-high {}",
            args.dirty_low, args.dirty_high
        )));
    }
    // A write-back batch frees its pages in one transaction, as a transform does.
    if args.writeback_batch * 64 + 4096 > layout.undo_slot_size {
        return Err(CliError::Usage(format!(
            "--writeback-batch {} is too large for this region's undo slots ({} each)",
            args.writeback_batch,
            human(layout.undo_slot_size)
        )));
    }
    Ok(EngineConfig {
        cache: engine::CacheConfig {
            enabled: args.cache == OnOff::On,
            policy: args.writeback.name(),
            zone_blocks: args.zone_blocks,
            high_pages: layout.nr_frames * args.dirty_high / 100,
            low_pages: layout.nr_frames * args.dirty_low / 100,
            batch_pages: args.writeback_batch,
            max_dirty_age: args.max_dirty_age,
            writeback_on_unmount: !args.keep_dirty,
        },
        temp: engine::TempConfig {
            enabled: args.tempfiles == OnOff::On,
            max_size: args.tempfile_max_size,
            transform_on_unmount: !args.keep_tempfiles,
            max_frames: layout.nr_frames * args.tempfile_share / 100,
            writeback_batch: args.tempfile_writeback_batch,
        },
        failpoints: failpoints(),
        xattrs: args.xattrs == OnOff::On,
        ..EngineConfig::default()
    })
}

/// `words`: the command line after the binary's name (`mount LOWER MOUNTPOINT ...`), passed to
/// the daemon unchanged.
pub fn run(args: &MountArgs, words: &[String]) -> CliResult {
    let mountpoint = rundir::canonical_mountpoint(&args.mountpoint)
        .map_err(|e| CliError::Usage(format!("mount point {}: {e}", args.mountpoint.display())))?;
    if rundir::is_stale(&mountpoint) {
        cleanup_stale(&mountpoint)?;
    }
    super::placement::check(&args.lower, &mountpoint)?;
    if args.foreground || args.daemon {
        return serve(args, &mountpoint);
    }
    start_daemon(words)
}

/// A mount point whose daemon died: detach it so that it can be mounted again.
fn cleanup_stale(mountpoint: &Path) -> CliResult {
    let c = std::ffi::CString::new(mountpoint.as_os_str().as_encoded_bytes())
        .map_err(|_| CliError::Usage("mount point contains a NUL byte".into()))?;
    // SAFETY: umount2 of a path; MNT_DETACH removes the dead FUSE mount lazily.
    let rc = unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    if rc != 0 {
        let status = Command::new("fusermount3").arg("-uz").arg(mountpoint).status();
        if !status.is_ok_and(|s| s.success()) {
            return Err(CliError::Other(format!(
                "{} is a stale mount (its daemon died) and could not be detached: {}",
                mountpoint.display(),
                std::io::Error::last_os_error()
            )));
        }
    }
    eprintln!(
        "nvstack: detached the stale mount at {} (its daemon had died)",
        mountpoint.display()
    );
    Ok(())
}

/// Starts this command again as the daemon, with exactly the words it was given plus
/// `--daemon` (no hand-made copy of the options that a new option could miss), in a new
/// session, and waits until it reports "ready" or fails. Relative paths mean the same to the
/// daemon: it starts in this working directory.
fn start_daemon(words: &[String]) -> CliResult {
    let exe = std::env::current_exe().map_err(|e| CliError::Other(e.to_string()))?;
    let mut command = Command::new(exe);
    command
        .args(words)
        .arg("--daemon")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: setsid in the child before exec: the daemon leaves our session and terminal.
    unsafe {
        command.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child =
        command.spawn().map_err(|e| CliError::Other(format!("cannot start the daemon: {e}")))?;
    let mut line = String::new();
    let _ = BufReader::new(child.stdout.take().expect("piped")).read_line(&mut line);
    if line.trim() == "ready" {
        return Ok(());
    }
    let mut stderr = String::new();
    let _ = std::io::Read::read_to_string(&mut child.stderr.take().expect("piped"), &mut stderr);
    let _ = child.wait();
    Err(CliError::Other(format!("mount failed: {}", stderr.trim().trim_start_matches("nvstack: "))))
}

fn threads(args: &MountArgs) -> u32 {
    args.threads.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(4, |n| n.get() as u32).clamp(4, 64)
    })
}

/// Every inode the kernel knows holds one O_PATH descriptor (and every open file one more), so
/// the soft limit on open files (often 1024) would cap the number of live files: raise it to
/// the hard limit, as libfuse's passthrough_hp does.
fn raise_open_file_limit() {
    // SAFETY: getrlimit/setrlimit on a struct we own.
    unsafe {
        let mut limit: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut limit) == 0
            && limit.rlim_cur < limit.rlim_max
        {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &raw const limit);
        }
    }
}

fn open_region(args: &MountArgs) -> CliResult<(Pool, String)> {
    let consistency = match args.consistency {
        ConsistencyArg::Undo => Consistency::Undo,
        ConsistencyArg::None => Consistency::None,
    };
    let mut note = String::new();
    if !args.nvram.exists() {
        // Small regions would be mostly undo log with 16 slots: a quarter of the region at most.
        let slots = args.undo_slots.unwrap_or_else(|| {
            u32::try_from(args.size / 4 / args.undo_slot_size.max(1)).unwrap_or(16).clamp(2, 16)
        });
        let params = FormatParams {
            region_size: args.size,
            undo_slots: slots,
            undo_slot_size: args.undo_slot_size,
        };
        let layout = super::format::format(&args.nvram, params, false)?;
        note = format!(
            "formatted a new region {} ({})",
            args.nvram.display(),
            human(layout.region_size)
        );
    }
    let region: Arc<dyn Region> = Arc::new(MmapRegion::open(&args.nvram, MmapOptions::default())?);
    let (pool, report) = Pool::open(region, consistency)?;
    if note.is_empty() {
        note = if report.transactions_rolled_back > 0 {
            format!(
                "recovered {}: rolled back {} unfinished operation(s)",
                args.nvram.display(),
                report.transactions_rolled_back
            )
        } else if report.was_clean {
            format!("opened {} (clean)", args.nvram.display())
        } else {
            format!(
                "recovered {} (not shut down cleanly; nothing to roll back)",
                args.nvram.display()
            )
        };
    }
    Ok((pool, note))
}

fn serve(args: &MountArgs, mountpoint: &Path) -> CliResult {
    // New objects get exactly the mode the kernel computed (it applied the caller's umask).
    // SAFETY: umask has no preconditions.
    unsafe { libc::umask(0) };
    raise_open_file_limit();
    let lower_dir = std::fs::canonicalize(&args.lower)
        .map_err(|e| CliError::Usage(format!("lower directory {}: {e}", args.lower.display())))?;
    if !lower_dir.is_dir() {
        return Err(CliError::Usage(format!("{} is not a directory", lower_dir.display())));
    }
    if rundir::is_mounted(mountpoint) {
        return Err(CliError::Usage(format!("{} is already a mount point", mountpoint.display())));
    }
    let lower = PosixLower::open(&lower_dir)
        .map_err(|e| CliError::Usage(format!("lower directory {}: {e}", lower_dir.display())))?;
    let (pool, note) = open_region(args)?;
    let root_attr = lower.getattr(lower.root()).map_err(|e| CliError::Other(e.to_string()))?;
    let statfs = lower.statfs(lower.root()).map_err(|e| CliError::Other(e.to_string()))?;
    let ours = Binding {
        fsid: statfs.fsid,
        dev: root_attr.dev,
        ino: root_attr.ino,
        path: lower_dir.to_string_lossy().into_owned(),
    };
    binding::bind_or_check(&pool, &ours).map_err(|e| CliError::Other(e.to_string()))?;

    let (run_dir, socket_path, listener) = prepare_run_dir(mountpoint)?;

    let engine = match start_engine(args, lower, pool) {
        Ok(engine) => Arc::new(engine),
        Err(e) => {
            let _ = std::fs::remove_dir_all(&run_dir);
            return Err(e);
        }
    };
    let timeouts = Timeouts {
        entry: Duration::from_secs_f64(args.entry_timeout.max(0.0)),
        attr: Duration::from_secs_f64(args.attr_timeout.max(0.0)),
    };
    let fs = FuseFs::new(Arc::clone(&engine), timeouts, args.max_write.min(16 << 20) as u32);
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        fuser::MountOption::FSName(lower_dir.to_string_lossy().into_owned()),
        fuser::MountOption::Subtype("nvstack".into()),
        fuser::MountOption::DefaultPermissions,
        fuser::MountOption::Suid,
        fuser::MountOption::Dev,
    ];
    // SAFETY: getuid has no preconditions.
    let owner = unsafe { libc::getuid() };
    config.acl = if owner == 0 { fuser::SessionACL::All } else { fuser::SessionACL::Owner };
    config.n_threads = Some(threads(args) as usize);
    config.clone_fd = true;
    let session = match fuser::Session::new(fs, mountpoint, &config) {
        Ok(session) => session,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&run_dir);
            if let Ok(engine) = Arc::try_unwrap(engine) {
                engine.shutdown();
            }
            return Err(CliError::Other(format!("cannot mount on {}: {e}", mountpoint.display())));
        }
    };

    let stat_engine = Arc::clone(&engine);
    let mount_info = serde_json::json!({
        "mountpoint": mountpoint.display().to_string(),
        "lower": lower_dir.display().to_string(),
        "nvram": args.nvram.display().to_string(),
        "pid": std::process::id(),
        "options": effective_options(args, engine.pool().layout()),
    });
    let control_thread = std::thread::spawn(move || {
        let handle = move |request: &str, out: &mut dyn Write| {
            control(&stat_engine, &mount_info, request, out);
        };
        super::control::serve(&listener, owner, &handle);
    });
    install_signal_handler(mountpoint.to_path_buf());
    let aging = start_aging(args, &engine);

    eprintln!("nvstack: {note}; mounted {} on {}", lower_dir.display(), mountpoint.display());
    if args.daemon {
        println!("ready");
        let _ = std::io::stdout().flush();
        redirect_output(&rundir::log_file(&run_dir));
    }
    let result = session.run();
    // The session ended: the kernel unmounted us. Stop the control thread (it holds the
    // engine), then close the engine, which marks the region clean.
    let _ = super::control::request(&socket_path, "quit");
    control_thread.join().ok();
    if let Some((stop, thread)) = aging {
        stop.store(true, Ordering::Relaxed);
        thread.join().ok();
    }
    let engine = Arc::try_unwrap(engine).ok();
    let _ = std::fs::remove_file(&socket_path);
    let _ = std::fs::remove_file(rundir::pid_file(&run_dir));
    match engine {
        Some(engine) => engine.shutdown(),
        None => eprintln!("nvstack: engine still referenced at exit; region left for recovery"),
    }
    eprintln!("nvstack: unmounted {}", mountpoint.display());
    result.map_err(|e| CliError::Other(format!("FUSE session: {e}")))
}

/// The mount's run directory (owner only), its control socket and pid file.
fn prepare_run_dir(
    mountpoint: &Path,
) -> CliResult<(PathBuf, PathBuf, std::os::unix::net::UnixListener)> {
    let run_dir = rundir::dir_for(mountpoint);
    std::fs::create_dir_all(&run_dir)
        .map_err(|e| CliError::Other(format!("{}: {e}", run_dir.display())))?;
    std::fs::set_permissions(&run_dir, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| CliError::Other(e.to_string()))?;
    let socket_path = rundir::socket(&run_dir);
    let _ = std::fs::remove_file(&socket_path);
    let listener = std::os::unix::net::UnixListener::bind(&socket_path)
        .map_err(|e| CliError::Other(format!("control socket {}: {e}", socket_path.display())))?;
    std::fs::write(rundir::pid_file(&run_dir), std::process::id().to_string())
        .map_err(|e| CliError::Other(e.to_string()))?;
    Ok((run_dir, socket_path, listener))
}

/// The clock of --max-dirty-age (the engine is deterministic; time enters here): about twice a
/// second, pages dirty for longer are written back. Stopped by setting the flag.
fn start_aging(
    args: &MountArgs,
    engine: &Arc<Engine<PosixLower>>,
) -> Option<(Arc<AtomicBool>, std::thread::JoinHandle<()>)> {
    if args.max_dirty_age == 0 {
        return None;
    }
    let engine = Arc::clone(engine);
    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    let thread = std::thread::spawn(move || {
        while !flag.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(500));
            if let Err(e) = engine.writeback_aged() {
                eprintln!("nvstack: write-back of old pages failed: {e}");
            }
        }
    });
    Some((stop, thread))
}

/// The engine over the recovered region: rebuilds the temp-file overlay and finishes
/// interrupted transforms.
fn start_engine(args: &MountArgs, lower: PosixLower, pool: Pool) -> CliResult<Engine<PosixLower>> {
    let config = engine_config(args, &pool)?;
    Engine::new(lower, pool, config).map_err(|e| match e {
        engine::StartError::Region(e) => CliError::Region(e),
        e => CliError::Other(format!("cannot start over {}: {e}", args.nvram.display())),
    })
}

/// The options the mount runs with, for `stat --json` (`mount.options`): every option of
/// `nvstack mount` as given, with the ones decided at mount filled in - the worker threads,
/// and the region's size and undo slots (an existing region keeps its own).
fn effective_options(args: &MountArgs, layout: &nvram::Layout) -> serde_json::Value {
    let mut options = serde_json::to_value(args).expect("options serialise");
    options["threads"] = threads(args).into();
    options["size"] = layout.region_size.into();
    options["undo_slots"] = layout.undo_slots.into();
    options["undo_slot_size"] = layout.undo_slot_size.into();
    options
}

/// Answers one control request (see `control.rs`): `stat` and `flush`.
fn control(
    engine: &Engine<PosixLower>,
    mount_info: &serde_json::Value,
    request: &str,
    out: &mut dyn Write,
) {
    match request {
        "stat" => {
            let mut value = serde_json::to_value(engine.stats()).expect("stats serialise");
            value["mount"] = mount_info.clone();
            let _ = out.write_all(serde_json::to_string_pretty(&value).expect("json").as_bytes());
        }
        "flush" => {
            let (transformed, mut error) = engine.flush_tempfiles(&mut |done, total| {
                let _ = writeln!(out, "progress {done} {total}");
            });
            let mut written = 0;
            if error.is_none() {
                let _ = writeln!(out, "phase writeback");
                (written, error) = engine.flush_cache(engine::Reason::Flush, &mut |done, total| {
                    let _ = writeln!(out, "progress {done} {total}");
                });
            }
            let reply = serde_json::json!({
                "transformed": transformed,
                "pages_written": written,
                "error": error.map(|e| e.to_string()),
            });
            let _ = writeln!(out, "{reply}");
        }
        other => {
            let _ = write!(out, "{{\"error\":\"unknown request {other:?}\"}}");
        }
    }
}

/// SIGTERM / SIGINT / SIGHUP: unmount, which ends the session and shuts down cleanly.
fn install_signal_handler(mountpoint: PathBuf) {
    // SAFETY: block the signals in this thread (inherited by threads spawned later), then wait
    // for them synchronously in a dedicated thread.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    unsafe {
        libc::sigemptyset(&raw mut set);
        for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::sigaddset(&raw mut set, sig);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &raw const set, std::ptr::null_mut());
    }
    std::thread::spawn(move || {
        let mut sig = 0;
        // SAFETY: sigwait on the blocked set.
        unsafe { libc::sigwait(&raw const set, &raw mut sig) };
        eprintln!("nvstack: signal {sig}: unmounting {}", mountpoint.display());
        let _ = super::umount::unmount_path(&mountpoint);
    });
}

fn redirect_output(log: &Path) {
    use std::os::fd::AsRawFd;
    if let Ok(file) = std::fs::OpenOptions::new().create(true).append(true).open(log) {
        // SAFETY: dup2 of a descriptor we own onto stdout/stderr.
        unsafe {
            libc::dup2(file.as_raw_fd(), 1);
            libc::dup2(file.as_raw_fd(), 2);
        }
    }
}
