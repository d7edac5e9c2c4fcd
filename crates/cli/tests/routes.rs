//! Routes (docs/design.md section 14): which opens the kernel serves in passthrough, and every
//! transition between the two routes of one file - fsynced, opened by two openers, truncated,
//! renamed and deleted while open, mmapped, written in passthrough and then read through the
//! NVRAM path - with no write lost and no stale read. Needs root and /dev/fuse, and a kernel
//! with FUSE passthrough (6.9+; the tests say so and check the fallback when it is missing).

mod common;

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_nvstack");

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// A lower directory, a mount point and a region, removed at the end (unmounted first).
struct Mount {
    dir: tempfile::TempDir,
    shm: tempfile::TempDir,
    mounted: bool,
}

impl Mount {
    fn new(extra: &[&str]) -> Mount {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("lower")).unwrap();
        std::fs::create_dir(dir.path().join("mnt")).unwrap();
        let shm = tempfile::Builder::new().prefix("nvstack-routes").tempdir_in("/dev/shm").unwrap();
        let mut m = Mount { dir, shm, mounted: false };
        m.mount(extra);
        m
    }
    fn lower(&self, name: &str) -> PathBuf {
        self.dir.path().join("lower").join(name)
    }
    fn mnt(&self, name: &str) -> PathBuf {
        self.dir.path().join("mnt").join(name)
    }
    fn mount(&mut self, extra: &[&str]) {
        let (lower, mnt, nvram) = (self.lower(""), self.mnt(""), self.shm.path().join("region"));
        let mut args = vec!["mount", lower.to_str().unwrap(), mnt.to_str().unwrap()];
        args.extend(["--nvram", nvram.to_str().unwrap(), "--size", "32M"]);
        args.extend_from_slice(extra);
        let out = Command::new(BIN).args(&args).output().unwrap();
        assert!(out.status.success(), "mount: {}", text(&out));
        self.mounted = true;
    }
    fn umount(&mut self) {
        let out = common::nvstack_umount(&self.mnt(""));
        assert!(out.status.success(), "umount: {}", text(&out));
        self.mounted = false;
    }
    fn stat(&self) -> serde_json::Value {
        let out = Command::new(BIN).args(["stat", "--json"]).arg(self.mnt("")).output().unwrap();
        assert!(out.status.success(), "stat: {}", text(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    }
    fn routes(&self) -> serde_json::Value {
        self.stat()["passthrough"].clone()
    }
    fn count(&self, counter: &str) -> u64 {
        self.routes()[counter].as_u64().unwrap_or_else(|| panic!("counter {counter}"))
    }
    /// Waits (bounded) until the daemon has seen every RELEASE: the kernel sends it after
    /// close returns, asynchronously, and an open before it would follow the earlier opens'
    /// route.
    fn released(&self) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while self.stat()["open_handles"].as_u64() != Some(0) {
            assert!(std::time::Instant::now() < deadline, "releases never arrived");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
    /// `nvstack flush`: temp files transformed, dirty pages written back (no NVRAM state left).
    fn flush(&self) {
        let out = Command::new(BIN).arg("flush").arg(self.mnt("")).output().unwrap();
        assert!(out.status.success(), "flush: {}", text(&out));
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if self.mounted {
            let _ = common::nvstack_umount(&self.mnt(""));
        }
        common::remove_run_dir(&self.mnt(""));
    }
}

/// Root, /dev/fuse and a kernel that takes passthrough (checked by one open); `None` skips.
fn mount(extra: &[&str]) -> Option<Mount> {
    if common::skip("the route tests") {
        return None;
    }
    let m = Mount::new(extra);
    std::fs::write(m.lower("probe"), b"probe").unwrap();
    assert_eq!(std::fs::read(m.mnt("probe")).unwrap(), b"probe");
    if m.count("opens_passthrough") == 0 {
        let r = m.routes();
        assert!(!r["enabled"].as_bool().unwrap(), "an open refused without turning it off: {r}");
        assert!(std::env::var_os("NVSTACK_REQUIRE_PASSTHROUGH").is_none(), "no passthrough: {r}");
        eprintln!("SKIP: this kernel or daemon has no FUSE passthrough ({r})");
        return None;
    }
    Some(m)
}

/// A shared read-write mapping of the first `len` bytes of `f`, unmapped on drop.
struct Mapping {
    at: *mut u8,
    len: usize,
}

impl Mapping {
    fn new(f: &File, len: usize) -> Mapping {
        let fd = std::os::fd::AsRawFd::as_raw_fd(f);
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        // SAFETY: a fresh shared mapping of an open file; used only through `bytes`.
        let at = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, fd, 0) };
        assert_ne!(at, libc::MAP_FAILED, "mmap: {}", std::io::Error::last_os_error());
        Mapping { at: at.cast(), len }
    }
    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: the mapping is `len` bytes and lives as long as `self`.
        unsafe { std::slice::from_raw_parts_mut(self.at, self.len) }
    }
    fn sync(&self) {
        // SAFETY: msync of the whole mapping.
        assert_eq!(unsafe { libc::msync(self.at.cast(), self.len, libc::MS_SYNC) }, 0);
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps what `new` mapped.
        unsafe { libc::munmap(self.at.cast(), self.len) };
    }
}

