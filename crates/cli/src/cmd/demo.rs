//! `nvstack demo`: the foundation in one minute. Formats a region, commits a transaction, kills
//! a process in the middle of a second one, shows `check` finding the unfinished transaction,
//! recovers, and finally runs a simulated power-cut sweep over every fence of a workload.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use nvram::{FormatParams, MmapOptions, MmapRegion, Region};
use txn::{Consistency, FrameId, FrameTag, Pool};

use crate::error::{CliError, CliResult};
use crate::size::human;

#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Region file to use (default: a fresh file under /dev/shm, removed afterwards).
    #[arg(long, value_name = "PATH")]
    pub nvram: Option<PathBuf>,
    /// Keep the region file afterwards (to run `nvstack inspect` on it).
    #[arg(long)]
    pub keep: bool,
}

#[derive(Debug, clap::Args)]
pub struct DemoChildArgs {
    #[arg(long)]
    pub nvram: PathBuf,
}

const MESSAGE_KIND: u32 = 0xde30;
const COMMITTED: &[u8] = b"transaction A: committed, durable, survives any crash";
const UNCOMMITTED: &[u8] = b"transaction B: NOT committed - a crash must erase this";

fn open(path: &Path) -> CliResult<(Pool, txn::RecoveryReport)> {
    let region: Arc<dyn Region> = Arc::new(MmapRegion::open(path, MmapOptions::default())?);
    Ok(Pool::open(region, Consistency::Undo)?)
}

/// The message frame is recorded in the first 8 bytes of the root area.
fn message_in(region: &dyn Region, layout: &nvram::Layout) -> String {
    let root = nvram::layout::ROOT_OFFSET;
    let frame = u64::from_le_bytes(region.read_vec(root, 8).try_into().expect("8 bytes"));
    let mut bytes = region.read_vec(layout.frame_offset(frame), 128);
    bytes.truncate(bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len()));
    String::from_utf8_lossy(&bytes).into_owned()
}

fn message(pool: &Pool) -> String {
    message_in(pool.region(), pool.layout())
}

pub fn run(args: &DemoArgs) -> CliResult {
    let dir = tempfile::Builder::new()
        .prefix("nvstack-demo")
        .tempdir_in("/dev/shm")
        .map_err(|e| CliError::Other(format!("cannot create a directory in /dev/shm: {e}")))?;
    let path = args.nvram.clone().unwrap_or_else(|| dir.path().join("region"));
    let params = FormatParams { region_size: 64 << 20, ..FormatParams::default() };

    println!("1. format {} ({})", path.display(), human(params.region_size));
    let layout = super::format::format(&path, params, args.nvram.is_some())?;
    println!("   {} undo slots, {} frames of 4 KiB", layout.undo_slots, layout.nr_frames);

    println!("2. transaction A: allocate a frame, write a message, point the root at it, commit");
    {
        let (pool, _) = open(&path)?;
        let mut tx = pool.begin();
        let frame = tx
            .alloc_frame(FrameTag { kind: MESSAGE_KIND, owner: 1, index: 0 })
            .map_err(|e| CliError::Other(e.to_string()))?;
        tx.write(pool.frame_offset(frame), COMMITTED);
        let (root, _) = pool.root_range();
        tx.update(root, &frame.0.to_le_bytes()).map_err(|e| CliError::Other(e.to_string()))?;
        tx.commit();
        println!("   message: \"{}\"", message(&pool));
        pool.close();
    }

    println!("3. transaction B in a child process: overwrite the message, allocate 3 frames ...");
    let exe = std::env::current_exe().map_err(|e| CliError::Other(e.to_string()))?;
    let mut child = Command::new(exe)
        .args(["demo-child", "--nvram"])
        .arg(&path)
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| CliError::Other(format!("cannot start the child: {e}")))?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("piped"))
        .read_line(&mut line)
        .map_err(|e| CliError::Other(e.to_string()))?;
    print!("   child says: {line}");
    child.kill().map_err(|e| CliError::Other(e.to_string()))?;
    child.wait().map_err(|e| CliError::Other(e.to_string()))?;
    println!("   ... and SIGKILL it before it commits");
    let view = MmapRegion::open(&path, MmapOptions { read_only: true, ..MmapOptions::default() })?;
    let inspection = txn::inspect(&view)?;
    println!(
        "   the region now: {} undo slot(s) in use, {} frames allocated, message reads \"{}\"",
        inspection.undo_slots_in_use,
        inspection.frames_used,
        message_in(&view, &inspection.layout)
    );
    drop(view);

    println!("4. nvstack check --nvram {}", path.display());
    print!("   ");
    super::check::run(&super::check::CheckArgs { nvram: path.clone() })?;

    println!("5. open = recover");
    let (pool, report) = open(&path)?;
    println!(
        "   rolled back {} transaction ({} undo records, {} restored); {} frame(s) in use",
        report.transactions_rolled_back,
        report.records_undone,
        human(report.bytes_restored),
        report.frames_used
    );
    println!("   message: \"{}\"", message(&pool));
    let ok = message(&pool).as_bytes() == COMMITTED && report.frames_used == 1;
    pool.close();
    if !ok {
        return Err(CliError::Other("recovery did not restore transaction A's state".into()));
    }

    println!("6. simulated power cuts: a seeded workload, crash images at every fence");
    let sweep = txn::testkit::crash_sweep(1, 40, 0).map_err(CliError::Other)?;
    println!(
        "   {} transactions ({} committed), {} crash points, {} crash images (dropped, kept and \
         torn unpersisted writes) recovered: every one showed exactly the last committed state",
        sweep.transactions, sweep.committed, sweep.crash_points, sweep.images
    );
    if args.keep {
        let kept = dir.keep();
        println!("region kept at {}", kept.join("region").display());
    }
    Ok(())
}

/// The child of step 3: runs transaction B up to just before commit, then waits to be killed.
pub fn run_child(args: &DemoChildArgs) -> CliResult {
    let (pool, _) = open(&args.nvram)?;
    let (root, _) = pool.root_range();
    let frame = u64::from_le_bytes(pool.read_vec(root, 8).try_into().expect("8 bytes"));
    let mut tx = pool.begin();
    tx.update(pool.frame_offset(FrameId(frame)), UNCOMMITTED)
        .map_err(|e| CliError::Other(e.to_string()))?;
    for i in 0..3 {
        let f = tx
            .alloc_frame(FrameTag { kind: MESSAGE_KIND, owner: 2, index: i })
            .map_err(|e| CliError::Other(e.to_string()))?;
        tx.write(pool.frame_offset(f), &[0xEE; 4096]);
    }
    println!(
        "transaction B has written everything, {} bytes of undo log, not committed",
        tx.undo_bytes()
    );
    std::io::stdout().flush().map_err(|e| CliError::Other(e.to_string()))?;
    loop {
        std::thread::park();
    }
}
