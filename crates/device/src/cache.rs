//! The volatile write cache of the modeled drive, over a durable medium (the image file).
//!
//! Protocol (one `CachedMedium`, all calls serialized by the caller's lock):
//! - `CachedMedium::write`: the written sectors become *held* (volatile). They are visible to
//!   `CachedMedium::read` at once (read-your-writes) but not yet on the medium.
//! - `CachedMedium::flush`: every held sector is written to the medium in LBA order —
//!   **this is the durability point**: after `flush` returns, the medium holds every write
//!   that was acknowledged before it. (The host file is not fsynced: the modeled power cut is
//!   of the modeled drive, not of the host.)
//! - `CachedMedium::discard`: held sectors in the range are dropped and the range is
//!   zeroed on the medium at once (a discard is durable immediately; see `docs/device.md`).
//! - `CachedMedium::write_through`: sectors written to the medium at once (durable when it
//!   returns), dropping any held copy: the NVRAM cache's destage path.
//! - `CachedMedium::forget`: held sectors dropped without being written, because a newer
//!   copy became durable elsewhere (the NVRAM cache absorbed a write to them).
//! - `CachedMedium::cut`: power failure. Held sectors are dropped, or torn at 512-byte sector
//!   granularity as a seeded RNG decides, and the cache is empty afterwards.
//!
//! Invariants:
//! 1. `held_sectors.len() == order.len()` and every held sector's `seq` is a key of `order`
//!    that maps back to it.
//! 2. `held_sectors.len() * 512 <= held_bytes_max` after every call: when a write would pass
//!    the limit, the oldest held sectors (by last write) are written back to the medium first
//!    — like a drive destaging its cache — and counted in `forced_writebacks_sectors`.
//! 3. A `held_bytes_max` of 0 means write-through: nothing is ever held.
//!
//! On-media format: none; the medium is the raw image, sector `s` at byte offset `s * 512`.

use std::collections::BTreeMap;
use std::io;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

/// Bytes per sector of the cache (the tear granularity).
pub(crate) const SECTOR: usize = 512;
const SECTOR_U64: u64 = SECTOR as u64;

/// The durable medium under the cache: the one narrow persistence interface. Offsets and
/// lengths in bytes; callers stay inside `len_bytes()`.
pub(crate) trait Medium: Send + std::fmt::Debug {
    fn len_bytes(&self) -> u64;
    fn read_at(&self, buf: &mut [u8], offset_bytes: u64) -> io::Result<()>;
    fn write_at(&mut self, data: &[u8], offset_bytes: u64) -> io::Result<()>;
    /// Makes the range read as zeros.
    fn zero_range(&mut self, offset_bytes: u64, len_bytes: u64) -> io::Result<()>;
    /// Makes the medium durable on the host (only at detach).
    fn sync(&mut self) -> io::Result<()>;
}

/// How a power cut treats the held sectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum CutMode {
    /// The seed picks one of `drop`, `prefix`, `scatter`.
    Seeded,
    /// Every held sector is lost.
    Drop,
    /// Held sectors reach the medium in write order up to a random point (a cache destaging
    /// in order when the power fails).
    Prefix,
    /// Each held sector independently reaches the medium with probability 1/2 (a cache
    /// destaging in any order).
    Scatter,
}

impl CutMode {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            CutMode::Seeded => "seeded",
            CutMode::Drop => "drop",
            CutMode::Prefix => "prefix",
            CutMode::Scatter => "scatter",
        }
    }
    pub(crate) fn parse(s: &str) -> Option<CutMode> {
        [CutMode::Seeded, CutMode::Drop, CutMode::Prefix, CutMode::Scatter]
            .into_iter()
            .find(|m| m.as_str() == s)
    }
}

/// What a cut did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CutReport {
    pub(crate) seed: u64,
    /// The mode applied (never `Seeded`).
    pub(crate) mode: CutMode,
    pub(crate) held_sectors: u64,
    pub(crate) persisted_sectors: u64,
    pub(crate) dropped_sectors: u64,
}

#[derive(Debug)]
struct Held {
    seq: u64,
    data: Box<[u8; SECTOR]>,
}

