//! End to end: ext4 on the flash model (`--model flash`: NAND behind the log-block FTL). Needs
//! root, /dev/fuse, loop devices, e2fsprogs; skipped otherwise (an error under CI). Every
//! scenario cleans up its mount, loop device and daemon through [`Attached`]'s Drop.
//!
//! Scenarios: the default chip (k9f1208, 64 log blocks) and the large-block chip with 4 log
//! blocks: attach a 32 MiB device, mkfs.ext4, write and rewrite files with fsync, and see NAND
//! programs, merges and erases in `device stat --json` whose counters add up; then detach
//! (bounded retries while the mount is transiently busy) and e2fsck the image.

use std::fs;
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_nvstack");
/// How long a detach may keep failing because the kernel file system is still busy.
const DETACH_DEADLINE: Duration = Duration::from_secs(20);

fn skip_reason() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root".into());
    }
    if !Path::new("/dev/fuse").exists() {
        return Some("no /dev/fuse".into());
    }
    for tool in ["losetup", "mkfs.ext4", "e2fsck", "mount"] {
        let found = ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
            .iter()
            .any(|d| Path::new(d).join(tool).exists());
        if !found {
            return Some(format!("{tool} not installed"));
        }
    }
    None
}

macro_rules! require_env {
    () => {
        if let Some(why) = skip_reason() {
            // CI runs as root with every tool installed: a skip there would hide a regression.
            assert!(std::env::var_os("CI").is_none(), "cannot run in CI: {why}");
            eprintln!("SKIP {}: {why}", module_path!());
            return;
        }
    };
}

fn dev(args: &[&str]) -> std::process::Output {
    Command::new(BIN).arg("device").args(args).output().expect("run nvstack")
}

