//! The direct path's log areas (`--direct-path on`, docs/direct-path.md "Grant"): one file per
//! delegation in a directory beside the region, on the same medium (`/dev/shm` for the
//! emulated region, a DAX file system for real pmem), so that a log is as durable as the region.
//!
//! The directory is `<region>.logs`, made by the daemon with mode 0711: other users may open a
//! file in it by its name (the grant tells the library), none may list it or create in it.
//! Each log is `<daemon pid>-<grant>.log`, created exclusively (no symlink is followed), 0600 and
//! owned by the caller, so that only the holder's user (and root) can map it; it is 4 MiB.
//! Logs left by a daemon that died are not merged yet (docs/direct-path.md "Steps": the
//! delegation records in the region come next): the start says how many it found and leaves
//! them for inspection.

use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvram::{MmapOptions, MmapRegion, Region};

/// Bytes of each log area.
pub const LOG_BYTES: u64 = 4 << 20;
/// The take-back's bound on the wait for a library thread inside an append.
const WAIT_BOUND_US: u64 = 100_000;
/// Below this, the wait yields instead of sleeping (an append takes a few microseconds).
const SPIN_US: u64 = 200;

/// Log areas as files in one directory.
#[derive(Debug)]
pub struct LogDir {
    dir: PathBuf,
}

impl LogDir {
    /// The directory of `region`'s logs, made if missing; says on stderr how many logs of an
    /// earlier daemon it holds.
    pub fn open(region: &Path) -> std::io::Result<LogDir> {
        let mut name = region.file_name().unwrap_or_default().to_os_string();
        name.push(".logs");
        let dir = region.with_file_name(name);
        match std::fs::DirBuilder::new().mode(0o711).create(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        // (mode 0711 whatever the umask made of it)
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o711))?;
        let left = std::fs::read_dir(&dir)?
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().ends_with(".log"))
            .count();
        if left > 0 {
            // Not an incident of the engine: the daemon's own start-up note.
            eprintln!(
                "nvstack: {} holds {left} delegation log(s) of an earlier daemon that did not \
                 stop cleanly; their writes are not merged (left for inspection)",
                dir.display()
            );
        }
        Ok(LogDir { dir })
    }
}

impl engine::LogAreas for LogDir {
    fn create(&self, grant: u64, owner: (u32, u32)) -> std::io::Result<(PathBuf, Arc<dyn Region>)> {
        let path = self.dir.join(format!("{}-{grant}.log", std::process::id()));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)?;
        let made = (|| {
            std::os::unix::fs::fchown(&file, Some(owner.0), Some(owner.1))?;
            file.set_len(LOG_BYTES)?;
            let options = MmapOptions { shared: true, ..MmapOptions::default() };
            MmapRegion::open(&path, options).map_err(std::io::Error::other)
        })();
        match made {
            Ok(region) => Ok((path, Arc::new(region))),
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                Err(e)
            }
        }
    }

    fn remove(&self, path: &Path) {
        let _ = std::fs::remove_file(path);
    }

    fn pause(&self, waited_us: u64) -> Option<u64> {
        if waited_us >= WAIT_BOUND_US {
            return None;
        }
        let t = Instant::now();
        if waited_us < SPIN_US {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(100));
        }
        Some((t.elapsed().as_micros() as u64).max(1))
    }
}
