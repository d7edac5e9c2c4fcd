//! Crash behaviour of `MemLower`: what survives `crash()` follows the module's rules (fsync makes
//! a file's data durable, fsyncdir its directory's names), and seeded crashes (`crash_with`)
//! replay exactly and always leave a consistent tree.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};

use lower::{Creds, Errno, FileKind, LowerFs, MemConfig, MemLower, SetAttr};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const ROOT: Creds = Creds { uid: 0, gid: 0, groups: Vec::new() };

fn name(s: &str) -> &OsStr {
    OsStr::new(s)
}

fn walk(l: &MemLower, path: &str) -> lower::Result<<MemLower as LowerFs>::Node> {
    let (mut node, _) = l.lookup(l.root(), name("."))?;
    for part in path.split('/').filter(|p| !p.is_empty()) {
        node = l.lookup(&node, name(part))?.0;
    }
    Ok(node)
}

fn contents(l: &MemLower, path: &str) -> lower::Result<Vec<u8>> {
    let node = walk(l, path)?;
    let size = l.getattr(&node)?.size;
    let file = l.open(&node, libc::O_RDONLY)?;
    let mut buf = vec![0u8; usize::try_from(size).unwrap()];
    let n = l.read(&file, 0, &mut buf)?;
    buf.truncate(n);
    Ok(buf)
}

fn fsync_dir(l: &MemLower, path: &str) {
    let dir = l.opendir(&walk(l, path).unwrap()).unwrap();
    l.fsyncdir(&dir, false).unwrap();
}

fn names(l: &MemLower, path: &str) -> Vec<String> {
    let dir = l.opendir(&walk(l, path).unwrap()).unwrap();
    let mut out = Vec::new();
    l.readdir(&dir, 0, &mut |e| {
        out.push(e.name.into_string().unwrap());
        true
    })
    .unwrap();
    out.retain(|n| n != "." && n != "..");
    out.sort();
    out
}

/// Everything observable, by path: kind, size, nlink, mode, data (or target), xattr names.
fn dump(l: &MemLower) -> BTreeMap<String, String> {
    fn visit(l: &MemLower, path: &str, out: &mut BTreeMap<String, String>) {
        let node = walk(l, path).unwrap();
        let a = l.getattr(&node).unwrap();
        let body = match a.kind() {
            FileKind::Regular => format!("{:?}", contents(l, path).unwrap()),
            FileKind::Symlink => format!("{:?}", l.readlink(&node).unwrap()),
            _ => String::new(),
        };
        let xattrs = l.listxattr(&node, 1 << 16).unwrap();
        out.insert(
            path.to_owned(),
            format!("{:?} {} {} {:o} {body} {xattrs:?}", a.kind(), a.size, a.nlink, a.mode),
        );
        if a.kind() == FileKind::Directory {
            for n in names(l, path) {
                visit(l, &format!("{path}/{n}"), out);
            }
        }
    }
    let mut out = BTreeMap::new();
    visit(l, "", &mut out);
    out
}

/// Checks what fsck would: link counts match the names, ".." names the parent, the free block
/// count matches the blocks in use.
fn check_consistent(l: &MemLower) {
    let mut links: BTreeMap<u64, u32> = BTreeMap::new();
    let mut nlink: BTreeMap<u64, u32> = BTreeMap::new();
    let mut used_blocks = 0;
    let mut stack = vec![String::new()];
    while let Some(path) = stack.pop() {
        let dir = walk(l, &path).unwrap();
        let da = l.getattr(&dir).unwrap();
        used_blocks += da.blocks / 8;
        let mut subdirs = 0;
        for n in names(l, &path) {
            let child = format!("{path}/{n}");
            let a = l.getattr(&walk(l, &child).unwrap()).unwrap();
            if a.kind() == FileKind::Directory {
                subdirs += 1;
                let dotdot = l.getattr(&walk(l, &format!("{child}/..")).unwrap()).unwrap();
                assert_eq!(dotdot.ino, da.ino, "{child}/.. names its parent");
                stack.push(child);
            } else {
                if !links.contains_key(&a.ino) {
                    used_blocks += a.blocks / 8;
                }
                *links.entry(a.ino).or_default() += 1;
                nlink.insert(a.ino, a.nlink);
            }
        }
        assert_eq!(da.nlink, 2 + subdirs, "{path}: directory link count");
    }
    assert_eq!(links, nlink, "file link counts match their names");
    let st = l.statfs(l.root()).unwrap();
    assert_eq!(st.blocks - st.bfree, used_blocks, "blocks in use");
}

