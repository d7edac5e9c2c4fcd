//! The engine's NVRAM block cache paths (`crate::nvcache`): how reads, writes, flushes and
//! discards go when a cache is attached ([`Engine::attach_nvcache`]).
//!
//! Per 512-byte sector:
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
//!
//! The NVRAM copy of a sector is always the newest (N5 of the cache): a write absorbed into
//! NVRAM drops any older volatile copy at once, and sectors that become metadata after they
//! were written ([`Engine::promote`]) move their volatile copy into NVRAM. Destage writes go
//! past the volatile cache straight to the image ([`Destage`]) and are charged to the model
//! at the arrival of the request that forced them.

use std::io;
use std::path::PathBuf;

use super::{Engine, FileMedium, NvCacheStats, SECTOR, covering};
use crate::cache::CachedMedium;
use crate::classify::{Class, Classifier, SectorSource};
use crate::model::{Actuator, Interval, Op, SECTOR_BYTES};
use crate::nvcache::{Backing, CacheMode, NvCache, NvCacheError, OpenReport};
use crate::trace::{Record, Trace, WriteHistogram};

/// The NVRAM block cache and its classifier, with the engine's counters of them.
#[derive(Debug)]
pub(super) struct Nv {
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

impl Engine {
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

    /// The read path with an NVRAM cache (see the module docs' table): `buf` holds the bytes at
    /// `offset` from the volatile cache and the image; resident sectors are copied over it from
    /// NVRAM at no model time, the other runs are charged to the model.
    pub(super) fn read_nv(
        &mut self,
        now_ns: Option<u64>,
        offset: u64,
        mut buf: Vec<u8>,
    ) -> io::Result<(Vec<u8>, u64)> {
        let len = buf.len() as u64;
        let (lba, sectors) = covering(offset, len);
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

    /// The write path with an NVRAM cache (see the module docs' table).
    pub(super) fn write_nv(
        &mut self,
        now_ns: Option<u64>,
        offset: u64,
        data: &[u8],
    ) -> io::Result<u64> {
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

    /// The NVRAM side of a discard, after the image range was zeroed: whole resident sectors
    /// are freed, a resident sector covered in part keeps its other bytes (rewritten in NVRAM).
    pub(super) fn discard_nv(
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

    /// Closes the NVRAM cache at a clean shutdown (marked clean), unless the power is off:
    /// then the region is left as the cut left it, for the next attach to recover.
    pub(super) fn close_nv(&mut self) {
        if let Some(nv) = self.nv.take() {
            if !self.is_off() {
                nv.cache.close();
            }
        }
    }

    /// The `nvcache` object of `stat.json`, if a cache is attached.
    pub(super) fn nv_stats(&self) -> Option<NvCacheStats> {
        self.nv.as_ref().map(|nv| NvCacheStats {
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
        })
    }
}
