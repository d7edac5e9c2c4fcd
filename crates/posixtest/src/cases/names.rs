//! The namespace: rename in all its forms, hard and symbolic links, mkdir/rmdir, mknod.

use crate::ctx::Ctx;

pub fn rename_file_over_file(c: &mut Ctx) {
    c.put("a", b"from a");
    c.put("b", b"from b");
    c.link("b", "b2");
    c.rename("a", "b", "0");
    c.stat("a");
    c.content("b");
    c.stat("b");
    c.stat("b2");
    // Renaming one hard link onto another of the same file is a no-op: both names stay.
    c.link("b", "b3");
    c.rename("b", "b3", "0");
    c.stat("b");
    c.stat("b3");
    c.rename("b", "b", "0");
    c.rename("absent", "x", "0");
    c.readdir("");
}

pub fn rename_type_mismatch(c: &mut Ctx) {
    c.put("f", b"file");
    c.mkdir("d", 0o755);
    c.mkdir("empty", 0o755);
    c.rename("f", "d", "0");
    c.rename("d", "f", "0");
    c.rename("f", "empty/", "0");
    c.rename("f", "g/", "0");
    c.readdir("");
}

pub fn rename_dir_over_dir(c: &mut Ctx) {
    c.mkdir("a", 0o755);
    c.put("a/inside", b"x");
    c.mkdir("full", 0o755);
    c.put("full/x", b"y");
    c.mkdir("empty", 0o700);
    c.rename("a", "full", "0");
    c.rename("a", "empty", "0");
    c.stat("empty");
    c.content("empty/inside");
    c.stat("a");
    c.stat("");
}

pub fn rename_into_own_subdir(c: &mut Ctx) {
    c.mkdir("a", 0o755);
    c.mkdir("a/b", 0o755);
    c.rename("a", "a/b/c", "0");
    c.rename("a", "a/c", "0");
    c.rename("a/b", "a/b/c", "0");
    c.rename("a/..", "z", "0");
    c.rename("a/.", "z", "0");
    c.rename("a/b", "a/b", "0");
    c.stat("a/b");
}

pub fn rename_moves_dir_updates_nlink(c: &mut Ctx) {
    c.mkdir("p", 0o755);
    c.mkdir("q", 0o755);
    c.mkdir("p/sub", 0o755);
    c.put("p/sub/f", b"moved");
    c.stat("p");
    c.stat("q");
    c.rename("p/sub", "q/sub", "0");
    c.stat("p");
    c.stat("q");
    c.stat("q/sub/..");
    c.content("q/sub/f");
    c.readdir("p");
    c.readdir("q");
}

pub fn rename_noreplace(c: &mut Ctx) {
    c.put("a", b"a");
    c.put("b", b"b");
    c.mkdir("d", 0o755);
    c.rename("a", "b", "RENAME_NOREPLACE");
    c.rename("a", "d", "RENAME_NOREPLACE");
    c.rename("a", "c", "RENAME_NOREPLACE");
    c.content("b");
    c.content("c");
    c.stat("a");
    c.rename("c", "x", "RENAME_NOREPLACE|RENAME_EXCHANGE");
}

pub fn rename_exchange(c: &mut Ctx) {
    c.put("f", b"file");
    c.mkdir("d", 0o700);
    c.put("d/inner", b"inner");
    c.rename("f", "d", "RENAME_EXCHANGE");
    c.lstat("f");
    c.lstat("d");
    c.content("d");
    c.content("f/inner");
    c.rename("f", "absent", "RENAME_EXCHANGE");
    c.symlink("target", "l");
    c.rename("l", "d", "RENAME_EXCHANGE");
    c.readlink("d");
    c.content("l");
    c.rename("f", "f/inner", "RENAME_EXCHANGE");
}

