//! Names and directories: name checks, lookup, creating objects (create, mkdir, mknod,
//! symlink), link, unlink, rmdir, rename and readdir with stable cookies (rules 12-13).

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;

use super::inode::{Content, Dentry, DirData, FileData, Inode, State};
use super::{
    COOKIE_DOT, COOKIE_DOTDOT, COOKIE_FIRST, LINK_MAX, MemFile, MemLower, MemNode, NAME_MAX,
    ROOT_INO, SYMLINK_MAX, err, hold,
};
use crate::Result;
use crate::creds::Creds;
use crate::types::{Attr, DirEntry, Errno, FileKind};

fn check_name(name: &OsStr) -> Result<()> {
    let b = name.as_bytes();
    if b.is_empty() {
        return err(libc::ENOENT);
    }
    if b.len() > NAME_MAX {
        return err(libc::ENAMETOOLONG);
    }
    if b.contains(&b'/') || b.contains(&0) {
        return err(libc::EINVAL);
    }
    Ok(())
}

fn is_dot(name: &OsStr) -> bool {
    name == "." || name == ".."
}

impl State {
    /// `ino` as the parent of a name operation: ENOTDIR if it is not a directory, ENOENT if it
    /// has been removed.
    fn parent_dir(&self, ino: u64) -> Result<&DirData> {
        let inode = self.get(ino);
        let Some(dir) = inode.dir() else { return err(libc::ENOTDIR) };
        if inode.nlink == 0 {
            return err(libc::ENOENT);
        }
        Ok(dir)
    }

    fn child(&self, dir: u64, name: &OsStr) -> Result<Option<u64>> {
        Ok(self.parent_dir(dir)?.entries.get(name).map(|e| e.ino))
    }

    pub(super) fn lookup(&self, dir: u64, name: &OsStr) -> Result<u64> {
        let inode = self.get(dir);
        let Some(d) = inode.dir() else { return err(libc::ENOTDIR) };
        if name == "." {
            return Ok(dir);
        }
        if inode.nlink == 0 {
            return err(libc::ENOENT);
        }
        if name == ".." {
            return Ok(d.parent);
        }
        check_name(name)?;
        self.child(dir, name)?.ok_or(Errno(libc::ENOENT))
    }

    /// Whether `ancestor` is `dir` or one of its ancestors.
    fn is_ancestor_or_self(&self, ancestor: u64, dir: u64) -> bool {
        let mut cur = dir;
        loop {
            if cur == ancestor {
                return true;
            }
            if cur == ROOT_INO {
                return false;
            }
            cur = self.get(cur).dir().expect("parents are directories").parent;
        }
    }
}

/// What a create makes.
enum NewKind {
    File,
    Dir,
    Symlink(Vec<u8>),
    /// FIFO, socket or device, with its device number.
    Special(u64),
}

impl MemLower {
    fn make(
        &self,
        st: &mut State,
        creds: &Creds,
        parent: u64,
        name: &OsStr,
        mode: u32,
        kind: NewKind,
    ) -> Result<u64> {
        st.parent_dir(parent)?;
        if is_dot(name) {
            return err(libc::EEXIST);
        }
        check_name(name)?;
        if st.child(parent, name)?.is_some() {
            return err(libc::EEXIST);
        }
        let ino = st.alloc_ino(&self.fs.config)?;
        let p = st.get(parent);
        let sgid_parent = p.mode & libc::S_ISGID != 0;
        let gid = if sgid_parent { p.gid } else { creds.gid };
        let mut mode = mode;
        if matches!(kind, NewKind::Dir) && sgid_parent {
            mode |= libc::S_ISGID;
        }
        // mode_strip_sgid: a group-executable setgid file in a setgid directory keeps S_ISGID
        // only if the creator is in that group (or privileged: fsuid 0).
        let sgid_x = libc::S_ISGID | libc::S_IXGRP;
        if !matches!(kind, NewKind::Dir)
            && mode & sgid_x == sgid_x
            && sgid_parent
            && creds.uid != 0
            && creds.gid != p.gid
            && !creds.groups.contains(&p.gid)
        {
            mode &= !libc::S_ISGID;
        }
        let rdev = if let NewKind::Special(rdev) = kind { rdev } else { 0 };
        let content = match kind {
            NewKind::File => Content::File(FileData::default()),
            NewKind::Dir => {
                let Some(phys) = st.alloc.alloc(None) else { return err(libc::ENOSPC) };
                Content::Dir(DirData {
                    entries: BTreeMap::new(),
                    next_cookie: COOKIE_FIRST,
                    parent,
                    phys,
                })
            }
            NewKind::Symlink(target) => Content::Symlink(target),
            NewKind::Special(_) => Content::Special,
        };
        let is_dir = matches!(content, Content::Dir(_));
        let now = self.fs.now();
        let inode = Inode {
            generation: super::inode::next_generation(),
            mode,
            uid: creds.uid,
            gid,
            nlink: if is_dir { 2 } else { 1 },
            rdev,
            atime: now,
            mtime: now,
            ctime: now,
            xattrs: BTreeMap::new(),
            content,
        };
        st.live.insert(ino, inode);
        let p = st.get_mut(parent);
        p.touch(now);
        if is_dir {
            p.nlink += 1;
        }
        let d = p.dir_mut();
        d.entries.insert(name.to_owned(), Dentry { ino, cookie: d.next_cookie });
        d.next_cookie += 1;
        Ok(ino)
    }

