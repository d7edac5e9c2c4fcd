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
//! `Engine::finish` (clean shutdown) flushes the cache unless the power is off, syncs the
//! image file on the host and writes out trace and histogram.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use serde::Serialize;

use crate::cache::{CachedMedium, CutMode, CutReport, Medium};
use crate::model::flash::FlashStats;
use crate::model::{Actuator, Interval, Op, SECTOR_BYTES};
use crate::trace::{Record, Trace, WriteHistogram};

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
    pub fn as_str(self) -> &'static str {
        match self {
            Timing::Sleep => "sleep",
            Timing::Account => "account",
        }
    }
}

/// A pending automatic cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ArmedCut {
    pub flushes: u64,
    pub writes: u64,
    pub seed: u64,
    pub mode: CutMode,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Power {
    On,
    Armed(ArmedCut),
    Off(CutReport),
}

/// Counters; everything `stat.json` reports.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Counters {
    pub reads: u64,
    pub writes: u64,
    pub flushes: u64,
    pub discards: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub bytes_discarded: u64,
    /// Writes that arrived after a power cut and went nowhere.
    pub writes_after_cut: u64,
}

/// The `stat.json` document.
#[derive(Debug, Clone, Serialize)]
pub struct Stats {
    pub model: String,
    pub timing: Timing,
    pub size_bytes: u64,
    /// Every request on the device file: reads + writes + flushes + discards.
    pub requests: u64,
    #[serde(flatten)]
    pub counters: Counters,
    /// Modeled busy time of the actuator.
    pub busy_ns: u64,
    pub busy_ms: f64,
    /// The modeled clock when the last request completed.
    pub clock_ns: u64,
    pub seek_distance_sectors: u64,
    /// Requests that needed positioning (seek and/or rotation).
    pub positionings: u64,
    pub volatile_bytes: u64,
    pub volatile_bytes_max: u64,
    pub forced_writeback_bytes: u64,
    pub flushed_bytes: u64,
    pub armed: Option<ArmedCut>,
    pub cut: Option<CutReport>,
    pub trace_records: u64,
    /// The flash model's NAND and FTL counters (`--model flash` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flash: Option<FlashStats>,
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

#[derive(Debug)]
pub struct Engine {
    cache: CachedMedium<FileMedium>,
    actuator: Actuator,
    timing: Timing,
    power: Power,
    counters: Counters,
    trace: Option<Trace>,
    histogram: Option<(WriteHistogram, PathBuf)>,
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
        })
    }

    pub fn size_bytes(&self) -> u64 {
        self.cache.len_bytes()
    }
    pub fn timing(&self) -> Timing {
        self.timing
    }
    pub fn is_off(&self) -> bool {
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
        let iv = self.actuator.submit(self.arrival(now_ns), Op::Read, lba, sectors);
        self.counters.reads += 1;
        self.counters.bytes_read += len;
        self.traced(iv, 'R', lba, sectors)?;
        Ok((buf, iv.end_ns))
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
        self.cache.write(data, offset)?;
        let (lba, sectors) = covering(offset, len);
        let iv = self.actuator.submit(self.arrival(now_ns), Op::Write, lba, sectors);
        self.counters.writes += 1;
        self.counters.bytes_written += len;
        if let Some((h, _)) = &mut self.histogram {
            h.record(offset, len);
        }
        self.traced(iv, 'W', lba, sectors)?;
        Ok(iv.end_ns)
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
    pub fn discard(&mut self, offset: u64, len: u64) -> io::Result<()> {
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
    pub fn arm_cut(&mut self, a: ArmedCut) -> Result<(), &'static str> {
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
        }
    }

    /// Clean shutdown: flush (unless cut), sync the image, write trace and histogram.
    pub fn finish(&mut self) -> io::Result<()> {
        if !self.is_off() {
            self.cache.flush()?;
        }
        self.cache.sync()?;
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

    #[test]
    fn writes_beyond_the_device_fail_with_enospc() {
        let d = tempfile::tempdir().unwrap();
        let mut e = engine(d.path(), Preset::None);
        let err = e.write(None, (1 << 20) - 10, &[0u8; 20]).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOSPC));
    }
}
