//! The FUSE side of the FAT server: every request becomes a job on the actor's channel
//! (bounded: `QUEUE_MAX`; FUSE threads block beyond), answered from the actor thread. Requests
//! FAT cannot honour are refused here without a job: mknod, symlink and link (EPERM).
//!
//! fsync and fsyncdir write everything dirty and flush the device (FAT keeps no per-file list
//! of dirty sectors); FUSE flush (close) is not a durability point and does nothing.

use std::ffi::OsStr;
use std::sync::mpsc;
use std::time::SystemTime;

use fuser::{
    Errno, FileHandle, Filesystem, FopenFlags, Generation, INodeNo, LockOwner, OpenFlags,
    RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry,
    ReplyOpen, ReplyStatfs, ReplyWrite, Request, WriteFlags,
};

use super::errno::{errno_of, io_err, name_str};
use super::nodes::join;
use super::volume::Volume;
use super::{NAME_MAX, TTL};

pub(super) type Job = Box<dyn FnOnce(&mut Volume) + Send>;

/// The FUSE side: queues every request to the actor.
pub(super) struct FatFs {
    pub(super) jobs: mpsc::SyncSender<Job>,
}

impl FatFs {
    fn run(&self, job: impl FnOnce(&mut Volume) + Send + 'static) {
        // The actor outlives the session; a send fails only while it is shutting down, when
        // the kernel no longer waits for answers.
        let _ = self.jobs.send(Box::new(job));
    }
}

impl FatFs {
    /// fsync and fsyncdir: everything dirty written, the device flushed.
    fn sync_all(&self, reply: ReplyEmpty) {
        self.run(move |v| match v.sync_all() {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        });
    }
}

/// Runs a changing operation and what its mode writes after it; an error from either is the
/// answer.
fn modify<T>(v: &mut Volume, op: impl FnOnce(&mut Volume) -> Result<T, Errno>) -> Result<T, Errno> {
    let r = op(v);
    let fin = v.finish().map_err(io_err);
    let t = r?;
    fin?;
    Ok(t)
}

impl Filesystem for FatFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let name = name.to_owned();
        self.run(move |v| {
            let r = v.path(parent).and_then(|p| Ok(join(&p, name_str(&name)?)));
            match r.and_then(|p| v.entry(&p)) {
                Ok(a) => reply.entry(&TTL, &a, Generation(0)),
                Err(e) => reply.error(e),
            }
        });
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.run(move |v| {
            if v.nodes.forget(ino.0, nlookup) {
                // A later lookup of its path makes a new node that opens the file again: two
                // handles on one entry would break V1, so this one closes now.
                v.close_file(Some(ino.0));
            }
        });
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.run(move |v| match v.path(ino).and_then(|p| v.find(&p)) {
            Ok(e) => reply.attr(&TTL, &v.attr(ino.0, e.as_ref())),
            Err(e) => reply.error(e),
        });
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        self.run(move |v| match modify(v, |v| v.setattr(ino, mode, uid, gid, size, mtime)) {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        });
    }

    fn mknod(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        // Regular files come through create; FAT has no special files.
        reply.error(Errno::EPERM);
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let name = name.to_owned();
        self.run(move |v| match modify(v, |v| v.mkdir(parent, &name)) {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        });
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let name = name.to_owned();
        self.run(move |v| match modify(v, |v| v.remove(parent, &name, false)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        });
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let name = name.to_owned();
        self.run(move |v| match modify(v, |v| v.remove(parent, &name, true)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        });
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let (name, newname) = (name.to_owned(), newname.to_owned());
        self.run(move |v| {
            match modify(v, |v| v.rename(parent, &name, newparent, &newname, flags)) {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            }
        });
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let trunc = flags.0 & libc::O_TRUNC != 0;
        self.run(move |v| {
            let r = v.path(ino).and_then(|p| match v.find(&p)? {
                Some(e) if e.dir => Err(Errno::EISDIR),
                Some(_) if trunc => modify(v, |v| v.set_size(ino.0, 0)),
                Some(_) => Ok(()),
                None => Err(Errno::EISDIR),
            });
            match r {
                Ok(()) => reply.opened(FileHandle(0), FopenFlags::empty()),
                Err(e) => reply.error(e),
            }
        });
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.run(move |v| match v.read(ino, offset, size) {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(e),
        });
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let data = data.to_vec();
        self.run(move |v| match modify(v, |v| v.write(ino, offset, &data)) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e),
        });
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lo: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn fsync(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _ds: bool, reply: ReplyEmpty) {
        // FAT keeps no per-file list of dirty sectors here: an fsync writes them all.
        self.sync_all(reply);
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _ds: bool,
        reply: ReplyEmpty,
    ) {
        self.sync_all(reply);
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        self.run(move |v| match v.readdir(ino) {
            Ok(list) => {
                for (i, (ino, kind, name)) in list.iter().enumerate().skip(offset as usize) {
                    if reply.add(INodeNo(*ino), (i + 1) as u64, *kind, name) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(e),
        });
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        self.run(move |v| match v.fs().stats() {
            Ok(s) => {
                let (total, free) = (u64::from(s.total_clusters()), u64::from(s.free_clusters()));
                let c = s.cluster_size();
                reply.statfs(total, free, free, 0, 0, c, NAME_MAX as u32, c);
            }
            Err(e) => reply.error(errno_of(&e)),
        });
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let name = name.to_owned();
        self.run(move |v| match modify(v, |v| v.create(parent, &name, flags)) {
            Ok(a) => reply.created(&TTL, &a, Generation(0), FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(e),
        });
    }

    fn symlink(
        &self,
        _req: &Request,
        _p: INodeNo,
        _n: &OsStr,
        _t: &std::path::Path,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EPERM);
    }

    fn link(&self, _req: &Request, _ino: INodeNo, _p: INodeNo, _n: &OsStr, reply: ReplyEntry) {
        reply.error(Errno::EPERM);
    }
}
