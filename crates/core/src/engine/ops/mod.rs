//! The operations: one public method of [`crate::Engine`] per request of the front end, named
//! after the syscall, grouped by family. Each returns plain data; the front end replies. Most
//! run through `Engine::op` (counted, one transaction); `write` counts itself and retries in
//! a transaction per attempt (`io.rs`), and `forget` only counts (no NVRAM change).

mod attrs;
mod dirs;
mod files;
mod io;
mod names;
