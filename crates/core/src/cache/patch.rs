//! Patches (non-blocking writes, design.md section 11.8; the FAST'15 paper's page patches): the
//! bytes a write put into part of a page that is not in NVRAM, kept without reading the page.
//!
//! | kind | frame | owner | index |
//! |---:|---|---|---|
//! | 0x5043_0004 [`KIND_PATCHES`] | patches of one file, packed (below) | the file's record place (`Place::owner`) | 0 |
//!
//! A patch frame is 64 slots of 64 bytes. Each patch of the owner file takes a run of
//! consecutive slots (as few as its bytes need: a 512-byte patch takes 9, so 7 share a frame);
//! slots that hold no patch are zero (`patchframe.rs` places, moves and frees them). A patch
//! (an *entry*) is a 32-byte header ([`LAYOUT`]), its byte ranges of the page - ascending,
//! disjoint and not adjacent (merged) - and their bytes packed in the same order, then zeros to
//! the end of its run. The paper keeps a FIFO queue of patches per page and applies them in
//! order; here every write merges into the page's one patch inside its transaction, so the
//! patch always holds the latest byte for every covered offset and applying it is one copy per
//! range.
//!
//! Invariants: **P4** a patch verifies (magic, checksum, run length, ranges sorted, disjoint,
//! not adjacent, inside the page, lengths summing to the data length, zeros after its data);
//! **P5** a patch never covers its whole page (that is a dirty page) and never reaches the
//! file's size (C3); **P6** every slot of a patch frame is either part of exactly one patch or
//! zero, a patch frame holds at least one patch, and no page of a file has two patches.
//!
//! Before packing (format 0x5043_0003, one patch per frame) a patch took a whole 4 KiB frame:
//! a 512-byte write used eight times its size of NVRAM, and the patch limit was reached after
//! an eighth of the writes it now holds. A region holding patches of that format is refused at
//! start with the way out named ([`KIND_PATCH_V1`]).

use crate::base::frames;
use nvram::checksum::checksum;

use super::PAGE;

pub const KIND_PATCHES: u32 = frames::PATCHES;
/// The unpacked format (one patch per frame), refused at start.
pub const KIND_PATCH_V1: u32 = frames::PATCH_V1;

const FRAME: usize = 4096;
/// A patch frame's unit of allocation.
pub const SLOT: usize = 64;
/// Slots of a patch frame (a `u64` bitmap of them is a frame's occupancy).
pub const SLOTS: usize = FRAME / SLOT;
const MAGIC: &[u8; 4] = b"NVP2";
const HEADER: usize = 32;
const SUM_OFF: usize = 24;
/// Bytes for ranges (4 each) and data together: a patch fills at most one whole frame.
pub const CAPACITY: usize = FRAME - HEADER;
/// A limit on fragmentation: a write that would leave more ranges fetches the page instead.
pub const MAX_RANGES: usize = 64;

/// The byte table of a patch's header (its ranges and data follow).
pub const LAYOUT: &[nvram::layout::Field] = &[
    (0, 4, "magic"),
    (4, 1, "slots"),
    (5, 1, "zero"),
    (6, 2, "range count"),
    (8, 8, "page"),
    (16, 2, "data length"),
    (18, 6, "zero"),
    (SUM_OFF, 8, "xxh3-64 of the patch's run without this field"),
];

const _: () = assert!(nvram::layout::contiguous(LAYOUT, HEADER), "patch header table");
const _: () = assert!(SLOTS == 64, "a frame's occupancy is one u64");

