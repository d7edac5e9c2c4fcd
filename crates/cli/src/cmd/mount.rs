//! `nvstack mount LOWER MOUNTPOINT --nvram PATH`: the options, the engine configuration they
//! make, and the start of the daemon (`daemon.rs`: recover, bind, serve until unmounted).
//!
//! Without `--foreground` the command starts itself again as the daemon (in a new session),
//! waits until the daemon reports "ready" or fails, and returns; the daemon's output then goes
//! to `/run/nvstack/mounts/<id>/daemon.log`.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use engine::{
    CacheConfig, EngineConfig, JournalConfig, PatchLimit, Share, TempConfig, WritebackPolicy,
};

use super::rundir;
use crate::error::{CliError, CliResult};
use crate::size::{human, parse_size};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ConsistencyArg {
    /// Every completed operation is atomic and durable (per-operation undo log in NVRAM).
    Undo,
    /// VM-aware journaling: every operation is atomic, and durable at the next group commit -
    /// on fsync, fdatasync, O_SYNC writes and `nvstack flush`, every --group-commit-interval
    /// seconds and at --group-commit-size of changed NVRAM - never later than the interval
    /// (the ext3 contract). Committed NVRAM is write-protected between commits: a stray store
    /// is trapped and counted (`stat`: journal.trapped_writes) instead of corrupting it.
    Journal,
    /// No undo log: the ext2-like baseline for benchmarks.
    None,
}

// The headings of `nvstack mount --help`: one per mechanism, in this order.
const REGION: &str = "Region and consistency";
const TEMPFFS: &str = "TempFFS (temp files)";
const CACHE: &str = "Page cache and write-back";
const NBW: &str = "Non-blocking writes";
const JOURNAL: &str = "Metadata journal";
const TRANSPORT: &str = "Routes and FUSE transport";
const DAEMON: &str = "Daemon";

/// Every option of `nvstack mount`, grouped by mechanism as `--help` shows them. The defaults
/// of the engine's knobs are the core's (`defaults()`: `EngineConfig::default()`), written
/// there only; a test checks that a mount without flags runs with exactly that configuration.
/// The daemon gets the words the user typed, not a copy of these fields (`start_daemon`), and
/// `nvstack stat --json` reports them as the mount runs with them (`mount.options`,
/// `effective_options`).
#[derive(Clone, Debug, clap::Args, serde::Serialize)]
#[allow(clippy::struct_excessive_bools)] // command-line switches
pub struct MountArgs {
    /// The directory to stack on (any file system). It belongs to nvstack while mounted.
    pub lower: PathBuf,
    /// Where to mount.
    pub mountpoint: PathBuf,

    /// The NVRAM region file; created (formatted) if missing, recovered if it was not unmounted
    /// cleanly. A region belongs to the first lower directory it was mounted over.
    #[arg(long, value_name = "PATH", help_heading = REGION)]
    pub nvram: PathBuf,
    /// Size in bytes (suffixes K, M, G, T) of a region created by this mount (ignored for an
    /// existing region).
    #[arg(long, value_parser = parse_size, default_value = "256M", value_name = "SIZE", help_heading = REGION)]
    pub size: u64,
    /// Undo-log slots of a region created by this mount (at most this many operations change
    /// NVRAM at once; others wait). Default: a quarter of the region's size in slots, 2 to 16.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=256), value_name = "N", help_heading = REGION)]
    pub undo_slots: Option<u32>,
    /// Size in bytes of each undo slot of a region created by this mount: the most NVRAM one
    /// operation may change (a 1 MiB write needs a little over 1 MiB).
    #[arg(long, value_parser = parse_size, default_value = size_text(nvram::layout::DEFAULT_UNDO_SLOT_SIZE), value_name = "SIZE", help_heading = REGION)]
    pub undo_slot_size: u64,
    /// How operations are made crash-consistent (docs/design.md section 12.1 compares them).
    #[arg(long, value_enum, default_value = "undo", help_heading = REGION)]
    pub consistency: ConsistencyArg,
    /// `--consistency journal`: the running group is committed (made durable) when its
    /// operations have changed this many bytes of NVRAM (whole pages; the group log's capacity
    /// bounds a group too). Default: --journal-size's value, which set it before it had a flag
    /// of its own.
    #[arg(long, value_parser = parse_size, value_name = "SIZE", help_heading = REGION)]
    pub group_commit_size: Option<u64>,
    /// `--consistency journal`: ... or at the latest this many seconds after the group's first
    /// operation (0: only by size and on durability calls). Default: --checkpoint-interval's
    /// value, which set it before it had a flag of its own.
    #[arg(long, value_name = "SECONDS", help_heading = REGION)]
    pub group_commit_interval: Option<u64>,

