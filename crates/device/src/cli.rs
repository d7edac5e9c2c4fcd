//! The `nvstack device` command line: clap definitions and [`run`].
//!
//! The daemon is started by re-executing the current binary as
//! `<exe> device serve IMAGE DIR ... --foreground`, so the binary that embeds
//! [`DeviceCommand`] must route `device <subcommand>` to [`run`].

use std::path::{Path, PathBuf};

use clap::Subcommand;

use crate::attach::{self, AttachRequest, FatDriver, Mkfs};
use crate::cache::CutMode;
use crate::engine::Timing;
use crate::error::DeviceError;
use crate::model::presets::{ModelOverrides, Preset};
use crate::nvcache::CacheMode;
use crate::serve::{self, NvramConfig, ServeConfig};
use crate::userfat::{self, FatServeConfig};

/// Parses a size: bytes, or a number with K, M, G, T (binary multiples; `KiB`/`K`/`k` alike).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let t = t.strip_suffix("iB").or_else(|| t.strip_suffix('B')).unwrap_or(t);
    let (num, shift) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 10),
        Some('m' | 'M') => (&t[..t.len() - 1], 20),
        Some('g' | 'G') => (&t[..t.len() - 1], 30),
        Some('t' | 'T') => (&t[..t.len() - 1], 40),
        _ => (t, 0),
    };
    let n: u64 = num.trim().parse().map_err(|_| format!("not a size: {s:?} (e.g. 512M, 4G)"))?;
    n.checked_mul(1u64 << shift).ok_or_else(|| format!("size too large: {s:?}"))
}

/// Options of the serving daemon (also accepted by `attach`).
#[derive(Debug, Clone, clap::Args)]
pub struct ServeOptions {
    /// Device model: hdd-7200, hdd-15k, hdd-7200-500g (seek + rotation + transfer), ssd
    /// (latency + transfer), flash (a NAND chip behind a log-block FTL: page reads/programs,
    /// merges, block erases, energy; see --flash-preset, --log-blocks and the `flash` object
    /// of `device stat --json`), none (zero cost).
    #[arg(long, default_value = "hdd-7200")]
    pub(crate) model: Preset,
    /// sleep: complete requests in wall time as modeled; account: only accumulate busy time.
    #[arg(long, value_enum, default_value = "account")]
    pub(crate) timing: Timing,
    #[command(flatten)]
    pub(crate) overrides: ModelOverrides,
    /// Write a per-request trace to this file.
    #[arg(long)]
    pub(crate) trace: Option<PathBuf>,
    /// Write a per-LBN write histogram to this file at detach.
    #[arg(long)]
    pub(crate) histogram: Option<PathBuf>,
    /// LBN size of the histogram, bytes.
    #[arg(long, default_value_t = 4096)]
    pub(crate) lbn_bytes: u64,
    /// Most bytes held in the volatile write cache (0 = write-through); past it, the oldest
    /// held writes are written back.
    #[arg(long, default_value = "64M", value_parser = parse_size)]
    pub(crate) volatile_max: u64,
    /// FUSE worker threads (the actuator stays serialized).
    #[arg(long, default_value_t = 2)]
    pub(crate) threads: usize,
    /// NVRAM block cache (NVFAT): a region file (e.g. /dev/shm/disk.nv) holding a write cache
    /// of 512-byte sectors in front of the drive. A write it absorbs is durable when it
    /// returns and costs no disk time; reads of cached sectors come from it; when full, the
    /// least recently written sector is destaged. Created if missing; recovered at attach
    /// after a power cut; drained by `device flush` and detach. A region with sectors of
    /// another image is refused.
    #[arg(long, value_name = "PATH")]
    pub(crate) nvram: Option<PathBuf>,
    /// Capacity of the NVRAM cache, e.g. 128K (rounded down to 512-byte sectors). Needed to
    /// create the region; default: the region's recorded capacity.
    #[arg(long, value_name = "SIZE", value_parser = parse_size, requires = "nvram")]
    pub(crate) nvram_cache_size: Option<u64>,
    /// What the NVRAM cache absorbs: metadata (the file system's metadata sectors, found from
    /// its own layout: ext2/3/4 and FAT) or all (every write). Default: the region's recorded
    /// mode, metadata for a new region.
    #[arg(long, value_enum, requires = "nvram")]
    pub(crate) nvram_cache: Option<CacheMode>,
}

