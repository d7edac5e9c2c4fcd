//! The `nvstack` command as users and scripts see it: messages, exit codes, files.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;

use nvram::layout::{FORMAT_VERSION, Layout, PAGE_SIZE};
use nvram::{MmapOptions, MmapRegion, Region};
use txn::{Consistency, FrameTag, Pool};

fn nvstack(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_nvstack")).args(args).output().expect("run nvstack")
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn shm() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("nvstack-cli-test").tempdir_in("/dev/shm").unwrap()
}

fn format(path: &Path) -> Output {
    nvstack(&["format", "--nvram", path.to_str().unwrap(), "--size", "8M", "--undo-slots", "2"])
}

fn check_once(path: &Path) -> Output {
    nvstack(&["check", "--nvram", path.to_str().unwrap()])
}

/// Tests run in parallel threads: a child another thread forks holds copies of this process's
/// descriptors - with their region locks - until it execs, so a region just closed can look
/// in use for a moment. Anything that locks a region retries that for a bounded time.
const IN_USE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

fn check(path: &Path) -> Output {
    let start = std::time::Instant::now();
    loop {
        let out = check_once(path);
        if !text(&out).contains("is in use by another nvstack") || start.elapsed() > IN_USE_WAIT {
            return out;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

fn open_region(path: &Path, options: MmapOptions) -> MmapRegion {
    let start = std::time::Instant::now();
    loop {
        match MmapRegion::open(path, options) {
            Err(nvram::Error::InUse { .. }) if start.elapsed() < IN_USE_WAIT => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            other => return other.unwrap(),
        }
    }
}

/// A region formatted in `dir` and opened.
fn formatted(dir: &Path) -> (PathBuf, Pool) {
    let path = dir.join("region");
    assert!(format(&path).status.success());
    let region: Arc<dyn Region> = Arc::new(open_region(&path, MmapOptions::default()));
    let (pool, _) = Pool::open(region, Consistency::Undo).unwrap();
    (path, pool)
}

/// A region with one committed frame and one transaction that never ended (the process "died").
fn region_with_unfinished_transaction(dir: &Path) -> PathBuf {
    let (path, pool) = formatted(dir);
    let mut tx = pool.begin();
    let frame = tx.alloc_frame(FrameTag { kind: 1, owner: 1, index: 0 }).unwrap();
    tx.write(pool.frame_offset(frame), b"committed");
    tx.commit();
    let mut tx = pool.begin();
    tx.update(pool.frame_offset(frame), b"in flight").unwrap();
    std::mem::forget(tx); // like a crash: the slot keeps its records
    drop(pool); // no close: the region stays marked unclean, its lock is released
    path
}

fn flip_byte(path: &Path, off: u64) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[off as usize] ^= 0x10;
    std::fs::write(path, bytes).unwrap();
}

fn layout_of(path: &Path) -> Layout {
    let options = MmapOptions { read_only: true, ..MmapOptions::default() };
    Layout::read(&open_region(path, options)).unwrap()
}

#[test]
fn format_creates_a_private_region_that_checks_consistent() {
    use std::os::unix::fs::PermissionsExt;
    let dir = shm();
    let path = dir.path().join("region");
    let out = format(&path);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("formatted"));
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    let out = check(&path);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("consistent (clean shutdown)"), "{}", text(&out));
}

#[test]
fn format_over_an_existing_region_needs_force() {
    let dir = shm();
    let path = dir.path().join("region");
    assert!(format(&path).status.success());
    let out = format(&path);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out).contains("already holds an nvstack region") && text(&out).contains("--force")
    );
    let out = nvstack(&[
        "format",
        "--nvram",
        path.to_str().unwrap(),
        "--size",
        "8M",
        "--undo-slots",
        "2",
        "--force",
    ]);
    assert!(out.status.success(), "{}", text(&out));
}

#[test]
fn format_over_another_file_needs_force() {
    let dir = shm();
    let path = dir.path().join("precious.txt");
    std::fs::write(&path, "not a region").unwrap();
    let out = format(&path);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out).contains("not an nvstack region"), "{}", text(&out));
    assert_eq!(std::fs::read(&path).unwrap(), b"not a region");
}

#[test]
fn a_too_small_size_is_refused_with_the_minimum_and_no_file_is_made() {
    let dir = shm();
    let path = dir.path().join("region");
    let out = nvstack(&["format", "--nvram", path.to_str().unwrap(), "--size", "64K"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out).contains("too small") && text(&out).contains("minimum"), "{}", text(&out));
    assert!(!path.exists());
    let out = nvstack(&["format", "--nvram", path.to_str().unwrap(), "--size", "12Q"]);
    assert_eq!(out.status.code(), Some(2), "clap usage error");
}

