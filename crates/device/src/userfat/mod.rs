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
//! Errno mapping: `errno.rs`, here only.
//!
//! Code: this file holds the options and the actor thread; `volume.rs` the volume (fatfs over
//! the sector store, cached open files, lookups, attributes); `ops.rs` the operations on it,
//! one per syscall family; `writeback.rs` what each mode writes after an operation and at the
//! write-back tick; `fuse.rs` the FUSE side, which queues every request to the actor;
//! `errno.rs` the errno mapping and name checks; `disk.rs` the sector store (the buffer
//! cache); `nodes.rs` inode numbers; `time.rs` FAT times.

mod disk;
mod errno;
mod fuse;
mod nodes;
mod ops;
mod time;
mod volume;
mod writeback;

use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Duration;

use fuser::{Config, MountOption, Session};

use crate::error::DeviceError;
use fuse::{FatFs, Job};
use volume::Volume;

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