    /// New regular files live only in NVRAM (TempFFS) until they are transformed into the
    /// lower directory: when they grow beyond --tempfile-max-size, when temp files exceed
    /// their share of the region (least recently used first), on `nvstack flush`, and at
    /// unmount. Short-lived files never cost lower-FS IO. `off`: every file is created in the
    /// lower directory (temp files left in the region are transformed at mount).
    #[arg(long, value_enum, default_value_t = OnOff::from(defaults().temp.enabled), value_name = "on|off", help_heading = TEMPFFS)]
    pub tempfiles: OnOff,
    /// A temp file growing beyond this size in bytes is transformed into the lower directory.
    #[arg(long, value_parser = parse_size, default_value = size_text(defaults().temp.max_size), value_name = "SIZE", help_heading = TEMPFFS)]
    pub tempfile_max_size: u64,
    /// Percent of the region's frames temp files may hold before the least recently used are
    /// transformed (NVRAM pressure).
    #[arg(long, default_value_t = percent(defaults().temp.share), value_parser = clap::value_parser!(u64).range(1..=100), value_name = "PERCENT", help_heading = TEMPFFS)]
    pub tempfile_share: u64,
    /// NR_WB of the thesis' pressure rule, in pages: pages of temp files transformed per
    /// pressure round (N = NR_WB x NR_TempFFS / NR_Dirty); each round ends with one syncfs of
    /// the lower FS.
    #[arg(long, default_value_t = defaults().temp.writeback_batch, value_parser = clap::value_parser!(u64).range(1..), value_name = "PAGES", help_heading = TEMPFFS)]
    pub tempfile_writeback_batch: u64,
    /// Background transforms: above this percent of the temp files' share (--tempfile-share),
    /// a daemon thread moves the least recently used temp files into the lower directory (8 x
    /// --tempfile-writeback-batch frames, at most 1,024 files, one group and its syncfs a
    /// round), so that writers rarely fill the share and wait for a transform in their own
    /// requests. 0: only writers relieve pressure, as in the thesis' TempFFS. For files that
    /// outlive the region (mail delivery); it costs files that would have died in NVRAM.
    /// Measured with 80 on the showcase (hdd-7200, 256 MiB region): Maildir deliveries 1.10x,
    /// asynchronous Postmark 10 % slower with 15 % more written to disk.
    #[arg(long, default_value_t = defaults().temp.background.map_or(0, percent), value_parser = clap::value_parser!(u64).range(0..=100), value_name = "PERCENT", help_heading = TEMPFFS)]
    pub tempfile_background: u64,
    /// Keep temp files in NVRAM across unmount instead of transforming them (the lower
    /// directory alone then lacks them until the next mount). Off unless given.
    #[arg(long, help_heading = TEMPFFS)]
    pub keep_tempfiles: bool,

    /// The NVRAM page cache: writes to existing lower files land in NVRAM as dirty pages
    /// (durable and atomic when the write returns; no lower IO) and are written back late, by
    /// the --writeback policy. `off`: writes go straight to the lower file (pages left in the
    /// region are written back at mount).
    #[arg(long, value_enum, default_value_t = OnOff::from(defaults().cache.enabled), value_name = "on|off", help_heading = CACHE)]
    pub cache: OnOff,
    /// Which dirty pages go when write-back runs (thesis 3.1.2): `file` - dirty files in order,
    /// all their pages (Linux); `recency` - inactive pages only, least recently used first;
    /// `location` - the zone whose dirty pages form the longest runs (max ASL), all pages;
    /// `relo` - inactive pages of the zone with max ASL, then the next zone.
    #[arg(long, value_enum, default_value = defaults().cache.policy.name(), help_heading = CACHE)]
    pub writeback: WritebackArg,
    /// Blocks (4 KiB) per zone of the lower device for the location-aware policies.
    #[arg(long, default_value_t = defaults().cache.zone_blocks, value_parser = clap::value_parser!(u64).range(1..), value_name = "BLOCKS", help_heading = CACHE)]
    pub zone_blocks: u64,
    /// Write-back starts when dirty pages exceed this percent of the region's frames ...
    #[arg(long, default_value_t = percent(defaults().cache.dirty_high), value_parser = clap::value_parser!(u64).range(1..=100), value_name = "PERCENT", help_heading = CACHE)]
    pub dirty_high: u64,
    /// ... and stops when they are down to this percent (at most --dirty-high).
    #[arg(long, default_value_t = percent(defaults().cache.dirty_low), value_parser = clap::value_parser!(u64).range(0..=100), value_name = "PERCENT", help_heading = CACHE)]
    pub dirty_low: u64,
    /// NR_WB: dirty pages per write-back batch (each batch: one sync of the lower file system,
    /// one NVRAM transaction).
    #[arg(long, default_value_t = defaults().cache.batch_pages, value_parser = clap::value_parser!(u64).range(1..=4096), value_name = "PAGES", help_heading = CACHE)]
    pub writeback_batch: u64,
    /// `on`: write-back above --dirty-high runs in a background thread of the daemon, so no
    /// writer waits for a whole round in its own request (a writer waits for write-back only
    /// when NVRAM is full, and then for the round's next freed batch, not the round). `off`:
    /// the writer that passes --dirty-high writes back down to --dirty-low before its write
    /// returns (on the modeled ssd one write waited 11-41 s for a round of ~25,000 pages; on
    /// hdd-7200 Postmark ran 4x and Zipf rewrites 1.3x longer than with `on`:
    /// docs/benchmarks.md "The background writer by default").
    #[arg(long, value_enum, default_value_t = OnOff::from(defaults().cache.background), value_name = "on|off", help_heading = CACHE)]
    pub writeback_background: OnOff,
    /// Seconds after which a dirty page is written back even without pressure, so that the
    /// lower directory alone is never older than this (0 = never).
    #[arg(long, default_value_t = defaults().cache.max_dirty_age, value_name = "SECONDS", help_heading = CACHE)]
    pub max_dirty_age: u64,
    /// Keep dirty pages in NVRAM across unmount instead of writing them back (the lower
    /// directory alone then lacks those writes until the next mount). Off unless given.
    #[arg(long, help_heading = CACHE)]
    pub keep_dirty: bool,

