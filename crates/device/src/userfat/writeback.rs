//! What reaches the device when: the three write-back modes of the module docs, as the
//! actor applies them.
//!
//! - after every operation that changed the volume, [`Volume::finish`]: `sync` writes all
//!   and flushes the device; NVFAT (`metadata_through`) writes the metadata sectors written by
//!   this operation ([`Volume::commit_metadata`]); past `dirty_max_bytes` everything dirty is
//!   written (`dirty_ratio`);
//! - every `writeback_interval`, [`Volume::writeback_tick`]: the sectors dirty for at least
//!   `dirty_expire` are written and the device flushed (pdflush);
//! - fsync, fsyncdir and unmount: everything, then a device flush ([`Volume::sync_all`]).
//!
//! A failed write leaves its sectors dirty (the sector store keeps them pending), so the next
//! tick or sync retries them; nothing acknowledged is dropped.

use std::io;
use std::time::Instant;

use fuser::Errno;

use super::disk::SECTOR;
use super::errno::io_err;
use super::volume::Volume;

impl Volume {
    /// After an operation that changed the volume: what its mode writes now (module docs).
    pub(super) fn finish(&mut self) -> io::Result<()> {
        self.counters.ops += 1;
        if self.cfg.sync {
            return self.disk.borrow_mut().sync();
        }
        if self.classifier.is_some() {
            self.commit_metadata()?;
        }
        let dirty = self.disk.borrow().pending_sectors() as u64 * SECTOR;
        if dirty > self.cfg.dirty_max_bytes {
            self.disk.borrow_mut().commit()?;
        }
        Ok(())
    }

    /// NVFAT: the metadata sectors this operation wrote go to the device now. Only the sectors
    /// written since the last call are classified (a pending data sector stays data until it
    /// is written again: a cluster that becomes a directory's is written - zeroed - by the
    /// operation that makes it one). The classifier learns from the metadata about to be
    /// written first (a new directory's entry in its parent names its clusters), then picks.
    fn commit_metadata(&mut self) -> io::Result<()> {
        let Some(mut cls) = self.classifier.take() else { return Ok(()) };
        let mut disk = self.disk.borrow_mut();
        let fresh = disk.take_fresh();
        for &s in &fresh {
            if cls.class_of(s).is_metadata() {
                if let Some(data) = disk.pending_data(s).map(<[u8]>::to_vec) {
                    cls.wrote(s, &data, &mut *disk);
                }
            }
        }
        let picked: Vec<u64> =
            fresh.iter().copied().filter(|s| cls.class_of(*s).is_metadata()).collect();
        let r = disk.commit_only(&picked);
        if r.is_err() {
            disk.restore_fresh(&fresh);
        }
        drop(disk);
        self.classifier = Some(cls);
        if r.as_ref().is_ok_and(|n| *n > 0) {
            self.counters.metadata_commits += 1;
        }
        r.map(drop)
    }

    /// The write-back tick: sectors dirty for `dirty_expire` are written and the device is
    /// flushed (only if something was written).
    pub(super) fn writeback_tick(&mut self) -> io::Result<()> {
        self.last_writeback = Instant::now();
        let now = self.seconds();
        let expire = self.cfg.dirty_expire.as_secs();
        let n = self.disk.borrow_mut().commit_where(|_, e, _| e + expire <= now)?;
        if n > 0 {
            self.counters.writebacks += 1;
            self.disk.borrow_mut().sync()?;
        }
        Ok(())
    }

    pub(super) fn sync_all(&mut self) -> Result<(), Errno> {
        self.disk.borrow_mut().sync().map_err(io_err)
    }
}
