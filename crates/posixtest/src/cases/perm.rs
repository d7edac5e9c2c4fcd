//! Permissions, run in a forked child that has dropped to an unprivileged identity
//! (`Ctx::as_user`): the case directory and the files the parent makes belong to root.

use crate::ctx::Ctx;

const NOBODY: u32 = 65534;
const OTHER: u32 = 1234;

pub fn perm_create_in_root_dir(c: &mut Ctx) {
    c.mkdir("d", 0o755);
    c.put("d/rootfile", b"root's");
    c.as_user(NOBODY, NOBODY, &[], |c| {
        c.open("d/new", "O_WRONLY|O_CREAT", 0o644);
        c.mkdir("d/newdir", 0o755);
        c.symlink("x", "d/newlink");
        c.mknod("d/fifo", libc::S_IFIFO | 0o644, 0, 0);
        c.unlink("d/rootfile");
        c.rename("d/rootfile", "d/moved", "0");
        c.link("d/rootfile", "d/hard");
        c.content("d/rootfile");
        c.open("d/rootfile", "O_WRONLY", 0);
        c.readdir("d");
    });
    c.readdir("d");
}

pub fn perm_created_objects_owned_by_caller(c: &mut Ctx) {
    c.mkdir("open", 0o777);
    c.chmod("open", 0o777);
    c.mkdir("sgid", 0o777);
    c.chown("sgid", 0, OTHER);
    c.chmod("sgid", 0o2777);
    c.as_user(NOBODY, NOBODY, &[], |c| {
        c.put("open/f", b"mine");
        c.mkdir("open/d", 0o755);
        c.symlink("f", "open/l");
        c.mknod("open/p", libc::S_IFIFO | 0o600, 0, 0);
        c.link("open/f", "open/f2");
        c.rename("open/f2", "open/f3", "0");
        c.put("sgid/f", b"group inherited");
        c.mkdir("sgid/d", 0o755);
        c.stat("open/f");
        // Not in group OTHER: chmod drops the set-group-ID bit it asks for.
        c.chmod("sgid/f", 0o2755);
        c.stat("sgid/f");
    });
    for n in ["open/f", "open/d", "open/l", "open/p", "open/f3", "sgid/f", "sgid/d"] {
        c.lstat(n);
    }
}

pub fn perm_sticky_directory(c: &mut Ctx) {
    c.mkdir("tmp", 0o777);
    c.chmod("tmp", 0o1777);
    c.put("tmp/rootfile", b"root's");
    c.chmod("tmp/rootfile", 0o666);
    c.mkdir("tmp/rootdir", 0o777);
    c.chmod("tmp/rootdir", 0o777);
    c.as_user(NOBODY, NOBODY, &[], |c| {
        c.unlink("tmp/rootfile");
        c.rename("tmp/rootfile", "tmp/mine", "0");
        c.rmdir("tmp/rootdir");
        c.put("tmp/own", b"mine");
        c.put("tmp/rootdir/inside", b"allowed: rootdir is not sticky");
        // Writing someone else's 0666 file is allowed; renaming over it is not.
        if let Some(fd) = c.open("tmp/rootfile", "O_WRONLY|O_APPEND", 0) {
            c.write(&fd, b" + nobody's");
        }
        c.rename("tmp/own", "tmp/rootfile", "0");
        c.rename("tmp/own", "tmp/own2", "0");
        c.unlink("tmp/own2");
    });
    c.as_user(OTHER, OTHER, &[], |c| {
        c.put("tmp/others", b"x");
    });
    c.as_user(NOBODY, NOBODY, &[], |c| {
        c.unlink("tmp/others");
    });
    c.readdir("tmp");
    c.content("tmp/rootfile");
    // Root may unlink anything in a sticky directory.
    c.unlink("tmp/others");
}

