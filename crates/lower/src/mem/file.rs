//! Regular-file data and the operations on it: read, write, truncate, holes and unwritten
//! blocks (fallocate), SEEK_DATA/SEEK_HOLE, FIEMAP, copy_file_range, and open (rule 11).

use std::sync::{Arc, Mutex, PoisonError};

use super::alloc::Allocator;
use super::inode::{Block, Content, FileData, State};
use super::{
    BLOCK_SIZE, COPY_CHUNK, FIEMAP_EXTENT_LAST, FIEMAP_EXTENT_UNWRITTEN, MAX_FILE_SIZE, MemFile,
    MemLower, MemNode, err, hold,
};
use crate::Result;
use crate::types::{Errno, Extent, FileKind};

fn block_len() -> usize {
    BLOCK_SIZE as usize
}

impl FileData {
    /// The block after the previous logical block's, for contiguous extents (rule 9).
    fn goal(&self, index: u64) -> Option<u64> {
        index.checked_sub(1).and_then(|prev| self.blocks.get(&prev)).map(|b| b.phys + 1)
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> usize {
        if offset >= self.size {
            return 0;
        }
        let n = buf.len().min(usize::try_from(self.size - offset).unwrap_or(usize::MAX));
        let mut done = 0;
        while done < n {
            let pos = offset + done as u64;
            let within = (pos % BLOCK_SIZE) as usize;
            let len = (block_len() - within).min(n - done);
            let out = &mut buf[done..done + len];
            match self.blocks.get(&(pos / BLOCK_SIZE)).and_then(|b| b.data.as_ref()) {
                Some(data) => out.copy_from_slice(&data[within..within + len]),
                None => out.fill(0),
            }
            done += len;
        }
        n
    }

    /// Writes as much of `data` as there are blocks for; returns the bytes written.
    fn write(&mut self, alloc: &mut Allocator, offset: u64, data: &[u8]) -> usize {
        let mut done = 0;
        while done < data.len() {
            let pos = offset + done as u64;
            let index = pos / BLOCK_SIZE;
            let within = (pos % BLOCK_SIZE) as usize;
            let len = (block_len() - within).min(data.len() - done);
            if !self.blocks.contains_key(&index) {
                let Some(phys) = alloc.alloc(self.goal(index)) else { break };
                self.blocks.insert(index, Block { phys, data: None });
            }
            let block = self.blocks.get_mut(&index).expect("present");
            let bytes =
                Arc::make_mut(block.data.get_or_insert_with(|| Arc::new(vec![0; block_len()])));
            bytes[within..within + len].copy_from_slice(&data[done..done + len]);
            done += len;
        }
        self.size = self.size.max(offset + done as u64);
        done
    }

    /// Zeroes `[from, to)` inside block `index` if it holds data.
    fn zero_within(&mut self, index: u64, from: usize, to: usize) {
        if let Some(Block { data: Some(data), .. }) = self.blocks.get_mut(&index) {
            Arc::make_mut(data)[from..to].fill(0);
        }
    }

    /// ftruncate: shrinking (or keeping the size) frees every block past the new size,
    /// preallocated ones included, and zeroes the tail of the last block (rule 11).
    fn truncate(&mut self, alloc: &mut Allocator, size: u64) {
        if size <= self.size {
            for (_, b) in self.blocks.split_off(&size.div_ceil(BLOCK_SIZE)) {
                alloc.release(b.phys);
            }
            if size % BLOCK_SIZE != 0 {
                self.zero_within(size / BLOCK_SIZE, (size % BLOCK_SIZE) as usize, block_len());
            }
        }
        self.size = size;
    }

    /// Allocates unwritten blocks over `[offset, end)` where there are holes; all or nothing.
    fn preallocate(&mut self, alloc: &mut Allocator, offset: u64, end: u64) -> Result<()> {
        let (first, last) = (offset / BLOCK_SIZE, (end - 1) / BLOCK_SIZE);
        let missing = (first..=last).filter(|i| !self.blocks.contains_key(i)).count() as u64;
        if missing > alloc.free_count {
            return err(libc::ENOSPC);
        }
        for index in first..=last {
            if !self.blocks.contains_key(&index) {
                let phys = alloc.alloc(self.goal(index)).expect("counted free blocks");
                self.blocks.insert(index, Block { phys, data: None });
            }
        }
        Ok(())
    }

    /// PUNCH_HOLE|KEEP_SIZE, as ext4 bounds it: nothing at or past the size, and the range ends
    /// at the end of the block holding the size (preallocated blocks past it stay).
    fn punch(&mut self, alloc: &mut Allocator, offset: u64, end: u64) {
        if offset >= self.size {
            return;
        }
        let end = end.min(self.size.div_ceil(BLOCK_SIZE) * BLOCK_SIZE);
        let (full_first, full_end) = (offset.div_ceil(BLOCK_SIZE), end / BLOCK_SIZE);
        if full_first < full_end {
            let mut tail = self.blocks.split_off(&full_first);
            let mut keep = tail.split_off(&full_end);
            for b in tail.values() {
                alloc.release(b.phys);
            }
            self.blocks.append(&mut keep);
        }
        let (first, last) = (offset / BLOCK_SIZE, (end - 1) / BLOCK_SIZE);
        let from = (offset % BLOCK_SIZE) as usize;
        let to = if last == first { ((end - 1) % BLOCK_SIZE) as usize + 1 } else { block_len() };
        if from != 0 || to != block_len() {
            self.zero_within(first, from, to);
        }
        if last != first && end % BLOCK_SIZE != 0 {
            self.zero_within(last, 0, (end % BLOCK_SIZE) as usize);
        }
    }

    /// SEEK_DATA / SEEK_HOLE: only written blocks are data (ext4 reports unwritten extents
    /// without cached pages as holes).
    fn seek(&self, offset: u64, data: bool) -> Result<u64> {
        if offset >= self.size {
            return err(libc::ENXIO);
        }
        let written = |i: &u64| self.blocks.get(i).is_some_and(|b| b.data.is_some());
        let mut index = offset / BLOCK_SIZE;
        if data {
            let next = self.blocks.range(index..).find(|(_, b)| b.data.is_some()).map(|(&i, _)| i);
            return match next {
                Some(i) if (i * BLOCK_SIZE).max(offset) < self.size => {
                    Ok((i * BLOCK_SIZE).max(offset))
                }
                _ => err(libc::ENXIO),
            };
        }
        while written(&index) && index * BLOCK_SIZE < self.size {
            index += 1;
        }
        Ok((index * BLOCK_SIZE).max(offset).min(self.size))
    }

    fn extents(&self) -> Vec<Extent> {
        let mut out: Vec<Extent> = Vec::new();
        let mut prev: Option<(u64, u64)> = None;
        for (&index, b) in &self.blocks {
            let flags = if b.data.is_none() { FIEMAP_EXTENT_UNWRITTEN } else { 0 };
            match out.last_mut() {
                Some(e) if prev == Some((index - 1, b.phys - 1)) && e.flags == flags => {
                    e.length += BLOCK_SIZE;
                }
                _ => out.push(Extent {
                    logical: index * BLOCK_SIZE,
                    physical: b.phys * BLOCK_SIZE,
                    length: BLOCK_SIZE,
                    flags,
                }),
            }
            prev = Some((index, b.phys));
        }
        if let Some(last) = out.last_mut() {
            last.flags |= FIEMAP_EXTENT_LAST;
        }
        out
    }

    /// Restores rule 11 on a crash image: written blocks past the size go, the tail is zeroed.
    pub(super) fn normalize(&mut self) {
        let end = self.size.div_ceil(BLOCK_SIZE);
        self.blocks.retain(|&i, b| i < end || b.data.is_none());
        if self.size % BLOCK_SIZE != 0 {
            self.zero_within(
                self.size / BLOCK_SIZE,
                (self.size % BLOCK_SIZE) as usize,
                block_len(),
            );
        }
    }
}

impl MemLower {
    pub(super) fn open_locked(&self, st: &mut State, ino: u64, flags: i32) -> Result<MemFile> {
        let writable = matches!(flags & libc::O_ACCMODE, libc::O_WRONLY | libc::O_RDWR);
        match st.get(ino).kind() {
            FileKind::Directory if writable => return err(libc::EISDIR),
            FileKind::Directory => {}
            _ if flags & libc::O_DIRECTORY != 0 => return err(libc::ENOTDIR),
            FileKind::Symlink => return err(libc::ELOOP),
            FileKind::Regular if flags & libc::O_TRUNC != 0 && writable => {
                let now = self.fs.now();
                let State { live, alloc, .. } = st;
                let inode = live.get_mut(&ino).expect("held");
                inode.file_mut().truncate(alloc, 0);
                inode.touch(now);
            }
            _ => {}
        }
        let flags = flags & (libc::O_ACCMODE | libc::O_APPEND | libc::O_DIRECT);
        Ok(MemFile { node: hold(&self.fs, st, ino), flags, dir: false, pos: Mutex::new(0) })
    }

