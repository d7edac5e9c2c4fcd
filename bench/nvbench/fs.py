"""File-system configurations as data, and how to set each one up and tear it down.

Kernel configurations (the papers' baselines):
  ext2              ext2
  ext4-ordered      ext4, data=ordered (metadata journaling; Linux default)
  ext4-writeback    ext4, data=writeback (VMA paper's 'writeback mode')
  ext4-journal      ext4, data=journal, internal journal of J bytes (the thesis' "Ext3")
  ext4-journal-ram  ext4, data=journal, external journal of J bytes on a loop device over a
                    /dev/shm file (the thesis' "Mext3": logs on MRAM)
  vfat              FAT (the NVFAT paper's baseline): the kernel's vfat where it exists, else
                    `nvstack device serve-fat` (fatfs in user space) on the same modeled device
  nvfat-<N>k        NVFAT: vfat with an NVRAM metadata write cache of N KiB in the device
                    (`device attach --nvram R --nvram-cache-size NK`; the FAT server then writes
                    metadata through to it at the end of every change)

nvstack configurations: nvstack mounted over a lower ext2/ext4 with the thesis' Table 4.2
features as flags: TempFFS = --tempfiles on, WB = the NVRAM page cache with relo write-back
(--cache on --writeback relo), Trans = --consistency undo. A configuration without WB runs with
--cache off: writes go straight to the lower file and the lower FS's page cache does Linux's own
(file-by-file) write-back, the thesis' baseline. `nvstack-<lower>` with every feature off
(tempfiles off, cache off, consistency none) is the FUSE-tax baseline. `nvstack-<lower>-journal`
is the VMA-journaling mode. `nvstack-ext2-wb-<policy>` (experiment writeback-policies): the page
cache on over ext2 with one of the four write-back policies (file, recency, location, relo),
--consistency undo, tempfiles off.

FUSE-tax configurations (experiment fuse-tax): `ext4` (ext4 data=ordered, the lower FS itself),
`passthrough_hp` / `passthrough_hp-wt` (libfuse's example, built by bench/tools/build-passthrough-hp;
-wt = without FUSE_WRITEBACK_CACHE), `nvstack-none` (nvstack --consistency none as a pass-through:
its defaults except that TempFFS and the NVRAM page cache are off, as when bench/results/fuse-tax
was measured, before either existed) and `nvstack-none-*` variants with one command-line knob
changed (threads, max_write, timeouts). Both keep one O_PATH descriptor per inode the kernel
knows, so RLIMIT_NOFILE bounds the number of files a workload may keep alive (20000 on this VM;
root cannot raise it here).

Block devices: `--device none` = a plain loop device over an image file (losetup --find --show);
`--device MODEL` = `nvstack device attach` (FUSE-served image with a modeled disk).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from .cgroup import MemoryCgroup
from .nvstack import Capabilities
from .shell import Shell
from .util import BenchError, fmt_size

# nvstack mount flags of the mechanisms (Table 4.2: TempFFS, the NVRAM page cache of WB) and the
# value that switches each off. A binary without the flag has not built the mechanism, so off is
# all it does: off values are passed only if `nvstack mount --help` lists the flag; on values
# need it (the configuration is skipped with the reason otherwise).
# `passthrough` (issue 16, on by default since 2026-11-25): a lower file with nothing in NVRAM
# is served by the kernel, so its writes never reach the NVRAM page cache. The thesis' and the
# papers' configurations name it off: they measure their mechanisms, which saw every write
# (from 2026-11-25 to 2026-11-28 they did not name it, and Table 4.2's WB and FUSE-Ext2 rows
# measured the kernel's passthrough instead: docs/benchmarks.md "Passthrough in the thesis
# configurations").
NVSTACK_FEATURE_OFF = {"tempfiles": "off", "cache": "off", "passthrough": "off"}
# settings of a mechanism -> the mechanism: passed (and their flag needed) only while it is on
# (a write-back policy means nothing with the page cache off)
NVSTACK_SETTINGS = {"writeback": "cache"}
WRITEBACK_POLICIES = ("file", "recency", "location", "relo")

# How the NVRAM region (a /dev/shm file) is charged to the run's memory cgroup:
#   touched  the daemon creates it; a page counts against M when the daemon first touches it
#            (the experiments before the thesis matrix)
#   charged  the whole region is allocated inside the cgroup before the mount: an NVRAM-based
#            machine whose memory M includes the region (the thesis' model)
#   extra    the whole region is allocated outside the cgroup before the mount: M is DRAM and
#            the region an extra device (how pmem and NVDIMMs are deployed)
NVRAM_ACCOUNTING = ("touched", "charged", "extra")

DEVICE_MODELS = ("hdd-7200", "hdd-15k", "hdd-7200-500g", "ssd", "flash", "none")
# the NVFAT paper's NVRAM write-cache sizes (KiB), Figures 4-8
NVFAT_CACHE_KIB = (1, 2, 4, 8, 16, 32, 64, 128)


@dataclass(frozen=True)
class FsConfig:
    name: str
    label: str                      # the paper's name for it (Table 4.2 etc.)
    description: str
    mkfs: str                       # ext2 | ext4 | vfat: the kernel FS (the lower FS for nvstack)
    mount_options: str = ""
    journal: str | None = None      # None | "internal" | "ram"  (ext4 only)
    nvstack: dict | None = None     # {"consistency", "tempfiles"?, "cache"?, "writeback"?,
                                    #  "args"?} (a key left out: nvstack's default)
    consistent: bool = False        # gives file-system consistency + data integrity after a crash
    fuse: dict | None = None        # another FUSE daemon: {"daemon": name in bench/.tools/bin, "args"}
    nvram_cache: str | None = None  # the device's NVRAM block cache, e.g. "128K" (NVFAT)
    # How nvstack's NVRAM region counts against the run's memory budget M (NVRAM_ACCOUNTING)
    nvram_accounting: str = "touched"

    @property
    def needs(self) -> list[str]:
        """Tools beyond the kernel: 'mount' for nvstack, the daemon's name for other FUSE FS."""
        if self.nvstack:
            # a feature switched on needs its flag; "off" values are today's only behaviour on
            # a binary without it. Settings of a mechanism that is on, and every flag in "args",
            # need theirs too.
            flags = [k for k in nvstack_flags(self.nvstack) if k in NVSTACK_SETTINGS or
                     self.nvstack[k] != NVSTACK_FEATURE_OFF.get(k)]
            flags += [a[2:].split("=", 1)[0] for a in self.nvstack.get("args", [])
                      if a.startswith("--")]
            return (["mount"] + [f"mount-flag:{k}" for k in dict.fromkeys(flags)] +
                    [f"consistency:{self.nvstack['consistency']}"])
        return [self.fuse["daemon"]] if self.fuse else []

    @property
    def cache_on(self) -> bool:
        """nvstack with its NVRAM page cache on (explicitly, or by nvstack's default)."""
        return bool(self.nvstack) and self.nvstack.get("cache", "on") == "on"

    @property
    def stacked(self) -> bool:
        """Mounted over a directory of the kernel FS (nvstack or another FUSE daemon)."""
        return bool(self.nvstack or self.fuse)


