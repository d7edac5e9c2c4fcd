//! The per-request trace and the per-LBN write histogram.
//!
//! Trace format (text, one request per line, written to the file given by `--trace`):
//! `arrival_ns start_ns end_ns op lba sectors` where `op` is `R`, `W`, `F` (flush, lba and
//! sectors 0) or `D` (discard). Times are on the modeled clock, LBAs in 512-byte sectors.
//!
//! Limits: at most [`TRACE_BUFFER_RECORDS`] records are buffered in memory; a full buffer is
//! written to the file before the next record is added, so memory stays bounded whatever the
//! run length. The histogram has one `u32` counter per LBN of the device (fixed at start,
//! `size / lbn_bytes` entries); counters saturate instead of wrapping.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;

/// Records buffered before a write to the trace file.
pub(crate) const TRACE_BUFFER_RECORDS: usize = 64 * 1024;

/// One traced request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Record {
    pub(crate) arrival_ns: u64,
    pub(crate) start_ns: u64,
    pub(crate) end_ns: u64,
    pub(crate) op: char,
    pub(crate) lba: u64,
    pub(crate) sectors: u64,
}

/// A bounded trace buffer in front of a file.
#[derive(Debug)]
pub(crate) struct Trace {
    out: BufWriter<File>,
    buffer: Vec<Record>,
    pub(crate) records: u64,
}

impl Trace {
    pub(crate) fn create(path: &Path) -> io::Result<Trace> {
        let mut out = BufWriter::new(File::create(path)?);
        writeln!(out, "# arrival_ns start_ns end_ns op lba sectors")?;
        Ok(Trace { out, buffer: Vec::with_capacity(TRACE_BUFFER_RECORDS), records: 0 })
    }

    pub(crate) fn push(&mut self, r: Record) -> io::Result<()> {
        if self.buffer.len() == TRACE_BUFFER_RECORDS {
            self.write_out()?;
        }
        self.buffer.push(r);
        self.records += 1;
        Ok(())
    }

    fn write_out(&mut self) -> io::Result<()> {
        for r in self.buffer.drain(..) {
            writeln!(
                self.out,
                "{} {} {} {} {} {}",
                r.arrival_ns, r.start_ns, r.end_ns, r.op, r.lba, r.sectors
            )?;
        }
        Ok(())
    }

    /// Writes everything buffered to the file.
    pub(crate) fn flush(&mut self) -> io::Result<()> {
        self.write_out()?;
        self.out.flush()
    }
}

/// Writes per logical block number (`lbn = byte offset / lbn_bytes`).
#[derive(Debug, Clone)]
pub(crate) struct WriteHistogram {
    lbn_bytes: u64,
    counts: Vec<u32>,
}

impl WriteHistogram {
    /// `lbn_bytes` must be a power of two of at least 512.
    pub(crate) fn new(device_bytes: u64, lbn_bytes: u64) -> WriteHistogram {
        assert!(lbn_bytes >= 512 && lbn_bytes.is_power_of_two());
        WriteHistogram { lbn_bytes, counts: vec![0; device_bytes.div_ceil(lbn_bytes) as usize] }
    }

    /// Counts one write touching bytes `[offset, offset + len)`.
    pub(crate) fn record(&mut self, offset: u64, len: u64) {
        if len == 0 {
            return;
        }
        let first = offset / self.lbn_bytes;
        let last = (offset + len - 1) / self.lbn_bytes;
        for lbn in first..=last {
            if let Some(c) = self.counts.get_mut(lbn as usize) {
                *c = c.saturating_add(1);
            }
        }
    }

    #[cfg(test)]
    pub(crate) fn count(&self, lbn: u64) -> u32 {
        self.counts.get(lbn as usize).copied().unwrap_or(0)
    }

    /// Writes `# lbn_bytes N` then `lbn count` for every written LBN.
    pub(crate) fn write_to(&self, path: &Path) -> io::Result<()> {
        let mut out = BufWriter::new(File::create(path)?);
        writeln!(out, "# lbn_bytes {}", self.lbn_bytes)?;
        writeln!(out, "# lbn writes")?;
        for (lbn, &c) in self.counts.iter().enumerate() {
            if c > 0 {
                writeln!(out, "{lbn} {c}")?;
            }
        }
        out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_counts_every_touched_lbn() {
        let mut h = WriteHistogram::new(64 * 1024, 4096);
        h.record(0, 4096);
        h.record(4095, 2); // touches lbn 0 and 1
        h.record(8192, 8192);
        let got: Vec<u32> = (0..5).map(|l| h.count(l)).collect();
        assert_eq!(got, vec![2, 1, 1, 1, 0]);
        h.record(1 << 40, 512); // beyond the device: ignored
    }

    #[test]
    fn trace_writes_all_records_through_a_bounded_buffer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.trace");
        let mut t = Trace::create(&path).unwrap();
        let n = TRACE_BUFFER_RECORDS + 10;
        for i in 0..n as u64 {
            t.push(Record {
                arrival_ns: i,
                start_ns: i,
                end_ns: i + 1,
                op: 'W',
                lba: i,
                sectors: 8,
            })
            .unwrap();
            assert!(t.buffer.len() <= TRACE_BUFFER_RECORDS);
        }
        t.flush().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), n + 1);
        assert!(text.lines().nth(1).unwrap().starts_with("0 0 1 W 0 8"));
    }
}
