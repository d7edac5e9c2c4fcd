//! A FAT volume served in user space (`nvstack device serve-fat`), for machines whose kernel
//! has no vfat module: the NVFAT experiment's file system.
//!
//! ```text
//!   application -> kernel FUSE -> this server (fatfs + buffer cache) -> DISK (the device
//!   daemon's disk.img: model, volatile cache, NVRAM cache, counters) -> image file
//! ```
//!
//! The volume is read and written by the `fatfs` crate (docs/nvfat.md says why that crate)
//! through [`disk::SectorDisk`], which plays the kernel's buffer cache. When dirty sectors go
//! to the device is the point of the experiment, and follows what Linux 2.6 did for the
//! paper's VFAT:
//!
//! - **async** (default, the paper's Async-PostMark): dirty sectors stay in the server; every
//!   `writeback_interval` (5 s) the sectors dirty for at least `dirty_expire` (30 s) are
//!   written and the device is flushed (pdflush: `dirty_writeback_centisecs`,
//!   `dirty_expire_centisecs`); past `dirty_max` bytes everything dirty is written at once
//!   (`dirty_ratio`); fsync, fsyncdir and unmount write everything and flush the device.
//! - **sync** (`-o sync`, Sync-PostMark): every operation that changes the volume writes what
//!   it dirtied and flushes the device before it answers.
//! - **metadata through** (NVFAT, chosen by `device attach` when the device has an NVRAM
//!   cache): at the end of every operation the sectors that hold metadata (boot sector, FAT
//!   copies, root directory, directory clusters: the device's own classifier,
//!   `classify::fat`) are written at once - the device's NVRAM cache makes them durable
//!   without touching the flash; file data follows the async rules.
//!
//! Threads: `fatfs` is not `Send` (its clock and code-page hooks are plain trait objects), so
//! one actor thread owns the volume and runs every request as a job from a channel; FUSE
//! worker threads only queue jobs. The actor's idle wake-ups drive the write-back.
//!
//! POSIX on FAT, as the kernel's vfat does it: no owners (every object belongs to the user
//! who mounts; chown to anyone else is EPERM), no modes beyond read-only (chmod EPERM), no
//! links, symlinks or special files (EPERM), names case-insensitive (a lookup returns the name
//! as stored), times in 2-second steps, files below 4 GiB (EFBIG). Differences: a directory
//! cannot move to another directory (EXDEV: `fatfs` does not rewrite its `..` entry; `mv`
//! copies instead); a file removed while open is gone for its open descriptors too (ENOENT).
//! Errno mapping: [`errno_of`], here only.

pub(crate) mod disk;
pub(crate) mod nodes;
pub(crate) mod time;

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime};

use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    LockOwner, MountOption, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, Session,
    WriteFlags,
};

use crate::classify::Classifier;
use crate::error::DeviceError;
use disk::{SECTOR, SectorDisk};
use nodes::{Nodes, ROOT, join, split};

/// Attribute and entry lifetime in the kernel: only this server changes the volume.
const TTL: Duration = Duration::from_secs(1);
/// Largest FAT file.
const FILE_BYTES_MAX: u64 = u32::MAX as u64;
/// Longest name (VFAT long names).
const NAME_MAX: usize = 255;
/// Queued requests at most (FUSE threads block beyond).
const QUEUE_MAX: usize = 256;

/// `nvstack device serve-fat` options.
#[derive(Debug, Clone)]
pub(crate) struct FatServeConfig {
    /// The device file (the daemon's disk.img, or any image file).
    pub(crate) disk: PathBuf,
    pub(crate) mountpoint: PathBuf,
    pub(crate) sync: bool,
    pub(crate) metadata_through: bool,
    pub(crate) writeback_interval: Duration,
    pub(crate) dirty_expire: Duration,
    pub(crate) dirty_max_bytes: u64,
    pub(crate) read_cache_bytes: u64,
}

impl FatServeConfig {
    pub(crate) fn new(disk: PathBuf, mountpoint: PathBuf) -> Self {
        FatServeConfig {
            disk,
            mountpoint,
            sync: false,
            metadata_through: false,
            writeback_interval: Duration::from_secs(5),
            dirty_expire: Duration::from_secs(30),
            dirty_max_bytes: 8 << 20,
            read_cache_bytes: 64 << 20,
        }
    }
}

/// The sector store, shared between `fatfs` (which owns its storage) and the server.
#[derive(Clone)]
struct Shared(Rc<RefCell<SectorDisk<File>>>);

impl Read for Shared {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        self.0.borrow_mut().read(b)
    }
}
impl Write for Shared {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.0.borrow_mut().write(b)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.0.borrow_mut().flush()
    }
}
impl Seek for Shared {
    fn seek(&mut self, p: SeekFrom) -> io::Result<u64> {
        self.0.borrow_mut().seek(p)
    }
}

