//! The daemon's life, after `nvstack mount` (mount.rs) parsed its arguments: recover the
//! region and bind it to the lower directory, start the engine, mount, answer control requests
//! (`stat`, `flush` over the run directory's socket), drive the engine's clock-driven work
//! (`--max-dirty-age`), and shut down when the kernel ends the session.
//!
//! Mount states: starting (region opened = recovered, binding checked) -> mounted (FUSE session
//! up, "ready" reported, control socket listening) -> unmounting (the kernel ended the session:
//! `nvstack umount`, `umount`, or SIGTERM/SIGINT to the daemon) -> stopped (engine shut down:
//! the region is marked clean). A killed daemon skips the last step; the next mount recovers.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use engine::Engine;
use engine::binding::{self, Binding};
use fusefs::{FuseFs, Timeouts};
use lower::LowerFs;
use lower::posix::PosixLower;
use nvram::{FormatParams, MmapOptions, MmapRegion, Region};
use txn::{Consistency, Pool};

use super::mount::{self, ConsistencyArg, MountArgs, engine_config, threads};
use super::rundir;
use crate::error::{CliError, CliResult};
use crate::size::human;

/// Every open file holds a descriptor, and so do the nodes the kernel knows up to
/// `--node-fds` (half this limit by default): raise the soft limit on open files (often 1024)
/// to the hard limit, as libfuse's passthrough_hp does.
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
        ConsistencyArg::Journal => Consistency::Journal,
    };
    let options = mount::pool_options(args);
    let mut note = String::new();
    if !args.nvram.exists() {
        let params = FormatParams {
            region_size: args.size,
            undo_slots: mount::undo_slots(args),
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
    let (pool, report) = Pool::open_with(region, consistency, options)?;
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

/// Buffers of 128 KiB and more are mapped for themselves and unmapped when freed (glibc's
/// starting threshold, made fixed). glibc otherwise raises the threshold to the size of each
/// such buffer freed, after which the workers' and transforms' transient buffers (1 MiB
/// chunks) are carved from per-thread arenas that keep the freed memory: measured with
/// Postmark 512 B-2 MB over a 25.5 MiB region, the daemon held 34.7 MiB of anonymous memory,
/// 7.8 MiB of it live (malloc_trim freed the rest) - enough for a 51 MiB memory budget to
/// kill it. The cost is one mmap and munmap per large buffer.
fn fix_mmap_threshold() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt has no preconditions; called before any other thread starts.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 << 10);
    }
}

