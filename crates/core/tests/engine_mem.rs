//! The engine over the in-memory lower file system: every request passes through to
//! `MemLower` inside a transaction, answers are the lower's, and what the application fsynced
//! through the engine survives a crash of the lower file system while the rest does not.

use std::ffi::OsStr;
use std::sync::Arc;

use engine::{Engine, EngineConfig, FsError};
use lower::{Creds, Errno, FileKind, LowerFs, MemLower, SetAttr};
use txn::{Consistency, Pool};

const ROOT: Creds = Creds { uid: 0, gid: 0, groups: Vec::new() };

fn pool() -> Pool {
    let params = txn::testkit::sweep_params();
    let region = Arc::new(nvram::SimRegion::new(params.region_size));
    Pool::format(&*region, params).unwrap();
    Pool::open(region, Consistency::None).unwrap().0
}

/// Tempfiles and the page cache off, and `--consistency none` (no metadata journal): these
/// tests are about passing through to the lower file system - through the engine, so no open
/// takes kernel passthrough (the mount's default).
fn passthrough() -> EngineConfig {
    EngineConfig {
        temp: engine::TempConfig { enabled: false, ..engine::TempConfig::default() },
        cache: engine::CacheConfig { enabled: false, ..engine::CacheConfig::default() },
        passthrough: false,
        ..EngineConfig::default()
    }
}

fn name(s: &str) -> &OsStr {
    OsStr::new(s)
}

