//! End to end: a FAT volume served in user space (`device attach --mkfs vfat --fat user`, the
//! NVFAT experiment's file system on this kernel, which has no vfat) over the modeled device.
//! Needs root, /dev/fuse and dosfstools; skipped otherwise (an error under CI).
//!
//! - A table of POSIX operations with the errno FAT gives (the same as the kernel's vfat
//!   where it differs from ext4), the tree and contents after a detach and a re-attach, and
//!   `fsck.fat -n` clean.
//! - Power cuts (`device cut`) after a seeded number of operations:
//!   - `-o sync` with the NVRAM metadata cache: every acknowledged write survives, with its
//!     content, and the volume checks clean;
//!   - the default (async) with the NVRAM cache (metadata written through: NVFAT): the tree
//!     (every name, every directory) survives and the volume checks clean; an fsynced file
//!     keeps its content;
//!   - async without NVRAM (write-back at fsync only): the volume at the last fsync, clean,
//!     fsynced files intact, later operations lost (the control: the cut is real).
//!
//! Replay one seed: `NVSTACK_SEED=3 cargo test -p nvstack --test device_userfat -- --nocapture`.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::device::{Attached, dev_ok};

/// Path -> content (`None`: a directory).
type Tree = BTreeMap<String, Option<Vec<u8>>>;
/// Path -> content of the files whose last change was fsynced.
type Synced = BTreeMap<String, Vec<u8>>;

fn dosfstools() -> bool {
    ["/usr/sbin/mkfs.vfat", "/sbin/mkfs.vfat", "/usr/sbin/fsck.fat", "/sbin/fsck.fat"]
        .iter()
        .any(|p| Path::new(p).exists())
}

macro_rules! require_fat_env {
    () => {
        require_device_env!();
        if !dosfstools() {
            assert!(std::env::var_os("CI").is_none(), "cannot run in CI: dosfstools missing");
            eprintln!("SKIP {}: dosfstools not installed", module_path!());
            return;
        }
    };
}

fn fsck(img: &Path) -> (i32, String) {
    let out = Command::new("fsck.fat").arg("-n").arg(img).output().expect("fsck.fat");
    let text =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.code().unwrap_or(-1), text)
}

/// fsck.fat -n on a copy whose dirty flag (set while mounted, left set by a power cut, as any
/// FAT driver leaves it) is cleared.
fn fsck_after_cut(img: &Path) -> (i32, String) {
    let copy = img.with_extension("fsck");
    let mut bytes = fs::read(img).unwrap();
    let fat32 = u16::from_le_bytes([bytes[0x16], bytes[0x17]]) == 0;
    bytes[if fat32 { 0x41 } else { 0x25 }] &= !1;
    fs::write(&copy, bytes).unwrap();
    let r = fsck(&copy);
    let _ = fs::remove_file(&copy);
    r
}

fn errno_of<T>(r: std::io::Result<T>) -> Option<i32> {
    r.err().and_then(|e| e.raw_os_error())
}

/// Every path under `root` with its content (`None` for a directory).
fn tree(root: &Path) -> Tree {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            if p.is_dir() {
                out.insert(rel, None);
                stack.push(p);
            } else {
                out.insert(rel, Some(fs::read(&p).unwrap()));
            }
        }
    }
    out
}

fn content(tag: u64, len: usize) -> Vec<u8> {
    format!("file {tag:08}|").into_bytes().into_iter().cycle().take(len).collect()
}

fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

