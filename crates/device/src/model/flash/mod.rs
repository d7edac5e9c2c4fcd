//! The flash model (`--model flash`): a NAND chip ([`nand`]) behind a log-block FTL
//! ([`ftl`]), as a [`DiskModel`] the actuator serves like any other drive.
//!
//! Request mapping (a request of `sectors` 512-byte sectors at `lba`):
//! - It covers the logical pages `lba * 512 / page_bytes ..= (end * 512 - 1) / page_bytes`,
//!   served one after the other (one chip: no plane or chip interleaving, no cache program).
//! - **Read**: each page with a version costs one host page read (`t_R` + bus); a page never
//!   written, or trimmed, costs nothing (the FTL knows it holds zeros).
//! - **Write**: each page costs one host page program (bus + `t_PROG`), plus whatever merges
//!   the FTL needs (copy-backs and erases). A page the request covers only partly is read
//!   first if it has a version (read-modify-write: the controller programs whole pages).
//! - **Discard** ([`DiskModel::discard`]): every page wholly inside the range is trimmed; no
//!   NAND operation, no time (a RAM update in the FTL). Partly covered pages keep their data.
//! - Service = `overhead_ns` (controller, per request) + host page operations
//!   (`Service::transfer_ns`) + merge work (`Service::merge_ns`).
//!
//! The state lives as long as the daemon: a re-attached image starts with an empty FTL (every
//! page unwritten), like a freshly formatted chip.
//!
//! Invariants:
//! 1. Pure and deterministic: the same request sequence gives the same services and counters
//!    (no clock, no randomness; `start_ns` is ignored).
//! 2. Counters add up: `page_reads = host_page_reads + copy_backs`, `page_programs =
//!    host_page_programs + copy_backs`, `block_erases = merges_switch + merges_partial + 2 *
//!    merges_full`, and the sum of per-block erase counts is `block_erases`.
//! 3. Every statistic is bounded: histograms have at most [`HISTOGRAM_BUCKETS_MAX`] buckets.

pub(crate) mod ftl;
pub(crate) mod nand;

use serde::Serialize;

use self::ftl::{Geometry, LogBlockFtl, NandOps, SPARE_BLOCKS};
use self::nand::{NandParams, NandPreset};
use super::{DiskModel, Op, SECTOR_BYTES, Service};

/// Default number of log blocks (the NVFAT paper's setting).
pub(crate) const LOG_BLOCKS_DEFAULT: u32 = 64;
/// Most buckets of every histogram in [`FlashStats`]: keeps `stat.json` small whatever the
/// device size.
pub(crate) const HISTOGRAM_BUCKETS_MAX: u64 = 256;

/// A per-item counter array folded into at most [`HISTOGRAM_BUCKETS_MAX`] buckets of
/// `per_bucket` consecutive items: bucket `i` covers items `i * per_bucket ..` and reports
/// their sum and their maximum (the last bucket may be short).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Histogram {
    /// What one item is.
    pub(crate) item: &'static str,
    pub(crate) items: u64,
    pub(crate) per_bucket: u64,
    pub(crate) sum: Vec<u64>,
    pub(crate) max: Vec<u64>,
}

impl Histogram {
    pub(crate) fn new(item: &'static str, values: impl ExactSizeIterator<Item = u64>) -> Histogram {
        let items = values.len() as u64;
        let per_bucket = items.div_ceil(HISTOGRAM_BUCKETS_MAX).max(1);
        let buckets = items.div_ceil(per_bucket) as usize;
        let (mut sum, mut max) = (vec![0; buckets], vec![0; buckets]);
        for (i, v) in values.enumerate() {
            let b = i / per_bucket as usize;
            sum[b] += v;
            max[b] = max[b].max(v);
        }
        Histogram { item, items, per_bucket, sum, max }
    }
}

