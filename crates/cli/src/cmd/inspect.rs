//! `nvstack inspect`: print a region's superblock, areas and usage without changing it.

use std::path::PathBuf;

use nvram::{MmapOptions, MmapRegion};

use crate::error::CliResult;
use crate::size::human;

#[derive(Debug, clap::Args)]
pub struct InspectArgs {
    /// The region file.
    #[arg(long, value_name = "PATH")]
    pub nvram: PathBuf,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &InspectArgs) -> CliResult {
    let in_use = nvram::is_in_use(&args.nvram)?;
    // A read-only mapping without the lock: inspecting a mounted region is allowed, its numbers
    // are then a racy snapshot (said in the output).
    let region = open_unlocked(&args.nvram)?;
    let report = txn::inspect(&region)?;
    let temps = temp_files(&args.nvram);
    let cached = cached_files(&args.nvram);
    let dir_times = dir_times(&args.nvram);
    let journal = journal_records(&args.nvram);
    let profile = route_profile(&args.nvram);
    let blocks = block_cache(&args.nvram);
    if args.json {
        let mut value = serde_json::to_value(&report).expect("inspection serialises");
        value["in_use"] = serde_json::Value::Bool(in_use);
        value["tempfiles"] = temps_json(&temps);
        value["cache"] = cached_json(&cached);
        value["dir_times"] = dir_times_json(&dir_times);
        value["journal"] = journal_json(&journal);
        value["route_profile"] = profile_json(&profile);
        value["block_cache"] = block_cache_json(&blocks);
        value["path"] = serde_json::Value::String(args.nvram.display().to_string());
        println!("{}", serde_json::to_string_pretty(&value).expect("json"));
        return Ok(());
    }
    let l = &report.layout;
    println!(
        "region      {}{}",
        args.nvram.display(),
        if in_use { " (in use by a running nvstack: values may change)" } else { "" }
    );
    println!("format      version {}, uuid {}", l.version, l.uuid);
    println!("size        {} ({} bytes)", human(l.region_size), l.region_size);
    println!(
        "state       {}, mounted {} time(s)",
        if report.state.clean { "clean" } else { "not clean (in use, or not shut down cleanly)" },
        report.state.mount_count
    );
    println!("areas       offset        size");
    println!("  superblock  {:>10}  {:>10}", 0, human(4096));
    println!("  state word  {:>10}  {:>10}", 4096, "8 B");
    println!("  root        {:>10}  {:>10}", 8192, human(4096));
    println!(
        "  undo log    {:>10}  {:>10}  ({} slots x {})",
        l.undo_offset,
        human(u64::from(l.undo_slots) * l.undo_slot_size),
        l.undo_slots,
        human(l.undo_slot_size)
    );
    println!("  descriptors {:>10}  {:>10}", l.desc_offset, human(l.desc_bytes));
    println!(
        "  frames      {:>10}  {:>10}  ({} x 4 KiB)",
        l.frames_offset,
        human(l.nr_frames * 4096),
        l.nr_frames
    );
    println!(
        "frames      {} used, {} free of {}",
        report.frames_used, report.frames_free, report.frames_total
    );
    for (kind, n) in &report.frames_by_kind {
        let what = frame_kind_name(*kind);
        println!("  kind {kind:<#12x} {n:<10} {what}");
    }
    let busy: Vec<String> = report
        .undo_slot_used
        .iter()
        .enumerate()
        .filter(|(_, u)| **u > 0)
        .map(|(i, u)| format!("slot {i}: {}", human(*u)))
        .collect();
    println!(
        "undo slots  {} in use{}",
        report.undo_slots_in_use,
        if busy.is_empty() { String::new() } else { format!(" ({})", busy.join(", ")) }
    );
    println!("root area   {} bytes used", report.root_area_bytes_used);
    print_temps(&temps);
    print_cached(&cached);
    print_dir_times(&dir_times);
    print_journal(&journal);
    print_profile(&profile);
    print_block_cache(&blocks);
    // Damage found by the block-cache scan refuses like `check` (exit 4, the frame named); a
    // region in use is only a racy snapshot, reported above.
    match blocks {
        Err(e @ crate::error::CliError::Region(nvram::Error::Corrupt { .. })) => Err(e),
        _ => Ok(()),
    }
}

