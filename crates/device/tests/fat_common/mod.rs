//! Shared by the FAT tests: images made by `mkfs.fat` (dosfstools), a workload of the `fatfs`
//! crate, and a walk of the tree as `fatfs` sees it.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{Read, Seek, Write};
use std::path::Path;
use std::process::Command;

pub fn have(tool: &str) -> bool {
    ["/usr/sbin", "/sbin", "/usr/bin", "/bin"].iter().any(|d| Path::new(d).join(tool).exists())
}

/// Skips (returns true) when dosfstools is missing; an error under CI.
pub fn skip() -> bool {
    if have("mkfs.fat") && have("fsck.fat") {
        return false;
    }
    assert!(std::env::var_os("CI").is_none(), "dosfstools missing in CI");
    eprintln!("SKIP: dosfstools (mkfs.fat, fsck.fat) not installed");
    true
}

/// A FAT variant to test: name, image size, mkfs.fat arguments.
#[derive(Clone, Copy, Debug)]
pub struct Variant {
    pub name: &'static str,
    pub size: u64,
    pub mkfs: &'static [&'static str],
}

pub const VARIANTS: [Variant; 3] = [
    Variant { name: "fat12", size: 4 << 20, mkfs: &["-F", "12", "-s", "4"] },
    Variant { name: "fat16", size: 32 << 20, mkfs: &["-F", "16", "-s", "4"] },
    Variant { name: "fat32", size: 64 << 20, mkfs: &["-F", "32", "-s", "1"] },
];

/// Creates `path` with `mkfs.fat`.
pub fn mkfs(path: &Path, v: Variant) {
    std::fs::File::create(path).unwrap().set_len(v.size).unwrap();
    let out = Command::new("mkfs.fat").args(v.mkfs).arg(path).output().expect("mkfs.fat");
    assert!(out.status.success(), "mkfs.fat: {}", String::from_utf8_lossy(&out.stderr));
}

/// `fsck.fat -n` of a copy of `img` after clearing what every unclean shutdown leaves: the
/// dirty flag in the boot sector (fatfs sets it while mounted) and, on FAT32, the FSInfo free
/// count hint (what a driver ignores on a dirty volume). Returns (exit code, output).
pub fn fsck_after_cut(img: &Path) -> (i32, String) {
    let copy = img.with_extension("fsck");
    let mut bytes = std::fs::read(img).unwrap();
    let fat32 = u16::from_le_bytes([bytes[0x16], bytes[0x17]]) == 0;
    let flag = if fat32 { 0x41 } else { 0x25 };
    bytes[flag] &= !1;
    if fat32 {
        let fsinfo = u16::from_le_bytes([bytes[0x30], bytes[0x31]]) as usize * 512;
        bytes[fsinfo + 488..fsinfo + 492].copy_from_slice(&u32::MAX.to_le_bytes());
    }
    std::fs::write(&copy, bytes).unwrap();
    let r = fsck(&copy);
    let _ = std::fs::remove_file(&copy);
    r
}

/// `fsck.fat -n IMG`: (exit code, output).
pub fn fsck(img: &Path) -> (i32, String) {
    let out = Command::new("fsck.fat").arg("-n").arg(img).output().expect("fsck.fat");
    let text =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.code().unwrap_or(-1), text)
}

/// The content of file number `id`: its 8-byte tag repeated (the tag starts every cluster).
pub fn content(id: u32, len: usize) -> Vec<u8> {
    let tag = format!("F{id:06}\n");
    tag.as_bytes().iter().copied().cycle().take(len).collect()
}