def _kernel() -> list[FsConfig]:
    return [
        FsConfig("ext2", "Ext2", "ext2, no journal", "ext2"),
        FsConfig("ext4-ordered", "Ext4-ordered", "ext4 data=ordered (metadata journaling)", "ext4",
                 "data=ordered", journal="internal"),
        FsConfig("ext4-writeback", "Ext4-writeback", "ext4 data=writeback", "ext4",
                 "data=writeback", journal="internal"),
        FsConfig("ext4-journal", "Ext3", "ext4 data=journal, internal journal (thesis' Ext3)",
                 "ext4", "data=journal", journal="internal", consistent=True),
        FsConfig("ext4-journal-ram", "Mext3",
                 "ext4 data=journal, external journal on a RAM-backed loop device (thesis' Mext3)",
                 "ext4", "data=journal", journal="ram", consistent=True),
        FsConfig("vfat", "VFAT", "FAT file system (NVFAT paper baseline)", "vfat"),
        FsConfig("ext4-ordered-nvcache-128k", "Ext4-ordered + NVRAM 128KB",
                 "ext4 data=ordered with a 128 KiB NVRAM metadata write cache in the device",
                 "ext4", "data=ordered", journal="internal", nvram_cache="128K"),
        FsConfig("ext4-ordered-nvcache-4m", "Ext4-ordered + NVRAM 4MB",
                 "ext4 data=ordered with a 4 MiB NVRAM metadata write cache in the device",
                 "ext4", "data=ordered", journal="internal", nvram_cache="4M"),
        FsConfig("ext4-ordered-nvcache-64m", "Ext4-ordered + NVRAM 64MB",
                 "ext4 data=ordered with a 64 MiB NVRAM metadata write cache in the device "
                 "(holds every metadata and journal write of the Sync-PostMark run)",
                 "ext4", "data=ordered", journal="internal", nvram_cache="64M"),
    ] + [FsConfig(f"nvfat-{k}k", f"NVFAT {k}KB", f"FAT with a {k} KiB NVRAM metadata write cache "
                  f"in the device (NVFAT)", "vfat", nvram_cache=f"{k}K")
         for k in NVFAT_CACHE_KIB]


def sized_journal(cfg: FsConfig) -> bool:
    """An internal journal of J bytes (the thesis' 256 MiB per GiB of memory) is made for
    data=journal only, where every block passes the journal; every other ext4 (data=ordered
    alone or as nvstack's lower FS) gets mke2fs's default journal, so a lower ext4 is formatted
    exactly like the kernel configuration it is compared with."""
    return cfg.journal == "internal" and "data=journal" in cfg.mount_options.split(",")