    pub(super) fn entry(&self, st: &mut State, ino: u64) -> (MemNode, Attr) {
        let attr = st.attr(&self.fs.config, ino);
        (hold(&self.fs, st, ino), attr)
    }

    fn new_object(
        &self,
        creds: &Creds,
        parent: &MemNode,
        name: &OsStr,
        mode: u32,
        kind: NewKind,
    ) -> Result<(MemNode, Attr)> {
        let mut st = self.fs.lock();
        let ino = self.make(&mut st, creds, parent.ino, name, mode, kind)?;
        Ok(self.entry(&mut st, ino))
    }

    pub(super) fn rename_locked(
        &self,
        st: &mut State,
        (parent, name): (u64, &OsStr),
        (newparent, newname): (u64, &OsStr),
        flags: u32,
    ) -> Result<()> {
        let exchange = flags & libc::RENAME_EXCHANGE != 0;
        let noreplace = flags & libc::RENAME_NOREPLACE != 0;
        if flags & !(libc::RENAME_EXCHANGE | libc::RENAME_NOREPLACE) != 0 || (exchange && noreplace)
        {
            return err(libc::EINVAL);
        }
        st.parent_dir(parent)?;
        st.parent_dir(newparent)?;
        if is_dot(name) {
            return err(libc::EBUSY);
        }
        if is_dot(newname) {
            return err(if noreplace { libc::EEXIST } else { libc::EBUSY });
        }
        check_name(name)?;
        check_name(newname)?;
        let src = st.child(parent, name)?.ok_or(Errno(libc::ENOENT))?;
        let dst = st.child(newparent, newname)?;
        if exchange && dst.is_none() {
            return err(libc::ENOENT);
        }
        if noreplace && dst.is_some() {
            return err(libc::EEXIST);
        }
        // lock_rename's traps: the source may not be an ancestor of the new parent, the
        // target not an ancestor of the old parent.
        if st.is_ancestor_or_self(src, newparent) {
            return err(libc::EINVAL);
        }
        if let Some(d) = dst
            && st.is_ancestor_or_self(d, parent)
        {
            return err(if exchange { libc::EINVAL } else { libc::ENOTEMPTY });
        }
        if dst == Some(src) {
            return Ok(());
        }
        let src_dir = st.get(src).kind() == FileKind::Directory;
        let dst_dir = dst.is_some_and(|d| st.get(d).kind() == FileKind::Directory);
        if let Some(d) = dst
            && !exchange
        {
            if src_dir && !dst_dir {
                return err(libc::ENOTDIR);
            }
            if !src_dir && dst_dir {
                return err(libc::EISDIR);
            }
            if dst_dir && !st.get(d).dir().expect("dir").entries.is_empty() {
                return err(libc::ENOTEMPTY);
            }
        }
        let now = self.fs.now();
        if exchange {
            let d = dst.expect("checked");
            st.get_mut(parent).dir_mut().entries.get_mut(name).expect("found").ino = d;
            st.get_mut(newparent).dir_mut().entries.get_mut(newname).expect("found").ino = src;
            self.reparent(st, src, parent, newparent);
            self.reparent(st, d, newparent, parent);
            st.get_mut(d).ctime = now;
        } else {
            st.get_mut(parent).dir_mut().entries.remove(name);
            if let Some(d) = dst {
                let victim = st.get_mut(d);
                victim.ctime = now;
                if dst_dir {
                    victim.nlink = 0;
                    st.get_mut(newparent).nlink -= 1;
                } else {
                    victim.nlink -= 1;
                }
                st.get_mut(newparent).dir_mut().entries.get_mut(newname).expect("found").ino = src;
                st.free_if_unused(d);
            } else {
                let nd = st.get_mut(newparent).dir_mut();
                nd.entries.insert(newname.to_owned(), Dentry { ino: src, cookie: nd.next_cookie });
                nd.next_cookie += 1;
            }
            self.reparent(st, src, parent, newparent);
        }
        st.get_mut(src).ctime = now;
        st.get_mut(parent).touch(now);
        st.get_mut(newparent).touch(now);
        Ok(())
    }

