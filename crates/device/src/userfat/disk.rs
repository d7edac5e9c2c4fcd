//! The sector store under `fatfs`: a read cache of clean sectors and the sectors one
//! operation wrote, over the device file.
//!
//! `fatfs` reads and writes its volume through `Read + Write + Seek` in pieces of any size (4
//! bytes of a FAT entry, 32 bytes of a directory entry, a cluster of data). The kernel's vfat
//! would go through the buffer cache; this is that cache for the user-space server:
//!
//! - **Writes** are kept whole-sector in `pending` (a partial write reads the rest of its
//!   sector first), each with the epoch in which it was first dirtied, so that repeated
//!   updates of a FAT sector reach the device once. [`SectorDisk::commit_where`] writes the
//!   pending sectors a predicate selects (by sector, epoch and content) to the device, adjacent
//!   selected sectors as one request, in ascending order. The server decides when: at the end
//!   of every operation in `sync` mode, for metadata sectors in NVFAT mode, for sectors older
//!   than the expiry at each write-back tick, and for all of them at fsync and unmount.
//! - **Reads** are served from `pending`, then from `clean`, then from the device; a miss
//!   reads the run of missing sectors up to [`READ_RUN_MAX_SECTORS`] in one request.
//! - `clean` is bounded (`clean_max` sectors); past the bound the least recently used eighth is
//!   dropped (an approximate LRU: a use stamps a sector with a counter), never the run just
//!   read (at most half the bound).
//!
//! Invariants: (D1) a sector is in at most one of `pending` and `clean`; (D2) `pending` is
//! newer than the device, `clean` equals the device; (D3) after `commit` returns Ok, `pending`
//! is empty and the device holds every sector written before it.

use std::collections::{BTreeMap, HashMap};

use std::io::{self, Read, Seek, SeekFrom, Write};

use crate::classify::SectorSource;

/// Bytes of a sector (the FAT server's and the device's unit).
pub(crate) const SECTOR: u64 = 512;
/// Longest read of missing sectors in one device request.
pub(crate) const READ_RUN_MAX_SECTORS: u64 = 128;
/// Longest write of adjacent pending sectors in one device request.
pub(crate) const WRITE_RUN_MAX_SECTORS: u64 = 256;

/// The device under the sector store.
pub(crate) trait Backend {
    fn read_at(&mut self, off: u64, buf: &mut [u8]) -> io::Result<()>;
    fn write_at(&mut self, off: u64, data: &[u8]) -> io::Result<()>;
    /// Makes everything written durable (fdatasync of the device file).
    fn sync(&mut self) -> io::Result<()>;
    fn size_bytes(&self) -> u64;
}

impl Backend for std::fs::File {
    fn read_at(&mut self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(self, buf, off)
    }
    fn write_at(&mut self, off: u64, data: &[u8]) -> io::Result<()> {
        std::os::unix::fs::FileExt::write_all_at(self, data, off)
    }
    fn sync(&mut self) -> io::Result<()> {
        self.sync_data()
    }
    fn size_bytes(&self) -> u64 {
        self.metadata().map_or(0, |m| m.len())
    }
}

/// What the store did, for the server's log and tests.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DiskCounters {
    /// Device read requests (misses).
    pub(crate) read_requests: u64,
    /// Device write requests (runs of adjacent sectors).
    pub(crate) write_requests: u64,
    pub(crate) sectors_written: u64,
    pub(crate) syncs: u64,
    /// Sector reads served without the device.
    pub(crate) hits: u64,
}

type Sector = Box<[u8; SECTOR as usize]>;

/// Hashing of sector numbers for the clean map: a multiplicative hash (sector numbers are
/// not adversarial; SipHash dominated the profile).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct SectorHash(u64);

impl std::hash::Hasher for SectorHash {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (n ^ self.0).wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29);
    }
}

type SectorMap<V> = HashMap<u64, V, std::hash::BuildHasherDefault<SectorHash>>;

