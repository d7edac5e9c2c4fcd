//! The queue of patched pages waiting for an asynchronous fetch (`async-fg`, `async-bg`;
//! design.md section 11.8), served in elevator order.
//!
//! The paper's fetches are block reads that the kernel's I/O scheduler sorts while they wait;
//! nvstack's fetcher reads one page at a time through the lower file system, so nothing below
//! it can reorder them. Taken in the order the writes came, random writes over a large file
//! fetch at the disk's random-read rate. Taken in ascending (file, page) order from where the
//! last fetch was (C-SCAN: after the highest, wrap to the lowest), the patched pages of a file
//! come out in file-offset order: on a disk, neighbours on the platter; for the lower file
//! system, reads it may serve from one extent.
//!
//! A page is queued once however many writes queued it. Bounded: at most `max` pages; a page
//! not queued keeps its patch (correct, as in `lazy`) and is queued again by its next write.

use std::collections::BTreeSet;
use std::ops::Bound;

/// (cached-file record frame, page index) pairs in elevator order.
#[derive(Debug)]
pub struct FetchQueue {
    queued: BTreeSet<(u64, u64)>,
    /// The last page handed out: the sweep continues above it.
    cursor: Option<(u64, u64)>,
    max: usize,
}

impl FetchQueue {
    pub(crate) fn new(max: usize) -> FetchQueue {
        FetchQueue { queued: BTreeSet::new(), cursor: None, max }
    }

    /// Queues `(object, page)` unless it is queued already or the queue is full.
    pub(crate) fn push(&mut self, object: u64, page: u64) {
        if self.queued.len() < self.max {
            self.queued.insert((object, page));
        }
    }

    /// The next page of the sweep: the lowest above the cursor, else the lowest of all.
    pub(crate) fn pop(&mut self) -> Option<(u64, u64)> {
        let above = self.cursor.and_then(|c| {
            self.queued.range((Bound::Excluded(c), Bound::Unbounded)).next().copied()
        });
        let next = above.or_else(|| self.queued.first().copied())?;
        self.queued.remove(&next);
        self.cursor = Some(next);
        Some(next)
    }

    pub(crate) fn len(&self) -> usize {
        self.queued.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_come_out_in_ascending_sweeps_once_each() {
        let mut q = FetchQueue::new(100);
        for p in [40, 7, 99, 7, 12, 40] {
            q.push(1, p);
        }
        assert_eq!(q.len(), 4, "a page is queued once");
        assert_eq!(q.pop(), Some((1, 7)));
        assert_eq!(q.pop(), Some((1, 12)));
        // Writes behind the sweep wait for the next one; those ahead join this one.
        q.push(1, 3);
        q.push(1, 50);
        assert_eq!(q.pop(), Some((1, 40)));
        assert_eq!(q.pop(), Some((1, 50)));
        assert_eq!(q.pop(), Some((1, 99)));
        assert_eq!(q.pop(), Some((1, 3)), "after the highest, the sweep starts again");
        assert_eq!(q.pop(), None);
        assert_eq!(q.len(), 0);
    }

    #[test]
    fn files_are_swept_one_after_another_and_the_queue_is_bounded() {
        let mut q = FetchQueue::new(3);
        q.push(2, 1);
        q.push(1, 9);
        q.push(1, 2);
        q.push(3, 0);
        assert_eq!(q.len(), 3, "full: the fourth page keeps its patch");
        let order: Vec<_> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(order, vec![(1, 2), (1, 9), (2, 1)]);
    }
}
