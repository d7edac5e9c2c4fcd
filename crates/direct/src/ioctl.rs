//! The two ioctls through which the library asks the daemon, on the open descriptor of the
//! delegated file (docs/direct-path.md "Grant"): restricted FUSE ioctls, so the kernel copies
//! fixed-size structures in and out (their size is in the command number) and the daemon sees
//! the caller's uid, gid and pid with the open's handle - the proof that the caller holds a
//! writable open of exactly that file.
//!
//! `DELEGATE` (in and out 256 bytes, little endian):
//!
//! | bytes | in | out |
//! |---|---|---|
//! | 0..4 | [`VERSION`] | [`VERSION`] |
//! | 4..8 | zero | zero |
//! | 8..16 | | the grant id |
//! | 16..24 | | the node id (the log header's) |
//! | 24..32 | | the file's size |
//! | 32..40 | | the first record's sequence number |
//! | 40..48 | | the log area's length |
//! | 48..256 | | the log file's path, NUL-terminated |
//!
//! Refusals are errors of the ioctl: `EBUSY` (another open of the file, or a delegation of it
//! already held through another open), `EOPNOTSUPP` (the direct path is off, the open is in
//! passthrough, not a regular file, not undo mode), `ENOSPC` (too many delegations), `EBADF`
//! (the open cannot write).
//!
//! `MERGE` (in and out 32 bytes): in the grant id (0..8) and flags (8..12: [`MERGE_END`] ends the
//! delegation); out the next record's sequence number (0..8, the log starts over with it) and
//! the file's size (8..16). The library asks when its log is full (the daemon merges and resets
//! the log) and before an mmap (with `MERGE_END`).

/// `_IOWR(type, nr, size)` of Linux's asm-generic ioctl.h.
const fn iowr(kind: u8, nr: u8, size: u32) -> u32 {
    (3 << 30) | (size << 16) | ((kind as u32) << 8) | nr as u32
}

/// The structures' version.
pub const VERSION: u32 = 1;
pub const DELEGATE_BYTES: usize = 256;
pub const MERGE_BYTES: usize = 32;
/// Ask for a delegation of the file open on the descriptor.
pub const DELEGATE: u32 = iowr(b'N', 0x45, DELEGATE_BYTES as u32);
/// Merge the log (and with [`MERGE_END`] end the delegation).
pub const MERGE: u32 = iowr(b'N', 0x46, MERGE_BYTES as u32);
/// `MERGE` flag: end the delegation after the merge.
pub const MERGE_END: u32 = 1;
/// Bytes of the path in `DELEGATE`'s answer, its NUL included.
pub const MAX_PATH: usize = DELEGATE_BYTES - 48;

/// `DELEGATE`'s answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Granted {
    pub grant: u64,
    pub node: u64,
    pub size: u64,
    pub first_seq: u64,
    pub log_len: u64,
    pub path: Vec<u8>,
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().expect("8 bytes"))
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().expect("4 bytes"))
}

/// The request of `DELEGATE`.
pub fn delegate_request() -> [u8; DELEGATE_BYTES] {
    let mut b = [0u8; DELEGATE_BYTES];
    b[0..4].copy_from_slice(&VERSION.to_le_bytes());
    b
}

/// Whether a `DELEGATE` request is of this version.
pub fn delegate_request_ok(b: &[u8]) -> bool {
    b.len() >= 8 && u32_at(b, 0) == VERSION
}

impl Granted {
    /// The answer's bytes; `None` when the path does not fit.
    pub fn encode(&self) -> Option<[u8; DELEGATE_BYTES]> {
        if self.path.len() >= MAX_PATH || self.path.contains(&0) {
            return None;
        }
        let mut b = [0u8; DELEGATE_BYTES];
        b[0..4].copy_from_slice(&VERSION.to_le_bytes());
        b[8..16].copy_from_slice(&self.grant.to_le_bytes());
        b[16..24].copy_from_slice(&self.node.to_le_bytes());
        b[24..32].copy_from_slice(&self.size.to_le_bytes());
        b[32..40].copy_from_slice(&self.first_seq.to_le_bytes());
        b[40..48].copy_from_slice(&self.log_len.to_le_bytes());
        b[48..48 + self.path.len()].copy_from_slice(&self.path);
        Some(b)
    }

    /// Reads an answer; `None` when it is not of this version.
    pub fn decode(b: &[u8]) -> Option<Granted> {
        if b.len() < DELEGATE_BYTES || u32_at(b, 0) != VERSION {
            return None;
        }
        let path = &b[48..DELEGATE_BYTES];
        let n = path.iter().position(|&c| c == 0)?;
        Some(Granted {
            grant: u64_at(b, 8),
            node: u64_at(b, 16),
            size: u64_at(b, 24),
            first_seq: u64_at(b, 32),
            log_len: u64_at(b, 40),
            path: path[..n].to_vec(),
        })
    }
}

/// The request of `MERGE`.
pub fn merge_request(grant: u64, flags: u32) -> [u8; MERGE_BYTES] {
    let mut b = [0u8; MERGE_BYTES];
    b[0..8].copy_from_slice(&grant.to_le_bytes());
    b[8..12].copy_from_slice(&flags.to_le_bytes());
    b
}

/// A `MERGE` request's grant and flags.
pub fn merge_request_decode(b: &[u8]) -> Option<(u64, u32)> {
    (b.len() >= 12).then(|| (u64_at(b, 0), u32_at(b, 8)))
}

/// The answer of `MERGE`: the next sequence number and the file's size.
pub fn merge_answer(next_seq: u64, size: u64) -> [u8; MERGE_BYTES] {
    let mut b = [0u8; MERGE_BYTES];
    b[0..8].copy_from_slice(&next_seq.to_le_bytes());
    b[8..16].copy_from_slice(&size.to_le_bytes());
    b
}

/// Reads a `MERGE` answer.
pub fn merge_answer_decode(b: &[u8]) -> Option<(u64, u64)> {
    (b.len() >= 16).then(|| (u64_at(b, 0), u64_at(b, 8)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_numbers_are_linux_iowr() {
        // _IOWR('N', 0x45, 256) computed by hand: dir 3, size 256, type 0x4e, nr 0x45.
        assert_eq!(DELEGATE, 0xc100_4e45);
        assert_eq!(MERGE, 0xc020_4e46);
    }

    #[test]
    fn answers_round_trip() {
        let g = Granted {
            grant: 7,
            node: 9,
            size: 4096,
            first_seq: 1,
            log_len: 4 << 20,
            path: b"/dev/shm/x/7.log".to_vec(),
        };
        assert_eq!(Granted::decode(&g.encode().unwrap()), Some(g.clone()));
        let long = Granted { path: vec![b'a'; MAX_PATH], ..g };
        assert_eq!(long.encode(), None);
        assert_eq!(merge_answer_decode(&merge_answer(5, 6)), Some((5, 6)));
        assert_eq!(merge_request_decode(&merge_request(3, MERGE_END)), Some((3, MERGE_END)));
    }
}
