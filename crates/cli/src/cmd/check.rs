//! `nvstack check`: verify a region offline by running recovery on a copy-on-write view.

use std::path::PathBuf;

use crate::error::CliResult;
use crate::size::human;

#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// The region file.
    #[arg(long, value_name = "PATH")]
    pub nvram: PathBuf,
}

pub fn run(args: &CheckArgs) -> CliResult {
    let path = args.nvram.display();
    let (pool, report) = match super::dry_open(&args.nvram) {
        Ok(opened) => opened,
        Err(e) => {
            eprintln!("{path}: DAMAGED or unreadable: {e}");
            return Err(e);
        }
    };
    if let Err(e) = pool.check_invariants() {
        eprintln!("{path}: DAMAGED: allocator invariant broken after recovery: {e}");
        return Err(crate::error::CliError::Region(nvram::Error::corrupt(
            nvram::Area::Descriptor(0),
            e,
        )));
    }
    // Every record kind is part of the region: a damaged one is reported as the mount (or the
    // device's attach) would refuse it.
    let temps = reported(&path, engine::tempfs::scan(&pool).map_err(Into::into))?;
    let cached = reported(&path, engine::cache::scan(&pool).map_err(Into::into))?;
    let journal = reported(&path, engine::journal::record::scan(&pool).map_err(Into::into))?;
    let dir_times =
        reported(&path, engine::tempfs::overlay::times::scan(&pool).map_err(Into::into))?;
    let profile = reported(&path, engine::route::profile::scan(&pool).map_err(Into::into))?;
    // A block cache (`device attach --nvram`): every frame and sector verified.
    let blocks = reported(&path, device::nvcache::scan(&pool).map_err(super::block_cache_error))?;
    let shutdown = if report.was_clean { "clean shutdown" } else { "not shut down cleanly" };
    let frames = format!("{}/{} frames in use", report.frames_used, report.frames_total);
    if report.transactions_rolled_back == 0 {
        println!("{path}: consistent ({shutdown}), {frames}, undo log empty");
    } else {
        println!(
            "{path}: recoverable ({shutdown}): {} unfinished transaction(s), {} undo records ({}) \
             will be rolled back at the next mount; {frames} after recovery",
            report.transactions_rolled_back,
            report.records_undone,
            human(report.bytes_restored)
        );
    }
    let transforming =
        temps.iter().filter(|t| t.rec.state == engine::tempfs::State::Transforming).count();
    if !temps.is_empty() {
        println!(
            "{path}: {} temp file(s) in NVRAM{}",
            temps.len(),
            if transforming > 0 {
                format!(", {transforming} half transformed (finished at the next mount)")
            } else {
                String::new()
            }
        );
    }
    if !cached.is_empty() {
        let pages: usize = cached.iter().map(|c| c.pages.len()).sum();
        let patches: usize = cached.iter().map(|c| c.patches.len()).sum();
        println!(
            "{path}: {} cached file(s) with {pages} dirty page(s) and {patches} patch(es) in \
             NVRAM (written back later)",
            cached.len()
        );
    }
    if let (Some(first), Some(last)) = (journal.first(), journal.last()) {
        println!(
            "{path}: {} metadata-journal record(s), sequence {} to {} (replayed onto the lower \
             directory at the next mount)",
            journal.len(),
            first.redo.seq,
            last.redo.seq
        );
    }
    if !dir_times.is_empty() {
        println!(
            "{path}: {} directory(ies) with pending times (settled at the next mount)",
            dir_times.len()
        );
    }
    if let Some(p) = &profile {
        println!(
            "{path}: route profile of {} file(s) that take the NVRAM path from their first open",
            p.profile.count()
        );
    }
    if blocks.is_none() {
        say_foreign(&path, &pool);
    }
    if let Some(b) = &blocks {
        println!(
            "{path}: block cache of {} ({} mode): {} sector(s) cached and verified{}",
            b.image.path,
            b.mode.as_str(),
            b.sectors.len(),
            super::block_cache_summary(b)
        );
    }
    Ok(())
}

/// Damage found by a scan: said on stderr with the region named, then the error (exit 4).
fn reported<T>(path: &impl std::fmt::Display, found: CliResult<T>) -> CliResult<T> {
    found.inspect_err(|e| eprintln!("{path}: DAMAGED: {e}"))
}

/// Frames of kinds no mount reads (the engine's table of frame kinds, `base/frames.rs`): the
/// region is another program's (the demo's, say) - a mount would refuse it.
fn say_foreign(path: &std::path::Display<'_>, pool: &txn::Pool) {
    let foreign = pool.allocated_frames().map_or(0, |f| {
        f.iter().filter(|(_, t)| engine::base::frames::of(t.kind).is_none()).count()
    });
    if foreign > 0 {
        println!(
            "{path}: {foreign} frame(s) of kinds no mount reads (`nvstack inspect` names them): \
             not a region `nvstack mount` takes"
        );
    }
}