/// What fatfs sees: every path (directories end with '/') -> file size (0 for directories),
/// short names joined with '/'.
pub fn tree<T: fatfs::ReadWriteSeek>(fs: &fatfs::FileSystem<T>) -> BTreeMap<String, u64> {
    fn walk<T: fatfs::ReadWriteSeek>(
        dir: &fatfs::Dir<'_, T>,
        prefix: &str,
        out: &mut BTreeMap<String, u64>,
    ) {
        for e in dir.iter() {
            let e = e.expect("directory entry");
            let name = e.file_name();
            if name == "." || name == ".." {
                continue;
            }
            if e.is_dir() {
                let p = format!("{prefix}{name}/");
                out.insert(p.clone(), 0);
                walk(&e.to_dir(), &p, out);
            } else {
                out.insert(format!("{prefix}{name}"), e.len());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(&fs.root_dir(), "/", &mut out);
    out
}

/// Short-name paths of directories as fatfs sees them.
pub fn short_dirs<T: fatfs::ReadWriteSeek>(fs: &fatfs::FileSystem<T>) -> Vec<String> {
    fn walk<T: fatfs::ReadWriteSeek>(dir: &fatfs::Dir<'_, T>, prefix: &str, out: &mut Vec<String>) {
        for e in dir.iter() {
            let e = e.expect("directory entry");
            let name = e.short_file_name();
            if e.is_dir() && name != "." && name != ".." {
                let p = format!("{prefix}{name}/");
                out.push(p.clone());
                walk(&e.to_dir(), &p, out);
            }
        }
    }
    let mut out = vec!["/".to_string()];
    walk(&fs.root_dir(), "/", &mut out);
    out.sort();
    out
}

/// Reads a whole file.
pub fn read_file<T: fatfs::ReadWriteSeek>(fs: &fatfs::FileSystem<T>, path: &str) -> Vec<u8> {
    let mut f = fs.root_dir().open_file(path).expect("open");
    let mut v = Vec::new();
    f.read_to_end(&mut v).expect("read");
    v
}

/// Writes a whole new file.
pub fn write_file<T: fatfs::ReadWriteSeek>(
    fs: &fatfs::FileSystem<T>,
    path: &str,
    data: &[u8],
    sync: bool,
) -> std::io::Result<()> {
    let mut f = fs.root_dir().create_file(path)?;
    f.truncate()?;
    f.write_all(data)?;
    if sync {
        f.flush()?;
    }
    drop(f);
    Ok(())
}

/// Rewinds a storage to 0 (fatfs wants an unseeked disk).
pub fn rewind<S: Seek>(s: &mut S) {
    s.seek(std::io::SeekFrom::Start(0)).unwrap();
}

/// A disk the tests drive fatfs over, shared between fatfs and the test (raw fix-ups).
pub trait Disk {
    fn read_at(&mut self, off: u64, buf: &mut [u8]);
    fn write_at(&mut self, off: u64, data: &[u8]);
    fn flush(&mut self) {}
    fn len(&self) -> u64;
}

/// A handle on a shared disk with its own position: what fatfs owns.
pub struct Handle<D: Disk> {
    pub disk: std::rc::Rc<std::cell::RefCell<D>>,
    pub pos: u64,
}

impl<D: Disk> Handle<D> {
    pub fn new(disk: D) -> Handle<D> {
        Handle { disk: std::rc::Rc::new(std::cell::RefCell::new(disk)), pos: 0 }
    }
    pub fn clone_handle(&self) -> Handle<D> {
        Handle { disk: self.disk.clone(), pos: 0 }
    }
}

impl<D: Disk> Read for Handle<D> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let len = self.disk.borrow().len();
        let n = buf.len().min(len.saturating_sub(self.pos) as usize);
        self.disk.borrow_mut().read_at(self.pos, &mut buf[..n]);
        self.pos += n as u64;
        Ok(n)
    }
}

impl<D: Disk> Write for Handle<D> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.disk.borrow_mut().write_at(self.pos, buf);
        self.pos += buf.len() as u64;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.disk.borrow_mut().flush();
        Ok(())
    }
}

