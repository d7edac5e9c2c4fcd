#!/usr/bin/env python3
"""Applications that wait for durability: the transaction loops of the showcase.

This file is the timed command of the workloads `sqlite`, `maildir` and `applog`
(nvbench/workloads/{sqlite,maildir,applog}.py build its argv). It uses only the standard
library and runs as a script (`python3 durable.py KIND ...`), so it needs neither the harness
nor its venv on the machine under test.

One *transaction* is what the application waits for before it tells its client "done":

  sqlite   BEGIN; INSERT one row (id, 100-byte payload); COMMIT, with PRAGMA synchronous=FULL
           and journal_mode WAL (the commit appends to the -wal file and fsyncs it) or DELETE
           (a rollback journal is created, written and fsynced, its directory fsynced, the
           database written and fsynced, the journal deleted: the commit point, which FULL
           does not sync - `--synchronous extra` fsyncs the directory after it too, sqlite's
           setting for a commit that must survive a power loss right after it). Python's
           sqlite3 module with isolation_level=None: the transaction is exactly the three
           statements.
  maildir  a mail delivery: create tmp/N, write the message, fsync it, rename tmp/N to new/N,
           fsync the directory new/ (the rename is durable only then).
  applog   an application log: append one 512-byte record (O_APPEND) and fdatasync.
  files    fs_mark -S 1 style: create files/N, write 4 KiB, fsync, close (one directory, the
           files stay; fs_mark's "fsync before close").
  editor   an editor saving a document: write the whole new version to doc.txt.tmp, fsync it,
           rename it over doc.txt, and (`--dir-fsync`) fsync the directory. Each version is
           one 4 KiB block that names its id and ends with a checksum.

A transaction is *acknowledged* when its last call returned (COMMIT, fsync of new/,
fdatasync). With `--acks FILE` the id of every acknowledged transaction is appended to FILE
(write + fsync on a descriptor opened O_APPEND) right after the acknowledgement, before the
next transaction starts: FILE lives outside the file system under test (the power-cut check
keeps it in /dev/shm, which an emulated power cut of the modeled disk does not touch), so it
names every commit the application was told about and may claim after a crash.

The loop runs until `--seconds` have passed or `--count` transactions are acknowledged,
whichever comes first, then prints one JSON object on stdout:

  {"kind", "transactions", "seconds" (the loop alone, monotonic clock), "tx_per_second",
   "first_id", "last_id", "latency_us": {"mean", "p50", "p99", "max"}, "params"}

`--init` prepares untimed (sqlite: create the database and its table, set the journal mode;
maildir: the directories tmp/, new/, cur/; applog: an empty log file) and prints
{"kind", "init": true}. An OSError or sqlite3.Error in the loop prints {"kind", "error",
"transactions" (acknowledged before it)} and exits 1.

`sqlite-check --dir D --acks FILE` (after a crash and recovery): PRAGMA integrity_check, the
ids in the table against the acknowledged ids (`account`): prints {"integrity_ok",
"acknowledged", "survived", "lost", "extra", ...} and exits 0 only if the database is intact
and every acknowledged commit is there. `maildir-check` does the same for the deliveries in
new/ (every message whole: its 4 KiB as written), `editor-check` for the document: it must be
one whole version (its checksum holds) no older than the last acknowledged one and at most one
newer (the save in flight).

`sync-point --dir D` (not a workload): create D/.nvbench-sync-point and fsync it. The harness
runs it after `sync` where a benchmark ends at a durability point: on ext4 nothing is left to
do; on nvstack in journal mode the fsync is the group commit that makes every operation
before it durable (a sync(2) does not reach a FUSE daemon).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

PAYLOAD_BYTES = 100          # sqlite row payload
MESSAGE_BYTES = 4096         # maildir message
RECORD_BYTES = 512           # applog record
FILE_BYTES = 4096            # files: fs_mark -s 4096
VERSION_BYTES = 4096         # editor: one version of the document


class Acks:
    """Appends acknowledged ids to a file outside the file system under test (or nowhere)."""

    def __init__(self, path: str | None):
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if path else None

    def ack(self, tx_id: int) -> None:
        if self.fd is not None:
            os.write(self.fd, b"%d\n" % tx_id)
            os.fsync(self.fd)


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list (q in 0..100); 0.0 for an empty list."""
    if not sorted_values:
        return 0.0
    k = max(0, min(len(sorted_values) - 1, math.ceil(q / 100.0 * len(sorted_values)) - 1))
    return sorted_values[k]


