//! A simulated region for crash testing: it remembers, per cache line, whether the latest stores
//! are durable, and can produce the image a crash would leave at any moment.
//!
//! Model (see `region` for the contract it simulates):
//! - `durable` holds what survives a crash for certain; `current` is what loads return.
//! - A line written since it was last made durable is *dirty*; `flush` makes a dirty line
//!   *flushed*; `fence` copies flushed lines into `durable`. A store to a flushed line makes it
//!   dirty again (the earlier flush may or may not have captured the new bytes).
//! - A crash image keeps `durable` and, for every aligned 8-byte word of a dirty or flushed line,
//!   picks the durable or the current value according to `CrashMode` (drop all, keep all, or a
//!   seeded coin per word: a torn write).
//!
//! Write protection is modelled by a set of protected pages checked on every `write` and
//! `store_u64`: a store touching one is refused whole and counted (`trapped_writes`), exactly
//! what a stray store into a read-only mapped page amounts to with `MmapRegion`, but without
//! signals, so crash sweeps and the wild-write test run in-process. Protection is volatile:
//! crash images ignore it.
//!
//! The fence hook is how tests crash "after every fence": it is called at the start of every
//! `fence`, before the flushed lines become durable, with a `CrashPoint` from which any number of
//! images can be taken. An image taken there represents a crash at any instant between the
//! previous fence and this one (with `KeepAll`, also the instant right after this fence), except
//! that a word stored twice in that interval is only seen with its last value.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Mutex;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::region::{
    CACHE_LINE, PersistMode, Region, RegionCounters, WORD, check_bounds, check_pages, check_word,
    pages_of,
};

/// What a crash does to stores that were not yet durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrashMode {
    /// Every unpersisted word is lost.
    DropAll,
    /// Every unpersisted word happened to reach the media.
    KeepAll,
    /// Each unpersisted word independently survives or not, by a seeded coin.
    Torn { seed: u64 },
}

/// The state of a simulated region at a fence, from which crash images are made.
pub struct CrashPoint<'a> {
    state: &'a SimState,
    /// Number of fences completed before this one (0 for the first fence).
    pub fence_seq: u64,
}

impl CrashPoint<'_> {
    /// The bytes a crash at this point would leave, under `mode`.
    pub fn image(&self, mode: CrashMode) -> Vec<u8> {
        self.state.image(mode)
    }

    /// Number of cache lines whose latest stores are not yet durable.
    pub fn unpersisted_lines(&self) -> usize {
        self.state.dirty.len() + self.state.flushed.len()
    }
}

impl fmt::Debug for CrashPoint<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CrashPoint")
            .field("fence_seq", &self.fence_seq)
            .field("unpersisted_lines", &self.unpersisted_lines())
            .finish()
    }
}

