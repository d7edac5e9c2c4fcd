//! The NVRAM data path: file data in pages of one frame each, as both TempFFS (a temp file's
//! pages) and the page cache (a cached file's dirty pages) keep it. What a write, a read and a
//! truncate do to such pages is here once, so that the two mechanisms cannot disagree on it
//! (a limit, a zeroed tail, a fresh frame written whole).

/// Bytes of a page: a frame of the region holds one page of file data.
pub const PAGE: u64 = nvram::layout::FRAME_SIZE;

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
