//! The FUSE front end: a directory with exactly one device file plus two control files.
//!
//! ```text
//!   <dir>/disk.img   ino 2  rw-------  the modeled disk (size of the image); opened with
//!                                       FOPEN_DIRECT_IO so the kernel keeps no second cache
//!   <dir>/stat.json  ino 3  r--------  counters as JSON (one snapshot per open, taken by
//!                                       its read at offset 0)
//!   <dir>/ctl        ino 4  -w-------  one command per write(): `flush` (the volatile cache
//!                                       and the NVRAM cache: `device flush`),
//!                                       `cut SEED MODE`, `arm-cut FLUSHES WRITES SEED MODE`
//! ```
//!
//! Request mapping (disk.img): read -> `Engine::read`; write -> `Engine::write`; fsync (the
//! loop device's cache flush, after all earlier writes) -> `Engine::flush`; fallocate
//! punch-hole / zero-range (discard, write-zeroes) -> `Engine::discard`; FUSE flush (close) is
//! not a durability point and does nothing.
//!
//! Locking: one mutex around the engine, so the actuator and its clock stay serialized however
//! many FUSE threads run. In `sleep` timing the thread sleeps *after* releasing the mutex,
//! until the modeled completion time, so requests queue on the modeled actuator while the
//! application computes. The session ACL is the default (owner only): only root, who mounts
//! it, can open these files.
//!
//! Errno mapping lives here and only here: `errno_of`.

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, UNIX_EPOCH};

use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, INodeNo, LockOwner,
    MountOption, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry,
    ReplyOpen, ReplyWrite, Request, Session, WriteFlags,
};

use crate::cache::CutMode;
use crate::engine::{ArmedCut, Engine, EngineConfig, FileMedium, Timing};
use crate::error::DeviceError;
use crate::model::Actuator;
use crate::model::presets::{ModelOverrides, Preset, build_model};
use crate::nvcache::{self, CacheMode, ImageId};

/// The device file's name in the served directory.
pub(crate) const DISK_FILE: &str = "disk.img";
pub(crate) const STAT_FILE: &str = "stat.json";
pub(crate) const CTL_FILE: &str = "ctl";

const INO_DISK: u64 = 2;
const INO_STAT: u64 = 3;
const INO_CTL: u64 = 4;
const TTL: Duration = Duration::from_secs(1);
/// Longest control command accepted, in bytes.
const CTL_COMMAND_MAX_BYTES: usize = 256;

/// Everything `serve` needs.
#[derive(Debug, Clone)]
pub(crate) struct ServeConfig {
    pub(crate) image: PathBuf,
    pub(crate) dir: PathBuf,
    pub(crate) model: Preset,
    pub(crate) overrides: ModelOverrides,
    pub(crate) timing: Timing,
    pub(crate) trace: Option<PathBuf>,
    pub(crate) histogram: Option<PathBuf>,
    pub(crate) volatile_bytes_max: u64,
    pub(crate) lbn_bytes: u64,
    pub(crate) threads: usize,
    /// The NVRAM block cache, if any.
    pub(crate) nvram: Option<NvramConfig>,
}

/// `--nvram PATH --nvram-cache-size SIZE --nvram-cache MODE`.
#[derive(Debug, Clone)]
pub(crate) struct NvramConfig {
    pub(crate) path: PathBuf,
    /// Sectors; `None` keeps the region's recorded capacity.
    pub(crate) capacity_sectors: Option<u64>,
    /// `None` keeps the region's recorded mode (metadata for a new region).
    pub(crate) mode: Option<CacheMode>,
}

#[derive(Debug)]
struct DeviceFs {
    /// The engine; every request takes this lock for its whole engine call (never while
    /// sleeping).
    engine: Arc<Mutex<Engine>>,
    timing: Timing,
    /// Wall-clock origin of the modeled clock in `sleep` timing.
    epoch: Instant,
    size_bytes: u64,
    /// stat.json per open handle: the document its read at offset 0 produced, so a reader
    /// that needs several reads gets one consistent document (counters move between reads).
    /// At most `MAX_STAT_OPENS` at once.
    stat_snapshots: Mutex<std::collections::HashMap<u64, Arc<Vec<u8>>>>,
    next_fh: std::sync::atomic::AtomicU64,
}

/// Open handles of stat.json at once; beyond, open fails with EMFILE.
const MAX_STAT_OPENS: usize = 1024;

fn errno_of(e: &io::Error) -> Errno {
    e.raw_os_error().map_or(Errno::EIO, Errno::from_i32)
}