pub(crate) struct SectorDisk<B: Backend> {
    backend: B,
    len: u64,
    pos: u64,
    /// Dirty sectors: (epoch first dirtied, content).
    pending: BTreeMap<u64, (u64, Sector)>,
    /// The epoch stamped on sectors dirtied from now on (the server's clock, in its units).
    epoch: u64,
    /// Sectors written since the last `take_fresh`, when tracked (NVFAT: only these need
    /// classifying at the end of an operation, not every pending data sector).
    fresh: Option<std::collections::BTreeSet<u64>>,
    clean: SectorMap<(u64, Sector)>,
    clean_max: usize,
    /// A copy of the sector read last: fatfs reads a directory entry as a dozen reads of 1-4
    /// bytes, which this serves without a map lookup. Equal to the sector's current content
    /// (writes update it).
    hot: Option<(u64, Sector)>,
    stamp: u64,
    counters: DiskCounters,
}

impl<B: Backend> std::fmt::Debug for SectorDisk<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SectorDisk")
            .field("len", &self.len)
            .field("pending", &self.pending.len())
            .field("clean", &self.clean.len())
            .field("counters", &self.counters)
            .finish_non_exhaustive()
    }
}

impl<B: Backend> SectorDisk<B> {
    /// `clean_max`: most clean sectors kept (at least 64).
    pub(crate) fn new(backend: B, clean_max: usize) -> io::Result<Self> {
        let len = backend.size_bytes();
        if len == 0 || len % SECTOR != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("device of {len} bytes: not a positive multiple of {SECTOR}"),
            ));
        }
        Ok(SectorDisk {
            backend,
            len,
            pos: 0,
            pending: BTreeMap::new(),
            epoch: 0,
            fresh: None,
            clean: SectorMap::default(),
            clean_max: clean_max.max(64),
            hot: None,
            stamp: 0,
            counters: DiskCounters::default(),
        })
    }

    pub(crate) fn counters(&self) -> DiskCounters {
        self.counters
    }

    pub(crate) fn pending_sectors(&self) -> usize {
        self.pending.len()
    }

    /// Sectors dirtied from now on carry `epoch` (a sector dirtied again keeps its first).
    pub(crate) fn set_epoch(&mut self, epoch: u64) {
        self.epoch = epoch;
    }

    /// Starts keeping the set of sectors written since the last [`Self::take_fresh`].
    pub(crate) fn track_fresh(&mut self) {
        self.fresh.get_or_insert_with(Default::default);
    }

    /// The sectors written since the last call (ascending); empty when not tracked.
    pub(crate) fn take_fresh(&mut self) -> Vec<u64> {
        self.fresh.as_mut().map(|f| std::mem::take(f).into_iter().collect()).unwrap_or_default()
    }

    /// Puts sectors back into the fresh set (a failed commit retries them next time).
    pub(crate) fn restore_fresh(&mut self, sectors: &[u64]) {
        if let Some(f) = self.fresh.as_mut() {
            f.extend(sectors.iter().copied());
        }
    }

    /// The pending sectors as (sector, epoch first dirtied).
    pub(crate) fn pending(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.pending.iter().map(|(&s, (e, _))| (s, *e))
    }

    /// A pending sector, to change in place before it is written.
    pub(crate) fn pending_mut(&mut self, s: u64) -> Option<&mut [u8]> {
        self.hot = None;
        self.pending.get_mut(&s).map(|(_, d)| &mut d[..])
    }

    /// The content of a pending sector.
    pub(crate) fn pending_data(&self, s: u64) -> Option<&[u8]> {
        self.pending.get(&s).map(|(_, d)| &d[..])
    }

    /// Makes sector `s` present in `pending` or `clean` (reading it from the device, with the
    /// run of missing sectors after it, on a miss), and stamps a clean sector as used.
    fn load(&mut self, s: u64) -> io::Result<()> {
        if self.pending.contains_key(&s) {
            self.counters.hits += 1;
            return Ok(());
        }
        self.stamp += 1;
        if let Some((st, _)) = self.clean.get_mut(&s) {
            *st = self.stamp;
            self.counters.hits += 1;
            return Ok(());
        }
        let last = self.len / SECTOR;
        let mut n = 1;
        let run_max = READ_RUN_MAX_SECTORS.min(self.clean_max as u64 / 2);
        while n < run_max
            && s + n < last
            && !self.pending.contains_key(&(s + n))
            && !self.clean.contains_key(&(s + n))
        {
            n += 1;
        }
        let mut buf = vec![0u8; (n * SECTOR) as usize];
        self.backend.read_at(s * SECTOR, &mut buf)?;
        self.counters.read_requests += 1;
        for (i, chunk) in buf.chunks_exact(SECTOR as usize).enumerate() {
            let mut b: Sector = Box::new([0; SECTOR as usize]);
            b.copy_from_slice(chunk);
            self.clean.insert(s + i as u64, (self.stamp, b));
        }
        // Keep the sector just read: bound first, then it is the newest stamp anyway.
        self.bound_clean();
        Ok(())
    }

    /// A loaded sector (see `load`).
    fn loaded(&self, s: u64) -> &[u8; SECTOR as usize] {
        match self.pending.get(&s) {
            Some((_, d)) => d,
            None => &self.clean.get(&s).expect("loaded").1,
        }
    }

    /// The sector's current content (a copy).
    fn sector(&mut self, s: u64) -> io::Result<[u8; SECTOR as usize]> {
        self.load(s)?;
        Ok(*self.loaded(s))
    }

    fn bound_clean(&mut self) {
        if self.clean.len() <= self.clean_max {
            return;
        }
        let mut stamps: Vec<u64> = self.clean.values().map(|(st, _)| *st).collect();
        let drop_n = (self.clean.len() / 8).max(self.clean.len() - self.clean_max);
        let (_, cut, _) = stamps.select_nth_unstable(drop_n - 1);
        let (cut, newest) = (*cut, self.stamp);
        // The sectors of the newest stamp (the run just read or written) always stay, so a
        // caller can use what it just loaded; a run is at most half the bound.
        self.clean.retain(|_, (st, _)| *st > cut || *st == newest);
    }

    /// Writes every pending sector to the device (D3), adjacent ones as one request.
    pub(crate) fn commit(&mut self) -> io::Result<u64> {
        self.commit_where(|_, _, _| true)
    }

    /// Writes the pending sectors that `select(sector, epoch, content)` picks, adjacent picked
    /// sectors as one request; the others stay pending. Returns the sectors written.
    pub(crate) fn commit_where(
        &mut self,
        select: impl Fn(u64, u64, &[u8]) -> bool,
    ) -> io::Result<u64> {
        let picked: Vec<u64> = self
            .pending
            .iter()
            .filter(|(s, (e, d))| select(**s, *e, &d[..]))
            .map(|(s, _)| *s)
            .collect();
        self.write_runs(&picked)
    }

    /// Writes those of `sectors` (ascending) that are pending, as `commit_where` does, without
    /// looking at the other pending sectors.
    pub(crate) fn commit_only(&mut self, sectors: &[u64]) -> io::Result<u64> {
        debug_assert!(sectors.windows(2).all(|w| w[0] < w[1]), "ascending, no duplicates");
        let picked: Vec<u64> =
            sectors.iter().copied().filter(|s| self.pending.contains_key(s)).collect();
        self.write_runs(&picked)
    }

    /// Writes the pending sectors `picked` (ascending), adjacent ones as one request.
    fn write_runs(&mut self, picked: &[u64]) -> io::Result<u64> {
        let mut written = 0;
        let mut i = 0;
        while i < picked.len() {
            let mut j = i + 1;
            while j < picked.len()
                && picked[j] == picked[j - 1] + 1
                && ((j - i) as u64) < WRITE_RUN_MAX_SECTORS
            {
                j += 1;
            }
            let run = &picked[i..j];
            let mut buf = Vec::with_capacity(run.len() * SECTOR as usize);
            for s in run {
                buf.extend_from_slice(&self.pending[s].1[..]);
            }
            // On error the run stays pending: nothing is lost, the next commit retries.
            self.backend.write_at(run[0] * SECTOR, &buf)?;
            self.counters.write_requests += 1;
            self.counters.sectors_written += run.len() as u64;
            written += run.len() as u64;
            self.stamp += 1;
            for s in run {
                let (_, data) = self.pending.remove(s).expect("in the run");
                self.clean.insert(*s, (self.stamp, data));
            }
            i = j;
        }
        self.bound_clean();
        Ok(written)
    }

    /// Commits, then makes the device durable.
    pub(crate) fn sync(&mut self) -> io::Result<()> {
        self.commit()?;
        self.backend.sync()?;
        self.counters.syncs += 1;
        Ok(())
    }
}