def nvstack_mount_argv(nv: str, opt: dict, lower: Path, mnt: Path, region: Path,
                       size_bytes: int, flags: set | None) -> list[str]:
    """`nvstack mount ... --foreground` for an nvstack option dict (FsConfig.nvstack); `flags`
    = the long options the binary's `mount --help` lists (None: assume the off switches)."""
    argv = [nv, "mount", str(lower), str(mnt), "--nvram", str(region),
            "--size", fmt_size(size_bytes), "--consistency", opt["consistency"]]
    flags = flags if flags is not None else set(NVSTACK_FEATURE_OFF)
    for key in nvstack_flags(opt):              # only the flags a configuration names
        # a feature that is off needs no flag on a binary that does not have it yet
        # (off is then the only behaviour); a feature that is on, or a setting of it, is
        # skipped before setup when the flag is missing
        if key in flags or opt[key] != NVSTACK_FEATURE_OFF.get(key):
            argv += [f"--{key}", opt[key]]
    return argv + [*opt.get("args", []), "--foreground"]


def nvstack_flags(opt: dict) -> list[str]:
    """The mechanism flags `nvstack mount` gets for an nvstack option dict, in argv order
    (values in `opt`): tempfiles and cache whenever named, a setting such as writeback only
    while its mechanism is on."""
    out = [k for k in NVSTACK_FEATURE_OFF if k in opt]
    out += [k for k, mech in NVSTACK_SETTINGS.items()
            if k in opt and opt.get(mech, "on") != NVSTACK_FEATURE_OFF[mech]]
    return out


# Thesis Table 4.2: (suffix, label, tempfiles, write-back policy or None = WB off, consistency).
# WB off = the NVRAM page cache off (--cache off): Linux's own write-back of the lower FS.
TABLE_4_2 = [
    ("", "FUSE-{L}", "off", None, "none"),
    ("-trans", "{L}_Trans", "off", None, "undo"),
    ("-tempffs", "TempFFS", "on", None, "none"),
    ("-wb", "WB", "off", "relo", "none"),
    ("-tempffs-trans", "TempFFS_{L}_Trans", "on", None, "undo"),
    ("-wb-trans", "WB_{L}_Trans", "off", "relo", "undo"),
    ("-tempffs-wb", "TempFFS_WB", "on", "relo", "none"),
    ("-tempffs-wb-trans", "TempFFS_WB_{L}_Trans", "on", "relo", "undo"),
    ("-journal", "VMA-{L}", "off", None, "journal"),
]

# Thesis sec. 4.3: the four write-back policies, each on its own over ext2 (tempfiles off,
# undo). --max-dirty-age 0: no write-back by age, so only the watermarks (and a full region)
# trigger it during a benchmark.
WB_POLICY_ARGS = ["--max-dirty-age", "0"]


