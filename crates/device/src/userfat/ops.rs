//! The operations on the volume, one per syscall family (lookups are in `volume.rs`): data
//! (read, write, truncate), attributes (setattr: only size and mtime change on FAT, owner
//! and mode changes to anything else are EPERM), and the namespace (create, mkdir, remove,
//! rename, readdir). Each runs on the actor thread; a changing one is followed by
//! `Volume::finish` (`fuse.rs`: `modify`).
//!
//! Entries are matched case-insensitively and answered with the name as stored. Removing or
//! renaming drops the cached open files first (V1 in `volume.rs`). A new directory's dot
//! entries are put where FAT requires them ([`fix_dot_entries`]) before anything is written.

use std::ffi::OsStr;
use std::io::{Read, Seek, SeekFrom, Write};
use std::time::SystemTime;

use fuser::{Errno, FileAttr, FileType, INodeNo, RenameFlags};

use super::errno::{io_err, name_str};
use super::nodes::{ROOT, join, split};
use super::volume::{FatFile, Volume};
use super::{FILE_BYTES_MAX, time};

impl Volume {
    pub(super) fn write(&mut self, ino: INodeNo, off: u64, data: &[u8]) -> Result<u32, Errno> {
        if off.checked_add(data.len() as u64).is_none_or(|e| e > FILE_BYTES_MAX) {
            return Err(Errno::EFBIG);
        }
        self.with_file(ino.0, |f| {
            let len = f.seek(SeekFrom::End(0)).map_err(io_err)?;
            if off > len {
                write_zeros(f, off - len)?;
            }
            f.seek(SeekFrom::Start(off)).map_err(io_err)?;
            f.write_all(data).map_err(io_err)?;
            f.flush().map_err(io_err)?;
            Ok(data.len() as u32)
        })
    }

    pub(super) fn read(&mut self, ino: INodeNo, off: u64, size: u32) -> Result<Vec<u8>, Errno> {
        self.with_file(ino.0, |f| {
            let len = f.seek(SeekFrom::End(0)).map_err(io_err)?;
            if off >= len {
                return Ok(Vec::new());
            }
            f.seek(SeekFrom::Start(off)).map_err(io_err)?;
            let mut buf = vec![0u8; (u64::from(size)).min(len - off) as usize];
            f.read_exact(&mut buf).map_err(io_err)?;
            Ok(buf)
        })
    }

