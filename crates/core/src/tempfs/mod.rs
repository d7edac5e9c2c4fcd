//! TempFFS: new files live only in NVRAM and are *transformed* into the lower file system late
//! (thesis 3.1.1; design.md section 10).
//!
//! A temp file is a record (attributes, the lower directory and the name) in a slot of a
//! record frame, eight to a frame (`crate::base::slots`), plus one data frame per resident page. The *overlay* (`crate::tempfs::overlay`) is the volatile
//! index of named temp files by (lower directory, name), rebuilt from the records at mount;
//! the engine consults it before the lower directory on lookup and merges it into readdir.
//!
//! Files: `record.rs` and `data.rs` (formats; records packed by `crate::base::slots`), `ops.rs` (operations on temp files),
//! `rename.rs` (rename over the merged namespace), `transform.rs` (the transform protocol and
//! the triggers), `recovery.rs` (the overlay rebuilt at mount).
//!
//! Locks (ranks in `sync.rs`): a temp file's state, then the overlay. Namespace changes hold
//! both while they commit and mirror (O5: a temp file's name changes only with its lock and the
//! overlay held); data changes hold the file's only; lower calls (the unlink of a shadowed
//! file) happen under the file's lock, never under the overlay. A file being transformed is
//! marked `Transforming`: writers, truncates and namespace changes of that file wait on its
//! condition variable until the transform ends (readers do not: the data is stable). A
//! transform therefore holds no lock during its lower IO.

pub mod data;
mod file;
mod listing;
pub mod names;
mod ops;
pub mod overlay;
pub mod record;
mod recovery;
mod rename;
mod transform;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use txn::{FrameId, FrameTag, Pool};

use crate::base::handles::HandleTable;
use crate::base::inodes::InodeTable;
use crate::base::share::Share;
use crate::base::sync::{Mutex, Rank};
use crate::tempfs::overlay::Overlay;
use lower::LowerFs;
use names::{Obj, Open};

use crate::base::slots;
pub use crate::base::slots::Place;
pub use file::{Fate, TempFile, TempState};
pub use record::{Record, State};

pub use crate::base::hidden::{HIDDEN_PREFIX, hidden_name, is_hidden};

/// Why a temp file was transformed (counted per trigger).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Trigger {
    /// It grew beyond `--tempfile-max-size`.
    Size,
    /// Temp files exceeded their share of the region; least recently used first.
    Pressure,
    /// Temp files passed the background mark (`--tempfile-background`): the daemon's
    /// transformer thread moved the least recently used out before any writer had to.
    Background,
    /// `nvstack flush`.
    Flush,
    /// Unmount (unless `--keep-tempfiles`), or mounting with `--tempfiles off`.
    Unmount,
    /// A hard link to it was asked for (links are made in the lower file system).
    Link,
    /// An extended attribute was set or removed (xattrs live in the lower file system).
    Xattr,
    /// fallocate(2) (allocation is the lower file system's business).
    Fallocate,
    /// A write found the NVRAM full even after pressure transforms.
    NvramFull,
    /// A lower object is renamed onto its name (the lower rename does the replacing).
    LowerRename,
    /// Recovery found it half transformed and finished the job.
    Recovery,
}

pub const TRIGGERS: [Trigger; 11] = [
    Trigger::Size,
    Trigger::Pressure,
    Trigger::Background,
    Trigger::Flush,
    Trigger::Unmount,
    Trigger::Link,
    Trigger::Xattr,
    Trigger::Fallocate,
    Trigger::NvramFull,
    Trigger::LowerRename,
    Trigger::Recovery,
];

impl Trigger {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Trigger::Size => "size",
            Trigger::Pressure => "pressure",
            Trigger::Background => "background",
            Trigger::Flush => "flush",
            Trigger::Unmount => "unmount",
            Trigger::Link => "link",
            Trigger::Xattr => "xattr",
            Trigger::Fallocate => "fallocate",
            Trigger::NvramFull => "nvram_full",
            Trigger::LowerRename => "lower_rename",
            Trigger::Recovery => "recovery",
        }
    }
}

/// Knobs of the temp-file store, fixed at mount. The default is what `nvstack mount` runs with
/// when no flag is given: the mount's flags take their defaults from it, so each is written
/// here only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TempConfig {
    /// New regular files become temp files (`--tempfiles on`).
    pub enabled: bool,
    /// A temp file growing beyond this is transformed (`--tempfile-max-size`).
    pub max_size: u64,
    /// Transform every temp file at unmount (default) or keep them in NVRAM.
    pub transform_on_unmount: bool,
    /// Temp files may hold this share of the region's frames (`--tempfile-share`); beyond it
    /// the least recently used are transformed.
    pub share: Share,
    /// NR_WB: pages the pressure trigger frees at a time (thesis: N = NR_WB * NR_TempFFS /
    /// NR_Dirty temp files' worth of pages; without the page cache NR_TempFFS = NR_Dirty).
    pub writeback_batch: u64,
    /// Above this share of their share (a percentage is of `share`'s frames, not of the
    /// region's) the background transformer moves the least recently used temp files out
    /// (`Engine::transform_in_background`, larger rounds than a writer's), so that writers
    /// rarely meet the share and its transforms in their own requests
    /// (`--tempfile-background`; `None`: never).
    pub background: Option<Share>,
}