#[test]
fn writes_without_fsync_are_lost() {
    let l = MemLower::default();
    let (_, _, f) = l.create(&ROOT, l.root(), name("f"), 0o644, libc::O_RDWR).unwrap();
    fsync_dir(&l, "");
    l.write(&f, 0, b"pending").unwrap();
    assert!(!l.pending().is_empty());
    let after = l.crash();
    assert!(after.pending().is_empty(), "a crash image is entirely durable");
    assert_eq!(contents(&after, "f").unwrap(), b"", "the name is durable, the data is not");
    assert!(!after.pending().is_empty(), "reading moved atime (relatime): pending again");
}

#[test]
fn fsynced_data_survives_later_writes_do_not() {
    let l = MemLower::default();
    let (_, _, f) = l.create(&ROOT, l.root(), name("f"), 0o644, libc::O_RDWR).unwrap();
    l.write(&f, 0, b"durable").unwrap();
    l.fsync(&f, false).unwrap();
    fsync_dir(&l, "");
    l.write(&f, 0, b"DURABLE and more").unwrap();
    assert_eq!(contents(&l.crash(), "f").unwrap(), b"durable");
    l.fsync(&f, true).unwrap();
    assert_eq!(contents(&l.crash(), "f").unwrap(), b"DURABLE and more");
}

#[test]
fn a_created_file_disappears_until_its_directory_is_fsynced() {
    let l = MemLower::default();
    l.mkdir(&ROOT, l.root(), name("d"), 0o755).unwrap();
    fsync_dir(&l, "");
    let (_, _, f) = l.create(&ROOT, &walk(&l, "d").unwrap(), name("f"), 0o644, 2).unwrap();
    l.write(&f, 0, b"data").unwrap();
    l.fsync(&f, false).unwrap();
    let after = l.crash();
    assert_eq!(walk(&after, "d/f").unwrap_err(), Errno(libc::ENOENT));
    assert_eq!(names(&after, "d"), Vec::<String>::new());
    fsync_dir(&l, "d");
    assert_eq!(contents(&l.crash(), "d/f").unwrap(), b"data");
}

#[test]
fn fsyncdir_alone_makes_new_children_exist_empty() {
    let l = MemLower::default();
    let (_, _, f) = l.create(&ROOT, l.root(), name("f"), 0o640, libc::O_RDWR).unwrap();
    l.write(&f, 0, b"lost").unwrap();
    let (d, _) = l.mkdir(&ROOT, l.root(), name("d"), 0o700).unwrap();
    l.mkdir(&ROOT, &d, name("sub"), 0o755).unwrap();
    l.symlink(&ROOT, l.root(), name("s"), name("f")).unwrap();
    fsync_dir(&l, "");
    let after = l.crash();
    assert_eq!(contents(&after, "f").unwrap(), b"");
    assert_eq!(after.getattr(&walk(&after, "f").unwrap()).unwrap().mode, libc::S_IFREG | 0o640);
    assert_eq!(names(&after, "d"), Vec::<String>::new(), "d's own entries were not fsynced");
    assert_eq!(after.readlink(&walk(&after, "s").unwrap()).unwrap(), b"f");
    check_consistent(&after);
}

#[test]
fn a_rename_is_durable_after_both_directories_are_fsynced() {
    let l = MemLower::default();
    for d in ["a", "b"] {
        l.mkdir(&ROOT, l.root(), name(d), 0o755).unwrap();
    }
    let (_, _, f) = l.create(&ROOT, &walk(&l, "a").unwrap(), name("f"), 0o644, 2).unwrap();
    l.write(&f, 0, b"x").unwrap();
    l.sync_all();
    assert!(l.pending().is_empty());
    l.rename(&walk(&l, "a").unwrap(), name("f"), &walk(&l, "b").unwrap(), name("g"), 0).unwrap();
    assert_eq!(names(&l.crash(), "a"), ["f"], "nothing fsynced: the old name");
    fsync_dir(&l, "b");
    let half = l.crash();
    assert_eq!((names(&half, "a"), names(&half, "b")), (vec!["f".into()], vec!["g".into()]));
    assert_eq!(half.getattr(&walk(&half, "b/g").unwrap()).unwrap().nlink, 2, "both names");
    check_consistent(&half);
    fsync_dir(&l, "a");
    let whole = l.crash();
    assert_eq!((names(&whole, "a"), names(&whole, "b")), (vec![], vec!["g".into()]));
    assert_eq!(contents(&whole, "b/g").unwrap(), b"x");
    check_consistent(&whole);
}