fn list(engine: &Engine<MemLower>, dir: u64) -> Vec<(String, Option<FileKind>)> {
    let fh = engine.opendir(dir).unwrap();
    let mut out = Vec::new();
    engine
        .readdir(fh, 0, &mut |e| {
            out.push((e.name.into_string().unwrap(), e.kind));
            true
        })
        .unwrap();
    engine.releasedir(fh).unwrap();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[test]
fn the_engine_runs_over_mem_lower_and_fsync_decides_what_survives_a_crash() {
    let lower = MemLower::default();
    // A second handle to the same file system: the engine owns the first.
    let handle = lower.clone();
    let engine = Engine::new(lower, pool(), passthrough()).unwrap();
    let root = engine.root_id();

    let (f, fh) = engine.create(&ROOT, root, name("f"), 0o644, libc::O_RDWR).unwrap();
    assert_eq!(engine.write(fh, 0, b"fsynced", false).unwrap(), 7);
    engine.fsync(fh, false).unwrap();
    let (g, gh) = engine.create(&ROOT, root, name("g"), 0o644, libc::O_RDWR).unwrap();
    engine.write(gh, 0, b"never fsynced", false).unwrap();
    let d = engine.mkdir(&ROOT, root, name("d"), 0o755).unwrap();
    engine.symlink(&ROOT, d.node_id, name("s"), name("../f")).unwrap();
    engine.link(f.node_id, d.node_id, name("f2")).unwrap();
    assert_eq!(engine.getattr(f.node_id).unwrap().nlink, 2);
    let mut got = Vec::new();
    engine.read(fh, 0, 100, |data| got.extend_from_slice(data)).unwrap();
    assert_eq!(got, b"fsynced");
    assert_eq!(
        list(&engine, root),
        [
            (".".into(), Some(FileKind::Directory)),
            ("..".into(), Some(FileKind::Directory)),
            ("d".into(), Some(FileKind::Directory)),
            ("f".into(), Some(FileKind::Regular)),
            ("g".into(), Some(FileKind::Regular)),
        ]
    );
    // The lower's errors pass through unchanged, and a failed operation is counted as such.
    let err = engine.mkdir(&ROOT, root, name("d"), 0o755).unwrap_err();
    assert!(matches!(err, FsError::Lower(Errno(libc::EEXIST))), "{err:?}");
    let err = engine.rename(root, name("d"), d.node_id, name("x"), 0).unwrap_err();
    assert!(matches!(err, FsError::Lower(Errno(libc::EINVAL))), "{err:?}");
    let set = SetAttr { size: Some(3), ..SetAttr::default() };
    assert_eq!(engine.setattr(g.node_id, Some(gh), &set, false).unwrap().size, 3);

    // Names become durable with fsyncdir of the root, through the engine.
    let dh = engine.opendir(root).unwrap();
    engine.fsyncdir(dh, false).unwrap();
    engine.releasedir(dh).unwrap();
    engine.write(fh, 0, b"FSYNCED, then changed", false).unwrap();

    let after = handle.crash();
    let read = |path: &str| {
        let (node, attr) = after.lookup(after.root(), name(path)).unwrap();
        let file = after.open(&node, libc::O_RDONLY).unwrap();
        let mut buf = vec![0u8; attr.size as usize];
        after.read(&file, 0, &mut buf).unwrap();
        buf
    };
    assert_eq!(read("f"), b"fsynced", "fsynced data, not the later write");
    assert_eq!(read("g"), b"", "the name survived, the data was never fsynced");
    let (dnode, _) = after.lookup(after.root(), name("d")).unwrap();
    assert_eq!(
        after.lookup(&dnode, name("s")).unwrap_err(),
        Errno(libc::ENOENT),
        "d was never fsynced: its entries are gone"
    );
    assert_eq!(after.lookup(after.root(), name("f")).unwrap().1.nlink, 1, "recounted");

    // The engine carries on over the live file system.
    engine.release(fh).unwrap();
    engine.release(gh).unwrap();
    engine.unlink(root, name("g")).unwrap();
    assert_eq!(engine.lookup(root, name("g")).unwrap_err().to_string(), {
        FsError::Lower(Errno(libc::ENOENT)).to_string()
    });
    // Passing through changes no NVRAM state, so no transaction was needed; the failed
    // operations are counted as errors.
    let stats = engine.stats();
    assert_eq!(stats.nvram.transactions_committed + stats.nvram.transactions_aborted, 0);
    assert!(stats.errors.values().sum::<u64>() >= 3, "{:?}", stats.errors);
    engine.shutdown();
}

#[test]
fn an_engine_over_a_crash_image_sees_the_durable_tree() {
    let lower = MemLower::default();
    let handle = lower.clone();
    let engine = Engine::new(lower, pool(), passthrough()).unwrap();
    let root = engine.root_id();
    let d = engine.mkdir(&ROOT, root, name("d"), 0o755).unwrap();
    let (_, fh) = engine.create(&ROOT, d.node_id, name("f"), 0o600, libc::O_RDWR).unwrap();
    engine.write(fh, 0, b"data", false).unwrap();
    engine.fsync(fh, false).unwrap();
    engine.release(fh).unwrap();
    handle.sync_all();
    engine.shutdown();

    let remounted = Engine::new(handle.crash(), pool(), passthrough()).unwrap();
    let root = remounted.root_id();
    let d = remounted.lookup(root, name("d")).unwrap();
    let f = remounted.lookup(d.node_id, name("f")).unwrap();
    assert_eq!((f.attr.size, f.attr.mode & 0o777), (4, 0o600));
    let fh = remounted.open(f.node_id, libc::O_RDONLY).unwrap();
    let mut got = Vec::new();
    remounted.read(fh, 0, 10, |data| got.extend_from_slice(data)).unwrap();
    assert_eq!(got, b"data");
    remounted.release(fh).unwrap();
    remounted.shutdown();
}

/// Start-up reads the region's frames against the one table of frame kinds
/// (`base/frames.rs`): a frame of a kind no room writes (another program's region, or damage)
/// refuses the start, naming the frame and its kind, before anything changes the region.
#[test]
fn a_region_holding_a_frame_of_an_unknown_kind_is_refused_naming_it() {
    let pool = pool();
    let mut tx = pool.begin();
    let frame = tx.alloc_frame(txn::FrameTag { kind: 0xde30, owner: 0, index: 0 }).unwrap();
    tx.commit();
    let err = Engine::new(MemLower::default(), pool, passthrough()).unwrap_err().to_string();
    assert!(err.contains("0xde30") && err.contains(&format!("frame {}", frame.0)), "{err}");
    // Every kind of the table is known: the check passes a region holding them all.
    let pool = self::pool();
    let mut tx = pool.begin();
    for k in engine::base::frames::KINDS {
        tx.alloc_frame(txn::FrameTag { kind: k.kind, owner: 0, index: 0 }).unwrap();
    }
    tx.commit();
    engine::base::frames::check_known(&pool).unwrap();
}