fn read_all(f: &mut File) -> Vec<u8> {
    let mut v = Vec::new();
    f.seek(SeekFrom::Start(0)).unwrap();
    f.read_to_end(&mut v).unwrap();
    v
}

fn open_rw(p: &Path, flags: i32) -> File {
    OpenOptions::new().read(true).write(true).custom_flags(flags).open(p).unwrap()
}

#[test]
fn a_file_only_read_or_streamed_is_served_by_the_kernel_and_sees_every_byte() {
    let Some(m) = mount(&[]) else { return };
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(m.lower("big"), &data).unwrap();
    let before = m.stat()["requests"]["read"].as_u64().unwrap_or(0);
    assert_eq!(std::fs::read(m.mnt("big")).unwrap(), data);
    // Streamed writes through the kernel reach the lower file at once; the engine sees none.
    let mut f = open_rw(&m.mnt("big"), 0);
    f.seek(SeekFrom::Start(1000)).unwrap();
    f.write_all(b"streamed").unwrap();
    assert_eq!(&std::fs::read(m.lower("big")).unwrap()[1000..1008], b"streamed");
    drop(f);
    let s = m.stat();
    assert_eq!(s["requests"]["read"].as_u64().unwrap_or(0), before, "no READ reached the daemon");
    assert!(s["requests"]["write"].as_u64().unwrap_or(0) == 0, "no WRITE reached the daemon");
    assert!(s["passthrough"]["opens_passthrough"].as_u64().unwrap() >= 3);
    assert_eq!(s["cache"]["files"].as_u64().unwrap(), 0, "nothing of it in NVRAM");
}

#[test]
fn a_file_fsynced_in_passthrough_is_durable_at_once_and_takes_the_nvram_path_from_its_next_open_also_after_a_remount()
 {
    let Some(mut m) = mount(&[]) else { return };
    std::fs::write(m.lower("db"), vec![b'a'; 8192]).unwrap();
    let mut f = open_rw(&m.mnt("db"), 0);
    f.write_all(b"commit-1").unwrap();
    f.sync_all().unwrap();
    assert_eq!(&std::fs::read(m.lower("db")).unwrap()[..8], b"commit-1", "synced in the lower");
    drop(f);
    m.released();
    let r = m.routes();
    assert_eq!((r["fsyncs"].as_u64(), r["learned_fsync"].as_u64()), (Some(1), Some(1)), "{r}");
    // The next open takes the NVRAM path: the write lands in NVRAM, not in the lower file.
    let mut f = open_rw(&m.mnt("db"), 0);
    f.write_all(b"commit-2").unwrap();
    f.sync_all().unwrap();
    assert_eq!(&read_all(&mut f)[..8], b"commit-2");
    assert_eq!(&std::fs::read(m.lower("db")).unwrap()[..8], b"commit-1", "in NVRAM only");
    drop(f);
    assert_eq!(m.count("nvram_because_profile"), 1);
    assert_eq!(m.count("fsyncs"), 1, "the second fsync did not wait for the lower file");
    // The profile is durable: after a remount (dirty pages written back at unmount) the file
    // has no NVRAM state but still takes the NVRAM path.
    m.umount();
    assert_eq!(&std::fs::read(m.lower("db")).unwrap()[..8], b"commit-2");
    m.mount(&[]);
    let mut f = open_rw(&m.mnt("db"), 0);
    assert_eq!(&read_all(&mut f)[..8], b"commit-2");
    drop(f);
    let r = m.routes();
    assert_eq!(r["profile_files"].as_u64(), Some(1), "{r}");
    assert_eq!(r["nvram_because_profile"].as_u64(), Some(1), "{r}");
}