fn dev_ok(args: &[&str]) -> String {
    let out = dev(args);
    assert!(
        out.status.success(),
        "device {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// An attached device; Drop detaches (or, if that fails, cuts, which never refuses).
struct Attached {
    mp: PathBuf,
    live: bool,
}

impl Attached {
    fn new(image: &Path, mp: &Path, extra: &[&str]) -> Attached {
        fs::create_dir_all(mp).unwrap();
        let mut args = vec!["attach", image.to_str().unwrap(), mp.to_str().unwrap()];
        args.extend(["--model", "flash", "--timing", "account", "--size", "32M"]);
        args.extend(["--mkfs", "ext4"]);
        args.extend(extra);
        dev_ok(&args);
        Attached { mp: mp.to_path_buf(), live: true }
    }

    fn stat(&self) -> serde_json::Value {
        serde_json::from_str(&dev_ok(&["stat", self.mp.to_str().unwrap(), "--json"])).unwrap()
    }

    /// Detaches, retrying while the kernel file system is busy (an unmount right after the
    /// last close can see EBUSY for a moment), at most until [`DETACH_DEADLINE`].
    fn detach(mut self) {
        let mp = self.mp.to_str().unwrap().to_string();
        let start = Instant::now();
        loop {
            let out = dev(&["detach", &mp]);
            if out.status.success() {
                break;
            }
            let err = String::from_utf8_lossy(&out.stderr).into_owned();
            let busy = err.contains("busy") || err.contains("EBUSY");
            assert!(busy && start.elapsed() < DETACH_DEADLINE, "detach {mp} failed: {err}");
            std::thread::sleep(Duration::from_millis(200));
        }
        self.live = false;
        // Detached: the daemon no longer answers for the mount point, nothing is mounted.
        assert!(!dev(&["stat", &mp, "--json"]).status.success(), "still attached");
        let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(!info.lines().any(|l| l.split(' ').nth(4) == Some(mp.as_str())), "{mp} mounted");
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        if self.live {
            let mp = self.mp.to_str().unwrap();
            if !dev(&["detach", mp]).status.success() {
                let _ = dev(&["cut", mp]);
            }
        }
    }
}

/// Files written with fsync, then rewritten in place (overwrites reach the FTL's log blocks;
/// full logs and evictions merge), then some deleted.
fn workload(mp: &Path) {
    for i in 0..24u32 {
        let mut f = fs::File::create(mp.join(format!("file{i}"))).unwrap();
        f.write_all(&vec![i as u8; 24 * 1024 + i as usize * 1000]).unwrap();
        f.sync_all().unwrap();
    }
    let mut hot = fs::OpenOptions::new().write(true).open(mp.join("file0")).unwrap();
    for round in 0..12u8 {
        for chunk in [3u64, 0, 2, 1] {
            hot.seek(SeekFrom::Start(chunk * 6 * 1024)).unwrap();
            hot.write_all(&[round; 6 * 1024]).unwrap();
        }
        hot.sync_all().unwrap();
    }
    for i in (1..24).step_by(3) {
        fs::remove_file(mp.join(format!("file{i}"))).unwrap();
    }
    let d = fs::File::open(mp).unwrap();
    d.sync_all().unwrap();
}

fn u(v: &serde_json::Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_else(|| panic!("flash.{key} missing or not a count: {v}"))
}

/// The contract counters exist, are consistent, and show real flash work.
fn check_flash_stats(s: &serde_json::Value, log_blocks: u64) {
    assert_eq!(s["model"], "flash", "{s}");
    let f = &s["flash"];
    assert!(f.is_object(), "stat has no flash object: {s}");
    let (programs, reads) = (u(f, "page_programs"), u(f, "page_reads"));
    let erases = u(f, "block_erases");
    let (switch, partial, full) =
        (u(f, "merges_switch"), u(f, "merges_partial"), u(f, "merges_full"));
    assert!(programs > 0, "no page programs: {f}");
    assert!(switch + partial + full >= 1, "no merge: {f}");
    assert!(erases >= 1, "no erase: {f}");
    assert!(f["energy_uj"].as_f64().unwrap() > 0.0);
    // Invariant 2 of model/flash: the counters add up.
    let copies = u(f, "copy_backs");
    assert_eq!(programs, u(f, "host_page_programs") + copies);
    assert_eq!(reads, u(f, "host_page_reads") + copies);
    assert_eq!(erases, switch + partial + 2 * full);
    assert_eq!(u(f, "log_blocks"), log_blocks);
    assert!(u(f, "log_blocks_used") <= log_blocks);
    // Erase statistics and bounded histograms.
    assert!(u(f, "erase_count_max") >= 1);
    assert!(f["erase_count_mean"].as_f64().unwrap() > 0.0);
    assert!(f["erase_count_stddev"].as_f64().unwrap() > 0.0);
    let sum = |h: &str| -> u64 {
        let arr = f[h]["sum"].as_array().unwrap();
        assert!(arr.len() <= 256 && arr.len() == f[h]["max"].as_array().unwrap().len(), "{h}");
        arr.iter().map(|v| v.as_u64().unwrap()).sum()
    };
    assert_eq!(sum("lbn_writes"), u(f, "host_page_programs"));
    assert_eq!(sum("page_writes"), programs);
    assert_eq!(sum("block_erase_counts"), erases);
}

fn flash_cycle(name: &str, extra: &[&str], log_blocks: u64) {
    let tmp = tempfile::tempdir().unwrap();
    let image = tmp.path().join(format!("{name}.img"));
    let mp = tmp.path().join("mnt");
    let a = Attached::new(&image, &mp, extra);
    workload(&mp);
    let s = a.stat();
    check_flash_stats(&s, log_blocks);
    let mut f = s["flash"].clone();
    for h in ["lbn_writes", "page_writes", "block_erase_counts"] {
        f[h]["sum"] = serde_json::json!("...");
        f[h]["max"] = serde_json::json!("...");
    }
    eprintln!("{name}: flash {}", serde_json::to_string_pretty(&f).unwrap());
    a.detach();
    let out = Command::new("e2fsck").arg("-fn").arg(&image).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{name}: e2fsck after detach: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn ext4_on_flash_programs_merges_and_erases() {
    require_env!();
    flash_cycle("flash-k9f1208", &[], 64);
}

#[test]
fn ext4_on_large_block_flash_with_few_log_blocks_evicts_and_merges() {
    require_env!();
    flash_cycle("flash-k9f1g08", &["--flash-preset", "k9f1g08", "--log-blocks", "4"], 4);
}
