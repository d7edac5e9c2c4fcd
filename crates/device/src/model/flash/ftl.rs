//! The log-block FTL (Kim, Kim, Noh, Min, Cho, "A space-efficient flash translation layer for
//! CompactFlash systems", IEEE Trans. Consumer Electronics 48(2), 2002): the scheme the NVFAT
//! paper runs under VFAT, with 64 log blocks.
//!
//! Pure and deterministic: no clock, no IO, no randomness. It decides which NAND operations a
//! host page read, write or trim costs and counts them in a [`NandOps`]; `nand.rs` prices
//! them. It stores no data, only where each logical page's newest version lives.
//!
//! # Mapping structures
//!
//! A logical page number `lpn` splits into a logical block number `lbn = lpn / P` and an
//! offset `off = lpn % P` (`P` = pages per block).
//!
//! ```text
//!  data[lbn] ──> data block (block mapped: page `off` holds logical offset `off`)
//!                 ┌────┬────┬────┬────┐
//!                 │ V0 │ I1 │ V2 │ -- │   V valid, I invalid (superseded or trimmed),
//!                 └────┴────┴────┴────┘   -- free; write_ptr = 3
//!  logs[lbn] ──> log block (page mapped, appended in write order)
//!                 ┌────┬────┬────┬────┐
//!                 │ 1  │ 3  │ -- │ -- │   offsets = [1, 3], newest[1] = 0, newest[3] = 1
//!                 └────┴────┴────┴────┘
//!  free ──> FIFO of erased blocks (allocate at the head, erased blocks join the tail)
//! ```
//!
//! The newest version of `(lbn, off)` is the log page `newest[off]` if the logical block has
//! a log block holding `off`, else data page `off` if it is valid, else there is none (the page
//! was never written or was trimmed; it reads as zeros and costs no NAND read).
//!
//! # Writes ([`LogBlockFtl::write`])
//!
//! - **W1, in place**: a logical block without a data block gets one from the free list. If
//!   `off >= write_ptr` of the data block (pages of a block are programmed in ascending order),
//!   the page is programmed in place. This is every first write of a page written in ascending
//!   order; no older version can exist (every version of `off` was written at or below the
//!   write pointer).
//! - **W2, log**: otherwise the page goes to the logical block's log block, at its next page.
//!   A logical block without one gets one from the free list; when all `log_blocks` are in
//!   use, the **oldest log block (first allocated) is merged first** (FIFO victim, wear- and
//!   recency-unaware, like the free-block allocator). The old version becomes invalid. A log
//!   block that becomes full is merged at once ([`LogBlockFtl::merge`]).
//!
//! # Merges ([`LogBlockFtl::merge`]), by the log block's content
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
//! # Trims ([`LogBlockFtl::trim`])
//!
//! A trimmed page's newest version becomes invalid and, if it was a log page, leaves the log
//! map: the page reads as zeros, costs no NAND operation, and is not copied by later merges.
//! Blocks are not erased by a trim (they are when their logical block next merges).
//!
//! # Invariants (checked by [`LogBlockFtl::check`], which the tests run after every step)
//!
//! 1. Every physical block is in exactly one state: free (in the free list, every page free,
//!    write pointer 0), data of `lbn` (`data[lbn]` names it), or log of `lbn` (`logs[lbn]`
//!    names it).
//! 2. At most `log_blocks` log blocks exist and at most one per logical block; a logical block
//!    with a log block has a data block.
//! 3. There are `logical_blocks + log_blocks + SPARE_BLOCKS` physical blocks, so at least
//!    `SPARE_BLOCKS` (1) are free whenever no merge is running: a full merge takes its new
//!    block before it erases two, and every other allocation has a free block by counting.
//!    Allocation therefore never fails.
//! 4. In every block the pages at or beyond the write pointer are free (ascending program
//!    order); a data block's page `off` holds logical offset `off`.
//! 5. A log block holds `1..P-1` programmed pages (a full one is merged at once); `newest[off]`
//!    is the last log page holding `off`, and it is valid; every other log page is invalid.
//! 6. Every logical page has at most one valid physical page: if the log holds `off`, data
//!    page `off` is not valid.
//! 7. A block is erased only when none of its pages is valid.
//!
//! # Limits
//!
//! `log_blocks` in `1..=LOG_BLOCKS_MAX`, `pages_per_block` in `1..=PAGES_PER_BLOCK_MAX`,
//! physical pages at most `PHYSICAL_PAGES_MAX` (state: 1 + 4 bytes per physical page, 8 per
//! logical block): checked by [`Geometry::validate`].

