//! The one facade through which the engine reaches the lower file system.
//!
//! Every call the engine makes into the lower file system goes through [`Lower`]: the
//! namespace and attribute changes (create, mknod, mkdir, symlink, link, unlink, rmdir,
//! rename, setattr, setxattr, removexattr) are grouped below, so that the metadata journal can
//! record each of them in the operation's transaction at one place; reads of the namespace,
//! data IO and durability calls follow.
//!
//! Invariant L1: no call reaches the lower file system while the calling thread holds a short
//! lock or an undo slot (`sync::assert_may_block`, checked in debug builds: every test run).
//! A lower call may wait for a disk; holding a global lock or a slot across it would stall
//! unrelated operations behind that disk.
//!
//! Rule W1 (journal consistency mode, design.md section 12.7): NVRAM state reaches the lower
//! file system only after the group commit that makes it durable, so that a crash which loses
//! the running group never leaves a lower change made after a lost operation. Every call that
//! changes the lower file system takes a [`Committed`], which only
//! [`Base::committed`](super::Base::committed) makes - by a group commit (a no-op in the other
//! modes). A caller takes it after the NVRAM commits whose state its lower changes carry, and
//! may use it for a batch of changes (a write-back batch, a transform group) of that state.
//! Reads, syncs, relatime's atime (`touch_atime`) and the calls on devices and FIFOs
//! (`write_special`) take none: they carry no NVRAM state.

use std::ffi::OsStr;

use lower::{Attr, Creds, DirEntry, Extent, LowerFs, Result, SetAttr, StatFs};

use crate::base::sync::assert_may_block;

/// Proof that the running group was committed (W1, see the module docs): the only way to
/// change the lower file system through the facade.
#[derive(Debug)]
pub struct Committed(());

impl Committed {
    /// Only `Base::committed`, right after its group commit, makes one.
    pub(super) fn after_group_commit() -> Committed {
        Committed(())
    }
}

/// See the module docs.
#[derive(Debug)]
pub struct Lower<L: LowerFs> {
    fs: L,
}

impl<L: LowerFs> Lower<L> {
    pub(crate) fn new(fs: L) -> Self {
        Lower { fs }
    }

    // Identity and time: no IO.

    pub(crate) fn root(&self) -> &L::Node {
        self.fs.root()
    }

    pub(crate) fn key(&self, node: &L::Node) -> (u64, u64) {
        self.fs.key(node)
    }

    pub(crate) fn now(&self) -> (i64, u32) {
        self.fs.now()
    }

    pub(crate) fn node_stats(&self) -> lower::NodeStats {
        self.fs.node_stats()
    }

    // Namespace and attribute changes (the metadata journal's hook).

    pub(crate) fn mknod(
        &self,
        _w1: &Committed,
        creds: &Creds,
        parent: &L::Node,
        name: &OsStr,
        mode: u32,
        rdev: u64,
    ) -> Result<(L::Node, Attr)> {
        assert_may_block("lower mknod");
        self.fs.mknod(creds, parent, name, mode, rdev)
    }

    pub(crate) fn mkdir(
        &self,
        _w1: &Committed,
        creds: &Creds,
        parent: &L::Node,
        name: &OsStr,
        mode: u32,
    ) -> Result<(L::Node, Attr)> {
        assert_may_block("lower mkdir");
        self.fs.mkdir(creds, parent, name, mode)
    }

    pub(crate) fn symlink(
        &self,
        _w1: &Committed,
        creds: &Creds,
        parent: &L::Node,
        name: &OsStr,
        target: &OsStr,
    ) -> Result<(L::Node, Attr)> {
        assert_may_block("lower symlink");
        self.fs.symlink(creds, parent, name, target)
    }

    pub(crate) fn create(
        &self,
        _w1: &Committed,
        creds: &Creds,
        parent: &L::Node,
        name: &OsStr,
        mode: u32,
        flags: i32,
    ) -> Result<(L::Node, Attr, L::File)> {
        assert_may_block("lower create");
        self.fs.create(creds, parent, name, mode, flags)
    }