impl ServeOptions {
    /// The NVRAM cache settings, if `--nvram` was given.
    pub(crate) fn nvram_config(&self) -> Result<Option<NvramConfig>, DeviceError> {
        let Some(path) = &self.nvram else { return Ok(None) };
        let capacity_sectors = match self.nvram_cache_size {
            Some(b) if b < 512 => {
                return Err(DeviceError::Invalid(format!(
                    "--nvram-cache-size {b} is less than one 512-byte sector"
                )));
            }
            Some(b) => Some(b / 512),
            None => None,
        };
        Ok(Some(NvramConfig { path: abs(path), capacity_sectors, mode: self.nvram_cache }))
    }
}

fn abs(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

impl ServeOptions {
    /// The same options as command-line words, for re-executing `device serve`.
    pub(crate) fn to_args(&self) -> Vec<String> {
        let mut a = vec![
            "--model".to_string(),
            self.model.name().to_string(),
            "--timing".to_string(),
            self.timing.as_str().to_string(),
            "--lbn-bytes".to_string(),
            self.lbn_bytes.to_string(),
            "--volatile-max".to_string(),
            self.volatile_max.to_string(),
            "--threads".to_string(),
            self.threads.to_string(),
        ];
        if let Some(t) = &self.trace {
            a.extend(["--trace".to_string(), abs(t).display().to_string()]);
        }
        if let Some(h) = &self.histogram {
            a.extend(["--histogram".to_string(), abs(h).display().to_string()]);
        }
        if let Some(p) = &self.nvram {
            a.extend(["--nvram".to_string(), abs(p).display().to_string()]);
        }
        if let Some(n) = self.nvram_cache_size {
            a.extend(["--nvram-cache-size".to_string(), n.to_string()]);
        }
        if let Some(m) = self.nvram_cache {
            a.extend(["--nvram-cache".to_string(), m.as_str().to_string()]);
        }
        let o = &self.overrides;
        let mut opt = |name: &str, v: Option<String>| {
            if let Some(v) = v {
                a.extend([name.to_string(), v]);
            }
        };
        opt("--rpm", o.rpm.map(|v| v.to_string()));
        opt("--avg-seek-ms", o.avg_seek_ms.map(|v| v.to_string()));
        opt("--track-to-track-ms", o.track_to_track_ms.map(|v| v.to_string()));
        opt("--full-stroke-ms", o.full_stroke_ms.map(|v| v.to_string()));
        opt("--media-mb-s", o.media_mb_s.map(|v| v.to_string()));
        opt("--heads", o.heads.map(|v| v.to_string()));
        opt("--capacity-sectors", o.capacity_sectors.map(|v| v.to_string()));
        opt("--overhead-us", o.overhead_us.map(|v| v.to_string()));
        opt("--flash-preset", o.flash_preset.map(|v| v.name().to_string()));
        opt("--log-blocks", o.log_blocks.map(|v| v.to_string()));
        a
    }
}

/// `device serve-fat` options.
#[derive(Debug, Clone, clap::Args)]
pub struct FatServeOptions {
    /// Every change is written and the device flushed before the request returns.
    #[arg(long)]
    sync: bool,
    /// Metadata sectors (boot, FAT, directories) are written to the device at the end of
    /// every change, for an NVRAM cache in the device to make durable (NVFAT).
    #[arg(long)]
    metadata_through: bool,
    /// Seconds between write-back ticks.
    #[arg(long, default_value_t = 5)]
    writeback_interval: u64,
    /// Seconds a sector stays dirty before a tick writes it.
    #[arg(long, default_value_t = 30)]
    dirty_expire: u64,
    /// Dirty bytes past which everything dirty is written at once.
    #[arg(long, default_value = "8M", value_parser = parse_size)]
    dirty_max: u64,
    /// Clean sectors kept for reads, bytes.
    #[arg(long, default_value = "64M", value_parser = parse_size)]
    read_cache: u64,
}

impl FatServeOptions {
    fn config(&self, disk: PathBuf, mountpoint: PathBuf) -> FatServeConfig {
        let mut cfg = FatServeConfig::new(disk, mountpoint);
        cfg.sync = self.sync;
        cfg.metadata_through = self.metadata_through;
        cfg.writeback_interval = std::time::Duration::from_secs(self.writeback_interval);
        cfg.dirty_expire = std::time::Duration::from_secs(self.dirty_expire);
        cfg.dirty_max_bytes = self.dirty_max;
        cfg.read_cache_bytes = self.read_cache;
        cfg
    }
}

/// `nvstack device <subcommand>`.
#[derive(Debug, Clone, Subcommand)]
pub enum DeviceCommand {
    /// Create a sparse image file.
    Create {
        image: PathBuf,
        /// Size, e.g. 256M, 4G.
        #[arg(long, value_parser = parse_size)]
        size: u64,
    },
    /// Serve IMAGE as DIR/disk.img through FUSE (in the background unless --foreground).
    Serve {
        image: PathBuf,
        dir: PathBuf,
        #[command(flatten)]
        options: ServeOptions,
        /// Run in this process until DIR is unmounted.
        #[arg(long)]
        foreground: bool,
    },
    /// Serve IMAGE, put a loop device on it, optionally mkfs, and mount it at MOUNTPOINT.
    Attach {
        image: PathBuf,
        mountpoint: PathBuf,
        #[command(flatten)]
        options: ServeOptions,
        /// Size of the image if it has to be created (default 256M); must match otherwise. With
        /// --model flash it is the FTL's logical space; the chip adds the log blocks and one
        /// spare block (e.g. 32M on k9f1208: 2048 + 64 + 1 blocks of 16 KiB).
        #[arg(long, value_parser = parse_size)]
        size: Option<u64>,
        /// Make this file system on the device first.
        #[arg(long, value_enum)]
        mkfs: Option<Mkfs>,
        /// Options for mount -o, e.g. data=journal. For the user-space FAT server: sync (every
        /// change written and flushed before it returns: Sync-PostMark), async (default),
        /// writeback=SECONDS (5), expire=SECONDS (30).
        #[arg(long)]
        mount_options: Option<String>,
        /// Who serves a FAT volume: kernel (vfat over the loop device) or user (`device
        /// serve-fat`: the fatfs crate through FUSE, on the same modeled device). Default:
        /// kernel if /proc/filesystems lists vfat, user otherwise. With --nvram the user
        /// server writes metadata through to the device's NVRAM cache at once (NVFAT).
        #[arg(long, value_enum)]
        fat: Option<FatDriver>,
    },
    /// Serve the FAT volume on DISK at MOUNTPOINT in user space, in the foreground, until
    /// MOUNTPOINT is unmounted (`attach` runs it for FAT volumes on kernels without vfat).
    /// Dirty sectors are held and written back as Linux 2.6 did for vfat: every
    /// --writeback-interval, those older than --dirty-expire, all of them past --dirty-max,
    /// at fsync and at unmount.
    ServeFat {
        disk: PathBuf,
        mountpoint: PathBuf,
        #[command(flatten)]
        options: FatServeOptions,
    },
    /// Print the device's counters (modeled busy time, requests, bytes, seek distance).
    Stat {
        mountpoint: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Power cut: drop/tear volatile writes, then unmount without anything reaching the image.
    Cut {
        mountpoint: PathBuf,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        #[arg(long, value_enum, default_value = "seeded")]
        mode: CutMode,
    },
    /// Arm a power cut after F more flushes and then W more writes (or at the next flush).
    ArmCut {
        mountpoint: PathBuf,
        #[arg(long, default_value_t = 0)]
        after_flushes: u64,
        #[arg(long, default_value_t = 0)]
        after_writes: u64,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        #[arg(long, value_enum, default_value = "seeded")]
        mode: CutMode,
    },
    /// Make every volatile write durable now, and drain the NVRAM cache into the image.
    Flush { mountpoint: PathBuf },
    /// Offline: recover the NVRAM cache of a detached or power-cut IMAGE and write every cached
    /// sector into it (then the image alone is the device: for fsck or copying).
    Drain {
        image: PathBuf,
        /// The region given to `attach --nvram`.
        #[arg(long, value_name = "PATH")]
        nvram: PathBuf,
    },
    /// Unmount, remove the loop device, flush and stop the daemon.
    Detach { mountpoint: PathBuf },
}

fn print_human(v: &serde_json::Value) {
    if let Some(map) = v.as_object() {
        for (k, val) in map {
            println!("{k:24} {val}");
        }
    }
}

fn attach_and_report(req: &AttachRequest, options: &ServeOptions) -> Result<(), DeviceError> {
    let st = attach::attach(req)?;
    let via = match (&st.loop_device, st.fat_server_pid) {
        (Some(dev), _) => dev.clone(),
        (None, Some(pid)) => format!("user-space FAT server, pid {pid}"),
        (None, None) => "?".into(),
    };
    println!(
        "attached {} at {} ({}, model {}, timing {})",
        st.image.display(),
        st.mountpoint.display(),
        via,
        options.model,
        options.timing.as_str()
    );
    Ok(())
}

/// Runs one `nvstack device` subcommand.
pub fn run(cmd: DeviceCommand) -> Result<(), DeviceError> {
    match cmd {
        DeviceCommand::Create { image, size } => attach::create_image(&image, size),
        DeviceCommand::Serve { image, dir, options, foreground } => {
            if foreground {
                let nvram = options.nvram_config()?;
                serve::serve(&ServeConfig {
                    image,
                    dir,
                    model: options.model,
                    overrides: options.overrides,
                    timing: options.timing,
                    trace: options.trace,
                    histogram: options.histogram,
                    volatile_bytes_max: options.volatile_max,
                    lbn_bytes: options.lbn_bytes,
                    threads: options.threads,
                    nvram,
                })
            } else {
                let size = std::fs::metadata(&image)
                    .map_err(|e| DeviceError::io("cannot stat image", &image, e))?
                    .len();
                let dir = abs(&dir);
                let log = dir.with_extension("serve.log");
                let child =
                    attach::spawn_daemon(&abs(&image), &dir, &options.to_args(), &log, size)?;
                println!(
                    "serving {} at {} (pid {}, log {})",
                    image.display(),
                    dir.display(),
                    child.id(),
                    log.display()
                );
                Ok(())
            }
        }
        DeviceCommand::Attach { image, mountpoint, options, size, mkfs, mount_options, fat } => {
            let req = AttachRequest {
                image,
                mountpoint,
                serve_args: options.to_args(),
                size_bytes: size,
                mkfs,
                mount_options,
                fat,
                nvram_cache: options.nvram.is_some(),
            };
            attach_and_report(&req, &options)
        }
        DeviceCommand::ServeFat { disk, mountpoint, options } => {
            userfat::serve_fat(&options.config(disk, mountpoint))
        }
        DeviceCommand::Stat { mountpoint, json } => {
            let v = attach::stat(&mountpoint)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&v).expect("json"));
            } else {
                print_human(&v);
            }
            Ok(())
        }
        DeviceCommand::Cut { mountpoint, seed, mode } => {
            let report = attach::cut(&mountpoint, seed, mode)?;
            println!("{}", serde_json::to_string(&report).expect("json"));
            Ok(())
        }
        DeviceCommand::ArmCut { mountpoint, after_flushes, after_writes, seed, mode } => {
            attach::arm_cut(&mountpoint, after_flushes, after_writes, seed, mode)
        }
        DeviceCommand::Flush { mountpoint } => {
            attach::flush(&mountpoint)?;
            if let Ok(v) = attach::stat(&mountpoint) {
                let nv = &v["nvcache"];
                if nv.is_object() {
                    println!(
                        "flushed; NVRAM cache drained ({} sectors destaged since attach, {} resident)",
                        nv["destaged"], nv["sectors_resident"]
                    );
                }
            }
            Ok(())
        }
        DeviceCommand::Drain { image, nvram } => {
            let n = serve::drain_offline(&image, &nvram)?;
            println!("drained {n} sector(s) from {} into {}", nvram.display(), image.display());
            Ok(())
        }
        DeviceCommand::Detach { mountpoint } => {
            for w in attach::detach(&mountpoint)? {
                eprintln!("nvstack device: {w}");
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::flash::nand::NandPreset;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Top {
        #[command(subcommand)]
        cmd: DeviceCommand,
    }

    #[test]
    fn sizes_parse() {
        let table =
            [("512", 512), ("4K", 4096), ("64M", 64 << 20), ("1GiB", 1 << 30), ("2g", 2 << 30)];
        for (s, want) in table {
            assert_eq!(parse_size(s), Ok(want), "{s}");
        }
        assert!(parse_size("x").is_err());
    }

    #[test]
    fn the_documented_interfaces_parse() {
        let lines = [
            "t attach img /mnt --model hdd-15k --timing sleep --size 64M --mkfs ext4 --mount-options data=journal",
            "t stat /mnt --json",
            "t cut /mnt --seed 7",
            "t detach /mnt",
            "t serve img dir --model ssd --timing account --trace t.txt --foreground",
            "t arm-cut /mnt --after-flushes 2 --after-writes 10 --seed 3 --mode scatter",
            "t attach img /mnt --model flash --size 32M --mkfs ext4",
            "t attach img /mnt --model flash --flash-preset k9f1g08 --log-blocks 16 --size 32M",
            "t attach img /mnt --model hdd-7200 --nvram /dev/shm/nv --nvram-cache-size 128K --nvram-cache metadata",
            "t attach img /mnt --nvram /dev/shm/nv --nvram-cache all",
            "t flush /mnt",
            "t drain img --nvram /dev/shm/nv",
        ];
        for l in lines {
            Top::try_parse_from(l.split_whitespace()).unwrap_or_else(|e| panic!("{l}: {e}"));
        }
    }

    #[test]
    fn serve_options_round_trip_through_args() {
        let top = Top::try_parse_from(
            "t serve img dir --model hdd-15k --timing sleep --avg-seek-ms 3.5 --heads 8"
                .split_whitespace(),
        )
        .unwrap();
        let DeviceCommand::Serve { options, .. } = top.cmd else { panic!() };
        let mut argv = vec!["t".to_string(), "serve".into(), "img".into(), "dir".into()];
        argv.extend(options.to_args());
        let again = Top::try_parse_from(argv).unwrap();
        let DeviceCommand::Serve { options: o2, .. } = again.cmd else { panic!() };
        assert_eq!(o2.overrides, options.overrides);
        assert_eq!((o2.model, o2.timing), (Preset::Hdd15k, Timing::Sleep));
    }

    #[test]
    fn nvram_options_round_trip_and_need_nvram() {
        let top = Top::try_parse_from(
            "t serve img dir --nvram /dev/shm/x --nvram-cache-size 64K --nvram-cache all"
                .split_whitespace(),
        )
        .unwrap();
        let DeviceCommand::Serve { options, .. } = top.cmd else { panic!() };
        let nv = options.nvram_config().unwrap().unwrap();
        assert_eq!((nv.capacity_sectors, nv.mode), (Some(128), Some(CacheMode::All)));
        let mut argv = vec!["t".to_string(), "serve".into(), "img".into(), "dir".into()];
        argv.extend(options.to_args());
        let again = Top::try_parse_from(argv).unwrap();
        let DeviceCommand::Serve { options: o2, .. } = again.cmd else { panic!() };
        assert_eq!(o2.nvram_config().unwrap().unwrap().capacity_sectors, Some(128));
        for bad in ["t serve img dir --nvram-cache-size 64K", "t serve img dir --nvram-cache all"] {
            assert!(Top::try_parse_from(bad.split_whitespace()).is_err(), "{bad}");
        }
        let tiny = Top::try_parse_from(
            "t serve img dir --nvram /x --nvram-cache-size 100".split_whitespace(),
        )
        .unwrap();
        let DeviceCommand::Serve { options, .. } = tiny.cmd else { panic!() };
        assert!(options.nvram_config().is_err());
    }

    #[test]
    fn flash_options_round_trip_through_args() {
        let top = Top::try_parse_from(
            "t serve img dir --model flash --flash-preset k9f1g08 --log-blocks 16 --overhead-us 5"
                .split_whitespace(),
        )
        .unwrap();
        let DeviceCommand::Serve { options, .. } = top.cmd else { panic!() };
        assert_eq!(options.overrides.flash_preset, Some(NandPreset::K9f1g08));
        assert_eq!(options.overrides.log_blocks, Some(16));
        let mut argv = vec!["t".to_string(), "serve".into(), "img".into(), "dir".into()];
        argv.extend(options.to_args());
        let again = Top::try_parse_from(argv).unwrap();
        let DeviceCommand::Serve { options: o2, .. } = again.cmd else { panic!() };
        assert_eq!(o2.overrides, options.overrides);
        assert_eq!(o2.model, Preset::Flash);
        assert!(Top::try_parse_from("t serve i d --flash-preset k9x".split_whitespace()).is_err());
    }
}
