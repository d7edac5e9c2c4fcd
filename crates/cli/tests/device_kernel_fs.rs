//! End to end: real kernel file systems on the modeled device (needs root, /dev/fuse, loop
//! devices, e2fsprogs). Every scenario cleans up its mounts, loop device and daemon through
//! [`Attached`]'s Drop, whatever fails.
//!
//! Scenarios: ext2 and ext4 (data=ordered, data=journal) attach, run a workload, detach, pass
//! `e2fsck -fn` and keep their data; power cuts at seeded random flush points: ext4 is clean
//! after journal replay for every seed, ext2 needs repair for at least one seed.

use std::fs;
use std::io::Write;
use std::path::Path;
use std::process::Command;

mod common;

use common::device::{Attached, dev_ok};

/// The attach arguments of these scenarios; `extra` adds mkfs and mount options.
fn attach(image: &Path, mp: &Path, extra: &[&str]) -> Attached {
    let mut args = vec!["--model", "hdd-7200", "--timing", "account", "--size", "32M"];
    args.extend(extra);
    Attached::new(image, mp, &args)
}

/// A small metadata-heavy workload with fsync flush points. Errors after a power cut are
/// tolerated by the callers (the disk may be gone); here every step must succeed.
fn workload(mp: &Path, rounds: u32) {
    for r in 0..rounds {
        let d = mp.join(format!("dir{r}"));
        fs::create_dir_all(&d).unwrap();
        for i in 0..20 {
            let p = d.join(format!("file{i}"));
            let mut f = fs::File::create(&p).unwrap();
            f.write_all(&vec![(r * 20 + i) as u8; 1000 + (i as usize) * 512]).unwrap();
            if i % 7 == 0 {
                f.sync_all().unwrap();
            }
        }
        fs::rename(d.join("file1"), d.join("renamed1")).unwrap();
        fs::remove_file(d.join("file2")).unwrap();
        let mut big = fs::File::create(d.join("big")).unwrap();
        big.write_all(&vec![0xabu8; 1 << 20]).unwrap();
        big.sync_all().unwrap();
    }
}

fn verify(mp: &Path, rounds: u32) {
    for r in 0..rounds {
        let d = mp.join(format!("dir{r}"));
        for i in [0u32, 3, 19] {
            let data = fs::read(d.join(format!("file{i}"))).unwrap();
            assert_eq!(data, vec![(r * 20 + i) as u8; 1000 + (i as usize) * 512]);
        }
        assert!(d.join("renamed1").exists() && !d.join("file2").exists());
        assert_eq!(fs::read(d.join("big")).unwrap().len(), 1 << 20);
    }
}

fn e2fsck(args: &[&str], image: &Path) -> (i32, String) {
    let out = Command::new("e2fsck").args(args).arg(image).output().expect("run e2fsck");
    let text =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.code().unwrap_or(-1), text)
}

fn clean_cycle(name: &str, mkfs: &str, mount_options: Option<&str>) {
    let tmp = tempfile::tempdir().unwrap();
    let image = tmp.path().join(format!("{name}.img"));
    let mp = tmp.path().join("mnt");
    let mut extra = vec!["--mkfs", mkfs];
    if let Some(o) = mount_options {
        extra.extend(["--mount-options", o]);
    }
    let a = attach(&image, &mp, &extra);
    workload(&mp, 3);
    let s = a.stat();
    for key in ["requests", "bytes_written", "bytes_read", "busy_ms", "seek_distance_sectors"] {
        assert!(s.get(key).is_some(), "stat lacks {key}: {s}");
    }
    assert!(s["bytes_written"].as_u64().unwrap() > 3 << 20, "{s}");
    assert!(s["busy_ms"].as_f64().unwrap() > 0.0, "{s}");
    assert!(s["flushes"].as_u64().unwrap() > 0, "fsync must reach the daemon as flushes: {s}");
    a.detach();
    let (code, text) = e2fsck(&["-fn"], &image);
    assert_eq!(code, 0, "{name}: e2fsck after a clean detach:\n{text}");
    // Data survives a clean detach: attach again without mkfs and read it back.
    let a = attach(&image, &mp, &[]);
    verify(&mp, 3);
    a.detach();
    eprintln!("{name}: clean, e2fsck exit 0, data verified; stat {s}");
}

