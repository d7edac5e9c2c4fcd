//! The image file as the engine's durable medium: reads and writes at offsets, discards as
//! punched holes (the image stays sparse), and a host sync only at detach.
//!
//! Durability on the *modeled* drive is the volatile cache's business (`crate::cache`): this
//! medium is what survives the modeled power cut, whether or not the host has synced it.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use crate::cache::Medium;

/// The image file as the durable medium.
#[derive(Debug)]
pub struct FileMedium {
    file: File,
    len_bytes: u64,
}

impl FileMedium {
    pub fn new(file: File, len_bytes: u64) -> Self {
        FileMedium { file, len_bytes }
    }
}

impl Medium for FileMedium {
    fn len_bytes(&self) -> u64 {
        self.len_bytes
    }
    fn read_at(&self, buf: &mut [u8], offset_bytes: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, offset_bytes)
    }
    fn write_at(&mut self, data: &[u8], offset_bytes: u64) -> io::Result<()> {
        self.file.write_all_at(data, offset_bytes)
    }
    fn zero_range(&mut self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        // Punching a hole keeps the image sparse; fall back to writing zeros where the host
        // file system cannot punch.
        #[allow(clippy::cast_possible_wrap)]
        let (off, len) = (offset_bytes as i64, len_bytes as i64);
        // SAFETY: plain syscall on an owned, open descriptor; no memory is passed.
        let rc = unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                off,
                len,
            )
        };
        if rc == 0 {
            return Ok(());
        }
        let zeros = vec![0u8; 1 << 20];
        let mut done = 0;
        while done < len_bytes {
            let n = (len_bytes - done).min(zeros.len() as u64);
            self.file.write_all_at(&zeros[..n as usize], offset_bytes + done)?;
            done += n;
        }
        Ok(())
    }
    fn sync(&mut self) -> io::Result<()> {
        self.file.sync_all()
    }
}