use std::collections::{BTreeMap, VecDeque};

use serde::Serialize;

/// Free blocks beyond the log blocks: the one a full merge needs before it can erase
/// (invariant 3).
pub(crate) const SPARE_BLOCKS: u32 = 1;
/// Most log blocks (`--log-blocks`).
pub(crate) const LOG_BLOCKS_MAX: u32 = 4096;
/// Most pages per erase block.
pub(crate) const PAGES_PER_BLOCK_MAX: u32 = 1024;
/// Most physical pages: a device of about 4 GiB on 512-byte pages, 16 GiB on 2 KiB pages;
/// at most 40 MiB of state (1 + 4 bytes per page).
pub(crate) const PHYSICAL_PAGES_MAX: u64 = 1 << 23;

/// The shape of the FTL's flash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(crate) struct Geometry {
    pub(crate) pages_per_block: u32,
    /// Blocks the host sees (the device size in blocks, rounded up).
    pub(crate) logical_blocks: u32,
    pub(crate) log_blocks: u32,
}

impl Geometry {
    pub(crate) fn physical_blocks(&self) -> u64 {
        u64::from(self.logical_blocks) + u64::from(self.log_blocks) + u64::from(SPARE_BLOCKS)
    }
    pub(crate) fn physical_pages(&self) -> u64 {
        self.physical_blocks() * u64::from(self.pages_per_block)
    }
    pub(crate) fn logical_pages(&self) -> u64 {
        u64::from(self.logical_blocks) * u64::from(self.pages_per_block)
    }
    pub(crate) fn validate(&self) -> Result<(), String> {
        if !(1..=PAGES_PER_BLOCK_MAX).contains(&self.pages_per_block) {
            return Err(format!(
                "pages per block must be in 1..={PAGES_PER_BLOCK_MAX}, got {}",
                self.pages_per_block
            ));
        }
        if !(1..=LOG_BLOCKS_MAX).contains(&self.log_blocks) {
            return Err(format!(
                "--log-blocks must be in 1..={LOG_BLOCKS_MAX}, got {}",
                self.log_blocks
            ));
        }
        if self.logical_blocks == 0 {
            return Err("the device must hold at least one block".into());
        }
        if self.physical_pages() > PHYSICAL_PAGES_MAX {
            return Err(format!(
                "the flash would have {} pages; the model holds at most {PHYSICAL_PAGES_MAX} \
                 (use a smaller --size or the large-block preset)",
                self.physical_pages()
            ));
        }
        Ok(())
    }
}

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

