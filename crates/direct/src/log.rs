//! A delegation's log area: one file's writes, appended by the library that holds the
//! delegation and read by the daemon, which trusts nothing in it (docs/direct-path.md).
//!
//! Layout (little endian; the area is a [`Region`] - an mmap of the log file, or a simulated
//! region in tests):
//!
//! | bytes | what |
//! |---|---|
//! | 0..8 | magic `NVSDLOG1` |
//! | 8..16 | the grant id the daemon gave this delegation |
//! | 16..24 | the delegated node id |
//! | 24..32 | `base`: the sequence number of the record at [`HEADER_BYTES`] |
//! | 32..40 | checksum of bytes 0..32 |
//! | 40..64 | zero |
//! | 64..128 | the control line: `state` and `writers` words (the take-back's handshake; volatile, not validated) |
//! | 128.. | records, each at a 64-byte aligned offset |
//!
//! A record: the **commit word** u64 (`tag(grant, seq)`: a checksum of the grant and the
//! record's sequence number, never zero), `offset` u64, `len` u32, `kind` u8, three zero
//! bytes, checksum u64 of (grant, seq, offset, len, kind, data), then `len` bytes of data, padded
//! to a multiple of 64 bytes. [`RecordKind::Write`] writes `data` at `offset`;
//! [`RecordKind::Truncate`] sets the file's size to `offset` (no data).
//!
//! **DL1** (the commit protocol, [`LogWriter::append`]): the record's body and checksum are
//! written and persisted first, then the commit word, which is persisted before the append
//! returns. A crash at any instant leaves every record whose append returned whole, and any
//! other record either absent or recognisably uncommitted (its commit word is not the next
//! sequence number, or - only after damage - its checksum fails).
//!
//! **DL2** (the reading rule, [`scan`]): records are read from [`HEADER_BYTES`] in order, the
//! first with sequence number `base`, each next one `seq + 1`. A word that is not the expected
//! record's tag ends the log: zero (never written), a record of an earlier pass over the area
//! before [`reset`] (its tag is of a smaller sequence number), or the data of such a record -
//! after a reset the records fall at other offsets, so *any* bytes may stand where the next
//! commit word would be, and only a tag of the expected sequence number for this grant counts
//! (a stale word matches it with probability 2^-64; a process that forges one harms only its
//! own file). Under the right tag, anything that is not a valid record - a checksum that fails,
//! a length past the area, an unknown kind, an offset past the file size limit - is damage:
//! the records before it are the valid prefix, and the log is refused.
//! (Found by the crash sweep: a first version ended the log only at words below the expected
//! sequence number and read a reset area's stale data as a sequence gap.)
//!
//! Re-applying a record is idempotent (absolute offsets, a truncate sets a size), so the daemon
//! may merge a prefix twice after its own crash.

use nvram::Region;
use nvram::checksum::checksum;

/// Bytes before the first record: the header line and the control line.
pub const HEADER_BYTES: u64 = 128;
/// Every record starts at a multiple of this.
pub const RECORD_ALIGN: u64 = 64;
/// Bytes of a record before its data.
pub const RECORD_HEAD: u64 = 32;
/// The largest data of one record: a write larger than this is split by the library into
/// several records (each atomic; the write as a whole is atomic only up to this size, as a
/// FUSE write is up to `--max-write`).
pub const MAX_RECORD_DATA: u32 = 1 << 20;
/// The largest file size a record may make (the engine's limit: `i64::MAX`, EFBIG beyond).
pub const MAX_FILE_SIZE: u64 = i64::MAX as u64;

const MAGIC: u64 = u64::from_le_bytes(*b"NVSDLOG1");
/// Offset of the take-back's `state` word (docs/direct-path.md, "Take-back").
pub const STATE_WORD: u64 = 64;
/// Offset of the take-back's `writers` word.
pub const WRITERS_WORD: u64 = 72;

/// What a record asks of the delegated file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordKind {
    /// `data` written at `offset`.
    Write,
    /// The size set to `offset`.
    Truncate,
}

impl RecordKind {
    fn code(self) -> u8 {
        match self {
            RecordKind::Write => 1,
            RecordKind::Truncate => 2,
        }
    }

    fn from_code(code: u8) -> Option<RecordKind> {
        match code {
            1 => Some(RecordKind::Write),
            2 => Some(RecordKind::Truncate),
            _ => None,
        }
    }
}

/// One committed record, as the daemon merges it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub seq: u64,
    pub kind: RecordKind,
    pub offset: u64,
    pub data: Vec<u8>,
}

/// The header's fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogHeader {
    pub grant: u64,
    pub node: u64,
    /// The sequence number of the first record.
    pub base: u64,
}

/// Why a log is refused as a whole (nothing of it is merged).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LogError {
    #[error("the log area is {0} bytes, smaller than its header")]
    TooSmall(u64),
    #[error("not a delegation log (bad magic or header checksum)")]
    NotALog,
    #[error("the log belongs to grant {found_grant} of node {found_node}, not {grant} of {node}")]
    NotThisDelegation { grant: u64, node: u64, found_grant: u64, found_node: u64 },
}