#[test]
fn check_reports_an_unfinished_transaction_as_recoverable_without_changing_the_file() {
    let dir = shm();
    let path = region_with_unfinished_transaction(dir.path());
    let before = std::fs::read(&path).unwrap();
    let out = check(&path);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("recoverable") && text(&out).contains("1 unfinished"),
        "{}",
        text(&out)
    );
    assert!(std::fs::read(&path).unwrap() == before, "check wrote to the region");
}

#[test]
fn check_names_the_damaged_area_and_exits_4() {
    let dir = shm();
    let path = region_with_unfinished_transaction(dir.path());
    let layout = layout_of(&path);
    let pristine = std::fs::read(&path).unwrap();
    let cases = [
        (100, "superblock"),
        (PAGE_SIZE + 2, "state word"),
        (layout.slot_offset(0) + 64 + 40, "undo log slot 0"),
        (layout.desc_offset + 5, "frame descriptor 0"),
        (layout.desc_offset + 32 * 7 + 1, "frame descriptor 7"),
    ];
    for (off, area) in cases {
        std::fs::write(&path, &pristine).unwrap();
        flip_byte(&path, off);
        let out = check(&path);
        assert_eq!(out.status.code(), Some(4), "{area}: {}", text(&out));
        assert!(
            text(&out).contains("DAMAGED") && text(&out).contains(area),
            "{area}: {}",
            text(&out)
        );
        let out = nvstack(&["inspect", "--nvram", path.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(4), "inspect of damaged {area}: {}", text(&out));
    }
}

#[test]
fn a_region_of_a_newer_format_is_refused_with_a_clear_message() {
    let dir = shm();
    let path = dir.path().join("region");
    assert!(format(&path).status.success());
    let newer = Layout { version: FORMAT_VERSION + 1, ..layout_of(&path) };
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[..PAGE_SIZE as usize].copy_from_slice(&newer.encode());
    std::fs::write(&path, bytes).unwrap();
    let out = check(&path);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out).contains("newer nvstack"), "{}", text(&out));
}

#[test]
fn inspect_json_reports_layout_usage_and_busy_slots() {
    let dir = shm();
    let path = region_with_unfinished_transaction(dir.path());
    let out = nvstack(&["inspect", "--nvram", path.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["layout"]["undo_slots"], 2);
    assert_eq!(v["frames_used"], 1);
    assert_eq!(v["undo_slots_in_use"], 1);
    assert_eq!(v["state"]["clean"], false);
    assert_eq!(v["in_use"], false);
    let human = nvstack(&["inspect", "--nvram", path.to_str().unwrap()]);
    assert!(text(&human).contains("undo slots  1 in use"), "{}", text(&human));
}

#[test]
fn a_region_in_use_is_not_checked_or_reformatted() {
    let dir = shm();
    let path = dir.path().join("region");
    assert!(format(&path).status.success());
    let _held = open_region(&path, MmapOptions::default());
    let out = check_once(&path);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out).contains("in use"), "{}", text(&out));
    let out = nvstack(&[
        "format",
        "--nvram",
        path.to_str().unwrap(),
        "--size",
        "8M",
        "--undo-slots",
        "2",
        "--force",
    ]);
    assert!(text(&out).contains("in use"), "{}", text(&out));
    let out = nvstack(&["inspect", "--nvram", path.to_str().unwrap()]);
    assert!(out.status.success() && text(&out).contains("in use by a running nvstack"));
}

#[test]
fn the_demo_runs_and_recovers() {
    let out = nvstack(&["demo"]);
    assert!(out.status.success(), "{}", text(&out));
    let t = text(&out);
    assert!(t.contains("rolled back 1 transaction"), "{t}");
    assert!(t.contains("message: \"transaction A: committed"), "{t}");
    assert!(t.contains("every one showed exactly the last committed state"), "{t}");
}

/// A region holding two metadata-journal records packed in one frame (as a daemon that died
/// before its checkpoint leaves them); returns the region offset of the second and its slot.
fn region_with_journal_records(dir: &Path) -> (PathBuf, u64, usize) {
    use engine::journal::record::{FRAME_SIZE, KIND_REDO, Op, Redo, SLOT_SIZE};
    let (path, pool) = formatted(dir);
    let mut frame_bytes = vec![0u8; FRAME_SIZE];
    let mut slot = 0;
    let mut second = 0;
    for (seq, op, name) in [(7, Op::Mkdir, "spool"), (8, Op::Create, "message")] {
        let mut redo = Redo::new(op);
        redo.seq = seq;
        redo.dir1 = vec![1; 12];
        redo.object = vec![seq as u8; 12];
        redo.name1 = name.into();
        let bytes = redo.encode();
        frame_bytes[slot * SLOT_SIZE..slot * SLOT_SIZE + bytes.len()].copy_from_slice(&bytes);
        second = slot;
        slot += redo.slots();
    }
    let mut tx = pool.begin();
    let frame = tx.alloc_frame(FrameTag { kind: KIND_REDO, owner: 0, index: 0 }).unwrap();
    let offset = pool.frame_offset(frame);
    tx.write(offset, &frame_bytes);
    tx.commit();
    drop(pool);
    (path, offset + (second * SLOT_SIZE) as u64, second)
}

