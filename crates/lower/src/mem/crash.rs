//! Durability and crashes: fsync and syncfs make live versions durable, [`MemLower::crash`] and
//! [`MemLower::crash_with`] build the file system a power cut would leave, rebuilt from the
//! durable (or mixed) versions as fsck would (rules 2-7).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::ffi::OsString;

use super::alloc::Allocator;
use super::inode::{Content, Inode, State};
use super::{MemFile, MemLower, ROOT_INO, err};
use crate::Result;
use crate::types::FileKind;

impl State {
    /// Rules 2 and 3: the live version of `ino` becomes durable.
    fn persist(&mut self, ino: u64, datasync: bool) {
        let live = self.get(ino).clone();
        let version = match (datasync, self.durable.get(&ino)) {
            (true, Some(old)) => Inode { content: live.content, nlink: live.nlink, ..old.clone() },
            _ => live,
        };
        if let Some(dir) = version.dir() {
            for e in dir.entries.values() {
                if !self.durable.contains_key(&e.ino) {
                    let skeleton = self.get(e.ino).skeleton();
                    self.durable.insert(e.ino, skeleton);
                }
            }
            self.durable.insert(ino, version);
            self.collect_durable();
        } else {
            self.durable.insert(ino, version);
        }
    }

    /// Drops durable versions no durable entry reaches and no live name can bring back.
    fn collect_durable(&mut self) {
        let mut reached = BTreeSet::from([ROOT_INO]);
        let mut stack = vec![ROOT_INO];
        while let Some(ino) = stack.pop() {
            if let Some(dir) = self.durable.get(&ino).and_then(Inode::dir) {
                for e in dir.entries.values() {
                    if reached.insert(e.ino) {
                        stack.push(e.ino);
                    }
                }
            }
        }
        let live = &self.live;
        self.durable
            .retain(|ino, _| reached.contains(ino) || live.get(ino).is_some_and(|i| i.nlink > 0));
    }
}

/// SplitMix64: a tiny, well-mixed, seedable generator (rule 7).
#[derive(Debug)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn coin(&mut self) -> bool {
        self.next() & 1 == 1
    }
}

/// Rule 7: `old` (durable) with each part independently replaced by `new`'s (live).
fn mix(old: &Inode, new: &Inode, rng: &mut SplitMix64) -> Inode {
    let mut m = old.clone();
    if rng.coin() {
        (m.mode, m.uid, m.gid) = (new.mode, new.uid, new.gid);
        (m.atime, m.mtime, m.ctime) = (new.atime, new.mtime, new.ctime);
    }
    if rng.coin() {
        m.xattrs.clone_from(&new.xattrs);
    }
    match (&mut m.content, &new.content) {
        (Content::File(a), Content::File(b)) => {
            if rng.coin() {
                a.size = b.size;
            }
            let keys: BTreeSet<u64> = a.blocks.keys().chain(b.blocks.keys()).copied().collect();
            for k in keys {
                if rng.coin() {
                    match b.blocks.get(&k) {
                        Some(block) => a.blocks.insert(k, block.clone()),
                        None => a.blocks.remove(&k),
                    };
                }
            }
        }
        (Content::Dir(a), Content::Dir(b)) => {
            let names: BTreeSet<OsString> =
                a.entries.keys().chain(b.entries.keys()).cloned().collect();
            for name in names {
                if rng.coin() {
                    match b.entries.get(&name) {
                        Some(e) => a.entries.insert(name, *e),
                        None => a.entries.remove(&name),
                    };
                }
            }
            a.next_cookie = a.next_cookie.max(b.next_cookie);
        }
        _ => {}
    }
    m
}

impl MemLower {
    /// syncfs: every live inode becomes durable (rule 5).
    pub fn sync_all(&self) {
        self.fs.syncs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let mut st = self.fs.lock();
        let live: Vec<(u64, Inode)> = st.live.iter().map(|(&i, n)| (i, n.clone())).collect();
        st.durable.extend(live);
        st.collect_durable();
    }

