//! The table of descriptors this library knows and their delegations.
//!
//! A descriptor names an [`OpenFile`] (shared by its duplicates: one open file description);
//! an open file may hold a [`Deleg`] - the grant, the mapped log area, and under its lock the
//! writer's position and the file's size and times. Locks: the table's, then an open file's,
//! then a delegation's; none is held across a call into the C library except a delegation's
//! (its appends, and the ioctls of its own descriptor).

use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use direct::control;
use direct::ioctl as dio;
use direct::{LogWriter, MAX_RECORD_DATA, RecordKind};
use nvram::{MmapOptions, MmapRegion, Region};

use crate::real;

/// Most descriptors in the table (a process with more serves the rest through FUSE).
const MAX_FDS: usize = 1 << 16;
/// How long a write waits for the daemon to end a merge that began during its append.
const SETTLE_WAIT_US: u64 = 2_000_000;

/// The file's attributes as the library keeps them while it is the only writer.
#[derive(Clone, Copy)]
pub struct Kept {
    pub stat: libc::stat64,
}

/// A delegation: the daemon's grant for one open file.
pub struct Deleg {
    grant: u64,
    area: MmapRegion,
    state: Mutex<DelegState>,
}

struct DelegState {
    at: u64,
    next_seq: u64,
    kept: Kept,
    /// The daemon took it back (its `state` was `RECALLED`).
    dead: bool,
}

/// One open file description on an nvstack mount that can write a regular file.
pub struct OpenFile {
    /// O_APPEND (as the application set it: open, F_SETFL).
    pub append: AtomicBool,
    /// The daemon refused a grant: the descriptor is served through FUSE.
    refused: AtomicBool,
    /// Mapped (mmap): the mapping sees the kernel's pages, so no delegation is asked for again.
    mapped: AtomicBool,
    /// Writes seen before a delegation was asked for (see [`ASK_AFTER`]).
    writes: std::sync::atomic::AtomicU32,
    deleg: Mutex<Option<Arc<Deleg>>>,
}

static TABLE: RwLock<Option<HashMap<c_int, Arc<OpenFile>>>> = RwLock::new(None);
/// Entries in the table: a process that opened nothing on a mount pays one load per call.
static COUNT: AtomicUsize = AtomicUsize::new(0);
/// Set in a child after fork: it serves nothing itself.
pub static FORKED: AtomicBool = AtomicBool::new(false);
/// `NVSTACK_DIRECT=off`.
pub static OFF: AtomicBool = AtomicBool::new(false);
/// Writes of a descriptor that go through FUSE before the library asks for a delegation
/// (`NVSTACK_DIRECT_AFTER`, default 1): a grant costs a request and a log file, which a file
/// written once and closed (a mail delivery) never earns back; a file written again is one
/// that is written often (a log, a database's journal).
pub static ASK_AFTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The open file of `fd`, if the library serves it.
pub fn get(fd: c_int) -> Option<Arc<OpenFile>> {
    if COUNT.load(Ordering::Acquire) == 0 || FORKED.load(Ordering::Relaxed) {
        return None;
    }
    let table = TABLE.read().unwrap_or_else(std::sync::PoisonError::into_inner);
    table.as_ref()?.get(&fd).cloned()
}

/// `fd` names `of` from now on (an open, a duplicate).
pub fn insert(fd: c_int, of: Arc<OpenFile>) {
    let mut table = TABLE.write().unwrap_or_else(std::sync::PoisonError::into_inner);
    let map = table.get_or_insert_with(HashMap::new);
    if map.len() >= MAX_FDS && !map.contains_key(&fd) {
        return;
    }
    if map.insert(fd, of).is_none() {
        COUNT.fetch_add(1, Ordering::AcqRel);
    }
}

/// `fd` was closed (or reused by dup2).
pub fn remove(fd: c_int) {
    if COUNT.load(Ordering::Acquire) == 0 {
        return;
    }
    let mut table = TABLE.write().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(map) = table.as_mut()
        && map.remove(&fd).is_some()
    {
        COUNT.fetch_sub(1, Ordering::AcqRel);
    }
}

