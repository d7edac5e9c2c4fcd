//! Crash-image sweep of the NVRAM block cache's own persistent structures (level 1 of STYLE
//! 12): a seeded sequence of absorbs (new sectors and rewrites, destaging when full), drains,
//! discards and clean reopenings runs on a simulated region; at every fence four crash images
//! (all unpersisted words dropped, all kept, two seeded tearings) are recovered by a fresh
//! `NvCache::open`, and the device it presents (the image as destaged so far, resident sectors
//! over it) must equal the device before the operation or after it - for an absorbed write as
//! a whole (a request is atomic), for a discard sector by sector. Recovery itself verifies
//! that no sector is resident twice (N3) and `check()` that the volatile state matches the
//! region (N4). Every 16th crash point is also crashed at every fence of its own recovery.
//!
//! Replay one seed: `NVSTACK_SEED=7 cargo test -p nvstack-device --test nvcache_crash -- --nocapture`.

use std::io;
use std::sync::{Arc, Mutex};

use device::classify::Class;
use device::nvcache::{Backing, ImageId, NvCache, format_params};
use nvram::{CrashMode, Region, SimRegion};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use txn::Pool;

const SECTOR: usize = 512;
const IMAGE_SECTORS: u64 = 48;
const CAPACITY: u64 = 10;
const OPS_PER_SEED: usize = 120;

fn image_id() -> ImageId {
    ImageId { size_bytes: IMAGE_SECTORS * SECTOR as u64, dev: 7, ino: 8, path: "/sweep.img".into() }
}

/// The image: durable at every write (the model's image file after a destage).
#[derive(Clone, Debug)]
struct Shared(Arc<Mutex<Vec<u8>>>);