/// Called at the start of every fence; must not access the region it is installed on.
pub type FenceHook = Box<dyn FnMut(&CrashPoint<'_>) + Send>;

struct SimState {
    current: Vec<u8>,
    durable: Vec<u8>,
    /// Lines stored to since they were last durable, not flushed since the last store.
    dirty: BTreeSet<u64>,
    /// Lines flushed and not stored to since, waiting for a fence.
    flushed: BTreeSet<u64>,
    counters: RegionCounters,
    fence_seq: u64,
    /// Write-protected pages (volatile: not part of any crash image).
    protected: BTreeSet<u64>,
}

impl SimState {
    /// True (and the store counted as trapped) when `[off, off + len)` touches a protected page.
    fn refuse_stray(&mut self, off: u64, len: u64) -> bool {
        let pages = pages_of(off, len);
        if self.protected.range(pages).next().is_some() {
            self.counters.trapped_writes += 1;
            return true;
        }
        false
    }

    fn mark_stored(&mut self, off: u64, len: u64) {
        if len == 0 {
            return;
        }
        for line in off / CACHE_LINE..=(off + len - 1) / CACHE_LINE {
            self.flushed.remove(&line);
            self.dirty.insert(line);
        }
    }

    fn image(&self, mode: CrashMode) -> Vec<u8> {
        let mut image = self.durable.clone();
        let mut rng = match mode {
            CrashMode::Torn { seed } => Some(ChaCha8Rng::seed_from_u64(seed)),
            _ => None,
        };
        for &line in self.dirty.iter().chain(self.flushed.iter()) {
            let start = line * CACHE_LINE;
            let end = (start + CACHE_LINE).min(self.current.len() as u64);
            let mut word = start;
            while word < end {
                let keep = match mode {
                    CrashMode::DropAll => false,
                    CrashMode::KeepAll => true,
                    CrashMode::Torn { .. } => rng.as_mut().expect("torn mode has an rng").random(),
                };
                if keep {
                    let range = word as usize..(word + WORD).min(end) as usize;
                    image[range.clone()].copy_from_slice(&self.current[range]);
                }
                word += WORD;
            }
        }
        image
    }
}

/// The crash-simulating region. See the module docs.
pub struct SimRegion {
    state: Mutex<SimState>,
    hook: Mutex<Option<FenceHook>>,
}

impl fmt::Debug for SimRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.state.lock().expect("sim region lock");
        f.debug_struct("SimRegion")
            .field("len", &state.current.len())
            .field("fence_seq", &state.fence_seq)
            .finish_non_exhaustive()
    }
}

impl SimRegion {
    /// A zero-filled region of `len` bytes (like a freshly created file), all durable.
    pub fn new(len: u64) -> SimRegion {
        SimRegion::from_image(vec![0; len as usize])
    }

    /// A region whose durable and current contents are `image` (e.g. a crash image to recover).
    pub fn from_image(image: Vec<u8>) -> SimRegion {
        SimRegion {
            state: Mutex::new(SimState {
                durable: image.clone(),
                current: image,
                dirty: BTreeSet::new(),
                flushed: BTreeSet::new(),
                counters: RegionCounters::default(),
                fence_seq: 0,
                protected: BTreeSet::new(),
            }),
            hook: Mutex::new(None),
        }
    }

    /// Installs (or removes) the hook called at the start of every fence.
    pub fn set_fence_hook(&self, hook: Option<FenceHook>) {
        *self.hook.lock().expect("sim hook lock") = hook;
    }

    /// The image a crash now would leave.
    pub fn crash_image(&self, mode: CrashMode) -> Vec<u8> {
        self.state.lock().expect("sim region lock").image(mode)
    }

    /// Number of fences so far.
    pub fn fence_seq(&self) -> u64 {
        self.state.lock().expect("sim region lock").fence_seq
    }

    /// The current (visible) contents.
    pub fn current(&self) -> Vec<u8> {
        self.state.lock().expect("sim region lock").current.clone()
    }

    /// Flips one bit of the current and durable contents: a media error, for corruption tests.
    pub fn flip_bit(&self, off: u64, bit: u8) {
        let mut state = self.state.lock().expect("sim region lock");
        state.current[off as usize] ^= 1 << (bit % 8);
        state.durable[off as usize] ^= 1 << (bit % 8);
    }
}

impl Region for SimRegion {
    fn len(&self) -> u64 {
        self.state.lock().expect("sim region lock").current.len() as u64
    }

    fn read(&self, off: u64, buf: &mut [u8]) {
        let state = self.state.lock().expect("sim region lock");
        check_bounds(state.current.len() as u64, off, buf.len() as u64);
        buf.copy_from_slice(&state.current[off as usize..off as usize + buf.len()]);
    }

    fn write(&self, off: u64, data: &[u8]) {
        let mut state = self.state.lock().expect("sim region lock");
        check_bounds(state.current.len() as u64, off, data.len() as u64);
        if state.refuse_stray(off, data.len() as u64) {
            return;
        }
        state.current[off as usize..off as usize + data.len()].copy_from_slice(data);
        state.mark_stored(off, data.len() as u64);
        state.counters.bytes_written += data.len() as u64;
    }