type Fs = fatfs::FileSystem<Shared>;
type Dir<'a> = fatfs::Dir<'a, Shared>;
type FatFile<'a> = fatfs::File<'a, Shared>;
/// Open files by inode: a `fatfs::File` knows its directory entry's place and its current
/// cluster, so a write through it neither searches the directory nor walks the chain again.
type Files<'a> = HashMap<u64, FatFile<'a>>;

self_cell::self_cell!(
    /// The volume and the files open on it (they borrow it).
    struct FsCell {
        owner: Fs,
        #[covariant]
        dependent: Files,
    }
);

/// Most files kept open at once (past it, all are closed; they reopen on use).
const OPEN_FILES_MAX: usize = 4096;

/// The one place errors become errno values.
fn errno_of(e: &io::Error) -> Errno {
    if let Some(n) = e.raw_os_error() {
        return Errno::from_i32(n);
    }
    match e.kind() {
        io::ErrorKind::NotFound => Errno::ENOENT,
        io::ErrorKind::AlreadyExists => Errno::EEXIST,
        io::ErrorKind::InvalidInput => Errno::EINVAL,
        io::ErrorKind::UnexpectedEof => Errno::EIO,
        // fatfs reports these as `Other` with a message.
        _ => match e.to_string().as_str() {
            "No space left on device" => Errno::ENOSPC,
            "Directory not empty" => Errno::ENOTEMPTY,
            "Is a directory" => Errno::EISDIR,
            "Not a directory" => Errno::ENOTDIR,
            "File name too long" => Errno::ENAMETOOLONG,
            "File name is empty" | "File name contains unsupported characters" => Errno::EINVAL,
            _ => Errno::EIO,
        },
    }
}

#[allow(clippy::needless_pass_by_value)] // the shape `map_err` wants
fn io_err(e: io::Error) -> Errno {
    errno_of(&e)
}

/// One directory entry as the server needs it.
#[derive(Debug, Clone)]
struct Entry {
    name: String,
    dir: bool,
    len: u64,
    modified: SystemTime,
    accessed: SystemTime,
    created: SystemTime,
    read_only: bool,
}

fn entry_of(e: &fatfs::DirEntry<'_, Shared>) -> Entry {
    let acc = e.accessed();
    Entry {
        name: e.file_name(),
        dir: e.is_dir(),
        len: e.len(),
        modified: time::from_dos(e.modified()),
        accessed: time::from_dos(fatfs::DateTime {
            date: acc,
            time: fatfs::Time { hour: 0, min: 0, sec: 0, millis: 0 },
        }),
        created: time::from_dos(e.created()),
        read_only: e.attributes().contains(fatfs::FileAttributes::READ_ONLY),
    }
}

fn name_str(name: &OsStr) -> Result<&str, Errno> {
    let n = name.to_str().ok_or(Errno::EINVAL)?;
    if n.len() > NAME_MAX {
        return Err(Errno::ENAMETOOLONG);
    }
    if n.is_empty() || n == "." || n == ".." || n.contains('/') {
        return Err(Errno::EINVAL);
    }
    Ok(n)
}

/// What the server did, logged at unmount.
#[derive(Debug, Default)]
struct Counters {
    ops: u64,
    writebacks: u64,
    metadata_commits: u64,
}

/// The mounted volume; lives on the actor thread only.
///
/// Invariant (V1): a cached `fatfs::File` is the only handle through which its file's entry
/// is changed; anything that moves or removes entries (unlink, rmdir, rename) drops the
/// cached files it may affect first, since their entry places would be stale.
struct Volume {
    cell: FsCell,
    disk: Rc<RefCell<SectorDisk<File>>>,
    nodes: Nodes,
    cfg: FatServeConfig,
    classifier: Option<Classifier>,
    uid: u32,
    gid: u32,
    cluster: u32,
    start: Instant,
    last_writeback: Instant,
    counters: Counters,
}

impl Volume {
    fn open(cfg: &FatServeConfig) -> Result<Volume, String> {
        let file = File::options()
            .read(true)
            .write(true)
            .open(&cfg.disk)
            .map_err(|e| format!("cannot open {}: {e}", cfg.disk.display()))?;
        let clean_max = (cfg.read_cache_bytes / SECTOR) as usize;
        let disk =
            SectorDisk::new(file, clean_max).map_err(|e| format!("{}: {e}", cfg.disk.display()))?;
        let disk = Rc::new(RefCell::new(disk));
        let opts = fatfs::FsOptions::new().time_provider(&time::UTC_CLOCK);
        let fs = Fs::new(Shared(disk.clone()), opts)
            .map_err(|e| format!("{} holds no FAT file system: {e}", cfg.disk.display()))?;
        let cluster = fs.cluster_size();
        let classifier = if cfg.metadata_through {
            disk.borrow_mut().track_fresh();
            let c = Classifier::probe(&mut *disk.borrow_mut());
            if !matches!(c, Classifier::Fat(_)) {
                return Err("the metadata classifier does not recognize the FAT layout".into());
            }
            Some(c)
        } else {
            None
        };
        // SAFETY: getuid/getgid have no preconditions.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        let now = Instant::now();
        Ok(Volume {
            cell: FsCell::new(fs, |_| HashMap::new()),
            disk,
            nodes: Nodes::default(),
            cfg: cfg.clone(),
            classifier,
            uid,
            gid,
            cluster,
            start: now,
            last_writeback: now,
            counters: Counters::default(),
        })
    }