fn attr(ino: u64, size: u64) -> FileAttr {
    let (kind, perm, nlink) = match ino {
        1 => (FileType::Directory, 0o755, 2),
        INO_DISK => (FileType::RegularFile, 0o600, 1),
        INO_STAT => (FileType::RegularFile, 0o400, 1),
        _ => (FileType::RegularFile, 0o200, 1),
    };
    FileAttr {
        ino: INodeNo(ino),
        size,
        blocks: size.div_ceil(512),
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind,
        perm,
        nlink,
        uid: 0,
        gid: 0,
        rdev: 0,
        flags: 0,
        blksize: 4096,
    }
}

impl DeviceFs {
    fn lock(&self) -> MutexGuard<'_, Engine> {
        // A panic while holding the lock is a bug; the engine state may be inconsistent, so
        // propagate rather than continue.
        self.engine.lock().expect("engine mutex poisoned")
    }

    fn now_ns(&self) -> Option<u64> {
        match self.timing {
            Timing::Sleep => Some(self.epoch.elapsed().as_nanos() as u64),
            Timing::Account => None,
        }
    }

    /// In `sleep` timing, waits until the modeled completion time.
    fn complete_at(&self, end_ns: u64) {
        if self.timing == Timing::Sleep {
            let due = self.epoch + Duration::from_nanos(end_ns);
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
        }
    }

    fn size_of(&self, ino: u64) -> Option<u64> {
        match ino {
            1 | INO_CTL => Some(0),
            INO_DISK => Some(self.size_bytes),
            // Reads are direct, so a size larger than the document is harmless: the read
            // returns the real length.
            INO_STAT => Some(64 * 1024),
            _ => None,
        }
    }

    fn control(&self, text: &str) -> Result<(), String> {
        let words: Vec<&str> = text.split_whitespace().collect();
        let num = |s: &str| s.parse::<u64>().map_err(|_| format!("not a number: {s:?}"));
        let mode = |s: &str| CutMode::parse(s).ok_or_else(|| format!("unknown cut mode {s:?}"));
        let mut e = self.lock();
        match words.as_slice() {
            ["flush"] => {
                e.flush().and_then(|()| e.drain().map(drop)).map_err(|err| err.to_string())
            }
            ["cut", seed, m] => e.cut(num(seed)?, mode(m)?).map(|_| ()).map_err(|x| x.to_string()),
            ["arm-cut", f, w, seed, m] => e
                .arm_cut(ArmedCut {
                    flushes: num(f)?,
                    writes: num(w)?,
                    seed: num(seed)?,
                    mode: mode(m)?,
                })
                .map_err(str::to_string),
            _ => Err(format!("unknown control command {text:?}")),
        }
    }
}

