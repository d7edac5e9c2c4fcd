//! The control line of a log area (bytes 64..128, docs/direct-path.md "Take-back"): the
//! handshake between the library, which appends, and the daemon, which merges. Volatile words,
//! never validated: a process that lies in them harms only its own file (the daemon's wait is
//! bounded and what it merges is validated).
//!
//! | offset | word | written by |
//! |---|---|---|
//! | 64 | `state`: [`ACTIVE`], [`RECALLING`] (a merge in progress), [`RECALLED`] (ended) | the daemon |
//! | 72 | `writers`: 1 while a library thread is inside an append, else 0 | the library |
//! | 80 | `fsyncs`: fsync and fdatasync calls the library answered (a statistic) | the library |
//! | 88 | `merged`: the sequence number of the last record merged (0: none), stored before the state leaves `RECALLING` | the daemon |
//!
//! **The handshake** (a store-load pair on each side with a full fence between, so that at
//! least one side sees the other): the library stores `writers = 1`, fences, loads `state`, and
//! appends only if it is `ACTIVE` ([`enter`]); the daemon stores `state = RECALLING`, fences,
//! and loads `writers` until it is 0 ([`recall`]). So when the daemon's wait ends, every append
//! is either finished (it is in the daemon's copy) or has not started its record (it will see
//! `RECALLING` and go through the descriptor instead). An append that was still inside when the
//! wait gave up (a stopped process) may not be in the daemon's copy. So an append that finds
//! `state` changed when it leaves ([`leave`] returns false) waits until the merge is over
//! ([`settled`]): if the delegation goes on, a record the merge missed is merged by the next
//! one (it is committed where the daemon's cursor stands); if it ended, the library compares
//! its record's sequence number with `merged` and writes what was not merged again through the
//! descriptor (now undelegated, so at exactly its offset) before the call returns.

use std::sync::atomic::{Ordering, fence};

use nvram::Region;

use crate::log::{STATE_WORD, WRITERS_WORD};

/// The offset of the `fsyncs` word.
pub const FSYNCS_WORD: u64 = 80;
/// The offset of the `merged` word.
pub const MERGED_WORD: u64 = 88;

/// The library may append.
pub const ACTIVE: u64 = 1;
/// The daemon is merging: appends go through the descriptor until the state is `ACTIVE` again.
pub const RECALLING: u64 = 2;
/// The delegation ended: the library serves nothing of this file any more.
pub const RECALLED: u64 = 3;

/// The library's entry into an append: true when it may append (the state was `ACTIVE`);
/// otherwise it is not inside and gets the state that stopped it.
pub fn enter(area: &dyn Region) -> Result<(), u64> {
    area.store_u64(WRITERS_WORD, 1);
    fence(Ordering::SeqCst);
    let state = area.load_u64(STATE_WORD);
    if state == ACTIVE {
        Ok(())
    } else {
        area.store_u64(WRITERS_WORD, 0);
        Err(state)
    }
}

/// The library leaves an append: true when the state stayed `ACTIVE` throughout, so the record
/// is the daemon's to merge; false when a recall began meanwhile (then the library writes the
/// same bytes through the descriptor before the call returns).
pub fn leave(area: &dyn Region) -> bool {
    fence(Ordering::SeqCst);
    let state = area.load_u64(STATE_WORD);
    area.store_u64(WRITERS_WORD, 0);
    state == ACTIVE
}

/// The daemon starts a recall: from now on no append begins.
pub fn begin_recall(area: &dyn Region) {
    area.store_u64(STATE_WORD, RECALLING);
    fence(Ordering::SeqCst);
}

/// Whether no library thread is inside an append (after [`begin_recall`]).
pub fn quiet(area: &dyn Region) -> bool {
    area.load_u64(WRITERS_WORD) == 0
}

/// The daemon's side of the handshake: [`begin_recall`], then `wait` is asked until it gives up
/// (it sleeps between asks and bounds the time: the engine is deterministic, time is the
/// caller's). True when the area became quiet.
pub fn recall(area: &dyn Region, wait: &mut dyn FnMut() -> bool) -> bool {
    begin_recall(area);
    loop {
        if quiet(area) {
            return true;
        }
        if !wait() {
            return quiet(area);
        }
    }
}

/// The daemon ends a merge that keeps the delegation (`merged`: the last record it merged):
/// appends may begin again.
pub fn resume(area: &dyn Region, merged: u64) {
    area.store_u64(MERGED_WORD, merged);
    fence(Ordering::SeqCst);
    area.store_u64(STATE_WORD, ACTIVE);
}

/// The daemon ends the delegation (`merged`: the last record it merged).
pub fn end(area: &dyn Region, merged: u64) {
    area.store_u64(MERGED_WORD, merged);
    fence(Ordering::SeqCst);
    area.store_u64(STATE_WORD, RECALLED);
}

/// The library, after a [`leave`] that found the state changed: waits (asking `wait` between
/// looks, which bounds the time) until the daemon's merge is over. `Some(merged)` when the
/// delegation ended (the last record merged), `None` when it goes on - or when `wait` gave up
/// (the daemon is gone: the caller's write through the descriptor then fails as any would).
pub fn settled(area: &dyn Region, wait: &mut dyn FnMut() -> bool) -> Option<u64> {
    loop {
        match area.load_u64(STATE_WORD) {
            RECALLED => {
                fence(Ordering::SeqCst);
                return Some(area.load_u64(MERGED_WORD));
            }
            ACTIVE => return None,
            _ if !wait() => return Some(0),
            _ => {}
        }
    }
}

/// The last record merged (after [`settled`]).
pub fn merged(area: &dyn Region) -> u64 {
    area.load_u64(MERGED_WORD)
}

/// The state word (what the library checks before anything else).
pub fn state(area: &dyn Region) -> u64 {
    area.load_u64(STATE_WORD)
}

/// The library counts one fsync or fdatasync it answered.
pub fn count_fsync(area: &dyn Region) {
    let n = area.load_u64(FSYNCS_WORD);
    area.store_u64(FSYNCS_WORD, n.wrapping_add(1));
}

/// The library's fsync count (read by the daemon at a merge; a statistic, never trusted).
pub fn fsyncs(area: &dyn Region) -> u64 {
    area.load_u64(FSYNCS_WORD)
}