/// The classifier reads the volume as the file system sees it now (pending sectors included).
impl<B: Backend> SectorSource for SectorDisk<B> {
    fn read_sectors(&mut self, lba: u64, buf: &mut [u8]) -> io::Result<()> {
        for (i, chunk) in buf.chunks_mut(SECTOR as usize).enumerate() {
            let s = self.sector(lba + i as u64)?;
            chunk.copy_from_slice(&s[..chunk.len()]);
        }
        Ok(())
    }
    fn sectors(&self) -> u64 {
        self.len / SECTOR
    }
}

fn past_end() -> io::Error {
    io::Error::new(io::ErrorKind::UnexpectedEof, "access past the end of the device")
}

impl<B: Backend> Read for SectorDisk<B> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = (buf.len() as u64).min(self.len.saturating_sub(self.pos)) as usize;
        let mut done = 0;
        while done < n {
            let at = self.pos + done as u64;
            let (s, within) = (at / SECTOR, (at % SECTOR) as usize);
            let take = (SECTOR as usize - within).min(n - done);
            if self.hot.as_ref().is_none_or(|(h, _)| *h != s) {
                self.load(s)?;
                let copy = Box::new(*self.loaded(s));
                self.hot = Some((s, copy));
            } else {
                self.counters.hits += 1;
            }
            let (_, hot) = self.hot.as_ref().expect("just set");
            buf[done..done + take].copy_from_slice(&hot[within..within + take]);
            done += take;
        }
        self.pos += n as u64;
        Ok(n)
    }
}