    /// Non-blocking writes (FAST'15): a write to part of a page that is not in NVRAM becomes a
    /// *patch* in NVRAM (durable and atomic when the write returns) instead of waiting for the
    /// page to be read from the disk. When the page is read and merged: `lazy` - only when
    /// needed (a read the patch does not cover reads the lower file; write-back writes just
    /// the patched bytes); `async-fg` - right after the write is answered, by the thread that
    /// served it; `async-bg` - by a background fetcher; `off` - before the write, which waits
    /// (the blocking baseline). Why `async-bg` by default: at the paper's scale (60 s of
    /// random writes to a cold 5 GiB file, docs/benchmarks.md "Non-blocking writes") it made
    /// the most operations in every random row on both disk models - 62x ext4's 128-byte
    /// random writes on hdd-7200 (`lazy` 58x); on ssd 5.4x (`lazy` 4.7x) and 2.45x ext4 on
    /// average over 128 B-2 KiB (`lazy` 2.22x) - because its fetcher frees patch memory past
    /// the limit, where `lazy` makes each writer read its page. `lazy` makes no disk reads of
    /// its own: a random reader of the same ssd ran 1.15-1.64x faster beside it - choose it
    /// when readers share the disk with sub-page writers. The fetcher drains patches in
    /// elevator order and sleeps while none are queued.
    /// Only files on the NVRAM path make patches: with --passthrough on, a file never fsynced
    /// is served by the kernel.
    #[arg(long, value_enum, default_value = defaults().cache.nbw.name(), help_heading = NBW)]
    pub nbw: NbwArg,
    /// Bytes of NVRAM that patches may take (4 KiB frames of 64-byte slots: a 512-byte patch
    /// takes 576 bytes, 7 share a frame); beyond, a partial write reads its page first, as with
    /// --nbw off. Default: 64M or an eighth of the region, the smaller.
    #[arg(long, value_parser = parse_size, value_name = "SIZE", help_heading = NBW)]
    pub nbw_patch_limit: Option<u64>,

    /// The metadata journal: namespace and attribute changes of lower files and directories
    /// (mkdir, rename, unlink, chmod ...) are applied to the lower directory at once and made
    /// durable by a record in NVRAM, so fsync of a directory, and a rename an application
    /// waits for, cost no disk wait. A checkpoint (one syncfs of the lower file system) makes
    /// them durable there and frees the records when they take this many bytes of NVRAM
    /// (records are packed 8-16 to a 4 KiB frame; at most a quarter of the region) ... Also
    /// journal mode's --group-commit-size unless that is given.
    #[arg(long, value_parser = parse_size, default_value = size_text(defaults().journal.size_max), value_name = "SIZE", help_heading = JOURNAL)]
    pub journal_size: u64,
    /// ... or when they are this many seconds old (0: only by size, at unmount, and when a
    /// durability call must reach the lower file system anyway). Not used with
    /// `--consistency none`, which has no journal. Also journal mode's --group-commit-interval
    /// unless that is given.
    #[arg(long, default_value_t = defaults().journal.interval_secs, value_name = "SECONDS", help_heading = JOURNAL)]
    pub checkpoint_interval: u64,