    /// Whole-file-system syncs (`sync_all`, syncfs) so far: a state saved before the last one
    /// can no longer be what a crash leaves.
    pub fn syncs(&self) -> u64 {
        self.fs.syncs.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Inode numbers whose live version differs from the durable one (pending changes).
    pub fn pending(&self) -> Vec<u64> {
        let st = self.fs.lock();
        st.live.iter().filter(|(i, n)| st.durable.get(i) != Some(*n)).map(|(&i, _)| i).collect()
    }

    /// An independent copy of the live state (as if everything had just been synced), e.g. to
    /// try an operation on a copy first. Inode numbers are kept.
    #[must_use]
    pub fn fork(&self) -> MemLower {
        let versions = self.fs.lock().live.clone();
        self.image(versions)
    }

    /// The file system a power cut now would leave: the durable state only (rule 6).
    #[must_use]
    pub fn crash(&self) -> MemLower {
        let versions = self.fs.lock().durable.clone();
        self.image(versions)
    }

    /// A power cut after arbitrary write-back: per object a seeded mix of durable and pending
    /// state (rule 7).
    #[must_use]
    pub fn crash_with(&self, seed: u64) -> MemLower {
        self.crash_mixed(seed, false)
    }

    /// A power cut of a journaling file system (ext4, xfs, btrfs): its namespace commits in
    /// order, so every directory is as of the last sync or every directory is as now (one
    /// seeded choice for all: no other prefix of pending namespace changes exists in this
    /// model), while file data and attributes are a seeded per-object mix as in `crash_with`.
    #[must_use]
    pub fn crash_ordered(&self, seed: u64) -> MemLower {
        self.crash_mixed(seed, true)
    }

    /// `crash_with` (`ordered` false) or `crash_ordered`: files a seeded per-object mix;
    /// directories too, or all as of the last sync or all as now.
    fn crash_mixed(&self, seed: u64, ordered: bool) -> MemLower {
        let st = self.fs.lock();
        let mut rng = SplitMix64(seed);
        let names_live = ordered && rng.coin();
        let inos: BTreeSet<u64> = st.live.keys().chain(st.durable.keys()).copied().collect();
        let mut versions = BTreeMap::new();
        for ino in inos {
            let (durable, live) = (st.durable.get(&ino), st.live.get(&ino));
            let is_dir = live.or(durable).is_some_and(|i| i.kind() == FileKind::Directory);
            let version = match (durable, live) {
                (_, Some(l)) if ordered && is_dir && names_live => l.clone(),
                (Some(d), _) if ordered && is_dir => d.clone(),
                (None, Some(l)) if ordered && is_dir => l.skeleton(),
                (Some(d), Some(l)) => mix(d, l, &mut rng),
                (None, Some(l)) => mix(&l.skeleton(), l, &mut rng),
                (Some(d), None) => d.clone(),
                (None, None) => unreachable!("from the union of both"),
            };
            versions.insert(ino, version);
        }
        drop(st);
        self.image(versions)
    }

    /// Rule 6: the tree reachable from the root in `versions`, as fsck would leave it.
    fn image(&self, mut versions: BTreeMap<u64, Inode>) -> MemLower {
        let config = self.fs.config.clone();
        let mut parents = BTreeMap::from([(ROOT_INO, ROOT_INO)]);
        let mut links: BTreeMap<u64, u32> = BTreeMap::new();
        let mut queue = VecDeque::from([ROOT_INO]);
        while let Some(dir) = queue.pop_front() {
            let d = versions[&dir].dir().expect("queued inodes are directories");
            let mut dropped = Vec::new();
            let mut subdirs = 0;
            for (name, e) in &d.entries {
                match versions.get(&e.ino).map(Inode::kind) {
                    None => dropped.push(name.clone()),
                    Some(FileKind::Directory) => {
                        if let std::collections::btree_map::Entry::Vacant(v) = parents.entry(e.ino)
                        {
                            v.insert(dir);
                            queue.push_back(e.ino);
                            subdirs += 1;
                        } else {
                            dropped.push(name.clone());
                        }
                    }
                    Some(_) => *links.entry(e.ino).or_default() += 1,
                }
            }
            let inode = versions.get_mut(&dir).expect("present");
            inode.nlink = 2 + subdirs;
            let d = inode.dir_mut();
            d.parent = parents[&dir];
            for name in dropped {
                d.entries.remove(&name);
            }
        }
        let mut out: BTreeMap<u64, Inode> = versions
            .into_iter()
            .filter(|(ino, _)| parents.contains_key(ino) || links.contains_key(ino))
            .collect();
        for (ino, inode) in &mut out {
            if let Some(&n) = links.get(ino) {
                inode.nlink = n;
            }
            if let Content::File(f) = &mut inode.content {
                f.normalize();
            }
        }
        let alloc = place_blocks(&mut out, config.blocks);
        let state = State { durable: out.clone(), live: out, refs: BTreeMap::new(), alloc };
        Self::from_state(config, state)
    }

    pub(super) fn do_fsync(&self, file: &MemFile, datasync: bool) -> Result<()> {
        let mut st = self.fs.lock();
        match st.get(file.node.ino).kind() {
            FileKind::Regular | FileKind::Directory => {}
            _ => return err(libc::EINVAL),
        }
        st.persist(file.node.ino, datasync);
        Ok(())
    }
}

/// Gives every block of a crash image a distinct physical block (the first claim in inode
/// order keeps its number) and returns the allocator of the rest.
fn place_blocks(inodes: &mut BTreeMap<u64, Inode>, total: u64) -> Allocator {
    let mut used = BTreeSet::new();
    let mut moved: Vec<(u64, Option<u64>)> = Vec::new();
    for (&ino, inode) in inodes.iter() {
        match &inode.content {
            Content::File(f) => {
                for (&i, b) in &f.blocks {
                    if b.phys == 0 || b.phys > total || !used.insert(b.phys) {
                        moved.push((ino, Some(i)));
                    }
                }
            }
            Content::Dir(d) => {
                if d.phys == 0 || d.phys > total || !used.insert(d.phys) {
                    moved.push((ino, None));
                }
            }
            Content::Symlink(_) | Content::Special => {}
        }
    }
    let mut alloc = Allocator::with_used(total, &used);
    for (ino, index) in moved {
        let phys = alloc.alloc(None);
        let inode = inodes.get_mut(&ino).expect("present");
        match (index, &mut inode.content) {
            (Some(i), Content::File(f)) => match phys {
                Some(p) => f.blocks.get_mut(&i).expect("present").phys = p,
                None => drop(f.blocks.remove(&i)),
            },
            (None, Content::Dir(d)) => d.phys = phys.unwrap_or(0),
            _ => unreachable!("recorded from the same content"),
        }
    }
    alloc
}

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;