    fn store_u64(&self, off: u64, value: u64) {
        let mut state = self.state.lock().expect("sim region lock");
        check_word(state.current.len() as u64, off);
        if state.refuse_stray(off, WORD) {
            return;
        }
        state.current[off as usize..off as usize + 8].copy_from_slice(&value.to_le_bytes());
        state.mark_stored(off, WORD);
        state.counters.bytes_written += WORD;
    }

    fn load_u64(&self, off: u64) -> u64 {
        let state = self.state.lock().expect("sim region lock");
        check_word(state.current.len() as u64, off);
        let mut word = [0u8; 8];
        word.copy_from_slice(&state.current[off as usize..off as usize + 8]);
        u64::from_le_bytes(word)
    }

    fn flush(&self, off: u64, len: u64) {
        let mut state = self.state.lock().expect("sim region lock");
        check_bounds(state.current.len() as u64, off, len);
        state.counters.flush_calls += 1;
        if len == 0 {
            return;
        }
        let lines: Vec<u64> =
            state.dirty.range(off / CACHE_LINE..=(off + len - 1) / CACHE_LINE).copied().collect();
        for line in lines {
            state.dirty.remove(&line);
            state.flushed.insert(line);
        }
    }

    fn fence(&self) {
        let mut state = self.state.lock().expect("sim region lock");
        if let Some(hook) = self.hook.lock().expect("sim hook lock").as_mut() {
            hook(&CrashPoint { state: &state, fence_seq: state.fence_seq });
        }
        let flushed = std::mem::take(&mut state.flushed);
        for line in flushed {
            let start = (line * CACHE_LINE) as usize;
            let end = (start + CACHE_LINE as usize).min(state.current.len());
            let SimState { current, durable, .. } = &mut *state;
            durable[start..end].copy_from_slice(&current[start..end]);
        }
        state.fence_seq += 1;
        state.counters.fence_calls += 1;
    }

    fn mode(&self) -> PersistMode {
        PersistMode::Simulated
    }

    fn protection_supported(&self) -> bool {
        true
    }

    fn protect(&self, off: u64, len: u64) {
        let mut state = self.state.lock().expect("sim region lock");
        check_pages(state.current.len() as u64, off, len);
        state.counters.protect_calls += 1;
        state.protected.extend(pages_of(off, len));
    }

    fn unprotect(&self, off: u64, len: u64) {
        let mut state = self.state.lock().expect("sim region lock");
        check_pages(state.current.len() as u64, off, len);
        state.counters.unprotect_calls += 1;
        for page in pages_of(off, len) {
            state.protected.remove(&page);
        }
    }

    fn is_protected(&self, off: u64) -> bool {
        let state = self.state.lock().expect("sim region lock");
        check_bounds(state.current.len() as u64, off, 1);
        state.protected.contains(&(off / crate::region::PROTECT_PAGE))
    }

    fn write_retained(&self, off: u64, data: &[u8]) {
        let mut state = self.state.lock().expect("sim region lock");
        check_bounds(state.current.len() as u64, off, data.len() as u64);
        state.current[off as usize..off as usize + data.len()].copy_from_slice(data);
        state.mark_stored(off, data.len() as u64);
        state.counters.bytes_written += data.len() as u64;
    }

