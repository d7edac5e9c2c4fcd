"""Finding the nvstack binary and what it can do yet.

Binary: $NVSTACK_BIN, else target/release/nvstack in the repository root, else PATH.
Other FUSE daemons for comparison (libfuse's passthrough_hp, `-wt` = without writeback cache):
$PASSTHROUGH_HP / $PASSTHROUGH_HP_WT, else bench/.tools/bin/<name> as built by
bench/tools/build-passthrough-hp (from the Debian source package of the installed libfuse).

Capabilities are probed, never assumed: `nvstack device attach --help` and
`nvstack mount --help` must exit 0. A configuration needing a missing capability is skipped
with the reason.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass, field

from .util import BENCH_DIR, REPO_DIR, which

BUILD_PASSTHROUGH_HP = BENCH_DIR / "tools" / "build-passthrough-hp"
FUSE_DAEMONS = {"passthrough_hp": "PASSTHROUGH_HP", "passthrough_hp-wt": "PASSTHROUGH_HP_WT"}


@dataclass
class Capabilities:
    binary: str | None
    device: bool = False
    mount: bool = False
    version: str | None = None
    reasons: dict = field(default_factory=dict)
    tools: dict = field(default_factory=dict)     # FUSE daemon name -> path (None if missing)
    mount_flags: set = field(default_factory=set)  # long options `nvstack mount --help` lists
    consistency_modes: set = field(default_factory=set)  # its --consistency values

    def missing(self, need: str) -> str | None:
        """None if `need` ('device' | 'mount' | a FUSE daemon name) is available, else why."""
        if need in FUSE_DAEMONS:
            if self.tools.get(need):
                return None
            return (f"{need} not built: run bench/tools/build-passthrough-hp (root; Debian "
                    f"source of libfuse 3.14) or set ${FUSE_DAEMONS[need]}")
        if need.startswith("consistency:"):
            mode = need.split(":", 1)[1]
            if self.mount and mode in self.consistency_modes:
                return None
            return f"`nvstack mount --consistency {mode}` does not exist yet"
        if need.startswith("mount-flag:"):
            flag = need.split(":", 1)[1]
            if self.mount and flag in self.mount_flags:
                return None
            return (f"`nvstack mount --{flag}` does not exist yet (the mechanism is not built; "
                    f"see `nvstack mount --help`)")
        if getattr(self, need):
            return None
        return self.reasons.get(need, f"nvstack {need} not available")


def find_fuse_daemon(name: str) -> str | None:
    env = os.environ.get(FUSE_DAEMONS[name])
    if env:
        return env if os.access(env, os.X_OK) else None
    local = BENCH_DIR / ".tools" / "bin" / name
    return str(local) if os.access(local, os.X_OK) else None


def find_binary() -> str | None:
    env = os.environ.get("NVSTACK_BIN")
    if env:
        return env if os.access(env, os.X_OK) else None
    local = REPO_DIR / "target" / "release" / "nvstack"
    if os.access(local, os.X_OK):
        return str(local)
    return which("nvstack")


def _ok(argv: list[str]) -> tuple[bool, str]:
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError) as exc:
        return False, str(exc)
    tail = (p.stderr or p.stdout).strip().splitlines()[-1:] or [""]
    return p.returncode == 0, f"exit {p.returncode}: {tail[0][:200]}"


_cache: Capabilities | None = None


def probe(refresh: bool = False) -> Capabilities:
    global _cache
    if _cache is not None and not refresh:
        return _cache
    binary = find_binary()
    caps = Capabilities(binary)
    caps.tools = {name: find_fuse_daemon(name) for name in FUSE_DAEMONS}
    if binary is None:
        why = "nvstack binary not found ($NVSTACK_BIN, target/release/nvstack, PATH)"
        caps.reasons = {"device": why, "mount": why}
    else:
        caps.device, why_d = _ok([binary, "device", "attach", "--help"])
        caps.mount, why_m = _ok([binary, "mount", "--help"])
        if caps.mount:
            try:
                p = subprocess.run([binary, "mount", "--help"], capture_output=True, text=True,
                                   timeout=20)
                caps.mount_flags = set(re.findall(r"--([a-z][a-z0-9-]+)", p.stdout))
                block = p.stdout.split("--consistency", 1)[-1].split("\n  -", 1)[0]
                caps.consistency_modes = set(re.findall(r"^\s+- ([a-z]+):", block, re.M))
            except (OSError, subprocess.SubprocessError):
                pass
        caps.reasons = {"device": f"`nvstack device attach --help` failed ({why_d})",
                        "mount": f"`nvstack mount --help` failed ({why_m})"}
        try:
            p = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10)
            caps.version = p.stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            pass
    _cache = caps
    return caps
