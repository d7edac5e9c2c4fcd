//! The POSIX conformance table (`nvstack-posixtest`, crate `crates/posixtest`) on the plain lower
//! file system and on an nvstack mount over the same file system, in every consistency mode
//! and non-blocking-write mode: the normalized results of every case must be identical,
//! except for the cases listed with a reason in `crates/posixtest/known-differences.txt`.
//!
//! The file system is a fresh ext4 on a loop device (a plain directory under /tmp when loop
//! devices or mkfs.ext4 are unavailable; the test says so). Needs root and /dev/fuse.
//!
//! Where the runner comes from: `CARGO_BIN_EXE_*` names only the binaries of this package, so
//! `nvstack-posixtest` is taken from the same target directory as `nvstack`
//! (`target/<profile>/nvstack-posixtest`). `cargo test --workspace` builds it (the posixtest
//! package has integration tests, so its binary is built); for this test alone run
//! `cargo build -p nvstack-posixtest && cargo test -p nvstack --test posix_table`. A missing
//! runner fails the test with that instruction; a runner older than its sources is refused too.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const NVSTACK: &str = env!("CARGO_BIN_EXE_nvstack");
/// The whole table takes about a second on ext4 and a few seconds on the mount; a case that hangs
/// in the kernel is cut off after this.
const TABLE_TIMEOUT: Duration = Duration::from_secs(300);