    /// Regular-file data of an open file, checked as read(2)/write(2) would.
    fn io_target(st: &State, file: &MemFile, write: bool) -> Result<()> {
        if file.dir {
            return err(if write { libc::EBADF } else { libc::EISDIR });
        }
        if (write && !file.writable()) || (!write && !file.readable()) {
            return err(libc::EBADF);
        }
        match st.get(file.node.ino).kind() {
            FileKind::Regular => Ok(()),
            FileKind::Directory => err(libc::EISDIR),
            _ => err(libc::EINVAL),
        }
    }

    fn truncate_locked(&self, st: &mut State, ino: u64, size: u64) -> Result<()> {
        if size > MAX_FILE_SIZE {
            return err(libc::EFBIG);
        }
        let now = self.fs.now();
        let State { live, alloc, .. } = st;
        let inode = live.get_mut(&ino).expect("held");
        inode.file_mut().truncate(alloc, size);
        inode.touch(now);
        Ok(())
    }

    pub(super) fn setattr_size(
        &self,
        st: &mut State,
        ino: u64,
        file: Option<&MemFile>,
        size: u64,
    ) -> Result<()> {
        i64::try_from(size).map_err(|_| Errno(libc::EFBIG))?;
        match file {
            // ftruncate: the file must be a regular file open for writing.
            Some(f) if f.dir || !f.writable() || st.get(ino).kind() != FileKind::Regular => {
                err(libc::EINVAL)
            }
            // truncate without a file reopens the node for writing.
            None => match st.get(ino).kind() {
                FileKind::Regular => self.truncate_locked(st, ino, size),
                FileKind::Directory => err(libc::EISDIR),
                FileKind::Symlink => err(libc::ELOOP),
                _ => err(libc::EINVAL),
            },
            Some(_) => self.truncate_locked(st, ino, size),
        }
    }