/// Damage after the valid prefix (DL2): the log is refused, its valid prefix merged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Damage {
    /// The right commit word over a body whose checksum fails.
    Checksum { at: u64, seq: u64 },
    /// A record that would reach past the area, larger than [`MAX_RECORD_DATA`], or a
    /// truncate with data.
    Length { at: u64, len: u32 },
    /// A kind this format does not know.
    Kind { at: u64, code: u8 },
    /// A write or truncate past the file size limit.
    FileSize { at: u64, end: u128 },
}

/// What [`scan`] found: the valid prefix and, if the log is damaged after it, where and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scan {
    pub records: Vec<Record>,
    pub damage: Option<Damage>,
    /// Where the next record would go, and its sequence number.
    pub end: u64,
    pub next_seq: u64,
}

fn header_sum(bytes: &[u8]) -> u64 {
    checksum(&[&bytes[..32]])
}

/// The checksum of a record's fields and data (public for tests that forge records).
pub fn record_sum(grant: u64, seq: u64, offset: u64, len: u32, kind: u8, data: &[u8]) -> u64 {
    checksum(&[
        &grant.to_le_bytes(),
        &seq.to_le_bytes(),
        &offset.to_le_bytes(),
        &len.to_le_bytes(),
        &[kind],
        data,
    ])
}

/// The commit word of record `seq` of `grant` (DL1, DL2).
fn tag(grant: u64, seq: u64) -> u64 {
    checksum(&[b"commit", &grant.to_le_bytes(), &seq.to_le_bytes()]) | 1
}

fn padded(len: u64) -> u64 {
    (RECORD_HEAD + len).div_ceil(RECORD_ALIGN) * RECORD_ALIGN
}

fn u64_at(bytes: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(bytes[off..off + 8].try_into().expect("8 bytes"))
}

/// Writes a fresh header: the daemon, when it creates a delegation's log (the records area is
/// zero in a new file). `base` is the first record's sequence number (at least 1: a zero commit
/// word means "never written").
pub fn format(area: &dyn Region, header: LogHeader) -> Result<(), LogError> {
    if area.len() < HEADER_BYTES + RECORD_ALIGN {
        return Err(LogError::TooSmall(area.len()));
    }
    assert!(header.base >= 1, "sequence numbers start at 1");
    write_header(area, header);
    Ok(())
}

fn write_header(area: &dyn Region, h: LogHeader) {
    let mut bytes = [0u8; 64];
    bytes[0..8].copy_from_slice(&MAGIC.to_le_bytes());
    bytes[8..16].copy_from_slice(&h.grant.to_le_bytes());
    bytes[16..24].copy_from_slice(&h.node.to_le_bytes());
    bytes[24..32].copy_from_slice(&h.base.to_le_bytes());
    let sum = header_sum(&bytes);
    bytes[32..40].copy_from_slice(&sum.to_le_bytes());
    area.write(0, &bytes);
    area.persist(0, 64);
}

/// After a merge of everything up to `next_seq - 1`: the area starts over with `next_seq`
/// (the daemon, while the library waits in its merge request). Old records stay in the area
/// with smaller sequence numbers, which end the log (DL2), so none of them is merged again.
pub fn reset(area: &dyn Region, grant: u64, node: u64, next_seq: u64) {
    write_header(area, LogHeader { grant, node, base: next_seq });
}

/// Reads and checks the header (a private copy of it), checking it belongs to `grant` of
/// `node`.
fn read_header(
    len: u64,
    read: &mut dyn FnMut(u64, &mut [u8]),
    grant: u64,
    node: u64,
) -> Result<LogHeader, LogError> {
    if len < HEADER_BYTES + RECORD_ALIGN {
        return Err(LogError::TooSmall(len));
    }
    let mut image = [0u8; 40];
    read(0, &mut image);
    if u64_at(&image, 0) != MAGIC || u64_at(&image, 32) != header_sum(&image) {
        return Err(LogError::NotALog);
    }
    let h =
        LogHeader { grant: u64_at(&image, 8), node: u64_at(&image, 16), base: u64_at(&image, 24) };
    if h.grant != grant || h.node != node {
        return Err(LogError::NotThisDelegation {
            grant,
            node,
            found_grant: h.grant,
            found_node: h.node,
        });
    }
    Ok(h)
}

/// The daemon's reading of a log (DL2), on a private copy of its bytes (never on memory the
/// library can still write).
pub fn scan(image: &[u8], grant: u64, node: u64) -> Result<Scan, LogError> {
    let mut read = |off: u64, buf: &mut [u8]| {
        buf.copy_from_slice(&image[off as usize..off as usize + buf.len()]);
    };
    scan_with(image.len() as u64, &mut read, grant, node, None)
}

/// The daemon's reading of a live log area that the library may still write: each piece (the
/// header, a record's head, its data) is copied once into private memory and checked there, so
/// what is merged is exactly what was validated. `from`: where an earlier scan of this pass
/// ended (its `end` and `next_seq`), so that a merge reads only the records added since.
pub fn scan_area(
    area: &dyn Region,
    grant: u64,
    node: u64,
    from: Option<(u64, u64)>,
) -> Result<Scan, LogError> {
    let mut read = |off: u64, buf: &mut [u8]| area.read(off, buf);
    scan_with(area.len(), &mut read, grant, node, from)
}

