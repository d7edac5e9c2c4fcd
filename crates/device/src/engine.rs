//! The device engine: image file + volatile write cache + actuator model + counters + trace.
//! No FUSE and no wall clock here: `serve.rs` drives it under one mutex and passes arrival
//! times in (or `None` in `account` timing).
//!
//! State machine of the engine (`Engine::power`):
//! - `On`: requests are served; `Engine::write` holds data volatile, `Engine::flush` makes it
//!   durable.
//! - `Armed { .. }` (still on): `Engine::arm_cut` set a trigger; after `flushes` more flushes
//!   and then `writes` more writes (or at the next flush, whichever comes first) the engine
//!   cuts itself: `Engine::cut`.
//! - `Off` (after `Engine::cut`): held writes were torn/dropped; every later write, flush and
//!   discard is discarded (the drive has no power), reads return what the image holds.
//!
//! `Engine::finish` (clean shutdown) flushes the cache unless the power is off, drains the
//! NVRAM cache (if any), syncs the image file on the host and writes out trace and histogram.
//!
//! With an NVRAM block cache (`Engine::attach_nvcache`, `crate::nvcache`), the request paths
//! are, per 512-byte sector:
//!
//! | request | sector resident in NVRAM | not resident, admitted (metadata, or mode `all`) | not resident, not admitted |
//! |---|---|---|---|
//! | write | rewritten in NVRAM (one transaction per request chunk), no model time | absorbed the same way; a held volatile copy is dropped (N5); when the cache is full the LRW sector is destaged first (model write, charged to this request) | volatile cache + model, as without NVRAM |
//! | read | from NVRAM, no model time (`hits`) | - | volatile cache / image + model |
//! | flush (FUSE fsync) | untouched: already durable | - | volatile cache flushed, as before |
//! | discard | freed from NVRAM (a partly covered sector is rewritten) | - | as before |
//!
//! Admission is decided per sector by the classifier (`crate::classify`) from the file
//! system's own layout; the classifier is told about every applied write. `nvstack device
//! flush` drains the NVRAM cache as well (`Engine::drain`); a power cut leaves it alone.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use serde::Serialize;

use crate::cache::{CachedMedium, CutMode, CutReport, Medium};
use crate::classify::{Class, Classifier, SectorSource};
use crate::model::flash::FlashStats;
use crate::model::{Actuator, Interval, Op, SECTOR_BYTES};
use crate::nvcache::{self, Backing, CacheMode, NvCache, NvCacheError, OpenReport};
use crate::trace::{Record, Trace, WriteHistogram};

const SECTOR: usize = SECTOR_BYTES as usize;

/// The image file as the durable medium.
#[derive(Debug)]
pub struct FileMedium {
    file: File,
    len_bytes: u64,
}

impl FileMedium {
    pub fn new(file: File, len_bytes: u64) -> Self {
        FileMedium { file, len_bytes }
    }
}

impl Medium for FileMedium {
    fn len_bytes(&self) -> u64 {
        self.len_bytes
    }
    fn read_at(&self, buf: &mut [u8], offset_bytes: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, offset_bytes)
    }
    fn write_at(&mut self, data: &[u8], offset_bytes: u64) -> io::Result<()> {
        self.file.write_all_at(data, offset_bytes)
    }
    fn zero_range(&mut self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        // Punching a hole keeps the image sparse; fall back to writing zeros where the host
        // file system cannot punch.
        #[allow(clippy::cast_possible_wrap)]
        let (off, len) = (offset_bytes as i64, len_bytes as i64);
        // SAFETY: plain syscall on an owned, open descriptor; no memory is passed.
        let rc = unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                off,
                len,
            )
        };
        if rc == 0 {
            return Ok(());
        }
        let zeros = vec![0u8; 1 << 20];
        let mut done = 0;
        while done < len_bytes {
            let n = (len_bytes - done).min(zeros.len() as u64);
            self.file.write_all_at(&zeros[..n as usize], offset_bytes + done)?;
            done += n;
        }
        Ok(())
    }
    fn sync(&mut self) -> io::Result<()> {
        self.file.sync_all()
    }
}

/// How the modeled clock relates to the wall clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Timing {
    /// Requests complete in wall time when the modeled clock says so.
    Sleep,
    /// No sleeping: requests run back to back on the modeled clock; busy time is accumulated.
    Account,
}

impl Timing {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Timing::Sleep => "sleep",
            Timing::Account => "account",
        }
    }
}

/// A pending automatic cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(crate) struct ArmedCut {
    pub(crate) flushes: u64,
    pub(crate) writes: u64,
    pub(crate) seed: u64,
    pub(crate) mode: CutMode,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Power {
    On,
    Armed(ArmedCut),
    Off(CutReport),
}

/// Counters; everything `stat.json` reports.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct Counters {
    pub(crate) reads: u64,
    pub(crate) writes: u64,
    pub(crate) flushes: u64,
    pub(crate) discards: u64,
    pub(crate) bytes_read: u64,
    pub(crate) bytes_written: u64,
    pub(crate) bytes_discarded: u64,
    /// Writes that arrived after a power cut and went nowhere.
    pub(crate) writes_after_cut: u64,
}