impl Backing for Shared {
    fn write_durable(&mut self, lba: u64, data: &[u8]) -> io::Result<()> {
        let at = lba as usize * SECTOR;
        self.0.lock().unwrap()[at..at + data.len()].copy_from_slice(data);
        Ok(())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Absorb,
    Drain,
    Discard,
    Reopen,
}

#[derive(Default)]
struct Sweep {
    seed: u64,
    op: usize,
    kind: Option<Kind>,
    before: Vec<u8>,
    after: Vec<u8>,
    crash_points: u64,
    images: u64,
    images_after: u64,
    nested_images: u64,
    failure: Option<String>,
}

fn crash_modes(seed: u64, fence: u64) -> [CrashMode; 4] {
    let base = seed.wrapping_mul(1_000_003).wrapping_add(fence.wrapping_mul(7919));
    [
        CrashMode::DropAll,
        CrashMode::KeepAll,
        CrashMode::Torn { seed: base },
        CrashMode::Torn { seed: base ^ 0x5555 },
    ]
}

/// Recovers a region image and returns the device it presents over `image`.
fn device_after_recovery(region: Vec<u8>, image: &[u8]) -> Result<Vec<u8>, String> {
    let r: Arc<dyn Region> = Arc::new(SimRegion::from_image(region));
    let (cache, _) = NvCache::open(r, &image_id(), None, None).map_err(|e| e.to_string())?;
    cache.check()?;
    if cache.resident_sectors() > CAPACITY {
        return Err(format!("{} sectors resident, capacity {CAPACITY}", cache.resident_sectors()));
    }
    let mut dev = image.to_vec();
    let mut buf = [0u8; SECTOR];
    for lbn in 0..IMAGE_SECTORS {
        if cache.read(lbn, &mut buf).map_err(|e| e.to_string())? {
            dev[lbn as usize * SECTOR..(lbn as usize + 1) * SECTOR].copy_from_slice(&buf);
        }
    }
    Ok(dev)
}

/// Recovery crashed at each of its own fences: every image must present the same device.
fn nested(region: Vec<u8>, image: &[u8], want: &[u8]) -> Result<u64, String> {
    let sim = Arc::new(SimRegion::from_image(region));
    let images: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
    let sink = Arc::clone(&images);
    sim.set_fence_hook(Some(Box::new(move |p| {
        let mut v = sink.lock().unwrap();
        v.push(p.image(CrashMode::DropAll));
        v.push(p.image(CrashMode::Torn { seed: p.fence_seq }));
    })));
    let r: Arc<dyn Region> = sim.clone();
    drop(NvCache::open(r, &image_id(), None, None).map_err(|e| e.to_string())?);
    sim.set_fence_hook(None);
    let all = std::mem::take(&mut *images.lock().unwrap());
    for img in &all {
        if device_after_recovery(img.clone(), image)? != want {
            return Err("a crash during recovery changed the recovered device".into());
        }
    }
    Ok(all.len() as u64)
}

fn check_point(s: &mut Sweep, point: &nvram::CrashPoint<'_>, image: &[u8]) -> Result<(), String> {
    s.crash_points += 1;
    let kind = s.kind.expect("an operation runs");
    for mode in crash_modes(s.seed, point.fence_seq) {
        let at =
            format!("seed {} op {} ({kind:?}) fence {} {mode:?}", s.seed, s.op, point.fence_seq);
        let got = device_after_recovery(point.image(mode), image)
            .map_err(|e| format!("{at}: recovery failed: {e}"))?;
        s.images += 1;
        let ok = match kind {
            Kind::Absorb | Kind::Drain | Kind::Reopen => {
                if got == s.after && got != s.before {
                    s.images_after += 1;
                }
                got == s.before || got == s.after
            }
            Kind::Discard => got
                .chunks(SECTOR)
                .zip(s.before.chunks(SECTOR).zip(s.after.chunks(SECTOR)))
                .all(|(g, (b, a))| g == b || g == a),
        };
        if !ok {
            let bad = got.chunks(SECTOR).zip(s.before.chunks(SECTOR)).position(|(g, b)| g != b);
            return Err(format!(
                "{at}: the recovered device is neither the one before nor the one after the \
                 operation (first sector differing from before: {bad:?})"
            ));
        }
        if s.crash_points % 16 == 0 && mode == CrashMode::KeepAll {
            s.nested_images +=
                nested(point.image(mode), image, &got).map_err(|e| format!("{at}: nested: {e}"))?;
        }
    }
    Ok(())
}

/// Sectors an absorb writes: (LBN, 512 bytes).
type Sectors = Vec<(u64, Vec<u8>)>;

/// The next operation: its kind, the sectors an absorb writes, the sectors a discard drops.
fn plan(rng: &mut ChaCha8Rng) -> (Kind, Sectors, Vec<u64>) {
    let mut sectors: Sectors = Vec::new();
    let mut discard: Vec<u64> = Vec::new();
    let kind = match rng.random_range(0..100) {
        0..80 => Kind::Absorb,
        80..87 => Kind::Drain,
        87..95 => Kind::Discard,
        _ => Kind::Reopen,
    };
    match kind {
        Kind::Absorb => {
            let n = rng.random_range(1..=6u64);
            // Hot sectors 0..16 (rewrites), the rest spread; sometimes a contiguous run.
            let mut lbns: Vec<u64> = if rng.random_bool(0.3) {
                let start = rng.random_range(0..IMAGE_SECTORS - n);
                (start..start + n).collect()
            } else {
                (0..n)
                    .map(|_| {
                        if rng.random_bool(0.6) {
                            rng.random_range(0..16)
                        } else {
                            rng.random_range(0..IMAGE_SECTORS)
                        }
                    })
                    .collect()
            };
            lbns.sort_unstable();
            lbns.dedup();
            for lbn in lbns {
                let mut d = vec![0u8; SECTOR];
                rng.fill(&mut d[..]);
                sectors.push((lbn, d));
            }
        }
        Kind::Discard => {
            let start = rng.random_range(0..IMAGE_SECTORS);
            let n = rng.random_range(1..=8).min(IMAGE_SECTORS - start);
            discard = (start..start + n).collect();
        }
        Kind::Drain | Kind::Reopen => {}
    }
    (kind, sectors, discard)
}

fn sweep(seed: u64) -> Sweep {
    let params = format_params(CAPACITY);
    let sim = Arc::new(SimRegion::new(params.region_size));
    Pool::format(&*sim, params).unwrap();
    let image = Shared(Arc::new(Mutex::new(vec![0u8; IMAGE_SECTORS as usize * SECTOR])));
    let state = Arc::new(Mutex::new(Sweep { seed, ..Sweep::default() }));
    let hook_state = Arc::clone(&state);
    let hook_image = image.clone();
    sim.set_fence_hook(Some(Box::new(move |point| {
        let mut s = hook_state.lock().unwrap();
        if s.failure.is_none() && s.kind.is_some() {
            let img = hook_image.0.lock().unwrap().clone();
            if let Err(e) = check_point(&mut s, point, &img) {
                s.failure = Some(e);
            }
        }
    })));
    let open = |capacity| {
        let r: Arc<dyn Region> = sim.clone();
        NvCache::open(r, &image_id(), capacity, None).unwrap().0
    };
    let mut cache = open(Some(CAPACITY));
    let mut model = vec![0u8; IMAGE_SECTORS as usize * SECTOR];
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut backing = image.clone();
    for op in 0..OPS_PER_SEED {
        let before = model.clone();
        let (kind, sectors, discard) = plan(&mut rng);
        let mut after = model.clone();
        for (lbn, d) in &sectors {
            after[*lbn as usize * SECTOR..(*lbn as usize + 1) * SECTOR].copy_from_slice(d);
        }
        for &lbn in &discard {
            after[lbn as usize * SECTOR..(lbn as usize + 1) * SECTOR].fill(0);
        }
        {
            let mut s = state.lock().unwrap();
            s.op = op;
            s.kind = Some(kind);
            s.before = before;
            s.after.clone_from(&after);
        }
        match kind {
            Kind::Absorb => {
                let list: Vec<(u64, &[u8], Class)> =
                    sectors.iter().map(|(l, d)| (*l, &d[..], Class::ExtDirectory)).collect();
                cache.absorb(&list, &mut backing).unwrap();
            }
            Kind::Drain => {
                cache.drain(&mut backing).unwrap();
            }
            Kind::Discard => {
                // As the engine does: the image range first, then the NVRAM sectors.
                for &lbn in &discard {
                    backing.write_durable(lbn, &[0u8; SECTOR]).unwrap();
                }
                cache.discard(&discard).unwrap();
            }
            Kind::Reopen => {
                cache.close();
                cache = open(None);
            }
        }
        model = after;
        cache.check().unwrap_or_else(|e| panic!("seed {seed} op {op}: {e}"));
        if let Some(f) = state.lock().unwrap().failure.take() {
            panic!("{f}");
        }
        // The live cache presents the model too.
        let img = image.0.lock().unwrap().clone();
        let mut dev = img;
        let mut buf = [0u8; SECTOR];
        for lbn in 0..IMAGE_SECTORS {
            if cache.read(lbn, &mut buf).unwrap() {
                dev[lbn as usize * SECTOR..(lbn as usize + 1) * SECTOR].copy_from_slice(&buf);
            }
        }
        assert!(dev == model, "seed {seed} op {op}: the live device differs from the model");
    }
    sim.set_fence_hook(None);
    let mut s = std::mem::take(&mut *state.lock().unwrap());
    s.failure = None;
    s
}

fn seeds(default: u64) -> Vec<u64> {
    match std::env::var("NVSTACK_SEED") {
        Ok(s) => vec![s.parse().expect("NVSTACK_SEED must be a number")],
        Err(_) => (1..=default).collect(),
    }
}

#[test]
fn every_crash_image_presents_the_device_before_or_after_the_operation() {
    let seeds = seeds(6);
    let (mut points, mut images, mut after, mut nested) = (0, 0, 0, 0);
    for &seed in &seeds {
        let s = sweep(seed);
        points += s.crash_points;
        images += s.images;
        after += s.images_after;
        nested += s.nested_images;
    }
    eprintln!(
        "nvcache crash sweep: {} seeds x {OPS_PER_SEED} operations (capacity {CAPACITY} \
         sectors): {points} crash points, {images} images recovered and checked ({after} showed \
         the operation done), {nested} more from crashes during recovery",
        seeds.len()
    );
    if seeds.len() > 1 {
        assert!(points >= 2000, "only {points} crash points");
        assert!(after > 0, "no image showed a completed operation: commit window not exercised");
        assert!(nested > 0, "no nested crash images");
    }
}
