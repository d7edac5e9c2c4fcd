//! The binding of a region to its lower directory, kept in the root area.
//!
//! A region's NVRAM state (later: temp files, dirty pages) only makes sense over the lower
//! directory it was made for, so the first mount records that directory and every later mount
//! checks it. Format (at the start of the root area; changed only in a transaction): the
//! header [`LAYOUT`] (magic "NVSBIND1", lower file system id (statfs f_fsid), device and inode of
//! the lower directory, path length (at most `PATH_MAX_BYTES`), XXH3-64 of the header's first
//! 40 bytes and the path), then the canonical path of the lower directory. All zero = unbound (a freshly formatted region). Matching rule: the inode must match, and
//! either the file system id or the path (device numbers and fs ids can change across reboots
//! for some file systems; the path can change if the directory was moved).

use nvram::checksum::checksum;
use nvram::layout::{get_u32, get_u64, put_u32, put_u64};
use txn::Pool;

pub const MAGIC: [u8; 8] = *b"NVSBIND1";
pub const HEADER: usize = 48;
pub const PATH_MAX_BYTES: usize = 2048;

/// The header's byte table (docs/design.md section 2, "Root area"); the path follows.
pub const LAYOUT: &[nvram::layout::Field] = &[
    (0, 8, "magic"),
    (8, 8, "lower file system id"),
    (16, 8, "lower directory device"),
    (24, 8, "lower directory inode"),
    (32, 4, "path length"),
    (36, 4, "zero"),
    (40, 8, "xxh3-64"),
];

const _: () = assert!(nvram::layout::contiguous(LAYOUT, HEADER));

/// The lower directory a region belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Binding {
    pub fsid: u64,
    pub dev: u64,
    pub ino: u64,
    pub path: String,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BindingError {
    #[error(
        "this region belongs to the lower directory {theirs} (inode {their_ino}); refusing to \
         mount it over {ours} (inode {our_ino}): use another --nvram file, or reformat this one \
         with `nvstack format --force` (its contents are lost)"
    )]
    Mismatch { theirs: String, their_ino: u64, ours: String, our_ino: u64 },
    #[error("the region's lower-directory record is damaged (checksum mismatch)")]
    Damaged,
    #[error("lower directory path longer than {PATH_MAX_BYTES} bytes")]
    PathTooLong,
    #[error("writing the lower-directory record: {0}")]
    Nvram(crate::base::error::FsError),
}

fn encode(b: &Binding) -> Vec<u8> {
    let mut rec = vec![0u8; HEADER + b.path.len()];
    rec[..8].copy_from_slice(&MAGIC);
    put_u64(&mut rec, 8, b.fsid);
    put_u64(&mut rec, 16, b.dev);
    put_u64(&mut rec, 24, b.ino);
    put_u32(&mut rec, 32, b.path.len() as u32);
    rec[HEADER..].copy_from_slice(b.path.as_bytes());
    let sum = checksum(&[&rec[..40], b.path.as_bytes()]);
    put_u64(&mut rec, 40, sum);
    rec
}

/// Reads the binding: `Ok(None)` when the region is unbound.
pub(crate) fn read(pool: &Pool) -> Result<Option<Binding>, BindingError> {
    let (root, _) = pool.root_range();
    let header = pool.read_vec(root, HEADER);
    if header.iter().all(|&b| b == 0) {
        return Ok(None);
    }
    let len = get_u32(&header, 32) as usize;
    if header[..8] != MAGIC || len > PATH_MAX_BYTES {
        return Err(BindingError::Damaged);
    }
    let path = pool.read_vec(root + HEADER as u64, len);
    if checksum(&[&header[..40], &path]) != get_u64(&header, 40) {
        return Err(BindingError::Damaged);
    }
    Ok(Some(Binding {
        fsid: get_u64(&header, 8),
        dev: get_u64(&header, 16),
        ino: get_u64(&header, 24),
        path: String::from_utf8_lossy(&path).into_owned(),
    }))
}

/// Binds an unbound region to `ours`, or checks that a bound one belongs to it. Returns whether
/// the region was bound now.
pub fn bind_or_check(pool: &Pool, ours: &Binding) -> Result<bool, BindingError> {
    if ours.path.len() > PATH_MAX_BYTES {
        return Err(BindingError::PathTooLong);
    }
    if let Some(theirs) = read(pool)? {
        return if theirs.ino == ours.ino && (theirs.fsid == ours.fsid || theirs.path == ours.path) {
            Ok(false)
        } else {
            Err(BindingError::Mismatch {
                theirs: theirs.path,
                their_ino: theirs.ino,
                ours: ours.path.clone(),
                our_ino: ours.ino,
            })
        };
    }
    let (root, _) = pool.root_range();
    let mut otx = crate::base::OpTx::new(pool);
    let written = otx.tx().update(root, &encode(ours)).map_err(crate::base::error::FsError::from);
    otx.end(written).map_err(BindingError::Nvram)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn pool() -> Pool {
        let params = txn::testkit::sweep_params();
        let region = Arc::new(nvram::SimRegion::new(params.region_size));
        Pool::format(&*region, params).unwrap();
        Pool::open(region, txn::Consistency::Undo).unwrap().0
    }

    fn binding(path: &str, ino: u64, fsid: u64) -> Binding {
        Binding { fsid, dev: 8, ino, path: path.into() }
    }

    #[test]
    fn first_mount_binds_and_later_mounts_must_match() {
        let pool = pool();
        assert_eq!(bind_or_check(&pool, &binding("/lower", 2, 77)), Ok(true));
        assert_eq!(bind_or_check(&pool, &binding("/lower", 2, 77)), Ok(false));
        // Moved directory, same file system: still ours.
        assert_eq!(bind_or_check(&pool, &binding("/moved", 2, 77)), Ok(false));
        // Same path, fs id changed (e.g. a different loop device): still ours.
        assert_eq!(bind_or_check(&pool, &binding("/lower", 2, 78)), Ok(false));
        let err = bind_or_check(&pool, &binding("/other", 3, 77)).unwrap_err();
        assert!(err.to_string().contains("belongs to the lower directory /lower"), "{err}");
    }

    #[test]
    fn a_damaged_binding_is_reported() {
        let pool = pool();
        bind_or_check(&pool, &binding("/lower", 2, 77)).unwrap();
        let (root, _) = pool.root_range();
        let mut tx = pool.begin();
        tx.update(root + 50, b"X").unwrap();
        tx.commit();
        assert_eq!(read(&pool), Err(BindingError::Damaged));
    }
}