#[test]
fn a_directory_renamed_into_an_fsynced_directory_keeps_one_name() {
    let l = MemLower::default();
    l.mkdir(&ROOT, l.root(), name("x"), 0o755).unwrap();
    l.mkdir(&ROOT, l.root(), name("y"), 0o755).unwrap();
    l.sync_all();
    l.rename(l.root(), name("y"), &walk(&l, "x").unwrap(), name("y"), 0).unwrap();
    fsync_dir(&l, "x");
    let after = l.crash();
    // The durable root still names y and so does the durable x: the first name in a
    // breadth-first walk wins, so the image stays a tree.
    assert_eq!(names(&after, ""), ["x", "y"]);
    assert_eq!(names(&after, "x"), Vec::<String>::new());
    check_consistent(&after);
}

#[test]
fn unlink_without_fsyncdir_brings_the_file_back() {
    let l = MemLower::default();
    let (_, _, f) = l.create(&ROOT, l.root(), name("f"), 0o644, libc::O_RDWR).unwrap();
    l.write(&f, 0, b"back").unwrap();
    l.sync_all();
    l.unlink(l.root(), name("f")).unwrap();
    drop(f);
    assert_eq!(contents(&l.crash(), "f").unwrap(), b"back");
    // Its inode number is not reused while a crash could bring it back.
    let (n, a) = l.mkdir(&ROOT, l.root(), name("d"), 0o755).unwrap();
    drop(n);
    assert_ne!(a.ino, lower::mem::FIRST_INO);
    fsync_dir(&l, "");
    assert_eq!(names(&l.crash(), ""), ["d"]);
}

#[test]
fn an_unlinked_open_file_is_gone_after_a_crash_even_if_fsynced() {
    let l = MemLower::default();
    let (_, _, f) = l.create(&ROOT, l.root(), name("tmp"), 0o600, libc::O_RDWR).unwrap();
    l.unlink(l.root(), name("tmp")).unwrap();
    l.write(&f, 0, b"scratch").unwrap();
    l.fsync(&f, false).unwrap();
    fsync_dir(&l, "");
    let mut buf = [0u8; 7];
    assert_eq!(l.read(&f, 0, &mut buf).unwrap(), 7, "still readable while open");
    let after = l.crash();
    assert_eq!(names(&after, ""), Vec::<String>::new());
    let st = after.statfs(after.root()).unwrap();
    assert_eq!(st.blocks - st.bfree, 1, "only the root directory's block");
}

#[test]
fn fdatasync_keeps_the_old_attributes() {
    let l = MemLower::default();
    let (node, _, f) = l.create(&ROOT, l.root(), name("f"), 0o644, libc::O_RDWR).unwrap();
    l.sync_all();
    l.setattr(&node, None, &SetAttr { mode: Some(0o600), ..SetAttr::default() }).unwrap();
    l.write(&f, 0, b"data").unwrap();
    l.fsync(&f, true).unwrap();
    let after = l.crash();
    let a = after.getattr(&walk(&after, "f").unwrap()).unwrap();
    assert_eq!((a.size, a.mode & 0o7777), (4, 0o644));
    assert_eq!(contents(&after, "f").unwrap(), b"data");
}

#[test]
fn xattrs_follow_the_file_fsync() {
    let l = MemLower::default();
    let (node, _, f) = l.create(&ROOT, l.root(), name("f"), 0o644, libc::O_RDWR).unwrap();
    fsync_dir(&l, "");
    l.setxattr(&node, name("user.k"), b"v", 0).unwrap();
    let after = l.crash();
    let err = after.getxattr(&walk(&after, "f").unwrap(), name("user.k"), 10).unwrap_err();
    assert_eq!(err, Errno(libc::ENODATA));
    l.fsync(&f, false).unwrap();
    let after = l.crash();
    assert_eq!(after.getxattr(&walk(&after, "f").unwrap(), name("user.k"), 10).unwrap(), b"v");
}