/// The `stat.json` document.
#[derive(Debug, Clone, Serialize)]
pub struct Stats {
    pub(crate) model: String,
    pub(crate) timing: Timing,
    pub(crate) size_bytes: u64,
    /// Every request on the device file: reads + writes + flushes + discards.
    pub(crate) requests: u64,
    #[serde(flatten)]
    pub(crate) counters: Counters,
    /// Modeled busy time of the actuator.
    pub(crate) busy_ns: u64,
    pub(crate) busy_ms: f64,
    /// The modeled clock when the last request completed.
    pub(crate) clock_ns: u64,
    pub(crate) seek_distance_sectors: u64,
    /// Requests that needed positioning (seek and/or rotation).
    pub(crate) positionings: u64,
    pub(crate) volatile_bytes: u64,
    pub(crate) volatile_bytes_max: u64,
    pub(crate) forced_writeback_bytes: u64,
    pub(crate) flushed_bytes: u64,
    pub(crate) armed: Option<ArmedCut>,
    pub(crate) cut: Option<CutReport>,
    pub(crate) trace_records: u64,
    /// The flash model's NAND and FTL counters (`--model flash` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) flash: Option<FlashStats>,
    /// The NVRAM block cache's counters (`--nvram` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nvcache: Option<NvCacheStats>,
}

/// The `nvcache` object of `stat.json`. Units: sectors of 512 bytes unless named bytes.
#[derive(Debug, Clone, Serialize)]
pub struct NvCacheStats {
    pub(crate) mode: CacheMode,
    /// The file system the classifier recognized ("ext4", "fat16", "none", ...).
    pub(crate) filesystem: &'static str,
    pub(crate) region: String,
    pub(crate) capacity_sectors: u64,
    /// Sectors read from NVRAM.
    pub(crate) hits: u64,
    /// Sectors written into NVRAM.
    pub(crate) writes_absorbed: u64,
    /// Sectors that left NVRAM for the image.
    pub(crate) destaged: u64,
    pub(crate) bytes_resident: u64,
    pub sectors_resident: u64,
    /// Read requests served from NVRAM entirely (no model time).
    pub(crate) read_requests_hit: u64,
    /// Write requests absorbed entirely (no model time unless a destage was needed).
    pub(crate) write_requests_absorbed: u64,
    /// Write requests absorbed in part (the rest went to the volatile cache and the model).
    pub(crate) write_requests_partly_absorbed: u64,
    /// Volatile sectors moved into NVRAM when the classifier learned they are metadata
    /// (FAT: a directory cluster written before its directory was known).
    pub promoted: u64,
    #[serde(flatten)]
    pub(crate) cache: nvcache::Counters,
    pub(crate) resident_by_class: std::collections::BTreeMap<&'static str, u64>,
    /// Sectors found resident when the cache was opened (recovered from a previous run).
    pub recovered_sectors: u64,
    /// Unfinished transactions rolled back when the cache was opened.
    pub(crate) recovered_rollbacks: u32,
}

/// Settings of one engine.
#[derive(Debug)]
pub struct EngineConfig {
    pub timing: Timing,
    pub volatile_bytes_max: u64,
    pub trace: Option<PathBuf>,
    pub histogram: Option<PathBuf>,
    pub lbn_bytes: u64,
}

/// The NVRAM block cache and its classifier, with the engine's counters of them.
#[derive(Debug)]
struct Nv {
    cache: NvCache,
    classifier: Classifier,
    region: String,
    opened: OpenReport,
    hits: u64,
    read_requests_hit: u64,
    write_requests_absorbed: u64,
    write_requests_partly: u64,
    promoted: u64,
}

#[derive(Debug)]
pub struct Engine {
    cache: CachedMedium<FileMedium>,
    actuator: Actuator,
    timing: Timing,
    power: Power,
    counters: Counters,
    trace: Option<Trace>,
    histogram: Option<(WriteHistogram, PathBuf)>,
    nv: Option<Nv>,
}

/// The device as it is now: the volatile cache over the image, resident NVRAM sectors over
/// both. What the classifier reads.
struct View<'a> {
    cache: &'a CachedMedium<FileMedium>,
    nv: Option<&'a NvCache>,
}

impl SectorSource for View<'_> {
    fn read_sectors(&mut self, lba: u64, buf: &mut [u8]) -> io::Result<()> {
        self.cache.read(buf, lba * SECTOR_BYTES)?;
        if let Some(nv) = self.nv {
            for (i, sector) in buf.chunks_exact_mut(SECTOR).enumerate() {
                nv.read(lba + i as u64, sector).map_err(io::Error::other)?;
            }
        }
        Ok(())
    }
    fn sectors(&self) -> u64 {
        self.cache.len_bytes() / SECTOR_BYTES
    }
}

/// Where the NVRAM cache destages: straight to the image (past the volatile cache: durable at
/// once), charged to the model at the arrival of the request that forced it.
struct Destage<'a> {
    cache: &'a mut CachedMedium<FileMedium>,
    actuator: &'a mut Actuator,
    trace: &'a mut Option<Trace>,
    histogram: &'a mut Option<(WriteHistogram, PathBuf)>,
    arrival: Option<u64>,
    /// Latest modeled completion of a destage write.
    end_ns: u64,
}

impl Backing for Destage<'_> {
    fn write_durable(&mut self, lba: u64, data: &[u8]) -> io::Result<()> {
        self.cache.write_through(data, lba * SECTOR_BYTES)?;
        let sectors = data.len() as u64 / SECTOR_BYTES;
        let iv = self.actuator.submit(self.arrival, Op::Write, lba, sectors);
        self.end_ns = self.end_ns.max(iv.end_ns);
        if let Some((h, _)) = self.histogram {
            h.record(lba * SECTOR_BYTES, data.len() as u64);
        }
        if let Some(t) = self.trace {
            t.push(Record {
                arrival_ns: iv.arrival_ns,
                start_ns: iv.start_ns,
                end_ns: iv.end_ns,
                op: 'W',
                lba,
                sectors,
            })?;
        }
        Ok(())
    }
}