impl Default for TempConfig {
    fn default() -> Self {
        TempConfig {
            enabled: true,
            max_size: 1 << 20,
            transform_on_unmount: true,
            share: Share::Percent(90),
            writeback_batch: 256,
            background: None,
        }
    }
}

impl TempConfig {
    /// The limits this configuration comes to in a region of `frames` frames: the share of
    /// the frames, and the background mark as a share of that ([`Share::of`] both).
    pub fn limits(&self, frames: u64) -> TempLimits {
        let max_frames = self.share.of(frames);
        TempLimits {
            max_frames,
            background_frames: self.background.map_or(u64::MAX, |b| b.of(max_frames)),
        }
    }
}

/// The temp-file store's limits in its region (`TempConfig::limits`, resolved once by
/// `Engine::new`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TempLimits {
    /// Temp files may hold at most this many frames; beyond it the least recently used are
    /// transformed.
    pub max_frames: u64,
    /// Above this many frames the background transformer runs (`u64::MAX`: never).
    pub background_frames: u64,
}

/// The temp-file store's engine-wide state: its knobs, counters and LRU clock. (Its files are
/// in the overlay; their data in NVRAM frames.)
#[derive(Debug)]
pub struct TempFs<L: LowerFs> {
    pub config: TempConfig,
    pub limits: TempLimits,
    pub counters: TempCounters,
    pub lru: Clock,
    /// One pressure relief or background round at a time.
    pub relieving: AtomicBool,
    /// The record frames and their taken slots (T6).
    pub slots: slots::SlotList,
    /// What NVRAM adds to the lower namespace (rank `Overlay`).
    pub overlay: Mutex<Overlay<L::Node>>,
    /// What the kernel names: node ids (lower objects and temp files) and open handles.
    pub nodes: InodeTable<Obj<L::Node>>,
    pub handles: HandleTable<Open<L>>,
}

impl<L: LowerFs> TempFs<L> {
    pub(crate) fn new(
        config: TempConfig,
        limits: TempLimits,
        nodes: InodeTable<Obj<L::Node>>,
        handles: HandleTable<Open<L>>,
    ) -> Self {
        TempFs {
            config,
            limits,
            counters: TempCounters::default(),
            lru: Clock::default(),
            relieving: AtomicBool::new(false),
            slots: slots::SlotList::default(),
            overlay: Mutex::new(Rank::Overlay, Overlay::default()),
            nodes,
            handles,
        }
    }

    /// Data pages of temp files in NVRAM now.
    pub(crate) fn pages_resident(&self) -> u64 {
        self.counters.pages_resident.load(Ordering::Relaxed)
    }

    /// `nvstack stat --json`: `tempfiles` (`files_resident`: the temp files in NVRAM now,
    /// which the base's space reservation counts).
    pub(crate) fn stats(&self, files_resident: u64) -> TempStats {
        let mut s = self.counters.snapshot(&self.config);
        s.record_frames = self.slots.frames();
        s.files_resident = files_resident;
        s
    }
}

/// Counters under `tempfiles` in `nvstack stat`.
#[derive(Debug)]
pub struct TempCounters {
    pub created: AtomicU64,
    pub deleted_in_nvram: AtomicU64,
    pub transformed: [AtomicU64; TRIGGERS.len()],
    pub bytes_written_by_apps: AtomicU64,
    pub bytes_transformed: AtomicU64,
    pub pages_resident: AtomicU64,
    pub span_files: AtomicU64,
    pub span_blocks_sum: AtomicU64,
    pub created_in_lower: AtomicU64,
    pub created_in_lower_nvram_full: AtomicU64,
    pub record_frames_freed: AtomicU64,
}

impl Default for TempCounters {
    fn default() -> Self {
        TempCounters {
            created: AtomicU64::new(0),
            deleted_in_nvram: AtomicU64::new(0),
            transformed: std::array::from_fn(|_| AtomicU64::new(0)),
            bytes_written_by_apps: AtomicU64::new(0),
            bytes_transformed: AtomicU64::new(0),
            pages_resident: AtomicU64::new(0),
            span_files: AtomicU64::new(0),
            span_blocks_sum: AtomicU64::new(0),
            created_in_lower: AtomicU64::new(0),
            created_in_lower_nvram_full: AtomicU64::new(0),
            record_frames_freed: AtomicU64::new(0),
        }
    }
}

