import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("PRAGMA journal_mode=DELETE"); db.execute("PRAGMA synchronous=FULL")
db.execute("CREATE TABLE IF NOT EXISTS t (k INTEGER PRIMARY KEY, v BLOB)")
n = int(sys.argv[2]); t = time.time()
for i in range(n):
    db.execute("BEGIN"); db.execute("INSERT INTO t (v) VALUES (?)", (b"x" * 100,)); db.execute("COMMIT")
s = time.time() - t
print(f"{n} tx in {s:.3f} s: {n/s:.0f} tx/s")