/// After a successful open of `fd` with `flags`: a candidate when it can write a regular file
/// of an nvstack mount.
pub fn opened(fd: c_int, flags: c_int) {
    if fd < 0 || OFF.load(Ordering::Relaxed) || FORKED.load(Ordering::Relaxed) {
        return;
    }
    let acc = flags & libc::O_ACCMODE;
    if (acc != libc::O_WRONLY && acc != libc::O_RDWR) || flags & libc::O_PATH != 0 {
        return;
    }
    // SAFETY: a zeroed stat64 is a valid out-buffer.
    let mut st: libc::stat64 = unsafe { std::mem::zeroed() };
    // SAFETY: fd is open; st is a valid out-buffer.
    if unsafe { real::fstat64(fd, &raw mut st) } != 0 {
        return;
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFREG || !crate::mounts::is_nvstack(st.st_dev) {
        return;
    }
    insert(
        fd,
        Arc::new(OpenFile {
            append: AtomicBool::new(flags & libc::O_APPEND != 0),
            refused: AtomicBool::new(false),
            mapped: AtomicBool::new(false),
            writes: std::sync::atomic::AtomicU32::new(0),
            deleg: Mutex::new(None),
        }),
    );
}

/// Drops every delegation (a child after fork: the parent's live on in the parent).
pub fn forget_all() {
    FORKED.store(true, Ordering::Relaxed);
}

impl OpenFile {
    /// The live delegation of this open file, asked for when there is none (first write, or
    /// the last one was taken back); `None`: served through FUSE.
    fn delegation(&self, fd: c_int) -> Option<Arc<Deleg>> {
        let mut slot = lock(&self.deleg);
        if let Some(d) = slot.as_ref() {
            if !lock(&d.state).dead && control::state(&d.area) != control::RECALLED {
                return Some(Arc::clone(d));
            }
            *slot = None;
        }
        if self.refused.load(Ordering::Relaxed)
            || self.mapped.load(Ordering::Relaxed)
            || self.writes.fetch_add(1, Ordering::Relaxed) < ASK_AFTER.load(Ordering::Relaxed)
        {
            return None;
        }
        let Some(d) = grant(fd) else {
            self.refused.store(true, Ordering::Relaxed);
            return None;
        };
        let d = Arc::new(d);
        *slot = Some(Arc::clone(&d));
        Some(d)
    }

    /// The delegation if it is live, never asking for one.
    fn live(&self) -> Option<Arc<Deleg>> {
        let slot = lock(&self.deleg);
        let d = slot.as_ref()?;
        (!lock(&d.state).dead && control::state(&d.area) != control::RECALLED)
            .then(|| Arc::clone(d))
    }

    /// Ends the delegation before a call the library cannot serve beside it (mmap): the log
    /// merged, the daemon the only writer again, and none asked for again on this open.
    pub fn end(&self, fd: c_int) {
        self.mapped.store(true, Ordering::Relaxed);
        let Some(d) = lock(&self.deleg).take() else { return };
        let mut st = lock(&d.state);
        if st.dead {
            return;
        }
        st.dead = true;
        let mut buf = dio::merge_request(d.grant, dio::MERGE_END);
        // SAFETY: fd is open; buf is MERGE_BYTES long, as the command's size says.
        let _ =
            unsafe { real::ioctl(fd, libc::c_ulong::from(dio::MERGE), buf.as_mut_ptr().cast()) };
    }

    /// A write of `bufs` at `pos` (None: at the descriptor's offset, or the end with
    /// O_APPEND), served in the process; `None` when it is not (the caller calls the C
    /// library). The answer is the write's: bytes written, or -1 with errno set.
    pub fn write(&self, fd: c_int, pos: Option<u64>, bufs: &[&[u8]]) -> Option<isize> {
        let d = self.delegation(fd)?;
        let mut st = lock(&d.state);
        match control::enter(&d.area) {
            Ok(()) => {}
            Err(control::RECALLED) => {
                st.dead = true;
                return None;
            }
            Err(_) => return None, // a merge in progress: this one goes through FUSE
        }
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        // With O_APPEND every write goes to the end, pwrite too (as Linux does).
        let at = match pos {
            _ if self.append.load(Ordering::Relaxed) => st.kept.stat.st_size as u64,
            Some(p) => p,
            None => {
                // SAFETY: fd is open.
                let cur = unsafe { real::lseek64(fd, 0, libc::SEEK_CUR) };
                if cur < 0 {
                    control::leave(&d.area);
                    return None;
                }
                cur as u64
            }
        };
        if at.checked_add(total as u64).is_none_or(|end| end > direct::log::MAX_FILE_SIZE) {
            control::leave(&d.area);
            real::set_errno(libc::EFBIG);
            return Some(-1);
        }
        let joined;
        let data: &[u8] = if bufs.len() == 1 {
            bufs[0]
        } else {
            joined = bufs.concat();
            &joined
        };
        let (last_seq, inside, mut undone) = append_all(fd, &d, &mut st, at, data);
        if inside && !control::leave(&d.area) {
            // A merge began while the record was made: wait for its end, and write again
            // through the descriptor what it did not merge of a delegation it ended.
            if let Some(merged) = settle(&d.area) {
                st.dead = true;
                if merged < last_seq && undone.is_none() {
                    undone = Some(at);
                }
            }
        }
        if let Some(from) = undone {
            let skip = (from - at) as usize;
            if let Err(e) = write_through(fd, &data[skip..], from) {
                real::set_errno(e);
                return Some(-1);
            }
        }
        let end = at + total as u64;
        let now = now();
        let s = &mut st.kept.stat;
        if end as i64 > s.st_size {
            s.st_size = end as i64;
            s.st_blocks = end.div_ceil(512) as i64;
        }
        (s.st_mtime, s.st_mtime_nsec, s.st_ctime, s.st_ctime_nsec) = (now.0, now.1, now.0, now.1);
        if pos.is_none() {
            // SAFETY: fd is open.
            unsafe { real::lseek64(fd, end as i64, libc::SEEK_SET) };
        }
        Some(total as isize)
    }

    /// fsync or fdatasync: `Some(0)` when every write of the library is durable already (a
    /// live delegation: each was durable when it returned).
    pub fn sync(&self) -> Option<i32> {
        let d = self.live()?;
        control::count_fsync(&d.area);
        Some(0)
    }

    /// fstat: the attributes the library keeps, while it is the only writer.
    pub fn stat(&self) -> Option<libc::stat64> {
        let d = self.live()?;
        let st = lock(&d.state);
        Some(st.kept.stat)
    }

    /// ftruncate that grows (or keeps) the size: a truncate record. A shrinking one goes to
    /// the kernel (the daemon takes the delegation back first; the kernel's size follows).
    pub fn truncate(&self, fd: c_int, len: u64) -> Option<i32> {
        let d = self.delegation(fd)?;
        let mut st = lock(&d.state);
        if (len as i64) < st.kept.stat.st_size || len > direct::log::MAX_FILE_SIZE {
            return None;
        }
        control::enter(&d.area).ok()?;
        let mut w = LogWriter::resume(&d.area, d.grant, st.at, st.next_seq);
        let Ok(seq) = w.append(RecordKind::Truncate, len, &[]) else {
            control::leave(&d.area);
            return None;
        };
        (st.at, st.next_seq) = w.position();
        if !control::leave(&d.area) {
            if let Some(merged) = settle(&d.area) {
                st.dead = true;
                if merged < seq {
                    // SAFETY: fd is open.
                    return Some(unsafe { real::ftruncate64(fd, len as i64) });
                }
            }
        }
        let now = now();
        let s = &mut st.kept.stat;
        s.st_size = len as i64;
        s.st_blocks = len.div_ceil(512) as i64;
        (s.st_mtime, s.st_mtime_nsec, s.st_ctime, s.st_ctime_nsec) = (now.0, now.1, now.0, now.1);
        Some(0)
    }
}

/// Appends `data` at `at` as records (one per `MAX_RECORD_DATA`), asking the daemon to merge
/// when the log is full. Returns the last record's sequence number, whether the caller is
/// still inside the handshake, and the offset from which nothing is in the log (the caller
/// writes that rest through the descriptor).
fn append_all(
    fd: c_int,
    d: &Deleg,
    st: &mut DelegState,
    at: u64,
    data: &[u8],
) -> (u64, bool, Option<u64>) {
    let mut last_seq = 0;
    let mut off = at;
    for chunk in data.chunks(MAX_RECORD_DATA as usize) {
        loop {
            let mut w = LogWriter::resume(&d.area, d.grant, st.at, st.next_seq);
            if let Ok(seq) = w.append(RecordKind::Write, off, chunk) {
                (st.at, st.next_seq) = w.position();
                last_seq = seq;
                break;
            }
            // Full: the daemon merges and the log starts over (outside the handshake: the
            // daemon's merge waits for no writer). A merge that began meanwhile ended or
            // kept the delegation; either way the records so far are the daemon's.
            control::leave(&d.area);
            let mut buf = dio::merge_request(d.grant, 0);
            // SAFETY: fd is open; buf is MERGE_BYTES long, as the command's size says.
            let r = unsafe {
                real::ioctl(fd, libc::c_ulong::from(dio::MERGE), buf.as_mut_ptr().cast())
            };
            match dio::merge_answer_decode(&buf) {
                Some((next, _)) if r == 0 => {
                    st.at = direct::HEADER_BYTES;
                    st.next_seq = next;
                }
                _ => {
                    st.dead = true;
                    return (last_seq, false, Some(off));
                }
            }
            if control::enter(&d.area).is_err() {
                return (last_seq, false, Some(off));
            }
        }
        off += chunk.len() as u64;
    }
    (last_seq, true, None)
}

/// After a [`control::leave`] that found a merge begun: waits for its end (bounded). `Some`
/// with the last record merged when it ended the delegation.
fn settle(area: &MmapRegion) -> Option<u64> {
    let mut waited = 0u64;
    control::settled(area, &mut || {
        if waited >= SETTLE_WAIT_US {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_micros(50));
        waited += 50;
        true
    })
}

/// The realtime clock (seconds, nanoseconds).
fn now() -> (i64, i64) {
    // SAFETY: a zeroed timespec is a valid out-buffer.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &raw mut ts) };
    (ts.tv_sec, ts.tv_nsec)
}

/// `data` written at exactly `off` through the descriptor (never at the end, also with
/// O_APPEND: RWF_NOAPPEND), every byte or an errno.
fn write_through(fd: c_int, mut data: &[u8], mut off: u64) -> Result<(), c_int> {
    const RWF_NOAPPEND: c_int = 0x20;
    while !data.is_empty() {
        let iov = libc::iovec { iov_base: data.as_ptr().cast_mut().cast(), iov_len: data.len() };
        // SAFETY: fd is open; iov describes `data`.
        let n = unsafe { real::pwritev64v2(fd, &raw const iov, 1, off as i64, RWF_NOAPPEND) };
        if n < 0 {
            // SAFETY: __errno_location is the calling thread's.
            let e = unsafe { *libc::__errno_location() };
            if e == libc::EINTR {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(libc::EIO);
        }
        data = &data[n as usize..];
        off += n as u64;
    }
    Ok(())
}

/// Asks the daemon for a delegation of the file open as `fd` and maps its log.
fn grant(fd: c_int) -> Option<Deleg> {
    // SAFETY: a zeroed stat64 is a valid out-buffer.
    let mut stat: libc::stat64 = unsafe { std::mem::zeroed() };
    // SAFETY: fd is open; stat is a valid out-buffer.
    if unsafe { real::fstat64(fd, &raw mut stat) } != 0 {
        return None;
    }
    let mut buf = dio::delegate_request();
    // SAFETY: fd is open; buf is DELEGATE_BYTES long, as the command's size says.
    if unsafe { real::ioctl(fd, libc::c_ulong::from(dio::DELEGATE), buf.as_mut_ptr().cast()) } != 0
    {
        return None;
    }
    let g = dio::Granted::decode(&buf)?;
    let path = std::path::PathBuf::from(
        <std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(g.path.clone()),
    );
    let area = MmapRegion::open(&path, MmapOptions { shared: true, ..MmapOptions::default() });
    let area = match area {
        Ok(area) if area.len() == g.log_len => area,
        _ => {
            // The daemon holds a delegation this process cannot use: give it back.
            let mut m = dio::merge_request(g.grant, dio::MERGE_END);
            // SAFETY: as above.
            let _ =
                unsafe { real::ioctl(fd, libc::c_ulong::from(dio::MERGE), m.as_mut_ptr().cast()) };
            return None;
        }
    };
    stat.st_size = g.size as i64;
    Some(Deleg {
        grant: g.grant,
        area,
        state: Mutex::new(DelegState {
            at: direct::HEADER_BYTES,
            next_seq: g.first_seq,
            kept: Kept { stat },
            dead: false,
        }),
    })
}