    use super::*;
    use crate::LowerFs;
    use crate::creds::Creds;
    use crate::types::SetAttr;

    const ROOT: Creds = Creds { uid: 0, gid: 0, groups: Vec::new() };

    #[test]
    fn crash_images_have_one_block_per_physical_number() {
        let l = MemLower::default();
        let (_, _, a) = l.create(&ROOT, l.root(), OsStr::new("a"), 0o644, libc::O_RDWR).unwrap();
        l.write(&a, 0, &[1u8; 8192]).unwrap();
        l.sync_all();
        // Free a's blocks live, then give them to b: durable a and live b share numbers.
        let node = l.lookup(l.root(), OsStr::new("a")).unwrap().0;
        l.setattr(&node, Some(&a), &SetAttr { size: Some(0), ..SetAttr::default() }).unwrap();
        let (_, _, b) = l.create(&ROOT, l.root(), OsStr::new("b"), 0o644, libc::O_RDWR).unwrap();
        l.write(&b, 0, &[2u8; 8192]).unwrap();
        for seed in 0..32 {
            let c = l.crash_with(seed);
            let st = c.fs.lock();
            let mut phys = BTreeSet::new();
            for inode in st.live.values() {
                if let Content::File(f) = &inode.content {
                    for b in f.blocks.values() {
                        assert!(phys.insert(b.phys), "seed {seed}: block {} twice", b.phys);
                    }
                }
            }
        }
    }
}