/// The `flash` object of `stat.json`. The first counters are contracts: spelled as the issue
/// names them.
#[derive(Debug, Clone, Serialize)]
pub struct FlashStats {
    /// Every page read on the chip: host reads and copy-back reads.
    pub(crate) page_reads: u64,
    /// Every page program on the chip: host programs and copy-back programs.
    pub(crate) page_programs: u64,
    pub(crate) block_erases: u64,
    pub(crate) merges_switch: u64,
    pub(crate) merges_partial: u64,
    pub(crate) merges_full: u64,
    /// Energy of all NAND operations (Vcc * Icc * time), microjoules.
    pub(crate) energy_uj: f64,
    pub(crate) host_page_reads: u64,
    pub(crate) host_page_programs: u64,
    /// Pages moved by merges.
    pub(crate) copy_backs: u64,
    /// page_programs / host_page_programs (0 before the first write).
    pub(crate) write_amplification: f64,
    /// Erases per physical block: mean, population standard deviation, maximum.
    pub(crate) erase_count_mean: f64,
    pub(crate) erase_count_stddev: f64,
    pub(crate) erase_count_max: u64,
    pub(crate) log_blocks_used: u64,
    pub(crate) free_blocks: u64,
    pub(crate) nand: NandPreset,
    pub(crate) chip: &'static str,
    pub(crate) page_bytes: u64,
    pub(crate) pages_per_block: u64,
    /// Physical blocks: logical + log + spare.
    pub(crate) blocks: u64,
    pub(crate) logical_blocks: u64,
    pub(crate) log_blocks: u64,
    pub(crate) spare_blocks: u64,
    /// Host page writes per logical block (LBN): what the file system sends (paper Fig. 5).
    pub(crate) lbn_writes: Histogram,
    /// Programs per physical page, copy-backs included: what the chip endures (paper Fig. 6).
    pub(crate) page_writes: Histogram,
    /// Erases per physical block (paper Fig. 7 is their mean and deviation).
    pub(crate) block_erase_counts: Histogram,
}

/// A NAND chip behind a log-block FTL; see the module docs.
#[derive(Debug, Clone)]
pub(crate) struct Flash {
    name: String,
    nand: NandParams,
    ftl: LogBlockFtl,
    device_sectors: u64,
    /// Fixed controller overhead per request.
    overhead_ns: u64,
    totals: NandOps,
    energy_fj: u64,
}

impl Flash {
    /// A flash device of `device_bytes` (a positive multiple of 512) on `nand` with
    /// `log_blocks` log blocks: `ceil(device_bytes / block_bytes)` logical blocks, plus the log
    /// blocks, plus [`SPARE_BLOCKS`] physical ones.
    pub(crate) fn new(
        name: &str,
        nand: NandParams,
        log_blocks: u32,
        device_bytes: u64,
        overhead_ns: u64,
    ) -> Result<Flash, String> {
        nand.validate()?;
        if device_bytes == 0 || device_bytes % SECTOR_BYTES != 0 {
            return Err(format!("device size {device_bytes} must be a positive multiple of 512"));
        }
        let logical_blocks = u32::try_from(device_bytes.div_ceil(nand.block_bytes()))
            .map_err(|_| format!("device of {device_bytes} bytes is too large for the model"))?;
        let geo = Geometry {
            pages_per_block: u32::try_from(nand.pages_per_block)
                .map_err(|_| "pages per block out of range".to_string())?,
            logical_blocks,
            log_blocks,
        };
        geo.validate()?;
        Ok(Flash {
            name: name.to_string(),
            nand,
            ftl: LogBlockFtl::new(geo),
            device_sectors: device_bytes / SECTOR_BYTES,
            overhead_ns,
            totals: NandOps::default(),
            energy_fj: 0,
        })
    }

    #[cfg(test)]
    pub(crate) fn ftl(&self) -> &LogBlockFtl {
        &self.ftl
    }
    #[cfg(test)]
    pub(crate) fn totals(&self) -> NandOps {
        self.totals
    }
    #[cfg(test)]
    pub(crate) fn energy_fj(&self) -> u64 {
        self.energy_fj
    }
    fn sectors_per_page(&self) -> u64 {
        self.nand.page_bytes / SECTOR_BYTES
    }

