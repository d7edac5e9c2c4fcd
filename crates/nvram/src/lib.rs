//! The NVRAM region: the bottom layer of nvstack.
//!
//! Everything durable that nvstack owns lives in one region of non-volatile memory, and every
//! load and store to it goes through the [`Region`] trait (`region.rs`), whose contract is the
//! persistence model the rest of the system is proven against. Implementations:
//!
//! - [`MmapRegion`] (`mmap.rs`): a file mapped `MAP_SHARED`, made durable by clwb + sfence on
//!   DAX, by the page cache on tmpfs (the default emulated NVRAM), or by msync on a disk file;
//! - [`SimRegion`] (`sim.rs`): a crash simulator that can produce the image a crash would leave
//!   after any fence (persisted lines kept, the rest dropped or torn at 8-byte granularity);
//! - [`OverlayRegion`] (`overlay.rs`): a copy-on-write view, to run recovery without writing.
//!
//! Write protection of committed pages (journal mode) is part of the trait (`protect`,
//! `unprotect`, `write_retained`: stores into protected pages, which `MmapRegion` makes through
//! a second, private mapping of its file); `trap.rs` traps stray stores into protected
//! `MmapRegion` pages (a SIGSEGV handler that diverts or fail-stops them).
//!
//! `layout.rs` fixes where the areas of a region live (superblock, state word, root area, undo
//! log, frame descriptors, frames) and verifies the superblock at open. The formats of the undo
//! log and of the descriptors belong to the transaction layer (`txn`), which is the only writer
//! of those areas.

pub mod checksum;
pub mod error;
pub mod layout;
pub mod mmap;
pub mod overlay;
pub mod region;
pub mod sim;
pub mod trap;

pub use error::{Area, Error, Result};
pub use layout::{FormatParams, Layout, RegionState};
pub use mmap::{MmapOptions, MmapRegion, PersistChoice, RetainedWrites, is_in_use};
pub use overlay::OverlayRegion;
pub use region::{CACHE_LINE, PROTECT_PAGE, PersistMode, Region, RegionCounters, WORD};
pub use sim::{CrashMode, CrashPoint, FenceHook, SimRegion};
pub use trap::TrapPolicy;
