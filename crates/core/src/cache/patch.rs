//! Patches (non-blocking writes, design.md section 11.8; the FAST'15 paper's page patches): the
//! bytes a write put into part of a page that is not in NVRAM, kept without reading the page.
//!
//! | kind | frame | owner | index |
//! |---:|---|---|---|
//! | 0x5043_0003 [`KIND_PATCH`] | one patch (below) | record frame number | page number |
//!
//! A patch frame holds the byte ranges of its page that writes covered, ascending, disjoint and
//! not adjacent (merged), followed by their bytes packed in the same order; the byte table is
//! [`LAYOUT`]. The paper keeps a FIFO queue of patches per page and applies them in order; here
//! every write merges into the page's one patch inside its transaction, so the patch always
//! holds the latest byte for every covered offset and applying it is one copy per range.
//! Invariants: **P4** a patch verifies (magic, checksum, page, ranges sorted, disjoint, not
//! adjacent, inside the page, lengths summing to the data length); **P5** a patch never covers
//! its whole page (that is a dirty page) and never reaches the file's size (C3).

use nvram::checksum::checksum;

use super::PAGE;

pub const KIND_PATCH: u32 = 0x5043_0003;

const MAGIC: &[u8; 8] = b"NVSPAT01";
const FRAME: usize = 4096;
const RANGES_OFF: usize = 24;
const SUM_OFF: usize = FRAME - 8;
/// Bytes for ranges (4 each) and data together.
pub const CAPACITY: usize = SUM_OFF - RANGES_OFF;
/// A limit on fragmentation: a write that would leave more ranges fetches the page instead.
pub const MAX_RANGES: usize = 64;

/// The patch frame's byte table.
pub const LAYOUT: &[nvram::layout::Field] = &[
    (0, 8, "magic"),
    (8, 8, "page"),
    (16, 2, "range count"),
    (18, 2, "data length"),
    (20, 4, "zero"),
    (RANGES_OFF, CAPACITY, "ranges and data"),
    (SUM_OFF, 8, "xxh3-64"),
];

const _: () = assert!(nvram::layout::contiguous(LAYOUT, FRAME), "patch table");

/// A decoded patch: covered ranges `(offset in page, length)` and a whole page of bytes of
/// which only the covered ones mean anything (kept zero elsewhere).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Patch {
    pub page: u64,
    pub ranges: Vec<(u16, u16)>,
    pub bytes: Box<[u8; PAGE as usize]>,
}

/// What merging a write into a patch gives.
#[derive(Debug)]
pub enum Merged {
    /// Still a patch (fits its frame).
    Patch(Patch),
    /// Every byte of the page is covered: a dirty page, no read needed.
    Page(Box<[u8; PAGE as usize]>),
    /// Too fragmented for one frame: the page must be fetched.
    TooLarge,
}

impl Patch {
    pub fn new(page: u64) -> Patch {
        Patch { page, ranges: Vec::new(), bytes: Box::new([0; PAGE as usize]) }
    }

    /// Bytes the patch holds.
    pub fn len(&self) -> usize {
        self.ranges.iter().map(|&(_, n)| usize::from(n)).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Whether `[from, to)` (offsets in the page) is covered entirely.
    pub fn covers(&self, from: usize, to: usize) -> bool {
        from >= to
            || self
                .ranges
                .iter()
                .any(|&(o, n)| usize::from(o) <= from && to <= usize::from(o) + usize::from(n))
    }

    /// Copies the covered bytes over `page` (a whole page).
    pub fn apply(&self, page: &mut [u8]) {
        for &(o, n) in &self.ranges {
            let (o, n) = (usize::from(o), usize::from(n));
            page[o..o + n].copy_from_slice(&self.bytes[o..o + n]);
        }
    }

    /// This patch with `data` written at `at` (offset in the page), and everything at or beyond
    /// `limit` (offset in the page: the file's size) cut away (P5).
    pub fn merge(&self, at: usize, data: &[u8], limit: usize) -> Merged {
        let mut covered = [false; PAGE as usize];
        let mut bytes = self.bytes.clone();
        for &(o, n) in &self.ranges {
            covered[usize::from(o)..usize::from(o) + usize::from(n)].fill(true);
        }
        covered[at..at + data.len()].fill(true);
        bytes[at..at + data.len()].copy_from_slice(data);
        let limit = limit.min(PAGE as usize);
        covered[limit..].fill(false);
        if limit == PAGE as usize && covered.iter().all(|&c| c) {
            return Merged::Page(bytes);
        }
        let ranges = runs(&covered);
        for (i, c) in covered.iter().enumerate() {
            if !c {
                bytes[i] = 0;
            }
        }
        let patch = Patch { page: self.page, ranges, bytes };
        if patch.ranges.len() > MAX_RANGES || patch.ranges.len() * 4 + patch.len() > CAPACITY {
            return Merged::TooLarge;
        }
        Merged::Patch(patch)
    }

    /// The frame's bytes (see [`LAYOUT`]).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; FRAME];
        b[..8].copy_from_slice(MAGIC);
        b[8..16].copy_from_slice(&self.page.to_le_bytes());
        b[16..18].copy_from_slice(&u16::try_from(self.ranges.len()).expect("ranges").to_le_bytes());
        b[18..20].copy_from_slice(&u16::try_from(self.len()).expect("length").to_le_bytes());
        let mut at = RANGES_OFF;
        for &(o, n) in &self.ranges {
            b[at..at + 2].copy_from_slice(&o.to_le_bytes());
            b[at + 2..at + 4].copy_from_slice(&n.to_le_bytes());
            at += 4;
        }
        for &(o, n) in &self.ranges {
            let (o, n) = (usize::from(o), usize::from(n));
            b[at..at + n].copy_from_slice(&self.bytes[o..o + n]);
            at += n;
        }
        assert!(at <= SUM_OFF, "a patch larger than its frame");
        let sum = checksum(&[&b[..SUM_OFF]]);
        b[SUM_OFF..].copy_from_slice(&sum.to_le_bytes());
        b
    }