    /// A directory moved from `from` to `to`: ".." and the parents' link counts follow.
    #[allow(clippy::unused_self)] // kept a method beside rename_locked for reading order
    fn reparent(&self, st: &mut State, ino: u64, from: u64, to: u64) {
        if from == to || st.get(ino).kind() != FileKind::Directory {
            return;
        }
        st.get_mut(ino).dir_mut().parent = to;
        st.get_mut(from).nlink -= 1;
        st.get_mut(to).nlink += 1;
    }

    pub(super) fn do_mknod(
        &self,
        creds: &Creds,
        parent: &MemNode,
        name: &OsStr,
        mode: u32,
        rdev: u64,
    ) -> Result<(MemNode, Attr)> {
        let kind = match mode & libc::S_IFMT {
            0 | libc::S_IFREG => NewKind::File,
            libc::S_IFIFO | libc::S_IFSOCK => NewKind::Special(0),
            libc::S_IFCHR | libc::S_IFBLK => NewKind::Special(rdev),
            libc::S_IFDIR => return err(libc::EPERM),
            _ => return err(libc::EINVAL),
        };
        let ty = if mode & libc::S_IFMT == 0 { libc::S_IFREG } else { mode & libc::S_IFMT };
        let mode = ty | (mode & 0o7777 & !self.fs.config.umask);
        self.new_object(creds, parent, name, mode, kind)
    }

    pub(super) fn do_mkdir(
        &self,
        creds: &Creds,
        parent: &MemNode,
        name: &OsStr,
        mode: u32,
    ) -> Result<(MemNode, Attr)> {
        let mode = libc::S_IFDIR | (mode & 0o1777 & !self.fs.config.umask);
        self.new_object(creds, parent, name, mode, NewKind::Dir)
    }

    pub(super) fn do_symlink(
        &self,
        creds: &Creds,
        parent: &MemNode,
        name: &OsStr,
        target: &OsStr,
    ) -> Result<(MemNode, Attr)> {
        let t = target.as_bytes();
        if t.is_empty() {
            return err(libc::ENOENT);
        }
        if t.len() > SYMLINK_MAX {
            return err(libc::ENAMETOOLONG);
        }
        if t.contains(&0) {
            return err(libc::EINVAL);
        }
        let kind = NewKind::Symlink(t.to_vec());
        self.new_object(creds, parent, name, libc::S_IFLNK | 0o777, kind)
    }

    pub(super) fn do_link(
        &self,
        node: &MemNode,
        newparent: &MemNode,
        newname: &OsStr,
    ) -> Result<Attr> {
        let mut st = self.fs.lock();
        st.parent_dir(newparent.ino)?;
        if is_dot(newname) {
            return err(libc::EEXIST);
        }
        check_name(newname)?;
        if st.child(newparent.ino, newname)?.is_some() {
            return err(libc::EEXIST);
        }
        let inode = st.get(node.ino);
        if inode.kind() == FileKind::Directory {
            return err(libc::EPERM);
        }
        if inode.nlink == 0 {
            return err(libc::ENOENT);
        }
        if inode.nlink >= LINK_MAX {
            return err(libc::EMLINK);
        }
        let now = self.fs.now();
        let inode = st.get_mut(node.ino);
        inode.nlink += 1;
        inode.ctime = now;
        let p = st.get_mut(newparent.ino);
        p.touch(now);
        let d = p.dir_mut();
        d.entries.insert(newname.to_owned(), Dentry { ino: node.ino, cookie: d.next_cookie });
        d.next_cookie += 1;
        Ok(st.attr(&self.fs.config, node.ino))
    }

    pub(super) fn do_unlink(&self, parent: &MemNode, name: &OsStr) -> Result<()> {
        let mut st = self.fs.lock();
        st.parent_dir(parent.ino)?;
        if is_dot(name) {
            return err(libc::EISDIR);
        }
        check_name(name)?;
        let ino = st.child(parent.ino, name)?.ok_or(Errno(libc::ENOENT))?;
        if st.get(ino).kind() == FileKind::Directory {
            return err(libc::EISDIR);
        }
        let now = self.fs.now();
        let p = st.get_mut(parent.ino);
        p.touch(now);
        p.dir_mut().entries.remove(name);
        let inode = st.get_mut(ino);
        inode.nlink -= 1;
        inode.ctime = now;
        st.free_if_unused(ino);
        Ok(())
    }

