//! File data of a temp file in NVRAM frames: positional read, write and truncate.
//!
//! A page (4 KiB of the file) is either resident (a data frame tagged with the record's
//! place, `Place::owner`, and the page number) or a hole (reads as zeros). Invariants: D1 a fresh data frame is
//! completely written in the transaction that allocates it (zeros where the write does not
//! reach), so no byte of a previous owner is ever visible; D2 bytes of a resident page beyond
//! the file size are zero (truncate zeroes the tail), so growing the file shows zeros; D3 no
//! resident page lies wholly beyond the size (T3 of the record).

use std::collections::BTreeMap;

use txn::{FrameId, FrameTag, Pool, Tx, TxError};

use super::record::{KIND_DATA, RECORD_SIZE, Record};
use crate::base::slots::{self, Place};

pub use crate::base::pages::{PAGE, pieces};

/// Writes `data` at `offset`; returns the pages it allocated (added to `pages`). On error no
/// page was added: the caller's map stays the mirror of what the rollback leaves.
pub fn write(
    tx: &mut Tx<'_>,
    object: Place,
    pages: &mut BTreeMap<u64, FrameId>,
    offset: u64,
    data: &[u8],
) -> Result<Vec<u64>, TxError> {
    let mut fresh = Vec::new();
    let result = write_into(tx, object, pages, offset, data, &mut fresh);
    if result.is_err() {
        forget_pages(pages, &fresh);
    }
    result.map(|()| fresh)
}

/// Takes pages added by `write` out of the map again (their transaction rolled back).
pub fn forget_pages(pages: &mut BTreeMap<u64, FrameId>, fresh: &[u64]) {
    for p in fresh {
        pages.remove(p);
    }
}

fn write_into(
    tx: &mut Tx<'_>,
    object: Place,
    pages: &mut BTreeMap<u64, FrameId>,
    offset: u64,
    data: &[u8],
    fresh: &mut Vec<u64>,
) -> Result<(), TxError> {
    let pool = tx.pool();
    for (page, in_page, done, n) in pieces(offset, data.len()) {
        let chunk = &data[done..done + n];
        if let Some(&frame) = pages.get(&page) {
            tx.update(pool.frame_offset(frame) + in_page as u64, chunk)?;
        } else {
            let frame =
                tx.alloc_frame(FrameTag { kind: KIND_DATA, owner: object.owner(), index: page })?;
            // D1: the whole frame is written now.
            let mut buf = vec![0u8; PAGE as usize];
            buf[in_page..in_page + n].copy_from_slice(chunk);
            tx.write(pool.frame_offset(frame), &buf);
            pages.insert(page, frame);
            fresh.push(page);
        }
    }
    Ok(())
}

/// Reads up to `buf.len()` bytes at `offset`, bounded by the size; holes read as zeros.
pub fn read(
    pool: &Pool,
    pages: &BTreeMap<u64, FrameId>,
    size: u64,
    offset: u64,
    buf: &mut [u8],
) -> usize {
    if offset >= size {
        return 0;
    }
    let len = (buf.len() as u64).min(size - offset) as usize;
    let mut done = 0usize;
    while done < len {
        let pos = offset + done as u64;
        let page = pos / PAGE;
        let in_page = pos % PAGE;
        let n = (PAGE - in_page).min((len - done) as u64) as usize;
        match pages.get(&page) {
            Some(&frame) => pool.read(pool.frame_offset(frame) + in_page, &mut buf[done..done + n]),
            None => buf[done..done + n].fill(0),
        }
        done += n;
    }
    len
}

/// Sets the size of the data to `size`: frees pages wholly beyond it and zeroes the tail of
/// the last partial page (D2, D3). Returns the number of frames freed.
pub fn truncate(
    tx: &mut Tx<'_>,
    pages: &mut BTreeMap<u64, FrameId>,
    old_size: u64,
    size: u64,
) -> Result<u64, TxError> {
    let pool = tx.pool();
    if size < old_size && size % PAGE != 0 {
        let page = size / PAGE;
        if let Some(&frame) = pages.get(&page) {
            let from = size % PAGE;
            let to = PAGE.min(old_size - page * PAGE);
            tx.update(pool.frame_offset(frame) + from, &vec![0u8; (to - from) as usize])?;
        }
    }
    let first_gone = size.div_ceil(PAGE);
    let gone: Vec<u64> = pages.range(first_gone..).map(|(&p, _)| p).collect();
    for &p in &gone {
        tx.free_frame(pages[&p])?;
        pages.remove(&p);
    }
    Ok(gone.len() as u64)
}

/// Frees every data frame of the file and takes its record out (`slots::remove`: the slot
/// is released after the commit, `Engine::release_record`).
pub fn free_all(
    tx: &mut Tx<'_>,
    object: Place,
    pages: &mut BTreeMap<u64, FrameId>,
) -> Result<u64, TxError> {
    let n = pages.len() as u64;
    for (_, &frame) in pages.iter() {
        tx.free_frame(frame)?;
    }
    pages.clear();
    slots::remove(tx, object, RECORD_SIZE)?;
    Ok(n)
}

/// Rewrites the record at its place (snapshot first).
pub fn put_record(tx: &mut Tx<'_>, object: Place, rec: &Record) -> Result<(), TxError> {
    slots::put(tx, object, &rec.encode())
}

/// The next data offset at or after `offset` (SEEK_DATA), or None (ENXIO).
pub fn seek_data(pages: &BTreeMap<u64, FrameId>, size: u64, offset: u64) -> Option<u64> {
    if offset >= size {
        return None;
    }
    let page = offset / PAGE;
    if pages.contains_key(&page) {
        return Some(offset);
    }
    pages.range(page..).next().map(|(&p, _)| (p * PAGE).max(offset)).filter(|&o| o < size)
}

/// The next hole at or after `offset` (SEEK_HOLE); the size counts as a hole.
pub fn seek_hole(pages: &BTreeMap<u64, FrameId>, size: u64, offset: u64) -> Option<u64> {
    if offset >= size {
        return None;
    }
    let mut page = offset / PAGE;
    while pages.contains_key(&page) {
        page += 1;
    }
    Some((page * PAGE).max(offset).min(size))
}
