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
    pub fn name(self) -> &'static str {
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
    pub fn request(&self, op: Op, ok: bool) {
        self.requests[op as usize].fetch_add(1, Ordering::Relaxed);
        if !ok {
            self.errors[op as usize].fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// A snapshot of the counters, for `nvstack stat`.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Stats {
    pub requests: BTreeMap<&'static str, u64>,
    /// Requests answered with an error, by operation (each request counted once).
    pub errors: BTreeMap<&'static str, u64>,
    /// Internal attempts that aborted and were tried again (not requests, not answers):
    /// `write` = write attempts that found NVRAM full (`Counters::write_retries`).
    pub retries: BTreeMap<&'static str, u64>,
    pub app: ByteCounts,
    pub lower: ByteCounts,
    pub inodes: u64,
    pub open_handles: u64,
    /// How the nodes the kernel knows hold their lower descriptors.
    pub lower_nodes: lower::NodeStats,
    pub nvram: NvramStats,
    pub tempfiles: crate::tempfs::TempStats,
    pub cache: crate::cache::counters::CacheStats,
    pub writeback: crate::cache::counters::WritebackStats,
    pub fsync: crate::engine::durability::FsyncStats,
    pub journal: crate::journal::JournalStats,
    pub nbw: crate::cache::counters::NbwStats,
    pub passthrough: crate::route::RouteStats,
}

#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct ByteCounts {
    pub bytes_read: u64,
    pub bytes_written: u64,
}

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct NvramStats {
    pub frames_total: u64,
    pub frames_used: u64,
    pub frames_free: u64,
    pub undo_bytes_max: u64,
    pub undo_slots: u32,
    pub undo_slots_in_use: u32,
    pub transactions_committed: u64,
    pub transactions_aborted: u64,
    pub persist_mode: String,
    pub consistency: String,
}

impl Counters {
    pub fn snapshot(&self) -> Stats {
        let mut stats = Stats::default();
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

impl<L: lower::LowerFs> crate::engine::Engine<L> {
    /// Every counter, for `nvstack stat`.
    pub fn stats(&self) -> Stats {
        let mut stats = self.counters.snapshot();
        let pool = self.pool.stats();
        stats.inodes = self.inodes.len() as u64;
        stats.open_handles = self.handles.len() as u64;
        stats.lower_nodes = self.lower.node_stats();
        stats.nvram = NvramStats {
            frames_total: pool.frames_total,
            frames_used: pool.frames_total - pool.frames_free,
            frames_free: pool.frames_free,
            undo_bytes_max: pool.undo_bytes_max,
            undo_slots: pool.undo_slots,
            undo_slots_in_use: pool.undo_slots_in_use,
            transactions_committed: pool.transactions_committed,
            transactions_aborted: pool.transactions_aborted,
            persist_mode: pool
                .persist_mode
                .map(|m| format!("{m:?}").to_lowercase())
                .unwrap_or_default(),
            consistency: format!("{:?}", self.pool.consistency()).to_lowercase(),
        };
        stats.tempfiles = self.temp.stats();
        (stats.cache, stats.writeback) = self.cache.stats();
        stats.fsync = self.fsync_stats();
        stats.nbw = self.cache.nbw_stats();
        stats.journal = self.journal.stats(pool.journal);
        stats.passthrough = self.routes.stats();
        stats
    }
}
