//! A copy-on-write view of another region: stores land in private pages, the base is never
//! written. `nvstack check` runs the real recovery code on such a view of a region file, so it
//! verifies exactly what `open` would do without changing a byte.

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;

use crate::region::{PersistMode, Region, RegionCounters, check_bounds, check_word};

const PAGE: u64 = 4096;

/// See the module docs.
pub struct OverlayRegion<R: Region> {
    base: R,
    /// Pages stored to, by page index; each holds the full current page.
    pages: Mutex<HashMap<u64, Box<[u8]>>>,
}

impl<R: Region> fmt::Debug for OverlayRegion<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OverlayRegion").field("base", &self.base).finish_non_exhaustive()
    }
}

impl<R: Region> OverlayRegion<R> {
    pub fn new(base: R) -> Self {
        OverlayRegion { base, pages: Mutex::new(HashMap::new()) }
    }

    /// Number of pages the overlay holds (pages that recovery would have written).
    pub fn pages_changed(&self) -> usize {
        self.pages.lock().expect("overlay lock").len()
    }

    fn with_page<T>(&self, page: u64, f: impl FnOnce(&mut [u8]) -> T) -> T {
        let mut pages = self.pages.lock().expect("overlay lock");
        let buf = pages.entry(page).or_insert_with(|| {
            let start = page * PAGE;
            let len = PAGE.min(self.base.len() - start) as usize;
            self.base.read_vec(start, len).into_boxed_slice()
        });
        f(buf)
    }
}

impl<R: Region> Region for OverlayRegion<R> {
    fn len(&self) -> u64 {
        self.base.len()
    }

    fn read(&self, off: u64, buf: &mut [u8]) {
        check_bounds(self.len(), off, buf.len() as u64);
        let pages = self.pages.lock().expect("overlay lock");
        let mut done = 0usize;
        while done < buf.len() {
            let pos = off + done as u64;
            let page = pos / PAGE;
            let in_page = (pos % PAGE) as usize;
            let n = (PAGE as usize - in_page).min(buf.len() - done);
            match pages.get(&page) {
                Some(p) => buf[done..done + n].copy_from_slice(&p[in_page..in_page + n]),
                None => self.base.read(pos, &mut buf[done..done + n]),
            }
            done += n;
        }
    }

    fn write(&self, off: u64, data: &[u8]) {
        check_bounds(self.len(), off, data.len() as u64);
        let mut done = 0usize;
        while done < data.len() {
            let pos = off + done as u64;
            let in_page = (pos % PAGE) as usize;
            let n = (PAGE as usize - in_page).min(data.len() - done);
            self.with_page(pos / PAGE, |p| {
                p[in_page..in_page + n].copy_from_slice(&data[done..done + n]);
            });
            done += n;
        }
    }

    fn store_u64(&self, off: u64, value: u64) {
        check_word(self.len(), off);
        self.write(off, &value.to_le_bytes());
    }

    fn load_u64(&self, off: u64) -> u64 {
        check_word(self.len(), off);
        let mut word = [0u8; 8];
        self.read(off, &mut word);
        u64::from_le_bytes(word)
    }

    fn flush(&self, off: u64, len: u64) {
        check_bounds(self.len(), off, len);
    }

    fn fence(&self) {}

    fn mode(&self) -> PersistMode {
        PersistMode::ReadOnly
    }

    fn counters(&self) -> RegionCounters {
        RegionCounters::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::SimRegion;

    #[test]
    fn stores_are_seen_through_the_overlay_and_never_reach_the_base() {
        let base = SimRegion::new(3 * PAGE);
        base.write(4000, &[1; 200]);
        let overlay = OverlayRegion::new(base);
        overlay.write(4090, &[2; 10]);
        let mut expected = vec![1u8; 200];
        expected[90..100].fill(2);
        assert_eq!(overlay.read_vec(4000, 200), expected);
        assert_eq!(overlay.pages_changed(), 2);
        assert_eq!(overlay.base.read_vec(4000, 200), vec![1; 200]);
    }
}