/// A medium with a bounded volatile write cache in front of it.
#[derive(Debug)]
pub(crate) struct CachedMedium<M: Medium> {
    medium: M,
    /// Held (volatile) sectors by sector number.
    held_sectors: BTreeMap<u64, Held>,
    /// Write order: seq -> sector. Oldest first.
    order: BTreeMap<u64, u64>,
    next_seq: u64,
    held_bytes_max: u64,
    pub(crate) forced_writebacks_sectors: u64,
    pub(crate) flushed_sectors: u64,
}

impl<M: Medium> CachedMedium<M> {
    /// `held_bytes_max` is rounded down to whole sectors; 0 means write-through.
    pub(crate) fn new(medium: M, held_bytes_max: u64) -> Self {
        CachedMedium {
            medium,
            held_sectors: BTreeMap::new(),
            order: BTreeMap::new(),
            next_seq: 0,
            held_bytes_max: held_bytes_max / SECTOR_U64 * SECTOR_U64,
            forced_writebacks_sectors: 0,
            flushed_sectors: 0,
        }
    }

    pub(crate) fn len_bytes(&self) -> u64 {
        self.medium.len_bytes()
    }
    pub(crate) fn held_bytes(&self) -> u64 {
        self.held_sectors.len() as u64 * SECTOR_U64
    }
    pub(crate) fn held_bytes_max(&self) -> u64 {
        self.held_bytes_max
    }
    #[cfg(test)]
    pub(crate) fn medium(&self) -> &M {
        &self.medium
    }

