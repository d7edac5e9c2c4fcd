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
//! # Merges ([`LogBlockFtl::merge`])
//!
//! When a log block is full or is evicted, it is merged with its data block: switch, partial
//! or full by the log block's content, each ending with erases. The rules and their costs are
//! in `merge.rs`, next to the code.
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
//!
//! # Code
//!
//! This file holds the mapping (the tables above, lookups, the write rules W1/W2, trims);
//! `merge.rs` the merges and the block primitives they share with the writes (allocate,
//! program, copy back, erase: the only places a page is programmed or a block is taken from
//! or returned to the free list); `accounting.rs`
//! what the FTL counts ([`NandOps`] per request, erases per block, programs per page, writes
//! per logical block); `check.rs` the invariant check the tests run.

mod accounting;
#[cfg(test)]
mod check;
mod merge;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, VecDeque};

use serde::Serialize;

pub(crate) use self::accounting::NandOps;

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
}
