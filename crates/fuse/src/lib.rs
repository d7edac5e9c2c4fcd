//! The FUSE front end: translation only. Each handler decodes the request, calls one engine
//! method and replies; errors become errno values in `errno.rs` and nowhere else.
//!
//! Kernel caching and why it is coherent: while mounted, the lower directory belongs to nvstack
//! (as with overlayfs, changes behind its back are undefined), so every change to it arrives as
//! a FUSE request. The kernel updates or invalidates its own caches for each request it sends
//! (a write extends `i_size` and invalidates the times, a create/unlink invalidates the parent's
//! attributes, a setattr reply carries the new ones). Entry and attribute replies can therefore
//! be cached for a long time (`Timeouts`, default one day, as libfuse's passthrough_hp), and
//! files keep their page cache across opens (`FOPEN_KEEP_CACHE`). Write-through mode (no
//! `FUSE_WRITEBACK_CACHE`) is kept on purpose: every write() reaches the daemon, which is what
//! lets the engine make each write an atomic, durable NVRAM transaction. The one attribute the
//! kernel cannot see change is the lower atime on reads; it is refreshed when the attribute
//! timeout expires (set `--attr-timeout 0` for strict atime).

mod attr;
mod direct;
mod errno;
mod handlers;

pub use direct::NotifierSlot;
pub use handlers::{DirectIo, FuseFs, Timeouts};
