//! Orchestration: image -> FUSE daemon -> loop device -> mkfs -> mount, and back.
//!
//! Run state lives in `/run/nvstack/device/<id>/` where `<id>` is the FNV-1a hash of the
//! canonical mount point: `state.json` ([`State`]), `serve.log` (the daemon's output) and
//! `fuse/` (the private FUSE directory holding `disk.img`, `stat.json`, `ctl`).
//!
//! Attach steps, each undone in reverse by `Teardown` if a later one fails:
//! 1. create the image if missing (sparse); 2. start the daemon (`device serve ...
//! --foreground`, re-executing this binary) and wait until `fuse/disk.img` answers;
//! 3. `losetup --find --show fuse/disk.img` (buffered: direct IO on a FUSE file fails);
//! 4. `mkfs.*` if asked; 5. `mount` at the mount point; 6. write `state.json`.
//!
//! A FAT volume on a kernel without vfat (or with `--fat user`) takes steps 3-5 differently:
//! `mkfs.vfat` formats `fuse/disk.img` itself and `device serve-fat` (the user-space FAT
//! server, `crate::userfat`) mounts it at the mount point; its pid is in `state.json`.
//!
//! Detach: umount the kernel FS (its flushes reach the daemon as fsync), `losetup -d`, flush,
//! unmount the FUSE dir (the daemon flushes and syncs the image, then exits), remove the run
//! dir. Cut: tell the daemon to cut the power *first* (so nothing the kernel writes from then
//! on survives), then the same teardown.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::cache::CutMode;
use crate::error::DeviceError;
use crate::serve::{CTL_FILE, DISK_FILE, STAT_FILE};

/// Root of all run directories.
pub(crate) const RUN_ROOT: &str = "/run/nvstack/device";
/// How long to wait for the daemon to mount, and for it to exit after unmount.
const DAEMON_TIMEOUT: Duration = Duration::from_secs(15);

/// The file systems `--mkfs` can make.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
pub enum Mkfs {
    Ext2,
    Ext4,
    Vfat,
}

impl Mkfs {
    fn command(self) -> (&'static str, &'static [&'static str]) {
        match self {
            Mkfs::Ext2 => ("mkfs.ext2", &["-F", "-q"]),
            Mkfs::Ext4 => ("mkfs.ext4", &["-F", "-q"]),
            Mkfs::Vfat => ("mkfs.vfat", &[]),
        }
    }
    fn fstype(self) -> &'static str {
        match self {
            Mkfs::Ext2 => "ext2",
            Mkfs::Ext4 => "ext4",
            Mkfs::Vfat => "vfat",
        }
    }
}

/// What `state.json` records about one attached device.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct State {
    pub(crate) mountpoint: PathBuf,
    pub(crate) image: PathBuf,
    pub(crate) run_dir: PathBuf,
    pub fuse_dir: PathBuf,
    pub(crate) loop_device: Option<String>,
    pub(crate) daemon_pid: u32,
    /// The user-space FAT server serving the mount point, if the volume is FAT served in user
    /// space.
    #[serde(default)]
    pub(crate) fat_server_pid: Option<u32>,
}

/// Who serves a FAT volume: the kernel's vfat over the loop device, or `device serve-fat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FatDriver {
    Kernel,
    User,
}

/// Whether the running kernel has a vfat file system.
pub(crate) fn kernel_has_vfat() -> bool {
    fs::read_to_string("/proc/filesystems")
        .is_ok_and(|t| t.lines().any(|l| l.split_whitespace().last() == Some("vfat")))
}

/// The user-space FAT server's options from a mount-option string: `sync`, `async`,
/// `writeback=SECONDS`, `expire=SECONDS`; anything else is refused by name.
pub(crate) fn fat_server_args(mount_options: Option<&str>) -> Result<Vec<String>, DeviceError> {
    let mut args = Vec::new();
    for o in mount_options.unwrap_or("").split(',').filter(|o| !o.is_empty()) {
        let secs = |v: &str| {
            v.parse::<u64>().map_err(|_| {
                DeviceError::Invalid(format!(
                    "mount option {o:?}: {v:?} is not a number of seconds"
                ))
            })
        };
        match o.split_once('=') {
            None if o == "sync" => args.push("--sync".to_string()),
            None if o == "async" => {}
            Some(("writeback", v)) => {
                args.extend(["--writeback-interval".to_string(), secs(v)?.to_string()]);
            }
            Some(("expire", v)) => {
                args.extend(["--dirty-expire".to_string(), secs(v)?.to_string()]);
            }
            _ => {
                return Err(DeviceError::Invalid(format!(
                    "mount option {o:?} is not one the user-space FAT server knows (sync, async, \
                     writeback=SECONDS, expire=SECONDS)"
                )));
            }
        }
    }
    Ok(args)
}