    pub(super) fn set_size(&mut self, ino: u64, size: u64) -> Result<(), Errno> {
        if size > FILE_BYTES_MAX {
            return Err(Errno::EFBIG);
        }
        self.with_file(ino, |f| {
            let len = f.seek(SeekFrom::End(0)).map_err(io_err)?;
            if size < len {
                f.seek(SeekFrom::Start(size)).map_err(io_err)?;
                f.truncate().map_err(io_err)?;
            } else if size > len {
                write_zeros(f, size - len)?;
            }
            f.flush().map_err(io_err)
        })
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn setattr(
        &mut self,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        mtime: Option<fuser::TimeOrNow>,
    ) -> Result<FileAttr, Errno> {
        let path = self.path(ino)?;
        let e = self.find(&path)?;
        let cur = self.attr(ino.0, e.as_ref());
        if uid.is_some_and(|u| u != cur.uid) || gid.is_some_and(|g| g != cur.gid) {
            return Err(Errno::EPERM);
        }
        if mode.is_some_and(|m| (m & 0o7777) as u16 != cur.perm) {
            return Err(Errno::EPERM);
        }
        let is_file = e.as_ref().is_some_and(|e| !e.dir);
        if let Some(s) = size {
            if !is_file {
                return Err(Errno::EISDIR);
            }
            self.set_size(ino.0, s)?;
        }
        if let (Some(t), true) = (mtime, is_file) {
            let when = match t {
                fuser::TimeOrNow::SpecificTime(t) => t,
                fuser::TimeOrNow::Now => SystemTime::now(),
            };
            self.with_file(ino.0, |f| {
                // Deprecated in fatfs 0.3 in favour of a custom clock, but it is the only way
                // to store a time the application chose (utimensat: touch -d, tar, cp -p).
                #[allow(deprecated)]
                f.set_modified(time::to_dos(when));
                f.flush().map_err(io_err)
            })?;
        }
        let e = self.find(&path)?;
        Ok(self.attr(ino.0, e.as_ref()))
    }

    pub(super) fn create(
        &mut self,
        parent: INodeNo,
        name: &OsStr,
        flags: i32,
    ) -> Result<FileAttr, Errno> {
        let path = join(&self.path(parent)?, name_str(name)?);
        match self.exists(&path)? {
            Some(_) if flags & libc::O_EXCL != 0 => return Err(Errno::EEXIST),
            Some(e) if e.dir => return Err(Errno::EISDIR),
            Some(_) => {
                let attr = self.entry(&path)?;
                if flags & libc::O_TRUNC != 0 {
                    self.set_size(attr.ino.0, 0)?;
                    let e = self.find(&path)?;
                    return Ok(self.attr(attr.ino.0, e.as_ref()));
                }
                return Ok(attr);
            }
            None => {
                let mut f = self.root().create_file(&path).map_err(io_err)?;
                f.flush().map_err(io_err)?;
            }
        }
        self.entry(&path)
    }

    pub(super) fn mkdir(&mut self, parent: INodeNo, name: &OsStr) -> Result<FileAttr, Errno> {
        let path = join(&self.path(parent)?, name_str(name)?);
        if self.exists(&path)?.is_some() {
            return Err(Errno::EEXIST);
        }
        self.root().create_dir(&path).map_err(io_err)?;
        let mut disk = self.disk.borrow_mut();
        let fresh: Vec<u64> = disk.pending().map(|(s, _)| s).collect();
        let fixed = fresh
            .into_iter()
            .filter(|s| fix_dot_entries(disk.pending_mut(*s).expect("pending")))
            .count();
        drop(disk);
        if fixed != 1 {
            eprintln!(
                "nvstack serve-fat: mkdir {path}: {fixed} directory clusters needed the dot-entry repair (expected 1)"
            );
        }
        self.entry(&path)
    }

    pub(super) fn remove(&mut self, parent: INodeNo, name: &OsStr, dir: bool) -> Result<(), Errno> {
        let path = join(&self.path(parent)?, name_str(name)?);
        let e = self.find(&path)?.ok_or(Errno::EBUSY)?;
        match (e.dir, dir) {
            (true, false) => return Err(Errno::EISDIR),
            (false, true) => return Err(Errno::ENOTDIR),
            _ => {}
        }
        let stored = join(split(&path).0, &e.name);
        if dir {
            self.close_files();
        } else {
            self.close_file(self.nodes.ino_of(&stored));
        }
        self.root().remove(&stored).map_err(io_err)?;
        self.nodes.removed(&stored);
        Ok(())
    }

    pub(super) fn rename(
        &mut self,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
    ) -> Result<(), Errno> {
        if flags.contains(RenameFlags::RENAME_EXCHANGE)
            || flags.contains(RenameFlags::RENAME_WHITEOUT)
        {
            return Err(Errno::EINVAL);
        }
        let (sp, dp) = (self.path(parent)?, self.path(newparent)?);
        let (sname, dname) = (name_str(name)?, name_str(newname)?);
        let src_e = self.find(&join(&sp, sname))?.ok_or(Errno::EBUSY)?;
        let src = join(&sp, &src_e.name);
        let dst = join(&dp, dname);
        if src == dst {
            return Ok(());
        }
        if src_e.dir
            && (dst.starts_with(&format!("{src}/"))
                || dst.to_lowercase().starts_with(&format!("{}/", src.to_lowercase())))
        {
            return Err(Errno::EINVAL);
        }
        if src_e.dir && sp.to_lowercase() != dp.to_lowercase() {
            // fatfs moves the entry but does not rewrite the directory's `..`.
            return Err(Errno::EXDEV);
        }
        if let Some(de) = self.exists(&dst)? {
            let dst_stored = join(&dp, &de.name);
            if dst_stored.to_lowercase() == src.to_lowercase() {
                // The same entry under another case: FAT keeps the stored name.
                return Ok(());
            }
            if flags.contains(RenameFlags::RENAME_NOREPLACE) {
                return Err(Errno::EEXIST);
            }
            match (src_e.dir, de.dir) {
                (false, true) => return Err(Errno::EISDIR),
                (true, false) => return Err(Errno::ENOTDIR),
                _ => {}
            }
            self.close_files();
            self.root().remove(&dst_stored).map_err(io_err)?;
            self.nodes.removed(&dst_stored);
        }
        self.close_files();
        {
            let (sdir, ddir) = (self.dir(&sp)?, self.dir(&dp)?);
            sdir.rename(&src_e.name, &ddir, dname).map_err(io_err)?;
        }
        self.nodes.renamed(&src, &dst);
        Ok(())
    }

    pub(super) fn readdir(&mut self, ino: INodeNo) -> Result<Vec<(u64, FileType, String)>, Errno> {
        let path = self.path(ino)?;
        if let Some(e) = self.find(&path)? {
            if !e.dir {
                return Err(Errno::ENOTDIR);
            }
        }
        let mut out = vec![(ino.0, FileType::Directory, ".".to_string())];
        let parent = if path.is_empty() { String::new() } else { split(&path).0.to_string() };
        out.push((self.nodes.ino_of(&parent).unwrap_or(ROOT), FileType::Directory, "..".into()));
        for e in self.dir(&path)?.iter() {
            let e = e.map_err(io_err)?;
            let name = e.file_name();
            if name == "." || name == ".." {
                continue;
            }
            let child = join(&path, &name);
            // Numbers for entries the kernel has not looked up: stable per path, above the
            // table's counter range (readdir's d_ino is informational on FUSE).
            let ino = self.nodes.ino_of(&child).unwrap_or_else(|| path_ino(&child));
            let kind = if e.is_dir() { FileType::Directory } else { FileType::RegularFile };
            out.push((ino, kind, name));
        }
        Ok(out)
    }
}

/// fatfs 0.3.6 writes a long-name entry before the `.` and `..` entries of a new directory
/// (its `write_entry` makes long names for every name), so `.` is not in slot 0 and `..` not
/// in slot 1 as FAT requires (`fsck.fat` repairs it; a file created later may take slot 0).
/// On the first sector of a fresh directory cluster - [LFN "."][.][LFN ".."][..] - this moves
/// `.` and `..` to slots 0 and 1 and frees the rest. Returns whether the sector was that.
fn fix_dot_entries(sector: &mut [u8]) -> bool {
    const E: usize = 32;
    const ATTR: usize = 11;
    let lfn = |e: &[u8], c: u8| e[ATTR] == 0x0F && e[1] == c && e[2] == 0;
    let sfn = |e: &[u8], name: &[u8; 11]| e[..11] == name[..] && e[ATTR] & 0x10 != 0;
    let (dot, dotdot) = (*b".          ", *b"..         ");
    if sector.len() < 5 * E
        || !lfn(&sector[..E], b'.')
        || !sfn(&sector[E..2 * E], &dot)
        || !lfn(&sector[2 * E..3 * E], b'.')
        || sector[2 * E + 3] != b'.'
        || !sfn(&sector[3 * E..4 * E], &dotdot)
        || sector[4 * E] != 0
    {
        return false;
    }
    let (d, dd) = (sector[E..2 * E].to_vec(), sector[3 * E..4 * E].to_vec());
    sector[..E].copy_from_slice(&d);
    sector[E..2 * E].copy_from_slice(&dd);
    sector[2 * E..4 * E].fill(0);
    true
}

fn write_zeros(f: &mut FatFile<'_>, mut n: u64) -> Result<(), Errno> {
    let z = [0u8; 4096];
    while n > 0 {
        let k = n.min(z.len() as u64) as usize;
        f.write_all(&z[..k]).map_err(io_err)?;
        n -= k as u64;
    }
    Ok(())
}

fn path_ino(path: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in path.to_lowercase().bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h | (1 << 63)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(name: &[u8; 11], attr: u8) -> [u8; 32] {
        let mut e = [0u8; 32];
        e[..11].copy_from_slice(name);
        e[11] = attr;
        e
    }

    fn lfn(c: u8, second: u8) -> [u8; 32] {
        let mut e = [0xFFu8; 32];
        e[0] = 0x41;
        e[1] = c;
        e[2] = 0;
        e[3] = second;
        e[4] = 0;
        e[11] = 0x0F;
        e
    }

    #[test]
    fn the_dot_entries_of_a_fresh_directory_move_to_slots_0_and_1() {
        let mut s = vec![0u8; 512];
        let dot = raw(b".          ", 0x10);
        let dotdot = raw(b"..         ", 0x10);
        s[..32].copy_from_slice(&lfn(b'.', 0));
        s[32..64].copy_from_slice(&dot);
        s[64..96].copy_from_slice(&lfn(b'.', b'.'));
        s[96..128].copy_from_slice(&dotdot);
        assert!(fix_dot_entries(&mut s));
        assert_eq!(&s[..32], &dot);
        assert_eq!(&s[32..64], &dotdot);
        assert!(s[64..].iter().all(|b| *b == 0));
        // Already right, or anything else: left alone.
        let before = s.clone();
        assert!(!fix_dot_entries(&mut s));
        assert_eq!(s, before);
        let mut other = vec![0u8; 512];
        other[..32].copy_from_slice(&lfn(b'.', 0));
        other[32..64].copy_from_slice(&raw(b"FILE    TXT", 0x20));
        assert!(!fix_dot_entries(&mut other));
    }
}