fn nv_io(e: &NvCacheError) -> io::Error {
    eprintln!("nvstack device: {e}");
    io::Error::other(e.to_string())
}

/// Maximal runs of equal flags: (start index, length, flag).
fn runs(flags: &[bool]) -> Vec<(usize, usize, bool)> {
    let mut out: Vec<(usize, usize, bool)> = Vec::new();
    for (i, &f) in flags.iter().enumerate() {
        match out.last_mut() {
            Some((_, len, g)) if *g == f => *len += 1,
            _ => out.push((i, 1, f)),
        }
    }
    out
}

/// The sectors covering bytes `[offset, offset + len)`; `len > 0`.
fn covering(offset: u64, len: u64) -> (u64, u64) {
    let first = offset / SECTOR_BYTES;
    let last = (offset + len - 1) / SECTOR_BYTES;
    (first, last - first + 1)
}

impl Engine {
    pub fn new(medium: FileMedium, actuator: Actuator, cfg: &EngineConfig) -> io::Result<Self> {
        let size = medium.len_bytes();
        let trace = cfg.trace.as_deref().map(Trace::create).transpose()?;
        let histogram =
            cfg.histogram.clone().map(|p| (WriteHistogram::new(size, cfg.lbn_bytes), p));
        Ok(Engine {
            cache: CachedMedium::new(medium, cfg.volatile_bytes_max),
            actuator,
            timing: cfg.timing,
            power: Power::On,
            counters: Counters::default(),
            trace,
            histogram,
            nv: None,
        })
    }

    /// Puts an opened NVRAM cache in front of the drive: recognizes the file system on the
    /// device (the image with the cache's sectors over it) and destages down to the capacity
    /// if it shrank. Called before anything is served.
    pub fn attach_nvcache(
        &mut self,
        mut nvc: NvCache,
        opened: OpenReport,
        region: String,
    ) -> io::Result<()> {
        let mut backing = Destage {
            cache: &mut self.cache,
            actuator: &mut self.actuator,
            trace: &mut self.trace,
            histogram: &mut self.histogram,
            arrival: None,
            end_ns: 0,
        };
        nvc.shrink(&mut backing).map_err(|e| nv_io(&e))?;
        let classifier = Classifier::probe(&mut View { cache: &self.cache, nv: Some(&nvc) });
        self.nv = Some(Nv {
            cache: nvc,
            classifier,
            region,
            opened,
            hits: 0,
            read_requests_hit: 0,
            write_requests_absorbed: 0,
            write_requests_partly: 0,
            promoted: 0,
        });
        Ok(())
    }

