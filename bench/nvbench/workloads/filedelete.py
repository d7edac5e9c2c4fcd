"""file_delete (VMA journaling paper, from Filebench): 40k files in 100 directories, sizes from
a gamma distribution with a 16 KB median, then 16 parallel deleters; only deletion is timed.

Creation is an untimed pre-step (a generated Python script, deterministic seed); deletion is
`find | xargs -P 16 rm` (coreutils). `scale` multiplies the file count (directories stay 100).
"""

from __future__ import annotations

from pathlib import Path

from . import Invocation, scaled, target_subdir

TOOL = "xargs"
PRIMARY = ("wall_seconds", "s", False)
CONFIGS = {"vma": {"files": 40_000, "dirs": 100, "median": 16 * 1024, "threads": 16,
                   "gamma_shape": 1.5}}

CREATE = '''import os, random, sys
root, files, dirs, median, shape, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), \\
    int(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6])
rng = random.Random(seed)
scale = median / (shape - 1/3 + 0.02 / shape)   # gamma median ~ k*theta*(1 - 1/(9k))^3 approx
buf = os.urandom(1 << 20)
for d in range(dirs):
    os.makedirs(os.path.join(root, f"d{d:03d}"), exist_ok=True)
for i in range(files):
    size = min(len(buf), max(1, int(rng.gammavariate(shape, scale))))
    with open(os.path.join(root, f"d{i % dirs:03d}", f"f{i:06d}"), "wb") as f:
        f.write(buf[:size])
os.sync()
'''


def variants(config: str, scale: float) -> list[tuple[str, dict]]:
    c = CONFIGS[config]
    p = {"config": config, "scale": scale, "paper_files": c["files"],
         "files": scaled(c["files"], scale), "dirs": c["dirs"], "median": c["median"],
         "threads": c["threads"], "gamma_shape": c["gamma_shape"], "seed": 42}
    return [(f"files={p['files']}", p)]


def invocation(p: dict, target: Path, rundir: Path) -> Invocation:
    d = target_subdir(target, "filedelete")
    create = ["python3", str(rundir / "create_files.py"), str(d), str(p["files"]), str(p["dirs"]),
              str(p["median"]), str(p["gamma_shape"]), str(p["seed"])]
    argv = ["sh", "-c", f"find {d} -type f -print0 | xargs -0 -P {p['threads']} -n 256 rm -f"]
    return Invocation(argv=argv, files={"create_files.py": CREATE}, pre=[create],
                      tools=["python3", "find", TOOL])
