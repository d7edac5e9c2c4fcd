//! Block and inode allocation: the free-block [`Allocator`] (lowest-first, with a goal for
//! contiguous extents), inode numbers, freeing an inode when its last name and holder go, and
//! statfs (rules 8-10).

use std::collections::{BTreeMap, BTreeSet};

use super::inode::{Content, State};
use super::{BLOCK_SIZE, FIRST_INO, MemConfig, MemLower, NAME_MAX, err};
use crate::Result;
use crate::types::StatFs;

/// Free blocks as ranges (start -> length) over 1..=total, lowest-first (rule 9).
#[derive(Clone, Debug)]
pub(super) struct Allocator {
    free: BTreeMap<u64, u64>,
    pub(super) free_count: u64,
}

impl Allocator {
    pub(super) fn with_used(total: u64, used: &BTreeSet<u64>) -> Allocator {
        let mut free = BTreeMap::new();
        let mut start = 1;
        let mut used_count = 0;
        for &b in used.range(1..=total) {
            if b > start {
                free.insert(start, b - start);
            }
            start = b + 1;
            used_count += 1;
        }
        if start <= total {
            free.insert(start, total + 1 - start);
        }
        Allocator { free, free_count: total - used_count }
    }

    /// Marks `b` used if it is free.
    fn take(&mut self, b: u64) -> bool {
        let Some((&s, &len)) = self.free.range(..=b).next_back() else { return false };
        if b >= s + len {
            return false;
        }
        self.free.remove(&s);
        if b > s {
            self.free.insert(s, b - s);
        }
        if b + 1 < s + len {
            self.free.insert(b + 1, s + len - b - 1);
        }
        self.free_count -= 1;
        true
    }

    pub(super) fn alloc(&mut self, goal: Option<u64>) -> Option<u64> {
        if let Some(g) = goal
            && self.take(g)
        {
            return Some(g);
        }
        let (&s, _) = self.free.iter().next()?;
        assert!(self.take(s));
        Some(s)
    }

    pub(super) fn release(&mut self, b: u64) {
        if b == 0 {
            return; // "no block" (a crash image out of space)
        }
        assert!(!self.free.contains_key(&b), "block {b} freed twice");
        let (mut start, mut len) = (b, 1);
        if let Some((&s, &l)) = self.free.range(..b).next_back() {
            assert!(s + l <= b, "block {b} freed twice");
            if s + l == b {
                self.free.remove(&s);
                start = s;
                len += l;
            }
        }
        if let Some(l) = self.free.remove(&(b + 1)) {
            len += l;
        }
        self.free.insert(start, len);
        self.free_count += 1;
    }
}

impl State {
    pub(super) fn alloc_ino(&self, config: &MemConfig) -> Result<u64> {
        if self.live.len() as u64 >= config.inodes {
            return err(libc::ENOSPC);
        }
        Ok((FIRST_INO..u64::MAX)
            .find(|i| !self.live.contains_key(i) && !self.durable.contains_key(i))
            .expect("inode numbers do not run out"))
    }

    pub(super) fn release(&mut self, ino: u64) {
        let count = self.refs.get_mut(&ino).expect("a held inode is counted");
        *count -= 1;
        if *count == 0 {
            self.refs.remove(&ino);
            self.free_if_unused(ino);
        }
    }

    /// Rule 8: frees an inode with no name and no holder.
    pub(super) fn free_if_unused(&mut self, ino: u64) {
        if self.refs.contains_key(&ino) || self.get(ino).nlink > 0 {
            return;
        }
        let inode = self.live.remove(&ino).expect("live");
        match inode.content {
            Content::File(f) => f.blocks.values().for_each(|b| self.alloc.release(b.phys)),
            Content::Dir(d) => self.alloc.release(d.phys),
            Content::Symlink(_) | Content::Special => {}
        }
    }
}

impl MemLower {
    pub(super) fn do_statfs(&self) -> StatFs {
        let st = self.fs.lock();
        let c = &self.fs.config;
        StatFs {
            blocks: c.blocks,
            bfree: st.alloc.free_count,
            bavail: st.alloc.free_count,
            files: c.inodes,
            ffree: c.inodes.saturating_sub(st.live.len() as u64),
            bsize: BLOCK_SIZE as u32,
            namelen: NAME_MAX as u32,
            frsize: BLOCK_SIZE as u32,
            fsid: c.fsid,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;

    use super::*;
    use crate::LowerFs;
    use crate::creds::Creds;
    use crate::types::{Errno, SetAttr};

    const ROOT: Creds = Creds { uid: 0, gid: 0, groups: Vec::new() };

    fn small(blocks: u64) -> MemLower {
        MemLower::new(MemConfig { blocks, ..MemConfig::default() })
    }

    #[test]
    fn allocator_prefers_the_goal_then_the_lowest_and_merges_on_release() {
        let mut a = Allocator::with_used(10, &BTreeSet::from([3]));
        assert_eq!(a.free_count, 9);
        assert_eq!(a.alloc(Some(5)), Some(5));
        assert_eq!(a.alloc(Some(5)), Some(1), "goal taken: lowest free");
        assert_eq!(a.alloc(None), Some(2));
        assert_eq!(a.alloc(None), Some(4));
        a.release(4);
        a.release(2);
        a.release(1);
        assert_eq!(a.free.get(&1), Some(&2));
        assert_eq!(a.free.get(&4), Some(&1));
        assert_eq!(a.free_count, 8);
    }

    #[test]
    fn a_full_file_system_gives_short_writes_then_enospc() {
        // The root directory holds one of the 4 blocks.
        let l = small(4);
        let (_, _, f) = l.create(&ROOT, l.root(), OsStr::new("f"), 0o644, libc::O_RDWR).unwrap();
        assert_eq!(l.write(&f, 100, &vec![7u8; 5 * 4096]).unwrap(), 3 * 4096 - 100);
        assert_eq!(l.write(&f, 3 * 4096, b"x").unwrap_err(), Errno(libc::ENOSPC));
        assert_eq!(l.statfs(l.root()).unwrap().bfree, 0);
        assert_eq!(
            l.mkdir(&ROOT, l.root(), OsStr::new("d"), 0o755).unwrap_err(),
            Errno(libc::ENOSPC)
        );
        l.setattr(l.root(), None, &SetAttr::default()).unwrap();
        let node = l.lookup(l.root(), OsStr::new("f")).unwrap().0;
        l.setattr(&node, Some(&f), &SetAttr { size: Some(0), ..SetAttr::default() }).unwrap();
        assert_eq!(l.statfs(l.root()).unwrap().bfree, 3);
    }

    #[test]
    fn freed_inode_numbers_are_reused_only_when_no_durable_version_names_them() {
        let l = MemLower::default();
        let (n, _, f) = l.create(&ROOT, l.root(), OsStr::new("a"), 0o644, libc::O_RDWR).unwrap();
        assert_eq!(n.ino, FIRST_INO);
        l.sync_all();
        l.unlink(l.root(), OsStr::new("a")).unwrap();
        drop((n, f));
        let (n2, _) = l.mkdir(&ROOT, l.root(), OsStr::new("b"), 0o755).unwrap();
        assert_eq!(n2.ino, FIRST_INO + 1, "the durable root still names inode 11");
        l.sync_all();
        l.rmdir(l.root(), OsStr::new("b")).unwrap();
        drop(n2);
        l.sync_all();
        let (n3, _) = l.mkdir(&ROOT, l.root(), OsStr::new("c"), 0o755).unwrap();
        assert_eq!(n3.ino, FIRST_INO);
    }
}
