//! The delegation log (docs/direct-path.md, `crates/direct/src/log.rs`): every append that
//! returned survives a crash at every fence in every crash mode, nothing half written is ever
//! read (DL1), an earlier pass over the area is never read again after a reset, and damage ends
//! the valid prefix with its reason (DL2) - a table of damaged logs.

use std::sync::{Arc, Mutex};

use direct::{Damage, LogError, LogHeader, LogWriter, Record, RecordKind, format, reset, scan};
use nvram::{CrashMode, Region, SimRegion};
use rand::{Rng, SeedableRng};

const GRANT: u64 = 0x6772_616e_7401;
const NODE: u64 = 42;
const AREA: u64 = 256 << 10;

/// A crash image with the number of appends that had returned when it was taken.
type Image = (usize, Vec<u8>);
/// How a row damages a log (given each record's offset).
type Damager = fn(&SimRegion, &[u64]);
/// (what, how, records kept, the damage expected)
type Row = (&'static str, Damager, usize, fn(&Damage) -> bool);

fn fresh() -> Arc<SimRegion> {
    let area = Arc::new(SimRegion::new(AREA));
    format(&*area, LogHeader { grant: GRANT, node: NODE, base: 1 }).unwrap();
    area
}

/// A seeded mix of writes (0-3000 bytes at random offsets, some empty) and truncates.
fn workload(seed: u64, n: usize) -> Vec<(RecordKind, u64, Vec<u8>)> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|i| {
            if rng.random_range(0..8) == 0 {
                (RecordKind::Truncate, rng.random_range(0..1 << 20), Vec::new())
            } else {
                let len = rng.random_range(0..3000);
                let data = (0..len).map(|j| (i * 7 + j) as u8).collect();
                (RecordKind::Write, rng.random_range(0..1 << 30), data)
            }
        })
        .collect()
}

fn as_records(ops: &[(RecordKind, u64, Vec<u8>)], first_seq: u64) -> Vec<Record> {
    ops.iter()
        .enumerate()
        .map(|(i, (kind, offset, data))| Record {
            seq: first_seq + i as u64,
            kind: *kind,
            offset: *offset,
            data: data.clone(),
        })
        .collect()
}

#[test]
fn appended_records_read_back_in_order() {
    let area = fresh();
    let ops = workload(1, 60);
    let mut w = LogWriter::resume(&*area, GRANT, direct::HEADER_BYTES, 1);
    for (kind, offset, data) in &ops {
        w.append(*kind, *offset, data).unwrap();
    }
    let s = scan(&area.current(), GRANT, NODE).unwrap();
    assert_eq!(s.damage, None);
    assert_eq!(s.records, as_records(&ops, 1));
    assert_eq!(s.next_seq, 61);
    // A writer resumed where the scan ended continues the same log.
    let mut w = LogWriter::resume(&*area, GRANT, s.end, s.next_seq);
    w.append(RecordKind::Write, 7, b"more").unwrap();
    assert_eq!(scan(&area.current(), GRANT, NODE).unwrap().records.len(), 61);
}

#[test]
fn a_full_area_refuses_the_record_and_keeps_what_it_holds() {
    let area = fresh();
    let mut w = LogWriter::resume(&*area, GRANT, direct::HEADER_BYTES, 1);
    let data = vec![9u8; 4000];
    let mut n = 0;
    let full = loop {
        match w.append(RecordKind::Write, n * 4000, &data) {
            Ok(_) => n += 1,
            Err(full) => break full,
        }
    };
    assert!(full.needed > full.free, "{full}");
    assert_eq!(n, (AREA - direct::HEADER_BYTES) / 4032);
    let s = scan(&area.current(), GRANT, NODE).unwrap();
    assert_eq!((s.records.len() as u64, s.damage), (n, None));
}

/// DL1 at every fence: a crash image taken at each fence of a seeded workload, in each crash
/// mode, holds exactly the records whose append returned before the fence, or one more (the
/// append the fence belongs to), never a damaged or partial one. Then the same after a reset
/// over a full earlier pass: the old records never come back.
#[test]
fn a_crash_at_every_fence_keeps_every_acknowledged_record_and_nothing_torn() {
    let mut checked = 0;
    for seed in 1..=4u64 {
        for pass in 0..2 {
            let area = fresh();
            let mut first_seq = 1;
            if pass == 1 {
                // An earlier pass fills the area; merged (here: forgotten); the area reset.
                let mut w = LogWriter::resume(&*area, GRANT, direct::HEADER_BYTES, 1);
                let mut i = 0;
                while w.append(RecordKind::Write, i, &[0xee; 1500]).is_ok() {
                    i += 1;
                }
                first_seq = i + 1;
                reset(&*area, GRANT, NODE, first_seq);
            }
            let ops = workload(seed, 24);
            let acked = Arc::new(Mutex::new(0usize));
            let images: Arc<Mutex<Vec<Image>>> = Arc::default();
            let (sink, seen) = (Arc::clone(&images), Arc::clone(&acked));
            area.set_fence_hook(Some(Box::new(move |point| {
                let n = *seen.lock().unwrap();
                let mut sink = sink.lock().unwrap();
                for mode in [
                    CrashMode::DropAll,
                    CrashMode::KeepAll,
                    CrashMode::Torn { seed: point.fence_seq },
                ] {
                    sink.push((n, point.image(mode)));
                }
            })));
            let mut w = LogWriter::resume(&*area, GRANT, direct::HEADER_BYTES, first_seq);
            for (kind, offset, data) in &ops {
                w.append(*kind, *offset, data).unwrap();
                *acked.lock().unwrap() += 1;
            }
            area.set_fence_hook(None);
            let want = as_records(&ops, first_seq);
            for (n, image) in std::mem::take(&mut *images.lock().unwrap()) {
                let s = scan(&image, GRANT, NODE).unwrap();
                assert_eq!(s.damage, None, "seed {seed} pass {pass}: {:?}", s.damage);
                let got = s.records.len();
                assert!(got == n || got == n + 1, "seed {seed} pass {pass}: {got} after {n} acks");
                assert_eq!(s.records, want[..got], "seed {seed} pass {pass}: a prefix");
                checked += 1;
            }
        }
    }
    eprintln!("{checked} crash images checked");
    assert!(checked > 1000, "{checked} images");
}