/// A snapshot of [`TempCounters`] (the JSON contract of `nvstack stat --json`).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct TempStats {
    pub enabled: bool,
    pub max_size: u64,
    pub created: u64,
    pub deleted_in_nvram: u64,
    pub transformed_total: u64,
    pub transformed: BTreeMap<&'static str, u64>,
    pub bytes_written_by_apps: u64,
    pub bytes_transformed: u64,
    pub pages_resident: u64,
    pub files_resident: u64,
    /// Frames the records of the resident temp files are packed in, eight to a frame (one
    /// may be empty, kept as room for the next creates; a record written before records were
    /// packed has a frame of its own): with `pages_resident`, the frames temp files hold.
    pub record_frames: u64,
    /// Record frames freed because they held no record any more (a second empty one, or
    /// every empty one after a flush).
    pub record_frames_freed: u64,
    /// Files created directly in the lower file system although tempfiles are on: the parent
    /// is on another file system or carries a default ACL, or the NVRAM had no free frame.
    pub created_in_lower: u64,
    /// Of those, the creates that found the NVRAM full (their transaction was aborted and
    /// counts in `nvram.transactions_aborted`).
    pub created_in_lower_nvram_full: u64,
    pub span_files: u64,
    pub span_blocks_sum: u64,
    /// Average distance in blocks between the first and last physical block of transformed
    /// files (thesis Fig 4.6); 0 when none was measured.
    pub span_blocks_avg: f64,
}

impl TempCounters {
    pub(crate) fn transformed(&self, t: Trigger) {
        self.transformed[t as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self, config: &TempConfig) -> TempStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let transformed: BTreeMap<&'static str, u64> =
            TRIGGERS.iter().map(|&t| (t.name(), get(&self.transformed[t as usize]))).collect();
        let span_files = get(&self.span_files);
        let span_blocks_sum = get(&self.span_blocks_sum);
        TempStats {
            enabled: config.enabled,
            max_size: config.max_size,
            created: get(&self.created),
            deleted_in_nvram: get(&self.deleted_in_nvram),
            transformed_total: transformed.values().sum(),
            transformed,
            bytes_written_by_apps: get(&self.bytes_written_by_apps),
            bytes_transformed: get(&self.bytes_transformed),
            pages_resident: get(&self.pages_resident),
            files_resident: 0, // `TempFs::stats` fills it in
            record_frames: 0,  // `TempFs::stats` fills it in
            record_frames_freed: get(&self.record_frames_freed),
            created_in_lower: get(&self.created_in_lower),
            created_in_lower_nvram_full: get(&self.created_in_lower_nvram_full),
            span_files,
            span_blocks_sum,
            span_blocks_avg: if span_files == 0 {
                0.0
            } else {
                span_blocks_sum as f64 / span_files as f64
            },
        }
    }
}

/// One temp file found in the region at mount.
#[derive(Debug)]
pub struct Found {
    pub place: Place,
    pub rec: Record,
    pub pages: BTreeMap<u64, FrameId>,
}

/// Everything of the temp-file store a region holds.
#[derive(Debug, Default)]
pub struct Scanned {
    pub files: Vec<Found>,
    /// Every record frame with its taken slots (bit i: slot i), empty ones too.
    pub record_frames: slots::FramesFound,
}

/// Reads every temp-file record of the region (after recovery rolled back unfinished
/// transactions) and checks T1-T3 and T5. Damage is reported with the place named, never
/// guessed.
pub fn scan(pool: &Pool) -> Result<Vec<Found>, nvram::Error> {
    scan_all(pool).map(|s| s.files)
}

/// [`scan`], with the record frames.
pub(crate) fn scan_all(pool: &Pool) -> Result<Scanned, nvram::Error> {
    let frames = pool.allocated_frames()?;
    let mut objects: BTreeMap<Place, Found> = BTreeMap::new();
    let mut record_frames = Vec::new();
    let mut data: Vec<(FrameId, FrameTag)> = Vec::new();
    for (frame, tag) in frames {
        match tag.kind {
            record::KIND_OBJECT => {
                let place = Place::whole(frame);
                let bytes = pool.read_vec(place.offset(pool), record::RECORD_SIZE);
                let rec = Record::decode(&bytes).map_err(|what| slots::damaged(place, what))?;
                objects.insert(place, Found { place, rec, pages: BTreeMap::new() });
            }
            record::KIND_RECORDS => {
                let records = slots::read_frame(pool, frame, record::RECORD_SIZE)?;
                record_frames.push((frame, slots::taken(&records)));
                for (place, bytes) in records {
                    let rec = Record::decode(&bytes).map_err(|what| slots::damaged(place, what))?;
                    objects.insert(place, Found { place, rec, pages: BTreeMap::new() });
                }
            }
            record::KIND_DATA => data.push((frame, tag)),
            _ => {}
        }
    }
    for (frame, tag) in data {
        let Some(obj) = objects.get_mut(&Place::from_owner(tag.owner)) else {
            return Err(nvram::Error::corrupt(
                nvram::Area::Frame(frame.0),
                "temp-file data frame whose owner is not a temp-file record (T2)",
            ));
        };
        if tag.index >= obj.rec.size.div_ceil(data::PAGE) {
            return Err(nvram::Error::corrupt(
                nvram::Area::Frame(frame.0),
                "temp-file data frame beyond the file size (T3)",
            ));
        }
        obj.pages.insert(tag.index, frame);
    }
    Ok(Scanned { files: objects.into_values().collect(), record_frames })
}

/// Ticks for LRU order.
#[derive(Debug, Default)]
pub struct Clock(AtomicU64);

impl Clock {
    pub(crate) fn tick(&self) -> u64 {
        self.0.fetch_add(1, Ordering::Relaxed)
    }
}
