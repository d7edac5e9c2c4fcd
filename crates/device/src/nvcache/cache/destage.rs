//! Sectors leaving the cache: destage (D1-D3 of the protocol in `mod.rs`), drain, shrink and
//! discard.
//!
//! The order of a destage is the whole crash argument: the slot is read and verified (D1), the
//! sector is written durably to the image (D2), and only then does one transaction free the
//! entry (D3). A crash between D2 and D3 leaves the sector resident with the bytes the image
//! already holds, so destaging it again is harmless; the other order could lose a sector that
//! was acknowledged. A discard frees entries without writing them: the caller has zeroed the
//! image range first. Drains and discards run in batches of `BATCH_SECTORS`, one transaction
//! each, in LBA order.

use super::{BATCH_SECTORS, Backing, NvCache, NvCacheError};
use crate::nvcache::record::{ENTRY_SIZE, SECTOR};

impl NvCache {
    /// D1-D3 for `lbns` (resident): their bytes to the image, contiguous runs as one write,
    /// then one transaction frees their slots.
    pub(super) fn destage(
        &mut self,
        lbns: &[u64],
        backing: &mut dyn Backing,
        drain: bool,
    ) -> Result<(), NvCacheError> {
        self.ensure_running()?;
        let mut sorted: Vec<u64> = lbns.to_vec();
        sorted.sort_unstable();
        let mut run: Vec<u8> = Vec::new();
        let mut run_start = 0;
        let mut buf = [0u8; SECTOR];
        let mut writes = 0;
        for (i, &lbn) in sorted.iter().enumerate() {
            // D1: a damaged slot is never written to the image.
            match self.read(lbn, &mut buf) {
                Ok(found) => assert!(found, "destage of sector {lbn}, which is not resident"),
                Err(e) => return self.fail(e),
            }
            if run.is_empty() {
                run_start = lbn;
            }
            run.extend_from_slice(&buf);
            let next_contiguous = sorted.get(i + 1) == Some(&(lbn + 1));
            if !next_contiguous {
                // D2: durable on the image before the slot is freed.
                if let Err(e) = backing.write_durable(run_start, &run) {
                    return self.fail(e.into());
                }
                writes += 1;
                run.clear();
            }
        }
        // D3.
        let mut tx = self.pool.begin();
        for lbn in &sorted {
            let (e, _) = self.slot_offsets(self.index[lbn].slot);
            if let Err(err) = tx.update(e, &[0u8; ENTRY_SIZE]) {
                drop(tx);
                return self.fail(err.into());
            }
        }
        tx.commit();
        self.forget(&sorted);
        let c = &mut self.counters;
        c.transactions += 1;
        c.destaged += sorted.len() as u64;
        c.destage_writes += writes;
        if drain {
            c.destaged_drain += sorted.len() as u64;
        } else {
            c.destaged_full += sorted.len() as u64;
        }
        Ok(())
    }

    /// Volatile side of freeing: after the freeing transaction committed.
    fn forget(&mut self, lbns: &[u64]) {
        for lbn in lbns {
            let r = self.index.remove(lbn).expect("forget of a resident sector");
            self.lrw.remove(&r.seq);
            self.free.release(Self::run_of(r.slot));
        }
    }

    /// Destages every resident sector (device flush, clean detach): batches of
    /// `BATCH_SECTORS` in LBA order. Returns the number destaged.
    pub fn drain(&mut self, backing: &mut dyn Backing) -> Result<u64, NvCacheError> {
        let mut all: Vec<u64> = self.index.keys().copied().collect();
        all.sort_unstable();
        for batch in all.chunks(BATCH_SECTORS) {
            self.destage(batch, backing, true)?;
        }
        Ok(all.len() as u64)
    }

    /// Destages LRW sectors until at most `capacity_sectors` are resident (after a re-attach
    /// with a smaller `--nvram-cache-size`).
    pub(crate) fn shrink(&mut self, backing: &mut dyn Backing) -> Result<u64, NvCacheError> {
        let mut n = 0;
        while self.index.len() as u64 > self.anchor.capacity_sectors {
            let victim = *self.lrw.values().next().expect("resident sectors");
            self.destage(&[victim], backing, true)?;
            n += 1;
        }
        Ok(n)
    }

    /// Drops resident sectors `lbns` without writing them (a discard: the caller zeroed the
    /// image range first). Non-resident LBNs are ignored.
    pub fn discard(&mut self, lbns: &[u64]) -> Result<u64, NvCacheError> {
        self.ensure_running()?;
        let resident: Vec<u64> =
            lbns.iter().copied().filter(|l| self.index.contains_key(l)).collect();
        for batch in resident.chunks(BATCH_SECTORS) {
            let mut tx = self.pool.begin();
            for lbn in batch {
                let (e, _) = self.slot_offsets(self.index[lbn].slot);
                if let Err(err) = tx.update(e, &[0u8; ENTRY_SIZE]) {
                    drop(tx);
                    return self.fail(err.into());
                }
            }
            tx.commit();
            self.forget(batch);
            self.counters.transactions += 1;
            self.counters.discarded += batch.len() as u64;
        }
        Ok(resident.len() as u64)
    }
}