def _nvstack() -> list[FsConfig]:
    out = []
    for lower in ("ext2", "ext4"):
        L = lower.capitalize()
        for suffix, label, tempfiles, wb, cons in TABLE_4_2:
            cache = ("cache on, writeback " + wb) if wb else \
                "cache off (Linux's write-back of the lower FS)"
            desc = (f"nvstack over {lower}: tempfiles {tempfiles}, {cache}, "
                    f"consistency {cons}, every lower file on the NVRAM path (passthrough off)" + (" (every feature off: the FUSE tax)" if not suffix else ""))
            opt = {"consistency": cons, "tempfiles": tempfiles, "cache": "on" if wb else "off",
                   "passthrough": "off"}
            if wb:
                opt["writeback"] = wb
            for acct in ("touched", "charged", "extra"):
                # the thesis matrix (issue 17): the same configuration under both accountings
                name = f"nvstack-{lower}{suffix}" + ("" if acct == "touched" else f"-{acct}")
                what = {"touched": "", "charged": "; NVRAM region charged to M in full",
                        "extra": "; NVRAM region outside M (an extra device)"}[acct]
                out.append(FsConfig(
                    name, label.format(L=L) + ("" if acct == "touched" else f" ({acct})"),
                    desc + what, lower, "data=ordered" if lower == "ext4" else "",
                    journal="internal" if lower == "ext4" else None,
                    nvstack=opt, consistent=cons in ("undo", "journal"), nvram_accounting=acct))
    for policy in WRITEBACK_POLICIES:
        out.append(FsConfig(
            f"nvstack-ext2-wb-{policy}", f"WB {policy}",
            f"nvstack over ext2: NVRAM page cache on with the {policy} write-back policy "
            f"(thesis sec. 4.3), tempfiles off, consistency undo, passthrough off, "
            f"{' '.join(WB_POLICY_ARGS)}",
            "ext2", nvstack={"consistency": "undo", "tempfiles": "off", "cache": "on",
                             "passthrough": "off", "writeback": policy,
                             "args": list(WB_POLICY_ARGS)},
            consistent=True))
    # nvstack as a new user meets it: every mechanism at its default (undo transactions,
    # TempFFS, the NVRAM page cache with relo write-back), named explicitly so that a change of
    # a default does not change the configuration silently. Over ext4 data=ordered formatted
    # exactly like `ext4-ordered` (the showcase compares the two on the same modeled disk).
    out.append(FsConfig(
        "nvstack-ext4-defaults", "nvstack",
        "nvstack with its defaults over ext4 data=ordered: consistency undo, tempfiles on, "
        "NVRAM page cache on with relo write-back",
        "ext4", "data=ordered", journal="internal",
        nvstack={"consistency": "undo", "tempfiles": "on", "cache": "on", "writeback": "relo"},
        consistent=True))
    # the same with one route or page-cache knob changed (experiment passthrough, issue 16)
    for name, args, what in (
            ("pt-off", ["--passthrough", "off"], "every open of a lower file takes the NVRAM "
             "path (FUSE request per IO), as before routes existed"),
            ("dio", ["--direct-io", "nvram"], "temp files bypass the kernel's page cache "
             "(cached once, in NVRAM; one request per write)"),
            ("dio-never", ["--direct-io", "never"], "every open of a temp file goes "
             "through the kernel's page cache (the default until 2026-11-29; since then "
             "opens that cannot read bypass it)"),
            ("spare", ["--fsync-requests", "spare"], "the kernel is told once not to send "
             "fsync requests (every operation is durable when it returns; no passthrough)")):
        out.append(FsConfig(
            f"nvstack-ext4-{name}", f"nvstack {' '.join(args)}",
            f"nvstack with its defaults over ext4 data=ordered but {' '.join(args)}: {what}",
            "ext4", "data=ordered", journal="internal",
            nvstack={"consistency": "undo", "tempfiles": "on", "cache": "on",
                     "writeback": "relo", "args": args},
            consistent=True))
    # the same in the other consistency modes (experiment durability: every mode side by side)
    for cons, what in (("journal", "VM-aware journaling: every operation atomic, durable at the "
                                   "next group commit (fsync, fdatasync, 5 s, 32 MiB)"),
                       ("none", "no log: a reference, not crash-consistent")):
        out.append(FsConfig(
            f"nvstack-ext4-defaults-{cons}", f"nvstack {cons}",
            f"nvstack with its defaults but --consistency {cons} ({what}) over ext4 "
            f"data=ordered: tempfiles on, NVRAM page cache on with relo write-back",
            "ext4", "data=ordered", journal="internal",
            nvstack={"consistency": cons, "tempfiles": "on", "cache": "on", "writeback": "relo"},
            consistent=cons != "none"))
    # Non-blocking writes (issue 14): the defaults with each fetch mode of --nbw, on the NVRAM
    # path. With passthrough on (the default since issue 16) a lower file that was never
    # fsynced is served by the kernel, so fio's writes never reach nvstack (measured 2026-11-26:
    # 158-160 random 512 B writes/s with lazy and async-bg, ext4's rate, no patch made).
    # --keep-dirty changes only the unmount after the measurement: it leaves the patches and
    # dirty pages in the region (thrown away with the run's disk) instead of writing them back
    # (3 min after 60 s of 128-byte random writes at scale 1: a read-modify-write per page).
    # The -bgwb twins add --writeback-background on: the cache's pressure rounds run in a
    # daemon thread instead of inside the write that crossed the high watermark (at scale 1 a
    # 25,000-page round inside one write decided several rows; docs/benchmarks.md). Since
    # 2026-11-28 that is nvstack's default, so on a newer binary a twin runs what its plain
    # configuration runs (kept: results before then name the twins).
    for mode, what in NBW_MODES:
        for suffix, extra, how in (("", [], ""),
                                   ("-bgwb", ["--writeback-background", "on"],
                                    "; --writeback-background on (pressure rounds in a daemon "
                                    "thread, not in the write that crossed the mark)")):
            out.append(FsConfig(
                f"nvstack-ext4-nbw-{mode}{suffix}", f"nvstack --nbw {mode}{suffix}",
                f"nvstack with its defaults over ext4 data=ordered, --passthrough off (the "
                f"NVRAM path) and --nbw {mode} ({what}); --keep-dirty (the unmount after the "
                f"measurement leaves patches and dirty pages in the region){how}",
                "ext4", "data=ordered", journal="internal",
                nvstack={"consistency": "undo", "tempfiles": "on", "cache": "on",
                         "writeback": "relo",
                         "args": ["--passthrough", "off", "--nbw", mode, "--keep-dirty",
                                  *extra]},
                consistent=True))
    return out


# --nbw modes (non-blocking writes paper, sec. 3.3): how a partial write to a page not in NVRAM
# gets the rest of its page.
NBW_MODES = [("off", "the writer reads the page first: the blocking baseline"),
             ("async-fg", "a patch; the FUSE thread reads the page after answering"),
             ("async-bg", "a patch; a background fetcher reads the page"),
             ("lazy", "a patch; the page is read only when needed: a read the patches do not "
                      "cover, its write-back (which writes only the patched bytes), the limit")]


# The FUSE tax measures nvstack as a pass-through (what every mechanism pays): TempFFS and the
# NVRAM page cache, both on by default now, are off, as they did not exist when
# bench/results/fuse-tax was measured (commit 03f0741), and so is the kernel's passthrough
# (issue 16), which would take the data requests the tax is about away from FUSE. On a binary
# without the flags nothing is passed (off is then all it does).
FUSE_TAX_OPTIONS = {"tempfiles": "off", "cache": "off", "passthrough": "off"}


