//! The device engine: image file + volatile write cache + actuator model + counters + trace.
//! No FUSE and no wall clock here: `serve.rs` drives it under one mutex and passes arrival
//! times in (or `None` in `account` timing).
//!
//! Request paths without an NVRAM cache: a read comes from the volatile cache over the image
//! and is charged to the model; a write is held volatile and charged when it arrives
//! (`docs/device.md`); a flush (the loop device's FUSE fsync) writes everything held to the
//! image - the durability point - at no model time; a discard zeroes the range at once and
//! tells the model of the whole sectors in it. Every request is traced when a trace is on.
//!
//! The power of the drive is a state machine, `On` -> `Armed` -> `Off` (`power.rs`): after a
//! cut, writes, flushes and discards go nowhere and reads return what the image holds. With an
//! NVRAM block cache attached, reads, writes and discards take the paths of `nv.rs`, per sector.
//!
//! `Engine::finish` (clean shutdown) flushes the cache unless the power is off, drains the
//! NVRAM cache (if any), syncs the image file on the host and writes out trace and histogram.
//!
//! Code: this file holds the engine and the request paths without an NVRAM cache (read,
//! write, flush, discard) and the clean shutdown; `power.rs` the power state machine and the
//! cut; `nv.rs` the request paths with an NVRAM block cache; `stats.rs` the counters and
//! `stat.json`; `medium.rs` the image file as the durable medium; `tests.rs` the unit tests.

mod medium;
mod nv;
mod power;
mod stats;
#[cfg(test)]
mod tests;

use std::io;
use std::path::PathBuf;

use serde::Serialize;

use crate::cache::{CachedMedium, Medium};
use crate::model::{Actuator, Interval, Op, SECTOR_BYTES};
use crate::trace::{Record, Trace, WriteHistogram};

pub use self::medium::FileMedium;
use self::nv::Nv;
pub(crate) use self::power::ArmedCut;
use self::power::Power;
use self::stats::Counters;
pub use self::stats::{NvCacheStats, Stats};

const SECTOR: usize = SECTOR_BYTES as usize;

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
    nv: Option<Nv>,
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

    pub(crate) fn size_bytes(&self) -> u64 {
        self.cache.len_bytes()
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
        self.read_nv(now_ns, offset, buf)
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
        self.armed_write()?;
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

    /// A cache flush (FUSE fsync): the durability point.
    pub fn flush(&mut self) -> io::Result<()> {
        self.armed_flush()?;
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

    /// Clean shutdown: flush and drain the NVRAM cache (unless cut), sync the image, close the
    /// region (marked clean unless cut), write trace and histogram.
    pub fn finish(&mut self) -> io::Result<()> {
        if !self.is_off() {
            self.cache.flush()?;
            self.drain()?;
        }
        self.cache.sync()?;
        self.close_nv();
        if let Some(t) = &mut self.trace {
            t.flush()?;
        }
        if let Some((h, p)) = &self.histogram {
            h.write_to(p)?;
        }
        Ok(())
    }
}