/// The block cache as the next attach will see it (recovery on a copy-on-write view).
fn block_cache(path: &std::path::Path) -> CliResult<Option<device::nvcache::Scan>> {
    let (pool, _) = super::dry_open(path)?;
    device::nvcache::scan(&pool).map_err(super::block_cache_error)
}

fn block_cache_json(b: &CliResult<Option<device::nvcache::Scan>>) -> serde_json::Value {
    match b {
        Ok(None) => serde_json::Value::Null,
        Ok(Some(b)) => serde_json::json!({
            "image": b.image,
            "mode": b.mode,
            "capacity_sectors": b.capacity_sectors,
            "frames": b.frames,
            "sectors_resident": b.sectors.len(),
            "bytes_resident": b.sectors.len() * 512,
            "lbn_min": b.sectors.first().map(|s| s.lbn),
            "lbn_max": b.sectors.last().map(|s| s.lbn),
            "by_class": b.by_class(),
            "sectors": b.sectors.iter().take(MAX_LISTED).collect::<Vec<_>>(),
        }),
        Err(e) => serde_json::json!({ "error": e.to_string() }),
    }
}

fn print_block_cache(b: &CliResult<Option<device::nvcache::Scan>>) {
    match b {
        Ok(None) => {}
        Ok(Some(b)) => {
            println!(
                "block cache image {} ({}, device {:#x}, inode {}), mode {}",
                b.image.path,
                human(b.image.size_bytes),
                b.image.dev,
                b.image.ino,
                b.mode.as_str()
            );
            println!(
                "            {} of {} sectors cached ({}) in {} frames{}",
                b.sectors.len(),
                b.capacity_sectors,
                human(b.sectors.len() as u64 * 512),
                b.frames,
                super::block_cache_summary(b)
            );
            for s in b.sectors.iter().take(20) {
                println!(
                    "  LBN {:<12} seq {:<10} {:<18} frame {} slot {}",
                    s.lbn, s.seq, s.class, s.frame, s.slot
                );
            }
            if b.sectors.len() > 20 {
                println!("  ... ({} more; --json lists up to {MAX_LISTED})", b.sectors.len() - 20);
            }
        }
        Err(e) => println!("block cache unreadable: {e}"),
    }
}

fn temps_json(temps: &CliResult<Vec<engine::tempfs::Found>>) -> serde_json::Value {
    match temps {
        Ok(list) => serde_json::json!(
            list.iter()
                .take(MAX_LISTED)
                .map(|t| serde_json::json!({
                    "serial": t.rec.serial,
                    "record": t.place.describe(),
                    "name": t.rec.name.to_string_lossy(),
                    "state": format!("{:?}", t.rec.state).to_lowercase(),
                    "size": t.rec.size,
                    "pages": t.pages.len(),
                    "nlink": t.rec.nlink,
                    "shadows": t.rec.shadows(),
                    "mode": format!("{:o}", t.rec.mode),
                    "uid": t.rec.uid,
                    "gid": t.rec.gid,
                }))
                .collect::<Vec<_>>()
        ),
        Err(e) => serde_json::json!({ "error": e.to_string() }),
    }
}

fn print_temps(temps: &CliResult<Vec<engine::tempfs::Found>>) {
    match temps {
        Ok(list) => {
            let pages: usize = list.iter().map(|t| t.pages.len()).sum();
            println!("temp files  {} in NVRAM ({pages} data pages)", list.len());
            for t in list.iter().take(20) {
                println!(
                    "  #{:<6} {:>10} B  {:<12} {}",
                    t.rec.serial,
                    t.rec.size,
                    format!("{:?}", t.rec.state).to_lowercase(),
                    if t.rec.nlink == 0 {
                        "(unlinked, open at the crash)".to_string()
                    } else {
                        t.rec.name.to_string_lossy().into_owned()
                    }
                );
            }
            if list.len() > 20 {
                println!("  ... ({} more; --json lists up to {MAX_LISTED})", list.len() - 20);
            }
        }
        Err(e) => println!("temp files  unreadable: {e}"),
    }
}