    /// Kernel passthrough for lower files NVRAM cannot help: an open of a lower file with
    /// nothing in NVRAM (no dirty pages, no patches) that was never fsynced, opened O_SYNC or
    /// written in small pieces is served by the kernel straight from the lower file (read,
    /// write, mmap at the lower FS's speed, no FUSE round trip per IO). Such a file's writes
    /// are then as durable as the lower FS makes them: its fsync waits for the disk once, and
    /// from its next open on (also after a remount: the route profile in NVRAM remembers it)
    /// it takes the NVRAM path. Needs Linux 6.9+ and root; without them, `off` silently.
    /// docs/design.md section 14.
    #[arg(long, value_enum, default_value_t = OnOff::from(defaults().passthrough), value_name = "on|off", help_heading = TRANSPORT)]
    pub passthrough: OnOff,
    /// Whether the kernel sends fsync, fdatasync and fsync of a directory to the daemon.
    /// `spare`: in undo mode every operation that returned is durable already (in NVRAM, or
    /// synced in the lower file system by the operation itself), so the first such request is
    /// answered "not implemented" and the kernel sends none again on this mount - it returns
    /// success at once: one FUSE round trip less per fsync (a 512 B append with fdatasync:
    /// 2 requests -> 1; a sqlite WAL commit 3.5 -> 2.5; a Maildir delivery 11 -> 9). The
    /// contract is unchanged: when fsync returns, the data and the names it depends on survive
    /// a power cut. The price: no passthrough (`--passthrough` is off: a passthrough file's
    /// fsync must reach the lower file), and what goes to the lower file system directly
    /// (writes through when NVRAM is full or with O_DIRECT, fallocate, copy_file_range,
    /// truncates of uncached files, namespace changes the metadata journal cannot take) is
    /// synced by its own operation (`fsync.eager_syncs`). Needs `--consistency undo`.
    /// `forward`: every durability call is a request (docs/design.md 13.7).
    #[arg(long, value_enum, default_value = defaults().fsync_requests.name(), value_name = "forward|spare", help_heading = TRANSPORT)]
    pub fsync_requests: FsyncRequestsArg,
    /// The direct path (docs/direct-path.md): a process that runs with the preload library
    /// (`nvstack run -- CMD`, or LD_PRELOAD=libnvstack.so) asks for a delegation of a file it
    /// writes, and from then on its write, pwrite, fsync, fdatasync and fstat of that file are
    /// served in its own process, durable in a log in NVRAM beside the region
    /// (`<nvram>.logs/`), with no FUSE request; any request of another process, or one the
    /// library did not catch, takes the delegation back and merges the log first. Granted
    /// only to the only open of a file on the NVRAM path. Needs `--consistency undo`. Not yet
    /// crash-safe against the daemon itself: if the daemon dies while a delegation is held,
    /// the library's writes since its last merge are not recovered (the next step).
    #[arg(long, value_enum, default_value = "off", value_name = "on|off", help_heading = TRANSPORT)]
    pub direct_path: OnOff,
    /// Which opens of files that live in NVRAM (temp files) bypass the kernel's page cache
    /// (FUSE direct IO; mmap still works). Such an open keeps no second copy of the bytes in
    /// the mount's page cache, a write(2) through it is one request (through the page cache,
    /// a write starting inside a page the kernel does not hold is split after that page), and
    /// the kernel does not ask for security.capability before its first write (nvstack
    /// removes set-ID bits itself). `write-only`: opens that cannot read (tar, cp, mail
    /// delivery, a log): a created file costs one request less (a created, written and
    /// fsynced file 10 % faster, a mail delivery 11 %, untar 18 % fewer requests), 512 B
    /// appends with fdatasync unchanged; `nvram`: every open, so every read(2) is a request
    /// too (cold reads 1.5x slower, no readahead); `never`: the kernel caches them as any
    /// file (docs/design.md section 14.6).
    #[arg(long, value_enum, default_value = "write-only", value_name = "never|write-only|nvram", help_heading = TRANSPORT)]
    pub direct_io: DirectIoArg,
    /// Extended attributes (and with them ACLs set through the mount). `off` answers every
    /// xattr request with "not supported" once, after which the kernel stops asking: it
    /// otherwise asks for security.capability before every write(2) (one FUSE round trip per
    /// write; Postmark: ~2 per file).
    #[arg(long, value_enum, default_value_t = OnOff::from(defaults().xattrs), value_name = "on|off", help_heading = TRANSPORT)]
    pub xattrs: OnOff,
    /// FUSE worker threads: the most that serve requests at once. With the spinning reader
    /// (`--spin-us`, on by default) one of them reads requests and the others wait until every
    /// reading worker has been busy with one request for 500 us (a request waiting on the
    /// disk), then join in. Default: 4, or one per CPU when there are more (at most 64).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=64), value_name = "N", help_heading = TRANSPORT)]
    pub threads: Option<u32>,
    /// What a FUSE worker's sleep and wakeup is worth, in microseconds of spinning (0 = never
    /// spin). An application waiting for durability sends its next request soon after each
    /// reply: taken by a worker still reading the device it costs no sleep and wakeup, which
    /// are most of a short request's round trip. After each request one worker keeps reading
    /// for a window it learns from how soon requests have followed replies - the one that would
    /// have cost them least, valuing each miss at this, at most twice this (ski rental; sqlite
    /// WAL commits 1.25-1.5x faster than with a fixed 20 us window; docs/design.md 14.8).
    /// Requests 40-60 us apart get a 60 us window, requests more than this apart none (but for
    /// one sample window in 64). The price is at most the window of CPU per request, none when
    /// the mount is idle.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u32).range(0..=1_000), value_name = "US", help_heading = TRANSPORT)]
    pub spin_us: u32,
    /// Seconds the kernel may cache attributes (0 = ask every time; strict atime).
    #[arg(long, default_value_t = fusefs::Timeouts::default().attr.as_secs_f64(), value_name = "SECONDS", help_heading = TRANSPORT)]
    pub attr_timeout: f64,
    /// Seconds the kernel may cache name lookups, and that a name does not exist (a negative
    /// entry: sqlite's hot-journal check or a PATH search asks once); 0 = ask every time.
    #[arg(long, default_value_t = fusefs::Timeouts::default().entry.as_secs_f64(), value_name = "SECONDS", help_heading = TRANSPORT)]
    pub entry_timeout: f64,
    /// Largest write in bytes the kernel sends in one request.
    #[arg(long, value_parser = parse_size, default_value = "1M", value_name = "SIZE", help_heading = TRANSPORT)]
    pub max_write: u64,