#[test]
fn a_fat_volume_served_in_user_space_answers_as_fat_does_and_checks_clean() {
    require_fat_env!();
    let tmp = tempfile::tempdir().unwrap();
    let (img, mp) = (tmp.path().join("fat.img"), tmp.path().join("mnt"));
    let a = Attached::new(
        &img,
        &mp,
        &["--model", "none", "--size", "32M", "--mkfs", "vfat", "--fat", "user"],
    );
    let p = |s: &str| mp.join(s);
    fs::create_dir(p("dir")).unwrap();
    fs::create_dir(p("dir/sub")).unwrap();
    fs::write(p("dir/a long file name.txt"), content(1, 5000)).unwrap();
    fs::write(p("small"), b"x").unwrap();
    fs::create_dir(p("other")).unwrap();
    let free_before = nix_statvfs_free(&mp);
    fs::write(p("dir/sub/big"), content(2, 300_000)).unwrap();
    assert!(nix_statvfs_free(&mp) < free_before, "statfs follows allocation");

    errno_table(&mp);
    // Names are case-insensitive and read back as stored.
    assert_eq!(fs::read(p("DIR/A LONG FILE NAME.TXT")).unwrap(), content(1, 5000));
    let names: Vec<String> = fs::read_dir(p("dir"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(names.contains(&"a long file name.txt".to_string()), "{names:?}");
    // Sizes: grow with zeros, shrink, write past the end with a hole of zeros.
    let f = fs::OpenOptions::new().write(true).open(p("victim")).unwrap();
    f.set_len(10_000).unwrap();
    f.set_len(2).unwrap();
    drop(f);
    let mut f = fs::OpenOptions::new().write(true).open(p("dir/a long file name.txt")).unwrap();
    std::os::unix::fs::FileExt::write_at(&f, b"tail", 9000).unwrap();
    f.flush().unwrap();
    drop(f);
    let mut want = content(1, 5000);
    want.resize(9000, 0);
    want.extend_from_slice(b"tail");
    assert_eq!(fs::read(p("dir/a long file name.txt")).unwrap(), want);
    assert_eq!(fs::read(p("victim")).unwrap(), b"ne");
    // O_TRUNC empties; O_APPEND appends.
    fs::OpenOptions::new().write(true).truncate(true).open(p("other/small2")).unwrap();
    assert_eq!(fs::metadata(p("other/small2")).unwrap().len(), 0);
    let mut f = fs::OpenOptions::new().append(true).custom_flags(0).open(p("victim")).unwrap();
    f.write_all(b"+").unwrap();
    drop(f);
    assert_eq!(fs::read(p("victim")).unwrap(), b"ne+");

    let before = tree(&mp);
    a.detach();
    let (rc, t) = fsck(&img);
    assert_eq!(rc, 0, "fsck.fat -n after detach:\n{t}");
    let a = Attached::new(&img, &mp, &["--model", "none", "--fat", "user"]);
    assert_eq!(tree(&mp), before, "the tree after a re-attach");
    a.detach();
}

/// Operations with the errno FAT answers, and a few that succeed (errno `None`).
fn errno_table(mp: &Path) {
    let p = |s: &str| mp.join(s);
    let excl = fs::OpenOptions::new().write(true).create_new(true).open(p("small"));
    let mut table: Vec<(&str, Option<i32>, Option<i32>)> = vec![
        ("create O_EXCL over a file", errno_of(excl), Some(libc::EEXIST)),
        ("mkdir over a file", errno_of(fs::create_dir(p("small"))), Some(libc::EEXIST)),
        (
            "rmdir of a non-empty directory",
            errno_of(fs::remove_dir(p("dir"))),
            Some(libc::ENOTEMPTY),
        ),
        ("unlink of a directory", errno_of(fs::remove_file(p("dir/sub"))), Some(libc::EISDIR)),
        ("rmdir of a file", errno_of(fs::remove_dir(p("small"))), Some(libc::ENOTDIR)),
        ("open of a missing file", errno_of(fs::read(p("nope"))), Some(libc::ENOENT)),
        (
            "symlink (FAT has none)",
            errno_of(std::os::unix::fs::symlink("small", p("link"))),
            Some(libc::EPERM),
        ),
        ("hard link", errno_of(fs::hard_link(p("small"), p("hard"))), Some(libc::EPERM)),
        (
            "chmod to a mode FAT cannot store",
            errno_of(fs::set_permissions(
                p("small"),
                std::os::unix::fs::PermissionsExt::from_mode(0o600),
            )),
            Some(libc::EPERM),
        ),
        (
            "a directory moved to another directory (fatfs keeps its '..')",
            errno_of(fs::rename(p("dir/sub"), p("other/sub"))),
            Some(libc::EXDEV),
        ),
        (
            "a directory moved into itself",
            errno_of(fs::rename(p("dir"), p("dir/sub/dir"))),
            Some(libc::EINVAL),
        ),
        (
            "a name with a character FAT forbids",
            errno_of(fs::write(p("a*b"), b"")),
            Some(libc::EINVAL),
        ),
        (
            "a name of 256 bytes",
            errno_of(fs::write(p(&"n".repeat(256)), b"")),
            Some(libc::ENAMETOOLONG),
        ),
    ];
    // Successes.
    table.push((
        "rename a file to another directory",
        errno_of(fs::rename(p("small"), p("other/small2"))),
        None,
    ));
    table.push((
        "rename a directory in its directory",
        errno_of(fs::rename(p("dir/sub"), p("dir/sub2"))),
        None,
    ));
    fs::write(p("victim"), b"old").unwrap();
    fs::write(p("winner"), b"new").unwrap();
    table.push((
        "rename over an existing file",
        errno_of(fs::rename(p("winner"), p("victim"))),
        None,
    ));
    let mut bad = Vec::new();
    for (what, got, want) in &table {
        if got != want {
            bad.push(format!("{what}: got errno {got:?}, want {want:?}"));
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

fn nix_statvfs_free(p: &Path) -> u64 {
    let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
    // SAFETY: c is a valid path; st is written by the call.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &raw mut st) }, 0);
    st.f_bfree * st.f_frsize
}

/// A seeded workload of creates, appends, mkdirs and unlinks; returns the expected tree after
/// each completed operation is acknowledged, plus the files fsynced (with their content).
fn workload(mp: &Path, seed: u64, ops: u64, fsync_some: bool) -> (Tree, Synced) {
    let mut want = Tree::new();
    let mut synced = BTreeMap::new();
    let dirs = ["d0", "d1", "d2"];
    for d in dirs {
        fs::create_dir(mp.join(d)).unwrap();
        want.insert(d.to_string(), None);
    }
    for i in 0..ops {
        let r = mix(seed * 1000 + i);
        let name = format!("{}/file{:03}", dirs[(r % 3) as usize], r % 40);
        let path = mp.join(&name);
        match (r >> 8) % 4 {
            0 if want.contains_key(&name) => {
                fs::remove_file(&path).unwrap();
                want.remove(&name);
                synced.remove(&name);
            }
            1 => {
                let d = format!("{}/sub{}", dirs[(r % 3) as usize], i);
                fs::create_dir(mp.join(&d)).unwrap();
                want.insert(d, None);
            }
            _ => {
                let add = content(i, 100 + (r >> 16) as usize % 3000);
                let mut f = fs::OpenOptions::new().create(true).append(true).open(&path).unwrap();
                f.write_all(&add).unwrap();
                let v = want.entry(name.clone()).or_insert_with(|| Some(Vec::new()));
                v.as_mut().unwrap().extend_from_slice(&add);
                if fsync_some && (r >> 24) % 3 == 0 {
                    f.sync_all().unwrap();
                    synced.insert(name.clone(), v.clone().unwrap());
                } else {
                    synced.remove(&name);
                }
            }
        }
    }
    (want, synced)
}

fn seeds() -> Vec<u64> {
    match std::env::var("NVSTACK_SEED") {
        Ok(s) => vec![s.parse().expect("NVSTACK_SEED is a number")],
        Err(_) => vec![1, 2, 3],
    }
}

/// Attach (flash model, account timing), run the workload, cut the power, drain the region
/// into the image offline, check it, attach again and return the tree.
fn cut_and_recover(
    seed: u64,
    mount_options: &str,
    nvram: bool,
    fsync_some: bool,
) -> (Tree, Synced, Tree) {
    let tmp = tempfile::tempdir().unwrap();
    let shm = tempfile::Builder::new().prefix("nvstack-userfat").tempdir_in("/dev/shm").unwrap();
    let (img, mp) = (tmp.path().join("fat.img"), tmp.path().join("mnt"));
    let region = shm.path().join("cache.nv");
    let region_s = region.to_str().unwrap().to_string();
    let mut args = vec!["--model", "flash", "--size", "32M", "--mkfs", "vfat", "--fat", "user"];
    if !mount_options.is_empty() {
        args.extend(["--mount-options", mount_options]);
    }
    if nvram {
        args.extend(["--nvram", &region_s, "--nvram-cache-size", "128K"]);
    }
    let a = Attached::new(&img, &mp, &args);
    let ops = 20 + mix(seed) % 60;
    let (want, synced) = workload(&mp, seed, ops, fsync_some);
    a.cut(seed);
    if nvram {
        dev_ok(&["drain", img.to_str().unwrap(), "--nvram", &region_s]);
    }
    let checked = if nvram || mount_options.contains("sync") || mount_options.contains("expire") {
        let (rc, t) = fsck_after_cut(&img);
        assert_eq!(
            rc, 0,
            "seed {seed} ({mount_options}, nvram {nvram}): fsck.fat -n after the cut:\n{t}"
        );
        true
    } else {
        false
    };
    eprintln!(
        "seed {seed}: {ops} operations, cut, fsck {}",
        if checked { "clean" } else { "not expected clean" }
    );
    // Mount what survived (no NVRAM: drained already) and read it.
    let a = Attached::new(&img, &mp, &["--model", "none", "--fat", "user"]);
    let got = tree(&mp);
    a.cut(0); // leave the image as it was recovered
    (want, synced, got)
}

#[test]
fn sync_power_cuts_with_the_nvram_cache_keep_every_acknowledged_write() {
    require_fat_env!();
    for seed in seeds() {
        let (want, _, got) = cut_and_recover(seed, "sync", true, false);
        assert_eq!(
            got, want,
            "seed {seed}: the tree after the cut is the tree every acknowledged operation made"
        );
    }
}

#[test]
fn nvfat_async_power_cuts_keep_the_tree_and_fsynced_files() {
    require_fat_env!();
    for seed in seeds() {
        let (want, synced, got) = cut_and_recover(seed, "", true, true);
        let names = |t: &Tree| -> Vec<(String, bool)> {
            t.iter().map(|(k, v)| (k.clone(), v.is_none())).collect()
        };
        assert_eq!(
            names(&got),
            names(&want),
            "seed {seed}: every name and directory survives (metadata in NVRAM)"
        );
        for (name, data) in &synced {
            assert_eq!(got[name].as_deref(), Some(&data[..]), "seed {seed}: fsynced {name}");
        }
    }
}

/// Without NVRAM and with write-back only at fsync (expire=3600), the volume after a cut is
/// the volume at the last fsync: consistent, fsynced files intact, later operations lost (the
/// control that shows the cut is real).
#[test]
fn async_without_nvram_keeps_fsynced_files_and_loses_the_rest() {
    require_fat_env!();
    let mut lost = 0;
    for seed in seeds() {
        let (want, synced, got) = cut_and_recover(seed, "expire=3600", false, true);
        for (name, data) in &synced {
            assert_eq!(
                got.get(name).and_then(|v| v.as_deref()),
                Some(&data[..]),
                "seed {seed}: fsynced {name}"
            );
        }
        lost += usize::from(got != want);
    }
    assert!(lost > 0, "no seed lost an operation that was not fsynced: the cut did not cut");
}

#[test]
fn a_user_fat_server_refuses_options_it_does_not_know_and_volumes_that_are_not_fat() {
    require_fat_env!();
    let tmp = tempfile::tempdir().unwrap();
    let (img, mp) = (tmp.path().join("fat.img"), tmp.path().join("mnt"));
    let out = common::device::dev(&[
        "attach",
        img.to_str().unwrap(),
        mp.to_str().unwrap(),
        "--model",
        "none",
        "--size",
        "32M",
        "--mkfs",
        "vfat",
        "--fat",
        "user",
        "--mount-options",
        "uid=1000",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("uid=1000") && err.contains("FAT server"), "{err}");
    let img2 = tmp.path().join("blank.img");
    let out = common::device::dev(&[
        "attach",
        img2.to_str().unwrap(),
        mp.to_str().unwrap(),
        "--model",
        "none",
        "--size",
        "1M",
        "--fat",
        "user",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--fat user"), "{err}");
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!info.contains(mp.to_str().unwrap()), "nothing left mounted");
    let _ = PathBuf::new();
}
