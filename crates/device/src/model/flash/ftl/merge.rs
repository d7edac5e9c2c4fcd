//! The merges of the log-block FTL, and the block primitives every state change goes
//! through.
//!
//! A log block is merged with its data block when it becomes full, or when it is the oldest
//! log block and a logical block without one needs one (rule W2 in `mod.rs`). By the log
//! block's content:
//!
//! - **switch**: the log holds offsets `0, 1, .., P-1` in this order (a sequential,
//!   complete overwrite): the log block becomes the data block, the old data block (all
//!   pages invalid) is erased. 1 erase, 0 copies.
//! - **partial**: the log holds offsets `0, 1, .., k-1` in order, `k < P` (only when a log
//!   block is evicted before it is full): the valid pages `k..P` of the data block are copied
//!   back into the log block at their own offsets, the log block becomes the data block, the
//!   old data block is erased. 1 erase, `#valid data pages in k..P` copies.
//! - **full**: anything else (out of order, or repeated offsets): a new block is taken from the
//!   free list, the newest version of every offset (log page, else valid data page) is copied
//!   back to its own offset, then the data block and the log block are erased, in this order.
//!   2 erases, `#offsets with a version` copies.
//!
//! A copy-back reads and programs one page inside the chip; it counts as one page read and
//! one page program in the totals ([`NandOps::page_reads`], [`NandOps::page_programs`]).
//!
//! The primitives keep the invariants of `mod.rs` local: [`LogBlockFtl::alloc`] takes the head
//! of the free list (invariant 3: never empty), [`LogBlockFtl::program`] only at or beyond the
//! write pointer (invariant 4), [`LogBlockFtl::copy`] only a valid page, and
//! [`LogBlockFtl::erase`] only a block without valid pages (invariant 7); an erased block joins
//! the tail of the free list and its erase count grows by one.

use super::{BlockUse, LogBlockFtl, NandOps, PageState, Ppn};

impl LogBlockFtl {
    /// Merges the log block of `lbn` with its data block (switch, partial or full; see the
    /// module docs). Precondition: `lbn` has a log block.
    pub(crate) fn merge(&mut self, lbn: u32, ops: &mut NandOps) {
        let log = self.logs.remove(&lbn).expect("merge of a logical block without a log block");
        self.log_age.remove(&log.seq);
        let d = self.data[lbn as usize].expect("invariant 2: a log block implies a data block");
        let ppb = self.ppb();
        let used = log.offsets.len() as u32;
        let in_order = log.offsets.iter().enumerate().all(|(i, &o)| o as usize == i);
        if in_order {
            if used == ppb {
                ops.merges_switch += 1;
            } else {
                // Partial: complete the log block from the data block, then switch.
                ops.merges_partial += 1;
                for off in used..ppb {
                    let src = Ppn { pbn: d, page: off };
                    if self.state(src) == PageState::Valid {
                        self.copy(src, Ppn { pbn: log.pbn, page: off }, ops);
                    }
                }
            }
            self.erase(d, ops);
            self.blocks[log.pbn as usize].usage = BlockUse::Data { lbn };
            self.data[lbn as usize] = Some(log.pbn);
        } else {
            ops.merges_full += 1;
            let n = self.alloc(BlockUse::Data { lbn });
            for off in 0..ppb {
                let src = if let Some(page) = log.newest[off as usize] {
                    Some(Ppn { pbn: log.pbn, page })
                } else {
                    let p = Ppn { pbn: d, page: off };
                    (self.state(p) == PageState::Valid).then_some(p)
                };
                if let Some(src) = src {
                    self.copy(src, Ppn { pbn: n, page: off }, ops);
                }
            }
            self.erase(d, ops);
            self.erase(log.pbn, ops);
            self.data[lbn as usize] = Some(n);
        }
    }

    pub(super) fn alloc(&mut self, usage: BlockUse) -> u32 {
        let pbn = self.free.pop_front().expect("invariant 3: a free block is always left");
        let b = &mut self.blocks[pbn as usize];
        assert!(b.usage == BlockUse::Free && b.write_ptr == 0, "free list names a used block");
        b.usage = usage;
        pbn
    }

    /// Programs page `p`: from the host (`src` = None) or as a copy-back of `src`.
    pub(super) fn program(&mut self, p: Ppn, src: Option<Ppn>) {
        let b = &mut self.blocks[p.pbn as usize];
        assert!(p.page >= b.write_ptr, "page {p:?} programmed out of order");
        b.write_ptr = p.page + 1;
        let i = self.idx(p);
        debug_assert_eq!(self.pages[i], PageState::Free);
        self.pages[i] = PageState::Valid;
        self.page_programs[i] = self.page_programs[i].saturating_add(1);
        #[cfg(test)]
        {
            self.tags[i] = match src {
                Some(s) => self.tags[self.idx(s)],
                None => self.tag_next,
            };
        }
        let _ = src;
    }

    fn copy(&mut self, src: Ppn, dst: Ppn, ops: &mut NandOps) {
        assert_eq!(self.state(src), PageState::Valid, "copy-back of a page that is not valid");
        self.program(dst, Some(src));
        self.set_state(src, PageState::Invalid);
        ops.copy_backs += 1;
    }

    fn erase(&mut self, pbn: u32, ops: &mut NandOps) {
        let ppb = self.ppb() as usize;
        let first = pbn as usize * ppb;
        let pages = &mut self.pages[first..first + ppb];
        assert!(
            pages.iter().all(|&s| s != PageState::Valid),
            "invariant 7: erase of block {pbn} with valid pages"
        );
        pages.fill(PageState::Free);
        let b = &mut self.blocks[pbn as usize];
        b.usage = BlockUse::Free;
        b.write_ptr = 0;
        b.erase_count = b.erase_count.saturating_add(1);
        self.free.push_back(pbn);
        ops.block_erases += 1;
    }
}