pub fn perm_chmod_chown_others_file(c: &mut Ctx) {
    c.put("rootfile", b"x");
    c.chmod("rootfile", 0o666);
    c.mkdir("w", 0o777);
    c.chmod("w", 0o777);
    c.as_user(NOBODY, NOBODY, &[OTHER], |c| {
        c.chmod("rootfile", 0o777);
        c.chown("rootfile", NOBODY, NOBODY);
        c.utimens("rootfile", (1, 0), (2, 0), "0");
        // UTIME_NOW only needs write permission.
        c.utimens("rootfile", (0, libc::UTIME_NOW), (0, libc::UTIME_NOW), "0");
        c.put("w/own", b"mine");
        c.chown("w/own", 0, NOBODY);
        c.chown("w/own", NOBODY, OTHER);
        c.stat("w/own");
        c.chown("w/own", u32::MAX, 5);
        c.chmod("w/own", 0o4700);
        c.stat("w/own");
        c.truncate("rootfile", 0);
    });
    c.stat("rootfile");
    c.stat("w/own");
}

pub fn perm_read_write_search(c: &mut Ctx) {
    c.put("secret", b"root only");
    c.chmod("secret", 0o600);
    c.put("public", b"everyone reads");
    c.chmod("public", 0o644);
    c.mkdir("noread", 0o711);
    c.put("noread/f", b"reachable by name");
    c.mkdir("nosearch", 0o744);
    c.put("nosearch/f", b"unreachable");
    c.put("group", b"group rw");
    c.chown("group", 0, OTHER);
    c.chmod("group", 0o660);
    c.as_user(NOBODY, NOBODY, &[OTHER], |c| {
        c.open("secret", "O_RDONLY", 0);
        c.content("public");
        c.open("public", "O_WRONLY", 0);
        c.open("public", "O_RDONLY|O_TRUNC", 0);
        c.truncate("public", 0);
        c.readdir("noread");
        c.content("noread/f");
        c.readdir("nosearch");
        c.stat("nosearch/f");
        c.access("public", "R_OK", "0");
        c.access("public", "W_OK", "0");
        // Supplementary group membership grants the group bits.
        if let Some(fd) = c.open("group", "O_RDWR", 0) {
            c.pwrite(&fd, b"GROUP", 0);
        }
        c.content("group");
    });
    c.as_user(NOBODY, NOBODY, &[], |c| {
        c.open("group", "O_RDONLY", 0);
    });
}

pub fn perm_xattrs_of_others_file(c: &mut Ctx) {
    c.put("f", b"x");
    c.chmod("f", 0o644);
    c.setxattr("f", "user.root", b"set by root", "0", true);
    c.put("w", b"x");
    c.chmod("w", 0o666);
    c.as_user(NOBODY, NOBODY, &[], |c| {
        c.getxattr("f", "user.root", 100);
        c.listxattr("f");
        c.setxattr("f", "user.nobody", b"1", "0", true);
        c.removexattr("f", "user.root");
        c.setxattr("w", "user.nobody", b"allowed: w is writable", "0", true);
        c.setxattr("w", "trusted.t", b"1", "0", true);
        c.getxattr("w", "user.nobody", 100);
    });
    c.listxattr("w");
}

pub fn perm_setuid_cleared_on_write(c: &mut Ctx) {
    c.mkdir("w", 0o777);
    c.chmod("w", 0o777);
    c.as_user(NOBODY, NOBODY, &[], |c| {
        c.put("w/prog", b"#!/bin/sh\n");
        c.chmod("w/prog", 0o6777);
        c.stat("w/prog");
    });
    c.as_user(OTHER, OTHER, &[], |c| {
        // A write by another user clears set-user-ID (and set-group-ID with group execute).
        if let Some(fd) = c.open("w/prog", "O_WRONLY|O_APPEND", 0) {
            c.write(&fd, b"echo\n");
        }
    });
    c.stat("w/prog");
    c.as_user(NOBODY, NOBODY, &[], |c| {
        c.chmod("w/prog", 0o6777);
        c.truncate("w/prog", 3);
        c.stat("w/prog");
    });
}