    /// The file system the classifier recognized ("none" without an NVRAM cache).
    pub fn filesystem(&self) -> &'static str {
        self.nv.as_ref().map_or("none", |n| n.classifier.fs_name())
    }

    pub(crate) fn size_bytes(&self) -> u64 {
        self.cache.len_bytes()
    }
    pub(crate) fn is_off(&self) -> bool {
        matches!(self.power, Power::Off(_))
    }

    fn arrival(&self, now_ns: Option<u64>) -> Option<u64> {
        match self.timing {
            Timing::Sleep => now_ns,
            Timing::Account => None,
        }
    }

    fn traced(&mut self, iv: Interval, op: char, lba: u64, sectors: u64) -> io::Result<()> {
        if let Some(t) = &mut self.trace {
            t.push(Record {
                arrival_ns: iv.arrival_ns,
                start_ns: iv.start_ns,
                end_ns: iv.end_ns,
                op,
                lba,
                sectors,
            })?;
        }
        Ok(())
    }

    /// Reads `len` bytes at `offset` (clamped to the device). Returns the data and the modeled
    /// completion time.
    pub fn read(
        &mut self,
        now_ns: Option<u64>,
        offset: u64,
        len: u64,
    ) -> io::Result<(Vec<u8>, u64)> {
        let len = len.min(self.size_bytes().saturating_sub(offset));
        let mut buf = vec![0u8; len as usize];
        if len == 0 {
            return Ok((buf, self.actuator.busy_until_ns()));
        }
        self.cache.read(&mut buf, offset)?;
        let (lba, sectors) = covering(offset, len);
        self.counters.reads += 1;
        self.counters.bytes_read += len;
        if self.nv.is_none() {
            let iv = self.actuator.submit(self.arrival(now_ns), Op::Read, lba, sectors);
            self.traced(iv, 'R', lba, sectors)?;
            return Ok((buf, iv.end_ns));
        }
        // Resident sectors from NVRAM, the other runs from the model.
        let nv = self.nv.as_mut().expect("checked");
        let resident: Vec<bool> = (lba..lba + sectors).map(|s| nv.cache.is_resident(s)).collect();
        let mut sector = [0u8; SECTOR];
        for (i, _) in resident.iter().enumerate().filter(|(_, r)| **r) {
            let s = lba + i as u64;
            nv.cache.read(s, &mut sector).map_err(|e| nv_io(&e))?;
            let s_start = s * SECTOR_BYTES;
            let lo = s_start.max(offset);
            let hi = (s_start + SECTOR_BYTES).min(offset + len);
            buf[(lo - offset) as usize..(hi - offset) as usize]
                .copy_from_slice(&sector[(lo - s_start) as usize..(hi - s_start) as usize]);
        }
        let hits = resident.iter().filter(|r| **r).count() as u64;
        nv.hits += hits;
        if hits == sectors {
            nv.read_requests_hit += 1;
        }
        let arrival = self.arrival(now_ns);
        let mut end_ns = now_ns.unwrap_or_else(|| self.actuator.busy_until_ns());
        for (start, n, is_resident) in runs(&resident) {
            let (run_lba, run_n) = (lba + start as u64, n as u64);
            let op = if is_resident { 'H' } else { 'R' };
            let iv = if is_resident {
                let t = arrival.unwrap_or_else(|| self.actuator.busy_until_ns());
                Interval {
                    arrival_ns: t,
                    start_ns: t,
                    end_ns: t,
                    service: crate::model::Service::default(),
                }
            } else {
                let iv = self.actuator.submit(arrival, Op::Read, run_lba, run_n);
                end_ns = end_ns.max(iv.end_ns);
                iv
            };
            self.traced(iv, op, run_lba, run_n)?;
        }
        Ok((buf, end_ns))
    }

    /// Writes `data` at `offset`. Returns the modeled completion time.
    pub fn write(&mut self, now_ns: Option<u64>, offset: u64, data: &[u8]) -> io::Result<u64> {
        let len = data.len() as u64;
        if offset.checked_add(len).is_none_or(|e| e > self.size_bytes()) {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        if len == 0 {
            return Ok(self.actuator.busy_until_ns());
        }
        if let Power::Armed(a) = &mut self.power {
            if a.flushes == 0 {
                if a.writes == 0 {
                    let (seed, mode) = (a.seed, a.mode);
                    self.cut(seed, mode)?;
                } else {
                    a.writes -= 1;
                }
            }
        }
        if self.is_off() {
            self.counters.writes_after_cut += 1;
            return Ok(self.actuator.busy_until_ns());
        }
        self.counters.writes += 1;
        self.counters.bytes_written += len;
        if self.nv.is_some() {
            return self.write_nv(now_ns, offset, data);
        }
        self.cache.write(data, offset)?;
        let (lba, sectors) = covering(offset, len);
        let iv = self.actuator.submit(self.arrival(now_ns), Op::Write, lba, sectors);
        if let Some((h, _)) = &mut self.histogram {
            h.record(offset, len);
        }
        self.traced(iv, 'W', lba, sectors)?;
        Ok(iv.end_ns)
    }

    /// The write path with an NVRAM cache (see the module docs' table).
    fn write_nv(&mut self, now_ns: Option<u64>, offset: u64, data: &[u8]) -> io::Result<u64> {
        let len = data.len() as u64;
        let (lba, sectors) = covering(offset, len);
        let arrival = self.arrival(now_ns);
        // The write as whole sectors: partial head and tail completed from the device.
        let mut whole = vec![0u8; (sectors * SECTOR_BYTES) as usize];
        let skip = (offset - lba * SECTOR_BYTES) as usize;
        if skip != 0 || data.len() != whole.len() {
            let nv = self.nv.as_ref().map(|n| &n.cache);
            View { cache: &self.cache, nv }.read_sectors(lba, &mut whole)?;
        }
        whole[skip..skip + data.len()].copy_from_slice(data);
        let nv = self.nv.as_mut().expect("write_nv needs the NVRAM cache");
        let classes = nv.classifier.classify(
            lba,
            &whole,
            &mut View { cache: &self.cache, nv: Some(&nv.cache) },
        );
        let all = nv.cache.mode() == CacheMode::All;
        let admitted: Vec<bool> = (0..sectors)
            .map(|i| all || classes[i as usize].is_metadata() || nv.cache.is_resident(lba + i))
            .collect();
        let absorbed = admitted.iter().filter(|a| **a).count() as u64;
        if absorbed == sectors {
            nv.write_requests_absorbed += 1;
        } else if absorbed > 0 {
            nv.write_requests_partly += 1;
        }
        let mut end_ns = now_ns.unwrap_or_else(|| self.actuator.busy_until_ns());
        let mut list: Vec<(u64, &[u8], Class)> = Vec::new();
        for (start, n, is_absorbed) in runs(&admitted) {
            let (run_lba, run_n) = (lba + start as u64, n as u64);
            let bytes = &whole[start * SECTOR..(start + n) * SECTOR];
            if is_absorbed {
                for i in 0..n {
                    list.push((
                        run_lba + i as u64,
                        &bytes[i * SECTOR..(i + 1) * SECTOR],
                        classes[start + i],
                    ));
                }
                let t = arrival.unwrap_or_else(|| self.actuator.busy_until_ns());
                let iv = Interval {
                    arrival_ns: t,
                    start_ns: t,
                    end_ns: t,
                    service: crate::model::Service::default(),
                };
                self.traced(iv, 'A', run_lba, run_n)?;
            } else {
                self.cache.write(bytes, run_lba * SECTOR_BYTES)?;
                let iv = self.actuator.submit(arrival, Op::Write, run_lba, run_n);
                end_ns = end_ns.max(iv.end_ns);
                if let Some((h, _)) = &mut self.histogram {
                    h.record(run_lba * SECTOR_BYTES, bytes.len() as u64);
                }
                self.traced(iv, 'W', run_lba, run_n)?;
            }
        }
        if !list.is_empty() {
            let nv = self.nv.as_mut().expect("checked");
            let mut backing = Destage {
                cache: &mut self.cache,
                actuator: &mut self.actuator,
                trace: &mut self.trace,
                histogram: &mut self.histogram,
                arrival,
                end_ns,
            };
            nv.cache.absorb(&list, &mut backing).map_err(|e| nv_io(&e))?;
            end_ns = end_ns.max(backing.end_ns);
            // N5: the NVRAM copy is the newest; an older volatile copy must never reach the image.
            for &(s, _, _) in &list {
                self.cache.forget(s, 1);
            }
        }
        let nv = self.nv.as_mut().expect("checked");
        let became =
            nv.classifier.wrote(lba, &whole, &mut View { cache: &self.cache, nv: Some(&nv.cache) });
        if !became.is_empty() {
            end_ns = end_ns.max(self.promote(arrival, &became)?);
        }
        Ok(end_ns)
    }

    /// Moves volatile copies of sectors that just became metadata into NVRAM (a directory
    /// cluster written before the classifier knew it as one): afterwards they are as durable
    /// as if they had been absorbed when written. Returns the latest destage completion.
    fn promote(&mut self, arrival: Option<u64>, ranges: &[(u64, u64)]) -> io::Result<u64> {
        let nv = self.nv.as_mut().expect("promote needs the NVRAM cache");
        let mut sectors: Vec<(u64, [u8; SECTOR], Class)> = Vec::new();
        for &(first, n) in ranges {
            for s in first..first + n {
                if self.cache.is_held(s) && !nv.cache.is_resident(s) {
                    let mut d = [0u8; SECTOR];
                    self.cache.read(&mut d, s * SECTOR_BYTES)?;
                    sectors.push((s, d, nv.classifier.class_of(s)));
                }
            }
        }
        if sectors.is_empty() {
            return Ok(0);
        }
        let list: Vec<(u64, &[u8], Class)> =
            sectors.iter().map(|(s, d, c)| (*s, &d[..], *c)).collect();
        let mut backing = Destage {
            cache: &mut self.cache,
            actuator: &mut self.actuator,
            trace: &mut self.trace,
            histogram: &mut self.histogram,
            arrival,
            end_ns: 0,
        };
        nv.cache.absorb(&list, &mut backing).map_err(|e| nv_io(&e))?;
        let end_ns = backing.end_ns;
        for &(s, _, _) in &list {
            self.cache.forget(s, 1);
        }
        nv.promoted += list.len() as u64;
        Ok(end_ns)
    }

    /// Destages every resident NVRAM sector to the image (`nvstack device flush`, detach).
    /// Returns the number of sectors destaged; 0 without an NVRAM cache or after a cut.
    pub(crate) fn drain(&mut self) -> io::Result<u64> {
        if self.is_off() {
            return Ok(0);
        }
        let Some(nv) = self.nv.as_mut() else { return Ok(0) };
        let mut backing = Destage {
            cache: &mut self.cache,
            actuator: &mut self.actuator,
            trace: &mut self.trace,
            histogram: &mut self.histogram,
            arrival: None,
            end_ns: 0,
        };
        nv.cache.drain(&mut backing).map_err(|e| nv_io(&e))
    }

    /// A cache flush (FUSE fsync): the durability point.
    pub fn flush(&mut self) -> io::Result<()> {
        if let Power::Armed(a) = &mut self.power {
            if a.flushes == 0 {
                let (seed, mode) = (a.seed, a.mode);
                self.cut(seed, mode)?;
            } else {
                a.flushes -= 1;
            }
        }
        if self.is_off() {
            return Ok(());
        }
        self.cache.flush()?;
        self.counters.flushes += 1;
        let t = self.actuator.busy_until_ns();
        let iv = Interval {
            arrival_ns: t,
            start_ns: t,
            end_ns: t,
            service: crate::model::Service::default(),
        };
        self.traced(iv, 'F', 0, 0)
    }

    /// A discard (FUSE fallocate punch-hole / zero-range). The model hears of the whole
    /// sectors inside the range (a flash FTL trims them); it costs no modeled time.
    pub(crate) fn discard(&mut self, offset: u64, len: u64) -> io::Result<()> {
        let len = len.min(self.size_bytes().saturating_sub(offset));
        if self.is_off() || len == 0 {
            return Ok(());
        }
        self.cache.discard(offset, len)?;
        let first_whole = offset.div_ceil(SECTOR_BYTES);
        let end_whole = (offset + len) / SECTOR_BYTES;
        if end_whole > first_whole {
            self.actuator.discard(first_whole, end_whole - first_whole);
        }
        if self.nv.is_some() {
            self.discard_nv(offset, len, first_whole, end_whole)?;
        }
        self.counters.discards += 1;
        self.counters.bytes_discarded += len;
        let (lba, sectors) = covering(offset, len);
        let t = self.actuator.busy_until_ns();
        let iv = Interval {
            arrival_ns: t,
            start_ns: t,
            end_ns: t,
            service: crate::model::Service::default(),
        };
        self.traced(iv, 'D', lba, sectors)
    }

    /// The NVRAM side of a discard, after the image range was zeroed: whole resident sectors
    /// are freed, a resident sector covered in part keeps its other bytes (rewritten in NVRAM).
    fn discard_nv(
        &mut self,
        offset: u64,
        len: u64,
        first_whole: u64,
        end_whole: u64,
    ) -> io::Result<()> {
        let nv = self.nv.as_mut().expect("discard_nv needs the NVRAM cache");
        let whole = nv.cache.resident_in(first_whole, end_whole.max(first_whole));
        nv.cache.discard(&whole).map_err(|e| nv_io(&e))?;
        let end = offset + len;
        let mut edges = vec![offset / SECTOR_BYTES, (end - 1) / SECTOR_BYTES];
        edges.dedup();
        let mut rewrite: Vec<(u64, [u8; SECTOR])> = Vec::new();
        for s in edges {
            if (first_whole..end_whole).contains(&s) || !nv.cache.is_resident(s) {
                continue;
            }
            let mut sector = [0u8; SECTOR];
            nv.cache.read(s, &mut sector).map_err(|e| nv_io(&e))?;
            let s_start = s * SECTOR_BYTES;
            let lo = s_start.max(offset);
            let hi = (s_start + SECTOR_BYTES).min(end);
            sector[(lo - s_start) as usize..(hi - s_start) as usize].fill(0);
            rewrite.push((s, sector));
        }
        if !rewrite.is_empty() {
            let list: Vec<(u64, &[u8], Class)> =
                rewrite.iter().map(|(s, d)| (*s, &d[..], Class::Data)).collect();
            let mut backing = Destage {
                cache: &mut self.cache,
                actuator: &mut self.actuator,
                trace: &mut self.trace,
                histogram: &mut self.histogram,
                arrival: None,
                end_ns: 0,
            };
            nv.cache.absorb(&list, &mut backing).map_err(|e| nv_io(&e))?;
        }
        // A discard over the superblock or boot sector (mkfs) changes what the device holds.
        if offset < 4 * SECTOR_BYTES {
            nv.classifier =
                Classifier::probe(&mut View { cache: &self.cache, nv: Some(&nv.cache) });
        }
        Ok(())
    }

    /// Power failure now. A second cut is a no-op that returns the first report.
    pub fn cut(&mut self, seed: u64, mode: CutMode) -> io::Result<CutReport> {
        if let Power::Off(r) = &self.power {
            return Ok(r.clone());
        }
        let r = self.cache.cut(seed, mode)?;
        self.power = Power::Off(r.clone());
        Ok(r)
    }

    /// Arms an automatic cut (see the module docs). Refused when the power is already off.
    pub(crate) fn arm_cut(&mut self, a: ArmedCut) -> Result<(), &'static str> {
        if self.is_off() {
            return Err("the power is already cut");
        }
        self.power = Power::Armed(a);
        Ok(())
    }

    pub fn stats(&self) -> Stats {
        let c = self.counters.clone();
        #[allow(clippy::cast_precision_loss)]
        let busy_ms = self.actuator.busy_ns() as f64 / 1e6;
        Stats {
            model: self.actuator.model_name().to_string(),
            timing: self.timing,
            size_bytes: self.size_bytes(),
            requests: c.reads + c.writes + c.flushes + c.discards,
            counters: c,
            busy_ns: self.actuator.busy_ns(),
            busy_ms,
            clock_ns: self.actuator.busy_until_ns(),
            seek_distance_sectors: self.actuator.seek_distance_sectors(),
            positionings: self.actuator.positionings(),
            volatile_bytes: self.cache.held_bytes(),
            volatile_bytes_max: self.cache.held_bytes_max(),
            forced_writeback_bytes: self.cache.forced_writebacks_sectors * SECTOR_BYTES,
            flushed_bytes: self.cache.flushed_sectors * SECTOR_BYTES,
            armed: match &self.power {
                Power::Armed(a) => Some(*a),
                _ => None,
            },
            cut: match &self.power {
                Power::Off(r) => Some(r.clone()),
                _ => None,
            },
            trace_records: self.trace.as_ref().map_or(0, |t| t.records),
            flash: self.actuator.flash_stats(),
            nvcache: self.nv.as_ref().map(|nv| NvCacheStats {
                mode: nv.cache.mode(),
                filesystem: nv.classifier.fs_name(),
                region: nv.region.clone(),
                capacity_sectors: nv.cache.capacity_sectors(),
                hits: nv.hits,
                writes_absorbed: nv.cache.counters().writes_absorbed,
                destaged: nv.cache.counters().destaged,
                bytes_resident: nv.cache.resident_sectors() * SECTOR_BYTES,
                sectors_resident: nv.cache.resident_sectors(),
                read_requests_hit: nv.read_requests_hit,
                write_requests_absorbed: nv.write_requests_absorbed,
                write_requests_partly_absorbed: nv.write_requests_partly,
                promoted: nv.promoted,
                cache: nv.cache.counters().clone(),
                resident_by_class: nv.cache.resident_by_class(),
                recovered_sectors: nv.opened.sectors_recovered,
                recovered_rollbacks: nv.opened.transactions_rolled_back,
            }),
        }
    }

    /// Clean shutdown: flush and drain the NVRAM cache (unless cut), sync the image, close the
    /// region (marked clean unless cut), write trace and histogram.
    pub fn finish(&mut self) -> io::Result<()> {
        if !self.is_off() {
            self.cache.flush()?;
            self.drain()?;
        }
        self.cache.sync()?;
        if let Some(nv) = self.nv.take() {
            if !self.is_off() {
                nv.cache.close();
            }
        }
        if let Some(t) = &mut self.trace {
            t.flush()?;
        }
        if let Some((h, p)) = &self.histogram {
            h.write_to(p)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::presets::{ModelOverrides, Preset, build_model};

    fn engine(dir: &std::path::Path, preset: Preset) -> Engine {
        let path = dir.join("img");
        let f =
            File::options().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
        f.set_len(1 << 20).unwrap();
        let act = Actuator::new(build_model(preset, &ModelOverrides::default(), 1 << 20).unwrap());
        let cfg = EngineConfig {
            timing: Timing::Account,
            volatile_bytes_max: 1 << 20,
            trace: Some(dir.join("trace")),
            histogram: Some(dir.join("hist")),
            lbn_bytes: 4096,
        };
        Engine::new(FileMedium::new(f, 1 << 20), act, &cfg).unwrap()
    }

    fn image(dir: &std::path::Path) -> Vec<u8> {
        std::fs::read(dir.join("img")).unwrap()
    }

    #[test]
    fn write_flush_cycle_reaches_the_image_only_at_flush() {
        let d = tempfile::tempdir().unwrap();
        let mut e = engine(d.path(), Preset::Hdd15k);
        e.write(None, 4096, &[1u8; 4096]).unwrap();
        assert_eq!(e.read(None, 4096, 4096).unwrap().0, vec![1u8; 4096]);
        assert_eq!(image(d.path())[4096], 0);
        e.flush().unwrap();
        assert_eq!(image(d.path())[4096], 1);
        let s = e.stats();
        assert_eq!((s.requests, s.counters.bytes_written, s.counters.bytes_read), (3, 4096, 4096));
        assert!(s.busy_ns > 0);
        e.finish().unwrap();
        let trace = std::fs::read_to_string(d.path().join("trace")).unwrap();
        assert_eq!(trace.lines().count(), 4);
        let hist = std::fs::read_to_string(d.path().join("hist")).unwrap();
        assert!(hist.contains("\n1 1\n"));
    }

    #[test]
    fn armed_cut_fires_after_the_given_flushes_and_writes() {
        let d = tempfile::tempdir().unwrap();
        let mut e = engine(d.path(), Preset::None);
        e.arm_cut(ArmedCut { flushes: 1, writes: 2, seed: 3, mode: CutMode::Drop }).unwrap();
        e.write(None, 0, &[1u8; 512]).unwrap();
        e.flush().unwrap(); // the one flush: durable
        e.write(None, 512, &[2u8; 512]).unwrap();
        e.write(None, 1024, &[3u8; 512]).unwrap();
        e.write(None, 1536, &[4u8; 512]).unwrap(); // cut happens before this one
        e.flush().unwrap();
        let s = e.stats();
        let cut = s.cut.expect("cut fired");
        assert_eq!((cut.held_sectors, cut.persisted_sectors), (2, 0));
        assert_eq!(s.counters.writes_after_cut, 1);
        e.finish().unwrap();
        let img = image(d.path());
        assert_eq!((img[0], img[512], img[1024], img[1536]), (1, 0, 0, 0));
    }

    #[test]
    fn armed_cut_fires_at_the_next_flush_if_writes_do_not_run_out() {
        let d = tempfile::tempdir().unwrap();
        let mut e = engine(d.path(), Preset::None);
        e.arm_cut(ArmedCut { flushes: 0, writes: 100, seed: 0, mode: CutMode::Drop }).unwrap();
        e.write(None, 0, &[1u8; 512]).unwrap();
        e.flush().unwrap();
        assert!(e.is_off());
        e.finish().unwrap();
        assert_eq!(image(d.path())[0], 0);
    }

    #[test]
    fn sequential_writes_cost_only_transfer_in_account_timing() {
        let d = tempfile::tempdir().unwrap();
        let mut e = engine(d.path(), Preset::Hdd15k);
        e.write(None, 0, &vec![0u8; 65536]).unwrap();
        let b0 = e.stats().busy_ns;
        e.write(None, 65536, &vec![0u8; 65536]).unwrap();
        let p = crate::model::presets::hdd_params(Preset::Hdd15k);
        assert_eq!(e.stats().busy_ns - b0, p.transfer_ns(128));
        assert_eq!(e.stats().seek_distance_sectors, 0);
    }

    #[test]
    fn flash_counters_appear_in_stats_and_discards_trim_the_ftl() {
        let d = tempfile::tempdir().unwrap();
        let mut e = engine(d.path(), Preset::Flash);
        assert!(engine(d.path(), Preset::Hdd15k).stats().flash.is_none());
        // 1 MiB on the small-block chip: 64 logical blocks of 16 KiB (32 pages of 512 B).
        e.write(None, 0, &[7u8; 16384]).unwrap();
        e.write(None, 0, &[8u8; 16384]).unwrap(); // sequential overwrite: one switch merge
        let v = serde_json::to_value(e.stats()).unwrap();
        let f = &v["flash"];
        for (key, want) in [
            ("page_programs", 64),
            ("page_reads", 0),
            ("block_erases", 1),
            ("merges_switch", 1),
            ("merges_partial", 0),
            ("merges_full", 0),
        ] {
            assert_eq!(f[key].as_u64(), Some(want), "{key}: {f}");
        }
        assert!(f["energy_uj"].as_f64().unwrap() > 0.0);
        // A discard of bytes 100..400 holds no whole sector: the FTL trims nothing (the
        // cache still zeroes the bytes); a discard of the first 1024 bytes trims pages 0, 1.
        e.discard(100, 300).unwrap();
        assert_eq!(e.read(None, 0, 512).unwrap().0[..100], [8u8; 100]);
        let reads = |e: &Engine| e.stats().flash.unwrap().page_reads;
        assert_eq!(reads(&e), 1);
        e.discard(0, 1024).unwrap();
        e.read(None, 0, 1024).unwrap();
        assert_eq!(reads(&e), 1, "trimmed pages cost no NAND read");
        e.read(None, 1024, 512).unwrap();
        assert_eq!(reads(&e), 2);
    }

    fn with_nvram(
        dir: &std::path::Path,
        region: &std::sync::Arc<nvram::SimRegion>,
        capacity: Option<u64>,
        mode: CacheMode,
    ) -> Engine {
        let mut e = engine(dir, Preset::Hdd15k);
        let r: std::sync::Arc<dyn nvram::Region> = region.clone();
        let id = crate::nvcache::ImageId::of(&dir.join("img")).unwrap();
        let (c, rep) = NvCache::open(r, &id, capacity, Some(mode)).unwrap();
        e.attach_nvcache(c, rep, "sim".into()).unwrap();
        e
    }

    fn sim_region(capacity: u64) -> std::sync::Arc<nvram::SimRegion> {
        let p = crate::nvcache::format_params(capacity);
        let r = std::sync::Arc::new(nvram::SimRegion::new(p.region_size));
        txn::Pool::format(&*r, p).unwrap();
        r
    }

    #[test]
    fn nvram_absorbs_serves_reads_and_drains_only_when_asked() {
        let d = tempfile::tempdir().unwrap();
        let region = sim_region(64);
        let mut e = with_nvram(d.path(), &region, Some(64), CacheMode::All);
        e.write(None, 8192, &[5u8; 4096]).unwrap();
        e.write(None, 8192 + 100, &[6u8; 10]).unwrap(); // partial sector: merged in NVRAM
        assert_eq!(e.stats().busy_ns, 0, "absorbed writes cost no disk time");
        let (data, _) = e.read(None, 8192, 4096).unwrap();
        assert_eq!(&data[..100], &[5u8; 100][..]);
        assert_eq!(&data[100..110], &[6u8; 10][..]);
        assert_eq!(e.stats().busy_ns, 0, "reads of resident sectors cost no disk time");
        e.flush().unwrap();
        assert_eq!(image(d.path())[8192], 0, "a flush does not destage");
        let v = serde_json::to_value(e.stats()).unwrap();
        let nv = &v["nvcache"];
        for (k, want) in
            [("hits", 8), ("writes_absorbed", 9), ("destaged", 0), ("bytes_resident", 4096)]
        {
            assert_eq!(nv[k].as_u64(), Some(want), "{k}: {nv}");
        }
        assert_eq!(e.drain().unwrap(), 8);
        assert_eq!(image(d.path())[8192 + 100], 6);
        assert!(e.stats().busy_ns > 0, "the drain is charged to the model");
        assert_eq!(e.stats().nvcache.unwrap().sectors_resident, 0);
    }

    #[test]
    fn a_power_cut_keeps_the_nvram_cache_and_the_next_engine_recovers_it() {
        let d = tempfile::tempdir().unwrap();
        let region = sim_region(64);
        let mut e = with_nvram(d.path(), &region, Some(64), CacheMode::All);
        e.write(None, 0, &[7u8; 1024]).unwrap();
        e.cut(1, CutMode::Drop).unwrap();
        e.write(None, 1024, &[8u8; 512]).unwrap(); // power is off: lost
        e.finish().unwrap();
        assert_eq!(image(d.path())[0], 0, "the image alone lacks the cached sectors");
        let again = std::sync::Arc::new(nvram::SimRegion::from_image(
            region.crash_image(nvram::CrashMode::DropAll),
        ));
        let mut e = with_nvram(d.path(), &again, None, CacheMode::All);
        assert_eq!(e.read(None, 0, 1024).unwrap().0, vec![7u8; 1024]);
        assert_eq!(e.read(None, 1024, 512).unwrap().0, vec![0u8; 512]);
        assert_eq!(e.stats().nvcache.unwrap().recovered_sectors, 2);
        e.finish().unwrap();
        assert_eq!(image(d.path())[1023], 7, "a clean shutdown drains");
    }

    #[test]
    fn metadata_mode_passes_unclassified_writes_to_the_volatile_cache() {
        let d = tempfile::tempdir().unwrap();
        let region = sim_region(64);
        let mut e = with_nvram(d.path(), &region, Some(64), CacheMode::Metadata);
        assert_eq!(e.filesystem(), "none");
        e.write(None, 4096, &[1u8; 4096]).unwrap();
        assert!(e.stats().busy_ns > 0);
        assert_eq!(e.stats().nvcache.unwrap().writes_absorbed, 0);
        e.cut(0, CutMode::Drop).unwrap();
        e.finish().unwrap();
        assert_eq!(image(d.path())[4096], 0, "volatile, lost by the cut");
    }

    #[test]
    fn a_full_nvram_cache_destages_the_lrw_sector_charged_to_the_write() {
        let d = tempfile::tempdir().unwrap();
        let region = sim_region(2);
        let mut e = with_nvram(d.path(), &region, Some(2), CacheMode::All);
        e.write(None, 0, &[1u8; 512]).unwrap();
        e.write(None, 4096, &[2u8; 512]).unwrap();
        assert_eq!(e.stats().busy_ns, 0);
        e.write(None, 8192, &[3u8; 512]).unwrap();
        let s = e.stats();
        assert!(s.busy_ns > 0, "the destage write is modeled");
        let nv = s.nvcache.unwrap();
        assert_eq!((nv.destaged, nv.cache.destaged_full, nv.sectors_resident), (1, 1, 2));
        assert_eq!(image(d.path())[0], 1, "sector 0 was the least recently written");
        assert_eq!(image(d.path())[4096], 0);
    }

    #[test]
    fn discard_frees_resident_sectors_and_zeroes_partial_ones() {
        let d = tempfile::tempdir().unwrap();
        let region = sim_region(64);
        let mut e = with_nvram(d.path(), &region, Some(64), CacheMode::All);
        e.write(None, 0, &[9u8; 2048]).unwrap();
        e.discard(256, 1024).unwrap(); // half of sector 0, all of sector 1, half of sector 2
        let (data, _) = e.read(None, 0, 2048).unwrap();
        assert_eq!(&data[..256], &[9u8; 256][..]);
        assert!(data[256..1280].iter().all(|&b| b == 0));
        assert_eq!(&data[1280..], &[9u8; 768][..]);
        let nv = e.stats().nvcache.unwrap();
        assert_eq!((nv.sectors_resident, nv.cache.discarded), (3, 1));
    }

    #[test]
    fn writes_beyond_the_device_fail_with_enospc() {
        let d = tempfile::tempdir().unwrap();
        let mut e = engine(d.path(), Preset::None);
        let err = e.write(None, (1 << 20) - 10, &[0u8; 20]).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOSPC));
    }
}