/// Damage a log of 5 committed records in one way each: the scan keeps the records before the
/// damage, names it, and merges nothing after it (DL2); a header that is not this delegation's
/// refuses the log whole.
#[test]
fn a_damaged_log_keeps_its_valid_prefix_and_says_what_is_wrong() {
    let rows: &[Row] = &[
        (
            "a flipped data bit in the third record",
            |a, at| a.flip_bit(at[2] + 40, 3),
            2,
            |d| matches!(d, Damage::Checksum { seq: 3, .. }),
        ),
        (
            "a length past the area",
            |a, at| a.write(at[1] + 16, &u32::MAX.to_le_bytes()),
            1,
            |d| matches!(d, Damage::Length { len: u32::MAX, .. }),
        ),
        (
            "an offset past the file size limit (checksum recomputed by a forger)",
            |a, at| forge(a, at[4], 5, i64::MAX as u64, WRITE, b"xy"),
            4,
            |d| matches!(d, Damage::FileSize { .. }),
        ),
        (
            "an unknown kind (checksum recomputed)",
            |a, at| forge(a, at[0], 1, 0, 9, b""),
            0,
            |d| matches!(d, Damage::Kind { code: 9, .. }),
        ),
        (
            "a record of another grant (its checksum binds the grant)",
            |a, at| forge_grant(a, at[2], GRANT + 1, 3),
            2,
            |d| matches!(d, Damage::Checksum { seq: 3, .. }),
        ),
    ];
    for (what, damage, kept, is) in rows {
        let area = fresh();
        let mut w = LogWriter::resume(&*area, GRANT, direct::HEADER_BYTES, 1);
        let mut at = Vec::new();
        for i in 0..5u64 {
            at.push(direct::HEADER_BYTES + i * 128);
            w.append(RecordKind::Write, i * 100, &[i as u8; 60]).unwrap();
        }
        damage(&area, &at);
        let s = scan(&area.current(), GRANT, NODE).unwrap();
        assert_eq!(s.records.len(), *kept, "{what}");
        let d = s.damage.expect(what);
        assert!(is(&d), "{what}: {d:?}");
    }
    // The header: another delegation's log, and not a log at all.
    let area = fresh();
    assert_eq!(
        scan(&area.current(), GRANT, NODE + 1),
        Err(LogError::NotThisDelegation {
            grant: GRANT,
            node: NODE + 1,
            found_grant: GRANT,
            found_node: NODE
        })
    );
    area.flip_bit(20, 0);
    assert_eq!(scan(&area.current(), GRANT, NODE), Err(LogError::NotALog));
    assert!(matches!(scan(&[0u8; 100], GRANT, NODE), Err(LogError::TooSmall(100))));
}

/// The on-log code of `RecordKind::Write` (the format's byte table).
const WRITE: u8 = 1;

/// A forger who knows the format: a record at `at` with a valid tag and checksum for this
/// grant.
fn forge(a: &SimRegion, at: u64, seq: u64, offset: u64, kind: u8, data: &[u8]) {
    forge_with(a, at, GRANT, seq, offset, kind, data);
}

/// Record 3 rewritten with a checksum made for `grant`.
fn forge_grant(a: &SimRegion, at: u64, grant: u64, seq: u64) {
    forge_with(a, at, grant, seq, 200, WRITE, &[2u8; 60]);
}

fn forge_with(a: &SimRegion, at: u64, grant: u64, seq: u64, offset: u64, kind: u8, data: &[u8]) {
    let len = data.len() as u32;
    let sum = direct::log::record_sum(grant, seq, offset, len, kind, data);
    a.store_u64(at, direct::log::commit_tag(GRANT, seq));
    a.store_u64(at + 8, offset);
    a.write(at + 16, &len.to_le_bytes());
    a.write(at + 20, &[kind, 0, 0, 0]);
    a.store_u64(at + 24, sum);
    a.write(at + 32, data);
}