fn skip() -> bool {
    common::skip("the POSIX table")
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `nvstack-posixtest` next to `nvstack`, refusing a missing or stale binary.
fn runner() -> PathBuf {
    let bin = Path::new(NVSTACK).with_file_name("nvstack-posixtest");
    let how = "build it with `cargo build -p nvstack-posixtest` (cargo test --workspace does)";
    let built = std::fs::metadata(&bin)
        .and_then(|m| m.modified())
        .unwrap_or_else(|_| panic!("{} missing: {how}", bin.display()));
    let src = repo().join("crates/posixtest/src");
    let newest_src = walk_newest(&src);
    assert!(built >= newest_src, "{} is older than crates/posixtest/src: {how}", bin.display());
    bin
}

fn walk_newest(dir: &Path) -> std::time::SystemTime {
    let mut newest = std::time::UNIX_EPOCH;
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let t = if p.is_dir() {
            walk_newest(&p)
        } else {
            std::fs::metadata(&p).unwrap().modified().unwrap()
        };
        newest = newest.max(t);
    }
    newest
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"))
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// A scratch file system: ext4 on a loop device, mounted at `root`; or, where that cannot be
/// made, a plain directory. Unmounted and detached on drop, whatever happened.
struct ScratchFs {
    tmp: tempfile::TempDir,
    loopdev: Option<String>,
    mounted: bool,
}

impl ScratchFs {
    fn new() -> ScratchFs {
        let tmp = tempfile::Builder::new().prefix("nvstack-posix-table").tempdir().unwrap();
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut fs = ScratchFs { tmp, loopdev: None, mounted: false };
        std::fs::create_dir(fs.root()).unwrap();
        if let Err(why) = fs.make_ext4() {
            eprintln!(
                "NOTE: no loop-mounted ext4 ({why}); running on a plain directory of the host FS"
            );
        }
        std::fs::set_permissions(fs.root(), std::fs::Permissions::from_mode(0o755)).unwrap();
        fs
    }

    fn root(&self) -> PathBuf {
        self.tmp.path().join("fs")
    }

    fn make_ext4(&mut self) -> Result<(), String> {
        let image = self.tmp.path().join("ext4.img");
        std::fs::File::create(&image)
            .and_then(|f| f.set_len(1 << 30))
            .map_err(|e| e.to_string())?;
        let o = run(Command::new("losetup").args(["--find", "--show"]).arg(&image));
        if !o.status.success() {
            return Err(format!("losetup: {}", text(&o).trim()));
        }
        let dev = String::from_utf8_lossy(&o.stdout).trim().to_string();
        self.loopdev = Some(dev.clone());
        let o = run(Command::new("mkfs.ext4").args(["-q", "-F", &dev]));
        if !o.status.success() {
            return Err(format!("mkfs.ext4: {}", text(&o).trim()));
        }
        let o = run(Command::new("mount").arg(&dev).arg(self.root()));
        if !o.status.success() {
            return Err(format!("mount: {}", text(&o).trim()));
        }
        self.mounted = true;
        Ok(())
    }
}

impl Drop for ScratchFs {
    fn drop(&mut self) {
        if self.mounted && !common::umount_retrying(&self.root()) {
            let _ = run(Command::new("umount").arg("-l").arg(self.root()));
        }
        if let Some(dev) = &self.loopdev {
            let _ = run(Command::new("losetup").args(["-d", dev]));
        }
    }
}

/// An nvstack mount of `lower` at `mnt`, unmounted on drop (`nvstack umount`, then
/// `fusermount3 -uz` as the last resort).
struct NvMount {
    mnt: PathBuf,
    _shm: tempfile::TempDir,
}

impl NvMount {
    fn new(
        lower: &Path,
        mnt: &Path,
        consistency: &str,
        tempfiles: &str,
        extra: &[&str],
    ) -> NvMount {
        let shm =
            tempfile::Builder::new().prefix("nvstack-posix-table").tempdir_in("/dev/shm").unwrap();
        let nvram = shm.path().join("region");
        let o = run(Command::new(NVSTACK)
            .arg("mount")
            .arg(lower)
            .arg(mnt)
            .arg("--nvram")
            .arg(&nvram)
            .args(["--size", "64M", "--consistency", consistency, "--tempfiles", tempfiles])
            .args(extra));
        let out = text(&o);
        assert!(
            !out.contains("unrecognized subcommand"),
            "nvstack mount not available in this build of nvstack: {out}"
        );
        assert!(o.status.success(), "nvstack mount --consistency {consistency}: {out}");
        NvMount { mnt: mnt.to_path_buf(), _shm: shm }
    }
}

impl Drop for NvMount {
    fn drop(&mut self) {
        if !common::nvstack_umount(&self.mnt).status.success() {
            let _ = run(Command::new("fusermount3").arg("-uz").arg(&self.mnt));
        }
        common::remove_run_dir(&self.mnt);
    }
}

/// Runs the table in `dir` and writes its JSON lines to `out`; fails on the runner's own error or
/// after `TABLE_TIMEOUT` (then a hung FUSE request is aborted by the caller's drop).
fn table(runner: &Path, dir: &Path, out: &Path) {
    let file = std::fs::File::create(out).unwrap();
    let mut child = Command::new(runner)
        .arg(dir)
        .arg("--json")
        .stdout(file)
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", runner.display()));
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > TABLE_TIMEOUT {
            let _ = child.kill();
            // A child stuck in a FUSE request cannot die until the connection goes.
            let _ = run(Command::new("fusermount3").arg("-uz").arg(dir));
            let _ = child.wait();
            panic!("the table in {} took longer than {TABLE_TIMEOUT:?}", dir.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    eprintln!("table in {}: {:.1} s", dir.display(), start.elapsed().as_secs_f64());
    assert!(status.success(), "nvstack-posixtest {} failed: {status}", dir.display());
}

#[test]
fn posix_table_mount_matches_lower() {
    if skip() {
        return;
    }
    let runner = runner();
    let fs = ScratchFs::new();
    let root = fs.root();
    let results = tempfile::tempdir().unwrap();

    let plain = root.join("plain");
    std::fs::create_dir(&plain).unwrap();
    let reference = results.path().join("plain.jsonl");
    table(&runner, &plain, &reference);
    let cases = std::fs::read_to_string(&reference).unwrap().lines().count();
    assert!(cases >= 50, "the table ran only {cases} cases");

    // With tempfiles on, the known differences of TempFFS come on top of the mount's own.
    let known = repo().join("crates/posixtest/known-differences.txt");
    let known_temp = results.path().join("known-tempfiles.txt");
    std::fs::write(
        &known_temp,
        std::fs::read_to_string(&known).unwrap()
            + &std::fs::read_to_string(
                repo().join("crates/posixtest/known-differences-tempfiles.txt"),
            )
            .unwrap(),
    )
    .unwrap();
    let mut failures = Vec::new();
    // With temp files off every file is a lower file: with passthrough on (the default) the
    // kernel serves the ones with nothing in NVRAM itself (docs/design.md section 14); with it
    // off their partial writes are patches in the non-blocking-write modes (async-bg by
    // default, lazy) or fetches (off). One row holds the fewest node descriptors, so that
    // nodes are released and reopened by handle all through the table.
    for (mode, tempfiles, nbw, passthrough, node_fds) in [
        ("undo", "on", "lazy", "on", None),
        ("none", "on", "lazy", "on", None),
        ("undo", "off", "lazy", "on", Some("16")),
        ("journal", "on", "lazy", "on", None),
        ("undo", "off", "lazy", "off", None),
        ("undo", "off", "off", "off", None),
        ("undo", "off", "async-bg", "off", None),
    ] {
        let nodes = node_fds.map(|n| format!("-node-fds-{n}")).unwrap_or_default();
        let config =
            format!("{mode}-tempfiles-{tempfiles}-nbw-{nbw}-passthrough-{passthrough}{nodes}");
        let (lower, mnt) =
            (root.join(format!("lower-{config}")), root.join(format!("mnt-{config}")));
        for d in [&lower, &mnt] {
            std::fs::create_dir(d).unwrap();
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let out = results.path().join(format!("mount-{config}.jsonl"));
        {
            let mut extra = vec!["--nbw", nbw, "--passthrough", passthrough];
            if let Some(n) = node_fds {
                extra.extend(["--node-fds", n]);
            }
            let _mount = NvMount::new(&lower, &mnt, mode, tempfiles, &extra);
            table(&runner, &mnt, &out);
            if node_fds.is_some() {
                // The row is only worth its name if nodes were released and reopened.
                let o = run(Command::new(NVSTACK).arg("stat").arg(&mnt).arg("--json"));
                let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("stat json");
                let n = &v["lower_nodes"];
                assert!(n["releases"].as_u64() > Some(0) && n["reopens"].as_u64() > Some(0), "{n}");
            }
        }
        let o = run(Command::new(&runner)
            .arg("--compare")
            .arg(&reference)
            .arg(&out)
            .arg("--known")
            .arg(if tempfiles == "on" { &known_temp } else { &known }));
        let what = format!(
            "--consistency {mode} --tempfiles {tempfiles} --nbw {nbw} --passthrough \
             {passthrough}{}",
            node_fds.map(|n| format!(" --node-fds {n}")).unwrap_or_default()
        );
        eprintln!("{what}:\n{}", text(&o));
        if !o.status.success() {
            failures.push(format!("{what}:\n{}", text(&o)));
        }
    }
    assert!(failures.is_empty(), "the mount differs from the lower ext4:\n{}", failures.join("\n"));
}