    pub(crate) fn link(
        &self,
        _w1: &Committed,
        node: &L::Node,
        newparent: &L::Node,
        newname: &OsStr,
    ) -> Result<Attr> {
        assert_may_block("lower link");
        self.fs.link(node, newparent, newname)
    }

    pub(crate) fn unlink(&self, _w1: &Committed, parent: &L::Node, name: &OsStr) -> Result<()> {
        assert_may_block("lower unlink");
        self.fs.unlink(parent, name)
    }

    pub(crate) fn rmdir(&self, _w1: &Committed, parent: &L::Node, name: &OsStr) -> Result<()> {
        assert_may_block("lower rmdir");
        self.fs.rmdir(parent, name)
    }

    pub(crate) fn rename(
        &self,
        _w1: &Committed,
        parent: &L::Node,
        name: &OsStr,
        newparent: &L::Node,
        newname: &OsStr,
        flags: u32,
    ) -> Result<()> {
        assert_may_block("lower rename");
        self.fs.rename(parent, name, newparent, newname, flags)
    }

    pub(crate) fn setattr(
        &self,
        _w1: &Committed,
        node: &L::Node,
        file: Option<&L::File>,
        set: &SetAttr,
    ) -> Result<Attr> {
        assert_may_block("lower setattr");
        self.fs.setattr(node, file, set)
    }

    /// relatime's atime update of a file a read went through the page cache for: the time is
    /// now, no NVRAM state, so no W1.
    pub(crate) fn touch_atime(&self, node: &L::Node) -> Result<Attr> {
        assert_may_block("lower setattr (atime)");
        let set = SetAttr { atime: Some(lower::TimeSet::Now), ..SetAttr::default() };
        self.fs.setattr(node, None, &set)
    }

    pub(crate) fn setxattr(
        &self,
        _w1: &Committed,
        node: &L::Node,
        name: &OsStr,
        value: &[u8],
        flags: i32,
    ) -> Result<()> {
        assert_may_block("lower setxattr");
        self.fs.setxattr(node, name, value, flags)
    }

    pub(crate) fn removexattr(&self, _w1: &Committed, node: &L::Node, name: &OsStr) -> Result<()> {
        assert_may_block("lower removexattr");
        self.fs.removexattr(node, name)
    }

    // Reading the namespace.

    pub(crate) fn lookup(&self, parent: &L::Node, name: &OsStr) -> Result<(L::Node, Attr)> {
        assert_may_block("lower lookup");
        self.fs.lookup(parent, name)
    }

    pub(crate) fn getattr(&self, node: &L::Node) -> Result<Attr> {
        assert_may_block("lower getattr");
        self.fs.getattr(node)
    }

    pub(crate) fn readlink(&self, node: &L::Node) -> Result<Vec<u8>> {
        assert_may_block("lower readlink");
        self.fs.readlink(node)
    }

    pub(crate) fn opendir(&self, node: &L::Node) -> Result<L::File> {
        assert_may_block("lower opendir");
        self.fs.opendir(node)
    }

    pub(crate) fn readdir(
        &self,
        dir: &L::File,
        offset: u64,
        emit: &mut dyn FnMut(DirEntry) -> bool,
    ) -> Result<()> {
        assert_may_block("lower readdir");
        self.fs.readdir(dir, offset, emit)
    }

    pub(crate) fn statfs(&self, node: &L::Node) -> Result<StatFs> {
        assert_may_block("lower statfs");
        self.fs.statfs(node)
    }

    pub(crate) fn getxattr(&self, node: &L::Node, name: &OsStr, size: usize) -> Result<Vec<u8>> {
        assert_may_block("lower getxattr");
        self.fs.getxattr(node, name, size)
    }

    pub(crate) fn listxattr(&self, node: &L::Node, size: usize) -> Result<Vec<u8>> {
        assert_may_block("lower listxattr");
        self.fs.listxattr(node, size)
    }

    pub(crate) fn dir_handle(&self, dir: &L::Node) -> Result<Vec<u8>> {
        assert_may_block("lower name_to_handle_at");
        self.fs.dir_handle(dir)
    }

    pub(crate) fn file_handle(&self, file: &L::Node) -> Result<Vec<u8>> {
        assert_may_block("lower name_to_handle_at");
        self.fs.file_handle(file)
    }