/// Most temp files `--json` lists.
const MAX_LISTED: usize = 10_000;

/// The temp files as the next mount will see them: recovery runs on a copy-on-write view.
fn temp_files(path: &std::path::Path) -> CliResult<Vec<engine::tempfs::Found>> {
    let (pool, _) = super::dry_open(path)?;
    Ok(engine::tempfs::scan(&pool)?)
}

/// The page cache's records as the next mount will see them (the files themselves are found
/// by handle only when mounted).
fn cached_files(path: &std::path::Path) -> CliResult<Vec<engine::cache::Found>> {
    let (pool, _) = super::dry_open(path)?;
    Ok(engine::cache::scan(&pool)?)
}

fn cached_json(cached: &CliResult<Vec<engine::cache::Found>>) -> serde_json::Value {
    match cached {
        Ok(list) => serde_json::json!({
            "files": list.len(),
            "dirty_pages": list.iter().map(|c| c.pages.len()).sum::<usize>(),
            "patches": list.iter().map(|c| c.patches.len()).sum::<usize>(),
            "records": list
                .iter()
                .take(MAX_LISTED)
                .map(|c| serde_json::json!({
                    "frame": c.record.frame.0,
                    "record": c.record.describe(),
                    "serial": c.rec.serial,
                    "size": c.rec.size,
                    "valid": c.rec.valid,
                    "dirty_pages": c.pages.len(),
                    "patches": c.patches.iter().take(MAX_LISTED).map(|(page, (at, p))| {
                        serde_json::json!({
                            "page": page,
                            "frame": at.frame.0,
                            "slot": at.slot,
                            "slots": at.slots,
                            "ranges": p.ranges,
                            "bytes": p.len(),
                        })
                    }).collect::<Vec<_>>(),
                    "handle": c.rec.handle.iter().fold(String::new(), |mut h, b| {
                        use std::fmt::Write;
                        let _ = write!(h, "{b:02x}");
                        h
                    }),
                }))
                .collect::<Vec<_>>(),
        }),
        Err(e) => serde_json::json!({ "error": e.to_string() }),
    }
}

fn print_cached(cached: &CliResult<Vec<engine::cache::Found>>) {
    match cached {
        Ok(list) => {
            let pages: usize = list.iter().map(|c| c.pages.len()).sum();
            let patches: usize = list.iter().map(|c| c.patches.len()).sum();
            println!(
                "page cache  {} file(s) with {pages} dirty page(s) and {patches} patch(es) in NVRAM",
                list.len()
            );
            for c in list {
                for (page, (at, p)) in c.patches.iter().take(20) {
                    println!(
                        "  patch     frame {:<8} slots {:>2}+{:<2} file record in {} page {page}: \
                         {} range(s), {} B",
                        at.frame.0,
                        at.slot,
                        at.slots,
                        c.record.describe(),
                        p.ranges.len(),
                        p.len()
                    );
                }
            }
        }
        Err(e) => println!("page cache  unreadable: {e}"),
    }
}

/// The metadata journal's records as the next mount will see them (replayed, then freed).
fn journal_records(path: &std::path::Path) -> CliResult<Vec<engine::journal::record::Found>> {
    let (pool, _) = super::dry_open(path)?;
    Ok(engine::journal::record::scan(&pool)?)
}

fn journal_json(found: &CliResult<Vec<engine::journal::record::Found>>) -> serde_json::Value {
    let hex = |b: &[u8]| {
        b.iter().fold(String::new(), |mut h, x| {
            use std::fmt::Write;
            let _ = write!(h, "{x:02x}");
            h
        })
    };
    match found {
        Ok(list) => serde_json::json!({
            "records": list.len(),
            "list": list
                .iter()
                .take(MAX_LISTED)
                .map(|f| serde_json::json!({
                    "frame": f.place.frame.0,
                    "slot": f.place.slot,
                    "slots": f.place.slots,
                    "seq": f.redo.seq,
                    "op": format!("{:?}", f.redo.op()).to_lowercase(),
                    "name1": f.redo.name1.to_string_lossy(),
                    "name2": f.redo.name2.to_string_lossy(),
                    "object": hex(&f.redo.object),
                }))
                .collect::<Vec<_>>(),
        }),
        Err(e) => serde_json::json!({ "error": e.to_string() }),
    }
}

