//! The operations: one public method of [`crate::Engine`] per request of the front end, named
//! after the syscall, grouped by family. Each runs through `Engine::op` (counted, one
//! transaction) and returns plain data; the front end replies.

mod attrs;
mod dirs;
mod files;
mod io;
mod names;