    /// The counters and histograms of `stat.json`.
    pub(crate) fn stats(&self) -> FlashStats {
        let t = &self.totals;
        let geo = self.ftl.geometry();
        let erases: Vec<u64> = self.ftl.erase_counts().map(u64::from).collect();
        let n = erases.len() as f64;
        let mean = erases.iter().sum::<u64>() as f64 / n;
        let var = erases.iter().map(|&e| (e as f64 - mean).powi(2)).sum::<f64>() / n;
        let wa = if t.host_page_programs == 0 {
            0.0
        } else {
            t.page_programs() as f64 / t.host_page_programs as f64
        };
        FlashStats {
            page_reads: t.page_reads(),
            page_programs: t.page_programs(),
            block_erases: t.block_erases,
            merges_switch: t.merges_switch,
            merges_partial: t.merges_partial,
            merges_full: t.merges_full,
            energy_uj: self.energy_fj as f64 / 1e9,
            host_page_reads: t.host_page_reads,
            host_page_programs: t.host_page_programs,
            copy_backs: t.copy_backs,
            write_amplification: wa,
            erase_count_mean: mean,
            erase_count_stddev: var.sqrt(),
            erase_count_max: erases.iter().copied().max().unwrap_or(0),
            log_blocks_used: self.ftl.log_blocks_used() as u64,
            free_blocks: self.ftl.free_blocks() as u64,
            nand: self.nand.preset,
            chip: self.nand.chip,
            page_bytes: self.nand.page_bytes,
            pages_per_block: self.nand.pages_per_block,
            blocks: geo.physical_blocks(),
            logical_blocks: u64::from(geo.logical_blocks),
            log_blocks: u64::from(geo.log_blocks),
            spare_blocks: u64::from(SPARE_BLOCKS),
            lbn_writes: Histogram::new(
                "logical block",
                self.ftl.lbn_write_counts().iter().copied(),
            ),
            page_writes: Histogram::new(
                "physical page",
                self.ftl.page_program_counts().iter().map(|&c| u64::from(c)),
            ),
            block_erase_counts: Histogram::new("physical block", erases.into_iter()),
        }
    }
}

impl DiskModel for Flash {
    fn service(&mut self, _start_ns: u64, op: Op, lba: u64, sectors: u64) -> Service {
        assert!(sectors > 0);
        let end = lba + sectors;
        assert!(end <= self.device_sectors, "request {lba}+{sectors} beyond the device");
        let spp = self.sectors_per_page();
        let mut ops = NandOps::default();
        for lpn in lba / spp..=(end - 1) / spp {
            match op {
                Op::Read => {
                    self.ftl.read(lpn, &mut ops);
                }
                Op::Write => {
                    let whole = lba <= lpn * spp && (lpn + 1) * spp <= end;
                    if !whole {
                        self.ftl.read(lpn, &mut ops);
                    }
                    self.ftl.write(lpn, &mut ops);
                }
            }
        }
        let cost = self.nand.cost(&ops);
        self.totals.add(&ops);
        self.energy_fj = self.energy_fj.saturating_add(cost.energy_fj);
        Service {
            overhead_ns: self.overhead_ns,
            transfer_ns: cost.host_ns,
            merge_ns: cost.merge_ns,
            ..Service::default()
        }
    }

    fn discard(&mut self, lba: u64, sectors: u64) {
        let spp = self.sectors_per_page();
        let end = (lba + sectors).min(self.device_sectors);
        // Whole pages only: [ceil(lba / spp), floor(end / spp)).
        for lpn in lba.div_ceil(spp)..end / spp {
            self.ftl.trim(lpn);
        }
    }

    fn flash_stats(&self) -> Option<FlashStats> {
        Some(self.stats())
    }