    pub(super) fn do_open_direct(&self, node: &MemNode, writable: bool) -> Result<Option<MemFile>> {
        let mut st = self.fs.lock();
        match st.get(node.ino).kind() {
            FileKind::Regular => {
                let access = if writable { libc::O_RDWR } else { libc::O_RDONLY };
                self.open_locked(&mut st, node.ino, access | libc::O_DIRECT).map(Some)
            }
            FileKind::Directory if writable => err(libc::EISDIR),
            FileKind::Symlink => err(libc::ELOOP),
            _ => Ok(None),
        }
    }

    pub(super) fn do_read(&self, file: &MemFile, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let mut st = self.fs.lock();
        Self::io_target(&st, file, false)?;
        file.check_direct(offset, buf.as_ptr(), buf.len())?;
        i64::try_from(offset).map_err(|_| Errno(libc::EINVAL))?;
        let now = self.fs.now();
        let inode = st.get_mut(file.node.ino);
        let n = inode.file().read(offset, buf);
        inode.accessed(now);
        Ok(n)
    }

    pub(super) fn do_write(&self, file: &MemFile, offset: u64, data: &[u8]) -> Result<usize> {
        let mut st = self.fs.lock();
        Self::io_target(&st, file, true)?;
        file.check_direct(offset, data.as_ptr(), data.len())?;
        i64::try_from(offset).map_err(|_| Errno(libc::EINVAL))?;
        if data.is_empty() {
            return Ok(0);
        }
        let State { live, alloc, .. } = &mut *st;
        let inode = live.get_mut(&file.node.ino).expect("held");
        // pwrite on an O_APPEND file appends (Linux ignores the offset).
        let offset = if file.flags & libc::O_APPEND != 0 { inode.file().size } else { offset };
        if offset >= MAX_FILE_SIZE {
            return err(libc::EFBIG);
        }
        let len = data.len().min(usize::try_from(MAX_FILE_SIZE - offset).unwrap_or(usize::MAX));
        let n = inode.file_mut().write(alloc, offset, &data[..len]);
        if n == 0 {
            return err(libc::ENOSPC);
        }
        inode.touch(self.fs.now());
        Ok(n)
    }