    /// Decodes and verifies a patch frame (P4); the error says what is wrong.
    pub fn decode(b: &[u8], page: u64) -> Result<Patch, &'static str> {
        if b.len() < FRAME || &b[..8] != MAGIC {
            return Err("bad patch magic");
        }
        let sum = u64::from_le_bytes(b[SUM_OFF..FRAME].try_into().expect("8 bytes"));
        if checksum(&[&b[..SUM_OFF]]) != sum {
            return Err("patch checksum mismatch");
        }
        if u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")) != page {
            return Err("patch of another page");
        }
        let count = usize::from(u16::from_le_bytes([b[16], b[17]]));
        let len = usize::from(u16::from_le_bytes([b[18], b[19]]));
        if b[20..24] != [0; 4] || count == 0 || count > MAX_RANGES || count * 4 + len > CAPACITY {
            return Err("bad patch lengths");
        }
        let mut p = Patch::new(page);
        let mut data = RANGES_OFF + 4 * count;
        let mut end = 0usize;
        for i in 0..count {
            let at = RANGES_OFF + 4 * i;
            let o = u16::from_le_bytes([b[at], b[at + 1]]);
            let n = u16::from_le_bytes([b[at + 2], b[at + 3]]);
            let (uo, un) = (usize::from(o), usize::from(n));
            // Ascending, disjoint and not adjacent (the first may start at 0), inside the page.
            if un == 0 || (i > 0 && uo <= end) || uo + un > PAGE as usize {
                return Err("bad patch range");
            }
            end = uo + un;
            p.bytes[uo..end].copy_from_slice(&b[data..data + un]);
            data += un;
            p.ranges.push((o, n));
        }
        if p.len() != len {
            return Err("patch data length mismatch");
        }
        if b[data..SUM_OFF].iter().any(|&x| x != 0) {
            return Err("bytes after the patch data");
        }
        if p.ranges == [(0, PAGE as u16)] {
            return Err("a patch covering its whole page (P5)");
        }
        Ok(p)
    }
}

/// The maximal runs of `true` as (offset, length).
fn runs(covered: &[bool]) -> Vec<(u16, u16)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < covered.len() {
        if covered[i] {
            let start = i;
            while i < covered.len() && covered[i] {
                i += 1;
            }
            out.push((to_u16(start), to_u16(i - start)));
        } else {
            i += 1;
        }
    }
    out
}

fn to_u16(x: usize) -> u16 {
    u16::try_from(x).expect("offsets in a page fit 16 bits")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn patched(writes: &[(usize, &[u8])]) -> Patch {
        let mut p = Patch::new(9);
        for &(at, data) in writes {
            match p.merge(at, data, PAGE as usize) {
                Merged::Patch(next) => p = next,
                other => panic!("{other:?}"),
            }
        }
        p
    }

    #[test]
    fn writes_merge_into_sorted_disjoint_ranges_and_the_latest_byte_wins() {
        let p = patched(&[(100, b"aaaa"), (10, b"bb"), (102, b"cccc"), (12, b"d")]);
        assert_eq!(p.ranges, vec![(10, 3), (100, 6)]);
        let mut page = [0u8; PAGE as usize];
        p.apply(&mut page);
        assert_eq!(&page[10..13], b"bbd");
        assert_eq!(&page[100..106], b"aacccc");
        assert!(p.covers(101, 106) && !p.covers(99, 101) && p.covers(5, 5));
        assert_eq!(Patch::decode(&p.encode(), 9).unwrap(), p);
    }

    #[test]
    fn a_patch_that_covers_the_page_is_a_page_and_the_size_cuts_it() {
        let p = patched(&[(0, &[1; 2048])]);
        match p.merge(2048, &[2; 2048], PAGE as usize) {
            Merged::Page(b) => {
                assert!(b[..2048].iter().all(|&x| x == 1) && b[2048..].iter().all(|&x| x == 2));
            }
            other => panic!("{other:?}"),
        }
        // The file ends at 3000: nothing at or beyond it stays, so it is not whole.
        match p.merge(2048, &[2; 2048], 3000) {
            Merged::Patch(q) => assert_eq!(q.ranges, vec![(0, 3000)]),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn too_many_fragments_do_not_fit() {
        let mut p = Patch::new(0);
        for i in 0..MAX_RANGES {
            p = match p.merge(i * 8, b"x", PAGE as usize) {
                Merged::Patch(q) => q,
                other => panic!("{other:?}"),
            };
        }
        assert!(matches!(p.merge(MAX_RANGES * 8 + 2, b"y", PAGE as usize), Merged::TooLarge));
        // Nearly the whole page in two pieces: more data than the frame holds.
        let big = patched(&[(0, &[7; 2000])]);
        assert!(matches!(big.merge(2001, &[8; 2090], PAGE as usize), Merged::TooLarge));
    }

    #[test]
    fn every_bit_flip_is_detected() {
        let b = patched(&[(3, b"hello"), (4000, b"world")]).encode();
        for byte in 0..FRAME {
            let mut bad = b.clone();
            bad[byte] ^= 0x04;
            assert!(Patch::decode(&bad, 9).is_err(), "byte {byte}");
        }
        assert!(Patch::decode(&b, 8).is_err(), "another page");
    }
}
