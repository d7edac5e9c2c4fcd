//! Open files: open, create, release, flush, fsync, fallocate, lseek, copy_file_range.

use std::ffi::OsStr;

use lower::{Creds, LowerFs};

use std::sync::atomic::AtomicBool;

use crate::base::Committed;
use crate::base::Entry;
use crate::base::counters::{Counters, Op};
use crate::base::error::{FsResult, answer};
use crate::base::handles::Handle;
use crate::engine::routing::{sync_flag, writable};
use crate::engine::{Engine, Via, stale};
use crate::route::{Keep, Opened, Route, Signal};
use crate::tempfs::names::{Obj, Open};
use crate::tempfs::{self, Fate, data};

impl<L: LowerFs> Engine<L> {
    /// Opens a file; the handle number (see [`Engine::open_routed`] for its route).
    pub fn open(&self, node_id: u64, flags: i32) -> FsResult<u64> {
        self.open_routed(node_id, flags).map(|o| o.fh)
    }

    /// Opens a file on its route (`route/`): the NVRAM path, or passthrough for a lower file
    /// with no NVRAM state that nothing marks as synchronous.
    pub fn open_routed(&self, node_id: u64, flags: i32) -> FsResult<Opened> {
        self.op(Op::Open, |tx| {
            loop {
                let node = match self.obj(node_id)? {
                    Obj::Lower(n) => n,
                    Obj::Temp(f) => {
                        match self.temp.temp_open(&self.base, tx, node_id, &f, flags)? {
                            Some(fh) => return Ok(self.nvram_route(node_id, fh, flags)),
                            None => continue,
                        }
                    }
                };
                // O_DIRECT is the kernel's business above FUSE (it bypasses its page cache and
                // sends us every request); our lower IO uses buffers of any alignment.
                let file = self.base.lower.open(&node, flags & !libc::O_DIRECT)?;
                let attr = self.base.lower.getattr(&node)?;
                let regular = attr.kind() == lower::FileKind::Regular;
                let key = self.base.lower.key(&node);
                let opened = self.register_lower(node_id, &node, file, key, attr, flags)?;
                if regular && !opened.passthrough && sync_flag(flags) {
                    self.learn_route(tx, node_id, Signal::SyncFlag);
                }
                return Ok(opened);
            }
        })
    }

    /// Registers an open lower object with its route (regular files only; a device or FIFO
    /// takes none); the route is given back if the handle table is full.
    fn register_lower(
        &self,
        node_id: u64,
        node: &L::Node,
        file: L::File,
        key: (u64, u64),
        attr: lower::Attr,
        flags: i32,
    ) -> FsResult<Opened> {
        let regular = attr.kind() == lower::FileKind::Regular;
        let route = if regular {
            self.choose_route(node_id, node, key, attr.mode, flags)
        } else {
            Route { passthrough: false, keep_cache: true }
        };
        let open = Open::Lower {
            file,
            key,
            regular,
            direct: flags & libc::O_DIRECT != 0,
            passthrough: route.passthrough,
            small_writes: AtomicBool::new(false),
            writable: writable(flags),
        };
        let fh = self.register(node_id, open).inspect_err(|_| {
            if regular {
                self.routes.release(node_id);
            }
        })?;
        let (passthrough, keep_cache) = (route.passthrough, route.keep_cache);
        Ok(Opened { fh, passthrough, keep_cache, nvram_resident: false })
    }

    /// Registers the NVRAM route of a temp-file open `fh` (rule 1 of `route/` holds for
    /// temp files too: a transformed one keeps its node).
    fn nvram_route(&self, node_id: u64, fh: u64, flags: i32) -> Opened {
        let route = self.routes.register(node_id, Some(Keep::State), 0, writable(flags));
        Opened {
            fh,
            passthrough: route.passthrough,
            keep_cache: route.keep_cache,
            nvram_resident: true,
        }
    }

    pub fn create(
        &self,
        creds: &Creds,
        parent: u64,
        name: &OsStr,
        mode: u32,
        flags: i32,
    ) -> FsResult<(Entry, u64)> {
        self.create_routed(creds, parent, name, mode, flags).map(|(e, o)| (e, o.fh))
    }