    pub(super) fn do_fallocate(
        &self,
        file: &MemFile,
        mode: i32,
        offset: u64,
        len: u64,
    ) -> Result<()> {
        const KEEP: i32 = libc::FALLOC_FL_KEEP_SIZE;
        const PUNCH: i32 = libc::FALLOC_FL_PUNCH_HOLE;
        if i64::try_from(offset).is_err() || len == 0 || i64::try_from(len).is_err() {
            return err(libc::EINVAL);
        }
        if mode & PUNCH != 0 && mode & KEEP == 0 {
            return err(libc::EOPNOTSUPP);
        }
        if !matches!(mode, 0 | KEEP) && mode != PUNCH | KEEP {
            return err(libc::EOPNOTSUPP);
        }
        let mut st = self.fs.lock();
        if !file.writable() {
            return err(libc::EBADF);
        }
        match st.get(file.node.ino).kind() {
            FileKind::Regular => {}
            FileKind::Directory => return err(libc::EISDIR),
            _ => return err(libc::ENODEV),
        }
        let end = offset.checked_add(len).filter(|&e| e <= MAX_FILE_SIZE);
        let Some(end) = end else { return err(libc::EFBIG) };
        let now = self.fs.now();
        let State { live, alloc, .. } = &mut *st;
        let inode = live.get_mut(&file.node.ino).expect("held");
        let f = inode.file_mut();
        if mode == PUNCH | KEEP {
            f.punch(alloc, offset, end);
            inode.touch(now);
            return Ok(());
        }
        f.preallocate(alloc, offset, end)?;
        if mode == 0 && end > f.size {
            f.size = end;
            inode.mtime = now;
        }
        inode.ctime = now;
        Ok(())
    }

    pub(super) fn do_lseek(&self, file: &MemFile, offset: i64, whence: i32) -> Result<i64> {
        let st = self.fs.lock();
        let inode = st.get(file.node.ino);
        let mut pos = file.pos.lock().unwrap_or_else(PoisonError::into_inner);
        let size = match &inode.content {
            Content::File(f) => f.size,
            Content::Dir(_) => BLOCK_SIZE,
            _ => return err(libc::ESPIPE),
        };
        let size = i64::try_from(size).expect("sizes fit i64");
        let new = match whence {
            libc::SEEK_SET => Some(offset),
            libc::SEEK_CUR => pos.checked_add(offset),
            libc::SEEK_END => size.checked_add(offset),
            libc::SEEK_DATA | libc::SEEK_HOLE => {
                let Content::File(f) = &inode.content else { return err(libc::EINVAL) };
                let Ok(off) = u64::try_from(offset) else { return err(libc::ENXIO) };
                let found = f.seek(off, whence == libc::SEEK_DATA)?;
                Some(i64::try_from(found).expect("below the size"))
            }
            _ => return err(libc::EINVAL),
        };
        let Some(new) = new else { return err(libc::EOVERFLOW) };
        if new < 0 {
            return err(libc::EINVAL);
        }
        *pos = new;
        Ok(new)
    }

