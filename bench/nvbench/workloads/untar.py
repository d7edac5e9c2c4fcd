"""Untar of a real source tarball from a Debian package (default: linux-source-*, the papers
untar Linux 2.6.11/2.6.12 trees; install with `bench/install.sh --with-linux-source`).

The compressed tarball is decompressed once, untimed and outside the measured file system, into
the work cache, so the timed `tar -xvf` measures the file system, not the decompressor (`-v`
lists every member on stdout: parse counts them as the operations of the run).
Not scaled: the whole tree (or the configuration's subtrees) is extracted (scale recorded as 1).

  linux-source  the whole tree (Linux 6.1: ~82k files, 1.3 GB).
  linux-fs-net  its fs/ and net/ only (Linux 6.1: 3,965 files, 71 MB in ~250 directories;
                the VMA paper's Linux 2.6.11 tree had 17,090 files, 231 MB): the durability
                experiment, which must fit in half an hour on both devices. The subset is a
                plain tar made once, untimed, in the work cache.
  linux-kernel  its kernel/ only (562 files, 11 MB): the quick variant.
"""

from __future__ import annotations

import glob
from pathlib import Path

from . import Invocation, target_subdir

TOOL = "tar"
PRIMARY = ("wall_seconds", "s", False)
_SOURCE = {"glob": "/usr/src/linux-source-*.tar.*", "package": "linux-source"}
CONFIGS = {"linux-source": {**_SOURCE, "members": []},
           "linux-fs-net": {**_SOURCE, "members": ["fs", "net"]},
           "linux-kernel": {**_SOURCE, "members": ["kernel"]}}
_DECOMP = {".xz": "xz", ".bz2": "bzip2", ".gz": "gzip", ".zst": "zstd"}


def find_tarball(config: str = "linux-source") -> str | None:
    hits = sorted(glob.glob(CONFIGS[config]["glob"]))
    return hits[-1] if hits else None


def variants(config: str, scale: float) -> list[tuple[str, dict]]:
    tarball = find_tarball(config)
    members = CONFIGS[config]["members"]
    name = Path(tarball).name.split(".tar")[0] if tarball else "missing-tarball"
    return [(name + "".join(f"-{m}" for m in members),
             {"config": config, "scale": 1, "tarball": tarball, "members": members,
              "package": CONFIGS[config]["package"]})]


def invocation(p: dict, target: Path, rundir: Path, cache: Path) -> Invocation:
    d = target_subdir(target, "untar")
    tarball = Path(p["tarball"] or "/missing/linux-source.tar.xz")
    stem = tarball.name.split(".tar")[0]          # also the tree's top directory
    plain = cache / (stem + ".tar")
    tool = _DECOMP.get(tarball.suffix, "cat")
    pre = [["mkdir", "-p", str(cache), str(d)],
           ["sh", "-c", f"test -s {plain} || ({tool} -dc {tarball} > {plain}.part && "
                        f"mv {plain}.part {plain})"]]
    members = p.get("members") or []
    if members:
        sub = cache / (stem + "".join(f"-{m}" for m in members) + ".tar")
        tmp = cache / f"{sub.name}.d"
        paths = " ".join(f"{stem}/{m}" for m in members)
        pre.append(["sh", "-c", f"test -s {sub} || (rm -rf {tmp} && mkdir -p {tmp} && "
                                f"tar -xf {plain} -C {tmp} {paths} && tar -cf {sub}.part -C "
                                f"{tmp} {stem} && mv {sub}.part {sub} && rm -rf {tmp})"])
        plain = sub
    tools = [TOOL] + ([tool] if tool != "cat" else [])
    return Invocation(argv=["tar", "-xvf", str(plain), "-C", str(d)], pre=pre, tools=tools)