    fn fs(&self) -> &Fs {
        self.cell.borrow_owner()
    }

    fn root(&self) -> Dir<'_> {
        self.fs().root_dir()
    }

    /// Runs `op` on the open file of `ino` (opened on first use). A failed operation closes
    /// the file: its position state may be mid-change.
    fn with_file<R>(
        &mut self,
        ino: u64,
        op: impl FnOnce(&mut FatFile<'_>) -> Result<R, Errno>,
    ) -> Result<R, Errno> {
        let path = self.nodes.path(ino).map(str::to_string).ok_or(Errno::ENOENT)?;
        self.cell.with_dependent_mut(|fs, files| {
            if !files.contains_key(&ino) {
                if files.len() >= OPEN_FILES_MAX {
                    files.clear();
                }
                let f = fs.root_dir().open_file(&path).map_err(io_err)?;
                files.insert(ino, f);
            }
            let r = op(files.get_mut(&ino).expect("just opened"));
            if r.is_err() {
                files.remove(&ino);
            }
            r
        })
    }

    /// Closes the cached file of `ino` (V1).
    fn close_file(&mut self, ino: Option<u64>) {
        if let Some(ino) = ino {
            self.cell.with_dependent_mut(|_, files| files.remove(&ino));
        }
    }

    /// Closes every cached file (V1: a rename may move any entry under it).
    fn close_files(&mut self) {
        self.cell.with_dependent_mut(|_, files| files.clear());
    }

    fn dir(&self, path: &str) -> Result<Dir<'_>, Errno> {
        if path.is_empty() { Ok(self.root()) } else { self.root().open_dir(path).map_err(io_err) }
    }

    fn path(&self, ino: INodeNo) -> Result<String, Errno> {
        self.nodes.path(ino.0).map(str::to_string).ok_or(Errno::ENOENT)
    }

    /// The entry at `path` (`None` for the root, which has none).
    fn find(&self, path: &str) -> Result<Option<Entry>, Errno> {
        if path.is_empty() {
            return Ok(None);
        }
        let (parent, name) = split(path);
        let lname = name.to_lowercase();
        for e in self.dir(parent)?.iter() {
            let e = e.map_err(io_err)?;
            if e.file_name().to_lowercase() == lname
                || e.short_file_name().eq_ignore_ascii_case(name)
            {
                return Ok(Some(entry_of(&e)));
            }
        }
        Err(Errno::ENOENT)
    }

    fn attr(&self, ino: u64, e: Option<&Entry>) -> FileAttr {
        let epoch = SystemTime::UNIX_EPOCH;
        let (dir, len, m, a, c, ro) = match e {
            None => (true, 0, epoch, epoch, epoch, false),
            Some(e) => (e.dir, e.len, e.modified, e.accessed, e.created, e.read_only),
        };
        let perm = match (dir, ro) {
            (true, _) => 0o755,
            (false, false) => 0o644,
            (false, true) => 0o444,
        };
        FileAttr {
            ino: INodeNo(ino),
            size: if dir { u64::from(self.cluster) } else { len },
            blocks: len.div_ceil(u64::from(self.cluster)) * u64::from(self.cluster) / 512,
            atime: a,
            mtime: m,
            ctime: m,
            crtime: c,
            kind: if dir { FileType::Directory } else { FileType::RegularFile },
            perm,
            nlink: if dir { 2 } else { 1 },
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            flags: 0,
            blksize: self.cluster,
        }
    }

    /// A lookup's answer: the node (one more kernel reference) and its attributes.
    fn entry(&mut self, path: &str) -> Result<FileAttr, Errno> {
        let e = self.find(path)?;
        let stored = match &e {
            Some(e) => join(split(path).0, &e.name),
            None => String::new(),
        };
        let ino = self.nodes.lookup(&stored).ok_or(Errno::ENFILE)?;
        Ok(self.attr(ino, e.as_ref()))
    }

    fn exists(&self, path: &str) -> Result<Option<Entry>, Errno> {
        match self.find(path) {
            Ok(e) => Ok(e),
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn seconds(&self) -> u64 {
        self.start.elapsed().as_secs()
    }

    /// After an operation that changed the volume: what its mode writes now (module docs).
    fn finish(&mut self) -> io::Result<()> {
        self.counters.ops += 1;
        if self.cfg.sync {
            return self.disk.borrow_mut().sync();
        }
        if self.classifier.is_some() {
            self.commit_metadata()?;
        }
        let dirty = self.disk.borrow().pending_sectors() as u64 * SECTOR;
        if dirty > self.cfg.dirty_max_bytes {
            self.disk.borrow_mut().commit()?;
        }
        Ok(())
    }

    /// NVFAT: the metadata sectors this operation wrote go to the device now. Only the sectors
    /// written since the last call are classified (a pending data sector stays data until it
    /// is written again: a cluster that becomes a directory's is written - zeroed - by the
    /// operation that makes it one). The classifier learns from the metadata about to be
    /// written first (a new directory's entry in its parent names its clusters), then picks.
    fn commit_metadata(&mut self) -> io::Result<()> {
        let Some(mut cls) = self.classifier.take() else { return Ok(()) };
        let mut disk = self.disk.borrow_mut();
        let fresh = disk.take_fresh();
        for &s in &fresh {
            if cls.class_of(s).is_metadata() {
                if let Some(data) = disk.pending_data(s).map(<[u8]>::to_vec) {
                    cls.wrote(s, &data, &mut *disk);
                }
            }
        }
        let picked: Vec<u64> =
            fresh.iter().copied().filter(|s| cls.class_of(*s).is_metadata()).collect();
        let r = disk.commit_only(&picked);
        if r.is_err() {
            disk.restore_fresh(&fresh);
        }
        drop(disk);
        self.classifier = Some(cls);
        if r.as_ref().is_ok_and(|n| *n > 0) {
            self.counters.metadata_commits += 1;
        }
        r.map(drop)
    }

    /// The write-back tick: sectors dirty for `dirty_expire` are written and the device is
    /// flushed (only if something was written).
    fn writeback_tick(&mut self) -> io::Result<()> {
        self.last_writeback = Instant::now();
        let now = self.seconds();
        let expire = self.cfg.dirty_expire.as_secs();
        let n = self.disk.borrow_mut().commit_where(|_, e, _| e + expire <= now)?;
        if n > 0 {
            self.counters.writebacks += 1;
            self.disk.borrow_mut().sync()?;
        }
        Ok(())
    }

    fn sync_all(&mut self) -> Result<(), Errno> {
        self.disk.borrow_mut().sync().map_err(io_err)
    }

    // ---- operations ----

    fn write(&mut self, ino: INodeNo, off: u64, data: &[u8]) -> Result<u32, Errno> {
        if off.checked_add(data.len() as u64).is_none_or(|e| e > FILE_BYTES_MAX) {
            return Err(Errno::EFBIG);
        }
        self.with_file(ino.0, |f| {
            let len = f.seek(SeekFrom::End(0)).map_err(io_err)?;
            if off > len {
                write_zeros(f, off - len)?;
            }
            f.seek(SeekFrom::Start(off)).map_err(io_err)?;
            f.write_all(data).map_err(io_err)?;
            f.flush().map_err(io_err)?;
            Ok(data.len() as u32)
        })
    }

    fn read(&mut self, ino: INodeNo, off: u64, size: u32) -> Result<Vec<u8>, Errno> {
        self.with_file(ino.0, |f| {
            let len = f.seek(SeekFrom::End(0)).map_err(io_err)?;
            if off >= len {
                return Ok(Vec::new());
            }
            f.seek(SeekFrom::Start(off)).map_err(io_err)?;
            let mut buf = vec![0u8; (u64::from(size)).min(len - off) as usize];
            f.read_exact(&mut buf).map_err(io_err)?;
            Ok(buf)
        })
    }

    fn set_size(&mut self, ino: u64, size: u64) -> Result<(), Errno> {
        if size > FILE_BYTES_MAX {
            return Err(Errno::EFBIG);
        }
        self.with_file(ino, |f| {
            let len = f.seek(SeekFrom::End(0)).map_err(io_err)?;
            if size < len {
                f.seek(SeekFrom::Start(size)).map_err(io_err)?;
                f.truncate().map_err(io_err)?;
            } else if size > len {
                write_zeros(f, size - len)?;
            }
            f.flush().map_err(io_err)
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn setattr(
        &mut self,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        mtime: Option<fuser::TimeOrNow>,
    ) -> Result<FileAttr, Errno> {
        let path = self.path(ino)?;
        let e = self.find(&path)?;
        let cur = self.attr(ino.0, e.as_ref());
        if uid.is_some_and(|u| u != cur.uid) || gid.is_some_and(|g| g != cur.gid) {
            return Err(Errno::EPERM);
        }
        if mode.is_some_and(|m| (m & 0o7777) as u16 != cur.perm) {
            return Err(Errno::EPERM);
        }
        let is_file = e.as_ref().is_some_and(|e| !e.dir);
        if let Some(s) = size {
            if !is_file {
                return Err(Errno::EISDIR);
            }
            self.set_size(ino.0, s)?;
        }
        if let (Some(t), true) = (mtime, is_file) {
            let when = match t {
                fuser::TimeOrNow::SpecificTime(t) => t,
                fuser::TimeOrNow::Now => SystemTime::now(),
            };
            self.with_file(ino.0, |f| {
                // Deprecated in fatfs 0.3 in favour of a custom clock, but it is the only way
                // to store a time the application chose (utimensat: touch -d, tar, cp -p).
                #[allow(deprecated)]
                f.set_modified(time::to_dos(when));
                f.flush().map_err(io_err)
            })?;
        }
        let e = self.find(&path)?;
        Ok(self.attr(ino.0, e.as_ref()))
    }

    fn create(&mut self, parent: INodeNo, name: &OsStr, flags: i32) -> Result<FileAttr, Errno> {
        let path = join(&self.path(parent)?, name_str(name)?);
        match self.exists(&path)? {
            Some(_) if flags & libc::O_EXCL != 0 => return Err(Errno::EEXIST),
            Some(e) if e.dir => return Err(Errno::EISDIR),
            Some(_) => {
                let attr = self.entry(&path)?;
                if flags & libc::O_TRUNC != 0 {
                    self.set_size(attr.ino.0, 0)?;
                    let e = self.find(&path)?;
                    return Ok(self.attr(attr.ino.0, e.as_ref()));
                }
                return Ok(attr);
            }
            None => {
                let mut f = self.root().create_file(&path).map_err(io_err)?;
                f.flush().map_err(io_err)?;
            }
        }
        self.entry(&path)
    }

    fn mkdir(&mut self, parent: INodeNo, name: &OsStr) -> Result<FileAttr, Errno> {
        let path = join(&self.path(parent)?, name_str(name)?);
        if self.exists(&path)?.is_some() {
            return Err(Errno::EEXIST);
        }
        self.root().create_dir(&path).map_err(io_err)?;
        let mut disk = self.disk.borrow_mut();
        let fresh: Vec<u64> = disk.pending().map(|(s, _)| s).collect();
        let fixed = fresh
            .into_iter()
            .filter(|s| fix_dot_entries(disk.pending_mut(*s).expect("pending")))
            .count();
        drop(disk);
        if fixed != 1 {
            eprintln!(
                "nvstack serve-fat: mkdir {path}: {fixed} directory clusters needed the dot-entry repair (expected 1)"
            );
        }
        self.entry(&path)
    }

    fn remove(&mut self, parent: INodeNo, name: &OsStr, dir: bool) -> Result<(), Errno> {
        let path = join(&self.path(parent)?, name_str(name)?);
        let e = self.find(&path)?.ok_or(Errno::EBUSY)?;
        match (e.dir, dir) {
            (true, false) => return Err(Errno::EISDIR),
            (false, true) => return Err(Errno::ENOTDIR),
            _ => {}
        }
        let stored = join(split(&path).0, &e.name);
        if dir {
            self.close_files();
        } else {
            self.close_file(self.nodes.ino_of(&stored));
        }
        self.root().remove(&stored).map_err(io_err)?;
        self.nodes.removed(&stored);
        Ok(())
    }

    fn rename(
        &mut self,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
    ) -> Result<(), Errno> {
        if flags.contains(RenameFlags::RENAME_EXCHANGE)
            || flags.contains(RenameFlags::RENAME_WHITEOUT)
        {
            return Err(Errno::EINVAL);
        }
        let (sp, dp) = (self.path(parent)?, self.path(newparent)?);
        let (sname, dname) = (name_str(name)?, name_str(newname)?);
        let src_e = self.find(&join(&sp, sname))?.ok_or(Errno::EBUSY)?;
        let src = join(&sp, &src_e.name);
        let dst = join(&dp, dname);
        if src == dst {
            return Ok(());
        }
        if src_e.dir
            && (dst.starts_with(&format!("{src}/"))
                || dst.to_lowercase().starts_with(&format!("{}/", src.to_lowercase())))
        {
            return Err(Errno::EINVAL);
        }
        if src_e.dir && sp.to_lowercase() != dp.to_lowercase() {
            // fatfs moves the entry but does not rewrite the directory's `..`.
            return Err(Errno::EXDEV);
        }
        if let Some(de) = self.exists(&dst)? {
            let dst_stored = join(&dp, &de.name);
            if dst_stored.to_lowercase() == src.to_lowercase() {
                // The same entry under another case: FAT keeps the stored name.
                return Ok(());
            }
            if flags.contains(RenameFlags::RENAME_NOREPLACE) {
                return Err(Errno::EEXIST);
            }
            match (src_e.dir, de.dir) {
                (false, true) => return Err(Errno::EISDIR),
                (true, false) => return Err(Errno::ENOTDIR),
                _ => {}
            }
            self.close_files();
            self.root().remove(&dst_stored).map_err(io_err)?;
            self.nodes.removed(&dst_stored);
        }
        self.close_files();
        {
            let (sdir, ddir) = (self.dir(&sp)?, self.dir(&dp)?);
            sdir.rename(&src_e.name, &ddir, dname).map_err(io_err)?;
        }
        self.nodes.renamed(&src, &dst);
        Ok(())
    }

    fn readdir(&mut self, ino: INodeNo) -> Result<Vec<(u64, FileType, String)>, Errno> {
        let path = self.path(ino)?;
        if let Some(e) = self.find(&path)? {
            if !e.dir {
                return Err(Errno::ENOTDIR);
            }
        }
        let mut out = vec![(ino.0, FileType::Directory, ".".to_string())];
        let parent = if path.is_empty() { String::new() } else { split(&path).0.to_string() };
        out.push((self.nodes.ino_of(&parent).unwrap_or(ROOT), FileType::Directory, "..".into()));
        for e in self.dir(&path)?.iter() {
            let e = e.map_err(io_err)?;
            let name = e.file_name();
            if name == "." || name == ".." {
                continue;
            }
            let child = join(&path, &name);
            // Numbers for entries the kernel has not looked up: stable per path, above the
            // table's counter range (readdir's d_ino is informational on FUSE).
            let ino = self.nodes.ino_of(&child).unwrap_or_else(|| path_ino(&child));
            let kind = if e.is_dir() { FileType::Directory } else { FileType::RegularFile };
            out.push((ino, kind, name));
        }
        Ok(out)
    }

    fn close(self) -> Result<String, String> {
        let Volume { cell, disk, counters, .. } = self;
        // Closing the files flushes their entries; then the volume can be unmounted.
        let fs = cell.into_owner();
        // Unmounting writes the FSInfo sector and clears the volume's dirty flag.
        fs.unmount().map_err(|e| format!("unmount: {e}"))?;
        disk.borrow_mut().sync().map_err(|e| format!("final write-back: {e}"))?;
        let c = disk.borrow().counters();
        Ok(format!(
            "{} operations, {} write-back ticks, {} metadata commits; device: {} read \
             requests, {} write requests ({} sectors), {} flushes, {} cache hits",
            counters.ops,
            counters.writebacks,
            counters.metadata_commits,
            c.read_requests,
            c.write_requests,
            c.sectors_written,
            c.syncs,
            c.hits
        ))
    }
}

/// fatfs 0.3.6 writes a long-name entry before the `.` and `..` entries of a new directory
/// (its `write_entry` makes long names for every name), so `.` is not in slot 0 and `..` not
/// in slot 1 as FAT requires (`fsck.fat` repairs it; a file created later may take slot 0).
/// On the first sector of a fresh directory cluster - [LFN "."][.][LFN ".."][..] - this moves
/// `.` and `..` to slots 0 and 1 and frees the rest. Returns whether the sector was that.
fn fix_dot_entries(sector: &mut [u8]) -> bool {
    const E: usize = 32;
    const ATTR: usize = 11;
    let lfn = |e: &[u8], c: u8| e[ATTR] == 0x0F && e[1] == c && e[2] == 0;
    let sfn = |e: &[u8], name: &[u8; 11]| e[..11] == name[..] && e[ATTR] & 0x10 != 0;
    let (dot, dotdot) = (*b".          ", *b"..         ");
    if sector.len() < 5 * E
        || !lfn(&sector[..E], b'.')
        || !sfn(&sector[E..2 * E], &dot)
        || !lfn(&sector[2 * E..3 * E], b'.')
        || sector[2 * E + 3] != b'.'
        || !sfn(&sector[3 * E..4 * E], &dotdot)
        || sector[4 * E] != 0
    {
        return false;
    }
    let (d, dd) = (sector[E..2 * E].to_vec(), sector[3 * E..4 * E].to_vec());
    sector[..E].copy_from_slice(&d);
    sector[E..2 * E].copy_from_slice(&dd);
    sector[2 * E..4 * E].fill(0);
    true
}

fn write_zeros(f: &mut FatFile<'_>, mut n: u64) -> Result<(), Errno> {
    let z = [0u8; 4096];
    while n > 0 {
        let k = n.min(z.len() as u64) as usize;
        f.write_all(&z[..k]).map_err(io_err)?;
        n -= k as u64;
    }
    Ok(())
}

fn path_ino(path: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in path.to_lowercase().bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h | (1 << 63)
}

type Job = Box<dyn FnOnce(&mut Volume) + Send>;

/// The FUSE side: queues every request to the actor.
struct FatFs {
    jobs: mpsc::SyncSender<Job>,
}

impl FatFs {
    fn run(&self, job: impl FnOnce(&mut Volume) + Send + 'static) {
        // The actor outlives the session; a send fails only while it is shutting down, when
        // the kernel no longer waits for answers.
        let _ = self.jobs.send(Box::new(job));
    }
}

impl FatFs {
    /// fsync and fsyncdir: everything dirty written, the device flushed.
    fn sync_all(&self, reply: ReplyEmpty) {
        self.run(move |v| match v.sync_all() {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        });
    }
}

/// Runs a changing operation and what its mode writes after it; an error from either is the
/// answer.
fn modify<T>(v: &mut Volume, op: impl FnOnce(&mut Volume) -> Result<T, Errno>) -> Result<T, Errno> {
    let r = op(v);
    let fin = v.finish().map_err(io_err);
    let t = r?;
    fin?;
    Ok(t)
}

impl Filesystem for FatFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let name = name.to_owned();
        self.run(move |v| {
            let r = v.path(parent).and_then(|p| Ok(join(&p, name_str(&name)?)));
            match r.and_then(|p| v.entry(&p)) {
                Ok(a) => reply.entry(&TTL, &a, Generation(0)),
                Err(e) => reply.error(e),
            }
        });
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.run(move |v| {
            if v.nodes.forget(ino.0, nlookup) {
                // A later lookup of its path makes a new node that opens the file again: two
                // handles on one entry would break V1, so this one closes now.
                v.close_file(Some(ino.0));
            }
        });
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.run(move |v| match v.path(ino).and_then(|p| v.find(&p)) {
            Ok(e) => reply.attr(&TTL, &v.attr(ino.0, e.as_ref())),
            Err(e) => reply.error(e),
        });
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        self.run(move |v| match modify(v, |v| v.setattr(ino, mode, uid, gid, size, mtime)) {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        });
    }

    fn mknod(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        // Regular files come through create; FAT has no special files.
        reply.error(Errno::EPERM);
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let name = name.to_owned();
        self.run(move |v| match modify(v, |v| v.mkdir(parent, &name)) {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        });
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let name = name.to_owned();
        self.run(move |v| match modify(v, |v| v.remove(parent, &name, false)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        });
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let name = name.to_owned();
        self.run(move |v| match modify(v, |v| v.remove(parent, &name, true)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        });
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let (name, newname) = (name.to_owned(), newname.to_owned());
        self.run(move |v| {
            match modify(v, |v| v.rename(parent, &name, newparent, &newname, flags)) {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            }
        });
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let trunc = flags.0 & libc::O_TRUNC != 0;
        self.run(move |v| {
            let r = v.path(ino).and_then(|p| match v.find(&p)? {
                Some(e) if e.dir => Err(Errno::EISDIR),
                Some(_) if trunc => modify(v, |v| v.set_size(ino.0, 0)),
                Some(_) => Ok(()),
                None => Err(Errno::EISDIR),
            });
            match r {
                Ok(()) => reply.opened(FileHandle(0), FopenFlags::empty()),
                Err(e) => reply.error(e),
            }
        });
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.run(move |v| match v.read(ino, offset, size) {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(e),
        });
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let data = data.to_vec();
        self.run(move |v| match modify(v, |v| v.write(ino, offset, &data)) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e),
        });
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lo: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn fsync(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _ds: bool, reply: ReplyEmpty) {
        // FAT keeps no per-file list of dirty sectors here: an fsync writes them all.
        self.sync_all(reply);
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _ds: bool,
        reply: ReplyEmpty,
    ) {
        self.sync_all(reply);
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        self.run(move |v| match v.readdir(ino) {
            Ok(list) => {
                for (i, (ino, kind, name)) in list.iter().enumerate().skip(offset as usize) {
                    if reply.add(INodeNo(*ino), (i + 1) as u64, *kind, name) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(e),
        });
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        self.run(move |v| match v.fs().stats() {
            Ok(s) => {
                let (total, free) = (u64::from(s.total_clusters()), u64::from(s.free_clusters()));
                let c = s.cluster_size();
                reply.statfs(total, free, free, 0, 0, c, NAME_MAX as u32, c);
            }
            Err(e) => reply.error(errno_of(&e)),
        });
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let name = name.to_owned();
        self.run(move |v| match modify(v, |v| v.create(parent, &name, flags)) {
            Ok(a) => reply.created(&TTL, &a, Generation(0), FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(e),
        });
    }

    fn symlink(
        &self,
        _req: &Request,
        _p: INodeNo,
        _n: &OsStr,
        _t: &std::path::Path,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EPERM);
    }

    fn link(&self, _req: &Request, _ino: INodeNo, _p: INodeNo, _n: &OsStr, reply: ReplyEntry) {
        reply.error(Errno::EPERM);
    }
}

/// The actor: owns the volume, runs jobs, drives the write-back; returns its summary line.
fn actor(
    cfg: &FatServeConfig,
    jobs: &mpsc::Receiver<Job>,
    ready: &mpsc::SyncSender<Result<(), String>>,
) -> Result<String, String> {
    let mut v = match Volume::open(cfg) {
        Ok(v) => v,
        Err(e) => {
            let _ = ready.send(Err(e.clone()));
            return Err(e);
        }
    };
    let _ = ready.send(Ok(()));
    let tick = cfg.writeback_interval.max(Duration::from_millis(100));
    loop {
        let wait = tick.saturating_sub(v.last_writeback.elapsed());
        match jobs.recv_timeout(wait) {
            Ok(job) => {
                let epoch = v.seconds();
                v.disk.borrow_mut().set_epoch(epoch);
                job(&mut v);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
        if !cfg.sync && v.last_writeback.elapsed() >= tick {
            if let Err(e) = v.writeback_tick() {
                eprintln!("nvstack serve-fat: write-back failed (kept dirty, retried): {e}");
            }
        }
    }
    v.close()
}

/// Serves the FAT volume on `cfg.disk` at `cfg.mountpoint` until it is unmounted, then writes
/// everything back, marks the volume clean and flushes the device.
pub(crate) fn serve_fat(cfg: &FatServeConfig) -> Result<(), DeviceError> {
    let (tx, rx) = mpsc::sync_channel::<Job>(QUEUE_MAX);
    let (ready_tx, ready_rx) = mpsc::sync_channel(1);
    let c = cfg.clone();
    let actor = std::thread::Builder::new()
        .name("fat-volume".into())
        .spawn(move || actor(&c, &rx, &ready_tx))
        .map_err(|e| DeviceError::io("cannot start the volume thread for", &cfg.disk, e))?;
    let opened = ready_rx.recv().unwrap_or_else(|_| Err("the volume thread died".into()));
    if let Err(e) = opened {
        let _ = actor.join();
        return Err(DeviceError::Invalid(e));
    }
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName(format!("nvstack-fat:{}", cfg.disk.display())),
        MountOption::Subtype("nvstack-fat".into()),
        MountOption::DefaultPermissions,
        MountOption::NoAtime,
    ];
    config.n_threads = Some(2);
    let session = Session::new(FatFs { jobs: tx }, &cfg.mountpoint, &config);
    let run = match session {
        Ok(s) => s.run(),
        Err(e) => Err(e),
    };
    // The session (and with it the job sender) is gone: the actor drains and closes.
    let closed = actor.join().unwrap_or_else(|_| Err("the volume thread panicked".into()));
    run.map_err(|e| DeviceError::io("FUSE session failed at", &cfg.mountpoint, e))?;
    let line = closed.map_err(DeviceError::Invalid)?;
    println!("nvstack serve-fat {}: {line}", cfg.mountpoint.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(name: &[u8; 11], attr: u8) -> [u8; 32] {
        let mut e = [0u8; 32];
        e[..11].copy_from_slice(name);
        e[11] = attr;
        e
    }

    fn lfn(c: u8, second: u8) -> [u8; 32] {
        let mut e = [0xFFu8; 32];
        e[0] = 0x41;
        e[1] = c;
        e[2] = 0;
        e[3] = second;
        e[4] = 0;
        e[11] = 0x0F;
        e
    }

    #[test]
    fn the_dot_entries_of_a_fresh_directory_move_to_slots_0_and_1() {
        let mut s = vec![0u8; 512];
        let dot = raw(b".          ", 0x10);
        let dotdot = raw(b"..         ", 0x10);
        s[..32].copy_from_slice(&lfn(b'.', 0));
        s[32..64].copy_from_slice(&dot);
        s[64..96].copy_from_slice(&lfn(b'.', b'.'));
        s[96..128].copy_from_slice(&dotdot);
        assert!(fix_dot_entries(&mut s));
        assert_eq!(&s[..32], &dot);
        assert_eq!(&s[32..64], &dotdot);
        assert!(s[64..].iter().all(|b| *b == 0));
        // Already right, or anything else: left alone.
        let before = s.clone();
        assert!(!fix_dot_entries(&mut s));
        assert_eq!(s, before);
        let mut other = vec![0u8; 512];
        other[..32].copy_from_slice(&lfn(b'.', 0));
        other[32..64].copy_from_slice(&raw(b"FILE    TXT", 0x20));
        assert!(!fix_dot_entries(&mut other));
    }

    #[test]
    fn fatfs_errors_map_to_the_errno_a_fat_driver_gives() {
        let other = |m: &str| io::Error::other(m.to_string());
        let table = [
            (io::Error::new(io::ErrorKind::NotFound, "x"), Errno::ENOENT),
            (io::Error::new(io::ErrorKind::AlreadyExists, "x"), Errno::EEXIST),
            (other("No space left on device"), Errno::ENOSPC),
            (other("Directory not empty"), Errno::ENOTEMPTY),
            (other("Is a directory"), Errno::EISDIR),
            (other("Not a directory"), Errno::ENOTDIR),
            (other("File name too long"), Errno::ENAMETOOLONG),
            (other("File name contains unsupported characters"), Errno::EINVAL),
            (other("something new"), Errno::EIO),
            (io::Error::from_raw_os_error(libc::EROFS), Errno::EROFS),
        ];
        for (e, want) in table {
            assert_eq!(errno_of(&e), want, "{e}");
        }
    }

    #[test]
    fn names_are_checked_before_fatfs_sees_them() {
        assert_eq!(name_str(OsStr::new("ok name.txt")), Ok("ok name.txt"));
        assert_eq!(name_str(OsStr::new(&"n".repeat(256))), Err(Errno::ENAMETOOLONG));
        assert_eq!(name_str(OsStr::new("..")), Err(Errno::EINVAL));
    }
}