    pub(super) fn do_rmdir(&self, parent: &MemNode, name: &OsStr) -> Result<()> {
        let mut st = self.fs.lock();
        st.parent_dir(parent.ino)?;
        if name == "." {
            return err(libc::EINVAL);
        }
        if name == ".." {
            return err(libc::ENOTEMPTY);
        }
        check_name(name)?;
        let ino = st.child(parent.ino, name)?.ok_or(Errno(libc::ENOENT))?;
        match st.get(ino).dir() {
            None => return err(libc::ENOTDIR),
            Some(d) if !d.entries.is_empty() => return err(libc::ENOTEMPTY),
            Some(_) => {}
        }
        let now = self.fs.now();
        let p = st.get_mut(parent.ino);
        p.touch(now);
        p.nlink -= 1;
        p.dir_mut().entries.remove(name);
        let inode = st.get_mut(ino);
        inode.nlink = 0;
        inode.ctime = now;
        st.free_if_unused(ino);
        Ok(())
    }

    pub(super) fn do_create(
        &self,
        creds: &Creds,
        parent: &MemNode,
        name: &OsStr,
        mode: u32,
        flags: i32,
    ) -> Result<(MemNode, Attr, MemFile)> {
        let mut st = self.fs.lock();
        st.parent_dir(parent.ino)?;
        if is_dot(name) {
            return err(libc::EISDIR);
        }
        check_name(name)?;
        let ino = match st.child(parent.ino, name)? {
            Some(_) if flags & libc::O_EXCL != 0 => return err(libc::EEXIST),
            Some(ino) => match st.get(ino).kind() {
                FileKind::Directory => return err(libc::EISDIR),
                FileKind::Symlink => return err(libc::ELOOP),
                _ => ino,
            },
            None => {
                let mode = libc::S_IFREG | (mode & 0o7777 & !self.fs.config.umask);
                self.make(&mut st, creds, parent.ino, name, mode, NewKind::File)?
            }
        };
        let file = self.open_locked(&mut st, ino, flags)?;
        let (node, attr) = self.entry(&mut st, ino);
        Ok((node, attr, file))
    }

    pub(super) fn do_opendir(&self, node: &MemNode) -> Result<MemFile> {
        let mut st = self.fs.lock();
        if st.get(node.ino).kind() != FileKind::Directory {
            return err(libc::ENOTDIR);
        }
        let mut file = self.open_locked(&mut st, node.ino, libc::O_RDONLY)?;
        file.dir = true;
        Ok(file)
    }

    pub(super) fn do_readdir(
        &self,
        dir: &MemFile,
        offset: u64,
        emit: &mut dyn FnMut(DirEntry) -> bool,
    ) -> Result<()> {
        if !dir.dir {
            return err(libc::ENOTDIR);
        }
        // Collected under the lock, emitted after it: `emit` may call back into the file system.
        let entries = {
            let mut st = self.fs.lock();
            let inode = st.get(dir.node.ino);
            if inode.nlink == 0 {
                // ext4 says ENOENT for a removed directory; glibc's readdir turns that into
                // the end of the directory, which is what the POSIX adapter reports.
                return Ok(());
            }
            let d = inode.dir().expect("opened as a directory");
            let mut list = vec![
                (COOKIE_DOT, OsString::from("."), dir.node.ino),
                (COOKIE_DOTDOT, OsString::from(".."), d.parent),
            ];
            list.extend(d.entries.iter().map(|(n, e)| (e.cookie, n.clone(), e.ino)));
            list.retain(|(cookie, _, _)| *cookie > offset);
            list.sort_by_key(|(cookie, _, _)| *cookie);
            let entries: Vec<DirEntry> = list
                .into_iter()
                .map(|(cookie, name, ino)| DirEntry {
                    ino,
                    offset: cookie,
                    kind: Some(st.get(ino).kind()),
                    name,
                })
                .collect();
            let now = self.fs.now();
            st.get_mut(dir.node.ino).accessed(now);
            entries
        };
        for entry in entries {
            if !emit(entry) {
                break;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LowerFs;

    const ROOT: Creds = Creds { uid: 0, gid: 0, groups: Vec::new() };

    #[test]
    fn readdir_cookies_stay_with_their_entries() {
        let l = MemLower::default();
        for n in ["a", "b", "c"] {
            l.mkdir(&ROOT, l.root(), OsStr::new(n), 0o755).unwrap();
        }
        let dir = l.opendir(l.root()).unwrap();
        let mut seen = Vec::new();
        l.readdir(&dir, 0, &mut |e| {
            seen.push((e.name, e.offset));
            seen.len() < 3
        })
        .unwrap();
        assert_eq!(seen.last().unwrap().0, "a");
        l.rmdir(l.root(), OsStr::new("b")).unwrap();
        l.mkdir(&ROOT, l.root(), OsStr::new("d"), 0o755).unwrap();
        let mut rest = Vec::new();
        l.readdir(&dir, seen.last().unwrap().1, &mut |e| {
            rest.push(e.name.into_string().unwrap());
            true
        })
        .unwrap();
        assert_eq!(rest, ["c", "d"]);
    }
}
