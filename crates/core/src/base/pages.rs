//! The NVRAM data path: file data in pages of one frame each, as both TempFFS (a temp file's
//! pages) and the page cache (a cached file's dirty pages) keep it. What a write, a read and a
//! truncate do to such pages, and to the size and times of the file's record, is here once, so
//! that the two mechanisms cannot disagree on it (a limit, a zeroed tail, a fresh frame written
//! whole, which times a write changes).
//!
//! Invariants the callers keep with these steps:
//! - D1 a fresh data frame is written whole in the transaction that allocates it (zeros where
//!   the write does not reach, [`fresh`]), so no byte of a previous owner is ever visible;
//! - D2 bytes of a resident page at or beyond the file size are zero ([`zero_tail`] when a
//!   truncate cuts a page), so a file that grows again shows zeros;
//! - D3 no resident page lies wholly at or beyond the size ([`first_gone`]);
//! - no file grows past [`MAX_SIZE`] ([`write_end`], [`check_size`]): EFBIG, as the kernel's
//!   own limit for a FUSE file.

use std::ops::Range;

use txn::{FrameId, FrameTag, Pool, Tx, TxError};

use super::error::{FsResult, answer};

/// Bytes of a page: a frame of the region holds one page of file data.
pub const PAGE: u64 = nvram::layout::FRAME_SIZE;

/// The largest size of a file: the kernel's limit for a FUSE file (`MAX_LFS_FILESIZE`), and
/// what the records' sizes (`off_t` to the kernel) can say.
pub const MAX_SIZE: u64 = i64::MAX as u64;

/// `len` bytes at `offset`, page by page: (page number, offset in the page, offset in the
/// data, length of the piece).
pub fn pieces(offset: u64, len: usize) -> impl Iterator<Item = (u64, usize, usize, usize)> {
    let mut done = 0usize;
    std::iter::from_fn(move || {
        if done >= len {
            return None;
        }
        let pos = offset + done as u64;
        let in_page = (pos % PAGE) as usize;
        let n = (PAGE as usize - in_page).min(len - done);
        let piece = (pos / PAGE, in_page, done, n);
        done += n;
        Some(piece)
    })
}

/// The end of a write of `len` bytes at `offset`; EFBIG when it would pass [`MAX_SIZE`].
pub(crate) fn write_end(offset: u64, len: usize) -> FsResult<u64> {
    match offset.checked_add(len as u64) {
        Some(end) if end <= MAX_SIZE => Ok(end),
        _ => Err(answer(libc::EFBIG)),
    }
}

/// A size a truncate may set; EFBIG past [`MAX_SIZE`].
pub(crate) fn check_size(size: u64) -> FsResult<()> {
    if size > MAX_SIZE {
        return Err(answer(libc::EFBIG));
    }
    Ok(())
}

/// The pages a write of `[offset, end)` touches.
pub(crate) fn span(offset: u64, end: u64) -> Range<u64> {
    offset / PAGE..end.div_ceil(PAGE)
}

/// The first page a truncate to `size` frees: every page from it on lies wholly at or beyond
/// the size (D3).
pub(crate) fn first_gone(size: u64) -> u64 {
    size.div_ceil(PAGE)
}

/// The bytes of the last page a truncate from `old` to `size` must zero (D2): (page, from,
/// to) in that page, or `None` when the new size ends on a page boundary or nothing shrinks.
pub(crate) fn tail(old: u64, size: u64) -> Option<(u64, u64, u64)> {
    if size >= old || size % PAGE == 0 {
        return None;
    }
    let page = size / PAGE;
    Some((page, size % PAGE, PAGE.min(old - page * PAGE)))
}

/// Writes `bytes` at `in_page` of a resident page (its frame is the file's already).
pub(crate) fn store(
    tx: &mut Tx<'_>,
    frame: FrameId,
    in_page: usize,
    bytes: &[u8],
) -> Result<(), TxError> {
    let at = tx.pool().frame_offset(frame) + in_page as u64;
    tx.update(at, bytes)
}

/// A fresh frame tagged `tag` holding `bytes` at `in_page` and zeros elsewhere, written whole
/// (D1).
pub(crate) fn fresh(
    tx: &mut Tx<'_>,
    tag: FrameTag,
    in_page: usize,
    bytes: &[u8],
) -> Result<FrameId, TxError> {
    let mut page = vec![0u8; PAGE as usize];
    page[in_page..in_page + bytes.len()].copy_from_slice(bytes);
    fresh_page(tx, tag, &page)
}

/// A fresh frame tagged `tag` holding the whole page `page` (D1).
pub(crate) fn fresh_page(tx: &mut Tx<'_>, tag: FrameTag, page: &[u8]) -> Result<FrameId, TxError> {
    debug_assert_eq!(page.len() as u64, PAGE, "D1: a fresh frame is written whole");
    let frame = tx.alloc_frame(tag)?;
    let at = tx.pool().frame_offset(frame);
    tx.write(at, page);
    Ok(frame)
}

/// Zeroes `[from, to)` of a resident page (the tail a truncate cut, D2).
pub(crate) fn zero_tail(
    tx: &mut Tx<'_>,
    frame: FrameId,
    from: u64,
    to: u64,
) -> Result<(), TxError> {
    debug_assert!(from <= to && to <= PAGE, "a tail lies in its page");
    let at = tx.pool().frame_offset(frame) + from;
    tx.update(at, &vec![0u8; (to - from) as usize])
}

/// Reads `out.len()` bytes at `in_page` of a resident page.
pub(crate) fn load(pool: &Pool, frame: FrameId, in_page: u64, out: &mut [u8]) {
    pool.read(pool.frame_offset(frame) + in_page, out);
}

/// The size and times in a file's record that its data changes: a temp file's record and a
/// cached file's record answer the same way to a write and a truncate.
pub trait DataRecord {
    /// The record's size, mtime and ctime.
    fn data_fields(&mut self) -> (&mut u64, &mut (i64, u32), &mut (i64, u32));

    /// A write ending at `end` (at most [`MAX_SIZE`], [`write_end`]) committed at `now`.
    fn written(&mut self, end: u64, now: (i64, u32)) {
        let (size, mtime, ctime) = self.data_fields();
        *size = (*size).max(end);
        (*mtime, *ctime) = (now, now);
    }

    /// A truncate to `size` (at most [`MAX_SIZE`], [`check_size`]) at `now`.
    fn truncated(&mut self, size: u64, now: (i64, u32)) {
        let (s, mtime, ctime) = self.data_fields();
        *s = size;
        (*mtime, *ctime) = (now, now);
    }
}
