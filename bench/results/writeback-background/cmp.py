#!/usr/bin/env python3
"""A/B table: primary metric per (workload, variant, fs, device), arms off/on over reps."""
import csv, glob, os, subprocess, sys, statistics as S
root = sys.argv[1]
extra = sys.argv[2].split(",") if len(sys.argv) > 2 else []
rows = {}
for d in sorted(glob.glob(f"{root}/*-r*")):
    arm = os.path.basename(d).split("-r")[0]
    csvs = [c for c in glob.glob(f"{d}/*.csv")]
    if not csvs:
        subprocess.run(["/var/tmp/bench36/bench/run", "parse", d], capture_output=True)
        csvs = glob.glob(f"{d}/*.csv")
    for c in csvs:
        for r in csv.DictReader(open(c)):
            if r["status"] != "ok":
                continue
            if r["primary"] == "1" or r["metric"] in extra:
                k = (r["workload"], r["variant"], r["fs"], r["device"], r["metric"], r["unit"], r["higher_is_better"])
                rows.setdefault(k, {}).setdefault(arm, []).append(float(r["value"]))
for k, v in sorted(rows.items()):
    off, on = v.get("off", []), v.get("on", [])
    mo = S.mean(off) if off else float("nan"); mn = S.mean(on) if on else float("nan")
    ratio = mn / mo if off and on and mo else float("nan")
    print(f"{k[0]:10} {k[1]:18} {k[2]:38} {k[3]:8} {k[4]:24} off {' '.join(f'{x:.4g}' for x in off):24} on {' '.join(f'{x:.4g}' for x in on):24} on/off {ratio:.3f} ({k[5]}, hib={k[6]})")
