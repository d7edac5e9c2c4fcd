//! The model is faithful where it matters: one table of operations runs on `PosixLower` over a
//! fresh temporary directory and on `MemLower`, and every answer (errno, size, contents, nlink,
//! kind, mode, owner, readdir names) must be the same. Each scenario is one test, named by what
//! it covers; a mismatch names the scenario, the step and both answers.
//!
//! Inode numbers and times differ by design (the model's are its own); the table compares
//! identity (`Same`) and explicitly set times (`Mtime`) instead.

use std::ffi::OsStr;

use lower::posix::PosixLower;
use lower::{Creds, FileKind, LowerFs, MemConfig, MemLower, SetAttr, TimeSet};

const RDWR: i32 = libc::O_RDWR;
const RDONLY: i32 = libc::O_RDONLY;
const WRONLY: i32 = libc::O_WRONLY;
const KEEP: i32 = libc::FALLOC_FL_KEEP_SIZE;
const PUNCH: i32 = libc::FALLOC_FL_PUNCH_HOLE;
const NOREPLACE: u32 = libc::RENAME_NOREPLACE;
const EXCHANGE: u32 = libc::RENAME_EXCHANGE;

/// One step. Paths are relative to the root and resolved by lookups; numbers after a path are
/// slots for open files (`usize`) or held nodes (`Hold`).
#[derive(Clone, Copy, Debug)]
enum Op {
    Create(&'static str, u32, i32, usize),
    CreateAs(&'static str, u32, (u32, u32), usize),
    Open(&'static str, i32, usize),
    OpenDir(&'static str, usize),
    Close(usize),
    Hold(&'static str, usize),
    StatHeld(usize),
    Mkdir(&'static str, u32),
    MkdirAs(&'static str, u32, (u32, u32)),
    Mknod(&'static str, u32),
    Symlink(&'static str, &'static str),
    Link(&'static str, &'static str),
    Unlink(&'static str),
    Rmdir(&'static str),
    Rename(&'static str, &'static str, u32),
    Write(usize, u64, &'static [u8]),
    Fill(usize, u64, u8, usize),
    Read(usize, u64, usize),
    Truncate(&'static str, u64),
    Ftruncate(&'static str, usize, u64),
    Fallocate(usize, i32, u64, u64),
    Lseek(usize, i64, i32),
    Copy(usize, u64, usize, u64, u64),
    Fsync(usize),
    Stat(&'static str),
    Same(&'static str, &'static str),
    List(&'static str),
    ListOpen(usize),
    Readlink(&'static str),
    SetXattr(&'static str, &'static str, &'static [u8], i32),
    GetXattr(&'static str, &'static str, usize),
    ListXattr(&'static str, usize),
    RemoveXattr(&'static str, &'static str),
    Chmod(&'static str, u32),
    Chown(&'static str, Option<u32>, Option<u32>),
    SetMtime(&'static str, i64, u32),
    Mtime(&'static str),
}

use Op::*;

type Outcome = Result<String, i32>;

struct Runner<'a, L: LowerFs> {
    l: &'a L,
    files: Vec<Option<L::File>>,
    nodes: Vec<Option<L::Node>>,
}

fn creds(uid: u32, gid: u32) -> Creds {
    Creds { uid, gid, groups: vec![gid] }
}

fn summary(data: &[u8]) -> String {
    if data.len() <= 48 {
        format!("{data:?}")
    } else {
        // FNV-1a: long reads compare by length and hash.
        let h = data.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        format!("{} bytes fnv {h:016x}", data.len())
    }
}

fn stat(attr: &lower::Attr) -> String {
    let kind = attr.kind();
    let (size, blocks) = match kind {
        // ext4 directory sizes and block counts grow with their entries; not compared.
        FileKind::Directory => (0, 0),
        _ => (attr.size, attr.blocks),
    };
    format!(
        "{kind:?} size={size} blocks={blocks} nlink={} mode={:o} uid={} gid={}",
        attr.nlink, attr.mode, attr.uid, attr.gid
    )
}

impl<L: LowerFs> Runner<'_, L> {
    fn resolve(&self, path: &str) -> Result<L::Node, i32> {
        let (mut node, _) = self.l.lookup(self.l.root(), OsStr::new(".")).map_err(|e| e.0)?;
        for part in path.split('/').filter(|p| !p.is_empty()) {
            node = self.l.lookup(&node, OsStr::new(part)).map_err(|e| e.0)?.0;
        }
        Ok(node)
    }

    fn parent(&self, path: &'static str) -> Result<(L::Node, &'static OsStr), i32> {
        let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
        Ok((self.resolve(dir)?, OsStr::new(name)))
    }

    fn file(&self, slot: usize) -> &L::File {
        self.files[slot].as_ref().expect("slot holds an open file")
    }

    fn put<T>(slots: &mut Vec<Option<T>>, slot: usize, value: T) {
        if slots.len() <= slot {
            slots.resize_with(slot + 1, || None);
        }
        slots[slot] = Some(value);
    }

    fn list(&self, dir: &L::File) -> Outcome {
        let mut names = Vec::new();
        self.l
            .readdir(dir, 0, &mut |e| {
                names.push(format!("{}:{:?}", e.name.to_string_lossy(), e.kind));
                true
            })
            .map_err(|e| e.0)?;
        names.sort();
        Ok(names.join(" "))
    }

    #[allow(clippy::too_many_lines)] // one arm per operation: a table, read top to bottom
    fn run(&mut self, op: Op) -> Outcome {
        let l = self.l;
        let root = creds(0, 0);
        let e = |e: lower::Errno| e.0;
        match op {
            Create(path, mode, _, slot) | CreateAs(path, mode, _, slot) => {
                let (c, flags) = match op {
                    CreateAs(_, _, (u, g), _) => (creds(u, g), RDWR),
                    Create(_, _, flags, _) => (root, flags),
                    _ => unreachable!(),
                };
                let (p, name) = self.parent(path)?;
                let (_, attr, file) = l.create(&c, &p, name, mode, flags).map_err(e)?;
                Self::put(&mut self.files, slot, file);
                Ok(stat(&attr))
            }
            Open(path, flags, slot) => {
                let file = l.open(&self.resolve(path)?, flags).map_err(e)?;
                Self::put(&mut self.files, slot, file);
                Ok(String::new())
            }
            OpenDir(path, slot) => {
                let dir = l.opendir(&self.resolve(path)?).map_err(e)?;
                Self::put(&mut self.files, slot, dir);
                Ok(String::new())
            }
            Close(slot) => {
                self.files[slot] = None;
                Ok(String::new())
            }
            Hold(path, slot) => {
                let node = self.resolve(path)?;
                Self::put(&mut self.nodes, slot, node);
                Ok(String::new())
            }
            StatHeld(slot) => {
                let node = self.nodes[slot].as_ref().expect("slot holds a node");
                Ok(stat(&l.getattr(node).map_err(e)?))
            }
            Mkdir(path, mode) | MkdirAs(path, mode, _) => {
                let c = if let MkdirAs(_, _, (u, g)) = op { creds(u, g) } else { root };
                let (p, name) = self.parent(path)?;
                Ok(stat(&l.mkdir(&c, &p, name, mode).map_err(e)?.1))
            }
            Mknod(path, mode) => {
                let (p, name) = self.parent(path)?;
                Ok(stat(&l.mknod(&root, &p, name, mode, 0).map_err(e)?.1))
            }
            Symlink(path, target) => {
                let (p, name) = self.parent(path)?;
                Ok(stat(&l.symlink(&root, &p, name, OsStr::new(target)).map_err(e)?.1))
            }
            Link(from, to) => {
                let node = self.resolve(from)?;
                let (p, name) = self.parent(to)?;
                Ok(stat(&l.link(&node, &p, name).map_err(e)?))
            }
            Unlink(path) => {
                let (p, name) = self.parent(path)?;
                l.unlink(&p, name).map(|()| String::new()).map_err(e)
            }
            Rmdir(path) => {
                let (p, name) = self.parent(path)?;
                l.rmdir(&p, name).map(|()| String::new()).map_err(e)
            }
            Rename(from, to, flags) => {
                let (p, name) = self.parent(from)?;
                let (np, newname) = self.parent(to)?;
                l.rename(&p, name, &np, newname, flags).map(|()| String::new()).map_err(e)
            }
            Write(slot, off, data) => {
                Ok(l.write(self.file(slot), off, data).map_err(e)?.to_string())
            }
            Fill(slot, off, byte, len) => {
                Ok(l.write(self.file(slot), off, &vec![byte; len]).map_err(e)?.to_string())
            }
            Read(slot, off, len) => {
                let mut buf = vec![0u8; len];
                let n = l.read(self.file(slot), off, &mut buf).map_err(e)?;
                Ok(summary(&buf[..n]))
            }
            Truncate(path, size) => {
                let set = SetAttr { size: Some(size), ..SetAttr::default() };
                Ok(stat(&l.setattr(&self.resolve(path)?, None, &set).map_err(e)?))
            }
            Ftruncate(path, slot, size) => {
                let set = SetAttr { size: Some(size), ..SetAttr::default() };
                let node = self.resolve(path)?;
                Ok(stat(&l.setattr(&node, Some(self.file(slot)), &set).map_err(e)?))
            }
            Fallocate(slot, mode, off, len) => {
                l.fallocate(self.file(slot), mode, off, len).map(|()| String::new()).map_err(e)
            }
            Lseek(slot, off, whence) => {
                Ok(l.lseek(self.file(slot), off, whence).map_err(e)?.to_string())
            }
            Copy(a, off_a, b, off_b, len) => Ok(l
                .copy_file_range(self.file(a), off_a, self.file(b), off_b, len)
                .map_err(e)?
                .to_string()),
            Fsync(slot) => l.fsync(self.file(slot), false).map(|()| String::new()).map_err(e),
            Stat(path) => Ok(stat(&l.getattr(&self.resolve(path)?).map_err(e)?)),
            Same(a, b) => Ok((l.key(&self.resolve(a)?) == l.key(&self.resolve(b)?)).to_string()),
            List(path) => {
                let dir = l.opendir(&self.resolve(path)?).map_err(e)?;
                self.list(&dir)
            }
            ListOpen(slot) => self.list(self.file(slot)),
            Readlink(path) => Ok(summary(&l.readlink(&self.resolve(path)?).map_err(e)?)),
            SetXattr(path, name, value, flags) => l
                .setxattr(&self.resolve(path)?, OsStr::new(name), value, flags)
                .map(|()| String::new())
                .map_err(e),
            GetXattr(path, name, size) => {
                Ok(summary(&l.getxattr(&self.resolve(path)?, OsStr::new(name), size).map_err(e)?))
            }
            ListXattr(path, size) => {
                let list = l.listxattr(&self.resolve(path)?, size).map_err(e)?;
                if size == 0 {
                    return Ok(list.len().to_string());
                }
                let mut names: Vec<_> = list.split(|&b| b == 0).filter(|n| !n.is_empty()).collect();
                names.sort();
                Ok(format!("{names:?}"))
            }
            RemoveXattr(path, name) => l
                .removexattr(&self.resolve(path)?, OsStr::new(name))
                .map(|()| String::new())
                .map_err(e),
            Chmod(path, mode) => {
                let set = SetAttr { mode: Some(mode), ..SetAttr::default() };
                Ok(stat(&l.setattr(&self.resolve(path)?, None, &set).map_err(e)?))
            }
            Chown(path, uid, gid) => {
                let set = SetAttr { uid, gid, ..SetAttr::default() };
                Ok(stat(&l.setattr(&self.resolve(path)?, None, &set).map_err(e)?))
            }
            SetMtime(path, s, ns) => {
                let set = SetAttr { mtime: Some(TimeSet::At(s, ns)), ..SetAttr::default() };
                l.setattr(&self.resolve(path)?, None, &set).map(|_| String::new()).map_err(e)
            }
            Mtime(path) => Ok(format!("{:?}", l.getattr(&self.resolve(path)?).map_err(e)?.mtime)),
        }
    }
}

fn statfs_type(path: &std::path::Path) -> i64 {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).expect("no NUL");
    // SAFETY: statfs fills the zeroed struct for a valid path.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statfs(c.as_ptr(), &raw mut st) }, 0, "statfs of the temp dir");
    st.f_type
}

/// The daemon's umask, which the kernel applies to creates on the lower directory.
fn process_umask() -> u32 {
    let status = std::fs::read_to_string("/proc/self/status").expect("procfs");
    let line = status.lines().find_map(|l| l.strip_prefix("Umask:")).expect("Umask line");
    u32::from_str_radix(line.trim(), 8).expect("octal umask")
}

fn outcomes<L: LowerFs>(l: &L, ops: &[Op]) -> Vec<Outcome> {
    let mut runner = Runner { l, files: Vec::new(), nodes: Vec::new() };
    ops.iter().map(|&op| runner.run(op)).collect()
}

fn compare(scenario: &str, ops: &[Op]) {
    let dir = tempfile::tempdir().expect("temp dir");
    // The model's reference is ext4 (block counts, SEEK_HOLE over unwritten extents, punch
    // bounds); tmpfs or btrfs would answer some steps differently.
    let fs = statfs_type(dir.path());
    assert_eq!(fs, 0xEF53, "the temp dir must be on ext4 (set TMPDIR), f_type {fs:#x}");
    let posix = PosixLower::open(dir.path()).expect("open lower");
    let mem = MemLower::new(MemConfig { umask: process_umask(), ..MemConfig::default() });
    let want = outcomes(&posix, ops);
    let got = outcomes(&mem, ops);
    let mismatches: Vec<String> = ops
        .iter()
        .zip(want.iter().zip(&got))
        .enumerate()
        .filter(|(_, (_, (w, g)))| w != g)
        .map(|(i, (op, (w, g)))| format!("  step {i} {op:?}:\n    posix {w:?}\n    mem   {g:?}"))
        .collect();
    assert!(mismatches.is_empty(), "{scenario}: the model differs\n{}", mismatches.join("\n"));
}

macro_rules! scenarios {
    ($($name:ident: [$($op:expr),* $(,)?];)*) => {
        $(
            #[test]
            fn $name() {
                compare(stringify!($name), &[$($op),*]);
            }
        )*
    };
}

const LONG_NAME: &str = "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn";

scenarios! {
    sparse_writes_reads_and_sizes: [
        Create("f", 0o644, RDWR, 0),
        Write(0, 10, b"hello"),
        Read(0, 0, 20),
        Stat("f"),
        Write(0, 1 << 20, b"x"),
        Stat("f"),
        Read(0, (1 << 20) - 3, 10),
        Read(0, 4000, 200),
        Read(0, 2 << 20, 10),
        Fill(0, 8000, 0xab, 10_000),
        Read(0, 0, 20_000),
        Stat("f"),
    ];
    truncate_shrinks_extends_and_zeroes_the_tail: [
        Create("f", 0o644, RDWR, 0),
        Fill(0, 0, 0xaa, 10_000),
        Truncate("f", 5000),
        Stat("f"),
        Truncate("f", 9000),
        Read(0, 4990, 20),
        Read(0, 0, 9000),
        Stat("f"),
        Ftruncate("f", 0, 0),
        Stat("f"),
        Open("f", RDONLY, 1),
        Ftruncate("f", 1, 10),
        Truncate("f", 1 << 50),
        Mkdir("d", 0o755),
        Truncate("d", 0),
    ];
    fallocate_modes_and_holes: [
        Create("f", 0o644, RDWR, 0),
        Fallocate(0, 0, 0, 8192),
        Stat("f"),
        Lseek(0, 0, libc::SEEK_DATA),
        Lseek(0, 0, libc::SEEK_HOLE),
        Fill(0, 0, 1, 12_288),
        Fallocate(0, KEEP, 12_288, 65_536),
        Stat("f"),
        Read(0, 12_280, 100),
        Fallocate(0, PUNCH | KEEP, 100, 5000),
        Stat("f"),
        Read(0, 90, 20),
        Read(0, 5090, 20),
        Lseek(0, 0, libc::SEEK_HOLE),
        Lseek(0, 200, libc::SEEK_DATA),
        Fallocate(0, PUNCH | KEEP, 0, 1 << 30),
        Stat("f"),
        Fallocate(0, PUNCH, 0, 4096),
        Fallocate(0, 0, 0, 0),
        Ftruncate("f", 0, 100),
        Stat("f"),
        Open("f", RDONLY, 1),
        Fallocate(1, 0, 0, 4096),
        Close(1),
        Create("g", 0o644, RDWR, 2),
        Fill(2, 0, 3, 5000),
        Fallocate(2, KEEP, 0, 65_536),
        Stat("g"),
        Fallocate(2, PUNCH | KEEP, 10, 1 << 30),
        Stat("g"),
        Read(2, 0, 5000),
        Fallocate(2, PUNCH | KEEP, 8192, 4096),
        Stat("g"),
        Fallocate(2, 0, 4000, 200_000),
        Stat("g"),
        Ftruncate("g", 2, 5000),
        Stat("g"),
    ];
    seek_data_and_hole: [
        Create("f", 0o644, RDWR, 0),
        Write(0, 0, b"a"),
        Write(0, 3 * 4096 + 5, b"b"),
        Lseek(0, 0, libc::SEEK_DATA),
        Lseek(0, 0, libc::SEEK_HOLE),
        Lseek(0, 100, libc::SEEK_DATA),
        Lseek(0, 5000, libc::SEEK_DATA),
        Lseek(0, 12_290, libc::SEEK_HOLE),
        Lseek(0, 12_294, libc::SEEK_DATA),
        Lseek(0, 12_295, libc::SEEK_DATA),
        Lseek(0, 5, libc::SEEK_END),
        Lseek(0, -1, libc::SEEK_SET),
        Lseek(0, 7, libc::SEEK_CUR),
        Lseek(0, 0, 99),
    ];
    directories_and_their_errors: [
        Mkdir("d", 0o755),
        Mkdir("d/e", 0o700),
        Stat("d"),
        Mkdir("d", 0o755),
        Create("d/f", 0o600, RDWR, 0),
        List("d"),
        List(""),
        Rmdir("d"),
        Rmdir("d/f"),
        Unlink("d/e"),
        Rmdir("d/."),
        Rmdir("d/.."),
        Unlink("d/."),
        Rmdir("d/missing"),
        Rmdir("d/e"),
        Stat("d"),
        Mkdir("d/f/x", 0o755),
        Stat("d/f/x"),
        Mkdir(LONG_NAME, 0o755),
        Stat(LONG_NAME),
        Same("d/..", ""),
        Same("d/.", "d"),
        OpenDir("d/f", 1),
    ];
    symlinks: [
        Create("f", 0o644, RDWR, 0),
        Symlink("s", "f"),
        Symlink("dangling", "nowhere/at/all"),
        Readlink("s"),
        Readlink("dangling"),
        Stat("s"),
        Readlink("f"),
        Open("s", RDONLY, 1),
        Open("s", RDONLY | libc::O_DIRECTORY, 1),
        Create("s", 0o644, RDWR, 1),
        Symlink("s", "g"),
        Symlink("e", ""),
        List(""),
    ];
    hard_links_count_names: [
        Create("f", 0o644, RDWR, 0),
        Mkdir("d", 0o755),
        Link("f", "d/g"),
        Stat("f"),
        Same("f", "d/g"),
        Link("f", "d/g"),
        Link("d", "e"),
        Unlink("f"),
        Stat("d/g"),
        Unlink("f"),
        Link("missing", "x"),
        Link("d/g", "nodir/x"),
        Link("d/g", "d/g/x"),
    ];
    fifos_sockets_and_mknod_errors: [
        Mknod("p", libc::S_IFIFO | 0o640),
        Mknod("s", libc::S_IFSOCK | 0o600),
        Mknod("r", libc::S_IFREG | 0o600),
        Mknod("r", 0o600),
        Mknod("d", libc::S_IFDIR | 0o755),
        Stat("p"),
        Stat("s"),
        Stat("r"),
        List(""),
        Unlink("p"),
        List(""),
    ];
    rename_files_and_directories: [
        Create("a", 0o644, RDWR, 0),
        Write(0, 0, b"a-data"),
        Create("b", 0o644, RDWR, 1),
        Mkdir("d", 0o755),
        Mkdir("e", 0o755),
        Create("e/x", 0o644, RDWR, 2),
        Rename("a", "b", 0),
        Read(1, 0, 10),
        Stat("b"),
        List(""),
        Rename("b", "d", 0),
        Rename("d", "b", 0),
        Rename("d", "e", 0),
        Rename("e", "d", 0),
        Stat("d"),
        List("d"),
        Rename("d", "d/x/y", 0),
        Rename("d", "d/z", 0),
        Rename("d/x", "d/x", 0),
        Mkdir("d/sub", 0o755),
        Rename("d/sub", "d", 0),
        Rename("missing", "z", 0),
        Rename("b", "nodir/z", 0),
        Rename("b", "b/z", 0),
        Rename("b", "d/b", 0),
        Stat("d"),
        Stat(""),
        Rename("d/sub", "top", 0),
        Stat("d"),
        Stat(""),
        List(""),
    ];
    rename_noreplace_exchange_and_hard_links: [
        Create("a", 0o644, RDWR, 0),
        Mkdir("d", 0o755),
        Mkdir("d/inner", 0o755),
        Mkdir("e", 0o755),
        Rename("a", "d", NOREPLACE),
        Rename("a", "fresh", NOREPLACE),
        Rename("fresh", "e/a", EXCHANGE),
        Rename("fresh", "d", EXCHANGE),
        Stat("fresh"),
        Stat("d"),
        Stat(""),
        Stat("fresh/inner"),
        Same("fresh/inner/..", "fresh"),
        Rename("fresh", "fresh/inner", EXCHANGE),
        Rename("d", "e", EXCHANGE | NOREPLACE),
        Rename("d", "e", 0x40),
        Link("d", "d2"),
        Rename("d", "d2", 0),
        List(""),
        Same("d", "d2"),
        Rename("fresh/.", "x", 0),
        Rename("d", "fresh/..", NOREPLACE),
        Rename("d", "fresh/..", 0),
        Rename("e", "fresh/inner", EXCHANGE),
        Stat("fresh/inner"),
        Stat("e"),
        Stat("fresh"),
    ];
    unlinked_open_files_stay_readable_and_writable: [
        Create("f", 0o644, RDWR, 0),
        Write(0, 0, b"still here"),
        Hold("f", 0),
        Unlink("f"),
        Stat("f"),
        Read(0, 0, 20),
        Write(0, 10, b", and more"),
        Read(0, 0, 30),
        StatHeld(0),
        Fsync(0),
        List(""),
        Mkdir("d", 0o755),
        Hold("d", 1),
        OpenDir("d", 1),
        Rmdir("d"),
        StatHeld(1),
        ListOpen(1),
        Create("d/x", 0o644, RDWR, 2),
    ];
    xattrs_create_replace_and_sizes: [
        Create("f", 0o644, RDWR, 0),
        SetXattr("f", "user.a", b"one", 0),
        SetXattr("f", "user.b", b"", 0),
        GetXattr("f", "user.a", 100),
        GetXattr("f", "user.a", 0),
        GetXattr("f", "user.a", 2),
        GetXattr("f", "user.b", 10),
        GetXattr("f", "user.missing", 10),
        ListXattr("f", 0),
        ListXattr("f", 100),
        ListXattr("f", 3),
        SetXattr("f", "user.a", b"two", libc::XATTR_CREATE),
        SetXattr("f", "user.c", b"x", libc::XATTR_REPLACE),
        SetXattr("f", "user.a", b"three", libc::XATTR_REPLACE),
        GetXattr("f", "user.a", 100),
        SetXattr("f", "user.a", b"x", 4),
        SetXattr("f", "user.", b"x", 0),
        SetXattr("f", "bogus.a", b"x", 0),
        SetXattr("f", "trusted.t", b"root", 0),
        GetXattr("f", "trusted.t", 100),
        RemoveXattr("f", "user.a"),
        RemoveXattr("f", "user.a"),
        ListXattr("f", 100),
        Mkdir("d", 0o755),
        SetXattr("d", "user.dir", b"yes", 0),
        GetXattr("d", "user.dir", 10),
        Symlink("s", "f"),
        SetXattr("s", "user.a", b"x", 0),
        GetXattr("s", "user.a", 10),
        Mknod("p", libc::S_IFIFO | 0o644),
        SetXattr("p", "user.a", b"x", 0),
    ];
    setattr_mode_owner_and_times: [
        Create("f", 0o644, RDWR, 0),
        Chmod("f", 0o4755),
        Chown("f", Some(1000), None),
        Chmod("f", 0o2750),
        Chown("f", None, Some(1000)),
        Chmod("f", 0o2740),
        Chown("f", Some(1), Some(2)),
        Mkdir("d", 0o755),
        Chmod("d", 0o3777),
        Chown("d", Some(5), Some(6)),
        Symlink("s", "f"),
        Chmod("s", 0o600),
        Stat("s"),
        SetMtime("f", 1_000_000, 42),
        Mtime("f"),
    ];
    open_flags_truncate_append_and_access: [
        Create("f", 0o644, RDWR, 0),
        Write(0, 0, b"0123456789"),
        Open("f", WRONLY | libc::O_APPEND, 1),
        Write(1, 0, b"ab"),
        Read(0, 0, 20),
        Read(1, 0, 5),
        Open("f", RDONLY, 2),
        Write(2, 0, b"x"),
        Open("f", WRONLY | libc::O_TRUNC, 3),
        Stat("f"),
        Create("f", 0o600, RDWR, 4),
        Create("f", 0o600, RDWR | libc::O_EXCL, 4),
        Mkdir("d", 0o755),
        Create("d", 0o600, RDWR, 4),
        Open("d", RDWR, 4),
        Open("d", RDONLY, 4),
        Read(4, 0, 10),
        Open("f", RDONLY | libc::O_DIRECTORY, 4),
        Create("nodir/x", 0o644, RDWR, 4),
        Create("f/x", 0o644, RDWR, 4),
        Create(LONG_NAME, 0o644, RDWR, 4),
        Write(0, 1 << 44, b"x"),
        Write(0, 0, b""),
    ];
    copy_file_range_copies_and_checks: [
        Create("a", 0o644, RDWR, 0),
        Fill(0, 0, 7, 10_000),
        Create("b", 0o644, RDWR, 1),
        Copy(0, 100, 1, 5000, 3000),
        Stat("b"),
        Read(1, 4990, 20),
        Read(1, 0, 8000),
        Copy(0, 9000, 1, 0, 5000),
        Copy(0, 20_000, 1, 0, 10),
        Copy(0, 0, 0, 100, 500),
        Copy(0, 0, 0, 5000, 500),
        Open("a", WRONLY | libc::O_APPEND, 2),
        Copy(0, 0, 2, 0, 10),
        Open("b", WRONLY, 3),
        Copy(3, 0, 1, 0, 10),
        Open("b", RDONLY, 4),
        Copy(0, 0, 4, 0, 10),
        Stat("a"),
    ];
    setgid_directories_pass_their_group: [
        Mkdir("g", 0o2777),
        Chown("g", Some(0), Some(1234)),
        Chmod("g", 0o2777),
        CreateAs("g/f", 0o644, (1000, 1000), 0),
        MkdirAs("g/sub", 0o755, (1000, 1000)),
        CreateAs("g/x", 0o2755, (1000, 1000), 1),
        Stat("g/f"),
        Stat("g/sub"),
        Stat("g/x"),
        Mkdir("plain", 0o777),
        Chmod("plain", 0o777),
        CreateAs("plain/f", 0o640, (1000, 1000), 2),
        Stat("plain/f"),
    ];
}
