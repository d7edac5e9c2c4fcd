//! The direct path end to end (docs/direct-path.md): a mount with `--direct-path on`, programs
//! run with the preload library (`nvstack run --library`), and what they and other processes
//! see. Needs root and /dev/fuse (CI has both), and python3 with its sqlite3 module.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_nvstack");

fn skip() -> bool {
    common::skip("the direct path's tests")
}

/// The preload library cargo built beside the binary (a dev-dependency of this crate: its
/// cdylib lands in `deps/`; `cargo build -p nvstack-preload` puts it beside the binary).
fn library() -> PathBuf {
    let dir = Path::new(BIN).parent().expect("the binary's directory");
    let candidates = [dir.join("libnvstack.so"), dir.join("deps/libnvstack.so")];
    candidates
        .iter()
        .filter(|p| p.is_file())
        .max_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
        .cloned()
        .expect("libnvstack.so built (cargo test builds it as a dev-dependency)")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

struct Fixture {
    dir: tempfile::TempDir,
    shm: tempfile::TempDir,
}

impl Fixture {
    fn new(extra: &[&str]) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::create_dir(dir.path().join("lower")).unwrap();
        std::fs::create_dir(dir.path().join("mnt")).unwrap();
        let shm =
            tempfile::Builder::new().prefix("nvstack-direct-test").tempdir_in("/dev/shm").unwrap();
        std::fs::set_permissions(shm.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let f = Fixture { dir, shm };
        let out = Command::new(BIN)
            .args(["mount", f.lower().to_str().unwrap(), f.mnt().to_str().unwrap()])
            .args(["--nvram", f.nvram().to_str().unwrap(), "--size", "64M"])
            .args(extra)
            .output()
            .unwrap();
        assert!(out.status.success(), "mount: {}", text(&out));
        std::fs::set_permissions(f.mnt(), std::fs::Permissions::from_mode(0o777)).unwrap();
        f
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
    fn logs(&self) -> PathBuf {
        self.shm.path().join("region.logs")
    }
    fn stat(&self) -> serde_json::Value {
        let out = Command::new(BIN)
            .args(["stat", "--json", self.mnt().to_str().unwrap()])
            .output()
            .unwrap();
        assert!(out.status.success(), "stat: {}", text(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    }
}

/// `python3 -c SCRIPT ARGS` under the library, asking for a delegation at the first write
/// (`NVSTACK_DIRECT_AFTER=0`; the default, 1, is tested on its own).
fn python(script: &str, args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.env("NVSTACK_DIRECT_AFTER", "0");
    c.args(["run", "--library", library().to_str().unwrap(), "--", "python3", "-c", script]);
    c.args(args);
    c
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

/// Appends N records of 100 bytes (record i = its number and a byte pattern) with O_APPEND,
/// fdatasync after each, printing each number once acknowledged; with "pause20" it waits for
/// a line on stdin after every 20th; with "wait" it waits for one at the end, then writes M
/// more.
const APPENDER: &str = r#"
import os, sys
path, n = sys.argv[1], int(sys.argv[2])
more = int(sys.argv[4]) if len(sys.argv) > 4 else 0
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
def rec(i):
    return (b"%07d " % i) + bytes([65 + i % 26]) * 91 + b"\n"
pause = len(sys.argv) > 3 and sys.argv[3] == "pause20"
for i in range(n):
    assert os.write(fd, rec(i)) == 100
    os.fdatasync(fd)
    print(i, flush=True)
    if pause and i % 20 == 19:
        sys.stdin.readline()
assert os.fstat(fd).st_size == 100 * n, os.fstat(fd).st_size
assert os.lseek(fd, 0, os.SEEK_END) == 100 * n
if len(sys.argv) > 3 and sys.argv[3] == "wait":
    sys.stdin.readline()
    for i in range(n, n + more):
        assert os.write(fd, rec(i)) == 100
        os.fdatasync(fd)
        print(i, flush=True)
os.close(fd)
"#;

fn record(i: usize) -> Vec<u8> {
    let mut r = format!("{i:07} ").into_bytes();
    r.extend(std::iter::repeat_n(65 + (i % 26) as u8, 91));
    r.push(b'\n');
    r
}

fn records(range: std::ops::Range<usize>) -> Vec<u8> {
    range.flat_map(record).collect()
}

#[test]
fn appends_and_fsyncs_are_served_in_the_process_and_merged_whole() {
    if skip() {
        return;
    }
    let f = Fixture::new(&["--direct-path", "on"]);
    let file = f.mnt().join("log");
    let out = python(APPENDER, &[file.to_str().unwrap(), "300"]).output().unwrap();
    assert!(out.status.success(), "appender: {}", text(&out));
    assert_eq!(std::fs::read(&file).unwrap(), records(0..300));
    let s = f.stat();
    let d = &s["direct"];
    assert_eq!(d["granted"], 1, "{d}");
    assert_eq!(d["writes"], 300, "{d}");
    assert_eq!(d["bytes"], 30_000, "{d}");
    assert_eq!(d["fsyncs"], 300, "{d}");
    assert_eq!(d["taken_back"]["release"], 1, "{d}");
    assert_eq!(d["active"], 0, "{d}");
    // No write and no fsync went through FUSE: the library served them all.
    assert!(s["requests"]["write"].as_u64().unwrap_or(0) == 0, "{}", s["requests"]);
    assert!(s["requests"]["fsync"].as_u64().unwrap_or(0) == 0, "{}", s["requests"]);
    // The log is gone with the delegation.
    assert_eq!(std::fs::read_dir(f.logs()).unwrap().count(), 0);
    // By default the first write of a descriptor goes through FUSE (a file written once is
    // not worth a grant) and the library asks at the second.
    let second = f.mnt().join("log2");
    let out = python(APPENDER, &[second.to_str().unwrap(), "100"])
        .env_remove("NVSTACK_DIRECT_AFTER")
        .output()
        .unwrap();
    assert!(out.status.success(), "appender: {}", text(&out));
    assert_eq!(std::fs::read(&second).unwrap(), records(0..100));
    let s2 = f.stat();
    assert_eq!(s2["requests"]["write"], 1, "{}", s2["requests"]);
    assert_eq!(s2["requests"]["fsync"], 1, "{}", s2["requests"]);
    assert_eq!(s2["direct"]["writes"], 300 + 99, "{}", s2["direct"]);
}

#[test]
fn without_the_direct_path_the_library_changes_nothing() {
    if skip() {
        return;
    }
    let f = Fixture::new(&[]);
    let file = f.mnt().join("log");
    let out = python(APPENDER, &[file.to_str().unwrap(), "50"]).output().unwrap();
    assert!(out.status.success(), "appender: {}", text(&out));
    assert_eq!(std::fs::read(&file).unwrap(), records(0..50));
    let s = f.stat();
    assert_eq!(s["direct"]["granted"], 0);
    assert_eq!(s["direct"]["refused_grants"]["off"], 1, "{}", s["direct"]);
    assert_eq!(s["requests"]["write"], 50);
}

/// Reads lines of acknowledged record numbers from a child's stdout.
fn acks(child: &mut Child) -> impl Iterator<Item = usize> + '_ {
    BufReader::new(child.stdout.as_mut().unwrap())
        .lines()
        .map_while(Result::ok)
        .filter_map(|l| l.trim().parse().ok())
}

#[test]
fn another_process_reading_meanwhile_sees_every_acknowledged_write() {
    if skip() {
        return;
    }
    let f = Fixture::new(&["--direct-path", "on"]);
    let file = f.mnt().join("log");
    let mut child = python(APPENDER, &[file.to_str().unwrap(), "200", "pause20"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut seen = 0;
    for i in acks(&mut child) {
        if i % 20 == 19 {
            // The writer holds its delegation and waits; this process has no library: its
            // stat and open take the delegation back, its read sees every record acknowledged.
            let data = std::fs::read(&file).unwrap();
            assert_eq!(data, records(0..i + 1), "after ack {i}");
            seen += 1;
            writeln!(stdin).unwrap();
        }
    }
    assert!(child.wait().unwrap().success());
    assert_eq!(seen, 10);
    assert_eq!(std::fs::read(&file).unwrap(), records(0..200));
    let d = &f.stat()["direct"];
    let t = &d["taken_back"];
    let by_reader =
        ["open", "getattr", "lookup"].iter().map(|k| t[k].as_u64().unwrap()).sum::<u64>();
    assert_eq!(by_reader, 10, "one take-back per look: {d}");
    assert_eq!(d["granted"], 10, "granted again after each take-back: {d}");
    assert_eq!(d["writes"], 200, "{d}");
}

#[test]
fn sigkill_of_the_writer_loses_no_acknowledged_record_and_tears_none() {
    if skip() {
        return;
    }
    let f = Fixture::new(&["--direct-path", "on"]);
    for (round, kill_after) in [3usize, 17, 40, 77, 150].into_iter().enumerate() {
        let file = f.mnt().join(format!("log{round}"));
        let mut child = python(APPENDER, &[file.to_str().unwrap(), "100000"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = libc::pid_t::try_from(child.id()).unwrap();
        let mut acked = None;
        for i in acks(&mut child) {
            acked = Some(i);
            if i + 1 >= kill_after {
                // SAFETY: kill of our own child.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                break;
            }
        }
        let _ = child.wait();
        let acked = acked.expect("some acknowledged records");
        let data = std::fs::read(&file).unwrap();
        // Every acknowledged record, whole and in order; after them at most whole records
        // the writer made but had not acknowledged.
        assert!(data.len() >= 100 * (acked + 1), "round {round}: {} bytes", data.len());
        assert_eq!(data.len() % 100, 0, "round {round}: a torn record");
        let n = data.len() / 100;
        assert_eq!(data, records(0..n), "round {round}");
    }
    let d = &f.stat()["direct"];
    assert_eq!(d["taken_back"]["release"], 5, "{d}");
    assert_eq!(d["active"], 0, "{d}");
}

#[test]
fn a_forged_log_is_refused_its_valid_prefix_kept_and_nothing_else_touched() {
    if skip() {
        return;
    }
    let f = Fixture::new(&["--direct-path", "on"]);
    let other = f.mnt().join("other");
    std::fs::write(&other, b"another file, untouched").unwrap();
    let file = f.mnt().join("log");
    let mut child = python(APPENDER, &[file.to_str().unwrap(), "10", "wait", "5"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let first: Vec<usize> = acks(&mut child).take(10).collect();
    assert_eq!(first, (0..10).collect::<Vec<_>>());
    // The log, as its owner (the library's process) could write it: a record after the valid
    // prefix under the right commit word, pointing at another offset, with a wrong checksum.
    let logs: Vec<_> = std::fs::read_dir(f.logs()).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(logs.len(), 1, "{logs:?}");
    let image = std::fs::read(&logs[0]).unwrap();
    let grant = u64::from_le_bytes(image[8..16].try_into().unwrap());
    let node = u64::from_le_bytes(image[16..24].try_into().unwrap());
    let scan = direct::scan(&image, grant, node).unwrap();
    assert_eq!(scan.records.len(), 10);
    let mut forged = Vec::new();
    forged.extend_from_slice(&direct::log::commit_tag(grant, scan.next_seq).to_le_bytes());
    forged.extend_from_slice(&0u64.to_le_bytes()); // offset 0: over the first records
    forged.extend_from_slice(&8u32.to_le_bytes());
    forged.extend_from_slice(&[1, 0, 0, 0]);
    forged.extend_from_slice(&0xbad_u64.to_le_bytes()); // not the record's checksum
    forged.extend_from_slice(b"GARBAGE!");
    let mut log = std::fs::OpenOptions::new().write(true).open(&logs[0]).unwrap();
    std::io::Seek::seek(&mut log, std::io::SeekFrom::Start(scan.end)).unwrap();
    log.write_all(&forged).unwrap();
    drop(log);
    // Any request on the file takes the delegation back: the log is refused, its valid
    // prefix is the file.
    assert_eq!(std::fs::read(&file).unwrap(), records(0..10));
    let d = &f.stat()["direct"];
    assert_eq!(d["refused_logs"], 1, "{d}");
    assert_eq!(d["taken_back"]["refused_log"], 1, "{d}");
    assert_eq!(std::fs::read(&other).unwrap(), b"another file, untouched");
    // The writer goes on: its next write finds the delegation ended and asks again.
    writeln!(child.stdin.as_mut().unwrap()).unwrap();
    let more: Vec<usize> = acks(&mut child).collect();
    assert_eq!(more, (10..15).collect::<Vec<_>>());
    assert!(child.wait().unwrap().success());
    assert_eq!(std::fs::read(&file).unwrap(), records(0..15));
    let incidents = &f.stat()["incidents"];
    assert_eq!(incidents["direct_refused_log"], 1, "{incidents}");
}

#[test]
fn a_log_is_its_owners_alone_and_no_file_is_delegated_past_the_kernels_checks() {
    if skip() {
        return;
    }
    let f = Fixture::new(&["--direct-path", "on"]);
    // root's file, which nobody may read and not write.
    let secret = f.mnt().join("secret");
    std::fs::write(&secret, b"root's").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let file = f.mnt().join("log");
    let mut child = python(APPENDER, &[file.to_str().unwrap(), "3", "wait", "1"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    assert_eq!(acks(&mut child).take(3).count(), 3);
    let logs: Vec<_> = std::fs::read_dir(f.logs()).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(logs.len(), 1);
    let meta = std::fs::metadata(&logs[0]).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&meta), 0);
    // nobody, with the library: cannot open root's delegation log, cannot list the log
    // directory, cannot open root's file for writing (the kernel's check, before any grant).
    let as_nobody = |script: &str, args: &[&str]| {
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", BIN, "run", "--library"])
            .arg(library())
            .args(["--", "python3", "-c", script])
            .args(args)
            .output()
            .unwrap()
    };
    let probe = r#"
import os, sys
log, logs, secret = sys.argv[1:4]
for what, f in [("log", lambda: os.open(log, os.O_RDWR)), ("list", lambda: os.listdir(logs)),
                ("secret", lambda: os.open(secret, os.O_WRONLY))]:
    try:
        f()
        print(what, "allowed")
    except PermissionError:
        print(what, "refused")
"#;
    let out = as_nobody(
        probe,
        &[logs[0].to_str().unwrap(), f.logs().to_str().unwrap(), secret.to_str().unwrap()],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "log refused\nlist refused\nsecret refused\n");
    writeln!(child.stdin.as_mut().unwrap()).unwrap();
    assert_eq!(acks(&mut child).count(), 1);
    assert!(child.wait().unwrap().success());
    // nobody's own file: delegated to nobody, its log owned by nobody.
    let mine = f.mnt().join("nobodys");
    let out = as_nobody(APPENDER, &[mine.to_str().unwrap(), "20"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(std::fs::read(&mine).unwrap(), records(0..20));
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&mine).unwrap()), 65534);
    assert_eq!(std::fs::read(&secret).unwrap(), b"root's");
    assert_eq!(f.stat()["direct"]["granted"], 2);
}

/// Writes through the library, a duplicate, a child after fork, stdio (glibc's own write,
/// which the library does not see) and again the library, then maps the file.
const MIXED: &str = r#"
import ctypes, mmap, os, sys
path = sys.argv[1]
fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
os.write(fd, b"A" * 10); os.fsync(fd)
fd2 = os.dup(fd)
os.write(fd2, b"B" * 10); os.fdatasync(fd2)
pid = os.fork()
if pid == 0:
    os.write(fd, b"C" * 10)
    os._exit(0)
os.waitpid(pid, 0)
os.write(fd, b"D" * 10)
libc = ctypes.CDLL(None)
libc.fdopen.restype = ctypes.c_void_p
fp = libc.fdopen(os.dup(fd), b"a")
libc.fputs.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
libc.fflush.argtypes = [ctypes.c_void_p]
libc.fputs(b"E" * 10, fp); libc.fflush(fp)
os.write(fd, b"F" * 10)
assert os.fstat(fd).st_size == 60, os.fstat(fd).st_size
m = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
print(m[:].decode())
os.write(fd, b"G" * 10)
os.close(fd); os.close(fd2)
"#;

#[test]
fn dup_fork_stdio_and_mmap_keep_one_file_in_order() {
    if skip() {
        return;
    }
    let f = Fixture::new(&["--direct-path", "on"]);
    let file = f.mnt().join("mixed");
    let out = python(MIXED, &[file.to_str().unwrap()]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let want: String = "ABCDEF".chars().flat_map(|c| std::iter::repeat_n(c, 10)).collect();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), want, "the mapping");
    let all: String = "ABCDEFG".chars().flat_map(|c| std::iter::repeat_n(c, 10)).collect();
    assert_eq!(std::fs::read_to_string(&file).unwrap(), all);
    let d = &f.stat()["direct"];
    // The child's write and stdio's (or the stat of its fdopen) came through FUSE and took the
    // delegation back; the mmap ended it (asked); each time the library asked again.
    let t = &d["taken_back"];
    let through_fuse =
        ["write", "getattr", "stat"].iter().map(|k| t[k].as_u64().unwrap()).sum::<u64>();
    assert!(t["write"].as_u64().unwrap() >= 1 && through_fuse >= 2, "{d}");
    assert_eq!(d["taken_back"]["asked"], 1, "{d}");
    assert!(d["granted"].as_u64().unwrap() >= 3, "{d}");
}

const SQLITE: &str = r#"
import sqlite3, sys
path, mode, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
db = sqlite3.connect(path, isolation_level=None)
db.execute("PRAGMA journal_mode=" + mode)
db.execute("PRAGMA synchronous=FULL")
db.execute("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, v TEXT)")
for i in range(n):
    db.execute("INSERT INTO t (v) VALUES (?)", ("x" * (i % 300),))
print(db.execute("PRAGMA integrity_check").fetchone()[0], db.execute("SELECT count(*) FROM t").fetchone()[0])
db.close()
"#;

#[test]
fn sqlite_in_wal_and_rollback_journal_modes_under_the_library() {
    if skip() {
        return;
    }
    let f = Fixture::new(&["--direct-path", "on"]);
    for mode in ["wal", "delete"] {
        let db = f.mnt().join(format!("{mode}.db"));
        let out = python(SQLITE, &[db.to_str().unwrap(), mode, "300"]).output().unwrap();
        assert!(out.status.success(), "{mode}: {}", text(&out));
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok 300", "{mode}");
        // And read back without the library, in a fresh process.
        let check = Command::new("python3")
            .args(["-c", SQLITE, db.to_str().unwrap(), mode, "0"])
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&check.stdout).trim(),
            "ok 300",
            "{mode}: {}",
            text(&check)
        );
    }
    let d = &f.stat()["direct"];
    assert!(d["granted"].as_u64().unwrap() >= 2, "{d}");
    assert!(d["writes"].as_u64().unwrap() >= 300, "{d}");
}