    fn name(&self) -> &str {
        &self.name
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Actuator;

    /// A round chip for hand computation: 2 KiB pages (4 sectors), 4 pages per block,
    /// t_R 25 us, t_PROG 200 us, t_BERS 2 ms, 25 ns per byte (51.2 us per page), 3.3 V at
    /// 15 mA (49.5 mW) for everything.
    fn round_nand() -> NandParams {
        NandParams { pages_per_block: 4, ..NandPreset::K9f1g08.params() }
    }

    /// 4 logical blocks of 8 KiB = 32 KiB, 2 log blocks.
    fn round_flash() -> Flash {
        Flash::new("flash", round_nand(), 2, 32 * 1024, 0).unwrap()
    }

    #[test]
    fn a_small_sequence_costs_the_hand_computed_time_and_energy() {
        let mut f = round_flash();
        // (op, lba, sectors, expected service ns, expected cumulative energy fJ). Per page:
        // host program 51.2 + 200 = 251.2 us (12.4344 uJ), host read 25 + 51.2 = 76.2 us
        // (3.7719 uJ), erase 2 ms (99 uJ).
        let rows: &[(Op, u64, u64, u64, u64)] = &[
            // Fill logical block 0 (4 pages, 16 sectors) in place: 4 programs.
            (Op::Write, 0, 16, 4 * 251_200, 4 * 12_434_400_000),
            // Overwrite it sequentially: 4 programs into a log block + switch merge (1 erase).
            (Op::Write, 0, 16, 4 * 251_200 + 2_000_000, 8 * 12_434_400_000 + 99_000_000_000),
            // Read one sector of page 0: one page read.
            (Op::Read, 1, 1, 76_200, 8 * 12_434_400_000 + 99_000_000_000 + 3_771_900_000),
            // Read an unwritten page (logical block 1): free.
            (Op::Read, 16, 4, 0, 8 * 12_434_400_000 + 99_000_000_000 + 3_771_900_000),
            // Write one sector of page 1: read-modify-write = read + program (to a new log).
            (
                Op::Write,
                5,
                1,
                76_200 + 251_200,
                9 * 12_434_400_000 + 99_000_000_000 + 2 * 3_771_900_000,
            ),
        ];
        let mut act = Actuator::new(Box::new(f.clone()));
        for (i, &(op, lba, n, ns, fj)) in rows.iter().enumerate() {
            let s = f.service(0, op, lba, n);
            assert_eq!(s.total_ns(), ns, "row {i}");
            assert_eq!(f.energy_fj(), fj, "row {i}");
            assert_eq!(act.submit(None, op, lba, n).service, s, "row {i}: actuator");
        }
        let st = f.stats();
        assert_eq!(
            (st.page_reads, st.page_programs, st.block_erases, st.merges_switch),
            (2, 9, 1, 1)
        );
        // 9 programs + 1 erase + 2 reads = 111.9096 + 99 + 7.5438 uJ.
        assert!((st.energy_uj - 218.4534).abs() < 1e-6, "{}", st.energy_uj);
        assert_eq!(act.busy_ns(), 4 * 251_200 * 2 + 2_000_000 + 2 * 76_200 + 251_200);
        assert_eq!(act.flash_stats().unwrap().block_erases, 1);
    }

    /// The worked example of docs/device.md ("The log-block FTL"), step by step: (lba, sectors,
    /// service ns, energy fJ of the step, data block of LBN 0 afterwards).
    #[test]
    fn the_worked_example_of_the_docs() {
        let mut f = round_flash();
        let steps: &[(&[u64], u64, u128, u32)] = &[
            (&[0, 1, 2, 3], 1_004_800, 4 * 12_434_400_000, 0),
            (&[0, 1, 2, 3], 3_004_800, 4 * 12_434_400_000 + 99_000_000_000, 1),
            (
                &[3, 1, 3, 0],
                5_904_800,
                4 * 12_434_400_000 + 4 * 11_137_500_000 + 2 * 99_000_000_000,
                3,
            ),
        ];
        for (i, &(pages, ns, fj, data)) in steps.iter().enumerate() {
            let e0 = f.energy_fj();
            let total: u64 =
                pages.iter().map(|&p| f.service(0, Op::Write, p * 4, 4).total_ns()).sum();
            assert_eq!(total, ns, "step {}", i + 1);
            assert_eq!(u128::from(f.energy_fj() - e0), fj, "step {}", i + 1);
            assert_eq!(f.ftl().data_block(0), Some(data), "step {}", i + 1);
        }
        let t = f.totals();
        assert_eq!((t.merges_switch, t.merges_full, t.copy_backs, t.block_erases), (1, 1, 4, 3));
        // Step 3's full merge: offset 0 came from log page 3 and so on; all now in block 3.
        for off in 0..4 {
            assert_eq!(f.ftl().lookup(off), Some(ftl::Ppn { pbn: 3, page: off as u32 }));
        }
        // The partial merge of step 4 is `evicting_an_in_order_incomplete_log_is_a_partial_merge`
        // in ftl/tests.rs (one log block).
    }

    #[test]
    fn a_request_spanning_pages_and_blocks_maps_to_every_page() {
        let mut f = round_flash();
        // Sectors 14..22 cover pages 3 (sectors 12-15, partly), 4 (16-19) and 5 (20-23,
        // partly): none has a version yet, so no read-modify-write: 3 programs.
        let s = f.service(0, Op::Write, 14, 8);
        assert_eq!(s.transfer_ns, 3 * 251_200);
        assert_eq!(f.totals().host_page_reads, 0);
        // The same again: pages 3 and 5 are partial and now have versions: 2 reads.
        f.service(0, Op::Write, 14, 8);
        assert_eq!(f.totals().host_page_reads, 2);
        assert_eq!(f.totals().host_page_programs, 6);
    }

    #[test]
    fn discard_trims_whole_pages_only() {
        let mut f = round_flash();
        f.service(0, Op::Write, 0, 16);
        // Sectors 2..10: page 0 partly, page 1 wholly (4-7), page 2 partly.
        f.discard(2, 8);
        assert!(f.ftl().lookup(0).is_some());
        assert!(f.ftl().lookup(1).is_none());
        assert!(f.ftl().lookup(2).is_some());
        f.ftl().check();
        // Reading the trimmed page costs nothing.
        assert_eq!(f.service(0, Op::Read, 4, 4).total_ns(), 0);
        // A trimmed page is not copied by the merge: overwrite pages 3, 0 (out of order), then
        // 3, 0 again -> full merge copies offsets 0, 2, 3 only.
        for lba in [12, 0, 12, 0] {
            f.service(0, Op::Write, lba, 4);
        }
        assert_eq!((f.totals().merges_full, f.totals().copy_backs), (1, 3));
    }

    #[test]
    fn the_device_size_sets_the_geometry() {
        // The paper's 32 MiB volume on the small-block chip: 2048 logical blocks of 16 KiB,
        // 64 log blocks, 1 spare.
        let f = Flash::new("flash", NandPreset::K9f1208.params(), 64, 32 << 20, 0).unwrap();
        let st = f.stats();
        assert_eq!((st.logical_blocks, st.blocks, st.free_blocks), (2048, 2113, 2113));
        // A size that is not a whole number of blocks rounds up; the last block is partial.
        let f = Flash::new("flash", NandPreset::K9f1g08.params(), 64, 130 * 1024, 0).unwrap();
        assert_eq!(f.stats().logical_blocks, 2);
        assert!(Flash::new("flash", NandPreset::K9f1208.params(), 0, 1 << 20, 0).is_err());
        assert!(Flash::new("flash", NandPreset::K9f1208.params(), 64, 1 << 40, 0).is_err());
    }

    #[test]
    fn erase_statistics_and_histograms_are_exact_and_bounded() {
        let mut f = round_flash(); // 4 + 2 + 1 = 7 physical blocks
        f.service(0, Op::Write, 0, 16);
        f.service(0, Op::Write, 0, 16); // switch merge: block 0 erased once
        let st = f.stats();
        assert_eq!(st.erase_count_max, 1);
        assert!((st.erase_count_mean - 1.0 / 7.0).abs() < 1e-12);
        // Population deviation of (1, 0, 0, 0, 0, 0, 0): sqrt(6/49).
        assert!((st.erase_count_stddev - (6.0f64 / 49.0).sqrt()).abs() < 1e-12);
        assert_eq!(st.lbn_writes.sum, vec![8, 0, 0, 0]);
        assert_eq!(st.block_erase_counts.sum, vec![1, 0, 0, 0, 0, 0, 0]);
        assert_eq!(st.page_writes.items, 28);
        assert_eq!(st.page_writes.sum.iter().sum::<u64>(), 8);
        assert!((st.write_amplification - 1.0).abs() < 1e-12);

        // The largest device the model takes keeps stat.json small: 256 buckets each.
        let big = Flash::new("flash", NandPreset::K9f1208.params(), 64, 2 << 30, 0).unwrap();
        let st = big.stats();
        for h in [&st.lbn_writes, &st.page_writes, &st.block_erase_counts] {
            assert!(h.sum.len() as u64 <= HISTOGRAM_BUCKETS_MAX && h.sum.len() == h.max.len());
            assert!(h.per_bucket * (h.sum.len() as u64 - 1) < h.items);
        }
        let doc = serde_json::to_string_pretty(&st).unwrap();
        assert!(doc.len() < 48 * 1024, "flash stats take {} bytes", doc.len());
    }

    #[test]
    fn histogram_buckets_fold_sums_and_maxima() {
        let h = Histogram::new("x", [1u64, 2, 3, 4, 5].into_iter());
        assert_eq!((h.per_bucket, h.sum.clone(), h.max.clone()), (1, vec![1, 2, 3, 4, 5], h.sum));
        let h = Histogram::new("x", (0..1000u32).map(|i| u64::from(i % 7)));
        assert_eq!(h.per_bucket, 4);
        assert_eq!(h.sum.len(), 250);
        assert_eq!((h.sum[0], h.max[0]), (6, 3));
        assert_eq!(h.sum.iter().sum::<u64>(), (0..1000u64).map(|i| i % 7).sum::<u64>());
    }
}