#[test]
fn check_and_inspect_list_journal_records_and_refuse_a_damaged_one_naming_its_frame() {
    let dir = shm();
    let (path, offset, slot) = region_with_journal_records(dir.path());
    assert_eq!(slot, 1, "the mkdir takes 1 slot (with room for replay's note), the create follows");
    let out = check(&path);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("2 metadata-journal record(s), sequence 7 to 8"), "{}", text(&out));
    let out = nvstack(&["inspect", "--nvram", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let listed = text(&out);
    assert!(listed.contains("mkdir") && listed.contains("spool"), "{listed}");
    assert!(listed.contains("create") && listed.contains("message"), "{listed}");
    assert!(listed.contains("slot 1"), "{listed}");

    // A flipped bit in the second record's name (after its 96-byte header and two 12-byte
    // handles): refused, the frame and slot named, never replayed.
    let layout = layout_of(&path);
    let frame = (offset - layout.frames_offset) / PAGE_SIZE;
    flip_byte(&path, offset + 96 + 24 + 2);
    let out = check(&path);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    let t = text(&out);
    assert!(
        t.contains("DAMAGED") && t.contains(&format!("frame {frame}")) && t.contains("slot 1"),
        "{t}"
    );
    let out = nvstack(&["inspect", "--nvram", path.to_str().unwrap()]);
    assert!(text(&out).contains(&format!("frame {frame}")), "{}", text(&out));
}

/// M6: a slot of a journal frame that is neither part of a record nor zero is damage (a
/// stale byte there could otherwise be read as the start of a record).
#[test]
fn check_refuses_a_journal_frame_with_a_stray_byte_between_records() {
    let dir = shm();
    let (path, offset, _) = region_with_journal_records(dir.path());
    // Slot 4: after the create (slot 1), in the zeroed rest of the frame.
    flip_byte(&path, offset + 3 * 256 + 17);
    let out = check(&path);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert!(text(&out).contains("slot 4"), "{}", text(&out));
}

/// A region written by a version with one journal record per frame is refused with what to do,
/// not read as the packed format (its records would be lost).
#[test]
fn check_refuses_a_journal_frame_of_the_earlier_format_saying_what_to_do() {
    use engine::journal::record::KIND_REDO_V1;
    let dir = shm();
    let (path, pool) = formatted(dir.path());
    let mut tx = pool.begin();
    let frame = tx.alloc_frame(FrameTag { kind: KIND_REDO_V1, owner: 0, index: 0 }).unwrap();
    tx.write(pool.frame_offset(frame), &[0x4e; 64]);
    tx.commit();
    drop(pool);
    let out = check(&path);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert!(text(&out).contains("earlier one-record-per-frame format"), "{}", text(&out));
}

/// A block cache (`device attach --nvram`) made through the device library: sectors 8 and 9 of
/// a 1 MiB image, the region left unclosed as a power cut would leave it.
fn block_cache_region(dir: &Path) -> (PathBuf, PathBuf) {
    use device::classify::Class;
    use device::nvcache::{Backing, ImageId};
    struct Nowhere;
    impl Backing for Nowhere {
        fn write_durable(&mut self, _: u64, _: &[u8]) -> std::io::Result<()> {
            panic!("nothing is destaged in this test")
        }
    }
    let image = dir.join("disk.img");
    std::fs::write(&image, vec![0u8; 1 << 20]).unwrap();
    let path = dir.join("cache.nv");
    let id = ImageId::of(&image).unwrap();
    let (mut cache, report) = device::nvcache::open_file(&path, &id, Some(64), None).unwrap();
    assert!(report.created);
    let (a, b) = (vec![1u8; 512], vec![2u8; 512]);
    cache
        .absorb(&[(8, &a[..], Class::ExtInodeTable), (9, &b[..], Class::ExtJournal)], &mut Nowhere)
        .unwrap();
    drop(cache); // not closed: a power cut after the commit
    (path, image)
}

#[test]
fn check_and_inspect_list_and_verify_a_block_cache() {
    let dir = shm();
    let (path, image) = block_cache_region(dir.path());
    let out = check(&path);
    assert!(out.status.success(), "{}", text(&out));
    let t = text(&out);
    assert!(t.contains("block cache of"), "{t}");
    assert!(t.contains("2 sector(s) cached and verified, LBN 8..=9"), "{t}");
    assert!(t.contains("ext.inode_table 1") && t.contains("ext.journal 1"), "{t}");
    let out = nvstack(&["inspect", "--nvram", path.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let b = &v["block_cache"];
    assert_eq!(b["sectors_resident"], 2, "{b}");
    assert_eq!(b["capacity_sectors"], 64);
    assert_eq!(b["mode"], "metadata");
    assert_eq!(b["image"]["path"], image.canonicalize().unwrap().to_str().unwrap());
    assert_eq!(b["sectors"][0]["lbn"], 8);
    assert_eq!(b["sectors"][1]["class"], "ext.journal");
    let frame = b["sectors"][1]["frame"].as_u64().unwrap();
    let slot = b["sectors"][1]["slot"].as_u64().unwrap();
    let human = text(&nvstack(&["inspect", "--nvram", path.to_str().unwrap()]));
    assert!(human.contains("block-cache frames"), "{human}");
    assert!(human.contains("2 of 64 sectors cached"), "{human}");
    // A flipped bit in the cached sector of LBN 9: refused, the frame named, exit 4.
    let layout = layout_of(&path);
    flip_byte(&path, layout.frame_offset(frame) + 512 * slot + 17);
    for args in [vec!["check"], vec!["inspect"]] {
        let mut a = args.clone();
        a.extend(["--nvram", path.to_str().unwrap()]);
        let out = nvstack(&a);
        assert_eq!(out.status.code(), Some(4), "{args:?}: {}", text(&out));
        assert!(text(&out).contains(&format!("frame {frame}: slot {slot}")), "{}", text(&out));
    }
    // A region of a plain format has no block cache: nothing is said about one.
    let plain = dir.path().join("plain");
    assert!(format(&plain).status.success());
    assert!(!text(&check(&plain)).contains("block cache"));
}

/// A region holding one cached file with patches on its pages 1 and 2, packed in one patch
/// frame (slots 0-0 and 1-1); the frame's offset.
fn region_with_patches(dir: &Path) -> (PathBuf, u64) {
    use engine::cache::patch::{KIND_PATCHES, Merged, Patch, SLOT};
    use engine::cache::record::{KIND_RECORD, Record};
    let (path, pool) = formatted(dir);
    let rec = Record {
        size: 3 * 4096,
        valid: 3 * 4096,
        mtime: (1, 0),
        ctime: (1, 0),
        serial: 1,
        handle: vec![7; 12],
    };
    let mut frame_bytes = vec![0u8; 4096];
    for (page, slot, bytes) in [(1, 0, &b"patched bytes"[..]), (2, 1, &b"more bytes"[..])] {
        let Merged::Patch(p) = Patch::new(page).merge(100, bytes, 4096) else {
            panic!("a small write is a patch")
        };
        assert_eq!(p.slots(), 1);
        frame_bytes[slot * SLOT..(slot + 1) * SLOT].copy_from_slice(&p.encode());
    }
    let mut tx = pool.begin();
    let object = tx.alloc_frame(FrameTag { kind: KIND_RECORD, owner: 0, index: 0 }).unwrap();
    tx.write(pool.frame_offset(object), &rec.encode());
    let frame = tx.alloc_frame(FrameTag { kind: KIND_PATCHES, owner: object.0, index: 0 }).unwrap();
    tx.write(pool.frame_offset(frame), &frame_bytes);
    tx.commit();
    let offset = pool.frame_offset(frame);
    drop(pool);
    (path, offset)
}

#[test]
fn check_and_inspect_list_patches_and_refuse_a_damaged_one_naming_its_frame() {
    let dir = shm();
    let (path, offset) = region_with_patches(dir.path());
    let out = check(&path);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("0 dirty page(s) and 2 patch(es)"), "{}", text(&out));
    let out = nvstack(&["inspect", "--nvram", path.to_str().unwrap()]);
    assert!(text(&out).contains("slots  0+1  file record in frame"), "{}", text(&out));
    assert!(text(&out).contains("page 1: 1 range(s), 13 B"), "{}", text(&out));
    assert!(text(&out).contains("slots  1+1  file record in frame"), "{}", text(&out));
    assert!(text(&out).contains("page 2: 1 range(s), 10 B"), "{}", text(&out));
    let layout = layout_of(&path);
    let frame = (offset - layout.frames_offset) / PAGE_SIZE;
    // A byte of the second patch's data (slot 1).
    flip_byte(&path, offset + 64 + 40);
    let out = check(&path);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert!(
        text(&out).contains("DAMAGED") && text(&out).contains(&format!("frame {frame}: slot 1")),
        "{}",
        text(&out)
    );
}
