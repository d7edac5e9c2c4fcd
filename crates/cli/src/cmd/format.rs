//! `nvstack format`: create (or with --force, recreate) a region file.

use std::path::{Path, PathBuf};

use nvram::layout::{DEFAULT_UNDO_SLOT_SIZE, DEFAULT_UNDO_SLOTS};
use nvram::{FormatParams, MmapOptions, MmapRegion};
use txn::Pool;

use crate::error::{CliError, CliResult};
use crate::size::{human, parse_size};

#[derive(Debug, clap::Args)]
pub struct FormatArgs {
    /// The region file (default location for emulated NVRAM: /dev/shm). Created with mode 0600.
    #[arg(long, value_name = "PATH")]
    pub nvram: PathBuf,
    /// Region size, e.g. 256M or 4G. Fixed for the region's life.
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    pub size: u64,
    /// Destroy an existing region (or any other file) at PATH.
    #[arg(long)]
    pub force: bool,
    /// Undo-log slots: the most transactions that can run at once (one per worker thread).
    #[arg(long, default_value_t = DEFAULT_UNDO_SLOTS, value_name = "N")]
    pub undo_slots: u32,
    /// Bytes of undo records one transaction may use; a larger operation fails with an error.
    #[arg(long, value_parser = parse_size, default_value_t = DEFAULT_UNDO_SLOT_SIZE, value_name = "SIZE")]
    pub undo_slot_size: u64,
}

pub fn run(args: &FormatArgs) -> CliResult {
    let params = FormatParams {
        region_size: args.size,
        undo_slots: args.undo_slots,
        undo_slot_size: args.undo_slot_size,
    };
    // Check the parameters before touching any file.
    nvram::Layout::compute(params)?;
    let layout = format(&args.nvram, params, args.force)?;
    println!(
        "formatted {}: {} region, {} undo slots x {}, {} frames ({}), uuid {}",
        args.nvram.display(),
        human(layout.region_size),
        layout.undo_slots,
        human(layout.undo_slot_size),
        layout.nr_frames,
        human(layout.nr_frames * 4096),
        layout.uuid
    );
    Ok(())
}

/// Formats `path`, refusing to overwrite anything without `force`.
pub fn format(path: &Path, params: FormatParams, force: bool) -> CliResult<nvram::Layout> {
    if path.exists() {
        if nvram::is_in_use(path)? {
            return Err(CliError::Usage(format!(
                "{} is in use by a running nvstack; unmount it first",
                path.display()
            )));
        }
        if !force {
            let what =
                match MmapRegion::open(path, MmapOptions { read_only: true, ..Default::default() })
                    .map_err(CliError::from)
                    .and_then(|r| Ok(nvram::Layout::read(&r)?))
                {
                    Ok(layout) => format!("an nvstack region (uuid {})", layout.uuid),
                    Err(CliError::Region(nvram::Error::NewerVersion { found, .. })) => {
                        format!("an nvstack region of format version {found}")
                    }
                    Err(_) => "a file that is not an nvstack region".into(),
                };
            return Err(CliError::Usage(format!(
                "{} already holds {what}; use --force to destroy it",
                path.display()
            )));
        }
        MmapRegion::recreate(path, params.region_size)?;
    } else {
        MmapRegion::create(path, params.region_size)?;
    }
    let region = MmapRegion::open(path, MmapOptions::default())?;
    Ok(Pool::format(&region, params)?)
}