impl Filesystem for DeviceFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let ino = match (u64::from(parent), name.to_str()) {
            (1, Some(DISK_FILE)) => INO_DISK,
            (1, Some(STAT_FILE)) => INO_STAT,
            (1, Some(CTL_FILE)) => INO_CTL,
            _ => return reply.error(Errno::ENOENT),
        };
        let size = self.size_of(ino).expect("known inode");
        reply.entry(&TTL, &attr(ino, size), fuser::Generation(0));
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.size_of(ino.into()) {
            Some(size) => reply.attr(&TTL, &attr(ino.into(), size)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<std::time::SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<std::time::SystemTime>,
        _chgtime: Option<std::time::SystemTime>,
        _bkuptime: Option<std::time::SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let Some(cur) = self.size_of(ino.into()) else {
            return reply.error(Errno::ENOENT);
        };
        // The disk has a fixed size; truncating the control files (O_TRUNC) is harmless.
        if u64::from(ino) == INO_DISK && size.is_some_and(|s| s != cur) {
            return reply.error(Errno::EPERM);
        }
        reply.attr(&TTL, &attr(ino.into(), cur));
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if self.size_of(ino.into()).is_none() || u64::from(ino) == 1 {
            return reply.error(Errno::ENOENT);
        }
        let mut fh = 0;
        if u64::from(ino) == INO_STAT {
            let mut snaps = self.stat_snapshots.lock().expect("snapshot lock");
            if snaps.len() >= MAX_STAT_OPENS {
                return reply.error(Errno::EMFILE);
            }
            fh = self.next_fh.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            snaps.insert(fh, Arc::new(Vec::new()));
        }
        // Direct IO: no page cache for the device file on top of the loop device's.
        reply.opened(FileHandle(fh), FopenFlags::FOPEN_DIRECT_IO);
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match u64::from(ino) {
            INO_DISK => {
                let r = self.lock().read(self.now_ns(), offset, u64::from(size));
                match r {
                    Ok((data, end_ns)) => {
                        self.complete_at(end_ns);
                        reply.data(&data);
                    }
                    Err(e) => reply.error(errno_of(&e)),
                }
            }
            INO_STAT => {
                let kept = self.stat_snapshots.lock().expect("snapshot lock").get(&fh.0).cloned();
                let doc = match kept {
                    Some(doc) if offset > 0 => doc,
                    _ => {
                        let stats = self.lock().stats();
                        let mut doc = serde_json::to_vec_pretty(&stats).expect("stats serialize");
                        doc.push(b'\n');
                        let doc = Arc::new(doc);
                        let mut snaps = self.stat_snapshots.lock().expect("snapshot lock");
                        if let Some(slot) = snaps.get_mut(&fh.0) {
                            *slot = Arc::clone(&doc);
                        }
                        doc
                    }
                };
                let start = (offset as usize).min(doc.len());
                let end = (start + size as usize).min(doc.len());
                reply.data(&doc[start..end]);
            }
            _ => reply.error(Errno::EBADF),
        }
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
        match u64::from(ino) {
            INO_DISK => {
                let r = self.lock().write(self.now_ns(), offset, data);
                match r {
                    Ok(end_ns) => {
                        self.complete_at(end_ns);
                        reply.written(data.len() as u32);
                    }
                    Err(e) => reply.error(errno_of(&e)),
                }
            }
            INO_CTL => {
                if data.len() > CTL_COMMAND_MAX_BYTES {
                    return reply.error(Errno::E2BIG);
                }
                match std::str::from_utf8(data)
                    .map_err(|e| e.to_string())
                    .and_then(|t| self.control(t))
                {
                    Ok(()) => reply.written(data.len() as u32),
                    Err(msg) => {
                        eprintln!("nvstack device: control: {msg}");
                        reply.error(Errno::EINVAL);
                    }
                }
            }
            _ => reply.error(Errno::EBADF),
        }
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

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.stat_snapshots.lock().expect("snapshot lock").remove(&fh.0);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        if u64::from(ino) != INO_DISK {
            return reply.ok();
        }
        let r = self.lock().flush();
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno_of(&e)),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        if u64::from(ino) != INO_DISK {
            return reply.error(Errno::EOPNOTSUPP);
        }
        let zeroing = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE;
        if mode & zeroing == 0 {
            // Plain allocation: the device is fully allocated already.
            let fits = offset.checked_add(length).is_some_and(|e| e <= self.size_bytes);
            return if fits { reply.ok() } else { reply.error(Errno::ENOSPC) };
        }
        let r = self.lock().discard(offset, length);
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno_of(&e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if u64::from(ino) != 1 {
            return reply.error(Errno::ENOTDIR);
        }
        let entries = [
            (1, FileType::Directory, "."),
            (1, FileType::Directory, ".."),
            (INO_DISK, FileType::RegularFile, DISK_FILE),
            (INO_STAT, FileType::RegularFile, STAT_FILE),
            (INO_CTL, FileType::RegularFile, CTL_FILE),
        ];
        for (i, (ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(*ino), (i + 1) as u64, *kind, name) {
                break;
            }
        }
        reply.ok();
    }
}

/// Opens (creating or recovering) the NVRAM cache of `image` and puts it in front of the
/// engine's drive, before anything is served.
pub(crate) fn open_nvcache(
    engine: &mut Engine,
    image: &Path,
    nv: &NvramConfig,
) -> Result<(), DeviceError> {
    let id = ImageId::of(image).map_err(|e| DeviceError::io("cannot stat image", image, e))?;
    let (cache, report) = nvcache::open_file(&nv.path, &id, nv.capacity_sectors, nv.mode)
        .map_err(|e| DeviceError::NvCache { path: nv.path.clone(), detail: e.to_string() })?;
    let line = format!(
        "NVRAM cache {}: {}{} sectors resident ({} recovered, {} transaction(s) rolled back), \
         capacity {} sectors, mode {}",
        nv.path.display(),
        if report.created { "created, " } else { "" },
        cache.resident_sectors(),
        report.sectors_recovered,
        report.transactions_rolled_back,
        cache.capacity_sectors(),
        cache.mode().as_str()
    );
    engine
        .attach_nvcache(cache, report, nv.path.display().to_string())
        .map_err(|e| DeviceError::NvCache { path: nv.path.clone(), detail: e.to_string() })?;
    println!("{line}, file system {}", engine.filesystem());
    Ok(())
}