    /// Creates and opens a file on its route (a temp file: the NVRAM path).
    pub fn create_routed(
        &self,
        creds: &Creds,
        parent: u64,
        name: &OsStr,
        mode: u32,
        flags: i32,
    ) -> FsResult<(Entry, Opened)> {
        self.op(Op::Create, |tx| {
            let p = self.dir(parent)?;
            if let Some((entry, fh)) =
                self.temp.temp_create(&self.base, tx, creds, (&p, name), mode, flags)?
            {
                return Ok((entry, self.nvram_route(entry.node_id, fh, flags)));
            }
            self.check_new_name(&p, name)?;
            let (node, attr, file) = self.journal.ns_create(
                &self.base,
                tx,
                creds,
                (&p, name),
                mode,
                flags & !libc::O_DIRECT,
            )?;
            let key = self.base.lower.key(&node);
            let node = std::sync::Arc::new(node);
            let entry = self.entry_of(std::sync::Arc::clone(&node), attr);
            let opened = self.register_lower(entry.node_id, &node, file, key, attr, flags)?;
            if self.temp.config.enabled {
                Counters::add(&self.temp.counters.created_in_lower, 1);
            }
            Ok((entry, opened))
        })
    }

    /// Closes open `fh`; returns whether it was in passthrough (the front end then lets go of
    /// the node's backing file when it was the last).
    pub fn release(&self, fh: u64) -> FsResult<bool> {
        self.op(Op::Release, |tx| {
            let h = self.temp.handles.remove(fh).ok_or_else(|| stale(fh))?;
            let passthrough = matches!(h.file, Open::Lower { passthrough: true, .. });
            if matches!(h.file, Open::Lower { regular: true, .. } | Open::Temp { .. }) {
                self.routes.release(h.node_id);
                if self.routes.opens(h.node_id) == 0 {
                    self.direct.closed(h.node_id);
                }
            }
            if Self::wrote_small(&h.file) {
                self.learn_route(tx, h.node_id, Signal::SmallWrites);
            }
            if let Open::Temp { file, .. } = &h.file {
                self.temp.temp_release(&self.base, tx, file)?;
            }
            Ok(passthrough)
        })
    }

    pub fn flush(&self, fh: u64) -> FsResult<()> {
        self.op(Op::Flush, |_| self.handle(fh).map(drop))
    }

    /// fsync and fdatasync (O_SYNC and O_DSYNC writes arrive as these too). Whatever of the
    /// file lives in NVRAM is durable already: a temp file, a cached file's dirty pages and
    /// record. The lower file system is asked only for changes made in it directly
    /// (`engine/durability.rs`), and always for devices and FIFOs.
    pub fn fsync(&self, fh: u64, datasync: bool) -> FsResult<()> {
        self.op(Op::Fsync, |otx| {
            let c = &self.base.durability.counters;
            Counters::add(&c.calls, 1);
            self.base.group_commit();
            let h = self.handle(fh)?;
            if let Open::Temp { file, .. } = &h.file
                && file.lock().fate == Fate::Resident
            {
                Counters::add(&c.temp_calls, 1);
                return Ok(());
            }
            Counters::add(&c.file_calls, 1);
            let file = self.lower_file(&h)?;
            if let Open::Lower { passthrough: true, .. } = &h.file {
                // The kernel wrote this file's data to the lower file itself, unseen: only
                // the lower file's fsync makes it durable. From its next open on, the file
                // takes the NVRAM path (the profile learns it).
                Counters::add(&self.routes.counters.fsyncs, 1);
                self.base.lower.fsync(file, datasync)?;
                Counters::add(&c.waited_on_lower, 1);
                self.learn_route(otx, h.node_id, Signal::Fsync);
                return Ok(());
            }
            if matches!(h.file, Open::Lower { regular: true, .. } | Open::Temp { .. }) {
                self.learn_route(otx, h.node_id, Signal::Fsync);
            }
            let waited = match self.via(&h)? {
                Via::Cache(key) | Via::Direct(key) => {
                    self.sync_if_unsynced(key, || Ok(self.base.lower.fsync(file, datasync)?))?
                }
                Via::Plain => {
                    self.base.lower.fsync(file, datasync)?;
                    true
                }
            };
            Counters::add(&c.waited_on_lower, u64::from(waited));
            Ok(())
        })
    }

    /// Allocation is the lower file system's business: fallocate on a temp file transforms
    /// it first.
    pub fn fallocate(&self, fh: u64, mode: i32, offset: u64, len: u64) -> FsResult<()> {
        let h = self.handle(fh)?;
        if let Open::Temp { .. } = &h.file {
            self.lower_object(h.node_id, tempfs::Trigger::Fallocate)?;
        }
        self.op(Op::Fallocate, |_| {
            let file = self.lower_file(&h)?;
            match self.via(&h)? {
                Via::Cache(key) | Via::Direct(key) => {
                    self.cache.with_clean_lower(&self.base, key, |w1| {
                        Ok(self.base.lower.fallocate(w1, file, mode, offset, len)?)
                    })?;
                    self.lower_changed(key, || Ok(self.base.lower.fsync(file, false)?))
                }
                Via::Plain => {
                    let w1 = self.base.committed();
                    Ok(self.base.lower.fallocate(&w1, file, mode, offset, len)?)
                }
            }
        })
    }