    /// Stay in the foreground (log to stderr) instead of starting a daemon. Off unless given.
    #[arg(long, short = 'f', help_heading = DAEMON)]
    pub foreground: bool,
    /// Most lower descriptors held for the objects the kernel knows (it keeps one inode per
    /// cached name, each held by an O_PATH descriptor). Past it the least recently used
    /// release theirs and reopen by file handle when used again, so a walk over more files
    /// than the open-file limit works. Releasing needs file handles (ext4, xfs, btrfs and
    /// tmpfs have them) and CAP_DAC_READ_SEARCH (root); without them nodes keep their
    /// descriptors. `nvstack stat` shows the counts. Default: half the open-file limit (which
    /// the daemon raises to its hard limit).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(16..), help_heading = DAEMON)]
    pub node_fds: Option<u64>,
    /// (internal) report readiness on stdout and then write to the log file.
    #[arg(long, hide = true)]
    #[serde(skip)]
    pub daemon: bool,
}

/// What the engine runs with where a flag is not given: the core's defaults
/// (`EngineConfig::default()` and the configurations it nests), the one place they are
/// written; the flags above take theirs from here. Made once, when the command line is parsed.
fn defaults() -> &'static EngineConfig {
    static DEFAULTS: LazyLock<EngineConfig> = LazyLock::new(EngineConfig::default);
    &DEFAULTS
}

/// A percent flag's default, from the core's share of the region.
fn percent(share: Share) -> u64 {
    match share {
        Share::Percent(p) => p,
        Share::Frames(_) => panic!("the default of a percent flag is a frame count: {share:?}"),
    }
}

/// `bytes` as a size flag's text (`32M`, `1088K`: the largest unit it is a whole number of),
/// for clap's `[default: ...]`. Clap parses a default as if it were typed, so it must read back
/// through `parse_size` to `bytes` (a test checks); it keeps defaults as `&'static str`, hence
/// the leak, a few bytes each time the command line is built.
fn size_text(bytes: u64) -> &'static str {
    let text = match ["K", "M", "G", "T"]
        .iter()
        .enumerate()
        .rev()
        .find(|&(i, _)| bytes != 0 && bytes % (1 << (10 * (i + 1))) == 0)
    {
        Some((i, unit)) => format!("{}{unit}", bytes >> (10 * (i + 1))),
        None => bytes.to_string(),
    };
    Box::leak(text.into_boxed_str())
}

/// `--writeback`: the core's policies (`WritebackPolicy`), spelled as their `name()`s (a test
/// checks), which `stat --json` shows too.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WritebackArg {
    File,
    Recency,
    Location,
    Relo,
}

impl WritebackArg {
    pub fn policy(self) -> WritebackPolicy {
        match self {
            WritebackArg::File => WritebackPolicy::File,
            WritebackArg::Recency => WritebackPolicy::Recency,
            WritebackArg::Location => WritebackPolicy::Location,
            WritebackArg::Relo => WritebackPolicy::Relo,
        }
    }
}

/// `--nbw`: the core's modes (`Nbw`), spelled as their `name()`s (a test checks).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum NbwArg {
    Off,
    AsyncFg,
    AsyncBg,
    Lazy,
}