/// Everything attach needs; `serve_args` are the daemon's model/timing/trace options as
/// command-line words (see `cli::ServeOptions::to_args`).
#[derive(Debug, Clone)]
pub(crate) struct AttachRequest {
    pub(crate) image: PathBuf,
    pub(crate) mountpoint: PathBuf,
    pub(crate) serve_args: Vec<String>,
    pub(crate) size_bytes: Option<u64>,
    pub(crate) mkfs: Option<Mkfs>,
    pub(crate) mount_options: Option<String>,
    /// Who serves a FAT volume; `None`: the kernel if it has vfat, else the user-space server.
    pub(crate) fat: Option<FatDriver>,
    /// The device has an NVRAM cache: the user-space FAT server writes metadata through.
    pub(crate) nvram_cache: bool,
}

/// Default image size when attach creates an image and no size is given.
pub(crate) const DEFAULT_IMAGE_BYTES: u64 = 256 << 20;

pub(crate) fn require_root(what: &str) -> Result<(), DeviceError> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(DeviceError::NotRoot(what.to_string()));
    }
    Ok(())
}

fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn canonical(p: &Path) -> Result<PathBuf, DeviceError> {
    p.canonicalize().map_err(|e| DeviceError::io("cannot resolve", p, e))
}

/// The run directory for a (canonical) mount point.
pub(crate) fn run_dir_for(mountpoint: &Path) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    Path::new(RUN_ROOT).join(format!("{:016x}", fnv1a(mountpoint.as_os_str().as_bytes())))
}