fn scan_with(
    len: u64,
    read: &mut dyn FnMut(u64, &mut [u8]),
    grant: u64,
    node: u64,
    from: Option<(u64, u64)>,
) -> Result<Scan, LogError> {
    let header = read_header(len, read, grant, node)?;
    let (start, first_seq) = from.unwrap_or((HEADER_BYTES, header.base));
    let mut out = Scan { records: Vec::new(), damage: None, end: start, next_seq: first_seq };
    let mut at = start;
    let mut head = [0u8; RECORD_HEAD as usize];
    while at + RECORD_HEAD <= len {
        let seq = out.next_seq;
        read(at, &mut head);
        if u64_at(&head, 0) != tag(grant, seq) {
            break; // never written, or an earlier pass's record or data: the end
        }
        let offset = u64_at(&head, 8);
        let rec_len = u32::from_le_bytes(head[16..20].try_into().expect("4 bytes"));
        let code = head[20];
        let sum = u64_at(&head, 24);
        if rec_len > MAX_RECORD_DATA || at + padded(u64::from(rec_len)) > len {
            out.damage = Some(Damage::Length { at, len: rec_len });
            break;
        }
        let mut data = vec![0u8; rec_len as usize];
        read(at + RECORD_HEAD, &mut data);
        if record_sum(grant, seq, offset, rec_len, code, &data) != sum {
            out.damage = Some(Damage::Checksum { at, seq });
            break;
        }
        let Some(kind) = RecordKind::from_code(code) else {
            out.damage = Some(Damage::Kind { at, code });
            break;
        };
        if kind == RecordKind::Truncate && rec_len != 0 {
            out.damage = Some(Damage::Length { at, len: rec_len });
            break;
        }
        let end = u128::from(offset) + u128::from(rec_len);
        if end > u128::from(MAX_FILE_SIZE) {
            out.damage = Some(Damage::FileSize { at, end });
            break;
        }
        out.records.push(Record { seq, kind, offset, data });
        at += padded(u64::from(rec_len));
        out.end = at;
        out.next_seq = seq + 1;
    }
    Ok(out)
}

/// The library's side: appends records to a log it alone writes (its delegation's).
#[derive(Debug)]
pub struct LogWriter<'a> {
    area: &'a dyn Region,
    grant: u64,
    at: u64,
    next_seq: u64,
}

/// The area has no room for the record: the library asks the daemon to merge and [`reset`].
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("the log area is full: {needed} bytes needed, {free} free")]
pub struct Full {
    pub needed: u64,
    pub free: u64,
}

impl<'a> LogWriter<'a> {
    /// A writer that continues a log: after the grant (an empty log) or after a reset, from
    /// what a [`scan`] of it found.
    pub fn resume(area: &'a dyn Region, grant: u64, end: u64, next_seq: u64) -> LogWriter<'a> {
        LogWriter { area, grant, at: end, next_seq }
    }

    /// Appends one record and returns its sequence number once it is durable (DL1).
    pub fn append(&mut self, kind: RecordKind, offset: u64, data: &[u8]) -> Result<u64, Full> {
        assert!(
            data.len() <= MAX_RECORD_DATA as usize,
            "a record holds at most MAX_RECORD_DATA bytes"
        );
        assert!(kind == RecordKind::Write || data.is_empty(), "a truncate carries no data");
        let len = data.len() as u32;
        let size = padded(u64::from(len));
        let free = self.area.len().saturating_sub(self.at);
        if size > free {
            return Err(Full { needed: size, free });
        }
        let seq = self.next_seq;
        let mut body = Vec::with_capacity(size as usize - 8);
        body.extend_from_slice(&offset.to_le_bytes());
        body.extend_from_slice(&len.to_le_bytes());
        body.extend_from_slice(&[kind.code(), 0, 0, 0]);
        let sum = record_sum(self.grant, seq, offset, len, kind.code(), data);
        body.extend_from_slice(&sum.to_le_bytes());
        body.extend_from_slice(data);
        // Body and checksum first, then the commit word: DL1.
        self.area.write(self.at + 8, &body);
        self.area.persist(self.at + 8, body.len() as u64);
        self.area.store_u64(self.at, tag(self.grant, seq));
        self.area.persist(self.at, 8);
        self.at += size;
        self.next_seq += 1;
        Ok(seq)
    }

    /// Where the next record goes and its sequence number (what [`LogWriter::resume`] takes).
    pub fn position(&self) -> (u64, u64) {
        (self.at, self.next_seq)
    }

    /// Bytes left for records.
    pub fn free(&self) -> u64 {
        self.area.len().saturating_sub(self.at)
    }
}

/// The commit word of record `seq` of `grant` (tests of damage forge records with it).
pub fn commit_tag(grant: u64, seq: u64) -> u64 {
    tag(grant, seq)
}