#[test]
fn ext2_attach_workload_detach_is_fsck_clean() {
    require_device_env!();
    clean_cycle("ext2", "ext2", None);
}

#[test]
fn ext4_ordered_attach_workload_detach_is_fsck_clean() {
    require_device_env!();
    clean_cycle("ext4-ordered", "ext4", Some("data=ordered"));
}

#[test]
fn ext4_journal_attach_workload_detach_is_fsck_clean() {
    require_device_env!();
    clean_cycle("ext4-journal", "ext4", Some("data=journal"));
}

/// splitmix64: the crash point of each seed, reproducible.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Attaches, arms a cut at a seeded random flush point, runs the workload, cuts, and returns
/// `(seed, after_flushes, after_writes, cut report, e2fsck exit code, e2fsck output)`.
fn crash_once(
    mkfs: &str,
    mount_options: Option<&str>,
    seed: u64,
) -> (u64, u64, u64, String, i32, String) {
    let tmp = tempfile::tempdir().unwrap();
    let image = tmp.path().join("crash.img");
    let mp = tmp.path().join("mnt");
    let mut extra = vec!["--mkfs", mkfs];
    if let Some(o) = mount_options {
        extra.extend(["--mount-options", o]);
    }
    let a = attach(&image, &mp, &extra);
    let flushes = mix(seed) % 6;
    let writes = mix(seed ^ 0xff) % 60;
    dev_ok(&[
        "arm-cut",
        mp.to_str().unwrap(),
        "--after-flushes",
        &flushes.to_string(),
        "--after-writes",
        &writes.to_string(),
        "--seed",
        &seed.to_string(),
    ]);
    workload(&mp, 2);
    let report = a.cut(seed);
    let (code, text) = if mkfs == "ext4" {
        // Replay the journal (as a mount would), then check without changing anything:
        // exit 0 is clean. A journal replay alone makes e2fsck exit 1, so it is not the check.
        let (rc, t) = e2fsck(&["-fy", "-E", "journal_only"], &image);
        assert!(rc <= 1, "journal replay failed ({rc}):\n{t}");
        e2fsck(&["-fn"], &image)
    } else {
        e2fsck(&["-fn"], &image)
    };
    (seed, flushes, writes, report.trim().to_string(), code, text)
}

const SEEDS: [u64; 6] = [1, 2, 3, 4, 5, 6];

#[test]
fn power_cut_ext4_recovers_clean_at_every_seed() {
    require_device_env!();
    for opts in [Some("data=ordered"), Some("data=journal")] {
        for seed in SEEDS {
            let (seed, f, w, report, code, text) = crash_once("ext4", opts, seed);
            eprintln!(
                "ext4 {opts:?} seed {seed}: cut after {f} flushes + {w} writes {report} -> e2fsck -fn exit {code}"
            );
            assert_eq!(
                code, 0,
                "ext4 {opts:?} seed {seed} not clean after journal replay:\n{text}"
            );
        }
    }
}

#[test]
fn power_cut_ext2_needs_repair_in_some_seed() {
    require_device_env!();
    let mut needs_repair = 0;
    for seed in SEEDS {
        let (seed, f, w, report, code, _text) = crash_once("ext2", None, seed);
        eprintln!(
            "ext2 seed {seed}: cut after {f} flushes + {w} writes {report} -> e2fsck -fn exit {code}"
        );
        assert!(code == 0 || code == 4, "unexpected e2fsck exit {code}");
        if code != 0 {
            needs_repair += 1;
        }
    }
    assert!(needs_repair > 0, "no seed left ext2 inconsistent: the power cut is not real");
}