/// Runs a command; stdout on success, a `Command` error with stderr otherwise.
pub(crate) fn run_cmd(program: &str, args: &[&str]) -> Result<String, DeviceError> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| DeviceError::Spawn { command: program.to_string(), source: e })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(DeviceError::Command {
            command: format!("{program} {}", args.join(" ")),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

fn unescape_mountinfo(s: &str) -> String {
    // mountinfo escapes space, tab, newline and backslash as \ooo.
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(u8::is_ascii_digit) {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether `path` (canonical) is a mount point, per /proc/self/mountinfo.
pub fn is_mounted(path: &Path) -> bool {
    let Ok(info) = fs::read_to_string("/proc/self/mountinfo") else { return false };
    let want = path.to_string_lossy();
    info.lines().any(|l| l.split(' ').nth(4).is_some_and(|mp| unescape_mountinfo(mp) == want))
}

fn umount(path: &Path, flags: i32) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: c is a valid NUL-terminated path for the duration of the call.
    if unsafe { libc::umount2(c.as_ptr(), flags) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn pid_alive(pid: u32) -> bool {
    // A zombie has exited; only a running process counts.
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s.rsplit(')').next().and_then(|r| r.split_whitespace().next()) != Some("Z"),
        Err(_) => false,
    }
}

/// Writes one control command to the daemon.
fn control(fuse_dir: &Path, cmd: &str) -> Result<(), DeviceError> {
    let path = fuse_dir.join(CTL_FILE);
    let mut f = OpenOptions::new()
        .write(true)
        .open(&path)
        .map_err(|e| DeviceError::io("cannot open the daemon's control file", &path, e))?;
    f.write_all(cmd.as_bytes()).map_err(|e| {
        DeviceError::io("the daemon refused the command (see serve.log) via", &path, e)
    })
}

/// Runs this executable with `args` in its own process group (a terminal's Ctrl-C does not
/// reach it), stdin closed, stdout and stderr to `log`.
fn spawn_self(args: &[&std::ffi::OsStr], log: &Path) -> Result<Child, DeviceError> {
    let exe =
        std::env::current_exe().map_err(|e| DeviceError::io("cannot find", "/proc/self/exe", e))?;
    let logf = File::create(log).map_err(|e| DeviceError::io("cannot create", log, e))?;
    let logf2 = logf.try_clone().map_err(|e| DeviceError::io("cannot open", log, e))?;
    Command::new(&exe)
        .args(args)
        .stdin(Stdio::null())
        .stdout(logf)
        .stderr(logf2)
        .process_group(0)
        .spawn()
        .map_err(|e| DeviceError::Spawn { command: exe.display().to_string(), source: e })
}

/// Starts `device serve IMAGE DIR ARGS --foreground` from this executable, in its own process
/// group, with output to `log`, and waits until the FUSE dir serves a `disk.img` of `size`.
pub(crate) fn spawn_daemon(
    image: &Path,
    fuse_dir: &Path,
    serve_args: &[String],
    log: &Path,
    size_bytes: u64,
) -> Result<Child, DeviceError> {
    fs::create_dir_all(fuse_dir).map_err(|e| DeviceError::io("cannot create", fuse_dir, e))?;
    let mut args: Vec<&std::ffi::OsStr> =
        vec!["device".as_ref(), "serve".as_ref(), image.as_os_str(), fuse_dir.as_os_str()];
    args.extend(serve_args.iter().map(std::ffi::OsStr::new));
    args.push("--foreground".as_ref());
    let mut child = spawn_self(&args, log)?;
    let start = Instant::now();
    let disk = fuse_dir.join(DISK_FILE);
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            let text = fs::read_to_string(log).unwrap_or_default();
            return Err(DeviceError::Daemon(format!("exited with {status}: {}", text.trim())));
        }
        if fs::metadata(&disk).is_ok_and(|m| m.len() == size_bytes) {
            return Ok(child);
        }
        if start.elapsed() > DAEMON_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            let _ = umount(fuse_dir, libc::MNT_DETACH);
            return Err(DeviceError::Daemon(format!(
                "no FUSE mount at {} after {DAEMON_TIMEOUT:?}",
                fuse_dir.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Undoes an attach, step by step; every step is idempotent and best effort except where the
/// caller asks for strictness (a busy mount point on detach is an error, not a lazy unmount).
#[derive(Debug)]
pub(crate) struct Teardown {
    pub(crate) state: State,
    /// Set while an attach is in progress: Drop tears down unless `disarm`ed.
    armed: bool,
}

impl Teardown {
    pub(crate) fn new(state: State) -> Self {
        Teardown { state, armed: true }
    }
    pub(crate) fn disarm(mut self) -> State {
        self.armed = false;
        self.state.clone()
    }

    /// Runs the teardown. `strict`: fail (and change nothing) if the kernel FS is busy.
    pub(crate) fn run(mut self, strict: bool) -> Result<Vec<String>, DeviceError> {
        self.armed = false;
        teardown(&self.state, strict)
    }
}

impl Drop for Teardown {
    fn drop(&mut self) {
        if self.armed {
            if let Err(e) = teardown(&self.state, false) {
                eprintln!("nvstack device: cleanup after a failed attach: {e}");
            }
        }
    }
}

fn loop_backs(dev: &str, file: &Path) -> bool {
    let name = dev.trim_start_matches("/dev/");
    fs::read_to_string(format!("/sys/block/{name}/loop/backing_file"))
        .is_ok_and(|b| Path::new(b.trim()) == file)
}

fn teardown(st: &State, strict: bool) -> Result<Vec<String>, DeviceError> {
    let mut warnings = Vec::new();
    // 1. The kernel file system.
    if is_mounted(&st.mountpoint) {
        match umount(&st.mountpoint, 0) {
            Ok(()) => {}
            Err(e) if strict => return Err(DeviceError::io("cannot unmount", &st.mountpoint, e)),
            Err(e) => {
                warnings
                    .push(format!("umount {}: {e}; unmounting lazily", st.mountpoint.display()));
                let _ = umount(&st.mountpoint, libc::MNT_DETACH);
            }
        }
    }
    // 1b. The user-space FAT server writes back and exits once its mount is gone.
    if let Some(pid) = st.fat_server_pid {
        let start = Instant::now();
        while pid_alive(pid) && start.elapsed() < DAEMON_TIMEOUT {
            std::thread::sleep(Duration::from_millis(20));
        }
        if pid_alive(pid) {
            warnings.push(format!("FAT server {pid} did not exit; killing it"));
            kill(pid);
        }
    }
    // 2. The loop device, only if it still backs onto our file.
    if let Some(dev) = &st.loop_device {
        if loop_backs(dev, &st.fuse_dir.join(DISK_FILE)) {
            if let Err(e) = run_cmd("losetup", &["-d", dev]) {
                warnings.push(e.to_string());
            }
        }
    }
    // 3. The FUSE dir: its unmount ends the daemon, which flushes (unless cut) and syncs.
    if is_mounted(&st.fuse_dir) {
        let start = Instant::now();
        loop {
            match umount(&st.fuse_dir, 0) {
                Ok(()) => break,
                Err(e) if start.elapsed() < Duration::from_secs(5) => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => {
                    warnings
                        .push(format!("umount {}: {e}; unmounting lazily", st.fuse_dir.display()));
                    let _ = umount(&st.fuse_dir, libc::MNT_DETACH);
                    break;
                }
            }
        }
    }
    // 4. The daemon.
    let start = Instant::now();
    while pid_alive(st.daemon_pid) && start.elapsed() < DAEMON_TIMEOUT {
        std::thread::sleep(Duration::from_millis(20));
    }
    if pid_alive(st.daemon_pid) {
        warnings.push(format!("daemon {} did not exit; killing it", st.daemon_pid));
        kill(st.daemon_pid);
    }
    // 5. The run dir (keep the log if anything went wrong).
    if warnings.is_empty() {
        let _ = fs::remove_dir_all(&st.run_dir);
    } else {
        let _ = fs::remove_file(st.run_dir.join("state.json"));
    }
    Ok(warnings)
}

fn kill(pid: u32) {
    if let Ok(pid) = libc::pid_t::try_from(pid) {
        // SAFETY: plain syscall; the pid is a process this state file recorded.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}

/// Whether the image holds a FAT boot sector.
fn image_is_fat(image: &Path) -> bool {
    use std::io::Read;
    let mut b = [0u8; 512];
    File::open(image).and_then(|mut f| f.read_exact(&mut b)).is_ok()
        && crate::classify::fat::FatLayout::parse(&b).is_some()
}

/// Starts `device serve-fat DISK MOUNTPOINT ARGS` in its own process group, output to `log`,
/// and waits until the mount point is mounted.
fn spawn_fat_server(
    disk: &Path,
    mountpoint: &Path,
    args: &[String],
    log: &Path,
) -> Result<Child, DeviceError> {
    let mut all: Vec<&std::ffi::OsStr> =
        vec!["device".as_ref(), "serve-fat".as_ref(), disk.as_os_str(), mountpoint.as_os_str()];
    all.extend(args.iter().map(std::ffi::OsStr::new));
    let mut child = spawn_self(&all, log)?;
    let start = Instant::now();
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            let text = fs::read_to_string(log).unwrap_or_default();
            return Err(DeviceError::Daemon(format!(
                "the FAT server exited with {status}: {}",
                text.trim()
            )));
        }
        if is_mounted(mountpoint) {
            return Ok(child);
        }
        if start.elapsed() > DAEMON_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            return Err(DeviceError::Daemon(format!(
                "the FAT server did not mount {} within {DAEMON_TIMEOUT:?}",
                mountpoint.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn write_state(st: &State) -> Result<(), DeviceError> {
    let path = st.run_dir.join("state.json");
    let text = serde_json::to_string_pretty(st).expect("state serializes");
    fs::write(&path, text).map_err(|e| DeviceError::io("cannot write", &path, e))
}

/// Reads the state of the device attached at `mountpoint`.
pub fn find_state(mountpoint: &Path) -> Result<State, DeviceError> {
    let mp = mountpoint.canonicalize().unwrap_or_else(|_| mountpoint.to_path_buf());
    let path = run_dir_for(&mp).join("state.json");
    let text = fs::read_to_string(&path).map_err(|_| DeviceError::NotAttached(mp.clone()))?;
    serde_json::from_str(&text)
        .map_err(|e| DeviceError::Invalid(format!("corrupt state file {}: {e}", path.display())))
}

/// Creates a sparse image of `size_bytes` (a positive multiple of 512); fails if it exists.
pub(crate) fn create_image(image: &Path, size_bytes: u64) -> Result<(), DeviceError> {
    if size_bytes == 0 || size_bytes % 512 != 0 {
        return Err(DeviceError::Invalid(format!(
            "image size {size_bytes} must be a positive multiple of 512 bytes"
        )));
    }
    let f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(image)
        .map_err(|e| DeviceError::io("cannot create image", image, e))?;
    f.set_len(size_bytes).map_err(|e| DeviceError::io("cannot size image", image, e))
}

/// The whole attach (see the module docs). Returns the recorded state.
pub(crate) fn attach(req: &AttachRequest) -> Result<State, DeviceError> {
    require_root("attach needs losetup and mount")?;
    if !req.mountpoint.exists() {
        fs::create_dir_all(&req.mountpoint)
            .map_err(|e| DeviceError::io("cannot create mount point", &req.mountpoint, e))?;
    }
    let mountpoint = canonical(&req.mountpoint)?;
    if is_mounted(&mountpoint) {
        return Err(DeviceError::Invalid(format!(
            "{} is already a mount point",
            mountpoint.display()
        )));
    }
    let run_dir = run_dir_for(&mountpoint);
    if let Ok(old) = find_state(&mountpoint) {
        if pid_alive(old.daemon_pid) {
            return Err(DeviceError::AlreadyAttached(mountpoint));
        }
        // A stale state from a crashed attach: clean what is left of it.
        let _ = teardown(&old, false);
    }
    if !req.image.exists() {
        create_image(&req.image, req.size_bytes.unwrap_or(DEFAULT_IMAGE_BYTES))?;
    }
    let image = canonical(&req.image)?;
    let size = fs::metadata(&image).map_err(|e| DeviceError::io("cannot stat", &image, e))?.len();
    if let Some(want) = req.size_bytes.filter(|&w| w != size) {
        return Err(DeviceError::Invalid(format!(
            "image {} exists with {size} bytes, but --size asks for {want}",
            image.display()
        )));
    }
    fs::create_dir_all(&run_dir).map_err(|e| DeviceError::io("cannot create", &run_dir, e))?;
    let fuse_dir = run_dir.join("fuse");
    let child = spawn_daemon(&image, &fuse_dir, &req.serve_args, &run_dir.join("serve.log"), size)?;
    let guard = Teardown::new(State {
        mountpoint: mountpoint.clone(),
        image,
        run_dir,
        fuse_dir: fuse_dir.clone(),
        loop_device: None,
        daemon_pid: child.id(),
        fat_server_pid: None,
    });
    write_state(&guard.state)?;
    let disk = fuse_dir.join(DISK_FILE);
    let fat_volume = match req.mkfs {
        Some(Mkfs::Vfat) => true,
        Some(_) => false,
        None => image_is_fat(&disk),
    };
    let user_fat = fat_volume
        && match req.fat {
            Some(FatDriver::User) => true,
            Some(FatDriver::Kernel) => false,
            None => !kernel_has_vfat(),
        };
    if req.fat == Some(FatDriver::User) && !fat_volume {
        return Err(DeviceError::Invalid(
            "--fat user serves FAT volumes; the image holds none and --mkfs vfat was not given"
                .into(),
        ));
    }
    if user_fat {
        let mut args = fat_server_args(req.mount_options.as_deref())?;
        if req.nvram_cache {
            args.push("--metadata-through".into());
        }
        if req.mkfs.is_some() {
            run_cmd("mkfs.vfat", &[&disk.to_string_lossy()])?;
        }
        let mut guard = guard;
        let log = guard.state.run_dir.join("fat.log");
        let server = spawn_fat_server(&disk, &mountpoint, &args, &log)?;
        guard.state.fat_server_pid = Some(server.id());
        write_state(&guard.state)?;
        return Ok(guard.disarm());
    }
    let dev =
        run_cmd("losetup", &["--find", "--show", &disk.to_string_lossy()])?.trim().to_string();
    let mut guard = guard;
    guard.state.loop_device = Some(dev.clone());
    write_state(&guard.state)?;
    if let Some(fs_kind) = req.mkfs {
        let (prog, args) = fs_kind.command();
        let mut all: Vec<&str> = args.to_vec();
        all.push(&dev);
        run_cmd(prog, &all)?;
    }
    let mut margs: Vec<&str> = Vec::new();
    if let Some(k) = req.mkfs {
        margs.extend(["-t", k.fstype()]);
    }
    if let Some(o) = &req.mount_options {
        margs.extend(["-o", o]);
    }
    let mp = mountpoint.to_string_lossy().into_owned();
    margs.extend([dev.as_str(), mp.as_str()]);
    run_cmd("mount", &margs)?;
    Ok(guard.disarm())
}

/// Reads the daemon's counters.
pub(crate) fn stat(mountpoint: &Path) -> Result<serde_json::Value, DeviceError> {
    let st = find_state(mountpoint)?;
    let path = st.fuse_dir.join(STAT_FILE);
    let text = fs::read_to_string(&path).map_err(|e| DeviceError::io("cannot read", &path, e))?;
    serde_json::from_str(&text)
        .map_err(|e| DeviceError::Invalid(format!("bad stat document from the daemon: {e}")))
}

/// Clean detach: everything written reaches the image.
pub(crate) fn detach(mountpoint: &Path) -> Result<Vec<String>, DeviceError> {
    require_root("detach needs umount and losetup")?;
    let st = find_state(mountpoint)?;
    Teardown::new(st).run(true)
}

/// Power cut now: the daemon tears/drops its volatile writes before anything else happens,
/// then the device is torn down. Returns the daemon's cut report (the `cut` field of stat).
pub(crate) fn cut(
    mountpoint: &Path,
    seed: u64,
    mode: CutMode,
) -> Result<serde_json::Value, DeviceError> {
    require_root("cut needs umount and losetup")?;
    let st = find_state(mountpoint)?;
    let armed = Teardown::new(st.clone());
    control(&st.fuse_dir, &format!("cut {seed} {}", mode.as_str()))?;
    let report = stat(mountpoint).map_or(serde_json::Value::Null, |v| v["cut"].clone());
    let warnings = armed.run(false)?;
    for w in warnings {
        eprintln!("nvstack device: {w}");
    }
    Ok(report)
}

/// Arms an automatic power cut after `flushes` more flushes and then `writes` more writes.
pub(crate) fn arm_cut(
    mountpoint: &Path,
    flushes: u64,
    writes: u64,
    seed: u64,
    mode: CutMode,
) -> Result<(), DeviceError> {
    let st = find_state(mountpoint)?;
    control(&st.fuse_dir, &format!("arm-cut {flushes} {writes} {seed} {}", mode.as_str()))
}

/// Asks the daemon to flush its volatile cache now (a user-space FAT server first writes
/// back everything it holds: an fsync of the mount point's directory).
pub(crate) fn flush(mountpoint: &Path) -> Result<(), DeviceError> {
    let st = find_state(mountpoint)?;
    if st.fat_server_pid.is_some() {
        File::open(&st.mountpoint).and_then(|d| d.sync_all()).map_err(|e| {
            DeviceError::io("the FAT server could not write back", &st.mountpoint, e)
        })?;
    }
    control(&st.fuse_dir, "flush")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_unescapes_octal() {
        assert_eq!(unescape_mountinfo("/mnt/a\\040b"), "/mnt/a b");
        assert_eq!(unescape_mountinfo("/plain"), "/plain");
    }

    #[test]
    fn fat_server_options_come_from_mount_options() {
        assert_eq!(fat_server_args(None).unwrap(), Vec::<String>::new());
        assert_eq!(
            fat_server_args(Some("sync,writeback=1,expire=2")).unwrap(),
            ["--sync", "--writeback-interval", "1", "--dirty-expire", "2"]
        );
        assert!(fat_server_args(Some("async")).unwrap().is_empty());
        let e = fat_server_args(Some("uid=5")).unwrap_err().to_string();
        assert!(e.contains("uid=5"), "{e}");
        assert!(fat_server_args(Some("expire=soon")).is_err());
    }

    #[test]
    fn run_dirs_differ_per_mountpoint() {
        assert_ne!(run_dir_for(Path::new("/mnt/a")), run_dir_for(Path::new("/mnt/b")));
        assert!(run_dir_for(Path::new("/mnt/a")).starts_with(RUN_ROOT));
    }
}