impl<D: Disk> Seek for Handle<D> {
    fn seek(&mut self, pos: std::io::SeekFrom) -> std::io::Result<u64> {
        let len = self.disk.borrow().len();
        let moved = |base: u64, d: i64| {
            base.checked_add_signed(d).ok_or_else(|| {
                std::io::Error::new(std::io::ErrorKind::InvalidInput, "seek before the start")
            })
        };
        self.pos = match pos {
            std::io::SeekFrom::Start(p) => p,
            std::io::SeekFrom::End(d) => moved(len, d)?,
            std::io::SeekFrom::Current(d) => moved(self.pos, d)?,
        };
        Ok(self.pos)
    }
}

fn raw_fat<D: Disk>(d: &mut D) -> (device::classify::fat::FatLayout, Vec<u8>) {
    let mut boot = vec![0u8; 512];
    d.read_at(0, &mut boot);
    let l = device::classify::fat::FatLayout::parse(&boot).expect("a FAT boot sector");
    let bps = u64::from(l.bytes_per_sector);
    let mut fat = vec![0u8; (u64::from(l.fat_sectors) * bps) as usize];
    d.read_at(u64::from(l.reserved_sectors) * bps, &mut fat);
    (l, fat)
}

/// `create_dir` of fatfs 0.3.6, then the fix of its known bug (rust-fatfs issue #117, PR
/// #100): it writes long-name entries before "." and "..", which fsck.fat rejects ("Expected
/// a valid '.' entry in this slot"). The clusters it allocated are found by comparing the
/// FAT before and after; a new directory's first cluster laid out as LFN, ".", LFN, ".." is
/// rewritten as ".", "..", end (and a ".." naming the FAT32 root cluster names 0, as the
/// specification wants) - through the same disk, so the device sees an ordinary write
/// to a directory cluster (as a driver without the bug would have made).
pub fn mkdir<T: fatfs::ReadWriteSeek, D: Disk>(
    fs: &fatfs::FileSystem<T>,
    raw: &Handle<D>,
    path: &str,
) -> std::io::Result<()> {
    let (l, before) = raw_fat(&mut *raw.disk.borrow_mut());
    fs.root_dir().create_dir(path)?;
    let (_, after) = raw_fat(&mut *raw.disk.borrow_mut());
    let bits: usize = match l.fat_type {
        device::classify::fat::FatType::Fat12 => 12,
        device::classify::fat::FatType::Fat16 => 16,
        device::classify::fat::FatType::Fat32 => 32,
    };
    let mut candidates = std::collections::BTreeSet::new();
    for (i, (a, b)) in before.iter().zip(&after).enumerate() {
        if a != b {
            let c = i * 8 / bits;
            candidates.extend([c.saturating_sub(1), c, c + 1]);
        }
    }
    let bps = u64::from(l.bytes_per_sector);
    for c in candidates {
        let Ok(c) = u32::try_from(c) else { continue };
        if c < 2 || c >= l.clusters + 2 {
            continue;
        }
        let at = l.cluster_sector(c) * bps;
        let mut head = [0u8; 128];
        raw.disk.borrow_mut().read_at(at, &mut head);
        let lfn = |e: &[u8]| e[11] == 0x0F;
        let named = |e: &[u8], n: &[u8]| &e[..11] == n && e[11] & 0x10 != 0;
        if lfn(&head[..32])
            && named(&head[32..64], b".          ")
            && lfn(&head[64..96])
            && named(&head[96..128], b"..         ")
        {
            let mut fixed = [0u8; 128];
            fixed[..32].copy_from_slice(&head[32..64]);
            fixed[32..64].copy_from_slice(&head[96..128]);
            // Also a FAT32 quirk of 0.3.6: ".." of a directory in the root must name cluster 0
            // (the spec's "root"), not the root's cluster.
            let dotdot = u32::from(u16::from_le_bytes([fixed[58], fixed[59]]))
                | (u32::from(u16::from_le_bytes([fixed[52], fixed[53]])) << 16);
            if l.fat_type == device::classify::fat::FatType::Fat32 && dotdot == l.root_cluster {
                fixed[52..54].fill(0);
                fixed[58..60].fill(0);
            }
            raw.disk.borrow_mut().write_at(at, &fixed);
        }
    }
    Ok(())
}