def summary(kind: str, lat_ns: list[int], seconds: float, first_id: int, params: dict) -> dict:
    lat = sorted(x / 1000.0 for x in lat_ns)
    n = len(lat)
    return {"kind": kind, "transactions": n, "seconds": round(seconds, 6),
            "tx_per_second": (n / seconds) if seconds > 0 else 0.0,
            "first_id": first_id if n else None, "last_id": first_id + n - 1 if n else None,
            "latency_us": {"mean": (sum(lat) / n) if n else 0.0, "p50": percentile(lat, 50),
                           "p99": percentile(lat, 99), "max": lat[-1] if n else 0.0},
            "params": params}


def loop(kind: str, one_tx, args, params: dict) -> int:
    """Run one_tx(id) until the time or count limit; ids start after the last one present."""
    acks = Acks(args.acks)
    first = args.first_id
    lat: list[int] = []
    deadline = time.monotonic() + args.seconds if args.seconds else None
    start = time.monotonic()
    tx_id = first
    try:
        while True:
            if args.count and len(lat) >= args.count:
                break
            if deadline is not None and time.monotonic() >= deadline:
                break
            t0 = time.monotonic_ns()
            one_tx(tx_id)
            lat.append(time.monotonic_ns() - t0)
            acks.ack(tx_id)
            tx_id += 1
    except (OSError, Exception) as exc:  # noqa: BLE001 - sqlite3.Error and OSError alike
        print(json.dumps({"kind": kind, "error": f"{type(exc).__name__}: {exc}",
                          "transactions": len(lat), "last_id": tx_id - 1 if lat else None}))
        return 1
    print(json.dumps(summary(kind, lat, time.monotonic() - start, first, params)))
    return 0


# ----- sqlite --------------------------------------------------------------------------------
def sqlite_open(path: str, journal_mode: str, synchronous: str = "FULL"):
    import sqlite3
    con = sqlite3.connect(path, isolation_level=None)   # we issue BEGIN/COMMIT ourselves
    mode = con.execute(f"PRAGMA journal_mode={journal_mode}").fetchone()[0]
    if mode.lower() != journal_mode.lower():
        raise RuntimeError(f"sqlite refused journal_mode={journal_mode} (got {mode})")
    con.execute(f"PRAGMA synchronous={synchronous}")
    return con


def run_sqlite(args) -> int:
    db = os.path.join(args.dir, "bench.db")
    params = {"journal_mode": args.journal_mode, "synchronous": args.synchronous.upper(),
              "payload_bytes": PAYLOAD_BYTES, "db": db}
    con = sqlite_open(db, args.journal_mode, args.synchronous)
    if args.init:
        con.execute("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, payload BLOB NOT NULL)")
        con.close()
        print(json.dumps({"kind": "sqlite", "init": True, "params": params}))
        return 0
    payload = b"p" * PAYLOAD_BYTES
    row = con.execute("SELECT max(id) FROM t").fetchone()[0]
    args.first_id = max(args.first_id, (row or 0) + 1)

    def tx(tx_id: int) -> None:
        con.execute("BEGIN")
        con.execute("INSERT INTO t (id, payload) VALUES (?, ?)", (tx_id, payload))
        con.execute("COMMIT")

    rc = loop("sqlite", tx, args, params)
    con.close()
    return rc


# ----- maildir -------------------------------------------------------------------------------
def maildir_message() -> bytes:
    return (b"From: bench@nvstack\nSubject: delivery\n\n" + b"x" * MESSAGE_BYTES)[:MESSAGE_BYTES]


def run_maildir(args) -> int:
    tmp, new = os.path.join(args.dir, "tmp"), os.path.join(args.dir, "new")
    params = {"message_bytes": MESSAGE_BYTES, "dir": args.dir}
    if args.init:
        for d in ("tmp", "new", "cur"):
            os.makedirs(os.path.join(args.dir, d), exist_ok=True)
        print(json.dumps({"kind": "maildir", "init": True, "params": params}))
        return 0
    message = maildir_message()
    new_fd = os.open(new, os.O_RDONLY | os.O_DIRECTORY)
    existing = [int(n) for n in os.listdir(new) if n.isdigit()]
    args.first_id = max(args.first_id, max(existing, default=0) + 1)

    def tx(tx_id: int) -> None:
        name = str(tx_id)
        src = os.path.join(tmp, name)
        fd = os.open(src, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, message)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(src, os.path.join(new, name))
        os.fsync(new_fd)

    try:
        return loop("maildir", tx, args, params)
    finally:
        os.close(new_fd)