#[test]
fn a_second_opener_takes_the_first_openers_route_and_both_see_each_others_writes() {
    let Some(m) = mount(&[]) else { return };
    std::fs::write(m.lower("shared"), b"0123456789").unwrap();
    let mut reader = File::open(m.mnt("shared")).unwrap();
    // O_DSYNC alone would keep the NVRAM path; while `a` is open it follows passthrough, and
    // its writes are synchronous in the lower file system.
    let mut writer = open_rw(&m.mnt("shared"), libc::O_DSYNC);
    writer.write_all(b"AB").unwrap();
    assert_eq!(read_all(&mut reader), b"AB23456789");
    assert_eq!(std::fs::read(m.lower("shared")).unwrap(), b"AB23456789");
    let r = m.routes();
    assert_eq!(r["passthrough_because_open"].as_u64(), Some(1), "{r}");
    assert_eq!(r["passthrough_nodes"].as_u64(), Some(1), "{r}");
    drop((reader, writer));
    m.released();
    // Both closed: a new O_DSYNC open is free to take the NVRAM path (and is learned).
    let mut again = open_rw(&m.mnt("shared"), libc::O_DSYNC);
    again.write_all(b"CD").unwrap();
    assert_eq!(read_all(&mut again), b"CD23456789");
    assert_eq!(std::fs::read(m.lower("shared")).unwrap(), b"AB23456789", "in NVRAM");
    drop(again);
    let r = m.routes();
    assert_eq!(r["nvram_because_sync_flag"].as_u64(), Some(1), "{r}");
    assert_eq!(r["learned_sync_flag"].as_u64(), Some(1), "{r}");
}

#[test]
fn passthrough_writes_are_not_hidden_by_the_page_cache_of_an_earlier_nvram_open() {
    let Some(m) = mount(&[]) else { return };
    // A temp file (NVRAM path), read so that the kernel caches its page, then transformed:
    // the lower file has no NVRAM state, so the next open takes passthrough.
    std::fs::write(m.mnt("t"), b"old-old-old").unwrap();
    assert_eq!(std::fs::read(m.mnt("t")).unwrap(), b"old-old-old");
    m.flush();
    assert_eq!(std::fs::read(m.lower("t")).unwrap(), b"old-old-old");
    let mut f = open_rw(&m.mnt("t"), 0);
    f.write_all(b"NEW").unwrap();
    drop(f);
    m.released();
    assert!(m.count("opens_passthrough") >= 1);
    // An O_DSYNC open takes the NVRAM path again: it must not read the cached "old" page (T3).
    let mut g = open_rw(&m.mnt("t"), libc::O_DSYNC);
    assert_eq!(read_all(&mut g), b"NEW-old-old");
    assert_eq!(m.count("nvram_because_sync_flag"), 1);
}

#[test]
fn truncate_rename_and_unlink_of_a_file_open_in_passthrough_lose_no_write() {
    let Some(m) = mount(&[]) else { return };
    std::fs::write(m.lower("f"), vec![b'x'; 20_000]).unwrap();
    let mut f = open_rw(&m.mnt("f"), 0);
    f.write_all(b"head").unwrap();
    // Truncate by path while open: both views agree.
    std::fs::OpenOptions::new().write(true).open(m.mnt("f")).unwrap().set_len(100).unwrap();
    assert_eq!(f.metadata().unwrap().len(), 100);
    assert_eq!(read_all(&mut f).len(), 100);
    assert_eq!(std::fs::metadata(m.lower("f")).unwrap().len(), 100);
    // Renamed while open: writes through the open file land in the renamed file.
    std::fs::rename(m.mnt("f"), m.mnt("g")).unwrap();
    f.seek(SeekFrom::Start(100)).unwrap();
    f.write_all(b"tail").unwrap();
    let g = std::fs::read(m.mnt("g")).unwrap();
    assert_eq!((&g[..4], &g[100..]), (&b"head"[..], &b"tail"[..]));
    assert_eq!(std::fs::read(m.lower("g")).unwrap(), g);
    // Deleted while open: still readable and writable through the open file, gone after.
    std::fs::remove_file(m.mnt("g")).unwrap();
    f.write_all(b"!").unwrap();
    assert_eq!(read_all(&mut f).len(), 105);
    assert!(!m.lower("g").exists());
    drop(f);
    assert!(!m.mnt("g").exists());
    m.released(); // open_handles reaches 0
}