impl NbwArg {
    pub fn mode(self) -> engine::Nbw {
        match self {
            NbwArg::Off => engine::Nbw::Off,
            NbwArg::AsyncFg => engine::Nbw::AsyncFg,
            NbwArg::AsyncBg => engine::Nbw::AsyncBg,
            NbwArg::Lazy => engine::Nbw::Lazy,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OnOff {
    On,
    Off,
}

impl From<bool> for OnOff {
    fn from(on: bool) -> OnOff {
        if on { OnOff::On } else { OnOff::Off }
    }
}

/// `--fsync-requests`: whether the kernel sends durability requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FsyncRequestsArg {
    Forward,
    Spare,
}

impl From<FsyncRequestsArg> for engine::FsyncRequests {
    fn from(a: FsyncRequestsArg) -> Self {
        match a {
            FsyncRequestsArg::Forward => engine::FsyncRequests::Forward,
            FsyncRequestsArg::Spare => engine::FsyncRequests::Spare,
        }
    }
}

/// `--direct-io`: which opens bypass the kernel's page cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DirectIoArg {
    Never,
    WriteOnly,
    Nvram,
}

/// The switch of process-level tests: `NVSTACK_FAILPOINT=<point>:<n>` SIGKILLs the daemon at
/// the n-th time it reaches `<point>` (names in core/src/transform.rs); with `:pause=<ms>`
/// appended it holds the request there that long instead (and says so in its log), for tests
/// of what else the daemon serves meanwhile.
#[derive(Debug)]
struct EnvFailpoint {
    point: String,
    remaining: std::sync::atomic::AtomicU64,
    pause: Option<Duration>,
}

impl engine::Failpoints for EnvFailpoint {
    fn hit(&self, point: &'static str) {
        use std::sync::atomic::Ordering;
        if point == self.point && self.remaining.fetch_sub(1, Ordering::SeqCst) == 1 {
            if let Some(pause) = self.pause {
                eprintln!("nvstack: failpoint {point}: pausing {} ms", pause.as_millis());
                std::thread::sleep(pause);
                eprintln!("nvstack: failpoint {point}: resumed");
                return;
            }
            // SAFETY: raising a signal at ourselves.
            unsafe { libc::raise(libc::SIGKILL) };
        }
    }
}

fn failpoints() -> Option<Arc<dyn engine::Failpoints>> {
    let spec = std::env::var("NVSTACK_FAILPOINT").ok()?;
    let (spec, pause) = match spec.rsplit_once(":pause=") {
        Some((spec, ms)) => (spec.to_string(), Some(Duration::from_millis(ms.parse().ok()?))),
        None => (spec, None),
    };
    let (point, n) = spec.rsplit_once(':')?;
    let n: u64 = n.parse().ok()?;
    Some(Arc::new(EnvFailpoint { point: point.to_string(), remaining: n.into(), pause }))
}

/// The engine's configuration for this mount: the flags, and the core's defaults for what has
/// no flag. Every field of the cache's and temp files' configurations is named here, so that
/// a new knob in the core is a compile error until the mount decides about it.
pub(super) fn engine_config(args: &MountArgs, layout: &nvram::Layout) -> CliResult<EngineConfig> {
    // A transform frees every frame of a file in one transaction (64 bytes of undo log per
    // frame); refuse a maximum the undo log cannot take.
    let frames = (args.tempfile_max_size + args.max_write).div_ceil(nvram::layout::FRAME_SIZE);
    if frames * 64 + 4096 > layout.undo_slot_size {
        let most = (layout.undo_slot_size - 4096) / 64 * nvram::layout::FRAME_SIZE;
        return Err(CliError::Usage(format!(
            "--tempfile-max-size {} is too large for this region's undo slots ({} each): at most \
             about {} (less --max-write), or format the region with larger slots",
            human(args.tempfile_max_size),
            human(layout.undo_slot_size),
            human(most.saturating_sub(args.max_write))
        )));
    }
    if args.dirty_low > args.dirty_high {
        return Err(CliError::Usage(format!(
            "--dirty-low {} is above --dirty-high {}",
            args.dirty_low, args.dirty_high
        )));
    }
    // A write-back batch frees its pages in one transaction, as a transform does.
    if args.writeback_batch * 64 + 4096 > layout.undo_slot_size {
        return Err(CliError::Usage(format!(
            "--writeback-batch {} is too large for this region's undo slots ({} each)",
            args.writeback_batch,
            human(layout.undo_slot_size)
        )));
    }
    if args.fsync_requests == FsyncRequestsArg::Spare && args.consistency != ConsistencyArg::Undo {
        let mode = clap::ValueEnum::to_possible_value(&args.consistency).expect("a named value");
        return Err(CliError::Usage(format!(
            "--fsync-requests spare needs --consistency undo (not {}): only there is every \
             operation durable when it returns; in journal mode an fsync commits the group",
            mode.get_name()
        )));
    }
    if args.direct_path == OnOff::On && args.consistency != ConsistencyArg::Undo {
        let mode = clap::ValueEnum::to_possible_value(&args.consistency).expect("a named value");
        return Err(CliError::Usage(format!(
            "--direct-path on needs --consistency undo (not {}): the library acknowledges a \
             write when its record is durable, and only undo mode's merge is durable when it \
             returns",
            mode.get_name()
        )));
    }
    let direct_logs = if args.direct_path == OnOff::On {
        let dir = super::logs::LogDir::open(&args.nvram).map_err(|e| {
            CliError::Other(format!(
                "the direct path's log directory beside {}: {e}",
                args.nvram.display()
            ))
        })?;
        Some(std::sync::Arc::new(dir) as std::sync::Arc<dyn engine::LogAreas>)
    } else {
        None
    };
    // Made now, not when the command line was parsed: the held files' default reads the
    // open-file limit, which the daemon has raised since.
    let defaults = EngineConfig::default();
    Ok(EngineConfig {
        cache: CacheConfig {
            enabled: args.cache == OnOff::On,
            policy: args.writeback.policy(),
            zone_blocks: args.zone_blocks,
            dirty_high: Share::Percent(args.dirty_high),
            dirty_low: Share::Percent(args.dirty_low),
            background: args.writeback_background == OnOff::On,
            batch_pages: args.writeback_batch,
            max_dirty_age: args.max_dirty_age,
            writeback_on_unmount: !args.keep_dirty,
            nbw: args.nbw.mode(),
            patch_limit: args.nbw_patch_limit.map_or(defaults.cache.patch_limit, |bytes| {
                PatchLimit::Frames((bytes / nvram::layout::FRAME_SIZE).max(1))
            }),
            held_files: defaults.cache.held_files,
        },
        temp: TempConfig {
            enabled: args.tempfiles == OnOff::On,
            max_size: args.tempfile_max_size,
            transform_on_unmount: !args.keep_tempfiles,
            share: Share::Percent(args.tempfile_share),
            writeback_batch: args.tempfile_writeback_batch,
            background: (args.tempfile_background != 0)
                .then_some(Share::Percent(args.tempfile_background)),
        },
        journal: JournalConfig {
            size_max: args.journal_size,
            interval_secs: args.checkpoint_interval,
        },
        failpoints: failpoints(),
        xattrs: args.xattrs == OnOff::On,
        passthrough: args.passthrough == OnOff::On,
        fsync_requests: args.fsync_requests.into(),
        direct_logs,
        ..defaults
    })
}

/// `--group-commit-size`, or `--journal-size`'s value.
pub(super) fn group_commit_size(args: &MountArgs) -> u64 {
    args.group_commit_size.unwrap_or(args.journal_size)
}

/// `--group-commit-interval`, or `--checkpoint-interval`'s value.
pub(super) fn group_commit_interval(args: &MountArgs) -> u64 {
    args.group_commit_interval.unwrap_or(args.checkpoint_interval)
}

/// Journal mode's group commits (the pool's options; the other modes ignore them). Without
/// their own flags they take the metadata journal's limits, as they did before they had flags:
/// a command line means what it meant.
pub(super) fn pool_options(args: &MountArgs) -> txn::OpenOptions {
    txn::OpenOptions {
        group_bytes_max: group_commit_size(args),
        group_interval_ns: match group_commit_interval(args) {
            0 => u64::MAX,
            secs => secs.saturating_mul(1_000_000_000),
        },
        ..txn::OpenOptions::default()
    }
}

/// Undo slots of a region this mount formats: as given, or a quarter of the region's size in
/// slots, 2 to 16 (small regions would be mostly undo log with 16).
pub(super) fn undo_slots(args: &MountArgs) -> u32 {
    args.undo_slots.unwrap_or_else(|| {
        u32::try_from(args.size / 4 / args.undo_slot_size.max(1)).unwrap_or(16).clamp(2, 16)
    })
}

/// `words`: the command line after the binary's name (`mount LOWER MOUNTPOINT ...`), passed to
/// the daemon unchanged.
pub fn run(args: &MountArgs, words: &[String]) -> CliResult {
    let mountpoint = rundir::canonical_mountpoint(&args.mountpoint)
        .map_err(|e| CliError::Usage(format!("mount point {}: {e}", args.mountpoint.display())))?;
    if rundir::is_stale(&mountpoint) {
        cleanup_stale(&mountpoint)?;
    }
    super::placement::check(&args.lower, &mountpoint)?;
    if args.foreground || args.daemon {
        return super::daemon::serve(args, &mountpoint);
    }
    start_daemon(words)
}

/// A mount point whose daemon died: detach it so that it can be mounted again.
fn cleanup_stale(mountpoint: &Path) -> CliResult {
    let c = std::ffi::CString::new(mountpoint.as_os_str().as_encoded_bytes())
        .map_err(|_| CliError::Usage("mount point contains a NUL byte".into()))?;
    // SAFETY: umount2 of a path; MNT_DETACH removes the dead FUSE mount lazily.
    let rc = unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    if rc != 0 {
        let status = Command::new("fusermount3").arg("-uz").arg(mountpoint).status();
        if !status.is_ok_and(|s| s.success()) {
            return Err(CliError::Other(format!(
                "{} is a stale mount (its daemon died) and could not be detached: {}",
                mountpoint.display(),
                std::io::Error::last_os_error()
            )));
        }
    }
    eprintln!(
        "nvstack: detached the stale mount at {} (its daemon had died)",
        mountpoint.display()
    );
    Ok(())
}

/// Starts this command again as the daemon, with exactly the words it was given plus
/// `--daemon` (no hand-made copy of the options that a new option could miss), in a new
/// session, and waits until it reports "ready" or fails. Relative paths mean the same to the
/// daemon: it starts in this working directory.
fn start_daemon(words: &[String]) -> CliResult {
    let exe = std::env::current_exe().map_err(|e| CliError::Other(e.to_string()))?;
    let mut command = Command::new(exe);
    command
        .args(words)
        .arg("--daemon")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: setsid in the child before exec: the daemon leaves our session and terminal.
    unsafe {
        command.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child =
        command.spawn().map_err(|e| CliError::Other(format!("cannot start the daemon: {e}")))?;
    let mut line = String::new();
    let _ = BufReader::new(child.stdout.take().expect("piped")).read_line(&mut line);
    if line.trim() == "ready" {
        return Ok(());
    }
    let mut stderr = String::new();
    let _ = std::io::Read::read_to_string(&mut child.stderr.take().expect("piped"), &mut stderr);
    let _ = child.wait();
    Err(CliError::Other(format!("mount failed: {}", stderr.trim().trim_start_matches("nvstack: "))))
}

/// FUSE worker threads: as given, or 4 (one per CPU when there are more).
pub(super) fn threads(args: &MountArgs) -> u32 {
    args.threads.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(4, |n| n.get() as u32).clamp(4, 64)
    })
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser, ValueEnum};
    use engine::EngineConfig;

    use super::*;

    #[derive(Debug, Parser)]
    #[command(name = "nvstack")]
    enum Words {
        Mount(MountArgs),
    }

    fn parse(words: &str) -> MountArgs {
        let Words::Mount(args) = Words::try_parse_from(words.split(' ')).expect("parses");
        args
    }

    /// The layout of the region a mount with `args` formats.
    fn layout(args: &MountArgs) -> nvram::Layout {
        nvram::Layout::compute(nvram::FormatParams {
            region_size: args.size,
            undo_slots: undo_slots(args),
            undo_slot_size: args.undo_slot_size,
        })
        .expect("a valid layout")
    }

    /// One place for defaults: a mount without flags runs with exactly the core's defaults,
    /// field by field, and so with the same limits in its region.
    #[test]
    fn a_mount_without_flags_runs_with_the_engine_defaults() {
        let args = parse("nvstack mount L M --nvram X");
        let layout = layout(&args);
        let built = engine_config(&args, &layout).expect("a configuration");
        let default = EngineConfig::default();
        // Exhaustive: a new field of EngineConfig fails to compile here until it is compared.
        let EngineConfig {
            max_handles,
            temp,
            max_walk,
            failpoints,
            xattrs,
            cache,
            journal,
            passthrough,
            fsync_requests,
            direct_logs,
        } = built;
        assert_eq!(max_handles, default.max_handles);
        assert_eq!(max_walk, default.max_walk);
        assert!(failpoints.is_none() && default.failpoints.is_none());
        assert_eq!(xattrs, default.xattrs);
        assert_eq!(passthrough, default.passthrough);
        assert_eq!(fsync_requests, default.fsync_requests);
        assert!(direct_logs.is_none() && default.direct_logs.is_none());
        assert_eq!(cache, default.cache);
        assert_eq!(temp, default.temp);
        assert_eq!(journal, default.journal);
        let frames = layout.nr_frames;
        assert_eq!(cache.limits(frames), default.cache.limits(frames));
        assert_eq!(temp.limits(frames), default.temp.limits(frames));
        // What the region-relative defaults come to in the default 256 MiB region.
        let limits = cache.limits(frames);
        assert_eq!(
            (limits.high_pages, limits.low_pages, limits.patch_limit),
            (frames * 8 / 10, frames * 6 / 10, frames / 8),
            "{frames} frames"
        );
        assert_eq!(temp.limits(frames).max_frames, frames * 9 / 10);
        assert_eq!(temp.limits(frames).background_frames, u64::MAX, "no background transforms");
    }

    /// Flags given reach the configuration as shares of the region, resolved by the core.
    #[test]
    fn percent_flags_become_shares_of_the_region() {
        let args = parse(
            "nvstack mount L M --nvram X --dirty-high 50 --dirty-low 10 --tempfile-share 40 \
             --tempfile-background 50 --nbw-patch-limit 1M",
        );
        let config = engine_config(&args, &layout(&args)).expect("a configuration");
        let limits = config.cache.limits(1000);
        assert_eq!((limits.high_pages, limits.low_pages, limits.patch_limit), (500, 100, 256));
        let temp = config.temp.limits(1000);
        assert_eq!((temp.max_frames, temp.background_frames), (400, 200));
        let args = parse("nvstack mount L M --nvram X --dirty-high 50 --dirty-low 60");
        assert!(engine_config(&args, &layout(&args)).is_err(), "--dirty-low above --dirty-high");
    }

    /// The CLI's spellings of the core's enums are the core's names (`stat --json` shows
    /// those), and every size default reads back to its value.
    #[test]
    fn value_names_are_the_cores_and_size_defaults_read_back() {
        for arg in WritebackArg::value_variants() {
            let name = arg.to_possible_value().expect("visible");
            assert_eq!(name.get_name(), arg.policy().name());
            assert_eq!(serde_json::to_value(arg).unwrap(), arg.policy().name());
        }
        for arg in NbwArg::value_variants() {
            let name = arg.to_possible_value().expect("visible");
            assert_eq!(name.get_name(), arg.mode().name());
            assert_eq!(serde_json::to_value(arg).unwrap(), arg.mode().name());
        }
        for bytes in [1 << 20, 32 << 20, nvram::layout::DEFAULT_UNDO_SLOT_SIZE, 4096, 1000, 3 << 30]
        {
            assert_eq!(parse_size(size_text(bytes)), Ok(bytes), "{}", size_text(bytes));
        }
        assert_eq!(size_text(nvram::layout::DEFAULT_UNDO_SLOT_SIZE), "1088K");
        Words::command().debug_assert();
    }

    /// Journal mode's group commits follow the metadata journal's flags unless given their own
    /// (a command line from before they had flags means what it meant).
    #[test]
    fn group_commits_follow_the_journal_flags_unless_given() {
        let ns = |args: &MountArgs| pool_options(args).group_interval_ns;
        let args = parse("nvstack mount L M --nvram X");
        let default = JournalConfig::default();
        assert_eq!(pool_options(&args).group_bytes_max, default.size_max);
        assert_eq!(ns(&args), default.interval_secs * 1_000_000_000);
        let args = parse("nvstack mount L M --nvram X --journal-size 8M --checkpoint-interval 0");
        assert_eq!((pool_options(&args).group_bytes_max, ns(&args)), (8 << 20, u64::MAX));
        let args = parse(
            "nvstack mount L M --nvram X --journal-size 8M --checkpoint-interval 3600 \
             --group-commit-size 2M --group-commit-interval 1",
        );
        assert_eq!((pool_options(&args).group_bytes_max, ns(&args)), (2 << 20, 1_000_000_000));
        assert_eq!((args.journal_size, args.checkpoint_interval), (8 << 20, 3600));
    }
}
