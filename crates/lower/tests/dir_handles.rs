//! Durable directory identities (TempFFS keys temp files by them): a directory handle survives
//! renames, and both ways of finding a directory again - `open_by_handle_at` (root) and the
//! bounded walk an unprivileged daemon uses - find the same directory.

use std::ffi::OsStr;

use lower::posix::PosixLower;
use lower::{LowerFs, MemLower, walk_for_dir};

#[test]
fn a_directory_handle_survives_a_rename_and_finds_the_directory_both_ways() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(tmp.path().join("a/b/c")).unwrap();
    std::fs::create_dir_all(tmp.path().join("x/y")).unwrap();
    let fs = PosixLower::open(tmp.path()).unwrap();
    let (dir_a, _) = fs.lookup(fs.root(), OsStr::new("a")).unwrap();
    let (dir_b, _) = fs.lookup(&dir_a, OsStr::new("b")).unwrap();
    let (dir_c, _) = fs.lookup(&dir_b, OsStr::new("c")).unwrap();
    let handle = fs.dir_handle(&dir_c).unwrap();
    assert!(!handle.is_empty() && handle.len() <= lower::MAX_DIR_HANDLE);
    // Moved elsewhere: same handle.
    std::fs::rename(tmp.path().join("a/b/c"), tmp.path().join("x/y/moved")).unwrap();
    let (dir_x, _) = fs.lookup(fs.root(), OsStr::new("x")).unwrap();
    let (dir_y, _) = fs.lookup(&dir_x, OsStr::new("y")).unwrap();
    let (moved, _) = fs.lookup(&dir_y, OsStr::new("moved")).unwrap();
    assert_eq!(fs.dir_handle(&moved).unwrap(), handle);
    assert_eq!(fs.key(&moved), fs.key(&dir_c));
    let walked = walk_for_dir(&fs, &handle, 100).unwrap();
    assert_eq!(fs.key(&walked), fs.key(&dir_c));
    let found = fs.find_dir(&handle, 100).unwrap();
    assert_eq!(fs.key(&found), fs.key(&dir_c));
    // A walk that may not visit enough directories says ENOENT, never a wrong directory.
    assert_eq!(walk_for_dir(&fs, &handle, 1).unwrap_err(), lower::Errno(libc::ENOENT));
    // The root has a handle too.
    let root_handle = fs.dir_handle(fs.root()).unwrap();
    assert_eq!(fs.key(&fs.find_dir(&root_handle, 10).unwrap()), fs.key(fs.root()));
}

#[test]
fn the_model_finds_directories_by_walking() {
    let fs = MemLower::default();
    let root = lower::Creds { uid: 0, gid: 0, groups: Vec::new() };
    let (d, _) = fs.mkdir(&root, fs.root(), OsStr::new("d"), 0o755).unwrap();
    let (e, _) = fs.mkdir(&root, &d, OsStr::new("e"), 0o755).unwrap();
    let handle = fs.dir_handle(&e).unwrap();
    assert_eq!(fs.key(&fs.find_dir(&handle, 10).unwrap()), fs.key(&e));
}