#[test]
fn a_shared_mapping_of_a_passthrough_file_writes_the_lower_file() {
    let Some(m) = mount(&[]) else { return };
    std::fs::write(m.lower("map"), vec![0u8; 8192]).unwrap();
    let f = open_rw(&m.mnt("map"), 0);
    let mut map = Mapping::new(&f, 8192);
    map.bytes()[4096..4102].copy_from_slice(b"mapped");
    map.sync();
    drop(map);
    drop(f);
    assert_eq!(&std::fs::read(m.lower("map")).unwrap()[4096..4102], b"mapped");
    assert_eq!(&std::fs::read(m.mnt("map")).unwrap()[4096..4102], b"mapped");
    assert!(m.count("opens_passthrough") >= 2);
}

#[test]
fn set_id_files_and_files_with_dirty_pages_keep_the_nvram_path() {
    let Some(m) = mount(&["--nbw", "off"]) else { return };
    std::fs::write(m.lower("suid"), b"#!/bin/sh\n").unwrap();
    std::fs::set_permissions(m.lower("suid"), std::fs::Permissions::from_mode(0o4755)).unwrap();
    assert_eq!(std::fs::read(m.mnt("suid")).unwrap(), b"#!/bin/sh\n");
    assert_eq!(m.count("nvram_because_setid"), 1);
    // Dirty pages in NVRAM: written through an O_DSYNC open (NVRAM path), then opened plainly.
    std::fs::write(m.lower("dirty"), vec![b'-'; 4096]).unwrap();
    open_rw(&m.mnt("dirty"), libc::O_DSYNC).write_all(b"dirty").unwrap();
    assert_eq!(m.stat()["cache"]["files"].as_u64(), Some(1));
    assert_eq!(&std::fs::read(m.mnt("dirty")).unwrap()[..5], b"dirty");
    assert!(m.count("nvram_because_state") + m.count("nvram_because_profile") >= 1);
}

#[test]
fn with_passthrough_off_every_open_takes_the_nvram_path() {
    if common::skip("the route tests") {
        return;
    }
    let m = Mount::new(&["--passthrough", "off"]);
    std::fs::write(m.lower("f"), b"lower").unwrap();
    assert_eq!(std::fs::read(m.mnt("f")).unwrap(), b"lower");
    let r = m.routes();
    assert_eq!((r["enabled"].as_bool(), r["opens_passthrough"].as_u64()), (Some(false), Some(0)));
    assert!(r["opens_nvram"].as_u64().unwrap() >= 1, "{r}");
}

#[test]
fn with_direct_io_nvram_a_temp_file_takes_one_request_per_write_and_mmap_still_sees_every_byte() {
    if common::skip("the route tests") {
        return;
    }
    let m = Mount::new(&["--direct-io", "nvram"]);
    let writes = |m: &Mount| m.stat()["requests"]["write"].as_u64().unwrap_or(0);
    let mut f = open_rw(&m.mnt("t"), libc::O_CREAT);
    let before = writes(&m);
    // Three writes that each start inside a page: through the page cache the last two would
    // be split after their first page (two requests each).
    for _ in 0..3 {
        f.write_all(&[b'w'; 10_000]).unwrap();
    }
    assert_eq!(writes(&m) - before, 3, "one request per write(2)");
    assert_eq!(m.stat()["tempfiles"]["files_resident"].as_u64(), Some(1), "a temp file");
    // A shared mapping of the direct-IO file: stores reach the file, and read(2) (a request to
    // the daemon, past the mapping's pages) sees them; a write(2) is seen through the mapping.
    let mut map = Mapping::new(&f, 8192);
    map.bytes()[100..106].copy_from_slice(b"mapped");
    map.sync();
    let mut g = File::open(m.mnt("t")).unwrap();
    assert_eq!(&read_all(&mut g)[100..106], b"mapped");
    g.sync_all().unwrap();
    open_rw(&m.mnt("t"), 0).write_all_at(b"pwrite", 200).unwrap();
    assert_eq!(&map.bytes()[200..206], b"pwrite", "the mapping sees a later write(2)");
    drop(map);
    let all = read_all(&mut f);
    assert_eq!(all.len(), 30_000);
    assert_eq!((&all[100..106], &all[200..206]), (&b"mapped"[..], &b"pwrite"[..]));
}

