import os, sys, time
root = sys.argv[1]; n = int(sys.argv[2])
for d in ("tmp", "new", "cur"):
    os.makedirs(os.path.join(root, d), exist_ok=True)
msg = b"m" * 4096
newfd = os.open(os.path.join(root, "new"), os.O_RDONLY | os.O_DIRECTORY)
base = int(time.time() * 1000) % 1000000
t = time.time()
for i in range(n):
    name = f"{base}.{i}"
    src = os.path.join(root, "tmp", name)
    fd = os.open(src, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, msg); os.fsync(fd); os.close(fd)
    os.rename(src, os.path.join(root, "new", name))
    os.fsync(newfd)
s = time.time() - t
print(f"{n} deliveries in {s:.3f} s: {n/s:.0f}/s")
