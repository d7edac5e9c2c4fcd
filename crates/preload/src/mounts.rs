//! Which devices may be nvstack mounts - FUSE mounts (`fuse` or `fuse.*` in
//! /proc/self/mountinfo: a mount made without the mount helper shows no subtype) - remembered
//! per device number; a device not seen before makes the table be read again (mounts come and
//! go). The grant ioctl is the real test: another FUSE file system refuses it, once per open.

use std::collections::HashMap;
use std::sync::Mutex;

static KNOWN: Mutex<Option<HashMap<u64, bool>>> = Mutex::new(None);

/// Most devices remembered before the table starts over.
const MAX_KNOWN: usize = 4096;

fn fuse_devices() -> Vec<u64> {
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else { return Vec::new() };
    text.lines()
        .filter_map(|line| {
            // id parent major:minor root mountpoint options [optional...] - fstype source super
            let (left, right) = line.split_once(" - ")?;
            let fstype = right.split(' ').next()?;
            if fstype != "fuse" && !fstype.starts_with("fuse.") {
                return None;
            }
            let (major, minor) = left.split(' ').nth(2)?.split_once(':')?;
            Some(libc::makedev(major.parse().ok()?, minor.parse().ok()?))
        })
        .collect()
}

/// Whether device `dev` may be an nvstack mount (a FUSE mount).
pub fn is_nvstack(dev: u64) -> bool {
    let mut known = KNOWN.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let map = known.get_or_insert_with(HashMap::new);
    if let Some(&yes) = map.get(&dev) {
        return yes;
    }
    if map.len() >= MAX_KNOWN {
        map.clear();
    }
    let devs = fuse_devices();
    for &d in &devs {
        map.insert(d, true);
    }
    let yes = devs.contains(&dev);
    map.insert(dev, yes);
    yes
}
