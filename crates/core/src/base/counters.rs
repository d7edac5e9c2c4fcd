//! Counters: requests per operation, bytes moved, lower IO. Lock-free (relaxed atomics): they
//! are observations, not synchronisation.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// Every operation the engine counts; names are the syscalls'.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Op {
    Lookup,
    Forget,
    Getattr,
    Setattr,
    Readlink,
    Mknod,
    Mkdir,
    Unlink,
    Rmdir,
    Symlink,
    Rename,
    Link,
    Open,
    Create,
    Read,
    Write,
    Flush,
    Release,
    Fsync,
    Opendir,
    Readdir,
    Releasedir,
    Fsyncdir,
    Statfs,
    Setxattr,
    Getxattr,
    Listxattr,
    Removexattr,
    Access,
    Fallocate,
    Lseek,
    CopyFileRange,
}

pub const OPS: [Op; 32] = [
    Op::Lookup,
    Op::Forget,
    Op::Getattr,
    Op::Setattr,
    Op::Readlink,
    Op::Mknod,
    Op::Mkdir,
    Op::Unlink,
    Op::Rmdir,
    Op::Symlink,
    Op::Rename,
    Op::Link,
    Op::Open,
    Op::Create,
    Op::Read,
    Op::Write,
    Op::Flush,
    Op::Release,
    Op::Fsync,
    Op::Opendir,
    Op::Readdir,
    Op::Releasedir,
    Op::Fsyncdir,
    Op::Statfs,
    Op::Setxattr,
    Op::Getxattr,
    Op::Listxattr,
    Op::Removexattr,
    Op::Access,
    Op::Fallocate,
    Op::Lseek,
    Op::CopyFileRange,
];

impl Op {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Op::Lookup => "lookup",
            Op::Forget => "forget",
            Op::Getattr => "getattr",
            Op::Setattr => "setattr",
            Op::Readlink => "readlink",
            Op::Mknod => "mknod",
            Op::Mkdir => "mkdir",
            Op::Unlink => "unlink",
            Op::Rmdir => "rmdir",
            Op::Symlink => "symlink",
            Op::Rename => "rename",
            Op::Link => "link",
            Op::Open => "open",
            Op::Create => "create",
            Op::Read => "read",
            Op::Write => "write",
            Op::Flush => "flush",
            Op::Release => "release",
            Op::Fsync => "fsync",
            Op::Opendir => "opendir",
            Op::Readdir => "readdir",
            Op::Releasedir => "releasedir",
            Op::Fsyncdir => "fsyncdir",
            Op::Statfs => "statfs",
            Op::Setxattr => "setxattr",
            Op::Getxattr => "getxattr",
            Op::Listxattr => "listxattr",
            Op::Removexattr => "removexattr",
            Op::Access => "access",
            Op::Fallocate => "fallocate",
            Op::Lseek => "lseek",
            Op::CopyFileRange => "copy_file_range",
        }
    }
}

#[derive(Debug)]
pub struct Counters {
    requests: [AtomicU64; OPS.len()],
    errors: [AtomicU64; OPS.len()],
    /// Attempts of a write that found NVRAM full and aborted their transaction (ops/io.rs):
    /// each is tried again once room is made - or, if none can be, the write fails and
    /// `errors` counts its answer. Not requests, and not answers the kernel saw.
    pub write_retries: AtomicU64,
    pub app_bytes_read: AtomicU64,
    pub app_bytes_written: AtomicU64,
    pub lower_bytes_read: AtomicU64,
    pub lower_bytes_written: AtomicU64,
}

impl Default for Counters {
    fn default() -> Self {
        Counters {
            requests: std::array::from_fn(|_| AtomicU64::new(0)),
            errors: std::array::from_fn(|_| AtomicU64::new(0)),
            write_retries: AtomicU64::new(0),
            app_bytes_read: AtomicU64::new(0),
            app_bytes_written: AtomicU64::new(0),
            lower_bytes_read: AtomicU64::new(0),
            lower_bytes_written: AtomicU64::new(0),
        }
    }
}

impl Counters {
    /// One request the kernel sent, counted once with the answer it got (`ok`: no errno).
    pub(crate) fn request(&self, op: Op, ok: bool) {
        self.requests[op as usize].fetch_add(1, Ordering::Relaxed);
        if !ok {
            self.errors[op as usize].fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// The requests and bytes of a snapshot of the counters (`nvstack stat`; the engine's
/// `Stats` shows each field under the same name).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct RequestStats {
    pub requests: BTreeMap<&'static str, u64>,
    /// Requests answered with an error, by operation (each request counted once).
    pub errors: BTreeMap<&'static str, u64>,
    /// Internal attempts that aborted and were tried again (not requests, not answers):
    /// `write` = write attempts that found NVRAM full (`Counters::write_retries`).
    pub retries: BTreeMap<&'static str, u64>,
    pub app: ByteCounts,
    pub lower: ByteCounts,
}

#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct ByteCounts {
    pub bytes_read: u64,
    pub bytes_written: u64,
}

impl Counters {
    pub(crate) fn snapshot(&self) -> RequestStats {
        let mut stats = RequestStats::default();
        for op in OPS {
            let n = self.requests[op as usize].load(Ordering::Relaxed);
            if n > 0 {
                stats.requests.insert(op.name(), n);
            }
            let e = self.errors[op as usize].load(Ordering::Relaxed);
            if e > 0 {
                stats.errors.insert(op.name(), e);
            }
        }
        let retries = self.write_retries.load(Ordering::Relaxed);
        if retries > 0 {
            stats.retries.insert(Op::Write.name(), retries);
        }
        stats.app = ByteCounts {
            bytes_read: self.app_bytes_read.load(Ordering::Relaxed),
            bytes_written: self.app_bytes_written.load(Ordering::Relaxed),
        };
        stats.lower = ByteCounts {
            bytes_read: self.lower_bytes_read.load(Ordering::Relaxed),
            bytes_written: self.lower_bytes_written.load(Ordering::Relaxed),
        };
        stats
    }
}