    fn counters(&self) -> RegionCounters {
        self.state.lock().expect("sim region lock").counters
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn unpersisted_store_is_lost_by_drop_all_and_kept_by_keep_all() {
        let region = SimRegion::new(4096);
        region.write(100, &[7; 16]);
        assert_eq!(region.crash_image(CrashMode::DropAll)[100..116], [0; 16]);
        assert_eq!(region.crash_image(CrashMode::KeepAll)[100..116], [7; 16]);
    }

    #[test]
    fn persisted_store_survives_every_crash_mode() {
        let region = SimRegion::new(4096);
        region.write(100, &[7; 16]);
        region.persist(100, 16);
        for mode in [CrashMode::DropAll, CrashMode::KeepAll, CrashMode::Torn { seed: 3 }] {
            assert_eq!(region.crash_image(mode)[100..116], [7; 16], "{mode:?}");
        }
    }

    #[test]
    fn flush_without_fence_is_not_durable() {
        let region = SimRegion::new(4096);
        region.write(0, &[1; 64]);
        region.flush(0, 64);
        assert_eq!(region.crash_image(CrashMode::DropAll)[..64], [0; 64]);
        region.fence();
        assert_eq!(region.crash_image(CrashMode::DropAll)[..64], [1; 64]);
    }

    #[test]
    fn store_after_flush_needs_a_new_flush() {
        let region = SimRegion::new(4096);
        region.write(0, &[1; 8]);
        region.flush(0, 8);
        region.write(8, &[2; 8]);
        region.fence();
        let image = region.crash_image(CrashMode::DropAll);
        assert_eq!(image[..16], [0; 16], "the line was stored to after its flush");
    }

    #[test]
    fn torn_image_mixes_words_but_never_splits_one() {
        let region = SimRegion::new(4096);
        let data: Vec<u8> = (1..=255).collect();
        region.write(0, &data);
        let mut mixed = false;
        for seed in 0..32 {
            let image = region.crash_image(CrashMode::Torn { seed });
            let mut kept = 0;
            for word in image[..248].chunks(8).zip(data.chunks(8)) {
                let (got, new) = word;
                assert!(got == new || got == [0; 8], "word split: {got:?}");
                kept += usize::from(got == new);
            }
            mixed |= kept > 0 && kept < 31;
        }
        assert!(mixed, "32 seeds never produced a partly kept write");
    }

    #[test]
    fn torn_images_replay_from_their_seed() {
        let region = SimRegion::new(4096);
        region.write(0, &[9; 512]);
        let a = region.crash_image(CrashMode::Torn { seed: 42 });
        let b = region.crash_image(CrashMode::Torn { seed: 42 });
        assert_eq!(a, b);
    }

    #[test]
    fn fence_hook_sees_state_before_the_fence() {
        let region = SimRegion::new(4096);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&seen);
        region.set_fence_hook(Some(Box::new(move |point| {
            sink.lock().unwrap().push((point.fence_seq, point.image(CrashMode::DropAll)[0]));
        })));
        region.write(0, &[5]);
        region.persist(0, 1);
        region.write(0, &[6]);
        region.persist(0, 1);
        assert_eq!(*seen.lock().unwrap(), vec![(0, 0), (1, 5)]);
    }

    #[test]
    fn atomic_word_store_round_trips() {
        let region = SimRegion::new(64);
        region.store_u64(8, 0xdead_beef);
        assert_eq!(region.load_u64(8), 0xdead_beef);
    }

    #[test]
    #[should_panic(expected = "unaligned")]
    fn unaligned_atomic_store_panics() {
        SimRegion::new(64).store_u64(4, 1);
    }

    #[test]
    fn stray_stores_to_protected_pages_are_refused_and_counted() {
        let region = SimRegion::new(4 * 4096);
        region.write(4096, &[1; 4096]);
        region.protect(4096, 2 * 4096);
        region.write(4000, &[9; 200]); // straddles into the protected page: refused whole
        region.store_u64(8192, 7);
        assert_eq!(region.counters().trapped_writes, 2);
        assert_eq!(region.read_vec(4000, 96), vec![0; 96]);
        assert_eq!(region.read_vec(4096, 104), vec![1; 104]);
        assert_eq!(region.load_u64(8192), 0);
        region.write_retained(8192, &[3; 8]);
        assert_eq!(region.read_vec(8192, 8), vec![3; 8], "retained stores pass");
        assert!(region.is_protected(8192) && !region.is_protected(12288));
        region.unprotect(4096, 4096);
        region.write(4096, &[2; 8]);
        assert_eq!(region.read_vec(4096, 8), vec![2; 8]);
        assert_eq!(region.counters().trapped_writes, 2);
    }

    #[test]
    #[should_panic(expected = "beyond region length")]
    fn out_of_bounds_write_panics() {
        SimRegion::new(64).write(60, &[0; 8]);
    }
}
