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
use std::path::Path;
use std::process::Command;

mod common;

use common::device::Attached;

/// The attach arguments of these scenarios; `extra` picks the chip and the log blocks.
fn attach(image: &Path, mp: &Path, extra: &[&str]) -> Attached {
    let mut args = vec!["--model", "flash", "--timing", "account", "--size", "32M"];
    args.extend(["--mkfs", "ext4"]);
    args.extend(extra);
    Attached::new(image, mp, &args)
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
    let a = attach(&image, &mp, extra);
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
    require_device_env!();
    flash_cycle("flash-k9f1208", &[], 64);
}

#[test]
fn ext4_on_large_block_flash_with_few_log_blocks_evicts_and_merges() {
    require_device_env!();
    flash_cycle("flash-k9f1g08", &["--flash-preset", "k9f1g08", "--log-blocks", "4"], 4);
}