/// A decoded patch: covered ranges `(offset in page, length)` and their bytes packed in the
/// same order, as in its entry. The volatile copy is as small as the patch: a whole page of
/// bytes per patch held 4 KiB of the daemon's DRAM for a 128-byte write (287 MiB for the
/// 70,000 patches of one benchmark run); packed, it holds the written bytes and its ranges.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Patch {
    pub page: u64,
    pub ranges: Vec<(u16, u16)>,
    data: Vec<u8>,
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
        Patch { page, ranges: Vec::new(), data: Vec::new() }
    }

    /// Bytes the patch holds.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// Each range's offset in the page and its bytes, in order.
    pub fn pieces(&self) -> impl Iterator<Item = (usize, &[u8])> {
        self.ranges.iter().scan(0usize, |at, &(o, n)| {
            let n = usize::from(n);
            let piece = &self.data[*at..*at + n];
            *at += n;
            Some((usize::from(o), piece))
        })
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Whether `[from, to)` (offsets in the page) is covered entirely.
    pub(crate) fn covers(&self, from: usize, to: usize) -> bool {
        from >= to
            || self
                .ranges
                .iter()
                .any(|&(o, n)| usize::from(o) <= from && to <= usize::from(o) + usize::from(n))
    }

    /// Copies the covered bytes over `page` (a whole page).
    pub(crate) fn apply(&self, page: &mut [u8]) {
        for (o, piece) in self.pieces() {
            page[o..o + piece.len()].copy_from_slice(piece);
        }
    }

    /// This patch with `data` written at `at` (offset in the page), and everything at or beyond
    /// `limit` (offset in the page: the file's size) cut away (P5).
    pub fn merge(&self, at: usize, data: &[u8], limit: usize) -> Merged {
        // Interval arithmetic on the sorted ranges, O(ranges) plus the copy of the page's
        // bytes: the byte-by-byte coverage map this replaced took a third of the daemon's CPU
        // under 128-byte sequential writes (docs/benchmarks.md, "Non-blocking writes").
        let limit = limit.min(PAGE as usize);
        let mut bytes = [0u8; PAGE as usize];
        self.apply(&mut bytes);
        bytes[at..at + data.len()].copy_from_slice(data);
        // The ranges with [lo, hi) added: overlapping or adjacent ranges join it.
        let mut joined: Vec<(usize, usize)> = Vec::with_capacity(self.ranges.len() + 1);
        let (mut lo, mut hi) = (at, at + data.len());
        let mut placed = data.is_empty();
        for &(o, n) in &self.ranges {
            let (o, end) = (usize::from(o), usize::from(o) + usize::from(n));
            if placed || end < lo {
                joined.push((o, end));
            } else if hi < o {
                joined.push((lo, hi));
                joined.push((o, end));
                placed = true;
            } else {
                lo = lo.min(o);
                hi = hi.max(end);
            }
        }
        if !placed {
            joined.push((lo, hi));
        }
        // P5: nothing at or beyond the file's size.
        joined.retain(|&(o, _)| o < limit);
        if let Some(last) = joined.last_mut() {
            last.1 = last.1.min(limit);
        }
        if limit == PAGE as usize && joined == [(0, PAGE as usize)] {
            return Merged::Page(Box::new(bytes));
        }
        let mut data = Vec::with_capacity(joined.iter().map(|&(o, end)| end - o).sum());
        for &(o, end) in &joined {
            data.extend_from_slice(&bytes[o..end]);
        }
        let ranges = joined.into_iter().map(|(o, end)| (to_u16(o), to_u16(end - o))).collect();
        let patch = Patch { page: self.page, ranges, data };
        if patch.ranges.len() > MAX_RANGES || patch.ranges.len() * 4 + patch.len() > CAPACITY {
            return Merged::TooLarge;
        }
        Merged::Patch(patch)
    }

    /// Slots the patch takes in its frame.
    pub fn slots(&self) -> usize {
        (HEADER + 4 * self.ranges.len() + self.len()).div_ceil(SLOT)
    }

    /// The patch's run of slots: header, ranges, data, zeros (see [`LAYOUT`]).
    pub fn encode(&self) -> Vec<u8> {
        let slots = self.slots();
        assert!(slots <= SLOTS, "a patch larger than its frame");
        let mut b = vec![0u8; slots * SLOT];
        b[..4].copy_from_slice(MAGIC);
        b[4] = u8::try_from(slots).expect("at most 64 slots");
        b[6..8].copy_from_slice(&u16::try_from(self.ranges.len()).expect("ranges").to_le_bytes());
        b[8..16].copy_from_slice(&self.page.to_le_bytes());
        b[16..18].copy_from_slice(&u16::try_from(self.len()).expect("length").to_le_bytes());
        let mut at = HEADER;
        for &(o, n) in &self.ranges {
            b[at..at + 2].copy_from_slice(&o.to_le_bytes());
            b[at + 2..at + 4].copy_from_slice(&n.to_le_bytes());
            at += 4;
        }
        b[at..at + self.data.len()].copy_from_slice(&self.data);
        let sum = run_sum(&b);
        b[SUM_OFF..HEADER].copy_from_slice(&sum.to_le_bytes());
        b
    }

    /// Decodes and verifies the patch whose run starts at `b[0]` (`b` reaches at least to the
    /// end of the run: the rest of the frame will do) (P4, P5); the error says what is wrong.
    pub(crate) fn decode(b: &[u8]) -> Result<Patch, &'static str> {
        if b.len() < HEADER || &b[..4] != MAGIC {
            return Err("bad patch magic");
        }
        let slots = usize::from(b[4]);
        if slots == 0 || slots * SLOT > b.len() {
            return Err("patch run past its frame");
        }
        let b = &b[..slots * SLOT];
        let sum = u64::from_le_bytes(b[SUM_OFF..HEADER].try_into().expect("8 bytes"));
        if run_sum(b) != sum {
            return Err("patch checksum mismatch");
        }
        let count = usize::from(u16::from_le_bytes([b[6], b[7]]));
        let len = usize::from(u16::from_le_bytes([b[16], b[17]]));
        if b[5] != 0 || b[18..24] != [0; 6] || count == 0 || count > MAX_RANGES {
            return Err("bad patch header");
        }
        if (HEADER + 4 * count + len).div_ceil(SLOT) != slots {
            return Err("patch lengths disagree with its run");
        }
        let page = u64::from_le_bytes(b[8..16].try_into().expect("8 bytes"));
        let mut p = Patch::new(page);
        let mut data = HEADER + 4 * count;
        let mut end = 0usize;
        for i in 0..count {
            let at = HEADER + 4 * i;
            let o = u16::from_le_bytes([b[at], b[at + 1]]);
            let n = u16::from_le_bytes([b[at + 2], b[at + 3]]);
            let (uo, un) = (usize::from(o), usize::from(n));
            // Ascending, disjoint and not adjacent (the first may start at 0), inside the page.
            if un == 0 || (i > 0 && uo <= end) || uo + un > PAGE as usize || data + un > b.len() {
                return Err("bad patch range");
            }
            end = uo + un;
            p.data.extend_from_slice(&b[data..data + un]);
            data += un;
            p.ranges.push((o, n));
        }
        if p.len() != len {
            return Err("patch data length mismatch");
        }
        if b[data..].iter().any(|&x| x != 0) {
            return Err("bytes after the patch data");
        }
        if p.ranges == [(0, PAGE as u16)] {
            return Err("a patch covering its whole page (P5)");
        }
        Ok(p)
    }
}