#[test]
fn by_default_a_write_only_open_of_a_temp_file_is_direct_io_and_still_removes_set_id_bits() {
    if common::skip("the route tests") {
        return;
    }
    // The default (--direct-io write-only): a file created for writing only, as mail
    // delivery, tar and cp make theirs.
    let m = Mount::new(&[]);
    let requests = |k: &str| m.stat()["requests"][k].as_u64().unwrap_or(0);
    let f = OpenOptions::new().write(true).create_new(true).open(m.mnt("msg")).unwrap();
    let (writes, xattrs) = (requests("write"), requests("getxattr"));
    for i in 0..3u64 {
        f.write_all_at(&[b'm'; 10_000], i * 10_000).unwrap();
    }
    assert_eq!(requests("write") - writes, 3, "one request per write(2)");
    assert_eq!(requests("getxattr") - xattrs, 0, "no security.capability query before writing");
    f.sync_all().unwrap();
    drop(f);
    assert_eq!(m.stat()["tempfiles"]["files_resident"].as_u64(), Some(1), "a temp file");
    assert_eq!(std::fs::read(m.mnt("msg")).unwrap(), vec![b'm'; 30_000]);
    // On this path the kernel leaves the removal of set-ID bits to nvstack
    // (FUSE_WRITE_KILL_SUIDGID): a write by a user without CAP_FSETID removes them, and the
    // next stat shows it.
    std::fs::set_permissions(m.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(m.mnt("msg"), std::fs::Permissions::from_mode(0o6777)).unwrap();
    let out = Command::new("sh")
        .args(["-c", "printf x >> msg"])
        .current_dir(m.mnt(""))
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let meta = std::fs::metadata(m.mnt("msg")).unwrap();
    assert_eq!(meta.permissions().mode() & 0o7777, 0o777, "set-ID bits removed");
    assert_eq!(meta.len(), 30_001);
}

#[test]
fn a_write_only_open_of_a_temp_file_bypasses_the_page_cache_and_readers_of_it_stay_coherent() {
    if common::skip("the route tests") {
        return;
    }
    // --direct-io write-only: the writer is a direct-IO open, the reader a cached one, of
    // the same temp file at once.
    let m = Mount::new(&["--direct-io", "write-only"]);
    let writes = |m: &Mount| m.stat()["requests"]["write"].as_u64().unwrap_or(0);
    let w = OpenOptions::new().write(true).create(true).truncate(true).open(m.mnt("mix")).unwrap();
    let before = writes(&m);
    for i in 0..3u64 {
        w.write_all_at(&[b'A'; 10_000], i * 10_000).unwrap();
    }
    assert_eq!(writes(&m) - before, 3, "one request per write(2) of a write-only open");
    let r = File::open(m.mnt("mix")).unwrap();
    let mut page = [0u8; 10];
    r.read_exact_at(&mut page, 5000).unwrap();
    assert_eq!(&page, b"AAAAAAAAAA");
    // The reader cached that page; a direct write over it must not leave it stale.
    w.write_all_at(b"BBBBBBBBBB", 5000).unwrap();
    r.read_exact_at(&mut page, 5000).unwrap();
    assert_eq!(&page, b"BBBBBBBBBB", "the cached reader sees the direct write");
    w.set_len(100).unwrap();
    assert_eq!(r.metadata().unwrap().len(), 100);
    let mut all = Vec::new();
    (&r).read_to_end(&mut all).unwrap();
    assert_eq!(all.len(), 100, "nor a truncate");
}
