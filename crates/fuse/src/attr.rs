//! Conversions between the lower adapter's plain data and fuser's types.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{FileAttr, FileType, INodeNo};
use lower::{Attr, FileKind, TimeSet};

pub fn time(t: (i64, u32)) -> SystemTime {
    match u64::try_from(t.0) {
        Ok(secs) => UNIX_EPOCH + Duration::new(secs, t.1),
        Err(_) => UNIX_EPOCH - Duration::new(t.0.unsigned_abs(), 0) + Duration::new(0, t.1),
    }
}

pub fn time_set(t: fuser::TimeOrNow) -> TimeSet {
    match t {
        fuser::TimeOrNow::Now => TimeSet::Now,
        fuser::TimeOrNow::SpecificTime(st) => match st.duration_since(UNIX_EPOCH) {
            Ok(d) => TimeSet::At(i64::try_from(d.as_secs()).unwrap_or(i64::MAX), d.subsec_nanos()),
            Err(e) => {
                let d = e.duration();
                let (mut secs, mut nanos) =
                    (-i64::try_from(d.as_secs()).unwrap_or(i64::MAX), d.subsec_nanos());
                if nanos > 0 {
                    secs -= 1;
                    nanos = 1_000_000_000 - nanos;
                }
                TimeSet::At(secs, nanos)
            }
        },
    }
}

pub fn kind(k: FileKind) -> FileType {
    match k {
        FileKind::Regular => FileType::RegularFile,
        FileKind::Directory => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDevice => FileType::CharDevice,
        FileKind::BlockDevice => FileType::BlockDevice,
    }
}

pub fn file_attr(node_id: u64, a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(node_id),
        size: a.size,
        blocks: a.blocks,
        atime: time(a.atime),
        mtime: time(a.mtime),
        ctime: time(a.ctime),
        crtime: UNIX_EPOCH,
        kind: kind(a.kind()),
        perm: (a.mode & 0o7777) as u16,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev as u32,
        blksize: a.blksize,
        flags: 0,
    }
}

/// The attributes of a negative entry: node 0 tells the kernel that the name does not exist
/// (FUSE's "zero nodeid is the same as ENOENT, but with a valid timeout"); the rest is unused.
pub fn negative_entry() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 0,
        flags: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip_including_before_the_epoch() {
        for t in [(0, 0), (1_700_000_000, 123_456_789), (-1, 500_000_000), (-86_400, 0)] {
            let st = time(t);
            assert_eq!(
                time_set(fuser::TimeOrNow::SpecificTime(st)),
                TimeSet::At(t.0, t.1),
                "{t:?}"
            );
        }
    }
}