/// The image file as a destage target (offline drain): plain writes, synced at the end.
struct ImageBacking<'a>(&'a File);

impl nvcache::Backing for ImageBacking<'_> {
    fn write_durable(&mut self, lba: u64, data: &[u8]) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        self.0.write_all_at(data, lba * 512)
    }
}

/// `nvstack device drain IMAGE --nvram PATH`: recovers the NVRAM cache of a detached (or cut)
/// image and writes every cached sector into it, so that the image alone is the device (for
/// fsck, copying, or attaching without the region). Returns the sectors written.
pub(crate) fn drain_offline(image: &Path, nvram: &Path) -> Result<u64, DeviceError> {
    let nv_err = |e: nvcache::NvCacheError| DeviceError::NvCache {
        path: nvram.to_path_buf(),
        detail: e.to_string(),
    };
    if !nvram.exists() {
        return Err(DeviceError::Invalid(format!("{} does not exist", nvram.display())));
    }
    let id = ImageId::of(image).map_err(|e| DeviceError::io("cannot stat image", image, e))?;
    let file = File::options()
        .read(true)
        .write(true)
        .open(image)
        .map_err(|e| DeviceError::io("cannot open image", image, e))?;
    let (mut cache, _) = nvcache::open_file(nvram, &id, None, None).map_err(nv_err)?;
    let n = cache.drain(&mut ImageBacking(&file)).map_err(nv_err)?;
    file.sync_all().map_err(|e| DeviceError::io("cannot sync image", image, e))?;
    cache.close();
    Ok(n)
}

/// Serves the image at `cfg.dir` in the foreground until the directory is unmounted, then
/// shuts the engine down cleanly (flush unless cut, sync, trace and histogram out).
pub(crate) fn serve(cfg: &ServeConfig) -> Result<(), DeviceError> {
    let file = File::options()
        .read(true)
        .write(true)
        .open(&cfg.image)
        .map_err(|e| DeviceError::io("cannot open image", &cfg.image, e))?;
    let size =
        file.metadata().map_err(|e| DeviceError::io("cannot stat image", &cfg.image, e))?.len();
    if size == 0 || size % 512 != 0 {
        return Err(DeviceError::Invalid(format!(
            "image {} has {size} bytes; it must be a positive multiple of 512",
            cfg.image.display()
        )));
    }
    let model = build_model(cfg.model, &cfg.overrides, size).map_err(DeviceError::Invalid)?;
    let engine_cfg = EngineConfig {
        timing: cfg.timing,
        volatile_bytes_max: cfg.volatile_bytes_max,
        trace: cfg.trace.clone(),
        histogram: cfg.histogram.clone(),
        lbn_bytes: cfg.lbn_bytes,
    };
    let mut engine = Engine::new(FileMedium::new(file, size), Actuator::new(model), &engine_cfg)
        .map_err(|e| DeviceError::io("cannot create trace/histogram for", &cfg.image, e))?;
    if let Some(nv) = &cfg.nvram {
        open_nvcache(&mut engine, &cfg.image, nv)?;
    }
    let engine = Arc::new(Mutex::new(engine));
    std::fs::create_dir_all(&cfg.dir).map_err(|e| DeviceError::io("cannot create", &cfg.dir, e))?;
    let fs = DeviceFs {
        engine: engine.clone(),
        timing: cfg.timing,
        epoch: Instant::now(),
        size_bytes: size,
        stat_snapshots: Mutex::default(),
        next_fh: std::sync::atomic::AtomicU64::new(0),
    };
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName(format!("nvstack-device:{}", cfg.image.display())),
        MountOption::Subtype("nvstack-device".into()),
        MountOption::NoAtime,
    ];
    config.n_threads = Some(cfg.threads.max(1));
    let session = Session::new(fs, &cfg.dir, &config)
        .map_err(|e| DeviceError::io("cannot mount FUSE at", &cfg.dir, e))?;
    let run = session.run();
    let mut e = engine.lock().expect("engine mutex poisoned");
    let fin = e.finish();
    run.map_err(|err| DeviceError::io("FUSE session failed at", &cfg.dir, err))?;
    fin.map_err(|err| DeviceError::io("cannot flush image", &cfg.image, err))
}
