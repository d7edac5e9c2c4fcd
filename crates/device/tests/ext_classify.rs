//! The ext metadata classifier against e2fsprogs' own view of real images: every block of an
//! ext4 image is classified (static map, then the content rule, as the engine does for a
//! write of that block) and compared with what `dumpe2fs` and `debugfs` say the block is.
//!
//! - `populated_by_mke2fs` (no root needed): `mke2fs -t ext4 -d TREE` (1 KiB and 4 KiB
//!   blocks) with nested
//!   directories, a 400-entry directory, a sparse file with 12 extents (a depth-1 extent
//!   tree) and a file with a 700-byte xattr (an xattr block).
//! - `after_kernel_activity` (root: loop mount): the same tree copied in by the kernel, plus
//!   htree directories (dir_index), directories and files removed and renamed, a fragmented
//!   file written with fsyncs; then unmounted and compared.
//!
//! Ground truth: `dumpe2fs` (superblocks and backups, descriptors, reserved GDT blocks,
//! bitmaps, inode tables), `debugfs` `blocks`/`ex`/`stat` of the journal inode, the resize
//! inode's DIND block, every directory (its blocks; extent-tree nodes) and every regular file
//! (data blocks must be classified data; extent-tree nodes; the xattr block). Blocks outside
//! all of these (free space, which may hold stale bytes) are counted but not judged.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use device::classify::ext::ExtMeta;
use device::classify::{Class, FileSource};

fn have(tool: &str) -> bool {
    ["/usr/sbin", "/sbin", "/usr/bin", "/bin"].iter().any(|d| Path::new(d).join(tool).exists())
}

fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd).args(args).output().unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(out.status.success(), "{cmd} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs debugfs commands on `img`; returns each command's output (debugfs echoes
/// "debugfs: COMMAND" before it).
fn debugfs(img: &Path, cmds: &[String]) -> Vec<String> {
    let mut child = Command::new("debugfs")
        .args(["-f", "-", img.to_str().unwrap()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("debugfs");
    let mut stdin = child.stdin.take().unwrap();
    let script = cmds.join("\n") + "\n";
    std::thread::spawn(move || stdin.write_all(script.as_bytes()).unwrap());
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut sections: Vec<String> = Vec::new();
    for line in text.lines() {
        if line.starts_with("debugfs: ") {
            sections.push(String::new());
        } else if let Some(s) = sections.last_mut() {
            s.push_str(line);
            s.push('\n');
        }
    }
    assert_eq!(sections.len(), cmds.len(), "debugfs output: {text}");
    sections
}

/// Numbers of the form "A" or "A-B" after `label` in `line`.
fn ranges_after(line: &str, label: &str) -> Option<(u64, u64)> {
    let rest = &line[line.find(label)? + label.len()..];
    let word: String =
        rest.trim_start().chars().take_while(|c| c.is_ascii_digit() || *c == '-').collect();
    let mut parts = word.split('-');
    let a: u64 = parts.next()?.parse().ok()?;
    let b: u64 = parts.next().map_or(Some(a), |b| b.parse().ok())?;
    Some((a, b))
}

/// Block numbers of a `blocks` answer line.
fn numbers(line: &str) -> Vec<u64> {
    line.split_whitespace().filter_map(|w| w.parse().ok()).collect()
}

/// Physical blocks of interior extent-tree nodes from `ex` output (entries of a level below
/// the maximum point at a node block).
fn tree_nodes(ex: &str) -> Vec<u64> {
    let mut out = Vec::new();
    for line in ex.lines() {
        let l = line.trim_start();
        let Some((lvl, rest)) = l.split_once('/') else { continue };
        let (Ok(level), Some(max)) = (
            lvl.trim().parse::<u32>(),
            rest.split_whitespace().next().and_then(|m| m.parse::<u32>().ok()),
        ) else {
            continue;
        };
        if level < max {
            // "0/ 1   1/  4     0 - 4294967295  1234   4294967296"
            let cols: Vec<&str> = l.split_whitespace().collect();
            if let Some(p) = cols.iter().position(|c| *c == "-").and_then(|i| cols.get(i + 2)) {
                if let Ok(b) = p.parse() {
                    out.push(b);
                }
            }
        }
    }
    out
}

#[derive(Default)]
struct Truth {
    /// Block -> expected class (metadata).
    meta: BTreeMap<u64, Class>,
    /// File data blocks (must be classified data).
    data: Vec<u64>,
}

fn ground_truth(img: &Path, dirs: &[String], files: &[String]) -> Truth {
    let mut t = Truth::default();
    let put = |t: &mut Truth, a: u64, b: u64, c: Class| {
        for x in a..=b {
            t.meta.entry(x).or_insert(c);
        }
    };
    for line in run("dumpe2fs", &[img.to_str().unwrap()]).lines() {
        for (label, class) in [
            ("superblock at", Class::ExtSuperblock),
            ("Group descriptors at", Class::ExtGroupDesc),
            ("Reserved GDT blocks at", Class::ExtGroupDesc),
            ("Block bitmap at", Class::ExtBitmap),
            ("Inode bitmap at", Class::ExtBitmap),
            ("Inode table at", Class::ExtInodeTable),
        ] {
            if let Some((a, b)) = ranges_after(line, label) {
                put(&mut t, a, b, class);
            }
        }
    }
    // Journal (inode 8) and the resize inode's double-indirect block.
    let out = debugfs(img, &["blocks <8>".into(), "ex <8>".into(), "stat <7>".into()]);
    for b in numbers(&out[0]).into_iter().chain(tree_nodes(&out[1])) {
        put(&mut t, b, b, Class::ExtJournal);
    }
    if let Some((d, _)) = out[2].lines().find_map(|l| ranges_after(l, "(DIND):")) {
        put(&mut t, d, d, Class::ExtSpecial);
    }
    let cmds: Vec<String> =
        dirs.iter().flat_map(|d| [format!("blocks \"{d}\""), format!("ex \"{d}\"")]).collect();
    // `blocks` lists extent-tree nodes too: take them from `ex` first.
    for pair in debugfs(img, &cmds).chunks(2) {
        for b in tree_nodes(&pair[1]) {
            put(&mut t, b, b, Class::ExtExtentTree);
        }
        for b in numbers(&pair[0]) {
            put(&mut t, b, b, Class::ExtDirectory);
        }
    }
    let cmds: Vec<String> = files
        .iter()
        .flat_map(|f| [format!("blocks \"{f}\""), format!("ex \"{f}\""), format!("stat \"{f}\"")])
        .collect();
    for triple in debugfs(img, &cmds).chunks(3) {
        let nodes = tree_nodes(&triple[1]);
        t.data.extend(numbers(&triple[0]).into_iter().filter(|b| !nodes.contains(b)));
        for b in nodes {
            put(&mut t, b, b, Class::ExtExtentTree);
        }
        if let Some((acl, _)) = triple[2].lines().find_map(|l| ranges_after(l, "File ACL:")) {
            if acl != 0 {
                put(&mut t, acl, acl, Class::ExtXattr);
            }
        }
    }
    t
}

/// Classifies every block of `img` and compares; returns the report line. Panics on any
/// metadata block misclassified or any file data block classified as metadata.
fn compare(img: &Path, dirs: &[String], files: &[String]) -> String {
    let truth = ground_truth(img, dirs, files);
    let mut src = FileSource(fs::File::open(img).unwrap());
    let meta = ExtMeta::probe(&mut src).expect("an ext file system");
    let bs = meta.layout.block_size as usize;
    let bytes = fs::read(img).unwrap();
    let class_of = |b: u64| meta.classify_block(b, &bytes[b as usize * bs..(b as usize + 1) * bs]);
    let mut per_class: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    let mut wrong = Vec::new();
    for (&b, &want) in &truth.meta {
        let got = class_of(b);
        let e = per_class.entry(want.name()).or_default();
        e.0 += 1;
        if got == want {
            e.1 += 1;
        } else {
            wrong.push(format!("block {b}: {} classified {}", want.name(), got.name()));
        }
    }
    let data_as_meta: Vec<u64> =
        truth.data.iter().copied().filter(|&b| class_of(b).is_metadata()).collect();
    let judged: std::collections::BTreeSet<u64> =
        truth.meta.keys().copied().chain(truth.data.iter().copied()).collect();
    let (mut other, mut other_meta) = (0, 0);
    for b in 0..meta.layout.blocks_count {
        if !judged.contains(&b) {
            other += 1;
            other_meta += u64::from(class_of(b).is_metadata());
        }
    }
    let table: Vec<String> = per_class.iter().map(|(c, (n, ok))| format!("{c} {ok}/{n}")).collect();
    let report = format!(
        "{} blocks of {} B: metadata per debugfs/dumpe2fs (correct/expected): {}; file data \
         blocks {} ({} classified metadata); other blocks {} ({} classified metadata)",
        meta.layout.blocks_count,
        bs,
        table.join(", "),
        truth.data.len(),
        data_as_meta.len(),
        other,
        other_meta
    );
    assert!(
        wrong.is_empty(),
        "{report}\nmisclassified:\n{}",
        wrong[..wrong.len().min(20)].join("\n")
    );
    assert!(data_as_meta.is_empty(), "{report}\nfile data classified metadata: {data_as_meta:?}");
    for c in ["ext.directory", "ext.extent_tree", "ext.xattr", "ext.journal", "ext.inode_table"] {
        assert!(
            per_class.get(c).is_some_and(|(n, _)| *n > 0),
            "no {c} block in the test image: {report}"
        );
    }
    report
}

/// A source tree: nested directories, a big directory, a sparse many-extent file, a file with
/// a large xattr. Returns (directories, files) as paths inside the file system.
fn make_tree(root: &Path) -> (Vec<String>, Vec<String>) {
    let mut dirs = vec!["/".to_string(), "/lost+found".to_string()];
    let mut files = Vec::new();
    for d in ["a", "a/b", "a/b/c", "big", "x"] {
        fs::create_dir_all(root.join(d)).unwrap();
        dirs.push(format!("/{d}"));
    }
    for i in 0..400 {
        let p = format!("big/entry-with-a-long-name-{i:04}");
        fs::write(root.join(&p), format!("{i}\n")).unwrap();
        files.push(format!("/{p}"));
    }
    for (i, d) in ["a", "a/b", "a/b/c", "x"].iter().enumerate() {
        let p = format!("{d}/file{i}");
        fs::write(root.join(&p), vec![i as u8 + 1; 3000 + i * 5000]).unwrap();
        files.push(format!("/{p}"));
    }
    // 12 data chunks separated by holes: 12 extents, more than the inode's 4.
    let sparse = root.join("x/sparse");
    let f = fs::File::create(&sparse).unwrap();
    for i in 0..12u64 {
        use std::os::unix::fs::FileExt;
        f.write_all_at(&[0x5au8; 2048], i * 64 * 1024).unwrap();
    }
    files.push("/x/sparse".into());
    let tagged = root.join("x/tagged");
    fs::write(&tagged, b"has a big xattr").unwrap();
    let value = vec![b'v'; 700];
    let name = std::ffi::CString::new("user.big").unwrap();
    let path = std::ffi::CString::new(tagged.to_str().unwrap()).unwrap();
    // SAFETY: valid NUL-terminated strings and a live buffer for the duration of the call.
    let rc = unsafe {
        libc::setxattr(path.as_ptr(), name.as_ptr(), value.as_ptr().cast(), value.len(), 0)
    };
    assert_eq!(rc, 0, "setxattr: {}", std::io::Error::last_os_error());
    files.push("/x/tagged".into());
    (dirs, files)
}

#[test]
fn populated_by_mke2fs() {
    if !have("mke2fs") || !have("debugfs") || !have("dumpe2fs") {
        assert!(std::env::var_os("CI").is_none(), "e2fsprogs missing in CI");
        eprintln!("SKIP: e2fsprogs not installed");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let tree = tmp.path().join("tree");
    let (dirs, files) = make_tree(&tree);
    for bs in ["1024", "4096"] {
        let img = tmp.path().join(format!("ext4-{bs}.img"));
        let args = [
            "-q",
            "-F",
            "-t",
            "ext4",
            "-b",
            bs,
            "-d",
            tree.to_str().unwrap(),
            img.to_str().unwrap(),
            "32M",
        ];
        run("mke2fs", &args);
        let report = compare(&img, &dirs, &files);
        eprintln!("mke2fs -d image, {bs}-byte blocks: {report}");
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Unmounts `mp` (bounded retries: right after the last close a mount can be busy).
fn umount(mp: &Path) {
    for _ in 0..100 {
        if Command::new("umount").arg(mp).status().is_ok_and(|s| s.success()) {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let _ = Command::new("umount").arg("-l").arg(mp).status();
    panic!("cannot unmount {}", mp.display());
}

struct Mounted(PathBuf);
impl Mounted {
    /// Unmounts for real (the image is complete afterwards).
    fn unmount(self) {
        umount(&self.0);
        std::mem::forget(self);
    }
}
impl Drop for Mounted {
    fn drop(&mut self) {
        if fs::read_to_string("/proc/self/mountinfo")
            .is_ok_and(|m| m.contains(self.0.to_str().unwrap()))
        {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
}

#[test]
fn after_kernel_activity() {
    if !is_root() || !have("mkfs.ext4") || !have("debugfs") || !have("dumpe2fs") {
        assert!(std::env::var_os("CI").is_none(), "needs root and e2fsprogs in CI");
        eprintln!("SKIP: needs root (loop mount) and e2fsprogs");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("ext4.img");
    let mp = tmp.path().join("mnt");
    fs::create_dir_all(&mp).unwrap();
    fs::File::create(&img).unwrap().set_len(32 << 20).unwrap();
    run("mkfs.ext4", &["-q", "-F", img.to_str().unwrap()]);
    run("mount", &["-o", "loop", img.to_str().unwrap(), mp.to_str().unwrap()]);
    let guard = Mounted(mp.clone());
    let (mut dirs, mut files) = make_tree(&mp);
    // Kernel-only structures: htree directories, removals, renames, a fragmented file.
    for d in ["h1", "h2"] {
        fs::create_dir(mp.join(d)).unwrap();
        dirs.push(format!("/{d}"));
        for i in 0..300 {
            let p = format!("{d}/a-rather-long-file-name-to-fill-blocks-{i:04}");
            fs::write(mp.join(&p), b"x").unwrap();
            if i % 3 == 0 {
                fs::remove_file(mp.join(&p)).unwrap();
            } else {
                files.push(format!("/{p}"));
            }
        }
    }
    fs::create_dir_all(mp.join("gone/deeper")).unwrap();
    fs::write(mp.join("gone/deeper/f"), vec![1u8; 5000]).unwrap();
    fs::remove_dir_all(mp.join("gone")).unwrap();
    fs::rename(mp.join("a/b/c"), mp.join("x/c-moved")).unwrap();
    for p in dirs.iter_mut().chain(files.iter_mut()) {
        if let Some(rest) = p.strip_prefix("/a/b/c") {
            *p = format!("/x/c-moved{rest}");
        }
    }
    {
        use std::os::unix::fs::FileExt;
        let frag = fs::File::create(mp.join("x/frag")).unwrap();
        let filler = fs::File::create(mp.join("x/filler")).unwrap();
        for i in 0..10u64 {
            frag.write_all_at(&[7u8; 4096], i * 4096).unwrap();
            frag.sync_all().unwrap();
            filler.write_all_at(&[8u8; 4096], i * 4096).unwrap();
            filler.sync_all().unwrap();
        }
        files.extend(["/x/frag".to_string(), "/x/filler".to_string()]);
    }
    guard.unmount();
    let report = compare(&img, &dirs, &files);
    eprintln!("kernel ext4 image: {report}");
}
