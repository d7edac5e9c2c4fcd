"""Experiments as data: which file systems x which workloads, at which scale and budget.

Scale rule: `scale` multiplies the papers' counts (files, transactions, bytes written, run
time); file sizes stay as in the paper. The memory budget M is given per experiment (the
thesis machine had 1 GiB); journal size J = 256 MiB x M / 1 GiB (the thesis' 256 MB log on a
1 GB machine); NVRAM region = M / 2 (inside M). Every value lands in each run's env.json.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from .fs import NVFAT_CACHE_KIB

THESIS_LOWER_EXT2 = ["nvstack-ext2", "nvstack-ext2-trans", "nvstack-ext2-tempffs",
                     "nvstack-ext2-wb", "nvstack-ext2-tempffs-trans", "nvstack-ext2-wb-trans",
                     "nvstack-ext2-tempffs-wb", "nvstack-ext2-tempffs-wb-trans"]
THESIS_FS = ["ext2", "ext4-journal", "ext4-journal-ram"] + THESIS_LOWER_EXT2
THESIS_FS_EXT4 = ["ext4-ordered"] + [n.replace("ext2", "ext4") for n in THESIS_LOWER_EXT2]

# The thesis matrix (issue 17 section 2): Table 4.2 at the thesis' own ratios, both memory
# accountings. Every nvstack configuration twice: NVRAM charged to M, NVRAM as an extra device.
THESIS_MATRIX_FS = (["ext2", "ext4-ordered", "ext4-journal", "ext4-journal-ram"]
                    + [f"{n}-{a}" for n in THESIS_LOWER_EXT2 for a in ("charged", "extra")])
THESIS_MATRIX_NOTES = [
    "The thesis' machine at scale s (default 0.1): Postmark's Fig 4.18 point (25k files, 200k "
    "transactions, 512 B-10 KB, no subdirectories, seed 42) x s, memory M = 1 GiB x s, so "
    "the working set keeps the thesis' ratio to memory (~130 MiB of files in 1 GiB).",
    "The kernel's write-back is the thesis machine's (Linux 2.6.12: background write-back "
    "past 10 % of memory, writers throttled past 40 %, pages dirty for 30 s written every "
    "5 s), set in bytes from M for each run (`kernel_dirty` in env.json) and restored after "
    "it: with the 24 GiB host's thresholds a run of M never writes back at all and ext2 "
    "measures the CPU. The 30 s expiry applies to runs that last longer than 30 s; ext2 "
    "alone finishes sooner and writes back by the background threshold.",
    "Memory accounting both ways, every nvstack configuration twice: `-charged` = an NVRAM "
    "region of M/2 allocated in full inside the run's memory cgroup before the mount (an "
    "NVRAM-based machine of equal memory, the thesis' model: the page cache gets what is "
    "left), `-extra` = the same region allocated outside the cgroup (M is DRAM, the region an "
    "extra device, as pmem and NVDIMMs are deployed). The kernel configurations get M; "
    "ext4-journal-ram (the thesis' Mext3) has its J = 256 MiB x s RAM journal taken from M.",
    "nvstack flags: Table 4.2 as in fs.py (TempFFS = --tempfiles on, WB = --cache on "
    "--writeback relo, Trans = --consistency undo; WB off = --cache off, Linux's write-back "
    "of the lower ext2), every other option at nvstack's default, including the metadata "
    "journal of undo mode (checkpoint every 5 s or at a quarter of the region).",
    "Device: the modeled hdd-7200 (the thesis' Maxtor 7200 rpm) with sleep timing, a fresh "
    "8 GiB image per run, caches dropped before the timed Postmark.",
]

# The thesis' Bonnie++, untar and 2 MB Postmark figures: the thesis matrix's machine (memory
# M = 1 GiB x scale, the kernel's write-back thresholds of Linux 2.6.12, hdd-7200), one
# accounting (the default: the region's pages are charged to the cgroup that touches them).
THESIS_FIGURE_NOTES = [
    "The thesis' machine at scale s as in thesis-matrix: memory M = 1 GiB x s (Bonnie++: the "
    "file is 2 x M, Bonnie++'s own rule; untar: a 71 MB tree in 256 MiB, the ratio of the "
    "thesis' ~230 MB Linux 2.6.12 tree to its 1 GiB; Postmark 2 MB: 25k files x s of 512 B-2 "
    "MB, ~25x M as in the thesis), the kernel's write-back thresholds of Linux 2.6.12 (10 % / "
    "40 % of M, 30 s expiry, restored after each run), the modeled hdd-7200 with sleep timing, "
    "a fresh 8 GiB image per run.",
    "Configurations: Table 4.2 against ext2, ext4 data=journal (the thesis' ext3 journal mode) "
    "and Mext3 (ext4 data=journal with its journal in RAM, taken from M), as in thesis-matrix "
    "but with one memory accounting: nvstack's region is M/2, charged to the run's cgroup page "
    "by page as the daemon touches it (thesis-matrix measured both accountings: within noise). "
    "The thesis' kernel compile (Figs 4.2/4.8/4.14/4.17, 'make') is not run: CPU-bound, "
    "'almost the same among all configurations' in the thesis.",
    "Wall time of the timed command alone (the sync after it is timed apart as "
    "sync_seconds): what the thesis measured. nvstack's Trans configurations are durable when "
    "the command returns; ext2 is not.",
]

def _thesis_figure(name: str, description: str, workload: tuple[str, str], reps: int,
                   memory: str, estimate: str, scale: float = 1.0) -> "Experiment":
    """One of the thesis' figure experiments on the thesis matrix's machine (hdd-7200, an
    8 GiB image, the thesis kernel's write-back thresholds, Table 4.2's configurations)."""
    return Experiment(name, description + ", the thesis machine's write-back thresholds",
                      THESIS_FS, [workload], baseline="ext2", reps=reps, memory=memory,
                      scale=scale, device="hdd-7200", disk="8G", kernel_dirty=(10, 40),
                      estimate=estimate, notes=THESIS_FIGURE_NOTES)


# The FUSE tax (issue: benchmark item). Same lower ext4 (fresh loop image per run) for all.
FUSE_TAX_FS = ["ext4", "passthrough_hp", "passthrough_hp-wt", "nvstack-none"]
FUSE_TAX_WORKLOADS = [("postmark", "fuse-tax"), ("fio", "tax-seq-write"),
                      ("fio", "tax-seq-write-1m"), ("fio", "tax-seq-read"),
                      ("fio", "tax-rand-write"), ("fio", "tax-rand-read")]
FUSE_TAX_NOTES = [
    "Lower file system: ext4 (data=ordered, 4 KiB blocks) on a plain loop device over an 8 GiB "
    "image file in the work directory (/var/tmp, the VM's ext4 root disk); a fresh image per "
    "run. The FUSE file systems are mounted over its directory `data/`.",
    "passthrough_hp = libfuse 3.14.0 example/passthrough_hp built from the Debian source "
    "package (bench/tools/build-passthrough-hp), run as shipped: it asks for "
    "FUSE_WRITEBACK_CACHE, so the kernel caches writes and sends them later in large "
    "batches. passthrough_hp-wt = the same source with only that request removed "
    "(write-through, as nvstack must be). Both with libfuse's default threads, splice on.",
    "Both passthrough_hp and nvstack keep one O_PATH descriptor per inode the kernel knows; "
    "RLIMIT_NOFILE is 20000 (soft = hard) on this VM and root cannot raise it (no "
    "CAP_SYS_RESOURCE), so Postmark uses 10k files (a 20k-file run fails with EMFILE on both).",
    "Memory budget M = 4 GiB per run (daemon + benchmark + page cache in one cgroup), large "
    "enough that the 1 GiB fio file and its double caching (FUSE + lower) never hit it: the "
    "tax measured is per-request cost, not cache duplication.",
    "nvstack runs as a pass-through: `--tempfiles off --cache off` (TempFFS and the NVRAM page "
    "cache are on by default since commits 7af3add and 31ff298; bench/results/fuse-tax was "
    "measured at 03f0741, before either existed, so these flags keep reruns comparable). A "
    "binary without the flags gets none (off is all it does).",
]

# Passthrough (issue 16): the same lower ext4 for all; nvstack with its defaults (routes on).
PASSTHROUGH_NOTES = [
    "Lower file system: ext4 (data=ordered, 4 KiB blocks) on a plain loop device over an 8 GiB "
    "image in the work directory (/var/tmp, the VM's disk), a fresh image per run; no modeled "
    "device: the data paths are measured, not a disk.",
    "fio files are laid out on the ext4 before nvstack mounts (prefill lower), so no page is "
    "in NVRAM and nvstack's default route for them is kernel passthrough; `nvstack-ext4-pt-off` "
    "is the same mount with --passthrough off (every IO a FUSE request, the NVRAM page cache "
    "taking the writes).",
    "Memory budget M = 4 GiB per run (daemon + benchmark + page cache in one cgroup), the "
    "256 MiB NVRAM region (/dev/shm) inside it; the 1 GiB file fits the page cache: per-request "
    "cost, not the disk, is what is compared. Postmark = the fuse-tax configuration (10k files, "
    "150k transactions, in memory).",
]

# TempFFS acceptance (issue 4): tempfiles off vs on over the same lower ext2, same consistency
# mode (undo, nvstack's default), and ext2 alone as the kernel baseline.
TEMPFFS_FS = ["ext2", "nvstack-ext2-trans", "nvstack-ext2-tempffs-trans"]
TEMPFFS_NOTES = [
    "Lower file system: ext2 (4 KiB blocks) on a plain loop device over a fresh 8 GiB image "
    "file in the work directory (/var/tmp, the VM's disk) per run, not the thesis' 7200 rpm "
    "disk: wall times are this VM's page cache and virtual disk (`--device hdd-7200` runs the "
    "same matrix on the modeled disk; add `--timing account` to keep it fast).",
    "Budget: memory M = 256 MiB per run (the thesis' 1 GiB x scale 0.25; daemon + Postmark + "
    "page cache in one cgroup) and an NVRAM region of 64 MiB inside M for both nvstack "
    "configurations (tempfiles off uses it for undo logs only). 64 MiB = 17 MiB of undo "
    "slots (16 x 1.06 MiB) + ~11.9k frames of 4 KiB (~46 MiB; `nvram.frames_total` in the "
    "tables), of which temp files may hold 90 % (nvstack's default `--tempfile-share`), ~10.7k "
    "frames. A temp file of 512 B-10 KB takes one object frame plus 1-3 data frames (~12 KiB, "
    "~3500 files in 10.7k frames), so at scale 0.25 the 1250- and 2500-file sets (~15 and ~30 MiB) should fit and 5000 and "
    "7500 (~60 and ~90 MiB) cannot: the thesis' TempFFS capacity also lay between its 10k and "
    "20k points. Every number in the TempFFS tables is stated with this budget; `--nvram` and "
    "`--memory` change it.",
    "nvstack runs: `--consistency undo` for both, `--tempfiles off` vs `--tempfiles on` "
    "(`--tempfile-max-size` left at its default, 1M; Postmark files stay below 10 KB). "
    "TempFFS counters are `nvstack stat --json` deltas over the timed Postmark and the sync "
    "after it; files still in NVRAM at unmount would be transformed after the stat, but "
    "Postmark deletes every file before it ends.",
    "Transactions: the thesis' 200k x scale (50k at 0.25, same transactions-per-file ratio); "
    "`--transactions N` sets them absolutely.",
]

# The showcase (scripts/demo): what nvstack is for. ext4 alone (its own fsyncs reach the modeled
# disk) vs nvstack with its defaults over the same ext4 (a commit is durable in NVRAM).
SHOWCASE_FS = ["ext4-ordered", "nvstack-ext4-defaults"]
SHOWCASE_WORKLOADS = [("sqlite", "wal"), ("sqlite", "delete"), ("maildir", "showcase"),
                      ("applog", "showcase")]
SHOWCASE_NOTES = [
    "Same device, same durability: both configurations run on a fresh 1 GiB image on the "
    "modeled hdd-7200 (sleep timing: a request's reply waits for its modeled completion) with "
    "a volatile write cache that only a flush makes durable. ext4-ordered = ext4 data=ordered "
    "alone: every fsync/fdatasync writes the data and the journal commit and flushes the "
    "disk's cache. nvstack-ext4-defaults = nvstack with every default (`--consistency undo`, "
    "TempFFS on, NVRAM page cache on, relo write-back) over the same ext4 (formatted the same "
    "way): a write or rename returns once it is durable in the NVRAM region (an undo-log "
    "transaction), so fsync of a file has nothing left to wait for; the region is 256 MiB in "
    "/dev/shm. Namespace changes of files and directories ext4 holds (sqlite's rollback "
    "journal, the Maildir's rename into new/) are applied to ext4 at once and made durable by "
    "a redo record in NVRAM (the metadata journal, checkpointed into ext4 every 5 s), so an "
    "fsync of a file or a directory waits for NVRAM only (`fsync.waited_on_lower` counts the "
    "exceptions). Until the metadata journal (git 828c23d) a directory fsync still committed "
    "ext4's journal: the rollback-journal and Maildir rows were 6.2x and 2.8x then.",
    "Each workload runs for 10 s (`--seconds`); tx/s = acknowledged transactions (COMMIT, "
    "fsync of new/, fdatasync returned) per second of the loop. Disk requests and bytes are "
    "`nvstack device stat` deltas over the timed loop and the sync after it, divided by the "
    "transactions. Pages nvstack keeps dirty in NVRAM (durable) are written back later "
    "(watermarks, unmount) and are not in these counters: `nv_writeback.pages_dirty` says how "
    "many were left.",
]

SHOWCASE_POSTMARK_NOTES = [
    "nvstack-ext2-tempffs-trans keeps new files in NVRAM (TempFFS) and transforms the least "
    "recently used into ext2 when the 18 MiB region (4 undo slots, ~3.3k frames) is full; the "
    "NVRAM page cache for existing files is off (`--cache off`, as when the README's first "
    "Postmark numbers were measured). Shrunk from 6000 files / 12,000 transactions with a "
    "TempFFS-off row (~7 min) to 3000 files / 6000 transactions (68 s measured) so that the whole "
    "`scripts/demo` stays under 10 minutes.",
    "The memory budget is small on purpose: the benchmark (and for nvstack the daemon and its "
    "NVRAM region) share one cgroup, so dirty pages must be written to the modeled disk during "
    "the run instead of dying in the page cache.",
]

# The write-back policies (issue 5 acceptance; thesis sec. 4.3, Figs 4.7, 4.10-4.12): ext2
# alone, the same nvstack stack with the NVRAM page cache off (Linux's write-back of ext2's
# page cache) and on with each of the four policies. Ratios are to WB file, as the thesis'.
WRITEBACK_FS = ["ext2", "nvstack-ext2-trans", "nvstack-ext2-wb-file", "nvstack-ext2-wb-recency",
                "nvstack-ext2-wb-location", "nvstack-ext2-wb-relo"]
WRITEBACK_WORKLOADS = [("postmark", "writeback"), ("fio", "wb-zipf-rewrite")]
WRITEBACK_NOTES = [
    "Configurations: `ext2` alone (the kernel baseline: its own page cache, Linux's write-back); "
    "`nvstack-ext2-trans` = nvstack `--consistency undo --tempfiles off --cache off` over ext2: "
    "the same stack without the NVRAM page cache, every write goes through to ext2, whose page "
    "cache Linux writes back file by file (the thesis' baseline); `nvstack-ext2-wb-<policy>` = "
    "the same with `--cache on --writeback file|recency|location|relo --max-dirty-age 0` (no "
    "write-back by age; otherwise nvstack's defaults: watermarks 80 % / 60 % of the frames, "
    "`--writeback-batch` 256 pages, `--zone-blocks` 1024 = 4 MiB). Ratios and improvements "
    "are relative to `WB file` (Linux's policy), as the thesis reports them.",
    "Budget: memory M = 64 MiB per run (daemon, benchmark, page caches and the NVRAM region in "
    "one cgroup) and an NVRAM region of 32 MiB inside M (M / 2) for every nvstack "
    "configuration: 7 undo slots (7.4 MiB) + ~6.2k frames of 4 KiB (~24 MiB; "
    "`nv_nvram.frames_total`); write-back starts above ~5.0k dirty pages (80 %) and stops at "
    "~3.7k (60 %) (`nv_writeback.high_pages` / `low_pages`). ext2 alone has all 64 MiB as page "
    "cache; with the cache off the region holds undo logs only. Every table row states M and "
    "NVRAM; `--memory` / `--nvram` change them.",
    "Postmark (thesis Fig 4.10): 512 B-10 KB, no subdirectories, seed 42, 20k transactions, "
    "2500 / 5000 / 7500 files: the live set (a record frame and 1-3 pages per file) is ~1.2x / "
    "2.3x / 3.5x the ~6.2k frames, so write-back runs at every point (the thesis saw no "
    "difference between policies below 15k files, where its working set fit in memory). With "
    "`--tempfiles off` Postmark's files are created in ext2 and their data (creation and "
    "appends) become dirty pages without lower blocks: their locations fall back to (file, "
    "page) order, so location-aware policies find runs within files only, and nvstack's "
    "inter-request distance counts only requests to pages that already have a block; the "
    "modeled disk's seek distance covers every request. Pages of files deleted while dirty "
    "are dropped, never written (`nv_cache.pages_dropped`). nvstack remembers written-back "
    "pages by (file handle, page), so a new file that reuses a deleted file's inode number "
    "does not count as a repeat. With a record frame per cached "
    "file the region can fill before the 80 % watermark: write-back then runs a batch at a "
    "time (`rounds.nvram_full`). 7500 files at most: RLIMIT_NOFILE is 20000 here and the "
    "daemon holds an O_PATH descriptor per live file and up to two more per cached file.",
    "fio `wb-zipf-rewrite` (rewrites, where recency and location matter): a 512 MiB file "
    "(131k pages, 16x the region) is laid out untimed on ext2 before nvstack is mounted (fio, "
    "1 MiB writes + fsync; the same physical layout for every configuration), caches are "
    "dropped, then 102,400 random 4 KiB overwrites (io_size 400 MiB), "
    "`random_distribution=zipf:1.1` (fio hashes the ranks over the file, so hot pages are "
    "scattered; with exact Zipf 1.1 the hottest 5k pages take ~84 % of the writes and ~18k "
    "distinct pages are written), psync, one job, `end_fsync=1` (every configuration ends "
    "durable: ext2 and the cache-off stack flush their page cache; nvstack's dirty NVRAM pages "
    "already are). Not laid out through the mount and then `nvstack flush`: nvstack remembers "
    "the pages it wrote back per mount (`repeated_pages`), so a prefill written back through "
    "the mount would make every timed write-back a repeat, and each policy's write-back order "
    "would lay the file out differently. `file` on a single file writes all its dirty pages in "
    "one batch per round (the whole cache, in ascending order).",
    "Why not Bonnie++ rewrite (thesis Fig 4.7): its rewrite is one sequential pass (read, "
    "modify and write each block once, ascending), so no page is dirtied twice while in NVRAM "
    "and LRU order = file order = disk order: recency, location and relo pick the same pages "
    "in the same order and only file's whole-file batches differ; its read and seek phases "
    "(minutes on hdd-7200) measure no write-back. `thesis-bonnie` runs the Table 4.2 WB "
    "configurations on it.",
    "Counters (`nvstack stat --json` deltas over the timed command and the sync after it): "
    "`nv_writeback.pages_written`, `batches`, `requests` (lower write requests: runs "
    "contiguous in file and on disk), `syncs` (fsync or syncfs: one per write-back call of "
    "at most NR_WB pages), `repeated_pages` (written back more than once: Fig "
    "4.12), `inter_request_distance_blocks` (accumulated: Fig 4.11), `rounds.<reason>`; "
    "`nv_cache.hits`, `fetches`, `pages_dropped`, `write_through`; `nv_writeback.pages_dirty` "
    "as read after (still in NVRAM, durable; written back at unmount, after the measurement). "
    "Device: the modeled hdd-7200 (the thesis' Maxtor 7200 rpm) with sleep timing, a fresh "
    "2 GiB image per run (`dev_*`: busy time, bytes, requests, seek distance).",
]

# Issue 13's benchmark: every durability point at NVRAM speed. Side by side in one run on the
# modeled hdd-7200 and ssd: ext4 alone vs nvstack over ext4 in each consistency mode.
DURABILITY_NV = ["nvstack-ext4-defaults", "nvstack-ext4-defaults-journal"]
# fsync-bound: an application waits for each durability point (ratio to ext4 data=ordered)
DURABILITY_FSYNC = [("sqlite", "wal"), ("sqlite", "delete"), ("applog", "showcase"),
                    ("maildir", "showcase"), ("filecreate", "fsync"), ("postmark", "sync")]
# the VMA journaling paper's own workloads (ratio to ext4 data=journal, its "journal mode")
DURABILITY_PAPER = [("fio", "seq_write-150m"), ("postmark", "vma"), ("untar", "linux-fs-net")]
DURABILITY_NOTES = [
    "Same device, same durability, one run: each device model (hdd-7200 and ssd, sleep timing: "
    "a request's reply waits for its modeled completion; a volatile write cache only a flush "
    "makes durable) gets a fresh 2 GiB image per run. ext4-ordered = ext4 data=ordered alone "
    "(its fsyncs reach the disk); ext4-journal = ext4 data=journal with a 256 MiB internal "
    "journal (the VMA paper's ext3 journal mode: data integrity); nvstack-ext4-defaults "
    "(`--consistency undo`: every operation durable when it returns) and "
    "nvstack-ext4-defaults-journal (`--consistency journal`: durable at the next group commit, "
    "which fsync, fdatasync and O_SYNC writes make) = nvstack with TempFFS and the NVRAM page "
    "cache on, a 256 MiB region in /dev/shm, over ext4 data=ordered formatted like "
    "ext4-ordered. Memory budget M = 1 GiB per run (cgroup; the region inside it).",
    "fsync-bound rows (ratio to ext4-ordered): sqlite3 synchronous=FULL in WAL and rollback "
    "journal (DELETE) mode, one INSERT per COMMIT; 512 B append + fdatasync; Maildir delivery "
    "(write tmp/N, fsync, rename into new/, fsync new/); create + write 4 KiB + fsync + close "
    "of many files in one directory (fs_mark -S 1 style, at most 10,000); each 5 s "
    "(`--seconds`), ops/s = acknowledged operations per second of the loop. Sync-PostMark: "
    "Postmark (200 files of 512 B-16 KB in 10 directories, 400 transactions, 4 KiB unbuffered "
    "IO) with every write synchronous by the `sync` mount option (MS_SYNCHRONOUS: the kernel "
    "follows each write(2) with a data sync, on FUSE one FSYNC request per WRITE; ext4 also "
    "commits each namespace change); ops/s = Postmark transactions per wall-clock second of "
    "the whole run (file set creation and deletion included).",
    "The paper's workloads (ratio to ext4-journal): 8 KiB appends to one file up to 150 MB, then "
    "fsync (fio seq_write at 1/4 of the paper's 600 MB); Postmark as the paper ran it (10k "
    "files of 500 B-9.77 KB in 200 directories, 25k transactions, no fsync); untar of Linux "
    "6.1's fs/ and net/ (3,965 files, 71 MB; the paper: Linux 2.6.11, 17,090 files). The "
    "metric is the time until everything is durable: the timed command, then `sync`, then an "
    "fsync of a marker file on the measured file system (`durable.py sync-point`; for nvstack "
    "in journal mode the group commit; sync(2) does not reach a FUSE daemon); `durable_seconds` "
    "= the three together; the command alone is in the tables too.",
    "Per operation: disk requests / flushes / bytes / busy time are `nvstack device stat` "
    "deltas over the timed command and the sync after it; fsync calls and fsync.waited_on_lower "
    "are `nvstack stat` deltas: a durability call that still waited for the lower file system. "
    "Pages and temp files nvstack keeps in NVRAM (durable) reach ext4 later and are not in "
    "these counters.",
]


@dataclass(frozen=True)
class Experiment:
    name: str
    description: str
    fs: list[str]
    workloads: list[tuple[str, str]]      # (workload module, its config name)
    baseline: str                         # summary ratios are relative to this configuration
    reps: int = 3
    memory: str = "1G"                    # budget M
    scale: float = 1.0
    device: str = "hdd-7200"              # preferred; falls back to plain loop if unavailable
    disk: str = "8G"
    estimate: str = ""                    # how long, for the README and `list`
    notes: list[str] = field(default_factory=list)
    nvram: str | None = None              # NVRAM region size; default M / 2 (inside M)
    # "module:config" -> the configurations that run it (a subset of fs; default: all of fs)
    workload_fs: dict[str, list[str]] = field(default_factory=dict)
    # "module:config" -> the configuration its ratios are relative to (default: baseline)
    baselines: dict[str, str] = field(default_factory=dict)
    # workload parameters set absolutely (unscaled) for this experiment; --seconds & co. win
    overrides: dict = field(default_factory=dict)
    # after the timed command and its sync: durable.py sync-point on the measured FS (the
    # group commit of nvstack's journal mode), timed as sync_point_seconds
    sync_point: bool = False
    # (background %, dirty %) of M: the kernel's write-back thresholds of the machine the budget
    # models, set for each run (runner.kernel_dirty_settings); None: the host's own
    kernel_dirty: tuple | None = None
    # configurations the experiment also knows but runs only when `--fs` names them (a
    # variant of a default configuration that answers one question, not the whole matrix)
    optional_fs: list[str] = field(default_factory=list)

    def fs_for(self, workload: str, config: str) -> list[str]:
        """The configurations that run workload:config, in the order of fs."""
        wanted = self.workload_fs.get(f"{workload}:{config}", self.fs)
        return [f for f in self.fs if f in wanted]

    def baseline_for(self, workload: str, config: str) -> str:
        return self.baselines.get(f"{workload}:{config}", self.baseline)

    @property
    def devices(self) -> list[str]:
        """The device models, in run order ("hdd-7200,ssd": both, side by side)."""
        return [d for d in self.device.split(",") if d]


NVFAT_NOTES = [
    "FAT on this kernel (no vfat module) is `nvstack device serve-fat`: the fatfs crate in user "
    "space over a sector buffer cache, through the same modeled device (flash model, volatile "
    "cache, NVRAM cache, counters) - see docs/nvfat.md. Async writes back as Linux 2.6's vfat "
    "did (every 5 s what is 30 s old; everything past 8 MiB dirty); Sync (-o sync) writes what "
    "each change dirtied and flushes the device before answering; with an NVRAM cache the server "
    "writes metadata through at the end of every change (NVFAT).",
    "Time: wall-clock seconds of Postmark (the paper's execution time) in sleep timing; "
    "durable_seconds adds the write-back of what the file system still held (`sync MNT`: an "
    "fsync of its root; the NVRAM cache is not drained). "
    "Erase counts, energy and histograms are the device's after the run and its flush (mkfs "
    "before it erases nothing on the fresh chip).",
    "Memory: the 64 MiB cgroup holds Postmark; the FAT server's buffer cache (64 MiB read cache, "
    "8 MiB dirty) is outside it, as the kernel's buffer cache would be in the paper's 64 MiB "
    "machine. One repetition per point (the paper reports one).",
]

NBW_NOTES = [
    "Memory (the experiment's defaults; --scale, --memory, --nvram and --disk change them, "
    "and the line below names what this run used): a cgroup budget of 512 MiB for every "
    "configuration, the 128 MiB NVRAM region inside it for nvstack (charged: nvstack's page "
    "cache gets 384 MiB); the 1.25 GiB file (5 GB x scale 0.25) is 2.5x the budget, laid out "
    "on the kernel FS before the mount and the caches dropped, so every page starts cold (fio "
    "invalidate=1). The paper's own configuration is --scale 1 --memory 2G --nvram 512M "
    "--disk 8G: a 5 GiB file, 60 s runs, a 64 MiB patch limit (its 64 MB).",
    "Durability is not the same: ext4's buffered writes are durable only after a later "
    "sync, nvstack's when the write returns (as in the paper, whose baseline is Linux's "
    "page cache); the rows compare the cost of a partial write to a cold page.",
    "Run time: 60 s x scale (15 s at the default 0.25) per run, one repetition by default "
    "(time-based: ops/s).",
]


EXPERIMENTS: dict[str, Experiment] = {e.name: e for e in [
    Experiment("smoke", "2 file systems x 1 small Postmark: checks the whole pipeline",
               ["ext2", "ext4-ordered"], [("postmark", "smoke")], baseline="ext2", reps=2,
               memory="128M", scale=1.0, disk="2G", estimate="~15 s measured, plain loop and hdd-7200 "
               "(fits the budget: ~1 MiB reaches the disk)"),
    Experiment("showcase", "the README demo, part 1: applications that wait for durability "
               "(sqlite3 synchronous=FULL in WAL and rollback-journal mode, Maildir delivery, "
               "512 B append + fdatasync log) on ext4 alone and on nvstack (defaults) over "
               "ext4, the modeled 7200 rpm disk with sleep timing; tx/s, disk requests and "
               "bytes per transaction",
               SHOWCASE_FS, SHOWCASE_WORKLOADS, baseline="ext4-ordered",
               reps=1, memory="1G", nvram="256M", scale=1.0, disk="1G",
               estimate="94 s measured on hdd-7200, sleep timing (8 runs of 10 s + setup)",
               notes=SHOWCASE_NOTES),
    Experiment("showcase-postmark", "the README demo, part 3: ext2 vs nvstack (TempFFS on, "
               "--consistency undo) over ext2, one short asynchronous Postmark on the modeled "
               "7200 rpm disk with a small memory budget; prints wall time, modeled disk busy "
               "time, bytes written, requests",
               ["ext2", "nvstack-ext2-tempffs-trans"],
               [("postmark", "showcase")], baseline="ext2",
               reps=1, memory="32M", nvram="18M", scale=1.0, disk="1G",
               estimate="68 s measured on hdd-7200, sleep timing (ext2 11 s, nvstack 51 s)", notes=SHOWCASE_POSTMARK_NOTES),
    Experiment("thesis-postmark", "thesis Figs 4.3/4.10/4.15/4.18: Postmark 512 B-10 KB, "
               "200k tx, 5k-30k files, Table 4.2 configurations",
               THESIS_FS, [("postmark", "thesis")], baseline="ext2",
               memory="256M", scale=0.25, estimate="~6-10 h at scale 0.25 (11 FS x 6 x 3 reps)"),
    Experiment("thesis-matrix", "issue 17 section 2: the thesis' Table 4.2 configurations "
               "(thesis Figs 4.15 and 4.18: Postmark 512 B-10 KB, 25k files, 200k tx, x scale) "
               "against ext2, ext4 ordered, ext4 data=journal and Mext3 on hdd-7200, the "
               "kernel's write-back thresholds of the thesis' machine, NVRAM charged to the "
               "budget and as an extra device",
               THESIS_MATRIX_FS, [("postmark", "thesis-matrix")], baseline="ext2", reps=3,
               memory="102M", scale=0.1, device="hdd-7200", disk="8G", kernel_dirty=(10, 40),
               estimate="~70 min at scale 0.1 (20 configurations x 3 reps; ext2 ~6 s, "
                        "ext4-journal ~45 s, nvstack ~60-80 s per run)",
               notes=THESIS_MATRIX_NOTES),
    _thesis_figure("thesis-postmark-2m", "thesis Fig 4.19: Postmark 512 B-2 MB, 25k files, "
                   "200k tx x scale, memory M = 1 GiB x scale", ("postmark", "thesis-2m"),
                   reps=1, memory="51M", scale=0.05,
                   estimate="hours at scale 0.05 (ext2 alone wrote 2.3 GB in its first 3 min, "
                   "~15 min a run estimated); measured at --scale 0.005 (18 min, 11 runs; at "
                   "--memory 36M the TempFFS+WB daemons were OOM-killed by the cgroup)"),
    _thesis_figure("thesis-bonnie", "thesis Figs 4.1/4.7/4.13/4.16: Bonnie++ char write, "
                   "block write, rewrite; file = 2 x M, M = 1 GiB x scale",
                   ("bonnie", "thesis"), reps=3, memory="128M",
                   estimate="27 min measured (33 runs, 28-83 s each at M = 128 MiB)"),
    _thesis_figure("thesis-untar", "thesis Figs 4.2/4.8/4.14/4.17: untar of Linux 6.1 fs/ + "
                   "net/ (71 MB) with M = 256 MiB, the thesis' tree-to-memory ratio (its 2.6.12 "
                   "tree, ~230 MB, on 1 GiB)", ("untar", "linux-fs-net"), reps=3,
                   memory="256M", estimate="5 min measured (33 runs; needs bench/install.sh "
                   "--with-linux-source)"),
    Experiment("tempffs-postmark", "TempFFS acceptance (issue 4; thesis Figs 4.3-4.6, TempFFS "
               "paper Figs 3-6): Postmark 512 B-10 KB, 5k/10k/20k/30k files and 200k "
               "transactions x scale, on ext2 and on nvstack (undo) over ext2 with tempfiles "
               "off vs on; throughput, files deleted in NVRAM, lower-FS bytes written, file span",
               TEMPFFS_FS, [("postmark", "tempffs")], baseline="ext2", reps=3,
               memory="256M", nvram="64M", scale=0.25, device="none", disk="8G",
               estimate="~15 min at scale 0.25 (estimated, 12-20 min: 3 FS x 4 x 3 reps, "
               "nvstack ~25-45 s per run)", notes=TEMPFFS_NOTES),
    Experiment("writeback-policies", "write-back policies (issue 5 acceptance; thesis sec. "
               "4.3, Figs 4.7, 4.10-4.12): the NVRAM page cache with file / recency / location "
               "/ relo write-back vs the cache off and ext2 alone: Postmark 512 B-10 KB (2500 / "
               "5000 / 7500 files, 20k tx) and fio Zipf-1.1 random 4 KiB rewrites of a 512 MiB "
               "file; wall time vs WB file, pages written, repeated pages, inter-request "
               "distance, modeled disk busy time",
               WRITEBACK_FS, WRITEBACK_WORKLOADS, baseline="nvstack-ext2-wb-file", reps=3,
               memory="64M", nvram="32M", scale=1.0, device="hdd-7200", disk="2G",
               estimate="~5 h on hdd-7200, sleep timing, 72 runs (measured: fio 38 min for its "
               "18 runs; a Postmark WB run ~3.2 min at 2500 files, ~6.5 min at 5000; 7500 not "
               "run, ~10 min estimated)", notes=WRITEBACK_NOTES),
    Experiment("vma", "VMA journaling paper: seq_write, rnd_write, file_delete, postmark, untar "
               "under ext4 writeback/ordered/journal vs nvstack journal mode",
               ["ext4-writeback", "ext4-ordered", "ext4-journal", "nvstack-ext4-journal"],
               [("fio", "seq_write"), ("fio", "rnd_write"), ("filedelete", "vma"),
                ("postmark", "vma"), ("untar", "linux-source")],
               baseline="ext4-journal", memory="512M", scale=0.25, estimate="~2-3 h"),
    Experiment("nbw", "Non-blocking writes (issue 14; the paper's Fig 10: Filebench "
               "personalities at sub-4 KB sizes with fio): sequential write, random write, "
               "random read/write (2 jobs) of 128 B-4 KiB on a pre-written file 2.5x the "
               "memory budget whose pages are cold (laid out before nvstack mounts), ext4 "
               "alone vs nvstack (defaults) with --nbw off, async-fg, async-bg, lazy",
               ["ext4-ordered"] + [f"nvstack-ext4-nbw-{m}" for m in
                                   ("off", "async-fg", "async-bg", "lazy")],
               [("fio", "nbw-seq-write"), ("fio", "nbw-random-write"),
                ("fio", "nbw-random-readwrite")], baseline="ext4-ordered", reps=1,
               memory="512M", nvram="128M", scale=0.25, device="hdd-7200,ssd", disk="4G",
               estimate="~35 s a run (1.25 GiB layout on the modeled disk + 15 s of fio): "
               "150 runs ~1.5 h; --device and --variants iosize=N run parts",
               notes=NBW_NOTES,
               optional_fs=[f"nvstack-ext4-nbw-{m}-bgwb" for m in
                            ("off", "async-fg", "async-bg", "lazy")]),
    Experiment("nvfat", "NVFAT paper (issue 15), Figures 4-8: Async- and Sync-PostMark (-o sync) "
               "on a 32 MiB FAT volume on the flash model (K9F1208 behind a log-block FTL with 64 "
               "log blocks): VFAT vs NVFAT with 1-128 KiB of NVRAM metadata write cache",
               ["vfat"] + [f"nvfat-{k}k" for k in NVFAT_CACHE_KIB],
               [("postmark", "nvfat-async"), ("postmark", "nvfat-sync")], baseline="vfat",
               reps=1, memory="64M", device="flash", disk="32M",
               estimate="~40 min on flash, sleep timing, 18 runs (measured: VFAT Sync ~5 min, "
               "Async ~1.5 min; NVFAT runs shorter)", notes=NVFAT_NOTES),
    Experiment("nvfat-ext4", "issue 15: the NVFAT cache in front of ext4 -o sync on hdd-7200 "
               "(Sync-PostMark as in the durability experiment): ext4 alone vs the same ext4 with "
               "a 128 KiB, 4 MiB or 64 MiB NVRAM metadata write cache in the device",
               ["ext4-ordered", "ext4-ordered-nvcache-128k", "ext4-ordered-nvcache-4m",
                "ext4-ordered-nvcache-64m"],
               [("postmark", "sync")], baseline="ext4-ordered", reps=2, memory="1G",
               device="hdd-7200", disk="2G", estimate="~3 min (8 runs of ~20 s)",
               notes=["ext4 is mounted -o sync (the workload's mount option); the device's NVRAM "
                      "cache absorbs what its classifier calls ext4 metadata: superblocks, group "
                      "descriptors, bitmaps, inode tables, directory and extent blocks, and the "
                      "journal"]),
    Experiment("fuse-tax", "the FUSE tax: Postmark and fio 4 KiB sequential and random read/write "
               "(+ 1 MiB sequential write) on the lower ext4 vs libfuse passthrough_hp (as shipped, and write-through) vs "
               "nvstack --consistency none, all over the same ext4 directory",
               FUSE_TAX_FS, FUSE_TAX_WORKLOADS, baseline="ext4", reps=3, memory="4G",
               nvram="256M", scale=1.0, device="none", disk="8G",
               estimate="24 min measured (4 FS x 6 workloads x 3 reps)",
               notes=FUSE_TAX_NOTES),
    Experiment("fuse-tax-threads", "nvstack none: FUSE worker threads 1/2/4/8 vs passthrough_hp "
               "(the fuse-tax workloads)",
               ["passthrough_hp", "nvstack-none-t1", "nvstack-none-t2", "nvstack-none",
                "nvstack-none-t8"], FUSE_TAX_WORKLOADS, baseline="passthrough_hp", reps=2,
               memory="4G", nvram="256M", scale=1.0, device="none", disk="8G",
               estimate="~35 min", notes=FUSE_TAX_NOTES),
    Experiment("durability", "issue 13: every durability point at NVRAM speed. ext4 alone vs "
               "nvstack over ext4 in undo and journal mode, on hdd-7200 and ssd in one run: "
               "sqlite WAL / rollback journal, 512 B append + fdatasync, Maildir delivery, "
               "create+write+fsync of many files, Sync-PostMark (ratios to ext4 data=ordered); "
               "the VMA paper's 8 KiB appends, Postmark and untar (ratios to ext4 data=journal); "
               "ops/s, disk requests and fsyncs that waited for the disk per operation",
               ["ext4-ordered", "ext4-journal", *DURABILITY_NV],
               DURABILITY_FSYNC + DURABILITY_PAPER, baseline="ext4-ordered",
               workload_fs={**{f"{w}:{c}": ["ext4-ordered", *DURABILITY_NV]
                               for w, c in DURABILITY_FSYNC},
                            **{f"{w}:{c}": ["ext4-journal", *DURABILITY_NV]
                               for w, c in DURABILITY_PAPER}},
               baselines={f"{w}:{c}": "ext4-journal" for w, c in DURABILITY_PAPER},
               overrides={"seconds": 5.0}, sync_point=True, reps=1, memory="1G",
               nvram="256M", scale=1.0, device="hdd-7200,ssd", disk="2G",
               estimate="9 min measured for the 54 runs; bench/run durability adds 16 "
                        "recovery runs (6-8 min measured)", notes=DURABILITY_NOTES),
    Experiment("durability-spare", "issue 45 item 1: the durability experiment's fsync-bound "
               "rows with nvstack's defaults beside `--fsync-requests spare` (the kernel told once "
               "not to send fsync requests) and ext4 alone, on hdd-7200 and ssd in one run",
               ["ext4-ordered", "nvstack-ext4-defaults", "nvstack-ext4-spare"],
               DURABILITY_FSYNC, baseline="ext4-ordered",
               overrides={"seconds": 5.0}, reps=1, memory="1G", nvram="256M", scale=1.0,
               device="hdd-7200,ssd", disk="2G",
               estimate="about 6 min for the 36 runs",
               notes=DURABILITY_NOTES[:2] + [
                   "nvstack-ext4-spare = nvstack-ext4-defaults with `--fsync-requests spare`: "
                   "the same durability (every operation durable when it returns, the lower "
                   "file system's changes outside NVRAM synced by their own operation), one "
                   "FUSE request less per durability call, no passthrough (docs/design.md "
                   "13.7)."]),
    Experiment("durability-quick", "the durability experiment shrunk for a smoke run (both "
               "devices, 1 s loops, counts x 0.1, untar of Linux's kernel/ only)",
               ["ext4-ordered", "ext4-journal", *DURABILITY_NV],
               DURABILITY_FSYNC + DURABILITY_PAPER[:2] + [("untar", "linux-kernel")],
               baseline="ext4-ordered",
               workload_fs={**{f"{w}:{c}": ["ext4-ordered", *DURABILITY_NV]
                               for w, c in DURABILITY_FSYNC},
                            **{f"{w}:{c}": ["ext4-journal", *DURABILITY_NV]
                               for w, c in DURABILITY_PAPER[:2] + [("untar", "linux-kernel")]}},
               baselines={f"{w}:{c}": "ext4-journal"
                          for w, c in DURABILITY_PAPER[:2] + [("untar", "linux-kernel")]},
               overrides={"seconds": 1.0}, sync_point=True, reps=1, memory="1G",
               nvram="256M", scale=0.1, device="hdd-7200,ssd", disk="2G",
               estimate="3.5 min measured for the 54 runs", notes=DURABILITY_NOTES),
    Experiment("passthrough", "issue 16: no tax where NVRAM cannot help. fio 4 KiB and 1 MiB "
               "sequential/random reads and writes of an existing 1 GiB file and in-memory "
               "Postmark: ext4 alone vs nvstack with its defaults (kernel passthrough for lower "
               "files with nothing in NVRAM) vs nvstack --passthrough off",
               ["ext4-ordered", "nvstack-ext4-defaults", "nvstack-ext4-pt-off", "nvstack-ext4-dio",
                "nvstack-ext4-dio-never"],
               [("fio", w) for w in ("pt-seq-read-4k", "pt-rand-read-4k", "pt-seq-write-4k",
                                     "pt-rand-write-4k", "pt-seq-read-1m", "pt-seq-write-1m")]
               + [("postmark", "fuse-tax")], baseline="ext4-ordered", reps=2, memory="4G",
               nvram="256M", scale=1.0, device="none", disk="8G",
               estimate="~25 s a fio run (1 GiB layout + 15 s), ~1 min a Postmark run: 42 runs "
                        "~20 min", notes=PASSTHROUGH_NOTES),
    Experiment("fuse-tax-knobs", "nvstack none: command-line knobs (max_write 128K, "
               "attr/entry timeout 0) vs defaults and passthrough_hp",
               ["passthrough_hp", "nvstack-none", "nvstack-none-mw128k", "nvstack-none-notimeout"],
               FUSE_TAX_WORKLOADS, baseline="passthrough_hp", reps=2, memory="4G",
               nvram="256M", scale=1.0, device="none", disk="8G", estimate="~25 min",
               notes=FUSE_TAX_NOTES),
]}
