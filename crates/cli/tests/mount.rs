//! The mount lifecycle as users see it: mount, use, umount, remount; SIGKILL of the daemon and
//! recovery; the region's binding to its lower directory; stat and its access rule; files owned
//! by their creators; the mount(8) helper. Needs root and /dev/fuse (CI has both; elsewhere the
//! tests say why they skip).

mod common;

use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_nvstack");

fn skip() -> bool {
    common::skip("the mount tests")
}

fn nvstack(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().expect("run nvstack")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// A lower directory, a mount point and a region path, all removed at the end; unmounts
/// whatever is still mounted, lazily if it must.
struct Fixture {
    dir: tempfile::TempDir,
    shm: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        // Other users must be able to reach the mount point (permission tests run as nobody).
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::create_dir(dir.path().join("lower")).unwrap();
        std::fs::create_dir(dir.path().join("mnt")).unwrap();
        let shm =
            tempfile::Builder::new().prefix("nvstack-mount-test").tempdir_in("/dev/shm").unwrap();
        Fixture { dir, shm }
    }
    fn lower(&self) -> PathBuf {
        self.dir.path().join("lower")
    }
    fn mnt(&self) -> PathBuf {
        self.dir.path().join("mnt")
    }
    fn nvram(&self) -> PathBuf {
        self.shm.path().join("region")
    }
    fn mount_with(&self, extra: &[&str]) -> Output {
        self.mount_sized("32M", extra)
    }
    fn mount_sized(&self, size: &str, extra: &[&str]) -> Output {
        Command::new(BIN).args(self.mount_args(size, extra)).output().expect("run nvstack")
    }
    /// `mount_sized` under an open-file limit of `nofile` (soft and hard: the daemon cannot
    /// raise it).
    fn mount_limited(&self, nofile: u32, size: &str, extra: &[&str]) -> Output {
        Command::new("prlimit")
            .arg(format!("--nofile={nofile}:{nofile}"))
            .arg(BIN)
            .args(self.mount_args(size, extra))
            .output()
            .expect("run prlimit nvstack mount")
    }
    /// `nvstack mount` of this fixture's directories with a region of `size`, then `extra`.
    fn mount_args(&self, size: &str, extra: &[&str]) -> Vec<String> {
        let (lower, mnt, nvram) = (self.lower(), self.mnt(), self.nvram());
        let mut args: Vec<String> = ["mount", lower.to_str().unwrap(), mnt.to_str().unwrap()]
            .into_iter()
            .chain(["--nvram", nvram.to_str().unwrap(), "--size", size])
            .map(String::from)
            .collect();
        args.extend(extra.iter().map(|&a| String::from(a)));
        args
    }
    fn mount(&self) {
        let out = self.mount_with(&[]);
        assert!(out.status.success(), "mount: {}", text(&out));
    }
    fn umount(&self) {
        let out = common::nvstack_umount(&self.mnt());
        assert!(out.status.success(), "umount: {}", text(&out));
    }
    fn daemon_pid(&self) -> i32 {
        let out = nvstack(&["stat", self.mnt().to_str().unwrap(), "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stat json");
        v["mount"]["pid"].as_i64().unwrap() as i32
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let mnt = self.mnt();
        if !common::nvstack_umount(&mnt).status.success() {
            let _ = Command::new("umount").arg("-l").arg(&mnt).output();
        }
        common::remove_run_dir(&mnt);
    }
}

/// Every path under `root` with its kind, size, mode, nlink and contents (or link target).
fn tree(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let mut entries: Vec<_> =
            std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
        entries.sort();
        for p in entries {
            let m = std::fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            let what = if m.is_dir() {
                stack.push(p.clone());
                "dir".to_string()
            } else if m.file_type().is_symlink() {
                format!("link->{}", std::fs::read_link(&p).unwrap().display())
            } else {
                format!("{:x}", xxhash(&std::fs::read(&p).unwrap()))
            };
            out.push(format!(
                "{rel} {what} size={} mode={:o} nlink={}",
                m.len(),
                m.mode(),
                m.nlink()
            ));
        }
    }
    out.sort();
    out
}

fn xxhash(data: &[u8]) -> u64 {
    data.iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

fn populate(root: &Path) {
    std::fs::create_dir_all(root.join("a/b/c")).unwrap();
    std::fs::write(root.join("a/file"), vec![7u8; 100_000]).unwrap();
    std::fs::write(root.join("a/b/c/deep"), b"deep").unwrap();
    std::os::unix::fs::symlink("file", root.join("a/link")).unwrap();
    std::fs::hard_link(root.join("a/file"), root.join("a/b/hard")).unwrap();
    std::fs::set_permissions(root.join("a/b/c/deep"), std::fs::Permissions::from_mode(0o600))
        .unwrap();
}

#[test]
fn umount_then_remount_shows_the_same_tree() {
    if skip() {
        return;
    }
    let f = Fixture::new();
    f.mount();
    populate(&f.mnt());
    let on_mount = tree(&f.mnt());
    f.umount();
    assert_eq!(tree(&f.lower()), on_mount, "the lower directory holds what was written");
    let check = nvstack(&["check", "--nvram", f.nvram().to_str().unwrap()]);
    assert!(text(&check).contains("clean shutdown"), "{}", text(&check));
    f.mount();
    assert_eq!(tree(&f.mnt()), on_mount);
}

#[test]
fn sigkill_of_the_daemon_then_mount_recovers_and_cleans_the_stale_mount_point() {
    if skip() {
        return;
    }
    let f = Fixture::new();
    f.mount();
    populate(&f.mnt());
    let expected = tree(&f.mnt());
    // SAFETY: kill of the daemon we started.
    unsafe { libc::kill(f.daemon_pid(), libc::SIGKILL) };
    std::thread::sleep(std::time::Duration::from_millis(200));
    let err = std::fs::metadata(f.mnt()).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOTCONN), "the mount point is stale");
    let out = f.mount_with(&[]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("stale mount"), "{}", text(&out));
    assert_eq!(tree(&f.mnt()), expected);
}

