//! The invariant check of the log-block FTL (invariants 1-6 of `mod.rs`; 7 is asserted at
//! every erase). O(pages), so for tests only: they run it after every step.

use super::{BlockUse, LogBlockFtl, PageState, Ppn, SPARE_BLOCKS};

impl LogBlockFtl {
    /// Checks invariants 1-6 of the module docs (7 is asserted at every erase). O(pages): for
    /// tests.
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
