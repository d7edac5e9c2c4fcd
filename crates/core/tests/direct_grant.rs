//! The direct path's grant and take-back in the engine (`engine/direct.rs`, docs/direct-path.md
//! DG1, DT1, DT2) over `MemLower`, with log areas in memory and the library played by
//! `direct::LogWriter` and the `direct::control` handshake: a table of grants refused with
//! their reasons, take-backs that end and merges that keep a delegation, a log that starts
//! over when full, a forged log refused with its valid prefix kept, and a library thread stuck
//! inside an append.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use direct::{LogWriter, RecordKind, control};
use engine::{
    CacheConfig, Caller, Engine, EngineConfig, LogAreas, Nbw, Share, TakeBack, TakenBack,
};
use engine::{FsError, TempConfig};
use lower::{Creds, MemLower};
use nvram::{FormatParams, Region, SimRegion};
use txn::{Consistency, Pool};

const ROOT: Creds = Creds { uid: 0, gid: 0, groups: Vec::new() };
const CALLER: Caller = Caller { uid: 0, gid: 0, pid: 1 };
const AREA: u64 = 64 << 10;

fn name(s: &str) -> &OsStr {
    OsStr::new(s)
}

/// Log areas in memory; `pause` counts 10 us a call, the bound is 100 us.
#[derive(Debug, Default)]
struct MemAreas {
    made: Mutex<Vec<(PathBuf, Arc<SimRegion>)>>,
    removed: Mutex<Vec<PathBuf>>,
}

impl LogAreas for MemAreas {
    fn create(
        &self,
        grant: u64,
        _owner: (u32, u32),
    ) -> std::io::Result<(PathBuf, Arc<dyn Region>)> {
        let path = PathBuf::from(format!("/mem/{grant}.log"));
        let area = Arc::new(SimRegion::new(AREA));
        self.made.lock().unwrap().push((path.clone(), Arc::clone(&area)));
        Ok((path, area))
    }
    fn remove(&self, path: &Path) {
        self.removed.lock().unwrap().push(path.to_path_buf());
    }
    fn pause(&self, waited_us: u64) -> Option<u64> {
        (waited_us < 100).then_some(10)
    }
}

impl MemAreas {
    fn last(&self) -> Arc<SimRegion> {
        Arc::clone(&self.made.lock().unwrap().last().expect("an area").1)
    }
}

fn params() -> FormatParams {
    FormatParams {
        region_size: 12288 + 4 * 65536 + 4096 + 512 * 4096,
        undo_slots: 4,
        undo_slot_size: 65536,
    }
}

fn engine_with(
    areas: Option<Arc<MemAreas>>,
    mode: Consistency,
) -> Result<Engine<MemLower>, String> {
    let region = Arc::new(SimRegion::new(params().region_size));
    Pool::format(&*region, params()).unwrap();
    let (pool, _) = Pool::open(region, mode).unwrap();
    let config = EngineConfig {
        temp: TempConfig { share: Share::Percent(100), ..TempConfig::default() },
        cache: CacheConfig { background: false, nbw: Nbw::Lazy, ..CacheConfig::default() },
        passthrough: false,
        direct_logs: areas.map(|a| a as Arc<dyn LogAreas>),
        ..EngineConfig::default()
    };
    Engine::new(MemLower::default(), pool, config).map_err(|e| e.to_string())
}

fn engine(areas: &Arc<MemAreas>) -> Engine<MemLower> {
    engine_with(Some(Arc::clone(areas)), Consistency::Undo).unwrap()
}

/// A temp file `n` with `data`, open read-write: (node, handle).
fn file(e: &Engine<MemLower>, n: &str, data: &[u8]) -> (u64, u64) {
    let (entry, fh) = e.create(&ROOT, e.root_id(), name(n), 0o644, libc::O_RDWR).unwrap();
    if !data.is_empty() {
        e.write(fh, 0, data, false).unwrap();
    }
    (entry.node_id, fh)
}