#[test]
fn a_region_is_refused_over_another_lower_directory() {
    if skip() {
        return;
    }
    let f = Fixture::new();
    f.mount();
    f.umount();
    let other = f.dir.path().join("other");
    std::fs::create_dir(&other).unwrap();
    let out = nvstack(&[
        "mount",
        other.to_str().unwrap(),
        f.mnt().to_str().unwrap(),
        "--nvram",
        f.nvram().to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(text(&out).contains("belongs to the lower directory"), "{}", text(&out));
}

#[test]
fn stat_counts_requests_and_bytes_and_is_refused_to_other_users() {
    if skip() {
        return;
    }
    let f = Fixture::new();
    f.mount();
    std::fs::write(f.mnt().join("x"), vec![1u8; 12345]).unwrap();
    assert_eq!(std::fs::read(f.mnt().join("x")).unwrap().len(), 12345);
    let out = nvstack(&["stat", f.mnt().to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["requests"]["write"].as_u64().unwrap() >= 1);
    assert!(v["requests"]["create"].as_u64().unwrap() >= 1);
    assert_eq!(v["app"]["bytes_written"], 12345);
    // A new file is a temp file: nothing reached the lower directory yet.
    assert_eq!(v["lower"]["bytes_written"], 0);
    assert_eq!(v["tempfiles"]["created"], 1);
    assert_eq!(v["tempfiles"]["bytes_written_by_apps"], 12345);
    assert_eq!(v["tempfiles"]["files_resident"], 1);
    assert_eq!(v["tempfiles"]["pages_resident"], 4);
    assert!(!f.lower().join("x").exists());
    let out = nvstack(&["flush", f.mnt().to_str().unwrap(), "--quiet"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("1 temp file(s) transformed"), "{}", text(&out));
    assert_eq!(std::fs::read(f.lower().join("x")).unwrap(), vec![1u8; 12345]);
    let out = nvstack(&["stat", f.mnt().to_str().unwrap(), "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["lower"]["bytes_written"], 12345);
    assert_eq!(v["tempfiles"]["transformed"]["flush"], 1);
    assert_eq!(v["tempfiles"]["bytes_transformed"], 12345);
    assert_eq!(v["tempfiles"]["files_resident"], 0);
    assert_eq!(v["tempfiles"]["span_files"], 1);
    assert!(v["nvram"]["frames_free"].as_u64().unwrap() > 0);
    assert!(v["nvram"]["undo_bytes_max"].as_u64().is_some());
    let human = nvstack(&["stat", f.mnt().to_str().unwrap()]);
    assert!(text(&human).contains("requests:"), "{}", text(&human));
    // Another user may not read the counters.
    let denied = Command::new(BIN)
        .args(["stat", f.mnt().to_str().unwrap()])
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    assert!(!denied.status.success(), "{}", text(&denied));
}

#[test]
fn files_created_by_a_user_belong_to_that_user() {
    if skip() {
        return;
    }
    let f = Fixture::new();
    f.mount();
    let shared = f.mnt().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = Command::new("sh")
        .args(["-c", "touch f && mkdir d && ln -s f s && mkfifo p"])
        .current_dir(&shared)
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    // `f` is a temp file until transformed; the transform keeps its owner.
    assert!(nvstack(&["flush", f.mnt().to_str().unwrap(), "-q"]).status.success());
    for name in ["f", "d", "s", "p"] {
        let m = std::fs::symlink_metadata(f.lower().join("shared").join(name)).unwrap();
        assert_eq!((m.uid(), m.gid()), (65534, 65534), "{name} on the lower directory");
    }
    // And the kernel's permission checks apply: nobody cannot write into root's 0755 dir.
    let out =
        Command::new("touch").arg(f.mnt().join("nope")).uid(65534).gid(65534).output().unwrap();
    assert!(!out.status.success());
    assert!(text(&out).contains("Permission denied"), "{}", text(&out));
    assert!(!f.lower().join("nope").exists());
}

#[test]
fn mount_8_with_the_helper_and_fstab_style_options() {
    if skip() {
        return;
    }
    let f = Fixture::new();
    let helper_dir = tempfile::tempdir().unwrap();
    let out = nvstack(&["install-mount-helper", "--dir", helper_dir.path().to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let helper = helper_dir.path().join("mount.fuse.nvstack");
    // mount(8) runs the helper as `mount.fuse.nvstack SOURCE DIR -o OPTIONS`: do exactly that.
    let options = format!("rw,nvram={},size=32M,consistency=none,_netdev", f.nvram().display());
    let out =
        Command::new(&helper).arg(f.lower()).arg(f.mnt()).args(["-o", &options]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    std::fs::write(f.mnt().join("via-helper"), b"ok").unwrap();
    assert!(nvstack(&["flush", f.mnt().to_str().unwrap(), "-q"]).status.success());
    assert_eq!(std::fs::read(f.lower().join("via-helper")).unwrap(), b"ok");
    let v: serde_json::Value =
        serde_json::from_slice(&nvstack(&["stat", f.mnt().to_str().unwrap(), "--json"]).stdout)
            .unwrap();
    assert_eq!(v["nvram"]["consistency"], "none");
}

#[test]
fn keep_tempfiles_keeps_them_across_unmounts_and_tempfiles_off_moves_them_down() {
    if skip() {
        return;
    }
    let f = Fixture::new();
    let out = f.mount_with(&["--keep-tempfiles"]);
    assert!(out.status.success(), "{}", text(&out));
    std::fs::write(f.mnt().join("kept"), b"in NVRAM only").unwrap();
    f.umount();
    // The lower directory alone lacks it; the region still has it.
    assert!(!f.lower().join("kept").exists());
    let out = f.mount_with(&["--keep-tempfiles"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(std::fs::read(f.mnt().join("kept")).unwrap(), b"in NVRAM only");
    f.umount();
    // Mounting with tempfiles off transforms what the region holds, at once (and with the
    // page cache off, writes go straight to the lower file).
    let out = f.mount_with(&["--tempfiles", "off", "--cache", "off"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(std::fs::read(f.lower().join("kept")).unwrap(), b"in NVRAM only");
    std::fs::write(f.mnt().join("direct"), b"straight down").unwrap();
    assert_eq!(std::fs::read(f.lower().join("direct")).unwrap(), b"straight down");
    let v: serde_json::Value =
        serde_json::from_slice(&nvstack(&["stat", f.mnt().to_str().unwrap(), "--json"]).stdout)
            .unwrap();
    assert_eq!(v["tempfiles"]["enabled"], false);
    assert_eq!(v["tempfiles"]["created"], 0);
    f.umount();
    // And a default mount transforms at unmount.
    f.mount();
    std::fs::write(f.mnt().join("late"), b"down at unmount").unwrap();
    assert!(!f.lower().join("late").exists());
    f.umount();
    assert_eq!(std::fs::read(f.lower().join("late")).unwrap(), b"down at unmount");
}

#[test]
fn a_tempfile_max_size_beyond_the_undo_log_is_refused_with_the_limit() {
    if skip() {
        return;
    }
    let f = Fixture::new();
    let out = f.mount_with(&["--tempfile-max-size", "1T"]);
    assert!(!out.status.success());
    assert!(text(&out).contains("too large for this region's undo slots"), "{}", text(&out));
}

#[test]
fn inspect_lists_temp_files_and_check_finds_a_damaged_temp_record() {
    if skip() {
        return;
    }
    let f = Fixture::new();
    let out = f.mount_with(&["--keep-tempfiles"]);
    assert!(out.status.success(), "{}", text(&out));
    std::fs::write(f.mnt().join("one"), b"first").unwrap();
    std::fs::write(f.mnt().join("two"), vec![7u8; 9000]).unwrap();
    f.umount();
    let nv = f.nvram();
    let out = nvstack(&["inspect", "--nvram", nv.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let list = v["tempfiles"].as_array().unwrap();
    let names: Vec<&str> = list.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["one", "two"]);
    assert_eq!(list[1]["size"], 9000);
    assert_eq!(list[1]["pages"], 3);
    // Both records in one record frame (frame 0: allocation is lowest first), in its first
    // two slots.
    assert_eq!(list[0]["record"], "frame 0 slot 0");
    assert_eq!(list[1]["record"], "frame 0 slot 1");
    let out = nvstack(&["check", "--nvram", nv.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("2 temp file(s) in NVRAM"), "{}", text(&out));
    // The root's pending times (P3: a directory holding temp files keeps its record), in the
    // frame after the temp files' record frame.
    assert_eq!(v["dir_times"]["directories"], 1, "{}", v["dir_times"]);
    assert_eq!(v["dir_times"]["records"][0]["frame"], 1, "{}", v["dir_times"]);
    assert!(text(&out).contains("1 directory(ies) with pending times"), "{}", text(&out));
    // One flipped bit in the second record (slot 1, 512 bytes in): check and mount both
    // refuse the region with the frame and slot named, exit code 4.
    let frames = v["layout"]["frames_offset"].as_u64().unwrap();
    let mut image = std::fs::read(&nv).unwrap();
    image[(frames + 512 + 240) as usize] ^= 0x10;
    std::fs::write(&nv, &image).unwrap();
    let out = nvstack(&["check", "--nvram", nv.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert!(text(&out).contains("frame 0 slot 1"), "{}", text(&out));
    let out = f.mount_with(&[]);
    assert!(!out.status.success());
    assert!(text(&out).contains("frame 0 slot 1"), "{}", text(&out));
    // A byte in a free slot (T5: free slots are zero) is damage too, not a free slot.
    image[(frames + 512 + 240) as usize] ^= 0x10;
    image[(frames + 5 * 512 + 7) as usize] = 1;
    std::fs::write(&nv, &image).unwrap();
    let out = nvstack(&["check", "--nvram", nv.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert!(text(&out).contains("frame 0 slot 5"), "{}", text(&out));
    // The same for the directory-times record.
    image[(frames + 5 * 512 + 7) as usize] = 0;
    image[(frames + 4096 + 20) as usize] ^= 0x01;
    std::fs::write(&nv, &image).unwrap();
    let out = nvstack(&["check", "--nvram", nv.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert!(
        text(&out).contains("frame 1") && text(&out).contains("directory-times"),
        "{}",
        text(&out)
    );
}

#[test]
fn xattrs_off_stops_the_kernel_asking_before_every_write() {
    if skip() {
        return;
    }
    let f = Fixture::new();
    let out = f.mount_with(&["--xattrs", "off"]);
    assert!(out.status.success(), "{}", text(&out));
    for i in 0..40 {
        use std::io::Write;
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(f.mnt().join(format!("f{}", i % 4)))
            .unwrap();
        file.write_all(format!("line {i}\n").as_bytes()).unwrap(); // one write(2)
    }
    let path = std::ffi::CString::new(f.mnt().join("f1").to_str().unwrap()).unwrap();
    // SAFETY: setxattr of a path with a 1-byte value.
    let rc =
        unsafe { libc::setxattr(path.as_ptr(), c"user.k".as_ptr(), c"v".as_ptr().cast(), 1, 0) };
    assert_eq!(rc, -1);
    assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(libc::EOPNOTSUPP));
    let v: serde_json::Value =
        serde_json::from_slice(&nvstack(&["stat", f.mnt().to_str().unwrap(), "--json"]).stdout)
            .unwrap();
    assert_eq!(v["requests"]["write"], 40);
    assert!(v["requests"]["getxattr"].as_u64().unwrap_or(0) <= 1, "{}", v["requests"]);
    assert!(v["requests"]["setxattr"].as_u64().unwrap_or(0) <= 1, "{}", v["requests"]);
}

/// `--fsync-requests spare` (docs/design.md 13.7): the first fsync and the first fsync of a
/// directory are answered "not implemented", after which the kernel sends no more of either and
/// returns success itself - fsync, fdatasync, O_SYNC writes and directory fsyncs all succeed,
/// and the daemon sees two requests for a hundred calls. What they acknowledged survives
/// SIGKILL of the daemon (its power-cut counterpart: crates/core/tests/durability.rs and
/// `bench/run powercut --fs nvstack-ext4-spare`). Journal mode refuses it with the reason.
#[test]
fn spared_fsync_requests_reach_the_daemon_once_and_lose_nothing() {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if skip() {
        return;
    }
    let f = Fixture::new();
    let out = f.mount_with(&["--consistency", "journal", "--fsync-requests", "spare"]);
    assert!(!out.status.success());
    assert!(text(&out).contains("needs --consistency undo"), "{}", text(&out));
    let out = f.mount_with(&["--fsync-requests", "spare"]);
    assert!(out.status.success(), "{}", text(&out));
    let v = stat_json(&f.mnt());
    assert_eq!(v["fsync"]["requests"], "spare");
    assert_eq!(v["passthrough"]["enabled"], false, "a passthrough file's fsync must reach it");
    std::fs::create_dir(f.mnt().join("new")).unwrap();
    let dir = std::fs::File::open(f.mnt().join("new")).unwrap();
    let mut log =
        std::fs::OpenOptions::new().create(true).append(true).open(f.mnt().join("log")).unwrap();
    let mut dsync = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .custom_flags(libc::O_DSYNC)
        .open(f.mnt().join("dsync"))
        .unwrap();
    for i in 0..50 {
        log.write_all(format!("record {i}\n").as_bytes()).unwrap();
        if i % 2 == 0 {
            log.sync_data().unwrap();
        } else {
            log.sync_all().unwrap();
        }
        dsync.write_all(format!("{i}\n").as_bytes()).unwrap();
        std::fs::write(f.mnt().join("new").join(i.to_string()), b"mail").unwrap();
        dir.sync_all().unwrap();
    }
    let v = stat_json(&f.mnt());
    assert_eq!(v["fsync"]["spared"], 2, "one FSYNC and one FSYNCDIR: {}", v["fsync"]);
    assert_eq!(v["fsync"]["calls"], 0, "{}", v["fsync"]);
    assert_eq!(v["requests"]["fsync"].as_u64().unwrap_or(0), 0, "{}", v["requests"]);
    // `nvstack sync` is served too (the sync(1) the kernel does not send).
    let out = nvstack(&["sync", f.mnt().to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(stat_json(&f.mnt())["fsync"]["sync_requests"], 1);
    drop((log, dsync, dir));
    // SAFETY: kill of the daemon we started.
    unsafe { libc::kill(f.daemon_pid(), libc::SIGKILL) };
    let mut remounted = false;
    for _ in 0..100 {
        // The dead mount may still be settling: bounded retries.
        let out = f.mount_with(&["--fsync-requests", "spare"]);
        if out.status.success() {
            remounted = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(remounted, "remount after SIGKILL");
    let log = std::fs::read_to_string(f.mnt().join("log")).unwrap();
    assert_eq!(log.lines().count(), 50);
    assert_eq!(std::fs::read_to_string(f.mnt().join("dsync")).unwrap().lines().count(), 50);
    assert_eq!(std::fs::read_dir(f.mnt().join("new")).unwrap().count(), 50);
    f.umount();
}

/// `nvstack sync` in journal mode commits the open group at once: `sync(1)` alone does not
/// reach the daemon (the kernel sends FUSE_SYNCFS only to virtiofs), so a written file's group
/// stays open until its interval.
#[test]
fn nvstack_sync_commits_journal_modes_open_group() {
    if skip() {
        return;
    }
    let f = Fixture::new();
    let out = f.mount_with(&["--consistency", "journal", "--group-commit-interval", "600"]);
    assert!(out.status.success(), "{}", text(&out));
    let commits = |v: &serde_json::Value| v["journal"]["group"]["group_commits"].as_u64().unwrap();
    std::fs::write(f.mnt().join("f"), b"x\n").unwrap();
    let before = commits(&stat_json(&f.mnt()));
    let _ = Command::new("sync").arg("-f").arg(f.mnt().join("f")).status();
    assert_eq!(commits(&stat_json(&f.mnt())), before, "syncfs(2) never reaches the daemon");
    let out = nvstack(&["sync", f.mnt().to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let v = stat_json(&f.mnt());
    assert_eq!(commits(&v), before + 1, "{}", v["journal"]["group"]);
    assert_eq!(v["fsync"]["sync_requests"], 1);
    f.umount();
}

/// `nvstack stat --json` of the mount.
fn stat_json(mnt: &Path) -> serde_json::Value {
    let out = nvstack(&["stat", mnt.to_str().unwrap(), "--json"]);
    serde_json::from_slice(&out.stdout).expect("stat json")
}

#[test]
fn the_daemons_background_transformer_keeps_temp_files_under_its_mark() {
    if skip() {
        return;
    }
    let f = Fixture::new();
    // 32 MiB = 8,192 frames; the share 90 % = 7,372; the mark 20 % of it = 1,474 frames.
    let out = f.mount_with(&["--tempfile-background", "20"]);
    assert!(out.status.success(), "mount: {}", text(&out));
    let mnt = f.mnt();
    // 2,000 one-page files: 2,000 pages and 250 record frames, above the mark and far below
    // the share.
    for i in 0..2000u32 {
        std::fs::write(mnt.join(format!("m{i}")), i.to_le_bytes().repeat(1024)).unwrap();
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let t = loop {
        let t = stat_json(&mnt)["tempfiles"].clone();
        let frames = t["pages_resident"].as_u64().unwrap() + t["record_frames"].as_u64().unwrap();
        if frames <= 1474 {
            break t;
        }
        assert!(std::time::Instant::now() < deadline, "still {frames} frames after 60 s: {t}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let background = t["transformed"]["background"].as_u64().unwrap();
    // 776 frames above the mark went, 9/8 of a frame a file (a page and a slot): at least
    // 776 / 1.125 = 690 files.
    assert!(background >= 690, "at least the 776 frames above the mark went: {t}");
    assert_eq!(t["transformed"]["pressure"], 0, "no writer met the share: {t}");
    // (a round may still be freeing files: the count only grows)
    let human = text(&nvstack(&["stat", mnt.to_str().unwrap()]));
    assert!(human.contains("; background "), "{human}");
    for i in (0..2000u32).step_by(7) {
        let want = i.to_le_bytes().repeat(1024);
        assert_eq!(std::fs::read(mnt.join(format!("m{i}"))).unwrap(), want, "m{i}");
        if i < 400 {
            // the least recently used are lower files now
            assert_eq!(std::fs::read(f.lower().join(format!("m{i}"))).unwrap(), want, "m{i}");
        }
    }
    f.umount();
    assert_eq!(std::fs::read_dir(f.lower()).unwrap().count(), 2000);
}

/// `RssAnon` of `pid` in KiB (the daemon's heap, stacks and buffers; not the region's shmem).
fn rss_anon_kib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("RssAnon:")).expect("RssAnon");
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn the_daemons_heap_gives_back_the_transient_buffers_of_a_postmark_run() {
    if skip() {
        return;
    }
    let f = Fixture::new();
    // Temp files, the page cache and relo (the defaults) in a region a dozen 2 MB files fill:
    // temp files are transformed by size and by pressure (1 MiB buffers each) while others
    // are read and appended. Before the daemon fixed glibc's mmap threshold (daemon.rs) it
    // ended this run holding 18 MiB of anonymous memory, most of it freed buffers kept by
    // per-thread arenas (4.8 MiB with the fix); under Postmark 512 B-2 MB 35 MiB, which got
    // it killed under a 51 MiB memory budget.
    let out = f.mount_sized("26M", &[]);
    assert!(out.status.success(), "mount: {}", text(&out));
    let (mnt, pid) = (f.mnt(), f.daemon_pid());
    // Postmark's pattern (60 files of 512 B-2 MB, 400 transactions of a read or an append and
    // a create or a delete), with a fixed seed and 4 KiB blocks instead of 512 B (fewer
    // requests, the same buffers in the daemon).
    let mut seed = 42u64;
    let mut rand = move |n: u64| {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (seed >> 33) % n
    };
    let block = vec![0x5au8; 4096];
    let write = |path: &Path, size: u64| {
        use std::io::Write;
        let mut file = std::fs::OpenOptions::new().create(true).append(true).open(path).unwrap();
        let mut left = size;
        while left > 0 {
            let n = left.min(4096);
            file.write_all(&block[..n as usize]).unwrap();
            left -= n;
        }
    };
    let mut files: Vec<(u32, u64)> = Vec::new();
    let mut next = 0u32;
    let mut create = |files: &mut Vec<(u32, u64)>, rand: &mut dyn FnMut(u64) -> u64| {
        let size = 512 + rand(2 << 20);
        write(&mnt.join(format!("p{next}")), size);
        files.push((next, size));
        next += 1;
    };
    for _ in 0..60 {
        create(&mut files, &mut rand);
    }
    for _ in 0..400 {
        let i = rand(files.len() as u64) as usize;
        let (id, size) = files[i];
        if rand(2) == 0 {
            let got = std::fs::read(mnt.join(format!("p{id}"))).unwrap();
            assert_eq!(got.len() as u64, size, "p{id}");
        } else {
            let more = rand(1 << 20);
            write(&mnt.join(format!("p{id}")), more);
            files[i].1 += more;
        }
        if rand(2) == 0 {
            create(&mut files, &mut rand);
        } else if files.len() > 1 {
            let (id, _) = files.swap_remove(rand(files.len() as u64) as usize);
            std::fs::remove_file(mnt.join(format!("p{id}"))).unwrap();
        }
    }
    let anon = rss_anon_kib(pid);
    eprintln!("daemon RssAnon after the run: {anon} KiB");
    let st = stat_json(&mnt);
    assert!(
        st["tempfiles"]["transformed"]["pressure"].as_u64().unwrap() > 0,
        "the run must make transforms by pressure: {}",
        st["tempfiles"]
    );
    assert!(anon < 12 << 10, "the daemon holds {anon} KiB of anonymous memory");
    for (id, size) in &files {
        assert_eq!(std::fs::metadata(mnt.join(format!("p{id}"))).unwrap().len(), *size, "p{id}");
    }
    f.umount();
}

#[test]
fn the_daemons_background_writer_keeps_writers_out_of_write_back() {
    if skip() {
        return;
    }
    // (`--writeback-background` as given, the round kind that must run, the one that must
    // not): by default the daemon's background writer takes the pages past the mark down and
    // no writer does; with `off` the writer that passed the mark does it in its request.
    for (given, runs, never) in
        [(None, "background", "pressure"), (Some("off"), "pressure", "background")]
    {
        let f = Fixture::new();
        // A lower file of 1,200 pages, existing before the mount (so its writes are cached
        // pages). 32 MiB = 8,192 frames; --dirty-high 10 = 819 frames, --dirty-low 5 = 409.
        let want: Vec<u8> = (0..1200u32).flat_map(|i| i.to_le_bytes().repeat(1024)).collect();
        std::fs::write(f.lower().join("big"), vec![0u8; want.len()]).unwrap();
        let mut args = vec!["--dirty-high", "10", "--dirty-low", "5", "--passthrough", "off"];
        args.extend(given.map(|v| ["--writeback-background", v]).into_iter().flatten());
        let out = f.mount_with(&args);
        assert!(out.status.success(), "mount: {}", text(&out));
        let mnt = f.mnt();
        {
            use std::os::unix::fs::FileExt;
            let file = std::fs::OpenOptions::new().write(true).open(mnt.join("big")).unwrap();
            for (i, page) in want.chunks(4096).enumerate() {
                file.write_all_at(page, i as u64 * 4096).unwrap();
            }
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let w = loop {
            let w = stat_json(&mnt)["writeback"].clone();
            if w["pages_dirty"].as_u64().unwrap() <= 819 && w["rounds"][runs].as_u64() >= Some(1) {
                break w;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{given:?}: not written back after 60 s: {w}"
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        };
        // 1,200 pages passed the mark: taken down by rounds of one kind only.
        assert!(w["pages_written"].as_u64().unwrap() >= 1200 - 819, "{given:?}: {w}");
        assert_eq!(w["rounds"][never], 0, "{given:?}: no {never} round: {w}");
        assert_eq!(std::fs::read(mnt.join("big")).unwrap(), want);
        f.umount();
        assert_eq!(std::fs::read(f.lower().join("big")).unwrap(), want);
    }
}

/// LOOKUP requests the daemon counted so far.
fn lookups(mnt: &Path) -> u64 {
    stat_json(mnt)["requests"]["lookup"].as_u64().unwrap_or(0)
}

#[test]
fn a_missing_name_is_cached_as_a_negative_entry_until_something_makes_it() {
    if skip() {
        return;
    }
    // (entry timeout, LOOKUPs of 5 checks of a missing name, and of 5 after its unlink)
    for (timeout, first, again) in [(None, 1, 1), (Some("0"), 5, 5)] {
        let f = Fixture::new();
        let out = match timeout {
            None => f.mount_with(&[]),
            Some(t) => f.mount_with(&["--entry-timeout", t]),
        };
        assert!(out.status.success(), "{}", text(&out));
        let name = f.mnt().join("journal");
        let before = lookups(&f.mnt());
        for _ in 0..5 {
            assert_eq!(std::fs::metadata(&name).unwrap_err().kind(), std::io::ErrorKind::NotFound);
        }
        assert_eq!(lookups(&f.mnt()) - before, first, "entry timeout {timeout:?}");
        // Made through the mount: seen at once, then gone at once after the unlink.
        std::fs::write(&name, b"x").unwrap();
        assert_eq!(std::fs::read(&name).unwrap(), b"x");
        std::fs::remove_file(&name).unwrap();
        let before = lookups(&f.mnt());
        for _ in 0..5 {
            assert_eq!(std::fs::metadata(&name).unwrap_err().kind(), std::io::ErrorKind::NotFound);
        }
        assert_eq!(lookups(&f.mnt()) - before, again, "entry timeout {timeout:?}");
        // A directory's name too, and a rename onto a cached missing name.
        std::fs::create_dir(f.mnt().join("d")).unwrap();
        assert!(std::fs::metadata(f.mnt().join("d/x")).is_err());
        std::fs::write(f.mnt().join("d/y"), b"y").unwrap();
        std::fs::rename(f.mnt().join("d/y"), f.mnt().join("d/x")).unwrap();
        assert_eq!(std::fs::read(f.mnt().join("d/x")).unwrap(), b"y");
        assert!(std::fs::metadata(f.mnt().join("d/y")).is_err());
        f.umount();
    }
}

/// The FUSE workers' crew (docs/design.md 14.8): while the daemon holds one request (a
/// failpoint pauses the first journaled change, a mkdir), other requests are still served - by
/// a reader the watcher adds, with the default spinning reader, or by the other workers with
/// `--spin-us 0` - and the spinning reader's counters say which happened. The added reader
/// stays while the held request is held: a hundred requests later it is still the only one
/// added.
#[test]
fn a_request_held_in_the_daemon_does_not_hold_up_the_others() {
    if skip() {
        return;
    }
    for spin in ["20", "0"] {
        let f = Fixture::new();
        std::fs::write(f.lower().join("existing"), b"served").unwrap();
        for i in 0..20 {
            std::fs::write(f.lower().join(format!("more-{i}")), i.to_string()).unwrap();
        }
        std::fs::create_dir(f.lower().join("sub")).unwrap();
        let (lower, mnt, nvram) = (f.lower(), f.mnt(), f.nvram());
        let out = Command::new(BIN)
            .args(["mount", "--size", "32M", "--spin-us", spin, "--nvram"])
            .args([&nvram, &lower, &mnt])
            .env("NVSTACK_FAILPOINT", "journal.committed:1:pause=8000")
            .output()
            .unwrap();
        assert!(out.status.success(), "mount: {}", text(&out));
        let mut held = Command::new("mkdir").arg(mnt.join("sub/held")).spawn().unwrap();
        // Wait (bounded) until the daemon says it holds the mkdir.
        let log = common::run_dir(&mnt).unwrap().join("daemon.log");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while !std::fs::read_to_string(&log).unwrap_or_default().contains("pausing") {
            assert!(std::time::Instant::now() < deadline, "the failpoint was not reached");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        // LOOKUP, GETATTR, OPEN, READ and RELEASE of another file, served meanwhile (not after
        // the daemon let the mkdir go on).
        assert_eq!(std::fs::read(mnt.join("existing")).unwrap(), b"served", "spin {spin}");
        // And a hundred more requests: the added reader stays while the held one is held (it
        // does not park after each request, which would make each wait for the watcher).
        for i in 0..20 {
            assert_eq!(
                std::fs::read(mnt.join(format!("more-{i}"))).unwrap(),
                i.to_string().as_bytes()
            );
        }
        let said = std::fs::read_to_string(&log).unwrap();
        assert!(!said.contains("resumed"), "spin {spin}: served only after the held request");
        let fuse = stat_json(&mnt)["fuse"].clone();
        if spin == "0" {
            assert_eq!(fuse["spin_hits"], 0, "{fuse}");
            assert_eq!(fuse["readers_added"], 0, "{fuse}");
        } else {
            let added = fuse["readers_added"].as_u64().unwrap();
            assert!((1..=3).contains(&added), "one reader added for the held request: {fuse}");
            assert!(fuse["spin_hits"].as_u64().unwrap() >= 1, "{fuse}");
        }
        assert!(held.wait().unwrap().success());
        assert!(mnt.join("sub/held").is_dir());
        f.umount();
    }
}

/// The spinning reader learns its window from the gaps between a reply and the next request
/// (docs/design.md 14.8): requests sent back to back get a window of at most twice
/// `--spin-us`, chosen after 128 windows and again after every 128 samples, and most of them
/// are taken while spinning; `--spin-us 0` never spins and learns nothing.
#[test]
fn the_spinning_reader_learns_its_window_from_the_requests() {
    if skip() {
        return;
    }
    for spin in [100u64, 0] {
        let f = Fixture::new();
        std::fs::write(f.lower().join("f"), b"x").unwrap();
        let out = f.mount_with(&["--spin-us", &spin.to_string()]);
        assert!(out.status.success(), "{}", text(&out));
        let file = std::fs::File::open(f.mnt().join("f")).unwrap();
        let n =
            |v: &serde_json::Value, k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{k}: {v}"));
        // One STATFS request each, back to back, in batches of 2,000. Tests share two CPUs: a
        // batch during which other tests' builds or daemons take them sees long gaps, and the
        // window learned from those gaps rightly takes few requests. A bounded retry: up to
        // three batches, each judged on its own; the first where spinning took most requests
        // ends it.
        let mut batches = Vec::new();
        for _ in 0..3 {
            let before = stat_json(&f.mnt())["fuse"].clone();
            for _ in 0..2000 {
                let mut buf: libc::statvfs = unsafe { std::mem::zeroed() };
                // SAFETY: a live descriptor and a statvfs buffer of our own.
                let rc =
                    unsafe { libc::fstatvfs(std::os::fd::AsRawFd::as_raw_fd(&file), &raw mut buf) };
                assert_eq!(rc, 0);
            }
            let after = stat_json(&f.mnt())["fuse"].clone();
            let hits = n(&after, "spin_hits") - n(&before, "spin_hits");
            let expired = n(&after, "spin_expired") - n(&before, "spin_expired");
            batches.push((hits, expired));
            if spin == 0 || hits > expired {
                break;
            }
        }
        drop(file);
        let fuse = stat_json(&f.mnt())["fuse"].clone();
        f.umount();
        assert_eq!(n(&fuse, "spin_us"), spin, "{fuse}");
        if spin == 0 {
            assert_eq!(n(&fuse, "spin_window_us"), 0, "{fuse}");
            assert_eq!(n(&fuse, "spin_windows_learned"), 0, "{fuse}");
            assert_eq!(n(&fuse, "spin_hits"), 0, "{fuse}");
            continue;
        }
        // The first choice after 128 windows, then one per 128 sample windows (one in 64):
        // by the end of 2,000 requests and the stat calls, at least one.
        assert!(n(&fuse, "spin_windows_learned") >= 1, "{fuse}");
        assert_eq!(n(&fuse, "spin_window_max_us"), 2 * spin, "{fuse}");
        assert!(n(&fuse, "spin_window_us") <= 2 * spin, "{fuse}");
        // Back to back, the next request comes within microseconds: a learned window takes
        // most of them (99 % on an idle machine; tests share two CPUs, which may deschedule
        // the loop now and then, so only a majority is asserted, in one of the batches).
        assert!(
            batches.iter().any(|&(hits, expired)| hits > expired),
            "(hits, expired) per batch {batches:?}: {fuse}"
        );
    }
}

#[test]
fn stat_says_why_writes_waited_at_the_patch_limit() {
    if skip() {
        return;
    }
    let f = Fixture::new();
    std::fs::write(f.lower().join("data"), vec![b'l'; 64 * 4096]).unwrap();
    // One frame of patches: 128-byte patches take 3 of its 64 slots, so 21 fit.
    let out = f.mount_with(&["--nbw", "lazy", "--nbw-patch-limit", "4K", "--passthrough", "off"]);
    assert!(out.status.success(), "{}", text(&out));
    {
        use std::os::unix::fs::FileExt;
        let file = std::fs::OpenOptions::new().write(true).open(f.mnt().join("data")).unwrap();
        for page in 0..30u64 {
            file.write_all_at(&[b'M'; 128], page * 4096 + 7).unwrap();
        }
    }
    let out = nvstack(&["stat", f.mnt().to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let all = text(&out);
    let line = all.lines().find(|l| l.starts_with("nbw (lazy)")).unwrap_or_else(|| panic!("{all}"));
    assert!(line.contains("21 patches created"), "{line}");
    assert!(line.contains("9 writes waited (9 patch_limit)"), "{line}");
    f.umount();
}

#[test]
fn dirty_pages_stay_with_keep_dirty_are_listed_flushed_and_a_damaged_record_is_refused() {
    if skip() {
        return;
    }
    let f = Fixture::new();
    std::fs::write(f.lower().join("data"), vec![b'l'; 20_000]).unwrap();
    // --nbw lazy (the default, named: async-bg would fetch it soon): the patch stays a patch;
    // --passthrough off: the write goes through NVRAM (in passthrough the kernel would write
    // the lower file itself).
    let out = f.mount_with(&["--keep-dirty", "--nbw", "lazy", "--passthrough", "off"]);
    assert!(out.status.success(), "{}", text(&out));
    {
        use std::os::unix::fs::FileExt;
        let file = std::fs::OpenOptions::new().write(true).open(f.mnt().join("data")).unwrap();
        file.write_all_at(&[b'M'; 100], 5000).unwrap();
    }
    let mut want = vec![b'l'; 20_000];
    want[5000..5100].fill(b'M');
    assert_eq!(std::fs::read(f.mnt().join("data")).unwrap(), want);
    let v: serde_json::Value =
        serde_json::from_slice(&nvstack(&["stat", f.mnt().to_str().unwrap(), "--json"]).stdout)
            .unwrap();
    assert_eq!(v["cache"]["files"], 1, "{v}");
    // Non-blocking writes (lazy): the partial page is not read but patched.
    assert_eq!(v["cache"]["fetches"], 0, "a partial page is not read: {v}");
    assert_eq!(v["nbw"]["patches"], 1, "{v}");
    assert_eq!(v["writeback"]["pages_dirty"], 1, "{v}");
    assert_eq!(v["writeback"]["policy"], "relo");
    f.umount();
    // --keep-dirty: the lower file alone still has the old bytes; the region has the page.
    assert_eq!(std::fs::read(f.lower().join("data")).unwrap(), vec![b'l'; 20_000]);
    let nv = f.nvram();
    let out = nvstack(&["inspect", "--nvram", nv.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((v["cache"]["files"].as_u64(), v["cache"]["patches"].as_u64()), (Some(1), Some(1)));
    let record = v["cache"]["records"][0]["frame"].as_u64().unwrap();
    let out = nvstack(&["check", "--nvram", nv.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("1 cached file(s) with 0 dirty page(s) and 1 patch(es)"),
        "{}",
        text(&out)
    );
    // The next mount finds the file by its handle; flush writes the page back.
    let out = f.mount_with(&["--keep-dirty", "--nbw", "lazy", "--passthrough", "off"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(std::fs::read(f.mnt().join("data")).unwrap(), want);
    let out = nvstack(&["flush", f.mnt().to_str().unwrap(), "-q"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("1 dirty page(s) written back"), "{}", text(&out));
    assert_eq!(std::fs::read(f.lower().join("data")).unwrap(), want);
    // Dirty again, kept, then one flipped bit in the record: check and mount refuse the
    // region with the frame named (exit 4), never a guess.
    {
        use std::os::unix::fs::FileExt;
        let file = std::fs::OpenOptions::new().write(true).open(f.mnt().join("data")).unwrap();
        file.write_all_at(b"again", 0).unwrap();
    }
    f.umount();
    let out = nvstack(&["inspect", "--nvram", nv.to_str().unwrap(), "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let record = v["cache"]["records"][0]["frame"].as_u64().unwrap_or(record);
    // The only cached file's record: slot 0 of its record frame.
    assert_eq!(v["cache"]["records"][0]["record"], format!("frame {record} slot 0"));
    let frames = v["layout"]["frames_offset"].as_u64().unwrap();
    let mut image = std::fs::read(&nv).unwrap();
    image[(frames + record * 4096 + 20) as usize] ^= 0x10;
    std::fs::write(&nv, &image).unwrap();
    let out = nvstack(&["check", "--nvram", nv.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert!(text(&out).contains(&format!("frame {record} slot 0")), "{}", text(&out));
    let out = f.mount_with(&[]);
    assert!(!out.status.success());
    assert!(text(&out).contains(&format!("frame {record} slot 0")), "{}", text(&out));
}

/// Whether `path` is a mount point (its exact path as field 5 of /proc/self/mountinfo; the test
/// paths have no characters that mountinfo escapes).
fn is_mounted(path: &Path) -> bool {
    let want = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(want.to_str().unwrap()))
}

/// Unmounts a mount the fixture does not know about when dropped (whatever failed), and removes
/// its run directory; asserts the clean unmount unless the test is already failing.
struct Unmounted(PathBuf);

impl Drop for Unmounted {
    fn drop(&mut self) {
        let out = common::nvstack_umount(&self.0);
        if !out.status.success() {
            let _ = Command::new("umount").arg("-l").arg(&self.0).output();
        }
        common::remove_run_dir(&self.0);
        if !std::thread::panicking() {
            assert!(out.status.success(), "umount {}: {}", self.0.display(), text(&out));
        }
    }
}

#[test]
fn a_mount_point_inside_the_lower_directory_is_refused_and_leaves_nothing_behind() {
    // Refused before anything is mounted or created: needs neither root nor /dev/fuse.
    let f = Fixture::new();
    let inside = f.lower().join("in");
    std::fs::create_dir(&inside).unwrap();
    let (lower, mp) = (f.lower(), inside.clone());
    let out = nvstack(&[
        "mount",
        lower.to_str().unwrap(),
        mp.to_str().unwrap(),
        "--nvram",
        f.nvram().to_str().unwrap(),
        "--size",
        "32M",
    ]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("is inside the lower directory"), "{said}");
    assert!(
        said.contains(mp.to_str().unwrap()) && said.contains(lower.to_str().unwrap()),
        "{said}"
    );
    assert!(!is_mounted(&mp), "nothing mounted");
    assert!(!common::run_dir(&mp).unwrap().exists(), "no run directory");
    assert!(!f.nvram().exists(), "no region created");
}

#[test]
fn mounting_over_the_lower_directory_itself_or_above_it_works_and_hides_it() {
    if skip() {
        return;
    }
    let f = Fixture::new();
    std::fs::write(f.lower().join("old"), b"before").unwrap();
    // Over the lower directory itself: the mount shows it and hides it from everyone else.
    let lower = f.lower();
    let over = |mp: &Path, nvram: &Path| {
        nvstack(&[
            "mount",
            lower.to_str().unwrap(),
            mp.to_str().unwrap(),
            "--nvram",
            nvram.to_str().unwrap(),
            "--size",
            "32M",
        ])
    };
    let out = over(&lower, &f.nvram());
    let guard = Unmounted(lower.clone());
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(std::fs::read(lower.join("old")).unwrap(), b"before");
    std::fs::write(lower.join("new"), b"through the mount").unwrap();
    assert!(is_mounted(&lower));
    drop(guard);
    assert!(!is_mounted(&lower));
    assert_eq!(std::fs::read(lower.join("new")).unwrap(), b"through the mount");
    // Above it (the mount point is an ancestor of the lower directory): the same.
    let above = f.dir.path().to_path_buf();
    let nvram = f.shm.path().join("region-above");
    let out = over(&above, &nvram);
    let guard = Unmounted(above.clone());
    assert!(out.status.success(), "{}", text(&out));
    let mut seen: Vec<_> =
        std::fs::read_dir(&above).unwrap().map(|e| e.unwrap().file_name()).collect();
    seen.sort();
    assert_eq!(seen, ["new", "old"], "the mount shows the lower directory");
    std::fs::write(above.join("from-above"), b"x").unwrap();
    drop(guard);
    assert!(!is_mounted(&above));
    assert_eq!(std::fs::read(lower.join("from-above")).unwrap(), b"x");
}

#[test]
fn umount_retries_a_busy_mount_and_says_how_to_find_the_holder() {
    if skip() {
        return;
    }
    let f = Fixture::new();
    f.mount();
    std::fs::write(f.mnt().join("held"), b"open").unwrap();
    let held = std::fs::File::open(f.mnt().join("held")).unwrap();
    let mnt = f.mnt();
    let out = nvstack(&["umount", "--busy-timeout", "0", mnt.to_str().unwrap()]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("is busy") && said.contains("fuser -vm"), "{said}");
    assert!(is_mounted(&mnt), "a busy mount stays mounted");
    // The holder lets go after a second; a bounded wait outlasts it.
    let release = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(1));
        drop(held);
    });
    let start = std::time::Instant::now();
    let out = nvstack(&["umount", "--busy-timeout", "20", mnt.to_str().unwrap()]);
    release.join().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(start.elapsed() >= std::time::Duration::from_millis(500), "it did wait");
    assert!(!is_mounted(&mnt));
    assert_eq!(std::fs::read(f.lower().join("held")).unwrap(), b"open");
}

#[test]
fn a_mount_point_reached_through_a_bind_mount_of_the_lower_directory_is_refused() {
    if skip() {
        return;
    }
    let f = Fixture::new();
    std::fs::create_dir(f.lower().join("in")).unwrap();
    let bind = f.dir.path().join("bind");
    std::fs::create_dir(&bind).unwrap();
    let out = Command::new("mount").arg("--bind").arg(f.lower()).arg(&bind).output().unwrap();
    assert!(out.status.success(), "mount --bind: {}", text(&out));
    let mp = bind.join("in");
    let out = nvstack(&[
        "mount",
        f.lower().to_str().unwrap(),
        mp.to_str().unwrap(),
        "--nvram",
        f.nvram().to_str().unwrap(),
    ]);
    if out.status.success() {
        // A regression: undo the mount before the bind mount under it.
        let _ = Command::new("umount").arg("-l").arg(&mp).output();
    }
    let unbound = common::umount_retrying(&bind);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("is inside the lower directory") && said.contains("bind is"), "{said}");
    assert!(unbound && !is_mounted(&mp), "nothing left mounted");
}

/// Files with pages in NVRAM keep at most a quarter of the open-file limit's descriptors:
/// under a limit of 600 (nodes 300), creating and writing 2,000 lower files on the NVRAM path
/// used to fail with EMFILE at the 291st (each cached file held two descriptors); every one
/// is created, reads back and reaches the lower directory.
#[test]
fn more_cached_files_than_the_open_file_limit_allows_descriptors_for() {
    if skip() {
        return;
    }
    let f = Fixture::new();
    let out = f.mount_limited(600, "64M", &["--passthrough", "off", "--tempfiles", "off"]);
    assert!(out.status.success(), "mount: {}", text(&out));
    let (mnt, n) = (f.mnt(), 2000);
    let body = |i: usize| format!("file {i} ").repeat(100).into_bytes();
    for i in 0..n {
        std::fs::write(mnt.join(format!("f{i}")), body(i))
            .unwrap_or_else(|e| panic!("file {i} of {n}: {e}"));
    }
    for i in (0..n).step_by(7) {
        assert_eq!(std::fs::read(mnt.join(format!("f{i}"))).unwrap(), body(i), "file {i}");
    }
    let errors = stat_json(&mnt)["errors"].clone();
    assert!(errors.get("create").is_none() && errors.get("write").is_none(), "{errors}");
    f.umount();
    for i in 0..n {
        let got = std::fs::read(f.lower().join(format!("f{i}"))).unwrap();
        assert_eq!(got, body(i), "lower file {i}");
    }
}

/// A walk over more files than `--node-fds` works: nodes past the limit release their
/// descriptors and reopen by handle; a deleted file that an application still holds (an
/// O_PATH descriptor: the daemon sees no open) keeps answering after its node was released.
#[test]
fn a_walk_over_more_files_than_node_fds_works_and_a_held_deleted_file_answers() {
    if skip() {
        return;
    }
    let f = Fixture::new();
    let files = 600;
    for i in 0..files {
        std::fs::write(f.lower().join(format!("f{i}")), format!("{i}")).unwrap();
    }
    // attr-timeout 0: the fstat below reaches the daemon.
    let out = f.mount_with(&["--node-fds", "16", "--attr-timeout", "0", "--tempfiles", "off"]);
    assert!(out.status.success(), "mount: {}", text(&out));
    let held = std::fs::File::options()
        .read(true)
        .custom_flags(libc::O_PATH)
        .open(f.mnt().join("f0"))
        .unwrap();
    for round in 0..2 {
        for i in 0..files {
            let data = std::fs::read_to_string(f.mnt().join(format!("f{i}"))).unwrap();
            assert_eq!(data, format!("{i}"), "round {round}");
        }
    }
    // f0's node was released by the walks (clock order), and unlinking re-pins it.
    std::fs::remove_file(f.mnt().join("f0")).unwrap();
    for i in 1..files {
        std::fs::metadata(f.mnt().join(format!("f{i}"))).unwrap();
    }
    let m = held.metadata().unwrap();
    assert_eq!((m.nlink(), m.len()), (0, 1), "the deleted file the application holds");
    let stat = nvstack(&["stat", f.mnt().to_str().unwrap(), "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&stat.stdout).expect("stat json");
    let nodes = &v["lower_nodes"];
    assert_eq!(nodes["handles"], true, "root on ext4 or tmpfs: {nodes}");
    assert_eq!(nodes["fds_limit"], 16, "{nodes}");
    // The limit may be passed for a moment by nodes in use, never by much.
    assert!(nodes["fds_held"].as_u64().unwrap() <= 16 + 8, "{nodes}");
    assert!(nodes["releases"].as_u64().unwrap() >= files, "{nodes}");
    assert!(nodes["reopens"].as_u64().unwrap() > 0, "{nodes}");
    let line = text(&nvstack(&["stat", f.mnt().to_str().unwrap()]));
    assert!(line.contains("of at most 16"), "{line}");
    drop(held);
    f.umount();
}

/// Every option of `nvstack mount`, at a value other than its default: (flag, value given or
/// None for a switch, the value `stat --json` must report under `mount.options`).
fn every_option() -> Vec<(&'static str, Option<&'static str>, serde_json::Value)> {
    use serde_json::json;
    vec![
        ("size", Some("32M"), json!(32 << 20)),
        ("undo-slots", Some("3"), json!(3)),
        ("undo-slot-size", Some("512K"), json!(512 << 10)),
        ("consistency", Some("none"), json!("none")),
        ("threads", Some("3"), json!(3)),
        ("attr-timeout", Some("5"), json!(5.0)),
        ("entry-timeout", Some("7"), json!(7.0)),
        ("max-write", Some("128K"), json!(128 << 10)),
        ("tempfiles", Some("off"), json!("off")),
        ("tempfile-max-size", Some("256K"), json!(256 << 10)),
        ("tempfile-share", Some("50"), json!(50)),
        ("tempfile-writeback-batch", Some("64"), json!(64)),
        ("tempfile-background", Some("60"), json!(60)),
        ("xattrs", Some("off"), json!("off")),
        ("passthrough", Some("off"), json!("off")),
        // (`spare` needs undo mode; this table's mount is `--consistency none`)
        ("fsync-requests", Some("forward"), json!("forward")),
        // (`on` needs undo mode too)
        ("direct-path", Some("off"), json!("off")),
        ("direct-io", Some("nvram"), json!("nvram")),
        ("keep-tempfiles", None, json!(true)),
        ("cache", Some("off"), json!("off")),
        ("writeback", Some("file"), json!("file")),
        ("zone-blocks", Some("512"), json!(512)),
        ("dirty-high", Some("70"), json!(70)),
        ("dirty-low", Some("40"), json!(40)),
        ("writeback-background", Some("off"), json!("off")),
        ("writeback-batch", Some("32"), json!(32)),
        ("max-dirty-age", Some("60"), json!(60)),
        ("keep-dirty", None, json!(true)),
        ("journal-size", Some("4M"), json!(4 << 20)),
        ("checkpoint-interval", Some("9"), json!(9)),
        ("group-commit-size", Some("2M"), json!(2 << 20)),
        ("group-commit-interval", Some("3"), json!(3)),
        ("nbw", Some("lazy"), json!("lazy")),
        ("nbw-patch-limit", Some("8M"), json!(8 << 20)),
        ("node-fds", Some("100"), json!(100)),
        ("spin-us", Some("35"), json!(35)),
    ]
}

#[test]
fn the_daemon_gets_every_option_as_given_and_stat_reports_them() {
    if skip() {
        return;
    }
    // Every option `nvstack mount --help` lists is in the table (a new option without a row
    // fails here, so it cannot be dropped on the way to the daemon unnoticed).
    let help = text(&nvstack(&["mount", "--help"]));
    let table = every_option();
    let not_options = ["help", "version", "nvram", "foreground"];
    for word in help.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-')) {
        let Some(flag) = word.strip_prefix("--") else { continue };
        if flag.is_empty() || not_options.contains(&flag) {
            continue;
        }
        assert!(table.iter().any(|(f, _, _)| *f == flag), "--{flag} has no row in every_option()");
    }
    let f = Fixture::new();
    let (lower, mnt, nvram) = (f.lower(), f.mnt(), f.nvram());
    let mut args = vec![
        "mount".to_string(),
        lower.display().to_string(),
        mnt.display().to_string(),
        "--nvram".to_string(),
        nvram.display().to_string(),
    ];
    for (flag, value, _) in &table {
        args.push(format!("--{flag}"));
        if let Some(value) = value {
            args.push((*value).to_string());
        }
    }
    // Daemon mode (no --foreground): the options must survive the re-exec.
    let out = Command::new(BIN).args(&args).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let stat = nvstack(&["stat", mnt.to_str().unwrap(), "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&stat.stdout).expect("stat json");
    f.umount();
    let options = &v["mount"]["options"];
    for (flag, _, want) in &table {
        let key = flag.replace('-', "_");
        assert_eq!(&options[&key], want, "--{flag}: mount.options.{key} = {}", options[&key]);
    }
    // And the engine runs with them.
    assert_eq!(v["nvram"]["consistency"], "none");
    assert_eq!(v["nvram"]["undo_slots"], 3);
    assert_eq!(v["tempfiles"]["enabled"], false);
    assert_eq!(v["cache"]["enabled"], false);
    assert_eq!(v["writeback"]["policy"], "file");
    assert_eq!(v["writeback"]["zone_blocks"], 512);
    assert_eq!(v["fuse"]["spin_us"], 35, "the FUSE session's window");
}

/// Without flags the engine runs with its defaults (one place: the core's), and `stat --json`
/// shows what they came to in the region: the watermarks at 80 % and 60 % of its frames, the
/// patch limit an eighth of them; journal mode's group commits take the metadata journal's
/// limits when not given their own.
#[test]
fn stat_shows_the_effective_defaults_and_group_commits_follow_the_journal() {
    if skip() {
        return;
    }
    let f = Fixture::new();
    let out = f.mount_with(&["--consistency", "journal", "--journal-size", "4M"]);
    assert!(out.status.success(), "mount: {}", text(&out));
    let v = stat_json(&f.mnt());
    f.umount();
    let frames = v["nvram"]["frames_total"].as_u64().unwrap();
    assert_eq!(v["writeback"]["high_pages"], frames * 80 / 100, "{}", v["writeback"]);
    assert_eq!(v["writeback"]["low_pages"], frames * 60 / 100, "{}", v["writeback"]);
    assert_eq!(v["writeback"]["policy"], "relo");
    assert_eq!(v["nbw"]["mode"], "async-bg");
    assert_eq!(v["nbw"]["patch_limit"], frames / 8, "{}", v["nbw"]);
    let options = &v["mount"]["options"];
    assert_eq!(options["group_commit_size"], 4 << 20, "{options}");
    assert_eq!(options["group_commit_interval"], 5, "{options}");
}
