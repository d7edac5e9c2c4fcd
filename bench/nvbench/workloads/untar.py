"""Untar of a real source tarball from a Debian package (default: linux-source-*, the papers
untar Linux 2.6.11/2.6.12 trees; install with `bench/install.sh --with-linux-source`).

The compressed tarball is decompressed once, untimed and outside the measured file system, into
the work cache, so the timed `tar -xf` measures the file system, not the decompressor.
Not scaled: the whole tree is extracted (scale recorded as 1).
"""

from __future__ import annotations

import glob
from pathlib import Path

from . import Invocation, target_subdir

TOOL = "tar"
PRIMARY = ("wall_seconds", "s", False)
CONFIGS = {"linux-source": {"glob": "/usr/src/linux-source-*.tar.*", "package": "linux-source"}}
_DECOMP = {".xz": "xz", ".bz2": "bzip2", ".gz": "gzip", ".zst": "zstd"}


def find_tarball(config: str = "linux-source") -> str | None:
    hits = sorted(glob.glob(CONFIGS[config]["glob"]))
    return hits[-1] if hits else None


def variants(config: str, scale: float) -> list[tuple[str, dict]]:
    tarball = find_tarball(config)
    return [(Path(tarball).name.split(".tar")[0] if tarball else "missing-tarball",
             {"config": config, "scale": 1, "tarball": tarball,
              "package": CONFIGS[config]["package"]})]


def invocation(p: dict, target: Path, rundir: Path, cache: Path) -> Invocation:
    d = target_subdir(target, "untar")
    tarball = Path(p["tarball"] or "/missing/linux-source.tar.xz")
    plain = cache / (tarball.name.split(".tar")[0] + ".tar")
    tool = _DECOMP.get(tarball.suffix, "cat")
    pre = [["mkdir", "-p", str(cache), str(d)],
           ["sh", "-c", f"test -s {plain} || ({tool} -dc {tarball} > {plain}.part && "
                        f"mv {plain}.part {plain})"]]
    tools = [TOOL] + ([tool] if tool != "cat" else [])
    return Invocation(argv=["tar", "-xf", str(plain), "-C", str(d)], pre=pre, tools=tools)