fn contents(e: &Engine<MemLower>, n: &str) -> Vec<u8> {
    let entry = e.lookup(e.root_id(), name(n)).unwrap();
    let fh = e.open(entry.node_id, libc::O_RDONLY).unwrap();
    let mut out = Vec::new();
    e.read(fh, 0, 1 << 20, |d| out.extend_from_slice(d)).unwrap();
    e.release(fh).unwrap();
    out
}

fn errno(e: &FsError) -> i32 {
    match e {
        FsError::Answer(lower::Errno(n)) | FsError::Lower(lower::Errno(n)) => *n,
        other => panic!("not an errno: {other:?}"),
    }
}

/// The library's side: appends inside the handshake, as `crates/preload` does.
struct Library {
    area: Arc<SimRegion>,
    grant: u64,
    at: u64,
    next_seq: u64,
}

impl Library {
    fn new(area: Arc<SimRegion>, g: &direct::ioctl::Granted) -> Library {
        Library { area, grant: g.grant, at: direct::HEADER_BYTES, next_seq: g.first_seq }
    }
    fn write(&mut self, off: u64, data: &[u8]) -> bool {
        if control::enter(&*self.area).is_err() {
            return false;
        }
        let mut w = LogWriter::resume(&*self.area, self.grant, self.at, self.next_seq);
        let ok = w.append(RecordKind::Write, off, data).is_ok();
        (self.at, self.next_seq) = w.position();
        assert!(control::leave(&*self.area), "no merge ran during the append");
        ok
    }
}

#[test]
fn grants_are_refused_with_their_reason() {
    // (what, how the file is opened and asked for, errno, the refusal counted)
    type Setup = fn(&Engine<MemLower>) -> (u64, u64);
    let areas = Arc::new(MemAreas::default());
    let rows: [(&str, Setup, i32, &str); 4] = [
        (
            "read-only open",
            |e| {
                let (node, fh) = file(e, "ro", b"x");
                e.release(fh).unwrap();
                (node, e.open(node, libc::O_RDONLY).unwrap())
            },
            libc::EBADF,
            "read_only",
        ),
        (
            "a second open",
            |e| {
                let (node, fh) = file(e, "two", b"x");
                e.open(node, libc::O_RDONLY).unwrap();
                (node, fh)
            },
            libc::EBUSY,
            "busy",
        ),
        (
            "already delegated",
            |e| {
                let (node, fh) = file(e, "again", b"x");
                e.grant(node, fh, CALLER).unwrap();
                (node, fh)
            },
            libc::EBUSY,
            "busy",
        ),
        (
            "a directory",
            |e| {
                let entry = e.mkdir(&ROOT, e.root_id(), name("d"), 0o755).unwrap();
                (entry.node_id, e.opendir(entry.node_id).unwrap())
            },
            libc::EOPNOTSUPP,
            "route",
        ),
    ];
    for (what, setup, want, counter) in rows {
        let e = engine(&areas);
        let (node, fh) = setup(&e);
        let err = e.grant(node, fh, CALLER).expect_err(what);
        assert_eq!(errno(&err), want, "{what}");
        assert_eq!(e.stats().direct.refused_grants[counter], 1, "{what}");
    }
    // Off: no log areas.
    let e = engine_with(None, Consistency::Undo).unwrap();
    let (node, fh) = file(&e, "f", b"x");
    assert_eq!(errno(&e.grant(node, fh, CALLER).unwrap_err()), libc::EOPNOTSUPP);
    assert_eq!(e.stats().direct.refused_grants["off"], 1);
    // Journal mode refuses the direct path at start.
    let why = engine_with(Some(areas), Consistency::Journal).unwrap_err();
    assert!(why.contains("--direct-path on needs --consistency undo"), "{why}");
}

