//! What the log-block FTL counts: the NAND operations and merges of each request
//! ([`NandOps`], priced by `nand.rs`), and the wear it leaves (erases per physical block,
//! programs per physical page, host writes per logical block) for `stat.json`'s histograms.
//!
//! Invariants (the property test in `tests.rs` checks them after random runs): the per-page
//! program counts sum to `page_programs()` of the totals, the per-block erase counts to
//! `block_erases`, the per-LBN write counts to `host_page_programs`; a switch or partial merge
//! erases one block, a full merge two. Per-block and per-page counters saturate.

use serde::Serialize;

use super::LogBlockFtl;
#[cfg(test)]
use super::Ppn;

/// NAND operations and merges, as counted by the FTL (one request's worth, or a total).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub(crate) struct NandOps {
    /// Page reads for the host: reads, and the read half of a partial-page write.
    pub(crate) host_page_reads: u64,
    /// Page programs for the host's writes.
    pub(crate) host_page_programs: u64,
    /// Pages moved by merges (one page read + one page program inside the chip each).
    pub(crate) copy_backs: u64,
    pub(crate) block_erases: u64,
    pub(crate) merges_switch: u64,
    pub(crate) merges_partial: u64,
    pub(crate) merges_full: u64,
}

impl NandOps {
    pub(crate) fn add(&mut self, o: &NandOps) {
        self.host_page_reads += o.host_page_reads;
        self.host_page_programs += o.host_page_programs;
        self.copy_backs += o.copy_backs;
        self.block_erases += o.block_erases;
        self.merges_switch += o.merges_switch;
        self.merges_partial += o.merges_partial;
        self.merges_full += o.merges_full;
    }
    /// Every page read on the chip (host reads + copy-backs).
    pub(crate) fn page_reads(&self) -> u64 {
        self.host_page_reads + self.copy_backs
    }
    /// Every page program on the chip (host programs + copy-backs).
    pub(crate) fn page_programs(&self) -> u64 {
        self.host_page_programs + self.copy_backs
    }
    #[cfg(test)]
    pub(crate) fn merges(&self) -> u64 {
        self.merges_switch + self.merges_partial + self.merges_full
    }
}

impl LogBlockFtl {
    pub(crate) fn log_blocks_used(&self) -> usize {
        self.logs.len()
    }
    pub(crate) fn free_blocks(&self) -> usize {
        self.free.len()
    }
    /// Whether `lbn` has a log block now.
    #[cfg(test)]
    pub(crate) fn has_log(&self, lbn: u32) -> bool {
        self.logs.contains_key(&lbn)
    }
    /// The data block of `lbn`, if any.
    #[cfg(test)]
    pub(crate) fn data_block(&self, lbn: u32) -> Option<u32> {
        self.data[lbn as usize]
    }
    /// Erases per physical block.
    pub(crate) fn erase_counts(&self) -> impl ExactSizeIterator<Item = u32> + '_ {
        self.blocks.iter().map(|b| b.erase_count)
    }
    /// Programs per physical page.
    pub(crate) fn page_program_counts(&self) -> &[u32] {
        &self.page_programs
    }
    /// Host page writes per logical block.
    pub(crate) fn lbn_write_counts(&self) -> &[u64] {
        &self.lbn_writes
    }
    #[cfg(test)]
    pub(crate) fn tag(&self, p: Ppn) -> u64 {
        self.tags[self.idx(p)]
    }
}
