"""Every command a run executes goes through a Shell, which also writes it down.

The log becomes the run's repro.sh: setup steps in order, the timed workload, and the teardown
steps inside a `cleanup` function run by `trap cleanup EXIT`. Values that are only known at run
time (the loop device printed by `losetup --find --show`) are captured into shell variables, and
later commands refer to the variable, so repro.sh never hard-codes a device path.

`Shell(dry_run=True)` executes nothing and returns placeholder output: the experiment matrix,
the generated input files and repro.sh can be checked without root, mounts or tools.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from .util import BenchError


@dataclass
class Result:
    returncode: int
    stdout: str = ""
    stderr: str = ""
    seconds: float = 0.0


class Shell:
    def __init__(self, dry_run: bool = False, echo: bool = False):
        self.dry_run = dry_run
        self.echo = echo
        self.setup: list[str] = []       # repro.sh body, in order
        self.cleanup: list[str] = []     # repro.sh cleanup(), in the order executed
        self._vars: dict[str, str] = {}  # runtime value -> variable name
        self._counter = 0
        self.phase = "setup"
        self.params: list[str] = []

    # ----- rendering -------------------------------------------------------------------------
    def render(self, argv: list[str]) -> str:
        out = []
        for arg in argv:
            hit = next(((v, n) for v, n in self._vars.items() if v and v in arg), None)
            if hit is None:
                out.append(shlex.quote(arg))
            else:
                value, name = hit
                ref = "${" + name + "}"
                out.append('"' + ref.join(_esc(part) for part in arg.split(value)) + '"')
        return " ".join(out)

    def _log(self, line: str) -> None:
        (self.cleanup if self.phase == "cleanup" else self.setup).append(line)
        if self.echo:
            print(f"  $ {line}", flush=True)

    def note(self, text: str) -> None:
        for line in text.splitlines():
            self._log(f"# {line}")

    def param(self, value: str, name: str, default: str) -> None:
        """Make `value` a parameter of repro.sh: NAME="${1:-default}" at the top."""
        self._vars[value] = name
        self.params.append(f'{name}="${{1:-{default}}}"; mkdir -p "${{{name}}}"')

    def bind(self, value: str, prefix: str) -> str:
        """Refer to a runtime value by a variable from now on; returns the variable name."""
        self._counter += 1
        name = f"{prefix}{self._counter}"
        self._vars[value] = name
        return name

    # ----- execution -------------------------------------------------------------------------
    def run(self, argv: list[str], *, check: bool = True, capture_as: str | None = None,
            timeout: float | None = None, stdout: Path | None = None,
            stderr: Path | None = None, log: bool = True, dry_output: str = "",
            time_it: bool = False) -> Result:
        """Run argv; with capture_as='LOOP' the stripped stdout becomes ${LOOPn} in repro.sh."""
        line = ("time -p " if time_it else "") + self.render(argv)
        if stdout is not None:
            line += f" >{self.render([str(stdout)])}"
        if stderr is not None:
            line += f" 2>{self.render([str(stderr)])}"
        if self.dry_run:
            out = dry_output or (f"/dev/loop-{capture_as.lower()}" if capture_as else "")
            res = Result(0, out, "", 0.0)
        else:
            res = self._execute(argv, timeout, stdout, stderr)
        if capture_as:
            name = self.bind(res.stdout.strip(), capture_as)
            line = f"{name}=$({line})"
        if log:
            self._log(line)
        if check and res.returncode != 0:
            raise BenchError(f"command failed (exit {res.returncode}): {line}\n{res.stderr.strip()[-2000:]}")
        return res

    def _execute(self, argv, timeout, stdout, stderr) -> Result:
        out_f = open(stdout, "w") if stdout else subprocess.PIPE
        err_f = open(stderr, "w") if stderr else subprocess.PIPE
        t0 = time.monotonic()
        try:
            p = subprocess.Popen(argv, stdout=out_f, stderr=err_f, text=True,
                                 start_new_session=True)
            try:
                o, e = p.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                o, e = p.communicate()
                return Result(124, o or "", (e or "") + f"\ntimed out after {timeout}s",
                              time.monotonic() - t0)
            except BaseException:
                # Ctrl-C: stop the child's process group (it is ours), then re-raise
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
                raise
        except FileNotFoundError as exc:
            return Result(127, "", str(exc), 0.0)
        finally:
            for f in (out_f, err_f):
                if f is not subprocess.PIPE:
                    f.close()
        return Result(p.returncode, o or "", e or "", time.monotonic() - t0)

    def sh(self, script: str, *, check: bool = True) -> Result:
        """A one-line shell snippet (redirections to /proc, sync + drop caches)."""
        self._log(script)
        if self.dry_run:
            return Result(0)
        res = self._execute(["sh", "-c", script], 600, None, None)
        if check and res.returncode != 0:
            raise BenchError(f"command failed (exit {res.returncode}): {script}\n{res.stderr.strip()}")
        return res

    def log_only(self, script: str) -> None:
        """A line for repro.sh that the harness does itself in Python (e.g. a wait loop)."""
        self._log(script)

    def write_file(self, path: Path, text: str) -> None:
        """Write an input file; repro.sh recreates it with a here-document."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        self._log(f"cat >{self.render([str(path)])} <<'NVBENCH_EOF'\n{text.rstrip()}\nNVBENCH_EOF")

    def spawn(self, argv: list[str], stdout: Path, stderr: Path, var: str):
        """Start a background daemon; repro.sh gets `argv & VARn=$!`. Returns Popen or None."""
        name = f"{var}{self._counter + 1}"
        self._counter += 1
        self.last_spawn_var = name
        self._log(f"{self.render(argv)} >{self.render([str(stdout)])} "
                  f"2>{self.render([str(stderr)])} &\n{name}=$!")
        if self.dry_run:
            return None
        return subprocess.Popen(argv, stdout=open(stdout, "w"), stderr=open(stderr, "w"),
                                start_new_session=True)

    # ----- repro.sh ----------------------------------------------------------------------------
    def repro_script(self, header: str) -> str:
        lines = ["#!/bin/bash", "# Reproduces exactly one benchmark run (generated by bench/run).",
                 *(f"# {h}" for h in header.splitlines()),
                 "set -euo pipefail", *self.params, "", "cleanup() {", "  set +eu"]
        lines += [f"  {c}" for c in self.cleanup] or ["  :"]
        lines += ["}", "trap cleanup EXIT", ""]
        lines += self.setup
        return "\n".join(lines) + "\n"


def _esc(text: str) -> str:
    """Escape text for use inside double quotes."""
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$").replace("`", "\\`")