    fn check_range(&self, offset: u64, len: u64) -> io::Result<()> {
        if offset.checked_add(len).is_none_or(|end| end > self.len_bytes()) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("range {offset}+{len} beyond the device ({} bytes)", self.len_bytes()),
            ));
        }
        Ok(())
    }

    /// Reads `buf.len()` bytes at `offset`: the medium overlaid with held sectors.
    pub(crate) fn read(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.check_range(offset, buf.len() as u64)?;
        if buf.is_empty() {
            return Ok(());
        }
        self.medium.read_at(buf, offset)?;
        let end = offset + buf.len() as u64;
        let first = offset / SECTOR_U64;
        let last = (end - 1) / SECTOR_U64;
        for (&s, held) in self.held_sectors.range(first..=last) {
            // Intersection of [s*512, s*512+512) with [offset, end).
            let s_start = s * SECTOR_U64;
            let lo = s_start.max(offset);
            let hi = (s_start + SECTOR_U64).min(end);
            buf[(lo - offset) as usize..(hi - offset) as usize]
                .copy_from_slice(&held.data[(lo - s_start) as usize..(hi - s_start) as usize]);
        }
        Ok(())
    }

    /// Writes `data` at `offset` into the cache (or through, if the cache is disabled).
    /// Partial sectors are completed from the current content (read-modify-write).
    pub(crate) fn write(&mut self, data: &[u8], offset: u64) -> io::Result<()> {
        self.check_range(offset, data.len() as u64)?;
        if data.is_empty() {
            return Ok(());
        }
        if self.held_bytes_max == 0 {
            return self.medium.write_at(data, offset);
        }
        let end = offset + data.len() as u64;
        let first = offset / SECTOR_U64;
        let last = (end - 1) / SECTOR_U64;
        for s in first..=last {
            let s_start = s * SECTOR_U64;
            let lo = s_start.max(offset);
            let hi = (s_start + SECTOR_U64).min(end);
            let mut sector = Box::new([0u8; SECTOR]);
            if hi - lo < SECTOR_U64 {
                self.read(&mut sector[..], s_start)?;
            }
            sector[(lo - s_start) as usize..(hi - s_start) as usize]
                .copy_from_slice(&data[(lo - offset) as usize..(hi - offset) as usize]);
            self.hold(s, sector)?;
        }
        debug_assert_eq!(self.held_sectors.len(), self.order.len());
        Ok(())
    }

    fn hold(&mut self, s: u64, data: Box<[u8; SECTOR]>) -> io::Result<()> {
        let seq = self.next_seq;
        self.next_seq += 1;
        if let Some(old) = self.held_sectors.insert(s, Held { seq, data }) {
            self.order.remove(&old.seq);
        }
        self.order.insert(seq, s);
        // Invariant 2: destage the oldest when past the limit.
        while self.held_bytes() > self.held_bytes_max {
            let (_, oldest) = self.order.pop_first().expect("held sectors without order");
            let held = self.held_sectors.remove(&oldest).expect("order names a held sector");
            self.medium.write_at(&held.data[..], oldest * SECTOR_U64)?;
            self.forced_writebacks_sectors += 1;
        }
        Ok(())
    }

    /// Writes every held sector to the medium (LBA order, contiguous runs coalesced).
    /// The durability point: see the module docs.
    pub(crate) fn flush(&mut self) -> io::Result<()> {
        let held = std::mem::take(&mut self.held_sectors);
        self.order.clear();
        self.flushed_sectors += held.len() as u64;
        let mut run: Vec<u8> = Vec::new();
        let mut run_start = 0u64;
        let mut run_next = u64::MAX;
        for (s, h) in held {
            if s != run_next && !run.is_empty() {
                self.medium.write_at(&run, run_start * SECTOR_U64)?;
                run.clear();
            }
            if run.is_empty() {
                run_start = s;
            }
            run.extend_from_slice(&h.data[..]);
            run_next = s + 1;
            // Keep the staging buffer bounded (1 MiB).
            if run.len() >= 1 << 20 {
                self.medium.write_at(&run, run_start * SECTOR_U64)?;
                run.clear();
                run_next = u64::MAX;
            }
        }
        if !run.is_empty() {
            self.medium.write_at(&run, run_start * SECTOR_U64)?;
        }
        Ok(())
    }

    /// Writes whole sectors `data` at `offset` straight to the medium (durable when it
    /// returns), dropping held copies of them.
    pub(crate) fn write_through(&mut self, data: &[u8], offset: u64) -> io::Result<()> {
        self.check_range(offset, data.len() as u64)?;
        assert!(
            offset % SECTOR_U64 == 0 && data.len() % SECTOR == 0,
            "write_through of partial sectors"
        );
        if data.is_empty() {
            return Ok(());
        }
        self.forget(offset / SECTOR_U64, data.len() as u64 / SECTOR_U64);
        self.medium.write_at(data, offset)
    }

    /// Drops held copies of sectors `[first, first + sectors)` without writing them.
    pub(crate) fn forget(&mut self, first: u64, sectors: u64) {
        let gone: Vec<u64> =
            self.held_sectors.range(first..first + sectors).map(|(&s, _)| s).collect();
        for s in gone {
            let h = self.held_sectors.remove(&s).expect("just listed");
            self.order.remove(&h.seq);
        }
    }

    /// Whether sector `s` is held (volatile).
    pub(crate) fn is_held(&self, s: u64) -> bool {
        self.held_sectors.contains_key(&s)
    }

    /// Drops held sectors inside the range and zeroes the range on the medium.
    pub(crate) fn discard(&mut self, offset: u64, len: u64) -> io::Result<()> {
        self.check_range(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let end = offset + len;
        // Whole sectors inside the range are dropped; partially covered ones are rewritten
        // with zeros in the covered part (they stay held).
        let first_full = offset.div_ceil(SECTOR_U64);
        let end_full = end / SECTOR_U64;
        if first_full < end_full {
            let gone: Vec<u64> =
                self.held_sectors.range(first_full..end_full).map(|(&s, _)| s).collect();
            for s in gone {
                let h = self.held_sectors.remove(&s).expect("just listed");
                self.order.remove(&h.seq);
            }
        }
        self.medium.zero_range(offset, len)?;
        for s in [offset / SECTOR_U64, (end - 1) / SECTOR_U64] {
            if let Some(h) = self.held_sectors.get_mut(&s) {
                let s_start = s * SECTOR_U64;
                let lo = s_start.max(offset);
                let hi = (s_start + SECTOR_U64).min(end);
                h.data[(lo - s_start) as usize..(hi - s_start) as usize].fill(0);
            }
        }
        Ok(())
    }

    /// Power failure: tears or drops the held sectors as `mode` and `seed` decide; the cache
    /// is empty afterwards. Deterministic in (held state, seed, mode).
    pub(crate) fn cut(&mut self, seed: u64, mode: CutMode) -> io::Result<CutReport> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mode = match mode {
            CutMode::Seeded => match rng.random_range(0..3u32) {
                0 => CutMode::Drop,
                1 => CutMode::Prefix,
                _ => CutMode::Scatter,
            },
            m => m,
        };
        let held = std::mem::take(&mut self.held_sectors);
        let order = std::mem::take(&mut self.order);
        let n = held.len() as u64;
        let keep: Vec<u64> = match mode {
            CutMode::Drop => Vec::new(),
            CutMode::Prefix => {
                let k = rng.random_range(0..=n) as usize;
                order.values().take(k).copied().collect()
            }
            CutMode::Scatter => order.values().copied().filter(|_| rng.random_bool(0.5)).collect(),
            CutMode::Seeded => unreachable!("resolved above"),
        };
        for s in &keep {
            self.medium.write_at(&held[s].data[..], s * SECTOR_U64)?;
        }
        let persisted = keep.len() as u64;
        Ok(CutReport {
            seed,
            mode,
            held_sectors: n,
            persisted_sectors: persisted,
            dropped_sectors: n - persisted,
        })
    }

    pub(crate) fn sync(&mut self) -> io::Result<()> {
        self.medium.sync()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An in-memory medium for tests.
    #[derive(Debug, Clone)]
    struct MemMedium(Vec<u8>);

    impl Medium for MemMedium {
        fn len_bytes(&self) -> u64 {
            self.0.len() as u64
        }
        fn read_at(&self, buf: &mut [u8], offset_bytes: u64) -> io::Result<()> {
            let o = offset_bytes as usize;
            buf.copy_from_slice(&self.0[o..o + buf.len()]);
            Ok(())
        }
        fn write_at(&mut self, data: &[u8], offset_bytes: u64) -> io::Result<()> {
            let o = offset_bytes as usize;
            self.0[o..o + data.len()].copy_from_slice(data);
            Ok(())
        }
        fn zero_range(&mut self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
            let o = offset_bytes as usize;
            self.0[o..o + len_bytes as usize].fill(0);
            Ok(())
        }
        fn sync(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn dev(sectors: usize, max: u64) -> CachedMedium<MemMedium> {
        CachedMedium::new(MemMedium(vec![0u8; sectors * SECTOR]), max)
    }

    fn read(c: &CachedMedium<MemMedium>, off: u64, len: usize) -> Vec<u8> {
        let mut b = vec![0u8; len];
        c.read(&mut b, off).unwrap();
        b
    }

    #[test]
    fn writes_are_visible_before_flush_and_durable_after() {
        let mut c = dev(16, 1 << 20);
        c.write(&[7u8; 1024], 512).unwrap();
        assert_eq!(read(&c, 512, 1024), vec![7u8; 1024], "read-your-writes");
        assert!(c.medium().0[512..1536].iter().all(|&b| b == 0), "not durable yet");
        c.flush().unwrap();
        assert_eq!(&c.medium().0[512..1536], &[7u8; 1024][..]);
        assert_eq!(c.held_bytes(), 0);
    }

    #[test]
    fn unaligned_write_merges_with_current_content() {
        let mut c = dev(4, 1 << 20);
        c.write(&[1u8; 2048], 0).unwrap();
        c.flush().unwrap();
        c.write(&[2u8; 10], 600).unwrap();
        let b = read(&c, 0, 2048);
        assert!(b[..600].iter().all(|&x| x == 1));
        assert!(b[600..610].iter().all(|&x| x == 2));
        assert!(b[610..].iter().all(|&x| x == 1));
        assert_eq!(c.held_bytes(), 512);
    }

    #[test]
    fn cut_drop_loses_everything_since_the_last_flush() {
        let mut c = dev(8, 1 << 20);
        c.write(&[1u8; 512], 0).unwrap();
        c.flush().unwrap();
        c.write(&[2u8; 1024], 0).unwrap();
        let r = c.cut(1, CutMode::Drop).unwrap();
        assert_eq!((r.held_sectors, r.persisted_sectors), (2, 0));
        assert_eq!(read(&c, 0, 512), vec![1u8; 512]);
        assert_eq!(read(&c, 512, 512), vec![0u8; 512]);
    }

    #[test]
    fn cut_prefix_persists_in_write_order() {
        for seed in 0..20 {
            let mut c = dev(64, 1 << 20);
            for s in (0..64u64).rev() {
                c.write(&[s as u8 + 1; 512], s * 512).unwrap();
            }
            let r = c.cut(seed, CutMode::Prefix).unwrap();
            // Written from the last sector down: the persisted ones are the top `k`.
            let k = r.persisted_sectors;
            for s in 0..64u64 {
                let durable = c.medium().0[(s * 512) as usize] != 0;
                assert_eq!(durable, s >= 64 - k, "seed {seed} sector {s}");
            }
        }
    }

    #[test]
    fn cut_is_deterministic_in_the_seed_and_tears_at_sector_granularity() {
        let run = |seed| {
            let mut c = dev(256, 1 << 20);
            c.write(&vec![9u8; 256 * 512], 0).unwrap();
            let r = c.cut(seed, CutMode::Scatter).unwrap();
            (r, c.medium().0.clone())
        };
        let (r1, m1) = run(42);
        let (r2, m2) = run(42);
        assert_eq!((r1.clone(), &m1), (r2, &m2));
        assert!(r1.persisted_sectors > 0 && r1.dropped_sectors > 0);
        for sector in m1.chunks(512) {
            assert!(sector.iter().all(|&b| b == 9) || sector.iter().all(|&b| b == 0));
        }
    }

    #[test]
    fn passing_the_limit_writes_back_the_oldest() {
        let mut c = dev(16, 4 * 512);
        for s in 0..6u64 {
            c.write(&[s as u8 + 1; 512], s * 512).unwrap();
        }
        assert_eq!(c.held_bytes(), 4 * 512);
        assert_eq!(c.forced_writebacks_sectors, 2);
        assert_eq!(c.medium().0[0], 1);
        assert_eq!(c.medium().0[512], 2);
        assert_eq!(c.medium().0[1024], 0, "sector 2 still volatile");
        c.cut(0, CutMode::Drop).unwrap();
        assert_eq!(read(&c, 1024, 512), vec![0u8; 512]);
    }

    #[test]
    fn discard_drops_held_sectors_and_zeroes_the_medium() {
        let mut c = dev(8, 1 << 20);
        c.write(&[5u8; 8 * 512], 0).unwrap();
        c.flush().unwrap();
        c.write(&[6u8; 8 * 512], 0).unwrap();
        c.discard(512, 1024).unwrap();
        assert_eq!(read(&c, 512, 1024), vec![0u8; 1024]);
        assert_eq!(read(&c, 0, 512), vec![6u8; 512]);
        assert_eq!(c.held_bytes(), 6 * 512);
    }

    #[test]
    fn write_through_when_the_cache_is_disabled() {
        let mut c = dev(4, 0);
        c.write(&[3u8; 512], 512).unwrap();
        assert_eq!(c.medium().0[512], 3);
        assert_eq!(c.cut(0, CutMode::Drop).unwrap().held_sectors, 0);
    }

    #[test]
    fn write_through_and_forget_drop_held_copies() {
        let mut c = dev(8, 1 << 20);
        c.write(&[1u8; 2048], 0).unwrap();
        c.write_through(&[2u8; 512], 512).unwrap();
        assert_eq!(c.medium().0[512], 2, "durable at once");
        assert!(!c.is_held(1) && c.is_held(0));
        c.forget(2, 2);
        assert!(!c.is_held(2) && !c.is_held(3) && c.is_held(0));
        assert_eq!(c.held_bytes(), 512);
        c.flush().unwrap();
        assert_eq!((c.medium().0[0], c.medium().0[512], c.medium().0[1024]), (1, 2, 0));
    }

    #[test]
    fn out_of_range_is_an_error() {
        let mut c = dev(4, 1 << 20);
        assert!(c.write(&[0u8; 512], 4 * 512).is_err());
        assert!(c.read(&mut [0u8; 2], 4 * 512 - 1).is_err());
    }
}