/// A physical page: block and page index inside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Ppn {
    pub(crate) pbn: u32,
    pub(crate) page: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PageState {
    Free,
    Valid,
    Invalid,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BlockUse {
    Free,
    Data { lbn: u32 },
    Log { lbn: u32 },
}

#[derive(Debug, Clone)]
struct Block {
    usage: BlockUse,
    /// The next page that may be programmed; pages at or beyond it are free (invariant 4).
    write_ptr: u32,
    erase_count: u32,
}

#[derive(Debug, Clone)]
struct LogBlock {
    pbn: u32,
    /// Allocation order; the smallest is the eviction victim.
    seq: u64,
    /// Log page `i` holds logical offset `offsets[i]`; `offsets.len()` is its write pointer.
    offsets: Vec<u32>,
    /// Logical offset -> the log page with its newest version.
    newest: Vec<Option<u32>>,
}

/// The log-block FTL; see the module docs.
#[derive(Debug, Clone)]
pub(crate) struct LogBlockFtl {
    geo: Geometry,
    blocks: Vec<Block>,
    /// Per physical page (`pbn * P + page`).
    pages: Vec<PageState>,
    /// Programs per physical page (host and copy-back), saturating.
    page_programs: Vec<u32>,
    /// Per logical block: its data block.
    data: Vec<Option<u32>>,
    /// Host page writes per logical block.
    lbn_writes: Vec<u64>,
    logs: BTreeMap<u32, LogBlock>,
    /// `seq -> lbn` of every log block: the victim order.
    log_age: BTreeMap<u64, u32>,
    next_seq: u64,
    free: VecDeque<u32>,
    /// Test only: a version tag per physical page, set by host programs from `tag_next` and
    /// carried by copy-backs, so tests can check that reads find the newest version.
    #[cfg(test)]
    tags: Vec<u64>,
    #[cfg(test)]
    pub(crate) tag_next: u64,
}

impl LogBlockFtl {
    /// All blocks erased and free, in number order. Panics on an invalid geometry (callers
    /// validate first: [`Geometry::validate`]).
    pub(crate) fn new(geo: Geometry) -> Self {
        if let Err(e) = geo.validate() {
            panic!("invalid FTL geometry {geo:?}: {e}");
        }
        let nblocks = geo.physical_blocks() as u32;
        let npages = geo.physical_pages() as usize;
        LogBlockFtl {
            geo,
            blocks: vec![
                Block { usage: BlockUse::Free, write_ptr: 0, erase_count: 0 };
                nblocks as usize
            ],
            pages: vec![PageState::Free; npages],
            page_programs: vec![0; npages],
            data: vec![None; geo.logical_blocks as usize],
            lbn_writes: vec![0; geo.logical_blocks as usize],
            logs: BTreeMap::new(),
            log_age: BTreeMap::new(),
            next_seq: 0,
            free: (0..nblocks).collect(),
            #[cfg(test)]
            tags: vec![0; npages],
            #[cfg(test)]
            tag_next: 0,
        }
    }

    pub(crate) fn geometry(&self) -> Geometry {
        self.geo
    }
    fn ppb(&self) -> u32 {
        self.geo.pages_per_block
    }
    fn split(&self, lpn: u64) -> (u32, u32) {
        assert!(lpn < self.geo.logical_pages(), "logical page {lpn} beyond the device");
        let ppb = u64::from(self.ppb());
        ((lpn / ppb) as u32, (lpn % ppb) as u32)
    }
    fn idx(&self, p: Ppn) -> usize {
        p.pbn as usize * self.ppb() as usize + p.page as usize
    }
    fn state(&self, p: Ppn) -> PageState {
        self.pages[self.idx(p)]
    }
    fn set_state(&mut self, p: Ppn, s: PageState) {
        let i = self.idx(p);
        self.pages[i] = s;
    }

    /// Where the newest version of `(lbn, off)` lives, if any.
    fn current(&self, lbn: u32, off: u32) -> Option<Ppn> {
        if let Some(log) = self.logs.get(&lbn) {
            if let Some(page) = log.newest[off as usize] {
                return Some(Ppn { pbn: log.pbn, page });
            }
        }
        let pbn = self.data[lbn as usize]?;
        let p = Ppn { pbn, page: off };
        (self.state(p) == PageState::Valid).then_some(p)
    }

    /// Where logical page `lpn` is, without counting a read.
    pub(crate) fn lookup(&self, lpn: u64) -> Option<Ppn> {
        let (lbn, off) = self.split(lpn);
        self.current(lbn, off)
    }

    /// A host read of `lpn`: one page read if the page has a version, none otherwise.
    pub(crate) fn read(&mut self, lpn: u64, ops: &mut NandOps) -> Option<Ppn> {
        let p = self.lookup(lpn)?;
        ops.host_page_reads += 1;
        Some(p)
    }

    /// A host write of the whole page `lpn` (rules W1, W2 of the module docs), with any merge
    /// it forces. Returns where the page was programmed (a merge at the end may have moved it
    /// since: ask [`LogBlockFtl::lookup`]).
    pub(crate) fn write(&mut self, lpn: u64, ops: &mut NandOps) -> Ppn {
        let (lbn, off) = self.split(lpn);
        ops.host_page_programs += 1;
        self.lbn_writes[lbn as usize] += 1;
        let d = if let Some(d) = self.data[lbn as usize] {
            d
        } else {
            let d = self.alloc(BlockUse::Data { lbn });
            self.data[lbn as usize] = Some(d);
            d
        };
        // W1: in place, in ascending page order.
        if off >= self.blocks[d as usize].write_ptr {
            let p = Ppn { pbn: d, page: off };
            debug_assert!(self.logs.get(&lbn).is_none_or(|l| l.newest[off as usize].is_none()));
            self.program(p, None);
            return p;
        }
        // W2: to the log block, evicting the oldest log block if none is left.
        if !self.logs.contains_key(&lbn) {
            if self.logs.len() == self.geo.log_blocks as usize {
                let (_, &victim) = self.log_age.first_key_value().expect("log blocks in use");
                self.merge(victim, ops);
            }
            let pbn = self.alloc(BlockUse::Log { lbn });
            let seq = self.next_seq;
            self.next_seq += 1;
            let ppb = self.ppb() as usize;
            self.logs.insert(
                lbn,
                LogBlock { pbn, seq, offsets: Vec::with_capacity(ppb), newest: vec![None; ppb] },
            );
            self.log_age.insert(seq, lbn);
        }
        if let Some(old) = self.current(lbn, off) {
            self.set_state(old, PageState::Invalid);
        }
        let log = self.logs.get_mut(&lbn).expect("just ensured");
        let page = log.offsets.len() as u32;
        log.offsets.push(off);
        log.newest[off as usize] = Some(page);
        let p = Ppn { pbn: log.pbn, page };
        self.program(p, None);
        if page + 1 == self.ppb() {
            self.merge(lbn, ops);
        }
        p
    }

    /// A trim (discard) of the whole page `lpn`: its newest version becomes invalid. No NAND
    /// operation.
    pub(crate) fn trim(&mut self, lpn: u64) {
        let (lbn, off) = self.split(lpn);
        let Some(p) = self.current(lbn, off) else { return };
        self.set_state(p, PageState::Invalid);
        if let Some(log) = self.logs.get_mut(&lbn) {
            if log.pbn == p.pbn {
                log.newest[off as usize] = None;
            }
        }
    }

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

    fn alloc(&mut self, usage: BlockUse) -> u32 {
        let pbn = self.free.pop_front().expect("invariant 3: a free block is always left");
        let b = &mut self.blocks[pbn as usize];
        assert!(b.usage == BlockUse::Free && b.write_ptr == 0, "free list names a used block");
        b.usage = usage;
        pbn
    }

    /// Programs page `p`: from the host (`src` = None) or as a copy-back of `src`.
    fn program(&mut self, p: Ppn, src: Option<Ppn>) {
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

    /// Checks invariants 1-6 of the module docs (7 is asserted at every erase). O(pages): for
    /// tests.
    #[cfg(test)]
    pub(crate) fn check(&self) {
        let ppb = self.ppb();
        let nblocks = self.blocks.len();
        let mut in_free = vec![false; nblocks];
        for &f in &self.free {
            assert!(!in_free[f as usize], "block {f} twice in the free list");
            in_free[f as usize] = true;
        }
        assert!(self.logs.len() <= self.geo.log_blocks as usize, "invariant 2: too many logs");
        assert_eq!(self.logs.len(), self.log_age.len());
        for (pbn, b) in self.blocks.iter().enumerate() {
            let pbn = pbn as u32;
            let page = |i: u32| self.state(Ppn { pbn, page: i });
            for i in b.write_ptr..ppb {
                assert_eq!(page(i), PageState::Free, "invariant 4: block {pbn} page {i}");
            }
            match b.usage {
                BlockUse::Free => {
                    assert!(in_free[pbn as usize], "invariant 1: free block {pbn} not listed");
                    assert_eq!(b.write_ptr, 0, "invariant 1: free block {pbn} programmed");
                }
                BlockUse::Data { lbn } => {
                    assert!(!in_free[pbn as usize]);
                    assert_eq!(self.data[lbn as usize], Some(pbn), "invariant 1: data {pbn}");
                }
                BlockUse::Log { lbn } => {
                    assert!(!in_free[pbn as usize]);
                    let log = &self.logs[&lbn];
                    assert_eq!(log.pbn, pbn, "invariant 1: log {pbn}");
                    assert_eq!(self.log_age.get(&log.seq), Some(&lbn));
                    let used = log.offsets.len() as u32;
                    assert!(used >= 1 && used < ppb, "invariant 5: log {pbn} holds {used}");
                    assert_eq!(b.write_ptr, used);
                    for (i, &off) in log.offsets.iter().enumerate() {
                        let i = i as u32;
                        let newest = log.newest[off as usize] == Some(i);
                        let last = !log.offsets[i as usize + 1..].contains(&off);
                        assert!(!newest || last, "invariant 5: newest[{off}] is not the last");
                        let want = if newest { PageState::Valid } else { PageState::Invalid };
                        assert_eq!(page(i), want, "invariant 5: log {pbn} page {i}");
                    }
                    for (off, newest) in log.newest.iter().enumerate() {
                        if let Some(i) = *newest {
                            assert_eq!(log.offsets.get(i as usize), Some(&(off as u32)));
                        }
                    }
                    let d = self.data[lbn as usize].expect("invariant 2: log without data");
                    for off in 0..ppb {
                        if log.newest[off as usize].is_some() {
                            let dp = self.state(Ppn { pbn: d, page: off });
                            assert_ne!(dp, PageState::Valid, "invariant 6: lbn {lbn} off {off}");
                        }
                    }
                }
            }
        }
        for (lbn, d) in self.data.iter().enumerate() {
            if let Some(d) = d {
                assert_eq!(self.blocks[*d as usize].usage, BlockUse::Data { lbn: lbn as u32 });
            }
        }
        let used = self.data.iter().flatten().count() + self.logs.len();
        assert_eq!(used + self.free.len(), nblocks, "invariant 1: blocks lost");
        assert!(self.free.len() >= SPARE_BLOCKS as usize, "invariant 3");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// 4 pages per block, 4 logical blocks, `logs` log blocks: small enough to follow by hand.
    fn ftl(logs: u32) -> LogBlockFtl {
        LogBlockFtl::new(Geometry { pages_per_block: 4, logical_blocks: 4, log_blocks: logs })
    }

    /// Writes the logical pages in order, checking the invariants after each; returns the ops.
    fn write_all(f: &mut LogBlockFtl, lpns: &[u64]) -> NandOps {
        let mut ops = NandOps::default();
        for &l in lpns {
            f.write(l, &mut ops);
            f.check();
        }
        ops
    }

    #[test]
    fn first_writes_in_ascending_order_go_in_place_without_merges() {
        let mut f = ftl(2);
        // Block 0 gets logical block 0 (free list in number order), page by page.
        let ops = write_all(&mut f, &[0, 1, 3]);
        assert_eq!(ops, NandOps { host_page_programs: 3, ..NandOps::default() });
        assert_eq!(f.lookup(3), Some(Ppn { pbn: 0, page: 3 }));
        assert_eq!(f.lookup(2), None, "skipped page 2 is unwritten");
        assert_eq!(f.log_blocks_used(), 0);
        // Page 2 is below the write pointer (4): it goes to a log block (block 1).
        let ops = write_all(&mut f, &[2]);
        assert_eq!(ops.merges(), 0);
        assert_eq!(f.lookup(2), Some(Ppn { pbn: 1, page: 0 }));
        assert!(f.has_log(0));
    }

    #[test]
    fn sequential_overwrite_of_a_block_is_one_switch_merge() {
        let mut f = ftl(2);
        write_all(&mut f, &[0, 1, 2, 3]); // in place into block 0
        let ops = write_all(&mut f, &[0, 1, 2, 3]); // log block 1, full -> switch
        assert_eq!(
            ops,
            NandOps {
                host_page_programs: 4,
                block_erases: 1,
                merges_switch: 1,
                ..NandOps::default()
            }
        );
        assert_eq!(f.data_block(0), Some(1), "the log block became the data block");
        assert_eq!(f.erase_counts().collect::<Vec<_>>(), vec![1, 0, 0, 0, 0, 0, 0]);
        assert!(!f.has_log(0));
        // The erased block 0 joined the tail of the free list: the next allocation takes
        // block 2, not block 0 (FIFO allocator).
        write_all(&mut f, &[4]);
        assert_eq!(f.data_block(1), Some(2));
    }

    #[test]
    fn evicting_an_in_order_incomplete_log_is_a_partial_merge() {
        let mut f = ftl(1);
        write_all(&mut f, &[0, 1, 2, 3, 4]); // lbn 0 in block 0, lbn 1 page 0 in block 1
        write_all(&mut f, &[0, 1]); // in order, incomplete: log block 2 for lbn 0
        // An overwrite in lbn 1 needs a log block; the only one belongs to lbn 0: it merges.
        // Partial: data pages 2 and 3 are copied back into the log block, block 0 erased.
        let ops = write_all(&mut f, &[4]);
        assert_eq!(
            ops,
            NandOps {
                host_page_programs: 1,
                copy_backs: 2,
                block_erases: 1,
                merges_partial: 1,
                ..NandOps::default()
            }
        );
        assert_eq!(f.data_block(0), Some(2));
        for off in 0..4 {
            assert_eq!(f.lookup(off), Some(Ppn { pbn: 2, page: off as u32 }));
        }
        assert!(f.has_log(1) && !f.has_log(0));
        // Block 0 was erased (tail of the free list), so lbn 1's log came from block 3.
        assert_eq!(f.lookup(4), Some(Ppn { pbn: 3, page: 0 }));
    }

    #[test]
    fn partial_merge_copies_only_valid_data_pages() {
        let mut f = ftl(1);
        write_all(&mut f, &[0, 1, 3, 4]); // lbn 0: pages 0, 1, 3 valid, 2 never written
        f.trim(3); // page 3 trimmed: invalid, nothing to copy
        write_all(&mut f, &[0]); // log for lbn 0: offset 0
        let ops = write_all(&mut f, &[4]); // evicts lbn 0's log: partial, copies page 1 only
        assert_eq!((ops.merges_partial, ops.copy_backs, ops.block_erases), (1, 1, 1));
        assert_eq!(f.lookup(2), None);
        assert_eq!(f.lookup(3), None);
    }

    #[test]
    fn random_overwrites_are_full_merges() {
        let mut f = ftl(2);
        write_all(&mut f, &[0, 1, 2, 3]); // data block 0
        // Log block 1 receives offsets 3, 1, 3, 0: out of order, full after 4 pages. Full
        // merge into new block 2: offset 0 (log page 3), 1 (log page 1), 2 (data page 2),
        // 3 (log page 2) = 4 copies; erase data block 0 and log block 1 = 2 erases.
        let ops = write_all(&mut f, &[3, 1, 3, 0]);
        assert_eq!(
            ops,
            NandOps {
                host_page_programs: 4,
                copy_backs: 4,
                block_erases: 2,
                merges_full: 1,
                ..NandOps::default()
            }
        );
        assert_eq!(f.data_block(0), Some(2));
        assert_eq!(f.erase_counts().take(3).collect::<Vec<_>>(), vec![1, 1, 0]);
        // Again: offsets 2, 2, 2, 2 -> full merge copying 4 pages (3 from the data block).
        let ops = write_all(&mut f, &[2, 2, 2, 2]);
        assert_eq!((ops.merges_full, ops.copy_backs, ops.block_erases), (1, 4, 2));
        // A reverse-order overwrite of a sparse block: data pages 0 and 2 written, log gets
        // 2, 0, 2, 0 -> full merge copies 2 pages (offsets 1 and 3 have no version).
        write_all(&mut f, &[8, 10]);
        let ops = write_all(&mut f, &[10, 8, 10, 8]);
        assert_eq!((ops.merges_full, ops.copy_backs, ops.block_erases), (1, 2, 2));
        assert_eq!(f.lookup(9), None);
    }

    #[test]
    fn log_exhaustion_evicts_the_oldest_log_block() {
        let mut f = ftl(2);
        write_all(&mut f, &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]); // lbn 0, 1, 2 full
        write_all(&mut f, &[1]); // log for lbn 0 (oldest)
        write_all(&mut f, &[5]); // log for lbn 1
        write_all(&mut f, &[2]); // lbn 0's log again: it is still the oldest
        // lbn 2 needs a log: lbn 0's log (allocated first) is merged, though it was written
        // last. Its offsets 1, 2 are not 0.. in order: a full merge of 4 copies, 2 erases.
        let ops = write_all(&mut f, &[9]);
        assert_eq!(
            ops,
            NandOps {
                host_page_programs: 1,
                copy_backs: 4,
                block_erases: 2,
                merges_full: 1,
                ..NandOps::default()
            }
        );
        assert!(!f.has_log(0) && f.has_log(1) && f.has_log(2));
    }

    #[test]
    fn reads_cost_a_page_read_only_for_written_pages() {
        let mut f = ftl(1);
        let mut ops = NandOps::default();
        assert_eq!(f.read(5, &mut ops), None);
        f.write(5, &mut ops);
        assert!(f.read(5, &mut ops).is_some());
        f.trim(5);
        assert_eq!(f.read(5, &mut ops), None);
        assert_eq!((ops.host_page_reads, ops.host_page_programs), (1, 1));
        f.check();
    }

    #[test]
    fn trim_of_a_log_page_keeps_it_out_of_the_merge() {
        let mut f = ftl(1);
        write_all(&mut f, &[0, 1, 2, 3]);
        write_all(&mut f, &[1, 0]); // log: offsets 1, 0 (out of order)
        f.trim(1); // newest version of offset 1 is log page 0: dropped
        f.check();
        assert_eq!(f.lookup(1), None);
        let ops = write_all(&mut f, &[3, 3]); // log full -> full merge: offsets 0, 2, 3
        assert_eq!((ops.merges_full, ops.copy_backs, ops.block_erases), (1, 3, 2));
        assert_eq!(f.lookup(1), None);
    }

    #[test]
    fn geometry_limits_are_enforced() {
        let ok = Geometry { pages_per_block: 32, logical_blocks: 2048, log_blocks: 64 };
        assert!(ok.validate().is_ok());
        assert_eq!(ok.physical_blocks(), 2048 + 64 + 1);
        for bad in [
            Geometry { log_blocks: 0, ..ok },
            Geometry { log_blocks: LOG_BLOCKS_MAX + 1, ..ok },
            Geometry { pages_per_block: 0, ..ok },
            Geometry { logical_blocks: 0, ..ok },
            Geometry { logical_blocks: 1 << 20, ..ok },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }

    /// One step of the property test: a write or a trim of a logical page.
    #[derive(Debug, Clone)]
    enum Step {
        Write(u64),
        Trim(u64),
    }

    fn steps(logical_pages: u64) -> impl Strategy<Value = Vec<Step>> {
        let step = prop_oneof![
            // Mostly writes, clustered on few pages sometimes (hot metadata) and spread
            // otherwise.
            6 => (0..logical_pages).prop_map(Step::Write),
            2 => (0..4u64).prop_map(Step::Write),
            1 => (0..logical_pages).prop_map(Step::Trim),
        ];
        proptest::collection::vec(step, 1..400)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Read-after-write through every merge: a model "logical page -> version tag of its
        /// last write" (None after a trim) matches the tag of the physical page the FTL maps,
        /// after every step; the invariants hold after every step; the counters add up.
        #[test]
        fn reads_always_find_the_newest_version(
            ppb in 1u32..6,
            logical_blocks in 1u32..6,
            log_blocks in 1u32..4,
            seq in steps(36),
        ) {
            let geo = Geometry { pages_per_block: ppb, logical_blocks, log_blocks };
            let mut f = LogBlockFtl::new(geo);
            let pages = geo.logical_pages();
            let mut model: Vec<Option<u64>> = vec![None; pages as usize];
            let mut ops = NandOps::default();
            for (i, step) in seq.iter().enumerate() {
                let tag = i as u64 + 1;
                match *step {
                    Step::Write(l) => {
                        let l = l % pages;
                        f.tag_next = tag;
                        f.write(l, &mut ops);
                        model[l as usize] = Some(tag);
                    }
                    Step::Trim(l) => {
                        let l = l % pages;
                        f.trim(l);
                        model[l as usize] = None;
                    }
                }
                f.check();
                for (l, want) in model.iter().enumerate() {
                    let got = f.lookup(l as u64).map(|p| f.tag(p));
                    prop_assert_eq!(got, *want, "logical page {} after step {}", l, i);
                }
            }
            let programs: u64 = f.page_program_counts().iter().map(|&c| u64::from(c)).sum();
            prop_assert_eq!(programs, ops.page_programs());
            let erases: u64 = f.erase_counts().map(u64::from).sum();
            prop_assert_eq!(erases, ops.block_erases);
            prop_assert_eq!(f.lbn_write_counts().iter().sum::<u64>(), ops.host_page_programs);
            // A switch or partial merge erases 1 block, a full merge 2.
            prop_assert_eq!(
                ops.block_erases,
                ops.merges_switch + ops.merges_partial + 2 * ops.merges_full
            );
        }
    }
}