    pub(crate) fn find_dir(&self, handle: &[u8], limit: usize) -> Result<L::Node> {
        assert_may_block("lower find_dir");
        self.fs.find_dir(handle, limit)
    }

    pub(crate) fn find_file(&self, handle: &[u8], limit: usize) -> Result<L::Node> {
        assert_may_block("lower find_file");
        self.fs.find_file(handle, limit)
    }

    pub(crate) fn find_object(&self, handle: &[u8], limit: usize) -> Result<L::Node> {
        assert_may_block("lower find_object");
        self.fs.find_object(handle, limit)
    }

    // Data.

    pub(crate) fn open(&self, node: &L::Node, flags: i32) -> Result<L::File> {
        assert_may_block("lower open");
        self.fs.open(node, flags)
    }

    /// No call: the descriptor of an open file, for the kernel's passthrough.
    pub(crate) fn backing_fd<'a>(&self, file: &'a L::File) -> Option<std::os::fd::BorrowedFd<'a>> {
        self.fs.backing_fd(file)
    }

    pub(crate) fn open_direct(&self, node: &L::Node, writable: bool) -> Result<Option<L::File>> {
        assert_may_block("lower open (O_DIRECT)");
        self.fs.open_direct(node, writable)
    }

    pub(crate) fn read(&self, file: &L::File, offset: u64, buf: &mut [u8]) -> Result<usize> {
        assert_may_block("lower read");
        self.fs.read(file, offset, buf)
    }

    /// Reads until `buf` is full or the file ends; returns the bytes read.
    pub(crate) fn read_full(&self, file: &L::File, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let mut got = 0;
        while got < buf.len() {
            let n = self.read(file, offset + got as u64, &mut buf[got..])?;
            if n == 0 {
                break;
            }
            got += n;
        }
        Ok(got)
    }

    pub(crate) fn write(
        &self,
        _w1: &Committed,
        file: &L::File,
        offset: u64,
        data: &[u8],
    ) -> Result<usize> {
        assert_may_block("lower write");
        self.fs.write(file, offset, data)
    }

    /// A write to a device or FIFO opened through the mount: no file-system state, so no W1.
    pub(crate) fn write_special(&self, file: &L::File, offset: u64, data: &[u8]) -> Result<usize> {
        assert_may_block("lower write (device or FIFO)");
        self.fs.write(file, offset, data)
    }

    pub(crate) fn fallocate(
        &self,
        _w1: &Committed,
        file: &L::File,
        mode: i32,
        offset: u64,
        len: u64,
    ) -> Result<()> {
        assert_may_block("lower fallocate");
        self.fs.fallocate(file, mode, offset, len)
    }

    pub(crate) fn lseek(&self, file: &L::File, offset: i64, whence: i32) -> Result<i64> {
        assert_may_block("lower lseek");
        self.fs.lseek(file, offset, whence)
    }

    pub(crate) fn copy_file_range(
        &self,
        _w1: &Committed,
        input: &L::File,
        offset_in: u64,
        output: &L::File,
        offset_out: u64,
        len: u64,
    ) -> Result<u64> {
        assert_may_block("lower copy_file_range");
        self.fs.copy_file_range(input, offset_in, output, offset_out, len)
    }

    pub(crate) fn fiemap(&self, file: &L::File) -> Result<Vec<Extent>> {
        assert_may_block("lower fiemap");
        self.fs.fiemap(file)
    }

    // Durability.

    pub(crate) fn fsync(&self, file: &L::File, datasync: bool) -> Result<()> {
        assert_may_block("lower fsync");
        self.fs.fsync(file, datasync)
    }

    pub(crate) fn fsyncdir(&self, dir: &L::File, datasync: bool) -> Result<()> {
        assert_may_block("lower fsyncdir");
        self.fs.fsyncdir(dir, datasync)
    }

    /// fsync of a directory by its node.
    pub(crate) fn sync_dir(&self, dir: &L::Node) -> Result<()> {
        let d = self.opendir(dir)?;
        self.fsyncdir(&d, false)
    }

    pub(crate) fn syncfs(&self) -> Result<()> {
        assert_may_block("lower syncfs");
        self.fs.syncfs()
    }
}