def _fuse_tax() -> list[FsConfig]:
    ext4 = dict(mkfs="ext4", mount_options="data=ordered", journal="internal")
    out = [FsConfig("ext4", "ext4", "ext4 data=ordered: the lower FS of the FUSE-tax configurations",
                    **ext4),
           FsConfig("passthrough_hp", "passthrough_hp",
                    "libfuse 3.14 example/passthrough_hp over ext4, as shipped (writeback cache)",
                    fuse={"daemon": "passthrough_hp", "args": []}, **ext4),
           FsConfig("passthrough_hp-wt", "passthrough_hp-wt",
                    "passthrough_hp over ext4 without FUSE_WRITEBACK_CACHE (write-through)",
                    fuse={"daemon": "passthrough_hp-wt", "args": []}, **ext4),
           FsConfig("nvstack-none", "nvstack-none",
                    "nvstack --consistency none over ext4 as a pass-through: defaults (4 threads, "
                    "1 day timeouts, max_write 1M) except TempFFS and the NVRAM page cache off "
                    "(--tempfiles off --cache off; on by default since the fuse-tax results) and "
                    "kernel passthrough off (--passthrough off: every request through FUSE)",
                    nvstack={"consistency": "none", **FUSE_TAX_OPTIONS}, **ext4)]
    knobs = [("t1", "--threads 1", ["--threads", "1"]), ("t2", "--threads 2", ["--threads", "2"]),
             ("t8", "--threads 8", ["--threads", "8"]),
             ("mw128k", "--max-write 128K", ["--max-write", "128K"]),
             ("notimeout", "--attr-timeout 0 --entry-timeout 0",
              ["--attr-timeout", "0", "--entry-timeout", "0"])]
    for suffix, what, args in knobs:
        out.append(FsConfig(f"nvstack-none-{suffix}", f"nvstack-none {what}",
                            f"nvstack --consistency none over ext4 as a pass-through (TempFFS, "
                            f"the NVRAM page cache and kernel passthrough off) with {what}",
                            nvstack={"consistency": "none", **FUSE_TAX_OPTIONS, "args": args}, **ext4))
    return out


CONFIGS: dict[str, FsConfig] = {c.name: c for c in _kernel() + _nvstack() + _fuse_tax()}


def tempfiles_pairs(names) -> dict[str, str]:
    """{nvstack config with tempfiles on: the one identical but for tempfiles off} among
    `names` (e.g. nvstack-ext2-tempffs-trans -> nvstack-ext2-trans)."""
    names = [n for n in names if n in CONFIGS and CONFIGS[n].nvstack]
    out = {}
    for on in names:
        opt = CONFIGS[on].nvstack
        if opt.get("tempfiles") != "on":
            continue
        for off in names:
            c = CONFIGS[off]
            if (c.nvstack == {**opt, "tempfiles": "off"} and c.mkfs == CONFIGS[on].mkfs
                    and c.mount_options == CONFIGS[on].mount_options):
                out[on] = off
                break
    return out


def writeback_file_twins(names) -> dict[str, str]:
    """{configuration: its `file` twin} among `names`: the nvstack configuration with the NVRAM
    page cache on and the `file` write-back policy (Linux's, the thesis' reference for the
    write-back policies) over the same lower FS (same mkfs, mount options, journal) and, for an
    nvstack configuration, with the same consistency mode and tempfiles setting. Every other
    configuration over that lower FS gets it: the other policies, the page cache off, the kernel
    FS alone (e.g. nvstack-ext2-wb-relo, nvstack-ext2-trans, ext2 -> nvstack-ext2-wb-file)."""
    names = [n for n in names if n in CONFIGS]
    files = [n for n in names if CONFIGS[n].cache_on
             and CONFIGS[n].nvstack.get("writeback") == "file"]
    out = {}
    for name in names:
        c = CONFIGS[name]
        if name in files or (c.stacked and not c.nvstack):
            continue
        for f in files:
            fc = CONFIGS[f]
            if (fc.mkfs, fc.mount_options, fc.journal) != (c.mkfs, c.mount_options, c.journal):
                continue
            if c.nvstack and any(c.nvstack.get(k) != fc.nvstack.get(k)
                                 for k in ("consistency", "tempfiles")):
                continue
            out[name] = f
            break
    return out


def lower_kernel_config(name: str, names) -> str | None:
    """The kernel configuration among `names` that is a stacked configuration's lower FS on
    its own (ext2 for nvstack-ext2-*; ext4-ordered or ext4 for ext4 lowers), or None."""
    c = CONFIGS.get(name)
    if c is None or not c.stacked:
        return None
    for k in names:
        kc = CONFIGS.get(k)
        if (kc is not None and not kc.stacked and kc.mkfs == c.mkfs
                and kc.mount_options == c.mount_options and kc.journal == c.journal):
            return k
    return None



