"""A power cut in the middle of a sqlite run, and what survives it (the showcase, part 2).

On the modeled disk (volatile write cache, `nvstack device cut`), for one file-system
configuration (ext4 alone, or nvstack over ext4):

  1. attach a fresh image (`nvstack device attach --mkfs`), mount nvstack over <lower>/data
     (stacked configurations), create the sqlite database (durable.py sqlite --init);
  2. run durable.py sqlite (synchronous=FULL) with `--acks` = a file in /dev/shm, outside the
     file system under test: the id of every commit whose COMMIT returned, written and
     fsynced before the next transaction begins;
  3. after `cut_after` seconds, the power cut: SIGKILL the nvstack daemon (stacked) and the
     application, then `nvstack device cut` (the disk's volatile cache is dropped or torn by
     the seed; the kernel FS is unmounted without anything more reaching the image; the
     dead FUSE mount is detached lazily);
  4. power on: re-attach the same image (the kernel replays ext4's journal at mount) and
     mount nvstack again over the same lower directory with the same region (recovery);
  5. check: PRAGMA integrity_check and the ids in the table against the acknowledged ids
     (durable.account: lost must be 0; commits in flight at the cut may or may not be there);
     then a clean `nvstack umount`, `nvstack check` of the region (exit 0), frames in use
     after unmount (`nvstack inspect --json`), `device detach` and `e2fsck -fn` of the image.

Everything runs through a Shell, so OUT/<fs>/repro.sh replays it; every wait is bounded and
every mount, loop device, daemon and file is removed on the way out, also on failure.
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
from .util import BenchError, fmt_size, slug
from .workloads import DURABLE_DRIVER
from .workloads.durable import read_acks

MOUNT_WAIT_S = 60          # a daemon (or its recovery) must have mounted by then
KILL_WAIT_S = 10


def _wait_mounted(path: Path, proc, what: str, log: Path) -> float:
    t0 = time.monotonic()
    while not fs_mod._is_mounted(path):
        if proc is not None and proc.poll() is not None:
            raise BenchError(f"{what} exited ({proc.returncode}) before mounting: "
                             f"{_tail(log)}")
        if time.monotonic() - t0 > MOUNT_WAIT_S:
            raise BenchError(f"{what} did not mount {path} within {MOUNT_WAIT_S} s: {_tail(log)}")
        time.sleep(0.05)
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


def run(out: Path, fs_name: str, *, device: str = "hdd-7200", timing: str = "sleep",
        workdir: Path = Path("/var/tmp/nvbench-work"), nvram_bytes: int = 256 << 20,
        disk_bytes: int = 1 << 30, journal_mode: str = "wal", cut_after: float = 8.0,
        seed: int = 1, echo: bool = False) -> dict:
    """One power-cut run of `fs_name` (a kernel ext4 configuration or nvstack over one);
    writes OUT/<fs>/result.json (returned), repro.sh and the raw outputs."""
    cfg = fs_mod.CONFIGS[fs_name]
    caps = nvstack.probe()
    why = caps.missing("device") or (caps.missing("mount") if cfg.nvstack else None)
    rundir = out / slug(fs_name)
    rundir.mkdir(parents=True, exist_ok=True)
    result = {"fs": fs_name, "label": cfg.label, "device": device, "timing": timing,
              "journal_mode": journal_mode, "synchronous": "FULL", "cut_after_s": cut_after,
              "seed": seed, "nvram_bytes": nvram_bytes if cfg.nvstack else None,
              "status": "ok", "reason": ""}
    if why:
        result.update(status="skipped", reason=why)
        _write(rundir / "result.json", result)
        return result
    if cfg.mkfs not in ("ext2", "ext4"):
        raise BenchError(f"power cut: {fs_name} is not on ext2/ext4")
    nv = caps.binary
    sh = Shell(echo=echo)
    sh.param(str(rundir), "RUN", "$(mktemp -d /tmp/nvbench-powercut.XXXXXX)")
    lay = fs_mod.Layout(workdir / f"powercut-{os.getpid()}-{slug(fs_name)}",
                        f"powercut-{os.getpid()}-{slug(fs_name)}")
    acks = Path("/dev/shm") / f"nvbench-{lay.run_id}.acks"
    lower_mnt, mnt = lay.lower_mnt, lay.mnt
    target = mnt if cfg.nvstack else lower_mnt
    dbdir = target / "nvbench-sqlite"
    opts = cfg.mount_options
    attach = [nv, "device", "attach", str(lay.image), str(lower_mnt), "--model", device,
              "--timing", timing, *(["--mount-options", opts] if opts else [])]
    mount_argv = (fs_mod.nvstack_mount_argv(nv, cfg.nvstack, lower_mnt / "data", mnt,
                                            lay.nvram, nvram_bytes, caps.mount_flags)
                  if cfg.nvstack else None)
    driver_argv = [sys.executable, str(DURABLE_DRIVER), "sqlite", "--dir", str(dbdir),
                   "--journal-mode", journal_mode]
    state = {"attached": False, "daemon": None, "driver": None, "daemon_var": "", "app_var": ""}

    def spawn_daemon(tag: str) -> float:
        state["daemon"] = sh.spawn(mount_argv, rundir / f"daemon-{tag}.stdout",
                                   rundir / f"daemon-{tag}.stderr", "DAEMON")
        state["daemon_var"] = sh.last_spawn_var
        sh.log_only(f"for i in $(seq 600); do mountpoint -q {mnt} && break; sleep 0.1; done")
        return _wait_mounted(mnt, state["daemon"], f"nvstack mount ({tag})",
                             rundir / f"daemon-{tag}.stderr")

    try:
        acks.unlink(missing_ok=True)
        sh.run(["mkdir", "-p", str(lower_mnt), str(mnt)])
        sh.note(f"power cut: {fs_name} ({cfg.description}) on {device} ({timing} timing)")
        sh.run([*attach, "--size", fmt_size(disk_bytes), "--mkfs", cfg.mkfs], timeout=300)
        state["attached"] = True
        if cfg.nvstack:
            sh.run(["mkdir", "-p", str(lower_mnt / "data")])
            spawn_daemon("first")
        sh.run(["mkdir", "-p", str(dbdir)])
        sh.run([*driver_argv, "--init"], timeout=120)
        sh.note(f"the application: sqlite commits until the power cut, acknowledged ids -> {acks}")
        state["driver"] = sh.spawn([*driver_argv, "--seconds", str(cut_after + 300),
                                    "--acks", str(acks)],
                                   rundir / "driver.stdout", rundir / "driver.stderr", "APP")
        state["app_var"] = sh.last_spawn_var
        sh.log_only(f"sleep {cut_after}")
        t_end = time.monotonic() + cut_after
        while time.monotonic() < t_end:
            if state["driver"].poll() is not None:
                raise BenchError(f"the sqlite loop ended before the power cut (exit "
                                 f"{state['driver'].returncode}): "
                                 f"{_tail(rundir / 'driver.stdout')} {_tail(rundir / 'driver.stderr')}")
            time.sleep(0.05)
        # --- the power cut: everything stops at once; the disk keeps only what was flushed
        sh.note("power cut: the daemon and the application die, the disk loses its cache")
        if cfg.nvstack:
            sh.log_only(f"kill -KILL ${state['daemon_var']}")
            _kill(state["daemon"])
        sh.log_only(f"kill -KILL ${state['app_var']}")
        _kill(state["driver"])
        cut = sh.run([nv, "device", "cut", str(lower_mnt), "--seed", str(seed)], check=False,
                     timeout=300)
        state["attached"] = False
        (rundir / "cut.txt").write_text(cut.stdout + cut.stderr)
        result["cut"] = (cut.stdout + cut.stderr).strip()[:500]
        try:
            cj = json.loads(cut.stdout)
            result.update(cut_mode=cj.get("mode"), cut_held_sectors=cj.get("held_sectors"),
                          cut_dropped_sectors=cj.get("dropped_sectors"))
        except ValueError:
            pass
        if cut.returncode != 0:
            raise BenchError(f"nvstack device cut failed (exit {cut.returncode}): {result['cut']}")
        if cfg.nvstack and fs_mod._is_mounted(mnt):
            sh.run(["fusermount3", "-uz", str(mnt)], check=False)
        acked = read_acks(str(acks))
        result["acknowledged_before_cut"] = len(acked)
        result["tx_per_second_before_cut"] = round(len(acked) / cut_after, 1)
        # --- power on: the same image, the same lower directory, the same region
        sh.note("power on: re-attach the image (ext4 replays its journal), mount nvstack again "
                "(recovery)")
        t0 = time.monotonic()
        sh.run(attach, timeout=300)
        state["attached"] = True
        result["reattach_seconds"] = round(time.monotonic() - t0, 2)
        if cfg.nvstack:
            result["recovery_mount_seconds"] = round(spawn_daemon("recovery"), 2)
        chk = sh.run([*driver_argv[:2], "sqlite-check", "--dir", str(dbdir), "--acks", str(acks)],
                     check=False, timeout=600)
        (rundir / "check.json").write_text(chk.stdout)
        try:
            check = json.loads(chk.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise BenchError(f"sqlite-check printed no result (exit {chk.returncode}): "
                             f"{chk.stderr.strip()[-500:]}") from None
        result["check"] = check
        if check.get("error"):
            raise BenchError(f"after the power cut: {check['error']}")
        result.update(integrity_ok=check["integrity_ok"], acknowledged=check["acknowledged"],
                      survived=check["survived"], lost=check["lost"], extra=check["extra"],
                      present=check["present"])
        # --- a clean shutdown, and the offline checks
        if cfg.nvstack:
            um = sh.run([nv, "umount", str(mnt)], check=False, timeout=600)
            if um.returncode != 0:
                raise BenchError(f"nvstack umount after recovery failed: {um.stderr.strip()}")
            try:
                state["daemon"].wait(timeout=60)
            except Exception:  # noqa: BLE001
                raise BenchError("the nvstack daemon did not exit after umount") from None
            state["daemon"] = None
            ck = sh.run([nv, "check", "--nvram", str(lay.nvram)], check=False, timeout=300)
            result["nvstack_check_exit"] = ck.returncode
            result["nvstack_check"] = (ck.stdout + ck.stderr).strip()[-300:]
            ins = sh.run([nv, "inspect", "--nvram", str(lay.nvram), "--json"], check=False,
                         timeout=120)
            try:
                result["frames_used_after_umount"] = json.loads(ins.stdout)["frames_used"]
            except (ValueError, KeyError, TypeError):
                result["frames_used_after_umount"] = None
        sh.run([nv, "device", "detach", str(lower_mnt)], check=False, timeout=600)
        state["attached"] = False
        fsck = sh.run(["e2fsck", "-fn", str(lay.image)], check=False, timeout=600)
        result["e2fsck_exit"] = fsck.returncode
        (rundir / "e2fsck.txt").write_text(fsck.stdout + fsck.stderr)
        problems = []
        if not check["integrity_ok"]:
            problems.append(f"integrity_check: {check['integrity_check']}")
        if check["lost"]:
            problems.append(f"{check['lost']} acknowledged commits lost "
                            f"(first: {check['lost_ids'][:5]})")
        if check["unexpected"]:
            problems.append(f"{check['unexpected']} rows that were never issued")
        if cfg.nvstack and result.get("nvstack_check_exit") != 0:
            problems.append(f"nvstack check exit {result.get('nvstack_check_exit')}")
        if fsck.returncode != 0:
            problems.append(f"e2fsck -fn exit {fsck.returncode}")
        if problems:
            result.update(status="failed", reason="; ".join(problems))
    except BenchError as exc:
        result.update(status="failed", reason=str(exc)[:2000])
    except BaseException:
        result.update(status="failed", reason="interrupted (Ctrl-C or signal)")
        raise
    finally:
        sh.phase = "cleanup"
        # repro.sh: whatever its body got to, leave no mount or loop device behind
        sh.log_only(f"mountpoint -q {mnt} && fusermount3 -uz {mnt}; "
                    f"mountpoint -q {lower_mnt} && {nv} device detach {lower_mnt}")
        _kill(state["driver"])
        if state["daemon"] is not None and state["daemon"].poll() is None:
            sh.run([nv, "umount", str(mnt)], check=False, timeout=120)
            try:
                state["daemon"].wait(timeout=30)
            except Exception:  # noqa: BLE001
                _kill(state["daemon"])
        if fs_mod._is_mounted(mnt):
            sh.run(["fusermount3", "-uz", str(mnt)], check=False)
        if state["attached"]:
            sh.run([nv, "device", "detach", str(lower_mnt)], check=False, timeout=600)
        if acks.exists():
            sh.run(["cp", str(acks), str(rundir / "acks.txt")], check=False)
        sh.run(["rm", "-f", str(acks), str(lay.nvram)], check=False)
        sh.run(["rm", "-rf", "--one-file-system", str(lay.workdir)], check=False)
        _write(rundir / "result.json", result)
        repro = rundir / "repro.sh"
        repro.write_text(sh.repro_script(f"power cut of {fs_name} during sqlite "
                                         f"journal_mode={journal_mode}; run as root"))
        repro.chmod(0o755)
    return result


def _write(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def text(results: list[dict]) -> str:
    """The power-cut lines of the showcase (plain text)."""
    lines = []
    for r in results:
        head = (f"{r['fs']}: sqlite journal_mode={r['journal_mode']} synchronous=FULL, power "
                f"cut after {r['cut_after_s']:g} s")
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
        lines.append(f"{head}{held}: {r['acknowledged']:,} commits acknowledged, "
                     f"{r['survived']:,} survived, {r['lost']} lost, {r['extra']} in flight found; "
                     f"PRAGMA integrity_check: {'ok' if r['integrity_ok'] else 'NOT ok'}; "
                     f"e2fsck -fn exit {r.get('e2fsck_exit')}{rec}. {verdict}")
    return "\n".join(lines)
