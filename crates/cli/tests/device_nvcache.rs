//! End to end: the NVRAM metadata write cache (`device attach --nvram`) under ext4 on a
//! modeled 7200 rpm disk (account timing). Needs root, /dev/fuse, loop devices, e2fsprogs;
//! skipped otherwise (an error under CI). Every scenario cleans up its mount, loop device,
//! daemon and region through [`Attached`]'s Drop and the temporary directories.
//!
//! Scenarios:
//! - power cuts at seeded points (`arm-cut` after F flushes and W writes) during an
//!   fsync-heavy workload, `data=ordered` and `-o sync`: after the cut the region still holds
//!   sectors the image lacks; recovery either offline (`device drain`, then e2fsck replays the
//!   journal on a copy and `e2fsck -fn` is clean) or by attaching again (the kernel replays the
//!   journal reading the cache); every file whose fsync (and its directory's) completed before
//!   the cut is there with its content, every unlink made durable is gone, and after a detach
//!   `e2fsck -fn` is clean;
//! - a tiny cache (32 sectors) destages all the time and never fails a request;
//! - `device flush` drains the cache; `device stat --json` has the contract counters;
//! - a region holding another image's sectors is refused by attach.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_nvstack");
/// How long a detach may keep failing because the kernel file system is still busy.
const DETACH_DEADLINE: Duration = Duration::from_secs(30);

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