# ----- applog --------------------------------------------------------------------------------
def run_applog(args) -> int:
    path = os.path.join(args.dir, "app.log")
    params = {"record_bytes": RECORD_BYTES, "log": path}
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    if args.init:
        os.close(fd)
        print(json.dumps({"kind": "applog", "init": True, "params": params}))
        return 0
    args.first_id = max(args.first_id, os.fstat(fd).st_size // RECORD_BYTES + 1)

    def tx(tx_id: int) -> None:
        head = b"%012d " % tx_id
        os.write(fd, head + b"r" * (RECORD_BYTES - len(head) - 1) + b"\n")
        os.fdatasync(fd)

    try:
        return loop("applog", tx, args, params)
    finally:
        os.close(fd)


# ----- files (fs_mark -S 1) -----------------------------------------------------------------
def run_files(args) -> int:
    d = os.path.join(args.dir, "files")
    params = {"file_bytes": FILE_BYTES, "dir": d, "fsync": "before close"}
    if args.init:
        os.makedirs(d, exist_ok=True)
        print(json.dumps({"kind": "files", "init": True, "params": params}))
        return 0
    data = b"f" * FILE_BYTES
    existing = [int(n) for n in os.listdir(d) if n.isdigit()]
    args.first_id = max(args.first_id, max(existing, default=0) + 1)

    def tx(tx_id: int) -> None:
        fd = os.open(os.path.join(d, str(tx_id)), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)

    return loop("files", tx, args, params)


# ----- editor --------------------------------------------------------------------------------
def editor_version(tx_id: int) -> bytes:
    """Version tx_id of the document: 4 KiB naming its id, its last 16 bytes a checksum."""
    import hashlib
    head = b"version %012d\n" % tx_id
    body = head + b"e" * (VERSION_BYTES - 16 - len(head))
    return body + hashlib.sha256(body).digest()[:16]


def editor_parse(data: bytes) -> int | None:
    """The id of a whole version, or None (wrong size, torn, or not a version at all)."""
    import hashlib
    if len(data) != VERSION_BYTES or hashlib.sha256(data[:-16]).digest()[:16] != data[-16:]:
        return None
    try:
        return int(data.split(b"\n", 1)[0].split()[1])
    except (IndexError, ValueError):
        return None


def run_editor(args) -> int:
    doc, tmp = os.path.join(args.dir, "doc.txt"), os.path.join(args.dir, "doc.txt.tmp")
    params = {"version_bytes": VERSION_BYTES, "doc": doc, "dir_fsync": args.dir_fsync}
    if args.init:
        with open(doc, "wb") as f:
            f.write(editor_version(0))
            os.fsync(f.fileno())
        print(json.dumps({"kind": "editor", "init": True, "params": params}))
        return 0
    with open(doc, "rb") as f:
        args.first_id = max(args.first_id, (editor_parse(f.read()) or 0) + 1)
    dir_fd = os.open(args.dir, os.O_RDONLY | os.O_DIRECTORY)

    def tx(tx_id: int) -> None:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, editor_version(tx_id))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, doc)
        if args.dir_fsync:
            os.fsync(dir_fd)

    try:
        return loop("editor", tx, args, params)
    finally:
        os.close(dir_fd)


