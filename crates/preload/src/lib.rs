//! `libnvstack.so`, the direct path's preload library (docs/direct-path.md): loaded with
//! `LD_PRELOAD` (`nvstack run -- CMD`), it serves an application's writes to files of nvstack
//! mounts (`--direct-path on`) in the application's own process - durable in a log area in
//! NVRAM that the daemon delegated to it, with no FUSE request - and its fsync, fdatasync and
//! fstat of those files. Everything else, and everything it cannot serve, goes to the C
//! library as without it; the daemon stays the authority (any request that reaches it on a
//! delegated file takes the delegation back first), so correctness never depends on this
//! library catching a call.
//!
//! What it does, per descriptor (`fds.rs`): an open that can write a regular file of an
//! nvstack mount is a *candidate*; its first write asks the daemon for a delegation (the
//! `DELEGATE` ioctl on the descriptor) and maps the log area the answer names. From then on a
//! write appends a record (`direct::LogWriter`, DL1) inside the take-back's handshake
//! (`direct::control`): durable when it returns; fsync and fdatasync return at once; fstat is
//! answered from the size and times the library keeps (it is the file's only writer: DG1).
//! A delegation the daemon took back is noticed at the next call (`state` is `RECALLED`), and
//! the next write asks again. `NVSTACK_DIRECT=off` in the environment turns it all off.
//!
//! Threads share the table (a lock per delegation orders its records); a child after fork
//! serves nothing itself (its calls go through the descriptor, and the daemon takes the
//! parent's delegation back at the first); exec drops it all (the kernel's file is as the
//! daemon left it).

// Sizes and offsets cross between the C types (off_t, ssize_t) and the log's u64; every one
// is bounded by the file size limit (i64::MAX) or a buffer's length, so the casts are lossless.
#![allow(
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap,
    reason = "C's signed sizes and offsets, bounded by the file size limit"
)]

mod fds;
mod hooks;
mod mounts;
mod real;