    pub(super) fn do_copy_file_range(
        &self,
        input: &MemFile,
        offset_in: u64,
        output: &MemFile,
        offset_out: u64,
        len: u64,
    ) -> Result<u64> {
        let mut st = self.fs.lock();
        let (ino_in, ino_out) = (input.node.ino, output.node.ino);
        let (kind_in, kind_out) = (st.get(ino_in).kind(), st.get(ino_out).kind());
        if kind_in == FileKind::Directory || kind_out == FileKind::Directory {
            return err(libc::EISDIR);
        }
        if kind_in != FileKind::Regular || kind_out != FileKind::Regular {
            return err(libc::EINVAL);
        }
        if input.dir
            || !input.readable()
            || !output.writable()
            || output.flags & libc::O_APPEND != 0
        {
            return err(libc::EBADF);
        }
        if i64::try_from(offset_in).is_err() || i64::try_from(offset_out).is_err() {
            return err(libc::EINVAL);
        }
        let size_in = st.get(ino_in).file().size;
        let mut count = if offset_in >= size_in { 0 } else { len.min(size_in - offset_in) };
        if count > 0 && offset_out >= MAX_FILE_SIZE {
            return err(libc::EFBIG);
        }
        count = count.min(MAX_FILE_SIZE.saturating_sub(offset_out));
        if ino_in == ino_out && offset_out + count > offset_in && offset_out < offset_in + count {
            return err(libc::EINVAL);
        }
        let mut done = 0;
        let mut buf = Vec::new();
        while done < count {
            let n = (count - done).min(COPY_CHUNK);
            buf.resize(n as usize, 0);
            st.get(ino_in).file().read(offset_in + done, &mut buf);
            let State { live, alloc, .. } = &mut *st;
            let out = live.get_mut(&ino_out).expect("held").file_mut();
            let written = out.write(alloc, offset_out + done, &buf) as u64;
            done += written;
            if written < n {
                break;
            }
        }
        if count > 0 && done == 0 {
            return err(libc::ENOSPC);
        }
        let now = self.fs.now();
        if done > 0 {
            st.get_mut(ino_out).touch(now);
        }
        st.get_mut(ino_in).accessed(now);
        Ok(done)
    }

    pub(super) fn do_fiemap(&self, file: &MemFile) -> Result<Vec<Extent>> {
        let st = self.fs.lock();
        match &st.get(file.node.ino).content {
            Content::File(f) => Ok(f.extents()),
            Content::Dir(d) => Ok(vec![Extent {
                logical: 0,
                physical: d.phys * BLOCK_SIZE,
                length: BLOCK_SIZE,
                flags: FIEMAP_EXTENT_LAST,
            }]),
            _ => err(libc::EOPNOTSUPP),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;

    use super::*;
    use crate::LowerFs;
    use crate::creds::Creds;

    const ROOT: Creds = Creds { uid: 0, gid: 0, groups: Vec::new() };

    #[test]
    fn sequential_writes_make_one_extent_and_preallocation_is_unwritten() {
        let l = MemLower::default();
        let (_, _, f) = l.create(&ROOT, l.root(), OsStr::new("f"), 0o644, libc::O_RDWR).unwrap();
        for i in 0..4u64 {
            l.write(&f, i * BLOCK_SIZE, &[1u8; 4096]).unwrap();
        }
        l.fallocate(&f, libc::FALLOC_FL_KEEP_SIZE, 4 * BLOCK_SIZE, 2 * BLOCK_SIZE).unwrap();
        let e = l.fiemap(&f).unwrap();
        assert_eq!(e.len(), 2, "{e:?}");
        assert_eq!((e[0].logical, e[0].length, e[0].flags), (0, 4 * BLOCK_SIZE, 0));
        assert_eq!(e[1].flags, FIEMAP_EXTENT_UNWRITTEN | FIEMAP_EXTENT_LAST);
        assert_eq!(e[1].physical, e[0].physical + e[0].length, "allocated after the data");
        assert_eq!(l.getattr(&l.lookup(l.root(), OsStr::new("f")).unwrap().0).unwrap().size, 16384);
    }
}
