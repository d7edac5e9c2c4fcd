//! Extended attributes: "user.", "trusted." and "security." names in a fixed per-inode space
//! (`MemConfig::xattr_space`); "system." (POSIX ACLs) is EOPNOTSUPP.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use super::{MemLower, MemNode, XATTR_ENTRY_OVERHEAD, XATTR_NAME_MAX, XATTR_SIZE_MAX, err};
use crate::Result;
use crate::types::{Errno, FileKind};

fn xattr_name(name: &OsStr) -> Result<()> {
    let b = name.as_bytes();
    if b.is_empty() || b.len() > XATTR_NAME_MAX {
        return err(libc::ERANGE);
    }
    for prefix in [&b"user."[..], b"trusted.", b"security."] {
        if let Some(rest) = b.strip_prefix(prefix) {
            return if rest.is_empty() { err(libc::EINVAL) } else { Ok(()) };
        }
    }
    err(libc::EOPNOTSUPP)
}

fn is_user_xattr(name: &OsStr) -> bool {
    name.as_bytes().starts_with(b"user.")
}

/// Answers a sized xattr query: `size == 0` asks for the length.
fn sized(value: Vec<u8>, size: usize) -> Result<Vec<u8>> {
    if size == 0 {
        Ok(vec![0; value.len()])
    } else if value.len() > size {
        err(libc::ERANGE)
    } else {
        Ok(value)
    }
}

impl MemLower {
    pub(super) fn do_setxattr(
        &self,
        node: &MemNode,
        name: &OsStr,
        value: &[u8],
        flags: i32,
    ) -> Result<()> {
        if flags & !(libc::XATTR_CREATE | libc::XATTR_REPLACE) != 0 {
            return err(libc::EINVAL);
        }
        if name.is_empty() || name.len() > XATTR_NAME_MAX {
            return err(libc::ERANGE);
        }
        if value.len() > XATTR_SIZE_MAX {
            return err(libc::E2BIG);
        }
        let mut st = self.fs.lock();
        let kind = st.get(node.ino).kind();
        if is_user_xattr(name) && !matches!(kind, FileKind::Regular | FileKind::Directory) {
            return err(libc::EPERM);
        }
        xattr_name(name)?;
        let inode = st.get(node.ino);
        let old = inode.xattrs.get(name);
        if old.is_none() && flags & libc::XATTR_REPLACE != 0 {
            return err(libc::ENODATA);
        }
        if old.is_some() && flags & libc::XATTR_CREATE != 0 {
            return err(libc::EEXIST);
        }
        let cost = |n: &OsStr, v: &[u8]| n.len() + v.len() + XATTR_ENTRY_OVERHEAD;
        let used: usize = inode.xattrs.iter().map(|(n, v)| cost(n, v)).sum();
        let after = used - old.map_or(0, |v| cost(name, v)) + cost(name, value);
        if after > self.fs.config.xattr_space {
            return err(libc::ENOSPC);
        }
        let now = self.fs.now();
        let inode = st.get_mut(node.ino);
        inode.xattrs.insert(name.to_owned(), value.to_vec());
        inode.ctime = now;
        Ok(())
    }

    pub(super) fn do_getxattr(&self, node: &MemNode, name: &OsStr, size: usize) -> Result<Vec<u8>> {
        if name.is_empty() || name.len() > XATTR_NAME_MAX {
            return err(libc::ERANGE);
        }
        let st = self.fs.lock();
        let inode = st.get(node.ino);
        if is_user_xattr(name) && !matches!(inode.kind(), FileKind::Regular | FileKind::Directory) {
            return err(libc::ENODATA);
        }
        xattr_name(name)?;
        let value = inode.xattrs.get(name).ok_or(Errno(libc::ENODATA))?;
        sized(value.clone(), size)
    }

    pub(super) fn do_listxattr(&self, node: &MemNode, size: usize) -> Result<Vec<u8>> {
        let st = self.fs.lock();
        let mut list = Vec::new();
        for name in st.get(node.ino).xattrs.keys() {
            list.extend_from_slice(name.as_bytes());
            list.push(0);
        }
        sized(list, size)
    }

    pub(super) fn do_removexattr(&self, node: &MemNode, name: &OsStr) -> Result<()> {
        if name.is_empty() || name.len() > XATTR_NAME_MAX {
            return err(libc::ERANGE);
        }
        let mut st = self.fs.lock();
        if is_user_xattr(name)
            && !matches!(st.get(node.ino).kind(), FileKind::Regular | FileKind::Directory)
        {
            return err(libc::EPERM);
        }
        xattr_name(name)?;
        let now = self.fs.now();
        let inode = st.get_mut(node.ino);
        inode.xattrs.remove(name).ok_or(Errno(libc::ENODATA))?;
        inode.ctime = now;
        Ok(())
    }
}
