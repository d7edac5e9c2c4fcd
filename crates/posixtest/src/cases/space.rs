//! Space management: fallocate modes, punching holes, copy_file_range.

use crate::ctx::{Ctx, fstat_raw};
use crate::sys::pattern;

pub fn fallocate_modes(c: &mut Ctx) {
    let mb = 1 << 20;
    if let Some(fd) = c.open("grow", "O_RDWR|O_CREAT", 0o644) {
        c.fallocate(&fd, "0", 0, mb);
        c.fstat(&fd);
        c.pread(&fd, 4096, mb - 4096);
        // Allocating inside the file changes neither size nor contents.
        c.pwrite(&fd, b"kept", 10);
        c.fallocate(&fd, "0", 0, 4096);
        c.pread(&fd, 4, 10);
        c.fallocate(&fd, "0", 0, 0);
        c.fallocate(&fd, "0", -1, 10);
    }
    if let Some(fd) = c.open("keep", "O_RDWR|O_CREAT", 0o644) {
        c.fallocate(&fd, "FALLOC_FL_KEEP_SIZE", 0, mb);
        c.fstat(&fd);
        c.pread(&fd, 10, 0);
        c.lseek(&fd, 0, "SEEK_END");
    }
    if let Some(fd) = c.open("keep", "O_RDONLY", 0) {
        c.fallocate(&fd, "0", 0, 4096);
    }
}

pub fn fallocate_punch_hole(c: &mut Ctx) {
    let Some(fd) = c.open("f", "O_RDWR|O_CREAT", 0o644) else { return };
    c.write(&fd, &pattern(65536, 9));
    c.fsync(&fd);
    c.fallocate(&fd, "FALLOC_FL_PUNCH_HOLE|FALLOC_FL_KEEP_SIZE", 4096, 8192);
    c.fstat(&fd);
    c.pread(&fd, 8192, 4096);
    c.pread(&fd, 4096, 0);
    c.pread(&fd, 4096, 12288);
    c.lseek(&fd, 0, "SEEK_HOLE");
    c.lseek(&fd, 4096, "SEEK_DATA");
    // A partial block is zeroed, not deallocated.
    c.fallocate(&fd, "FALLOC_FL_PUNCH_HOLE|FALLOC_FL_KEEP_SIZE", 20000, 100);
    c.pread(&fd, 200, 19950);
    // PUNCH_HOLE without KEEP_SIZE is invalid.
    c.fallocate(&fd, "FALLOC_FL_PUNCH_HOLE", 0, 4096);
    // Punching past the end does not grow the file.
    c.fallocate(&fd, "FALLOC_FL_PUNCH_HOLE|FALLOC_FL_KEEP_SIZE", 60000, 100_000);
    c.fstat(&fd);
    c.fallocate(&fd, "FALLOC_FL_ZERO_RANGE", 30000, 10000);
    c.pread(&fd, 10100, 29950);
    if let Ok(st) = fstat_raw(fd.0) {
        c.check("blocks < 128 after punching", st.st_blocks < 128);
    }
}

pub fn copy_file_range_basic(c: &mut Ctx) {
    c.put("src", &pattern(10000, 10));
    let (Some(src), Some(dst)) =
        (c.open("src", "O_RDONLY", 0), c.open("dst", "O_RDWR|O_CREAT", 0o644))
    else {
        return;
    };
    c.copy_file_range(&src, 100, &dst, 0, 5000);
    c.fstat(&dst);
    c.pread(&dst, 6000, 0);
    // Past the source's end: fewer bytes, then none.
    c.copy_file_range(&src, 9000, &dst, 8000, 5000);
    c.copy_file_range(&src, 20000, &dst, 0, 100);
    c.fstat(&dst);
    c.content("dst");
    // Onto itself with overlapping ranges is EINVAL.
    if let Some(rw) = c.open("src", "O_RDWR", 0) {
        c.copy_file_range(&rw, 0, &rw, 100, 1000);
        c.copy_file_range(&rw, 0, &rw, 5000, 1000);
    }
    c.content("src");
    // The destination must be open for writing.
    c.copy_file_range(&dst, 0, &src, 0, 10);
}
