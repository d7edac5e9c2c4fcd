//! File data of a temp file in NVRAM frames: positional read, write and truncate.
//!
//! A page (4 KiB of the file) is either resident (a data frame tagged with the record's
//! place, `Place::owner`, and the page number) or a hole (reads as zeros). Every step on the
//! pages is the NVRAM data path the page cache takes too (`base/pages.rs`, with its
//! invariants D1-D3); this file keeps the temp file's page map in step with it.

use std::collections::BTreeMap;

use txn::{FrameId, FrameTag, Pool, Tx, TxError};

use super::record::{KIND_DATA, RECORD_SIZE, Record};
use crate::base::slots::{self, Place};

use crate::base::pages as path; // the NVRAM data path
pub use crate::base::pages::{PAGE, pieces};

/// Writes `data` at `offset`; returns the pages it allocated (added to `pages`). On error no
/// page was added: the caller's map stays the mirror of what the rollback leaves.
pub(crate) fn write(
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
pub(crate) fn forget_pages(pages: &mut BTreeMap<u64, FrameId>, fresh: &[u64]) {
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
    for (page, in_page, done, n) in pieces(offset, data.len()) {
        let chunk = &data[done..done + n];
        if let Some(&frame) = pages.get(&page) {
            path::store(tx, frame, in_page, chunk)?;
        } else {
            let tag = FrameTag { kind: KIND_DATA, owner: object.owner(), index: page };
            let frame = path::fresh(tx, tag, in_page, chunk)?;
            pages.insert(page, frame);
            fresh.push(page);
        }
    }
    Ok(())
}

/// Reads up to `buf.len()` bytes at `offset`, bounded by the size; holes read as zeros.
pub(crate) fn read(
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
            Some(&frame) => path::load(pool, frame, in_page, &mut buf[done..done + n]),
            None => buf[done..done + n].fill(0),
        }
        done += n;
    }
    len
}

/// Sets the size of the data to `size`: frees pages wholly beyond it and zeroes the tail of
/// the last partial page (D2, D3). Returns the number of frames freed.
pub(crate) fn truncate(
    tx: &mut Tx<'_>,
    pages: &mut BTreeMap<u64, FrameId>,
    old_size: u64,
    size: u64,
) -> Result<u64, TxError> {
    if let Some((page, from, to)) = path::tail(old_size, size)
        && let Some(&frame) = pages.get(&page)
    {
        path::zero_tail(tx, frame, from, to)?;
    }
    let gone: Vec<u64> = pages.range(path::first_gone(size)..).map(|(&p, _)| p).collect();
    for &p in &gone {
        tx.free_frame(pages[&p])?;
        pages.remove(&p);
    }
    Ok(gone.len() as u64)
}

/// Frees every data frame of the file and takes its record out (`slots::remove`: the slot
/// is released after the commit, `TempFs::release_record`).
pub(crate) fn free_all(
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
pub(crate) fn put_record(tx: &mut Tx<'_>, object: Place, rec: &Record) -> Result<(), TxError> {
    slots::put(tx, object, &rec.encode())
}

/// The next data offset at or after `offset` (SEEK_DATA), or None (ENXIO).
pub(crate) fn seek_data(pages: &BTreeMap<u64, FrameId>, size: u64, offset: u64) -> Option<u64> {
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
pub(crate) fn seek_hole(pages: &BTreeMap<u64, FrameId>, size: u64, offset: u64) -> Option<u64> {
    if offset >= size {
        return None;
    }
    let mut page = offset / PAGE;
    while pages.contains_key(&page) {
        page += 1;
    }
    Some((page * PAGE).max(offset).min(size))
}
