//! The mounted volume: `fatfs` over the sector store, the files it keeps open, and the
//! lookups and attributes every operation starts from. It lives on the actor thread only
//! (`fatfs` is not `Send`), so nothing here locks.
//!
//! Invariant (V1): a cached `fatfs::File` is the only handle through which its file's entry
//! is changed; anything that moves or removes entries (unlink, rmdir, rename) drops the
//! cached files it may affect first, since their entry places would be stale. The cache holds
//! at most `OPEN_FILES_MAX` files (past it, all are closed; they reopen on use).

use std::cell::RefCell;
use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::rc::Rc;
use std::time::{Instant, SystemTime};

use fuser::{Errno, FileAttr, FileType, INodeNo};

use super::disk::{SECTOR, SectorDisk};
use super::errno::io_err;
use super::nodes::{Nodes, join, split};
use super::{FatServeConfig, time};
use crate::classify::Classifier;

/// The sector store, shared between `fatfs` (which owns its storage) and the server.
#[derive(Clone)]
pub(super) struct Shared(Rc<RefCell<SectorDisk<File>>>);

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

pub(super) type Fs = fatfs::FileSystem<Shared>;
pub(super) type Dir<'a> = fatfs::Dir<'a, Shared>;
pub(super) type FatFile<'a> = fatfs::File<'a, Shared>;
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

/// One directory entry as the server needs it.
#[derive(Debug, Clone)]
pub(super) struct Entry {
    pub(super) name: String,
    pub(super) dir: bool,
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

/// What the server did, logged at unmount.
#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) ops: u64,
    pub(super) writebacks: u64,
    pub(super) metadata_commits: u64,
}

/// The mounted volume; lives on the actor thread only.
///
/// Invariant (V1): a cached `fatfs::File` is the only handle through which its file's entry
/// is changed; anything that moves or removes entries (unlink, rmdir, rename) drops the
/// cached files it may affect first, since their entry places would be stale.
pub(super) struct Volume {
    cell: FsCell,
    pub(super) disk: Rc<RefCell<SectorDisk<File>>>,
    pub(super) nodes: Nodes,
    pub(super) cfg: FatServeConfig,
    pub(super) classifier: Option<Classifier>,
    uid: u32,
    gid: u32,
    cluster: u32,
    start: Instant,
    pub(super) last_writeback: Instant,
    pub(super) counters: Counters,
}

impl Volume {
    pub(super) fn open(cfg: &FatServeConfig) -> Result<Volume, String> {
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

    pub(super) fn fs(&self) -> &Fs {
        self.cell.borrow_owner()
    }

    pub(super) fn root(&self) -> Dir<'_> {
        self.fs().root_dir()
    }

    /// Runs `op` on the open file of `ino` (opened on first use). A failed operation closes
    /// the file: its position state may be mid-change.
    pub(super) fn with_file<R>(
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
    pub(super) fn close_file(&mut self, ino: Option<u64>) {
        if let Some(ino) = ino {
            self.cell.with_dependent_mut(|_, files| files.remove(&ino));
        }
    }

    /// Closes every cached file (V1: a rename may move any entry under it).
    pub(super) fn close_files(&mut self) {
        self.cell.with_dependent_mut(|_, files| files.clear());
    }

    pub(super) fn dir(&self, path: &str) -> Result<Dir<'_>, Errno> {
        if path.is_empty() { Ok(self.root()) } else { self.root().open_dir(path).map_err(io_err) }
    }

    pub(super) fn path(&self, ino: INodeNo) -> Result<String, Errno> {
        self.nodes.path(ino.0).map(str::to_string).ok_or(Errno::ENOENT)
    }

    /// The entry at `path` (`None` for the root, which has none).
    pub(super) fn find(&self, path: &str) -> Result<Option<Entry>, Errno> {
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

    pub(super) fn attr(&self, ino: u64, e: Option<&Entry>) -> FileAttr {
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
    pub(super) fn entry(&mut self, path: &str) -> Result<FileAttr, Errno> {
        let e = self.find(path)?;
        let stored = match &e {
            Some(e) => join(split(path).0, &e.name),
            None => String::new(),
        };
        let ino = self.nodes.lookup(&stored).ok_or(Errno::ENFILE)?;
        Ok(self.attr(ino, e.as_ref()))
    }

    pub(super) fn exists(&self, path: &str) -> Result<Option<Entry>, Errno> {
        match self.find(path) {
            Ok(e) => Ok(e),
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub(super) fn seconds(&self) -> u64 {
        self.start.elapsed().as_secs()
    }

    pub(super) fn close(self) -> Result<String, String> {
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