/// The checksum of a patch's run, its own field left out.
fn run_sum(run: &[u8]) -> u64 {
    checksum(&[&run[..SUM_OFF], &run[HEADER..]])
}

/// The patches of a patch frame as (first slot, patch), in slot order, verified (P4, P6:
/// slots outside every patch are zero, at least one patch, no page twice); the error names
/// the slot.
pub fn decode_frame(frame: &[u8]) -> Result<Vec<(usize, Patch)>, (usize, &'static str)> {
    let mut out: Vec<(usize, Patch)> = Vec::new();
    let mut slot = 0;
    while slot < SLOTS {
        let b = &frame[slot * SLOT..FRAME];
        if b[..SLOT].iter().all(|&x| x == 0) {
            slot += 1;
            continue;
        }
        let patch = Patch::decode(b).map_err(|what| (slot, what))?;
        if out.iter().any(|(_, q)| q.page == patch.page) {
            return Err((slot, "two patches of one page (P6)"));
        }
        let next = slot + patch.slots();
        out.push((slot, patch));
        slot = next;
    }
    if out.is_empty() {
        return Err((0, "a patch frame without patches (P6)"));
    }
    Ok(out)
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
        assert_eq!(Patch::decode(&p.encode()).unwrap(), p);
        assert_eq!(p.slots(), (32 + 8 + 9usize).div_ceil(SLOT));
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

    /// Merging agrees with a byte model of the page (which offsets were written, and their
    /// latest byte) over seeded sequences of writes and cuts at the file's size.
    #[test]
    fn merging_agrees_with_a_byte_model() {
        use rand::{Rng, SeedableRng};
        for seed in 0..300u64 {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            let mut model: Vec<Option<u8>> = vec![None; PAGE as usize];
            let mut p = Patch::new(1);
            for step in 0..40 {
                let at = rng.random_range(0..PAGE as usize);
                let longest = if rng.random_bool(0.2) { PAGE as usize } else { 300 };
                let len = rng.random_range(0..=(PAGE as usize - at).min(longest));
                let fill = rng.random::<u8>() | 1;
                let cut = rng.random_bool(0.1);
                let limit = if cut { rng.random_range(0..=PAGE as usize) } else { PAGE as usize };
                let data = vec![fill; len];
                let mut next = model.clone();
                for b in &mut next[at..at + len] {
                    *b = Some(fill);
                }
                for b in &mut next[limit..] {
                    *b = None;
                }
                let runs = model_runs(&next);
                let ctx = format!("seed {seed} step {step}: write {at}+{len} limit {limit}");
                match p.merge(at, &data, limit) {
                    Merged::Page(page) => {
                        assert!(next.iter().all(Option::is_some), "{ctx}: not whole");
                        assert!(next.iter().zip(page.iter()).all(|(m, b)| *m == Some(*b)), "{ctx}");
                        break;
                    }
                    Merged::TooLarge => {
                        assert!(
                            runs.len() > MAX_RANGES
                                || runs.len() * 4 + next.iter().flatten().count() > CAPACITY,
                            "{ctx}: fits, yet refused"
                        );
                        break;
                    }
                    Merged::Patch(q) => {
                        assert_eq!(q.ranges, runs, "{ctx}");
                        let mut page = [0u8; PAGE as usize];
                        q.apply(&mut page);
                        for (i, m) in next.iter().enumerate() {
                            assert_eq!(page[i], m.unwrap_or(0), "{ctx}: byte {i}");
                        }
                        // An empty patch is removed by its caller, never encoded.
                        if !q.is_empty() {
                            assert!(Patch::decode(&q.encode()).as_ref() == Ok(&q), "{ctx}");
                        }
                        p = q;
                        model = next;
                    }
                }
            }
        }
    }

    fn model_runs(m: &[Option<u8>]) -> Vec<(u16, u16)> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < m.len() {
            let start = i;
            while i < m.len() && m[i].is_some() {
                i += 1;
            }
            if i > start {
                out.push((to_u16(start), to_u16(i - start)));
            } else {
                i += 1;
            }
        }
        out
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
        for byte in 0..b.len() {
            let mut bad = b.clone();
            bad[byte] ^= 0x04;
            assert!(Patch::decode(&bad).is_err(), "byte {byte}");
        }
    }

    #[test]
    fn a_512_byte_patch_takes_9_slots_and_7_share_a_frame() {
        let p = patched(&[(512, &[5; 512])]);
        assert_eq!(p.slots(), 9);
        assert_eq!(SLOTS / p.slots(), 7);
        // The largest patch fills exactly one frame.
        let big = patched(&[(0, &[1; CAPACITY - 4])]);
        assert_eq!(big.slots(), SLOTS);
    }

    /// A frame with `patches` placed at their slots, zeros elsewhere.
    fn frame_of(patches: &[(usize, &Patch)]) -> Vec<u8> {
        let mut f = vec![0u8; FRAME];
        for &(slot, p) in patches {
            let e = p.encode();
            f[slot * SLOT..slot * SLOT + e.len()].copy_from_slice(&e);
        }
        f
    }

    #[test]
    fn a_frame_decodes_to_its_patches_and_refuses_stray_bytes_and_duplicates() {
        let mut a = patched(&[(0, &[1; 100])]);
        a.page = 3;
        let mut b = patched(&[(2000, &[0; 300])]); // zero data: its run has zero slots inside
        b.page = 7;
        let f = frame_of(&[(0, &a), (10, &b)]);
        let got = decode_frame(&f).unwrap();
        assert_eq!(got, vec![(0, a.clone()), (10, b.clone())]);
        let mut stray = f.clone();
        stray[63 * SLOT + 5] = 1;
        assert_eq!(decode_frame(&stray).unwrap_err().0, 63);
        let twice = frame_of(&[(0, &a), (20, &a)]);
        assert_eq!(decode_frame(&twice).unwrap_err(), (20, "two patches of one page (P6)"));
        assert!(decode_frame(&[0u8; FRAME]).is_err(), "an empty patch frame");
        // A run claiming to reach past the frame.
        let mut late = vec![0u8; FRAME];
        let e = b.encode();
        assert_eq!(b.slots(), 6);
        late[60 * SLOT..].copy_from_slice(&e[..4 * SLOT]);
        assert_eq!(decode_frame(&late).unwrap_err(), (60, "patch run past its frame"));
    }
}