@dataclass
class Layout:
    """Where one run puts things. Everything lives under workdir except the RAM files."""
    workdir: Path
    run_id: str

    @property
    def image(self) -> Path:
        return self.workdir / "disk.img"

    @property
    def lower_mnt(self) -> Path:
        return self.workdir / "lower"

    @property
    def mnt(self) -> Path:
        return self.workdir / "mnt"

    @property
    def journal_image(self) -> Path:
        return Path("/dev/shm") / f"nvbench-{self.run_id}-journal.img"

    @property
    def nvram(self) -> Path:
        return Path("/dev/shm") / f"nvbench-{self.run_id}.nvram"


@dataclass
class Target:
    """A configured, mounted file system for one run. Use setup()/teardown() (teardown is
    idempotent and runs every undo step even if an earlier one fails)."""
    shell: Shell
    config: FsConfig
    device: str                     # "none" or a model name
    layout: Layout
    disk_bytes: int
    journal_bytes: int
    nvram_bytes: int
    timing: str = "sleep"
    caps: Capabilities | None = None
    cgroup: MemoryCgroup | None = None
    rundir: Path | None = None
    remount_options: str = ""       # a stacked FS: `mount -o remount,<these>` once it is up
                                    # (e.g. sync: Sync-PostMark on a FUSE mount)
    _undo: list = field(default_factory=list)
    interrupted: BaseException | None = None   # a Ctrl-C that came during teardown()
    daemon: object = None
    path: Path | None = None        # where the workload runs
    device_mnt: Path | None = None  # mount point of the (modeled) device, for `device stat`
    loop_dev: str | None = None     # the plain loop device (--device none), for block_stat()

    # ----- setup -----------------------------------------------------------------------------
    def setup(self, before_stack=None) -> Path:
        """Make and mount the file system; returns where the workload runs. `before_stack(dir)`
        runs once the kernel FS is mounted and before a stacked FS is mounted over it, with the
        directory the workload's target will show (<kernel FS>/data for stacked configurations,
        the kernel FS itself otherwise): untimed preparation nvstack must not see."""
        sh, lay, cfg = self.shell, self.layout, self.config
        sh.note(f"file system {cfg.name} ({cfg.label}): {cfg.description}; device {self.device}")
        sh.run(["mkdir", "-p", str(lay.workdir)])
        self._undo.append(lambda: sh.run(["rm", "-rf", "--one-file-system", str(lay.workdir)],
                                         check=False))
        kernel_mnt = lay.lower_mnt if cfg.stacked else lay.mnt
        sh.run(["mkdir", "-p", str(kernel_mnt)])
        jdev = self._journal_device() if cfg.journal == "ram" else None
        if self.device == "none":
            self._plain_loop(kernel_mnt, jdev)
        else:
            self._modeled(kernel_mnt, jdev)
        self.device_mnt = kernel_mnt
        if before_stack is not None:
            base = kernel_mnt / "data" if cfg.stacked else kernel_mnt
            if cfg.stacked:
                sh.run(["mkdir", "-p", str(base)])
            before_stack(base)
        if cfg.nvstack:
            self.path = self._nvstack_mount(kernel_mnt)
        elif cfg.fuse:
            self.path = self._fuse_mount(kernel_mnt)
        else:
            self.path = kernel_mnt
        if cfg.stacked and self.remount_options:
            # the FUSE superblock takes MS_SYNCHRONOUS & co. by remount (no mount helper: -i);
            # its lower FS keeps its own options
            sh.run(["mount", "-i", "-o", f"remount,{self.remount_options}", str(self.path)])
        return self.path

    def _mount_options(self, jdev: str | None) -> str:
        opts = [o for o in self.config.mount_options.split(",") if o]
        if jdev:
            opts.append(f"journal_path={jdev}")
        return ",".join(opts)

    def _mkfs_argv(self, dev: str, jdev: str | None) -> list[str]:
        cfg = self.config
        if cfg.mkfs == "vfat":
            return ["mkfs.vfat", dev]
        argv = ["mke2fs", "-q", "-F", "-t", cfg.mkfs, "-b", "4096"]
        if sized_journal(cfg):
            argv += ["-J", f"size={max(4, self.journal_bytes >> 20)}"]
        if jdev:
            argv += ["-J", f"device={jdev}"]
        return argv + [dev]

    def _journal_device(self) -> str:
        sh, img = self.shell, self.layout.journal_image
        sh.run(["truncate", "-s", fmt_size(self.journal_bytes), str(img)])
        self._undo.append(lambda: sh.run(["rm", "-f", str(img)], check=False))
        jdev = sh.run(["losetup", "--find", "--show", str(img)], capture_as="JLOOP").stdout.strip()
        self._undo.append(lambda: sh.run(["losetup", "-d", jdev], check=False))
        sh.run(["mke2fs", "-q", "-F", "-O", "journal_dev", "-b", "4096", jdev])
        return jdev

    def _plain_loop(self, mnt: Path, jdev: str | None) -> None:
        sh, img = self.shell, self.layout.image
        sh.run(["truncate", "-s", fmt_size(self.disk_bytes), str(img)])
        dev = sh.run(["losetup", "--find", "--show", str(img)], capture_as="LOOP").stdout.strip()
        self._undo.append(lambda: sh.run(["losetup", "-d", dev], check=False))
        self.loop_dev = dev
        sh.run(self._mkfs_argv(dev, jdev))
        opts = self._mount_options(jdev)
        sh.run(["mount", "-t", self.config.mkfs, *(["-o", opts] if opts else []), dev, str(mnt)])
        self._undo.append(lambda: _umount(sh, mnt))

    def _modeled(self, mnt: Path, jdev: str | None) -> None:
        sh, img, cfg = self.shell, self.layout.image, self.config
        nv = self.caps.binary if self.caps and self.caps.binary else "nvstack"
        argv = [nv, "device", "attach", str(img), str(mnt), "--model", self.device,
                "--timing", self.timing, "--size", fmt_size(self.disk_bytes)]
        if jdev or sized_journal(cfg):
            # mkfs options `device attach --mkfs` cannot express: format the image file
            # ourselves, then attach it without --mkfs (attach keeps an existing image).
            sh.run(["truncate", "-s", fmt_size(self.disk_bytes), str(img)])
            sh.run(self._mkfs_argv(str(img), jdev))
        else:
            argv += ["--mkfs", cfg.mkfs]
        opts = self._mount_options(jdev)
        if opts:
            argv += ["--mount-options", opts]
        if cfg.nvram_cache:
            region = self.layout.nvram
            argv += ["--nvram", str(region), "--nvram-cache-size", cfg.nvram_cache]
            self._undo.append(lambda: sh.run(["rm", "-f", str(region)], check=False))
        sh.run(argv, timeout=300)
        self._undo.append(lambda: sh.run([nv, "device", "detach", str(mnt)], check=False,
                                         timeout=600))

    def _nvstack_mount(self, lower_mnt: Path) -> Path:
        sh, lay, opt = self.shell, self.layout, self.config.nvstack
        nv = self.caps.binary if self.caps and self.caps.binary else "nvstack"
        lower = lower_mnt / "data"
        sh.run(["mkdir", "-p", str(lower), str(lay.mnt)])
        argv = nvstack_mount_argv(nv, opt, lower, lay.mnt, lay.nvram, self.nvram_bytes,
                                  self.caps.mount_flags if self.caps else None)
        self._undo.append(lambda: sh.run(["rm", "-f", str(lay.nvram)], check=False))
        acct = self.config.nvram_accounting
        if acct != "touched":
            # Format the region, then allocate every page of it (fallocate on tmpfs allocates
            # and charges them to the caller's memory cgroup; the daemon's later touches are
            # not charged again): inside the run's cgroup when charged, outside when extra.
            size = fmt_size(self.nvram_bytes)
            # the undo slots a mount would give a region it creates (crates/cli daemon.rs:
            # a quarter of the region in 1,114,112-byte slots, 2 to 16)
            slots = max(2, min(16, self.nvram_bytes // 4 // 1_114_112))
            sh.run([nv, "format", "--nvram", str(lay.nvram), "--size", size,
                    "--undo-slots", str(slots)])
            alloc = ["fallocate", "-l", size, str(lay.nvram)]
            sh.run(self.cgroup.wrap(alloc) if acct == "charged" and self.cgroup else alloc)
        self._spawn_daemon(argv, "nvstack mount",
                           lambda: self._stop_daemon([nv, "umount", str(lay.mnt)]))
        return lay.mnt

    def _fuse_mount(self, lower_mnt: Path) -> Path:
        """Another FUSE daemon (passthrough_hp) over lower/data, in the foreground."""
        sh, lay, fuse = self.shell, self.layout, self.config.fuse
        binary = self.caps.tools.get(fuse["daemon"]) if self.caps else None
        lower = lower_mnt / "data"
        sh.run(["mkdir", "-p", str(lower), str(lay.mnt)])
        argv = [binary or fuse["daemon"], *fuse.get("args", []), "--foreground", str(lower),
                str(lay.mnt)]
        self._spawn_daemon(argv, fuse["daemon"],
                           lambda: self._stop_daemon(["umount", str(lay.mnt)]))
        return lay.mnt

    def _spawn_daemon(self, argv: list[str], what: str, stop) -> None:
        sh, lay = self.shell, self.layout
        if self.cgroup is not None:
            argv = self.cgroup.wrap(argv)   # daemon (and NVRAM region) pay from the same budget
        logdir = self.rundir or lay.workdir
        self.daemon = sh.spawn(argv, logdir / "daemon.stdout", logdir / "daemon.stderr", "DAEMON")
        self._undo.append(stop)             # undone first: umount, then the rest
        # wait for the mount (repro.sh polls the same way; here the daemon's exit ends the wait)
        sh.log_only(f"for i in $(seq 300); do mountpoint -q {lay.mnt} && break; sleep 0.1; done; "
                    f"mountpoint -q {lay.mnt}")
        if not sh.dry_run:
            deadline = time.monotonic() + 30
            while not _is_mounted(lay.mnt):
                if self.daemon.poll() is not None or time.monotonic() > deadline:
                    err = (logdir / "daemon.stderr").read_text()[-2000:]
                    raise BenchError(f"{what} did not come up: {err}")
                time.sleep(0.1)

    def _stop_daemon(self, umount_argv: list[str]) -> None:
        """Unmount and wait for the daemon. A Ctrl-C during the unmount (which may write back
        for minutes) still stops the daemon and detaches the mount before it is passed on:
        otherwise the daemon outlived its run, holding the modeled disk the next steps detach."""
        sh, mnt = self.shell, self.layout.mnt
        interrupted = None
        try:
            sh.run(umount_argv, check=False, timeout=600)
        except KeyboardInterrupt as exc:
            interrupted = exc
        if self.daemon is not None:
            _end(self.daemon, grace=0 if interrupted else 60)
        if _is_mounted(mnt):
            sh.run(["fusermount3", "-uz", str(mnt)], check=False)
        if interrupted:
            raise interrupted

    # ----- measurement helpers ---------------------------------------------------------------
    def device_stat(self, dest: Path) -> None:
        """`nvstack device stat --json` into dest (modeled disk only)."""
        if self.device == "none" or self.device_mnt is None:
            return
        nv = self.caps.binary if self.caps and self.caps.binary else "nvstack"
        self.shell.run([nv, "device", "stat", str(self.device_mnt), "--json"], stdout=dest,
                       check=False)

    def block_stat(self, dest: Path) -> None:
        """The kernel's /sys/block/<loop>/stat line of the plain loop device that holds the
        kernel FS (for stacked configurations: the lower FS) into dest, as is (fields in the
        kernel's Documentation/block/stat.rst; sectors are 512 bytes). Plain loop only: the
        modeled disk has `device stat`."""
        if self.loop_dev is None:
            return
        sh = self.shell
        sh.log_only(f"cat /sys/block/$(basename {sh.render([self.loop_dev])})/stat "
                    f">{sh.render([str(dest)])}")
        if sh.dry_run:
            return
        try:
            dest.write_text(Path("/sys/block", Path(self.loop_dev).name, "stat").read_text())
        except OSError:
            pass

    def flush_argv(self) -> list[str] | None:
        """The command that makes durable what a FAT file system still holds, for FAT on a
        modeled device: `sync MNT` (coreutils fsyncs the directory; a user-space FAT server
        writes back everything dirty and flushes the device's volatile cache; sync(2) does not
        reach it). The NVRAM cache is not drained: what it holds is durable already, and a
        drain would add flash work the NVFAT paper's runs never do. None otherwise."""
        if self.config.mkfs != "vfat" or self.device == "none" or self.device_mnt is None:
            return None
        return ["sync", str(self.device_mnt)]

    def fuse_pid(self) -> int | None:
        """pid of the FUSE daemon (the cgroup wrapper execs it), or None."""
        return self.daemon.pid if self.daemon is not None else None

    def nvstack_stat(self, dest: Path) -> None:
        if not self.config.nvstack:
            return
        nv = self.caps.binary if self.caps and self.caps.binary else "nvstack"
        self.shell.run([nv, "stat", str(self.layout.mnt), "--json"], stdout=dest, check=False)

    # ----- teardown --------------------------------------------------------------------------
    def teardown(self) -> list[str]:
        """Undo every setup step in reverse; returns the errors (never raises). A Ctrl-C (or
        SIGTERM) that arrives meanwhile does not stop the undoing: it is kept in
        `self.interrupted`, which the caller raises once its bookkeeping is written, so that
        the harness stops instead of starting the next run."""
        errors = []
        while self._undo:
            step = self._undo.pop()
            try:
                step()
            except KeyboardInterrupt as exc:
                self.interrupted = exc
                errors.append(f"interrupted: {exc}")
            except BaseException as exc:  # noqa: BLE001 - keep undoing whatever failed
                errors.append(str(exc))
        return errors


def _is_mounted(path: Path) -> bool:
    target = str(path.resolve())
    try:
        with open("/proc/self/mountinfo") as f:
            return any(line.split()[4] == target for line in f)
    except OSError:
        return False


def _end(proc, grace: float) -> None:
    """Waits `grace` seconds for our daemon to exit, then terminates it (10 s), then kills it."""
    for stop, timeout in ((None, grace), (proc.terminate, 10), (proc.kill, None)):
        if stop:
            stop()
        try:
            proc.wait(timeout=timeout)
            return
        except BaseException:  # noqa: BLE001 - a timeout, or Ctrl-C: escalate
            continue


def _umount(sh: Shell, mnt: Path) -> None:
    for attempt in range(10):
        res = sh.run(["umount", str(mnt)], check=False, log=attempt == 0)
        if res.returncode == 0 or sh.dry_run:
            return
        time.sleep(0.5)
    sh.run(["umount", "-l", str(mnt)], check=False)


def resolve(names: list[str]) -> list[FsConfig]:
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        raise BenchError(f"unknown file system configuration(s): {', '.join(unknown)}; "
                         f"see `bench/run list`")
    return [CONFIGS[n] for n in names]