/// The daemon's life (see the module docs): returns when the kernel ended the session.
pub fn serve(args: &MountArgs, mountpoint: &Path) -> CliResult {
    // New objects get exactly the mode the kernel computed (it applied the caller's umask).
    // SAFETY: umask has no preconditions.
    unsafe { libc::umask(0) };
    raise_open_file_limit();
    fix_mmap_threshold();
    let (lower_dir, lower, pool, note) = open_lower_and_region(args, mountpoint)?;
    let (run_dir, socket_path, listener) = prepare_run_dir(mountpoint)?;
    let engine = match start_engine(args, lower, pool) {
        Ok(engine) => Arc::new(engine),
        Err(e) => {
            let _ = std::fs::remove_dir_all(&run_dir);
            return Err(e);
        }
    };
    let spin = Arc::new(fuser::SpinReader::new(Duration::from_micros(args.spin_us.into())));
    let session = match fuse_session(args, mountpoint, &lower_dir, &engine, &spin) {
        Ok(session) => session,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&run_dir);
            if let Ok(engine) = Arc::try_unwrap(engine) {
                engine.shutdown();
            }
            return Err(e);
        }
    };
    let mount_info = serde_json::json!({
        "mountpoint": mountpoint.display().to_string(),
        "lower": lower_dir.display().to_string(),
        "nvram": args.nvram.display().to_string(),
        "pid": std::process::id(),
        "options": effective_options(args, engine.pool().layout()),
    });
    let control_engine = Arc::clone(&engine);
    let control_thread = std::thread::spawn(move || {
        let handle = move |request: &str, out: &mut dyn Write| {
            control(&control_engine, &spin, &mount_info, request, out);
        };
        super::control::serve(&listener, owner(), &handle);
    });
    install_signal_handler(mountpoint.to_path_buf());
    let aging = start_aging(args, &engine);
    let fetcher = start_fetcher(args, &engine);
    let transformer = start_transformer(args, &engine);
    let writer = start_writer(args, &engine);

    eprintln!("nvstack: {note}; mounted {} on {}", lower_dir.display(), mountpoint.display());
    if args.daemon {
        println!("ready");
        let _ = std::io::stdout().flush();
        redirect_output(&rundir::log_file(&run_dir));
    }
    let result = session.run();
    // The session ended: the kernel unmounted us. Stop the control thread (it holds the
    // engine) and the timer, then close the engine, which marks the region clean.
    let _ = super::control::request(&socket_path, "quit");
    control_thread.join().ok();
    for (stop, thread) in aging.into_iter().chain(fetcher).chain(transformer).chain(writer) {
        stop.store(true, Ordering::Relaxed);
        thread.thread().unpark();
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

/// The daemon's owner: the only user (besides root) its control socket answers.
fn owner() -> u32 {
    // SAFETY: getuid has no preconditions.
    unsafe { libc::getuid() }
}

/// Starting: the lower directory opened, the region opened (recovered) or formatted, and the
/// region's binding to the lower directory checked (or made, on first mount).
fn open_lower_and_region(
    args: &MountArgs,
    mountpoint: &Path,
) -> CliResult<(PathBuf, PosixLower, Pool, String)> {
    let lower_dir = std::fs::canonicalize(&args.lower)
        .map_err(|e| CliError::Usage(format!("lower directory {}: {e}", args.lower.display())))?;
    if !lower_dir.is_dir() {
        return Err(CliError::Usage(format!("{} is not a directory", lower_dir.display())));
    }
    if rundir::is_mounted(mountpoint) {
        return Err(CliError::Usage(format!("{} is already a mount point", mountpoint.display())));
    }
    let lower = PosixLower::open_with_node_fds(&lower_dir, node_fds(args))
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
    Ok((lower_dir, lower, pool, note))
}

/// The FUSE session on the mount point (mounted: from now on the kernel sends requests).
fn fuse_session(
    args: &MountArgs,
    mountpoint: &Path,
    lower_dir: &Path,
    engine: &Arc<Engine<PosixLower>>,
    spin: &Arc<fuser::SpinReader>,
) -> CliResult<fuser::Session<FuseFs<PosixLower>>> {
    let timeouts = Timeouts {
        entry: Duration::from_secs_f64(args.entry_timeout.max(0.0)),
        attr: Duration::from_secs_f64(args.attr_timeout.max(0.0)),
    };
    let fs = FuseFs::new(Arc::clone(engine), timeouts, args.max_write.min(16 << 20) as u32)
        .with_direct_io(match args.direct_io {
            super::mount::DirectIoArg::Never => fusefs::DirectIo::Never,
            super::mount::DirectIoArg::WriteOnly => fusefs::DirectIo::WriteOnly,
            super::mount::DirectIoArg::Nvram => fusefs::DirectIo::Nvram,
        });
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        fuser::MountOption::FSName(lower_dir.to_string_lossy().into_owned()),
        fuser::MountOption::Subtype("nvstack".into()),
        fuser::MountOption::DefaultPermissions,
        fuser::MountOption::Suid,
        fuser::MountOption::Dev,
    ];
    config.acl = if owner() == 0 { fuser::SessionACL::All } else { fuser::SessionACL::Owner };
    config.n_threads = Some(threads(args) as usize);
    config.clone_fd = true;
    config.spin = Some(Arc::clone(spin));
    let slot = fs.notifier_slot();
    let session = fuser::Session::new(fs, mountpoint, &config)
        .map_err(|e| CliError::Other(format!("cannot mount on {}: {e}", mountpoint.display())))?;
    // The direct path's invalidations (crates/fuse/src/direct.rs) go through the session.
    let _ = slot.set(session.notifier());
    Ok(session)
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

/// A daemon thread and the flag that stops it (set the flag, then unpark the thread).
type Worker = (Arc<AtomicBool>, std::thread::JoinHandle<()>);

/// What wakes a daemon thread that found no work: `idle` passing, or - with a bell - the
/// engine ringing it (then `idle` only bounds a park, in case a ring was missed).
type BellOf = fn(&Engine<PosixLower>) -> &engine::sync::Bell;

/// A daemon thread around one engine call: `work` runs again at once while it did some (it
/// returned true), otherwise the thread parks until `idle` passed or its bell rang. Stopped
/// by setting the flag and unparking it; a call in progress finishes first. (The engine is
/// deterministic and starts no thread; time enters here.)
fn spawn_loop(
    engine: &Arc<Engine<PosixLower>>,
    idle: Duration,
    bell: Option<BellOf>,
    work: impl Fn(&Engine<PosixLower>) -> bool + Send + 'static,
) -> Worker {
    let engine = Arc::clone(engine);
    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    let thread = std::thread::spawn(move || {
        if let Some(bell) = bell {
            bell(&engine).attach(std::thread::current());
        }
        while !flag.load(Ordering::Relaxed) {
            // The snapshot comes before the look for work (`Bell`: no lost wakeup).
            let rung = bell.map(|b| b(&engine).rung());
            if !work(&engine) && bell.map(|b| b(&engine).rung()) == rung {
                std::thread::park_timeout(idle);
            }
        }
    });
    (stop, thread)
}

/// The engine's clock: about twice a second (the first time at mount) `Engine::tick` commits
/// a due group (journal mode: `--group-commit-interval`), checkpoints the metadata journal past
/// `--checkpoint-interval`
/// and writes back pages dirty for longer than `--max-dirty-age`.
fn start_aging(args: &MountArgs, engine: &Arc<Engine<PosixLower>>) -> Option<Worker> {
    let groups = args.consistency == ConsistencyArg::Journal;
    if args.max_dirty_age == 0 && args.checkpoint_interval == 0 && !groups {
        return None;
    }
    Some(spawn_loop(engine, Duration::from_millis(500), None, |engine| {
        if let Err(e) = engine.tick() {
            eprintln!("nvstack: timed checkpoint or write-back failed: {e}");
        }
        false
    }))
}

/// How long the `async-bg` fetcher waits while fetches are paused (the cache above its high
/// watermark, `nbw.fetches_paused`): write-back, not a ring, ends a pause.
const FETCH_PAUSE: Duration = Duration::from_millis(2);

/// `--nbw async-bg`: the background fetcher - patched pages are read from the lower file and
/// merged, 64 at a time; with none queued it sleeps until a patch is queued (its bell; at
/// most a second), and while fetches are paused it looks again every 2 ms.
fn start_fetcher(args: &MountArgs, engine: &Arc<Engine<PosixLower>>) -> Option<Worker> {
    (args.nbw == super::mount::NbwArg::AsyncBg).then(|| {
        spawn_loop(engine, Duration::from_secs(1), Some(Engine::fetcher_bell), |engine| {
            if engine.fetch_patches(64) > 0 {
                return true;
            }
            // None merged with pages queued: paused (or failing; both wait for write-back).
            if engine.fetches_queued() > 0 {
                std::thread::sleep(FETCH_PAUSE);
                return true;
            }
            false
        })
    })
}

/// `--tempfile-background`: the background transformer - while temp files hold more than the
/// mark, one round after another (`Engine::transform_in_background`); otherwise it looks again
/// every 50 ms (at most 20 wakeups a second on an idle mount: a counter read).
fn start_transformer(args: &MountArgs, engine: &Arc<Engine<PosixLower>>) -> Option<Worker> {
    (args.tempfiles == super::mount::OnOff::On && args.tempfile_background != 0).then(|| {
        spawn_loop(engine, Duration::from_millis(50), None, |engine| {
            engine.transform_in_background() > 0
        })
    })
}

/// `--writeback-background on`: the background writer - while the page cache holds more
/// frames than `--dirty-high`, one pressure round after another (`Engine::writeback_in_background`);
/// otherwise it sleeps until a write leaves the cache above the mark (its bell; at most
/// 250 ms, for frames that arrive by other ways than a write). Writers then meet write-back
/// only when NVRAM is full.
fn start_writer(args: &MountArgs, engine: &Arc<Engine<PosixLower>>) -> Option<Worker> {
    (args.cache == super::mount::OnOff::On && args.writeback_background == super::mount::OnOff::On)
        .then(|| {
            spawn_loop(engine, Duration::from_millis(250), Some(Engine::writer_bell), |engine| {
                engine.writeback_in_background() > 0
            })
        })
}

/// The engine over the recovered region: rebuilds the temp-file overlay and finishes
/// interrupted transforms.
fn start_engine(args: &MountArgs, lower: PosixLower, pool: Pool) -> CliResult<Engine<PosixLower>> {
    let config = engine_config(args, pool.layout())?;
    Engine::new(lower, pool, config).map_err(|e| match e {
        engine::StartError::Region(e) => CliError::Region(e),
        e => CliError::Other(format!("cannot start over {}: {e}", args.nvram.display())),
    })
}

/// The options the mount runs with, for `stat --json` (`mount.options`): every option of
/// `nvstack mount` as given, with the ones decided at mount filled in - the worker threads,
/// the region's size and undo slots (an existing region keeps its own), the lower nodes'
/// descriptors and journal mode's group commits.
fn effective_options(args: &MountArgs, layout: &nvram::Layout) -> serde_json::Value {
    let mut options = serde_json::to_value(args).expect("options serialise");
    options["threads"] = threads(args).into();
    options["size"] = layout.region_size.into();
    options["undo_slots"] = layout.undo_slots.into();
    options["undo_slot_size"] = layout.undo_slot_size.into();
    options["node_fds"] = node_fds(args).into();
    options["group_commit_size"] = mount::group_commit_size(args).into();
    options["group_commit_interval"] = mount::group_commit_interval(args).into();
    options
}

/// `--node-fds`, or its default (half the open-file limit, once raised).
fn node_fds(args: &MountArgs) -> usize {
    args.node_fds
        .map_or_else(lower::posix::default_node_fds, |n| usize::try_from(n).unwrap_or(usize::MAX))
}

/// Answers one control request (see `control.rs`): `stat`, `flush` and `sync`.
fn control(
    engine: &Engine<PosixLower>,
    spin: &fuser::SpinReader,
    mount_info: &serde_json::Value,
    request: &str,
    out: &mut dyn Write,
) {
    match request {
        "stat" => {
            let mut value = serde_json::to_value(engine.stats()).expect("stats serialise");
            value["mount"] = mount_info.clone();
            // The FUSE transport's own counters (the engine does not see it).
            value["fuse"] = serde_json::json!({
                "spin_us": spin.spin().as_micros(),
                "spin_window_us": spin.window().as_micros(),
                "spin_window_max_us": spin.window_max_us(),
                "spin_windows_learned": spin.windows_learned(),
                "spin_hits": spin.hits(),
                "spin_expired": spin.expired(),
                "readers_added": spin.readers_added(),
            });
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
            let mut checkpointed = 0;
            if error.is_none() {
                // The lower directory alone is then complete and durable.
                match engine.checkpoint(engine::journal::checkpoint::Why::Flush) {
                    Ok(n) => checkpointed = n,
                    Err(e) => error = Some(e),
                }
            }
            engine.group_commit(); // journal mode: everything durable in NVRAM too
            let reply = serde_json::json!({
                "transformed": transformed,
                "pages_written": written,
                "journal_records_checkpointed": checkpointed,
                "error": error.map(|e| e.to_string()),
            });
            let _ = writeln!(out, "{reply}");
        }
        "sync" => {
            let error = engine.sync_all().err().map(|e| e.to_string());
            let _ = writeln!(out, "{}", serde_json::json!({ "error": error }));
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
