//! Shared by the tests that attach a modeled device (`nvstack device ...`): the environment
//! check, the command, and [`Attached`], which detaches (or cuts) whatever fails.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_nvstack");

/// How long a detach may keep failing because the kernel file system is busy: right after
/// the last close a mount can be busy for a moment on a loaded machine (TESTING-NOTES.md).
pub const DETACH_DEADLINE: Duration = Duration::from_secs(30);

/// Why the device tests cannot run here, if they cannot.
pub fn skip_reason() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root".into());
    }
    if !Path::new("/dev/fuse").exists() {
        return Some("no /dev/fuse".into());
    }
    for tool in ["losetup", "mkfs.ext4", "mkfs.ext2", "e2fsck", "mount"] {
        let found = ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
            .iter()
            .any(|d| Path::new(d).join(tool).exists());
        if !found {
            return Some(format!("{tool} not installed"));
        }
    }
    None
}

/// Returns early from a test that cannot run here; under CI that is an error (CI runs as root
/// with every tool installed: a skip there would hide a regression).
#[macro_export]
macro_rules! require_device_env {
    () => {
        if let Some(why) = common::device::skip_reason() {
            assert!(std::env::var_os("CI").is_none(), "cannot run in CI: {why}");
            eprintln!("SKIP {}: {why}", module_path!());
            return;
        }
    };
}

pub fn dev(args: &[&str]) -> std::process::Output {
    Command::new(BIN).arg("device").args(args).output().expect("run nvstack")
}

pub fn dev_ok(args: &[&str]) -> String {
    let out = dev(args);
    assert!(
        out.status.success(),
        "device {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `device detach MP`, repeated while it fails because the kernel file system is busy, for at
/// most [`DETACH_DEADLINE`] (detach refuses a busy mount and changes nothing then).
pub fn detach_retrying(mp: &Path) -> std::process::Output {
    let start = Instant::now();
    loop {
        let out = dev(&["detach", mp.to_str().unwrap()]);
        let busy = String::from_utf8_lossy(&out.stderr).contains("busy");
        if out.status.success() || !busy || start.elapsed() > DETACH_DEADLINE {
            return out;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// An attached device; Drop detaches (or, if that fails, cuts, which never refuses).
pub struct Attached {
    pub mp: PathBuf,
    live: bool,
}

impl Attached {
    /// `nvstack device attach IMAGE MP ARGS...`.
    pub fn new(image: &Path, mp: &Path, args: &[&str]) -> Attached {
        fs::create_dir_all(mp).unwrap();
        let mut all = vec!["attach", image.to_str().unwrap(), mp.to_str().unwrap()];
        all.extend(args);
        dev_ok(&all);
        Attached { mp: mp.to_path_buf(), live: true }
    }

    /// Detaches (bounded retries while busy) and checks nothing is left mounted.
    pub fn detach(mut self) {
        self.live = false;
        let out = detach_retrying(&self.mp);
        assert!(
            out.status.success(),
            "device detach failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let mp = self.mp.to_str().unwrap();
        let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(!info.lines().any(|l| l.split(' ').nth(4) == Some(mp)), "{mp} still mounted");
    }

    /// `device cut MP --seed SEED`: a power cut (the device's volatile cache is lost).
    pub fn cut(mut self, seed: u64) -> String {
        self.live = false;
        dev_ok(&["cut", self.mp.to_str().unwrap(), "--seed", &seed.to_string()])
    }

    pub fn stat(&self) -> serde_json::Value {
        serde_json::from_str(&dev_ok(&["stat", self.mp.to_str().unwrap(), "--json"])).unwrap()
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        if self.live && !detach_retrying(&self.mp).status.success() {
            let _ = dev(&["cut", self.mp.to_str().unwrap()]);
        }
    }
}