fn text(out: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn dev_ok(args: &[&str]) -> String {
    let out = dev(args);
    assert!(out.status.success(), "device {args:?} failed: {}", text(&out));
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
        args.extend(["--model", "hdd-7200", "--timing", "account"]);
        args.extend(extra);
        dev_ok(&args);
        Attached { mp: mp.to_path_buf(), live: true }
    }
    fn stat(&self) -> serde_json::Value {
        serde_json::from_str(&dev_ok(&["stat", self.mp.to_str().unwrap(), "--json"])).unwrap()
    }
    /// The daemon's stat.json read directly (cheap enough to read after every fsync).
    fn stat_file(&self) -> PathBuf {
        device::attach::find_state(&self.mp).unwrap().fuse_dir.join("stat.json")
    }
    fn detach(mut self) {
        let mp = self.mp.to_str().unwrap().to_string();
        let start = Instant::now();
        loop {
            let out = dev(&["detach", &mp]);
            if out.status.success() {
                break;
            }
            let err = text(&out);
            assert!(
                err.contains("busy") && start.elapsed() < DETACH_DEADLINE,
                "detach {mp} failed: {err}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        self.live = false;
    }
    fn cut(mut self, seed: u64) -> String {
        self.live = false;
        dev_ok(&["cut", self.mp.to_str().unwrap(), "--seed", &seed.to_string()])
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

fn e2fsck(args: &[&str], image: &Path) -> (i32, String) {
    let out = Command::new("e2fsck").args(args).arg(image).output().expect("run e2fsck");
    (out.status.code().unwrap_or(-1), text(&out))
}

/// A region file in /dev/shm, removed with the directory.
fn shm() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("nvstack-nvcache-test").tempdir_in("/dev/shm").unwrap()
}

/// splitmix64: the crash point of each seed, reproducible.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The content of file `(round, i)`.
fn content(r: u32, i: u32) -> Vec<u8> {
    let len = 700 + (mix(u64::from(r * 100 + i)) % 40_000) as usize;
    let tag = format!("r{r:03}i{i:03}-");
    tag.as_bytes().iter().copied().cycle().take(len).collect()
}

fn fsync_dir(d: &Path) -> std::io::Result<()> {
    fs::File::open(d)?.sync_all()
}

/// What must survive: path -> content (Some) or absence (None).
type Durable = BTreeMap<PathBuf, Option<Vec<u8>>>;

/// One durability point of the workload: file `i` of round `r` created, written, fsynced
/// with its directories; every second one then renamed or unlinked and the directory
/// fsynced. Returns what must survive once the point completed.
fn point(mp: &Path, round: u32, i: u32) -> std::io::Result<Vec<(PathBuf, Option<Vec<u8>>)>> {
    let dir = mp.join(format!("dir{round}"));
    fs::create_dir_all(&dir)?;
    let path = dir.join(format!("file{i}"));
    let mut file = fs::File::create(&path)?;
    file.write_all(&content(round, i))?;
    file.sync_all()?;
    fsync_dir(&dir)?;
    fsync_dir(mp)?;
    let mut done = vec![(path.clone(), Some(content(round, i)))];
    if i % 4 == 1 {
        let to = dir.join(format!("renamed{i}"));
        fs::rename(&path, &to)?;
        fsync_dir(&dir)?;
        done.push((path, None));
        done.push((to, Some(content(round, i))));
    } else if i % 4 == 2 {
        fs::remove_file(&path)?;
        fsync_dir(&dir)?;
        done.push((path, None));
    }
    Ok(done)
}

/// The fsync-heavy workload, until the armed cut is seen (or `rounds` rounds of 8 points).
/// After every durability point the daemon's stat is read: when it shows no cut, every
/// request of the point was served before the power failed, so its effect must survive.
/// A failed request is tolerated only once the power is off (the disk is gone).
fn workload(a: &Attached, rounds: u32) -> (Durable, bool) {
    let stat = a.stat_file();
    let powered = || {
        let v: serde_json::Value =
            serde_json::from_str(&fs::read_to_string(&stat).unwrap()).unwrap();
        v["cut"].is_null()
    };
    let mut durable = Durable::new();
    for r in 0..rounds {
        for i in 0..8 {
            let done = point(&a.mp, r, i);
            let on = powered();
            match done {
                Ok(done) if on => durable.extend(done),
                Err(e) if on => panic!("round {r} point {i} failed before the power cut: {e}"),
                _ => return (durable, true),
            }
        }
    }
    (durable, false)
}

/// Checks the mounted file system against what must survive (absolute paths under it).
fn verify(durable: &Durable) {
    for (p, want) in durable {
        match want {
            Some(c) => {
                let got =
                    fs::read(p).unwrap_or_else(|e| panic!("{}: fsynced but {e}", p.display()));
                assert!(got == *c, "{}: fsynced content differs", p.display());
            }
            None => assert!(!p.exists(), "{}: unlinked durably but present", p.display()),
        }
    }
}

/// One power cut: attach with the cache, arm, run, cut, recover (offline drain or
/// re-attach), verify, detach, e2fsck. Returns a report line.
fn crash_once(seed: u64, mount_options: Option<&str>, drain_offline: bool) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let shm = shm();
    let image = tmp.path().join("ext4.img");
    let mp = tmp.path().join("mnt");
    let region = shm.path().join("cache.nv");
    let rs = region.to_str().unwrap();
    let mut extra = vec!["--size", "32M", "--mkfs", "ext4", "--nvram", rs];
    extra.extend(["--nvram-cache-size", "1M", "--nvram-cache", "metadata"]);
    if let Some(o) = mount_options {
        extra.extend(["--mount-options", o]);
    }
    let a = Attached::new(&image, &mp, &extra);
    let flushes = 5 + mix(seed) % 80;
    let writes = mix(seed ^ 0xff) % 120;
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
    let (durable, cut_seen) = workload(&a, 12);
    let report = a.cut(seed);
    // The region survived the cut with sectors the image alone lacks.
    let out = Command::new(BIN).args(["inspect", "--nvram", rs, "--json"]).output().unwrap();
    assert!(out.status.success(), "inspect after the cut: {}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let resident = v["block_cache"]["sectors_resident"].as_u64().unwrap();
    let how = if drain_offline {
        let drained = dev_ok(&["drain", image.to_str().unwrap(), "--nvram", rs]);
        assert!(drained.contains(&format!("drained {resident} sector(s)")), "{drained}");
        let copy = tmp.path().join("check.img");
        fs::copy(&image, &copy).unwrap();
        let (rc, t) = e2fsck(&["-fy", "-E", "journal_only"], &copy);
        assert!(rc <= 1, "seed {seed}: journal replay failed ({rc}):\n{t}");
        let (rc, t) = e2fsck(&["-fn"], &copy);
        assert_eq!(rc, 0, "seed {seed}: e2fsck -fn after the cut (cache drained offline):\n{t}");
        "drained offline, e2fsck -fn 0 after journal replay"
    } else {
        "recovered by attach"
    };
    let a = Attached::new(&image, &mp, &["--nvram", rs]);
    let s = a.stat();
    if !drain_offline {
        assert_eq!(s["nvcache"]["recovered_sectors"].as_u64(), Some(resident), "{s}");
    }
    verify(&durable);
    a.detach();
    let (rc, t) = e2fsck(&["-fn"], &image);
    assert_eq!(rc, 0, "seed {seed}: e2fsck -fn after recovery and detach:\n{t}");
    format!(
        "seed {seed}: cut after {flushes} flushes + {writes} writes ({}) {} -> {resident} sectors \
         in NVRAM at the cut, {how}; {} durable paths verified; e2fsck -fn 0",
        if cut_seen { "during the workload" } else { "at the final cut" },
        report.trim(),
        durable.len()
    )
}

const SEEDS: [u64; 6] = [1, 2, 3, 4, 5, 6];

#[test]
fn ext4_power_cuts_with_the_metadata_cache_keep_every_fsynced_file() {
    require_env!();
    for seed in SEEDS {
        eprintln!("ext4 ordered: {}", crash_once(seed, None, seed % 2 == 0));
    }
}

#[test]
fn ext4_sync_mount_power_cuts_with_the_metadata_cache_keep_every_fsynced_file() {
    require_env!();
    for seed in SEEDS {
        eprintln!("ext4 -o sync: {}", crash_once(seed + 100, Some("sync"), seed % 2 == 1));
    }
}

fn u(v: &serde_json::Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or_else(|| panic!("nvcache.{k} missing: {v}"))
}

#[test]
fn a_tiny_cache_destages_all_the_time_and_never_errors_and_flush_drains() {
    require_env!();
    let tmp = tempfile::tempdir().unwrap();
    let shm = shm();
    let image = tmp.path().join("ext4.img");
    let mp = tmp.path().join("mnt");
    let region = shm.path().join("tiny.nv");
    let rs = region.to_str().unwrap();
    let extra = ["--size", "32M", "--mkfs", "ext4", "--nvram", rs, "--nvram-cache-size", "16K"];
    let a = Attached::new(&image, &mp, &extra);
    let (durable, cut) = workload(&a, 4);
    assert!(!cut);
    let s = a.stat();
    let nv = &s["nvcache"];
    for k in ["hits", "writes_absorbed", "destaged", "bytes_resident"] {
        assert!(nv.get(k).is_some(), "stat lacks nvcache.{k}: {nv}");
    }
    assert_eq!((u(nv, "capacity_sectors"), nv["filesystem"].as_str()), (32, Some("ext4")));
    assert!(u(nv, "writes_absorbed") > 200, "{nv}");
    assert!(u(nv, "destaged_full") > 100, "a 32-sector cache must destage all the time: {nv}");
    // Every sector that entered is resident or was destaged (no drain or discard yet).
    assert_eq!(
        u(nv, "writes_absorbed") - u(nv, "write_hits"),
        u(nv, "destaged") + u(nv, "sectors_resident"),
        "{nv}"
    );
    assert!(u(nv, "sectors_resident") <= 32 && u(nv, "bytes_resident") <= 32 * 512, "{nv}");
    assert!(nv["absorbed_by_class"]["ext.journal"].as_u64().unwrap() > 0, "{nv}");
    eprintln!(
        "tiny cache after the workload: nvcache {}",
        serde_json::to_string_pretty(nv).unwrap()
    );
    // device flush drains.
    let out = dev_ok(&["flush", mp.to_str().unwrap()]);
    assert!(out.contains("NVRAM cache drained"), "{out}");
    let nv = a.stat()["nvcache"].clone();
    assert_eq!(u(&nv, "sectors_resident"), 0, "{nv}");
    assert!(u(&nv, "destaged_drain") > 0, "{nv}");
    verify(&durable);
    a.detach();
    let (rc, t) = e2fsck(&["-fn"], &image);
    assert_eq!(rc, 0, "{t}");
    let a = Attached::new(&image, &mp, &["--nvram", rs]);
    verify(&durable);
    a.detach();
}

#[test]
fn a_region_holding_another_images_sectors_is_refused() {
    require_env!();
    let tmp = tempfile::tempdir().unwrap();
    let shm = shm();
    let (one, two) = (tmp.path().join("one.img"), tmp.path().join("two.img"));
    let mp = tmp.path().join("mnt");
    let region = shm.path().join("r.nv");
    let rs = region.to_str().unwrap();
    let a = Attached::new(
        &one,
        &mp,
        &["--size", "32M", "--mkfs", "ext4", "--nvram", rs, "--nvram-cache-size", "1M"],
    );
    fs::write(mp.join("x"), b"x").unwrap();
    fsync_dir(&mp).unwrap();
    a.cut(1);
    fs::create_dir_all(&mp).unwrap();
    let args = [
        "attach",
        two.to_str().unwrap(),
        mp.to_str().unwrap(),
        "--size",
        "32M",
        "--mkfs",
        "ext4",
        "--nvram",
        rs,
    ];
    let out = dev(&args);
    assert!(!out.status.success(), "attach of another image with a bound region succeeded");
    let t = text(&out);
    assert!(t.contains("cached sector(s) of image") && t.contains("one.img"), "{t}");
    // Drained into its image, the region can serve another one.
    dev_ok(&["drain", one.to_str().unwrap(), "--nvram", rs]);
    let a = Attached::new(&two, &mp, &["--size", "32M", "--mkfs", "ext4", "--nvram", rs]);
    a.detach();
    let (rc, t) = e2fsck(&["-fy", "-E", "journal_only"], &one);
    assert!(rc <= 1, "{t}");
    assert_eq!(e2fsck(&["-fn"], &one).0, 0);
}

/// Sets its flag when dropped (a panicking test still stops its helper threads).
struct Stop<'a>(&'a std::sync::atomic::AtomicBool);

impl Drop for Stop<'_> {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// stat.json read in small pieces while the disk is busy is one document: every read of an
/// open handle after the first comes from the snapshot its first read took (the counters move
/// between reads; a reader that needs several reads once got the tail of a longer document).
#[test]
fn stat_json_read_in_pieces_while_the_disk_is_busy_is_one_document() {
    require_env!();
    let tmp = tempfile::tempdir().unwrap();
    let image = tmp.path().join("ext4.img");
    let mp = tmp.path().join("mnt");
    let a = Attached::new(&image, &mp, &["--size", "32M", "--mkfs", "ext4"]);
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            for i in 0u32.. {
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                let p = mp.join(format!("f{}", i % 64));
                fs::write(&p, content(i, 0)).unwrap();
                fs::File::open(&p).unwrap().sync_all().unwrap();
            }
        });
        // The writer stops when this scope's main thread ends, panicking or not.
        let _stop = Stop(&stop);
        for _ in 0..200 {
            let mut f = fs::File::open(a.stat_file()).unwrap();
            let (mut doc, mut buf) = (Vec::new(), [0u8; 61]);
            loop {
                let n = std::io::Read::read(&mut f, &mut buf).unwrap();
                if n == 0 {
                    break;
                }
                doc.extend_from_slice(&buf[..n]);
            }
            let parsed: Result<serde_json::Value, _> = serde_json::from_slice(&doc);
            assert!(parsed.is_ok(), "{parsed:?}: {}", String::from_utf8_lossy(&doc));
        }
    });
}
