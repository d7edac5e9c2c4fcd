#!/usr/bin/env python3
"""Per run of the nbw experiment: ops/s (write, read), fio's longest write, and nvstack's
counters: writer waits (reasons), patches, fetches, rounds, pages written. Usage: table.py DIR..."""
import json, sys
from pathlib import Path

def ops(fio):
    w = sum(j["write"]["iops"] for j in fio["jobs"])
    r = sum(j["read"]["iops"] for j in fio["jobs"])
    mx = max((j["write"]["clat_ns"]["max"] for j in fio["jobs"] if j["write"]["total_ios"]), default=0)
    return w, r, mx / 1e9

rows = []
for top in sys.argv[1:]:
    for res in sorted(Path(top).glob("runs/nbw/*/*/*/rep*/result.json")):
        d = res.parent
        r = json.loads(res.read_text())
        wl, var, fs = d.parts[-4], d.parts[-3], d.parts[-2]
        if r.get("status") != "ok":
            print(wl, var, fs, "FAILED", r.get("reason")); continue
        txt = (d / "stdout.txt").read_text()
        fio = json.loads(txt[txt.index("{"):])
        w, rd, mx = ops(fio)
        st = {}
        if (d / "nvstack_stat.json").exists():
            st = json.loads((d / "nvstack_stat.json").read_text())
        n, wb = st.get("nbw", {}), st.get("writeback", {})
        rounds = wb.get("rounds", {})
        cpu = r.get("cpu", {})
        print(f"{wl[4:]:22s} {var:12s} {fs.replace('nvstack-ext4-nbw-','nv-'):14s} {d.name} "
              f"w/s {w:9.1f} r/s {rd:7.1f} max {mx:6.2f}s wall {r['wall_seconds']:.0f} "
              f"waits {n.get('writer_waits','-')} {({k:v for k,v in n.get('writer_wait_reasons',{}).items() if v})} "
              f"patches {n.get('patches_created','-')} fetch a/r/wb {n.get('fetches_async','-')}/{n.get('fetches_on_read','-')}/{n.get('fetches_on_writeback','-')} "
              f"paused {n.get('fetches_paused','-')} rounds {({k:v for k,v in rounds.items() if v})} written {wb.get('pages_written','-')} roomw {wb.get('room_waits','-')} "
              f"cpu app {cpu.get('app_s',0):.1f} d {cpu.get('daemon_s',0):.1f}")