    pub fn lseek(&self, fh: u64, offset: i64, whence: i32) -> FsResult<i64> {
        self.op(Op::Lseek, |_| {
            let h = self.handle(fh)?;
            if let Open::Temp { file, .. } = &h.file {
                let st = file.lock();
                if st.fate == Fate::Resident {
                    let from = u64::try_from(offset).map_err(|_| answer(libc::EINVAL))?;
                    let found = match whence {
                        libc::SEEK_DATA => data::seek_data(&st.pages, st.rec.size, from),
                        libc::SEEK_HOLE => data::seek_hole(&st.pages, st.rec.size, from),
                        _ => return Err(answer(libc::EINVAL)),
                    };
                    return found.and_then(|o| i64::try_from(o).ok()).ok_or(answer(libc::ENXIO));
                }
            }
            if let Via::Cache(key) = self.via(&h)?
                && let Some(cf) = self.cache.cached(key)
                && matches!(whence, libc::SEEK_DATA | libc::SEEK_HOLE)
                && let Some(found) = crate::cache::PageCache::cached_seek(
                    &self.base,
                    &cf,
                    self.lower_file(&h)?,
                    offset,
                    whence,
                )?
            {
                return Ok(found);
            }
            Ok(self.base.lower.lseek(self.lower_file(&h)?, offset, whence)?)
        })
    }

    pub fn copy_file_range(
        &self,
        fh_in: u64,
        offset_in: u64,
        fh_out: u64,
        offset_out: u64,
        len: u64,
    ) -> FsResult<u64> {
        let input = self.handle(fh_in)?;
        let output = self.handle(fh_out)?;
        // A temp file on either side, an input with dirty pages in NVRAM, or an output the
        // cache takes: copy through the engine.
        let temp = |h: &Handle<Open<L>>| matches!(h.file, Open::Temp { .. });
        let (via_in, via_out) = (self.via(&input)?, self.via(&output)?);
        let cached_in = matches!(via_in, Via::Cache(k) if self.cache.cached(k).is_some());
        let cached_out = matches!(via_out, Via::Cache(_)) && self.cache.config().enabled;
        if temp(&input) || temp(&output) || cached_in || cached_out {
            return self.copy_by_buffer(fh_in, offset_in, fh_out, offset_out, len);
        }
        self.op(Op::CopyFileRange, |_| {
            let copy = |w1: &Committed| -> FsResult<u64> {
                Ok(self.base.lower.copy_file_range(
                    w1,
                    self.lower_file(&input)?,
                    offset_in,
                    self.lower_file(&output)?,
                    offset_out,
                    len,
                )?)
            };
            let n = match via_out {
                Via::Cache(key) | Via::Direct(key) => {
                    let n = self.cache.with_clean_lower(&self.base, key, copy)?;
                    let file = self.lower_file(&output)?;
                    self.lower_changed(key, || Ok(self.base.lower.fsync(file, false)?))?;
                    n
                }
                Via::Plain => copy(&self.base.committed())?,
            };
            Counters::add(&self.base.counters.app_bytes_written, n);
            Counters::add(&self.base.counters.lower_bytes_written, n);
            Ok(n)
        })
    }

    /// copy_file_range through the engine (a temp file or the page cache on a side): read and
    /// write in chunks of at most 1 MiB; each chunk is one read and one write operation.
    fn copy_by_buffer(
        &self,
        fh_in: u64,
        offset_in: u64,
        fh_out: u64,
        offset_out: u64,
        len: u64,
    ) -> FsResult<u64> {
        const CHUNK: u64 = 1 << 20;
        let mut done = 0u64;
        while done < len {
            let want = (len - done).min(CHUNK) as u32;
            let mut chunk = Vec::new();
            self.read(fh_in, offset_in + done, want, |d| chunk.extend_from_slice(d))?;
            if chunk.is_empty() {
                break;
            }
            let n = self.write(fh_out, offset_out + done, &chunk, false)?;
            done += n as u64;
            if n < chunk.len() {
                break;
            }
        }
        self.base.counters.request(Op::CopyFileRange, true);
        Ok(done)
    }
}