fn print_journal(found: &CliResult<Vec<engine::journal::record::Found>>) {
    match found {
        Ok(list) if list.is_empty() => {}
        Ok(list) => {
            println!("journal     {} record(s) (replayed at the next mount):", list.len());
            for f in list.iter().take(MAX_LISTED) {
                let r = &f.redo;
                println!(
                    "  {:>8}  frame {:<8} slot {:<2} {:<11} {} {}",
                    r.seq,
                    f.place.frame.0,
                    f.place.slot,
                    format!("{:?}", r.op()).to_lowercase(),
                    r.name1.to_string_lossy(),
                    r.name2.to_string_lossy()
                );
            }
        }
        Err(e) => println!("journal     unreadable: {e}"),
    }
}

type Profile = CliResult<Option<engine::route::profile::Found>>;

/// The route profile as the next mount will see it.
fn route_profile(path: &std::path::Path) -> Profile {
    let (pool, _) = super::dry_open(path)?;
    Ok(engine::route::profile::scan(&pool)?)
}

fn profile_json(profile: &Profile) -> serde_json::Value {
    match profile {
        Ok(None) => serde_json::Value::Null,
        Ok(Some(p)) => serde_json::json!({
            "frame": p.frame.0,
            "files": p.profile.count(),
            "capacity": engine::route::profile::CAPACITY,
        }),
        Err(e) => serde_json::json!({ "error": e.to_string() }),
    }
}

fn print_profile(profile: &Profile) {
    match profile {
        Ok(None) => {}
        Ok(Some(p)) => println!(
            "routes      {} of {} file(s) in the route profile (NVRAM path from the first open)",
            p.profile.count(),
            engine::route::profile::CAPACITY
        ),
        Err(e) => println!("routes      unreadable: {e}"),
    }
}

/// Pending directory times as the next mount will see them.
fn dir_times(path: &std::path::Path) -> CliResult<Vec<engine::tempfs::overlay::times::Found>> {
    let (pool, _) = super::dry_open(path)?;
    Ok(engine::tempfs::overlay::times::scan(&pool)?)
}

fn dir_times_json(
    found: &CliResult<Vec<engine::tempfs::overlay::times::Found>>,
) -> serde_json::Value {
    match found {
        Ok(list) => serde_json::json!({
            "directories": list.len(),
            "records": list
                .iter()
                .take(MAX_LISTED)
                .map(|t| serde_json::json!({
                    "frame": t.frame.0,
                    "mtime": [t.times.mtime.0, t.times.mtime.1],
                    "ctime": [t.times.ctime.0, t.times.ctime.1],
                    "handle": t.times.handle.iter().fold(String::new(), |mut h, b| {
                        use std::fmt::Write;
                        let _ = write!(h, "{b:02x}");
                        h
                    }),
                }))
                .collect::<Vec<_>>(),
        }),
        Err(e) => serde_json::json!({ "error": e.to_string() }),
    }
}

fn print_dir_times(found: &CliResult<Vec<engine::tempfs::overlay::times::Found>>) {
    match found {
        Ok(list) if list.is_empty() => {}
        Ok(list) => println!(
            "dir times   {} directory(ies) with pending mtime/ctime (settled at mount, flush, unmount)",
            list.len()
        ),
        Err(e) => println!("dir times   unreadable: {e}"),
    }
}

fn open_unlocked(path: &std::path::Path) -> CliResult<MmapRegion> {
    let options = MmapOptions { read_only: true, unlocked: true, ..MmapOptions::default() };
    Ok(MmapRegion::open(path, options)?)
}

/// What a frame of `kind` holds, from the engine's one table of frame kinds
/// (`engine::base::frames`), or the device's block cache (its regions hold nothing else).
fn frame_kind_name(kind: u32) -> &'static str {
    match engine::base::frames::of(kind) {
        Some(k) => k.name,
        None if kind == device::nvcache::record::KIND_FRAME => {
            "block-cache frames (7 sectors each)"
        }
        None => "unknown kind (not written by nvstack)",
    }
}