impl<B: Backend> Write for SectorDisk<B> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.pos + data.len() as u64 > self.len {
            return Err(past_end());
        }
        let mut done = 0;
        while done < data.len() {
            let at = self.pos + done as u64;
            let (s, within) = (at / SECTOR, (at % SECTOR) as usize);
            let take = (SECTOR as usize - within).min(data.len() - done);
            let mut sector =
                if take == SECTOR as usize { [0u8; SECTOR as usize] } else { self.sector(s)? };
            sector[within..within + take].copy_from_slice(&data[done..done + take]);
            self.clean.remove(&s);
            if let Some((h, hot)) = self.hot.as_mut() {
                if *h == s {
                    **hot = sector;
                }
            }
            if let Some(f) = self.fresh.as_mut() {
                f.insert(s);
            }
            let epoch = self.pending.get(&s).map_or(self.epoch, |(e, _)| *e);
            self.pending.insert(s, (epoch, Box::new(sector)));
            done += take;
        }
        self.pos += data.len() as u64;
        Ok(data.len())
    }
    /// fatfs flushes its files and FAT through here; durability is the server's decision
    /// (commit at the end of the operation, sync when asked), so nothing happens here.
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<B: Backend> Seek for SectorDisk<B> {
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        let new = match pos {
            SeekFrom::Start(x) => Some(x),
            SeekFrom::End(d) => self.len.checked_add_signed(d),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        match new {
            Some(p) if p <= self.len => {
                self.pos = p;
                Ok(p)
            }
            _ => Err(io::Error::new(io::ErrorKind::InvalidInput, "seek outside the device")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device in memory that logs its requests.
    struct Mem {
        data: Vec<u8>,
        log: Vec<(char, u64, usize)>,
        fail_writes: bool,
    }
    impl Backend for Mem {
        fn read_at(&mut self, off: u64, buf: &mut [u8]) -> io::Result<()> {
            self.log.push(('r', off, buf.len()));
            buf.copy_from_slice(&self.data[off as usize..off as usize + buf.len()]);
            Ok(())
        }
        fn write_at(&mut self, off: u64, d: &[u8]) -> io::Result<()> {
            if self.fail_writes {
                return Err(io::Error::from_raw_os_error(libc::EIO));
            }
            self.log.push(('w', off, d.len()));
            self.data[off as usize..off as usize + d.len()].copy_from_slice(d);
            Ok(())
        }
        fn sync(&mut self) -> io::Result<()> {
            self.log.push(('s', 0, 0));
            Ok(())
        }
        fn size_bytes(&self) -> u64 {
            self.data.len() as u64
        }
    }

    fn mem(sectors: usize) -> Mem {
        let data = (0..sectors * 512).map(|i| (i % 251) as u8).collect();
        Mem { data, log: Vec::new(), fail_writes: false }
    }

    #[test]
    fn small_writes_to_one_sector_reach_the_device_once_and_whole() {
        let mut d = SectorDisk::new(mem(16), 64).unwrap();
        for i in 0..5u64 {
            d.seek(SeekFrom::Start(1024 + i * 4)).unwrap();
            d.write_all(&[0xAB; 4]).unwrap();
        }
        assert!(d.backend.log.iter().all(|e| e.0 == 'r'), "nothing written before commit");
        assert_eq!(d.commit().unwrap(), 1);
        let writes: Vec<_> = d.backend.log.iter().filter(|e| e.0 == 'w').collect();
        assert_eq!(writes, vec![&('w', 1024, 512)]);
        // The bytes around the small writes are the device's old bytes.
        assert_eq!(d.backend.data[1024..1044], [0xAB; 20]);
        assert_eq!(d.backend.data[1044], (1044 % 251) as u8);
        assert_eq!(d.backend.data[1023], (1023 % 251) as u8);
    }

    #[test]
    fn adjacent_sectors_are_one_request_and_reads_see_pending_data() {
        let mut d = SectorDisk::new(mem(32), 64).unwrap();
        d.seek(SeekFrom::Start(512 * 3)).unwrap();
        d.write_all(&[7; 512 * 3]).unwrap();
        d.seek(SeekFrom::Start(512 * 10)).unwrap();
        d.write_all(&[9; 512]).unwrap();
        let mut b = [0u8; 8];
        d.seek(SeekFrom::Start(512 * 4 - 4)).unwrap();
        d.read_exact(&mut b).unwrap();
        assert_eq!(b, [7; 8]);
        assert_eq!(d.commit().unwrap(), 4);
        let writes: Vec<_> = d.backend.log.iter().filter(|e| e.0 == 'w').copied().collect();
        assert_eq!(writes, vec![('w', 1536, 1536), ('w', 5120, 512)]);
        assert_eq!(d.pending_sectors(), 0);
    }

    #[test]
    fn commit_where_writes_only_the_picked_sectors_and_keeps_first_epochs() {
        let mut d = SectorDisk::new(mem(32), 64).unwrap();
        d.set_epoch(1);
        d.write_all(&[1; 512 * 4]).unwrap();
        d.set_epoch(2);
        d.seek(SeekFrom::Start(512)).unwrap();
        d.write_all(&[2; 512]).unwrap(); // sector 1 keeps epoch 1
        d.seek(SeekFrom::Start(512 * 8)).unwrap();
        d.write_all(&[3; 512]).unwrap();
        let epochs: Vec<_> = d.pending().collect();
        assert_eq!(epochs, vec![(0, 1), (1, 1), (2, 1), (3, 1), (8, 2)]);
        // Old sectors only, but not sector 2: two runs.
        assert_eq!(d.commit_where(|s, e, _| e < 2 && s != 2).unwrap(), 3);
        let writes: Vec<_> = d.backend.log.iter().filter(|e| e.0 == 'w').copied().collect();
        assert_eq!(writes, vec![('w', 0, 1024), ('w', 1536, 512)]);
        assert_eq!(d.pending().map(|p| p.0).collect::<Vec<_>>(), vec![2, 8]);
        assert_eq!(d.backend.data[512..1024], [2; 512]);
    }

    #[test]
    fn fresh_sectors_are_the_ones_written_since_the_last_take() {
        let mut d = SectorDisk::new(mem(32), 64).unwrap();
        d.write_all(&[1; 512]).unwrap();
        assert!(d.take_fresh().is_empty(), "not tracked yet");
        d.track_fresh();
        d.seek(SeekFrom::Start(512 * 5)).unwrap();
        d.write_all(&[2; 1024]).unwrap();
        d.seek(SeekFrom::Start(512 * 5)).unwrap();
        d.write_all(&[3; 10]).unwrap();
        assert_eq!(d.take_fresh(), vec![5, 6]);
        assert!(d.take_fresh().is_empty());
        d.restore_fresh(&[9]);
        assert_eq!(d.take_fresh(), vec![9]);
        assert_eq!(d.pending_sectors(), 3, "fresh is a view; pending is unchanged");
    }

    #[test]
    fn misses_read_a_run_and_hits_do_not_reach_the_device() {
        let mut d = SectorDisk::new(mem(300), 1000).unwrap();
        let mut b = vec![0u8; 100];
        d.read_exact(&mut b).unwrap();
        assert_eq!(d.backend.log, vec![('r', 0, (READ_RUN_MAX_SECTORS * 512) as usize)]);
        d.seek(SeekFrom::Start(512 * 100)).unwrap();
        d.read_exact(&mut b).unwrap();
        assert_eq!(d.backend.log.len(), 1, "a hit");
        let want: Vec<u8> = (51200u32..51300).map(|i| (i % 251) as u8).collect();
        assert_eq!(b, want);
    }

    #[test]
    fn the_clean_cache_stays_bounded() {
        let mut d = SectorDisk::new(mem(2048), 100).unwrap();
        let mut b = vec![0u8; 512 * 2048];
        d.read_exact(&mut b).unwrap();
        assert!(d.clean.len() <= 100, "{} clean sectors", d.clean.len());
    }

    #[test]
    fn a_failed_commit_keeps_the_sectors_pending() {
        let mut d = SectorDisk::new(mem(8), 64).unwrap();
        d.write_all(&[1; 512]).unwrap();
        d.backend.fail_writes = true;
        assert!(d.commit().is_err());
        assert_eq!(d.pending_sectors(), 1);
        d.backend.fail_writes = false;
        d.sync().unwrap();
        assert_eq!(d.backend.data[..512], [1; 512]);
        assert_eq!(d.backend.log.last(), Some(&('s', 0, 0)));
    }

    #[test]
    fn access_past_the_end_is_refused() {
        let mut d = SectorDisk::new(mem(2), 64).unwrap();
        assert!(d.seek(SeekFrom::Start(1025)).is_err());
        d.seek(SeekFrom::Start(1020)).unwrap();
        assert!(d.write_all(&[0; 8]).is_err());
        let mut b = [0u8; 8];
        assert_eq!(d.read(&mut b).unwrap(), 4);
    }
}