#[test]
fn a_crash_of_a_crash_image_is_the_same_image() {
    let l = MemLower::default();
    let (_, _, f) = l.create(&ROOT, l.root(), name("f"), 0o644, libc::O_RDWR).unwrap();
    l.write(&f, 10_000, b"sparse").unwrap();
    l.fsync(&f, false).unwrap();
    l.mkdir(&ROOT, l.root(), name("d"), 0o755).unwrap();
    fsync_dir(&l, "");
    let once = l.crash();
    assert_eq!(dump(&once), dump(&once.crash()));
    assert_eq!(dump(&once), dump(&once.crash_with(7)), "nothing pending: nothing to mix");
}

/// A seeded random history over a few names, some fsyncs among the changes.
fn random_history(seed: u64) -> MemLower {
    let l = MemLower::new(MemConfig { blocks: 256, ..MemConfig::default() });
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let dirs = ["", "a", "b", "a/c"];
    let files = ["f", "g", "h"];
    for _ in 0..120 {
        let dir = dirs[rng.random_range(0..dirs.len())];
        let Ok(parent) = walk(&l, dir) else { continue };
        let file = name(files[rng.random_range(0..files.len())]);
        let sub = name(&dirs[rng.random_range(1..dirs.len())][dir.len().min(1)..]);
        let _ = match rng.random_range(0..10) {
            0 => l.mkdir(&ROOT, &parent, name(dirs[rng.random_range(1..3)]), 0o755).map(drop),
            1 => l.unlink(&parent, file),
            2 => l.rmdir(&parent, sub),
            3 => {
                let to = walk(&l, dirs[rng.random_range(0..dirs.len())]);
                let flags =
                    [0, libc::RENAME_EXCHANGE, libc::RENAME_NOREPLACE][rng.random_range(0..3)];
                to.and_then(|to| l.rename(&parent, file, &to, file, flags))
            }
            4 => l.opendir(&parent).and_then(|d| l.fsyncdir(&d, false)),
            _ => l.create(&ROOT, &parent, file, 0o644, libc::O_RDWR).and_then(|(_, _, f)| {
                let len = rng.random_range(1..20_000);
                l.write(&f, rng.random_range(0..30_000), &vec![rng.random(); len])?;
                if rng.random_bool(0.3) { l.fsync(&f, rng.random_bool(0.5)) } else { Ok(()) }
            }),
        };
    }
    l
}

#[test]
fn seeded_crashes_replay_exactly_and_stay_consistent() {
    let mut distinct = std::collections::BTreeSet::new();
    for history in 0..8 {
        let l = random_history(history);
        let durable = dump(&l.crash());
        check_consistent(&l.crash());
        for seed in 0..16 {
            let a = l.crash_with(seed);
            let b = l.crash_with(seed);
            let image = dump(&a);
            assert_eq!(image, dump(&b), "history {history} seed {seed} replays");
            check_consistent(&a);
            distinct.insert(format!("{image:?}"));
            if !l.pending().is_empty() && seed == 0 {
                // Some seed in 16 differs from the durable-only image when anything is pending.
                let differs = (0..16).any(|s| dump(&l.crash_with(s)) != durable);
                assert!(differs, "history {history}: seeds mix in pending state");
            }
        }
    }
    assert!(distinct.len() > 8, "seeds give different images ({})", distinct.len());
}

#[test]
fn fsynced_and_unchanged_state_survives_every_seeded_crash() {
    let l = random_history(99);
    let (_, _, f) = l.create(&ROOT, l.root(), name("keep"), 0o644, libc::O_RDWR).unwrap();
    l.write(&f, 0, b"kept whatever happens").unwrap();
    l.fsync(&f, false).unwrap();
    fsync_dir(&l, "");
    for seed in 0..64 {
        let after = l.crash_with(seed);
        assert_eq!(contents(&after, "keep").unwrap(), b"kept whatever happens", "seed {seed}");
    }
}

#[test]
fn sync_all_makes_everything_durable() {
    let l = random_history(5);
    l.sync_all();
    assert!(l.pending().is_empty());
    assert_eq!(dump(&l.crash()), dump(&l));
    assert_eq!(dump(&l.crash_with(3)), dump(&l));
}

#[test]
fn names_are_compared_as_bytes() {
    // Non-UTF-8 names round-trip through crash images.
    use std::os::unix::ffi::OsStringExt;
    let l = MemLower::default();
    let odd = OsString::from_vec(vec![0xff, b'x']);
    l.mkdir(&ROOT, l.root(), &odd, 0o755).unwrap();
    fsync_dir(&l, "");
    let after = l.crash();
    assert!(after.lookup(after.root(), &odd).is_ok());
}