# ----- sync point ----------------------------------------------------------------------------
def run_sync_point(args) -> int:
    """A durability point after a benchmark: fsync a marker file on the measured FS."""
    fd = os.open(os.path.join(args.dir, ".nvbench-sync-point"), os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return 0


# ----- after a crash -------------------------------------------------------------------------
def read_acks(path: str) -> list[int]:
    """The ids in an acks file. A torn last line (the writer killed inside write(2)) is not
    an acknowledgement: the id is written whole, newline last, before the transaction counts."""
    with open(path, "rb") as f:
        data = f.read()
    lines = data.split(b"\n")
    return [int(x) for x in lines[:-1] if x.strip()]   # lines[-1]: after the last newline


def account(acked: list[int], present: list[int]) -> dict:
    """Compare the acknowledged ids with the ids found after the crash.

    lost      acknowledged but missing: a durability bug (must be 0)
    survived  acknowledged and present
    extra     present but never acknowledged: the commit(s) in flight at the cut, which may
              or may not survive (allowed), or ids that were never issued (beyond the last
              acknowledged id + 1: a bug, counted in `unexpected`)
    """
    a, p = set(acked), set(present)
    lost = sorted(a - p)
    extra = sorted(p - a)
    top = max(a, default=0)
    unexpected = [x for x in extra if x > top + 1]
    return {"acknowledged": len(a), "present": len(p), "survived": len(a & p),
            "lost": len(lost), "lost_ids": lost[:20], "extra": len(extra),
            "extra_ids": extra[:20], "unexpected": len(unexpected),
            "duplicates_in_acks": len(acked) - len(a), "max_acknowledged": top,
            "ok": not lost and not unexpected and len(acked) == len(a)}


def run_sqlite_check(args) -> int:
    """After a crash: PRAGMA integrity_check and the rows against the acks file."""
    import sqlite3
    db = os.path.join(args.dir, "bench.db")
    if not os.path.exists(db):
        print(json.dumps({"kind": "sqlite-check", "error": f"{db} does not exist"}))
        return 1
    # a rollback journal left behind (DELETE mode: its unlink, the commit point, was lost)
    # makes sqlite roll the last transaction back when it opens the database
    hot = os.path.getsize(db + "-journal") if os.path.exists(db + "-journal") else None
    try:
        con = sqlite3.connect(db, isolation_level=None)
        integrity = [r[0] for r in con.execute("PRAGMA integrity_check")]
        mode = con.execute("PRAGMA journal_mode").fetchone()[0]
        present = [r[0] for r in con.execute("SELECT id FROM t")]
        con.close()
    except sqlite3.Error as exc:
        print(json.dumps({"kind": "sqlite-check", "error": f"{type(exc).__name__}: {exc}"}))
        return 1
    return _check_result("sqlite-check", args, present, integrity_check=integrity[:10],
                         integrity_ok=integrity == ["ok"], journal_mode=mode,
                         rollback_journal_bytes_at_open=hot)


def _check_result(kind: str, args, present: list[int], **extra) -> int:
    acked = read_acks(args.acks) if args.acks else []
    res = {"kind": kind, **extra, **account(acked, present)}
    res["ok"] = res["ok"] and extra.get("integrity_ok", True)
    print(json.dumps(res))
    return 0 if res["ok"] else 1


def run_maildir_check(args) -> int:
    """After a crash: every delivery in new/ whole (the message as written), against the acks."""
    new = os.path.join(args.dir, "new")
    present, damaged = [], []
    message = maildir_message()
    for name in os.listdir(new):
        if not name.isdigit():
            continue
        with open(os.path.join(new, name), "rb") as f:
            (present if f.read() == message else damaged).append(int(name))
    return _check_result("maildir-check", args, present, integrity_ok=not damaged,
                         damaged=len(damaged), damaged_ids=sorted(damaged)[:20])


def run_editor_check(args) -> int:
    """After a crash: doc.txt is one whole version, no older than the last acknowledged save.
    Only the latest version exists, so `present` is every id up to it: an acknowledged id above
    it is lost; the save in flight may or may not be there."""
    try:
        with open(os.path.join(args.dir, "doc.txt"), "rb") as f:
            version = editor_parse(f.read())
    except OSError as exc:
        print(json.dumps({"kind": "editor-check", "error": f"{type(exc).__name__}: {exc}"}))
        return 1
    acked = read_acks(args.acks) if args.acks else []
    first = min(acked, default=1)
    present = list(range(first, version + 1)) if version is not None else []
    return _check_result("editor-check", args, present, integrity_ok=version is not None,
                         version=version)


RUNNERS = {"sqlite": run_sqlite, "maildir": run_maildir, "applog": run_applog,
           "files": run_files, "editor": run_editor, "sync-point": run_sync_point,
           "sqlite-check": run_sqlite_check, "maildir-check": run_maildir_check,
           "editor-check": run_editor_check}
CHECKS = ("sqlite-check", "maildir-check", "editor-check")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description="transaction loops of applications that wait for "
                                 "durability (one JSON line on stdout)")
    ap.add_argument("kind", choices=sorted(RUNNERS))
    ap.add_argument("--dir", required=True, help="directory on the file system under test")
    ap.add_argument("--seconds", type=float, default=0.0, help="stop after this long (0: no limit)")
    ap.add_argument("--count", type=int, default=0, help="stop after this many transactions")
    ap.add_argument("--acks", help="append the id of every acknowledged transaction here "
                    "(write + fsync), outside the file system under test")
    ap.add_argument("--journal-mode", default="wal", choices=["wal", "delete"],
                    help="sqlite journal mode (synchronous=FULL always)")
    ap.add_argument("--synchronous", default="full", choices=["full", "extra"],
                    help="sqlite PRAGMA synchronous (EXTRA also fsyncs the directory after "
                    "the rollback journal's unlink, the commit point of DELETE mode)")
    ap.add_argument("--first-id", type=int, default=1, help="first transaction id (at least "
                    "one more than the highest already present)")
    ap.add_argument("--dir-fsync", action="store_true", help="editor: fsync the directory "
                    "after the rename")
    ap.add_argument("--init", action="store_true", help="prepare the directory, untimed")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.kind not in (*CHECKS, "sync-point") and not args.init and not args.seconds \
            and not args.count:
        print("durable.py: give --seconds or --count", file=sys.stderr)
        return 2
    return RUNNERS[args.kind](args)


if __name__ == "__main__":
    sys.exit(main())
