//! Reading and writing: through a temp file, the page cache, or straight to the lower file.

use std::sync::Arc;

use lower::LowerFs;
use txn::TxError;

use crate::base::OpTx;
use crate::base::counters::{Counters, Op};
use crate::base::error::{FsError, FsResult};
use crate::engine::{Engine, Via, stale};
use crate::tempfs::names::{Obj, Open};
use crate::tempfs::{self, Fate, TempFile, data};

/// What a write leaves to do after its operation ended.
enum After {
    Nothing,
    Temp(Arc<TempFile>),
    Cached,
}

impl<L: LowerFs> Engine<L> {
    /// Reads up to `size` bytes and hands them to `reply`. The bytes live in a buffer owned by
    /// the calling worker thread and reused across requests (no allocation and zero-fill per
    /// read).
    pub fn read(&self, fh: u64, offset: u64, size: u32, reply: impl FnOnce(&[u8])) -> FsResult<()> {
        let result = self.read_uncounted(fh, offset, size, reply);
        self.base.counters.request(Op::Read, result.is_ok());
        result
    }

    /// [`Engine::read`] not counted as a request (the direct path reads a file's last byte).
    pub(crate) fn read_uncounted(
        &self,
        fh: u64,
        offset: u64,
        size: u32,
        reply: impl FnOnce(&[u8]),
    ) -> FsResult<()> {
        thread_local! {
            static BUFFER: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        self.attempt(|tx| {
            let h = self.handle(fh)?;
            BUFFER.with_borrow_mut(|buf| {
                if buf.len() < size as usize {
                    buf.resize(size as usize, 0);
                }
                let buf = &mut buf[..size as usize];
                if let Open::Temp { file, .. } = &h.file {
                    let mut st = file.lock();
                    if st.fate == Fate::Resident {
                        let n = data::read(&self.base.pool, &st.pages, st.rec.size, offset, buf);
                        st.last_use = self.temp.lru.tick();
                        crate::tempfs::TempFs::temp_touch_atime(&self.base, tx, file, &mut st)?;
                        drop(st);
                        Counters::add(&self.base.counters.app_bytes_read, n as u64);
                        reply(&buf[..n]);
                        return Ok(());
                    }
                }
                let file = self.lower_file(&h)?;
                let n = match self.via(&h)? {
                    Via::Cache(key) => {
                        let cached = match self.cache.cached(key) {
                            Some(cf) => {
                                self.cache.cached_read(&self.base, &cf, file, offset, buf)?
                            }
                            None => None,
                        };
                        if let Some(n) = cached {
                            Counters::add(&self.base.counters.app_bytes_read, n as u64);
                            reply(&buf[..n]);
                            return Ok(());
                        }
                        self.base.lower.read(file, offset, buf)?
                    }
                    Via::Direct(key) => self.cache.with_clean_lower(&self.base, key, |_| {
                        Ok(self.base.lower.read(file, offset, buf)?)
                    })?,
                    Via::Plain => self.base.lower.read(file, offset, buf)?,
                };
                Counters::add(&self.base.counters.app_bytes_read, n as u64);
                Counters::add(&self.base.counters.lower_bytes_read, n as u64);
                reply(&buf[..n]);
                Ok(())
            })
        })
    }

    /// `kill_suidgid`: the kernel asks to remove set-ID bits first (a write by an
    /// unprivileged caller).
    ///
    /// A full NVRAM never fails a write the lower file system would take: with no free frame,
    /// room is made once (least recently used temp files transformed, inactive dirty pages
    /// written back by the policy); if that did not help, or the write needs more undo log
    /// than a slot holds, the file leaves NVRAM (a temp file is transformed, a cached file's
    /// write goes through to the lower file, which is written back first).
    ///
    /// The request is counted once, with its answer; the attempts that found NVRAM full and
    /// aborted are counted apart (`retries.write`).
    pub fn write(&self, fh: u64, offset: u64, data: &[u8], kill_suidgid: bool) -> FsResult<usize> {
        let result = self.write_retrying(fh, offset, data, kill_suidgid);
        self.base.counters.request(Op::Write, result.is_ok());
        result
    }

    pub(crate) fn write_retrying(
        &self,
        fh: u64,
        offset: u64,
        data: &[u8],
        kill_suidgid: bool,
    ) -> FsResult<usize> {
        let mut pressured = false;
        let mut write_through = false;
        let mut attempts = 0;
        loop {
            // A limit: as it is, after room was made, after its temp file was transformed,
            // written through - each arm below moves on, so a write is tried at most four times.
            attempts += 1;
            debug_assert!(attempts <= 4, "a write tried {attempts} times");
            let result = self
                .attempt(|otx| self.write_once(otx, fh, offset, data, kill_suidgid, write_through));
            if matches!(result, Err(FsError::Nvram(_))) {
                // An aborted attempt; the arms below make room and try again, or fail.
                Counters::add(&self.base.counters.write_retries, 1);
            }
            match result {
                Ok((n, After::Temp(file))) => {
                    debug_assert_eq!(n, data.len(), "a write to NVRAM is whole or fails");
                    self.temp.after_write(&self.base, &file);
                    self.relieve_pressure(false);
                    return Ok(n);
                }
                Ok((n, After::Cached)) => {
                    debug_assert_eq!(n, data.len(), "a write to NVRAM is whole or fails");
                    self.cache.after_cached_write(&self.base);
                    return Ok(n);
                }
                Ok((n, After::Nothing)) => return Ok(n),
                Err(FsError::Nvram(TxError::NoFrames)) if !pressured => {
                    pressured = true;
                    self.make_room();
                }
                Err(FsError::Nvram(e)) => {
                    let h = self.handle(fh)?;
                    match &h.file {
                        Open::Temp { file, .. } if file.lock().fate == Fate::Resident => {
                            self.temp.transform(&self.base, file, tempfs::Trigger::NvramFull)?;
                        }
                        _ if !write_through => {
                            write_through = true;
                            self.cache.count_write_through();
                        }
                        _ => return Err(FsError::Nvram(e)),
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// One attempt of `write`: to the temp file, through the page cache (unless
    /// `write_through`), or to the lower file.
    fn write_once(
        &self,
        otx: &mut OpTx<'_>,
        fh: u64,
        offset: u64,
        data: &[u8],
        kill_suidgid: bool,
        write_through: bool,
    ) -> FsResult<(usize, After)> {
        let h = self.handle(fh)?;
        if let Open::Temp { file, .. } = &h.file
            && let Some(written) =
                self.temp.temp_write(&self.base, otx, file, offset, data, kill_suidgid)?
        {
            return Ok((written, After::Temp(Arc::clone(file))));
        }
        let via = self.via(&h)?;
        if kill_suidgid || matches!(via, Via::Cache(_)) {
            let Obj::Lower(node) = self.obj(h.node_id)? else {
                return Err(stale(h.node_id));
            };
            if kill_suidgid {
                self.kill_suidgid(otx, &node)?;
            }
            if let Via::Cache(key) = via
                && self.cache.config().enabled
                && !write_through
            {
                if data.len() < crate::engine::routing::SMALL_WRITE
                    && let Open::Lower { small_writes, .. } = &h.file
                {
                    small_writes.store(true, std::sync::atomic::Ordering::Relaxed);
                }
                while let Some(cf) = self.cache.cache_entry(&self.base, otx, &node, key)? {
                    if let Some(n) = self.cache.cached_write(&self.base, otx, &cf, offset, data)? {
                        Counters::add(&self.base.counters.app_bytes_written, n as u64);
                        return Ok((n, After::Cached));
                    }
                }
            }
        }
        let file = self.lower_file(&h)?;
        let n = match via {
            Via::Cache(key) | Via::Direct(key) => {
                let n = self.cache.with_clean_lower(&self.base, key, |w1| {
                    Ok(self.base.lower.write(w1, file, offset, data)?)
                })?;
                // Written through: only as durable as the lower file system makes it.
                self.lower_changed(key, || Ok(self.base.lower.fsync(file, false)?))?;
                n
            }
            Via::Plain => self.base.lower.write_special(file, offset, data)?,
        };
        Counters::add(&self.base.counters.app_bytes_written, n as u64);
        Counters::add(&self.base.counters.lower_bytes_written, n as u64);
        Ok((n, After::Nothing))
    }
}