#[test]
fn a_take_back_merges_every_record_and_ends_the_delegation() {
    let areas = Arc::new(MemAreas::default());
    let e = engine(&areas);
    let (node, fh) = file(&e, "f", b"0123456789");
    let g = e.grant(node, fh, CALLER).unwrap();
    assert_eq!(g.size, 10);
    let mut lib = Library::new(areas.last(), &g);
    assert!(lib.write(10, b"abc"));
    assert!(lib.write(2, b"XY"));
    // Before the take-back the engine still has the merged file only.
    assert_eq!(e.getattr(node).unwrap().size, 10);
    let t = e.take_back(node, TakeBack::Open).unwrap();
    assert_eq!(t, TakenBack::Ended { tail: Some((12, b'c')) });
    assert_eq!(control::state(&*lib.area), control::RECALLED);
    assert_eq!(control::merged(&*lib.area), 2);
    assert!(!lib.write(13, b"late"), "an ended delegation takes no more appends");
    assert_eq!(e.take_back(node, TakeBack::Open).unwrap(), TakenBack::None);
    e.release(fh).unwrap();
    assert_eq!(contents(&e, "f"), b"01XY456789abc");
    let d = e.stats().direct;
    assert_eq!((d.granted, d.writes, d.bytes, d.active, d.taken_back["open"]), (1, 2, 5, 0, 1));
    assert_eq!(areas.removed.lock().unwrap().len(), 1);
}

#[test]
fn merges_for_the_holders_reads_keep_the_delegation_and_merge_each_record_once() {
    let areas = Arc::new(MemAreas::default());
    let e = engine(&areas);
    let (node, fh) = file(&e, "f", b"");
    let g = e.grant(node, fh, CALLER).unwrap();
    let mut lib = Library::new(areas.last(), &g);
    for round in 0..3u8 {
        assert!(lib.write(u64::from(round) * 4, &[b'a' + round; 4]));
        assert_eq!(e.take_back(node, TakeBack::Read).unwrap(), TakenBack::Kept);
        assert_eq!(control::state(&*lib.area), control::ACTIVE);
    }
    assert_eq!(e.stats().direct.writes, 3, "each record merged once");
    assert_eq!(
        e.take_back(node, TakeBack::Release).unwrap(),
        TakenBack::Ended { tail: Some((11, b'c')) }
    );
    e.release(fh).unwrap();
    assert_eq!(contents(&e, "f"), b"aaaabbbbcccc");
}

#[test]
fn a_full_log_is_merged_and_starts_over_and_nothing_is_merged_twice() {
    let areas = Arc::new(MemAreas::default());
    let e = engine(&areas);
    let (node, fh) = file(&e, "f", b"");
    let g = e.grant(node, fh, CALLER).unwrap();
    let mut lib = Library::new(areas.last(), &g);
    let mut want = Vec::new();
    let mut resets = 0;
    for i in 0..200u32 {
        let rec = vec![(i % 251) as u8; 1000];
        if !lib.write(u64::from(i) * 1000, &rec) {
            // Full: the MERGE ioctl; the log starts over with the next sequence number.
            let (next, size, t) = e.merge_asked(node, fh, g.grant, false).unwrap();
            assert_eq!((t, size), (TakenBack::Kept, u64::from(i) * 1000));
            (lib.at, lib.next_seq) = (direct::HEADER_BYTES, next);
            resets += 1;
            assert!(lib.write(u64::from(i) * 1000, &rec));
        }
        want.extend_from_slice(&rec);
    }
    assert!(resets >= 2, "{resets} resets of a {AREA} B area");
    e.take_back(node, TakeBack::Release).unwrap();
    e.release(fh).unwrap();
    assert_eq!(contents(&e, "f"), want);
    assert_eq!(e.stats().direct.writes, 200);
    // A MERGE for another grant, or after the end, is refused.
    assert!(e.merge_asked(node, fh, g.grant, false).is_err());
}

