"""A power cut in the middle of a real application, and what survives it (the showcase, part 2;
issue 13's whole-stack power cut: `bench/run powercut`).

On the modeled disk (volatile write cache, `nvstack device cut`), for one file-system
configuration (ext4 alone, or nvstack over ext4 in a consistency mode) and one application:

  1. attach a fresh image (`nvstack device attach --mkfs`), mount nvstack over <lower>/data
     (stacked configurations), prepare the application (durable.py KIND --init);
  2. run the application's loop with `--acks` = a file in /dev/shm, outside the file system
     under test: the id of every transaction the application was told is durable, written and
     fsynced before the next transaction begins;
  3. after `cut_after` seconds, the power cut: SIGKILL the application, then the nvstack
     daemon (stacked), then `nvstack device cut` (the disk's volatile cache is dropped or torn by
     the seed; the kernel FS is unmounted without anything more reaching the image; the
     dead FUSE mount is detached lazily);
  4. power on: re-attach the same image (the kernel replays ext4's journal at mount) and
     mount nvstack again over the same lower directory with the same region (recovery);
  5. check (durable.py KIND-check): every acknowledged transaction is there (durable.account:
     lost must be 0; one in flight at the cut may or may not be), and the data is whole
     (sqlite: PRAGMA integrity_check; Maildir: every message as written; editor: the
     document is one whole version); then a clean `nvstack umount`, `nvstack check` of the
     region (exit 0), frames in use after unmount (`nvstack inspect --json`), `device detach`
     and `e2fsck -fn` of the image.

The applications (APPS): sqlite3 synchronous=FULL in WAL and in rollback-journal (DELETE)
mode (a transaction = COMMIT returned), and DELETE with synchronous=EXTRA (FULL does not sync
the unlink of the rollback journal that commits a DELETE-mode transaction; EXTRA fsyncs the
directory after it); the Maildir delivery (write tmp/N, fsync, rename into
new/, fsync new/); the editor (write doc.txt.tmp, fsync, rename over doc.txt; `editor` acks
when the rename returned, which nvstack's undo mode makes durable, `editor-dirsync` after an
fsync of the directory too, which is what ext4 and nvstack's journal mode promise).

`Stack` is the machinery (attach, mount, kill + cut, power on, recovery mount, teardown) that
`recovery.py` (the durability experiment's recovery times) uses as well. Everything runs
through a Shell, so OUT/<name>/repro.sh replays it; every wait is bounded and every mount,
loop device, daemon and file is removed on the way out, also on failure.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from . import fs as fs_mod
from . import nvstack
from .shell import Shell
from .util import BenchError, failure_recorded, fmt_size, slug
from .workloads import DURABLE_DRIVER
from .workloads.durable import read_acks

MOUNT_WAIT_S = 60          # a daemon (or its recovery) must have mounted by then
# Stack.cut's order (results before it recorded this were cut daemon first, then application)
KILL_ORDER = "application, daemon"
KILL_WAIT_S = 10

# application -> (durable.py kind, its extra arguments, the check after recovery)
APPS: dict[str, tuple[str, list[str], str]] = {
    "sqlite-wal": ("sqlite", ["--journal-mode", "wal"], "sqlite-check"),
    "sqlite-delete": ("sqlite", ["--journal-mode", "delete"], "sqlite-check"),
    "sqlite-delete-extra": ("sqlite", ["--journal-mode", "delete", "--synchronous", "extra"],
                            "sqlite-check"),
    "maildir": ("maildir", [], "maildir-check"),
    "editor": ("editor", [], "editor-check"),
    "editor-dirsync": ("editor", ["--dir-fsync"], "editor-check"),
}


def _wait_mounted(path: Path, proc, what: str, log: Path) -> float:
    t0 = time.monotonic()
    while not fs_mod._is_mounted(path):
        if proc is not None and proc.poll() is not None:
            raise BenchError(f"{what} exited ({proc.returncode}) before mounting: "
                             f"{_tail(log)}")
        if time.monotonic() - t0 > MOUNT_WAIT_S:
            raise BenchError(f"{what} did not mount {path} within {MOUNT_WAIT_S} s: {_tail(log)}")
        time.sleep(0.02)
    return time.monotonic() - t0


def _tail(path: Path, n: int = 600) -> str:
    try:
        return path.read_text()[-n:].strip()
    except OSError:
        return ""


def _kill(proc) -> None:
    if proc is None or proc.poll() is not None:
        return
    try:
        proc.send_signal(signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=KILL_WAIT_S)
    except Exception:  # noqa: BLE001 - a process stuck in D state: report, do not hang
        pass


class Stack:
    """One file-system configuration on a modeled disk that can lose power: a kernel ext2/ext4
    alone, or nvstack over <lower>/data. Use as a context manager (teardown on the way out)."""

    def __init__(self, rundir: Path, fs_name: str, *, device: str, timing: str, workdir: Path,
                 nvram_bytes: int, disk_bytes: int, journal_bytes: int = 0,
                 nvstack_args: list[str] | None = None, lower_options: str = "",
                 echo: bool = False):
        self.cfg = fs_mod.CONFIGS[fs_name]
        self.fs_name, self.rundir, self.device, self.timing = fs_name, rundir, device, timing
        self.caps = nvstack.probe()
        if self.cfg.mkfs not in ("ext2", "ext4"):
            raise BenchError(f"power cut: {fs_name} is not on ext2/ext4")
        self.nv = self.caps.binary
        self.sh = Shell(echo=echo)
        self.sh.param(str(rundir), "RUN", "$(mktemp -d /tmp/nvbench-powercut.XXXXXX)")
        tag = f"powercut-{os.getpid()}-{slug(fs_name)}"
        self.lay = fs_mod.Layout(workdir / tag, tag)
        self.lower_mnt, self.mnt = self.lay.lower_mnt, self.lay.mnt
        self.target = self.mnt if self.cfg.nvstack else self.lower_mnt
        self.disk_bytes, self.journal_bytes = disk_bytes, journal_bytes
        opts = ",".join(o for o in (self.cfg.mount_options, lower_options) if o)
        self.attach_argv = [self.nv, "device", "attach", str(self.lay.image), str(self.lower_mnt),
                            "--model", device, "--timing", timing,
                            *(["--mount-options", opts] if opts else [])]
        self.mount_argv = (fs_mod.nvstack_mount_argv(self.nv, self.cfg.nvstack,
                                                     self.lower_mnt / "data", self.mnt,
                                                     self.lay.nvram, nvram_bytes,
                                                     self.caps.mount_flags)
                           if self.cfg.nvstack else None)
        if self.mount_argv and nvstack_args:
            self.mount_argv[-1:-1] = nvstack_args            # before --foreground
        self.attached = False
        self.daemon = None
        self.daemon_var = ""
        self.procs: list = []

    @staticmethod
    def missing(fs_name: str) -> str | None:
        """Why this configuration cannot lose power here (None: it can)."""
        caps = nvstack.probe()
        cfg = fs_mod.CONFIGS[fs_name]
        return caps.missing("device") or (caps.missing("mount") if cfg.nvstack else None)

    def __enter__(self) -> "Stack":
        return self

    def __exit__(self, *exc) -> None:
        self.teardown()

    # ----- power on ------------------------------------------------------------------------
    def create(self) -> None:
        """A fresh image with the kernel FS (formatted like fs.Target does: data=journal gets
        the sized journal), attached; nvstack mounted over <lower>/data."""
        sh = self.sh
        sh.run(["mkdir", "-p", str(self.lower_mnt), str(self.mnt)])
        sh.note(f"{self.fs_name} ({self.cfg.description}) on {self.device} "
                f"({self.timing} timing)")
        if fs_mod.sized_journal(self.cfg):
            sh.run(["truncate", "-s", fmt_size(self.disk_bytes), str(self.lay.image)])
            sh.run(["mke2fs", "-q", "-F", "-t", self.cfg.mkfs, "-b", "4096", "-J",
                    f"size={max(4, self.journal_bytes >> 20)}", str(self.lay.image)])
            sh.run([*self.attach_argv, "--size", fmt_size(self.disk_bytes)], timeout=300)
        else:
            sh.run([*self.attach_argv, "--size", fmt_size(self.disk_bytes), "--mkfs",
                    self.cfg.mkfs], timeout=300)
        self.attached = True
        if self.cfg.nvstack:
            sh.run(["mkdir", "-p", str(self.lower_mnt / "data")])
            self.mount_nvstack("first")

    def mount_nvstack(self, tag: str) -> float:
        """Start the daemon; seconds until the mount is there (at recovery: the recovery)."""
        if fs_mod._is_mounted(self.mnt):
            # A dead daemon's mount would look mounted at once and time nothing.
            raise BenchError(f"{self.mnt} is still mounted before nvstack mount ({tag})")
        self.daemon = self.sh.spawn(self.mount_argv, self.rundir / f"daemon-{tag}.stdout",
                                    self.rundir / f"daemon-{tag}.stderr", "DAEMON")
        self.daemon_var = self.sh.last_spawn_var
        self.sh.log_only(f"for i in $(seq 600); do mountpoint -q {self.mnt} && break; "
                         f"sleep 0.1; done")
        return _wait_mounted(self.mnt, self.daemon, f"nvstack mount ({tag})",
                             self.rundir / f"daemon-{tag}.stderr")

    def reattach(self) -> float:
        """Power on: attach the same image again (ext4 replays its journal); seconds taken."""
        t0 = time.monotonic()
        self.sh.run(self.attach_argv, timeout=600)
        self.attached = True
        return time.monotonic() - t0

    def detach(self) -> None:
        self.sh.run([self.nv, "device", "detach", str(self.lower_mnt)], check=False, timeout=600)
        self.attached = False

    # ----- the power cut ---------------------------------------------------------------------
    def spawn(self, argv: list[str], name: str) -> object:
        proc = self.sh.spawn(argv, self.rundir / f"{name}.stdout", self.rundir / f"{name}.stderr",
                             "APP")
        self.procs.append((proc, self.sh.last_spawn_var))
        return proc

    def cut(self, seed: int) -> dict:
        """Everything stops at once: SIGKILL the applications, then the daemon, then drop or
        tear the disk's volatile cache (`device cut`). Returns what the cut reported.

        The applications die first: an application that outlives the daemon sees the mount
        fail and may still acknowledge - sqlite's unixDelete treats a directory it cannot open
        (ENOTCONN) as synced, so a DELETE-mode COMMIT whose journal unlink reached the daemon
        returns success without its directory fsync. Requests in flight when the application
        dies may still complete in the daemon: as if the power failed a moment later."""
        sh = self.sh
        sh.note("power cut: the application and the daemon die, the disk loses its cache")
        for proc, var in self.procs:
            sh.log_only(f"kill -KILL ${var}")
            _kill(proc)
        if self.cfg.nvstack:
            sh.log_only(f"kill -KILL ${self.daemon_var}")
            _kill(self.daemon)
        cut = sh.run([self.nv, "device", "cut", str(self.lower_mnt), "--seed", str(seed)],
                     check=False, timeout=300)
        self.attached = False
        (self.rundir / "cut.txt").write_text(cut.stdout + cut.stderr)
        out = {"cut": (cut.stdout + cut.stderr).strip()[:500]}
        try:
            cj = json.loads(cut.stdout)
            out.update(cut_mode=cj.get("mode"), cut_held_sectors=cj.get("held_sectors"),
                       cut_dropped_sectors=cj.get("dropped_sectors"))
        except ValueError:
            pass
        if cut.returncode != 0:
            raise BenchError(f"nvstack device cut failed (exit {cut.returncode}): {out['cut']}")
        if self.cfg.nvstack and fs_mod._is_mounted(self.mnt):
            sh.run(["fusermount3", "-uz", str(self.mnt)], check=False)
        return out

    def device_stat(self) -> dict:
        """`nvstack device stat --json` of the disk: requests, bytes, busy time since it was
        attached ({} if it fails)."""
        res = self.sh.run([self.nv, "device", "stat", str(self.lower_mnt), "--json"],
                          check=False, timeout=60)
        try:
            doc = json.loads(res.stdout)
        except ValueError:
            return {}
        return {k: doc[k] for k in ("requests", "reads", "writes", "flushes", "bytes_read",
                                    "bytes_written", "busy_ms") if k in doc}

    def stat(self) -> dict:
        """`nvstack stat --json` of the mount ({} if it fails)."""
        res = self.sh.run([self.nv, "stat", str(self.mnt), "--json"], check=False, timeout=60)
        try:
            return json.loads(res.stdout)
        except ValueError:
            return {}

    # ----- shutdown and the offline checks ---------------------------------------------------
    def shutdown_checks(self) -> dict:
        """A clean `nvstack umount`, `nvstack check`, frames in use, `device detach`,
        `e2fsck -fn`; returns their results (and raises if the unmount fails)."""
        sh, out = self.sh, {}
        if self.cfg.nvstack:
            um = sh.run([self.nv, "umount", str(self.mnt)], check=False, timeout=600)
            if um.returncode != 0:
                raise BenchError(f"nvstack umount after recovery failed: {um.stderr.strip()}")
            try:
                self.daemon.wait(timeout=60)
            except Exception:  # noqa: BLE001
                raise BenchError("the nvstack daemon did not exit after umount") from None
            self.daemon = None
            ck = sh.run([self.nv, "check", "--nvram", str(self.lay.nvram)], check=False,
                        timeout=300)
            out["nvstack_check_exit"] = ck.returncode
            out["nvstack_check"] = (ck.stdout + ck.stderr).strip()[-300:]
            ins = sh.run([self.nv, "inspect", "--nvram", str(self.lay.nvram), "--json"],
                         check=False, timeout=120)
            try:
                out["frames_used_after_umount"] = json.loads(ins.stdout)["frames_used"]
            except (ValueError, KeyError, TypeError):
                out["frames_used_after_umount"] = None
        self.detach()
        fsck = sh.run(["e2fsck", "-fn", str(self.lay.image)], check=False, timeout=600)
        out["e2fsck_exit"] = fsck.returncode
        (self.rundir / "e2fsck.txt").write_text(fsck.stdout + fsck.stderr)
        return out

    def teardown(self) -> None:
        sh, nv, mnt, lower = self.sh, self.nv, self.mnt, self.lower_mnt
        sh.phase = "cleanup"
        # repro.sh: whatever its body got to, leave no mount or loop device behind
        sh.log_only(f"mountpoint -q {mnt} && fusermount3 -uz {mnt}; "
                    f"mountpoint -q {lower} && {nv} device detach {lower}")
        for proc, _var in self.procs:
            _kill(proc)
        if self.daemon is not None and self.daemon.poll() is None:
            sh.run([nv, "umount", str(mnt)], check=False, timeout=120)
            try:
                self.daemon.wait(timeout=30)
            except Exception:  # noqa: BLE001
                _kill(self.daemon)
        if fs_mod._is_mounted(mnt):
            sh.run(["fusermount3", "-uz", str(mnt)], check=False)
        if self.attached:
            self.detach()
        sh.run(["rm", "-f", str(self.lay.nvram)], check=False)
        sh.run(["rm", "-rf", "--one-file-system", str(self.lay.workdir)], check=False)

    def write_repro(self, header: str) -> None:
        repro = self.rundir / "repro.sh"
        repro.write_text(self.sh.repro_script(header))
        repro.chmod(0o755)


def run(out: Path, fs_name: str, *, app: str = "sqlite-wal", device: str = "hdd-7200",
        timing: str = "sleep", workdir: Path = Path("/var/tmp/nvbench-work"),
        nvram_bytes: int = 256 << 20, disk_bytes: int = 1 << 30, cut_after: float = 8.0,
        seed: int = 1, name: str | None = None, flush_after_init: bool = False,
        echo: bool = False) -> dict:
    """One power-cut run of `app` on `fs_name` (a kernel ext4 configuration or nvstack over
    one); writes OUT/<name>/result.json (returned; name = the configuration's by default),
    repro.sh and the raw outputs. `flush_after_init` (nvstack): `nvstack flush` once the
    application's directory and files are made, so the cut finds them in the lower file
    system (no replay of their creation; a diagnostic variant)."""
    kind, extra, check_kind = APPS[app]
    cfg = fs_mod.CONFIGS[fs_name]
    rundir = out / slug(name or fs_name)
    rundir.mkdir(parents=True, exist_ok=True)
    result = {"fs": fs_name, "label": cfg.label, "app": app, "device": device, "timing": timing,
              "consistency": (cfg.nvstack or {}).get("consistency"),
              "journal_mode": extra[1] if kind == "sqlite" else None,
              "synchronous": (extra[3].upper() if len(extra) > 3 else "FULL")
              if kind == "sqlite" else None, "cut_after_s": cut_after,
              "seed": seed, "nvram_bytes": nvram_bytes if cfg.nvstack else None,
              "flush_after_init": flush_after_init, "kill_order": KILL_ORDER,
              "status": "ok", "reason": ""}
    why = Stack.missing(fs_name)
    if why:
        result.update(status="skipped", reason=why)
        _write(rundir / "result.json", result)
        return result
    acks = Path("/dev/shm") / f"nvbench-powercut-{os.getpid()}-{slug(fs_name)}.acks"
    stack = Stack(rundir, fs_name, device=device, timing=timing, workdir=workdir,
                  nvram_bytes=nvram_bytes, disk_bytes=disk_bytes, echo=echo)
    sh = stack.sh
    appdir = stack.target / f"nvbench-{kind}"
    driver_argv = [sys.executable, str(DURABLE_DRIVER), kind, "--dir", str(appdir), *extra]
    try:
        with failure_recorded(result):
            acks.unlink(missing_ok=True)
            stack.create()
            sh.run(["mkdir", "-p", str(appdir)])
            sh.run([*driver_argv, "--init"], timeout=120)
            if flush_after_init and cfg.nvstack:
                sh.run([stack.nv, "flush", str(stack.mnt)], timeout=600)
            sh.note(f"the application ({app}): transactions until the power cut, acknowledged "
                    f"ids -> {acks}")
            driver = stack.spawn([*driver_argv, "--seconds", str(cut_after + 300), "--acks",
                                  str(acks)], "driver")
            sh.log_only(f"sleep {cut_after}")
            t_end = time.monotonic() + cut_after
            while time.monotonic() < t_end:
                if driver.poll() is not None:
                    raise BenchError(f"the {app} loop ended before the power cut (exit "
                                     f"{driver.returncode}): {_tail(rundir / 'driver.stdout')} "
                                     f"{_tail(rundir / 'driver.stderr')}")
                time.sleep(0.05)
            result.update(stack.cut(seed))
            acked = read_acks(str(acks))
            result["acknowledged_before_cut"] = len(acked)
            result["tx_per_second_before_cut"] = round(len(acked) / cut_after, 1)
            sh.note("power on: re-attach the image (ext4 replays its journal), mount nvstack again "
                    "(recovery)")
            result["reattach_seconds"] = round(stack.reattach(), 2)
            if cfg.nvstack:
                result["recovery_mount_seconds"] = round(stack.mount_nvstack("recovery"), 2)
            chk = sh.run([sys.executable, str(DURABLE_DRIVER), check_kind, "--dir", str(appdir),
                          "--acks", str(acks)], check=False, timeout=600)
            (rundir / "check.json").write_text(chk.stdout)
            try:
                check = json.loads(chk.stdout.strip().splitlines()[-1])
            except (ValueError, IndexError):
                raise BenchError(f"{check_kind} printed no result (exit {chk.returncode}): "
                                 f"{chk.stderr.strip()[-500:]}") from None
            result["check"] = check
            if check.get("error"):
                raise BenchError(f"after the power cut: {check['error']}")
            result.update(integrity_ok=check["integrity_ok"], acknowledged=check["acknowledged"],
                          survived=check["survived"], lost=check["lost"], extra=check["extra"],
                          present=check["present"])
            result.update(stack.shutdown_checks())
            problems = []
            if not check["integrity_ok"]:
                problems.append(f"integrity: {check.get('integrity_check') or check}")
            if check["lost"]:
                problems.append(f"{check['lost']} acknowledged transactions lost "
                                f"(first: {check['lost_ids'][:5]})")
            if check["unexpected"]:
                problems.append(f"{check['unexpected']} transactions that were never issued")
            if cfg.nvstack and result.get("nvstack_check_exit") != 0:
                problems.append(f"nvstack check exit {result.get('nvstack_check_exit')}")
            if result.get("e2fsck_exit") != 0:
                problems.append(f"e2fsck -fn exit {result.get('e2fsck_exit')}")
            if problems:
                result.update(status="failed", reason="; ".join(problems))
    finally:
        stack.teardown()
        if acks.exists():
            sh.run(["cp", str(acks), str(rundir / "acks.txt")], check=False)
        sh.run(["rm", "-f", str(acks)], check=False)
        _write(rundir / "result.json", result)
        stack.write_repro(f"power cut of {fs_name} during {app}; run as root")
    return result


def merge(doc: dict, results: list[dict], command: str) -> dict:
    """OUT/powercut.json after one more `bench/run powercut`: its cuts join the ones already
    there (a cut of the same configuration, application, seed and variant is replaced), its
    command joins the commands."""
    def key(r: dict) -> tuple:
        return (r["fs"], r.get("app"), r.get("seed"), r.get("flush_after_init", False))
    new = {key(r) for r in results}
    return {"commands": [*doc.get("commands", []), command],
            "results": [r for r in doc.get("results", []) if key(r) not in new] + results}


def _write(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def _what(r: dict) -> str:
    if r.get("app") in (None, "sqlite-wal", "sqlite-delete", "sqlite-delete-extra"):
        return (f"sqlite journal_mode={r.get('journal_mode') or 'wal'} "
                f"synchronous={r.get('synchronous') or 'FULL'}")
    return r["app"]


def text(results: list[dict]) -> str:
    """The power-cut lines (plain text), one per run."""
    lines = []
    for r in results:
        mode = f" ({r['consistency']})" if r.get("consistency") else ""
        head = f"{r['fs']}{mode}: {_what(r)}, power cut after {r['cut_after_s']:g} s"
        if r["status"] != "ok" and "acknowledged" not in r:
            lines.append(f"{head}: {r['status'].upper()}: {r['reason']}")
            continue
        verdict = "OK" if r["status"] == "ok" else f"FAILED: {r['reason']}"
        rec = (f"; recovery mount {r['recovery_mount_seconds']:.1f} s, nvstack check exit "
               f"{r.get('nvstack_check_exit')}, frames in use after umount "
               f"{r.get('frames_used_after_umount')}" if "recovery_mount_seconds" in r else "")
        held = (f" (disk cache at the cut: {r['cut_held_sectors']} sectors held, "
                f"{r['cut_dropped_sectors']} dropped, mode {r['cut_mode']})"
                if r.get("cut_held_sectors") is not None else "")
        whole = ("PRAGMA integrity_check: " if _what(r).startswith("sqlite") else "data whole: ")
        lines.append(f"{head}{held}: {r['acknowledged']:,} commits acknowledged, "
                     f"{r['survived']:,} survived, {r['lost']} lost, {r['extra']} in flight found; "
                     f"{whole}{'ok' if r['integrity_ok'] else 'NOT ok'}; "
                     f"e2fsck -fn exit {r.get('e2fsck_exit')}{rec}. {verdict}")
    return "\n".join(lines)