pub fn rename_times(c: &mut Ctx) {
    c.mkdir("src", 0o755);
    c.mkdir("dst", 0o755);
    c.put("src/f", b"x");
    let (f0, s0, d0) = (c.times("src/f"), c.times("src"), c.times("dst"));
    crate::cases::files::nap();
    c.rename("src/f", "dst/f", "0");
    let (f1, s1, d1) = (c.times("dst/f"), c.times("src"), c.times("dst"));
    if let (Some(f0), Some(s0), Some(d0), Some(f1), Some(s1), Some(d1)) = (f0, s0, d0, f1, s1, d1) {
        c.check("source dir mtime changed", s1.mtime != s0.mtime);
        c.check("target dir mtime changed", d1.mtime != d0.mtime);
        c.check("file mtime unchanged", f1.mtime == f0.mtime);
        c.check("file ctime changed", f1.ctime != f0.ctime);
    }
}

pub fn hard_links(c: &mut Ctx) {
    c.put("f", b"shared");
    c.link("f", "g");
    c.stat("f");
    c.link("f", "g");
    c.mkdir("d", 0o755);
    c.link("d", "d2");
    c.link("absent", "x");
    c.link("f", "d/h");
    c.stat("d/h");
    c.unlink("f");
    c.stat("g");
    c.content("d/h");
    if let Some(fd) = c.open("g", "O_WRONLY|O_APPEND", 0) {
        c.write(&fd, b" by all");
    }
    c.content("d/h");
    c.symlink("g", "sl");
    // link() does not follow a symlink on Linux: the new name is a second link to the symlink.
    c.link("sl", "sl2");
    c.lstat("sl2");
    c.stat("sl");
}

pub fn symlinks(c: &mut Ctx) {
    c.symlink("target", "l");
    c.readlink("l");
    c.lstat("l");
    c.stat("l");
    c.put("target", b"now here");
    c.stat("l");
    c.content("l");
    c.symlink("x", "l");
    c.readlink("target");
    c.readlink("absent");
    c.symlink("", "empty");
    let long = "t".repeat(1000);
    c.symlink(&long, "long");
    c.readlink("long");
    c.lstat("long");
    c.symlink("/nonexistent/abs", "abs");
    c.readlink("abs");
    c.mkdir("d", 0o755);
    c.symlink("../target", "d/up");
    c.content("d/up");
    c.symlink("d", "ld");
    c.content("ld/up");
    c.unlink("ld");
    c.stat("d");
    c.rmdir("ld");
}

pub fn mkdir_rmdir(c: &mut Ctx) {
    c.mkdir("d", 0o755);
    c.stat("d");
    c.mkdir("d", 0o755);
    c.mkdir("d/sub", 0o711);
    c.stat("d");
    c.stat("d/sub");
    c.put("d/f", b"x");
    c.rmdir("d");
    c.rmdir("d/f");
    c.unlink("d/sub");
    c.rmdir("d/sub/.");
    c.rmdir("d/sub/..");
    c.rmdir("d/sub");
    c.unlink("d/f");
    c.stat("d");
    c.rmdir("d");
    c.rmdir("d");
    c.mkdir("absent/x", 0o755);
    c.mkdir("m", 0o7777);
    c.stat("m");
    c.mkdir("n", 0);
    c.stat("n");
    c.readdir("");
}

pub fn mknod_special_files(c: &mut Ctx) {
    c.mknod("fifo", libc::S_IFIFO | 0o644, 0, 0);
    c.lstat("fifo");
    if let Some(fd) = c.open("fifo", "O_RDONLY|O_NONBLOCK", 0) {
        c.read(&fd, 10);
    }
    c.open("fifo", "O_WRONLY|O_NONBLOCK", 0);
    c.mknod("fifo", libc::S_IFIFO | 0o644, 0, 0);
    c.mknod("reg", libc::S_IFREG | 0o600, 0, 0);
    c.stat("reg");
    c.mknod("null", libc::S_IFCHR | 0o666, 1, 3);
    c.lstat("null");
    c.mknod("blk", libc::S_IFBLK | 0o600, 7, 200);
    c.lstat("blk");
    c.mknod("bad", 0o170_000 | 0o644, 0, 0);
    c.readdir("");
    c.unlink("fifo");
    c.unlink("null");
}