#[test]
fn a_forged_log_is_refused_its_valid_prefix_merged_and_no_other_file_touched() {
    let areas = Arc::new(MemAreas::default());
    let e = engine(&areas);
    let (other, other_fh) = file(&e, "other", b"untouched");
    let (node, fh) = file(&e, "f", b"");
    let g = e.grant(node, fh, CALLER).unwrap();
    let mut lib = Library::new(areas.last(), &g);
    assert!(lib.write(0, b"good "));
    assert!(lib.write(5, b"prefix"));
    // A record under the right commit word with a wrong checksum, then a valid-looking one.
    let mut forged = Vec::new();
    forged.extend_from_slice(&direct::log::commit_tag(g.grant, lib.next_seq).to_le_bytes());
    forged.extend_from_slice(&0u64.to_le_bytes());
    forged.extend_from_slice(&4u32.to_le_bytes());
    forged.extend_from_slice(&[1, 0, 0, 0]);
    forged.extend_from_slice(&1u64.to_le_bytes());
    forged.extend_from_slice(b"EVIL");
    lib.area.write(lib.at, &forged);
    let t = e.take_back(node, TakeBack::Getattr).unwrap();
    assert!(matches!(t, TakenBack::Ended { .. }), "{t:?}");
    e.release(fh).unwrap();
    e.release(other_fh).unwrap();
    assert_eq!(contents(&e, "f"), b"good prefix");
    assert_eq!(contents(&e, "other"), b"untouched");
    let _ = other;
    let s = e.stats();
    assert_eq!((s.direct.refused_logs, s.direct.taken_back["refused_log"]), (1, 1));
    assert_eq!(s.incidents["direct_refused_log"], 1);
    // A header rewritten to name another delegation is refused as a whole.
    let (node, fh) = file(&e, "g", b"");
    let g = e.grant(node, fh, CALLER).unwrap();
    let area = areas.last();
    direct::format(&*area, direct::LogHeader { grant: g.grant + 1, node, base: 1 }).unwrap();
    assert!(matches!(e.take_back(node, TakeBack::Open).unwrap(), TakenBack::Ended { .. }));
    assert_eq!(e.stats().direct.refused_logs, 2);
}

#[test]
fn a_library_thread_stuck_inside_an_append_bounds_the_wait_and_its_record_is_not_lost() {
    let areas = Arc::new(MemAreas::default());
    let e = engine(&areas);
    let (node, fh) = file(&e, "f", b"");
    let g = e.grant(node, fh, CALLER).unwrap();
    let lib = Library::new(areas.last(), &g);
    // Inside (writers = 1) with its record committed, then stopped before leaving.
    control::enter(&*lib.area).unwrap();
    let mut writer = LogWriter::resume(&*lib.area, g.grant, lib.at, lib.next_seq);
    let seq = writer.append(RecordKind::Write, 0, b"stuck").unwrap();
    let taken = e.take_back(node, TakeBack::Open).unwrap();
    assert!(matches!(taken, TakenBack::Ended { .. }));
    let stats = e.stats().direct;
    assert_eq!(stats.wait_timeouts, 1);
    assert!(stats.take_back_wait_us >= 100, "{}", stats.take_back_wait_us);
    // When it leaves it sees the merge began, and the merged word says its record is in.
    assert!(!control::leave(&*lib.area));
    assert_eq!(control::settled(&*lib.area, &mut || false), Some(seq));
    e.release(fh).unwrap();
    assert_eq!(contents(&e, "f"), b"stuck");
}

#[test]
fn an_open_registered_after_the_grant_takes_it_back_and_one_before_refuses_it() {
    let areas = Arc::new(MemAreas::default());
    let e = engine(&areas);
    let (node, fh) = file(&e, "f", b"");
    let g = e.grant(node, fh, CALLER).unwrap();
    let mut lib = Library::new(areas.last(), &g);
    assert!(lib.write(0, b"before the open"));
    // The front end's order: the open registers, then the take-back (DG1).
    let second = e.open(node, libc::O_RDONLY).unwrap();
    assert!(e.delegated(node));
    assert!(matches!(e.take_back(node, TakeBack::Open).unwrap(), TakenBack::Ended { .. }));
    let mut out = Vec::new();
    e.read(second, 0, 100, |d| out.extend_from_slice(d)).unwrap();
    assert_eq!(out, b"before the open");
    // And with the second open still there, no grant.
    assert_eq!(errno(&e.grant(node, fh, CALLER).unwrap_err()), libc::EBUSY);
    e.release(second).unwrap();
    assert!(e.grant(node, fh, CALLER).is_ok(), "the only open again");
    e.take_back_all();
    e.release(fh).unwrap();
    assert_eq!(e.stats().direct.taken_back["unmount"], 1);
}
