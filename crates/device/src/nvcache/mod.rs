//! The NVRAM block cache (NVFAT, SAC'09): a write cache of 512-byte sectors in a region of
//! non-volatile memory, in front of the modeled drive.
//!
//! A write the cache absorbs is durable when it returns: its sectors are stored in the
//! region by one undo-log transaction (`txn`, the same crash-safe region and transactions as
//! the file system), and it costs no modeled disk time. Reads of resident sectors are served
//! from the region. Sectors leave the cache one at a time when it is full, least recently
//! written first (LRW, the paper's destage), or all at once on `nvstack device flush` and at
//! a clean detach; a destaged sector is written to the image first and freed afterwards, so a
//! crash between the two only writes the same bytes again. A power cut of the modeled drive
//! (`device cut`) leaves the region alone; the next attach recovers it (`Pool::open` rolls back
//! an unfinished transaction, the frames are verified and the hash and LRW order rebuilt)
//! before anything is served.
//!
//! Code: `record.rs` (the persistent format: anchor, frame header, entries), `cache/` (the
//! cache: `mod.rs` hash on LBN, LRW order and the protocol; `absorb.rs`, `destage.rs` the
//! persistent operations; `open.rs` creation and recovery; `verify.rs` the checks and `scan`
//! for `nvstack check`/`inspect`). What is admitted in `metadata` mode is decided by
//! `crate::classify`. Design, byte tables and the proof by cases: `docs/nvcache.md`.

mod cache;
pub mod record;

pub(crate) use cache::Counters;
pub use cache::{
    Backing, NvCache, NvCacheError, OpenReport, ResidentSector, Scan, format_params, open_file,
    scan,
};
pub use record::{CacheMode, ImageId};
