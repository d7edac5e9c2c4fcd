//! Where a mount point may lie relative to its lower directory, checked before anything is
//! mounted or created (`nvstack mount` and the mount(8) helper).
//!
//! The daemon opens the lower directory (an O_PATH descriptor) before it mounts and reaches
//! every lower object relative to that descriptor, never by path. Hence:
//!
//! 1. **Mount point inside the lower directory: refused.** The mount would be an entry of its
//!    own lower tree: a lookup through the mount reaches the mount again (a walk never ends),
//!    and the daemon, which holds that entry, keeps the mount and every enclosing one busy,
//!    so neither can be unmounted short of a lazy unmount and a kill.
//! 2. **Mount point = the lower directory: allowed.** The mount hides the lower directory
//!    from everyone else while it is mounted; the daemon's descriptor still reaches it.
//! 3. **Mount point above the lower directory: allowed**, for the same reason: the lower
//!    directory (with everything else under the mount point) is hidden, never traversed.
//!
//! Paths are compared canonical (symlinks resolved); a mount point reached through a bind mount
//! of the lower directory is caught by comparing device and inode numbers of its ancestors.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::error::{CliError, CliResult};

/// Refuses a canonical `mountpoint` that lies strictly inside the directory `lower` (rule 1).
pub fn check(lower: &Path, mountpoint: &Path) -> CliResult {
    let lower = std::fs::canonicalize(lower)
        .map_err(|e| CliError::Usage(format!("lower directory {}: {e}", lower.display())))?;
    let id = |p: &Path| std::fs::metadata(p).map(|m| (m.dev(), m.ino())).ok();
    let inside = if mountpoint != lower && mountpoint.starts_with(&lower) {
        Some(lower.clone())
    } else {
        // Another path to the same directory (a bind mount): compare ancestors by identity.
        let lower_id = id(&lower);
        let same = |a: &&Path| lower_id.is_some() && id(a) == lower_id;
        mountpoint.ancestors().skip(1).find(same).map(Path::to_path_buf)
    };
    let Some(via) = inside else { return Ok(()) };
    let (mp, low) = (mountpoint.display(), lower.display());
    let how = if via == lower { String::new() } else { format!(" ({} is {low})", via.display()) };
    Err(CliError::Usage(format!(
        "mount point {mp} is inside the lower directory {low}{how}: the mount would appear in \
         its own lower tree, so walking it would never end and it could not be unmounted. \
         Mount outside {low}, or over {low} itself (the mount then hides it)"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dirs() -> (tempfile::TempDir, std::path::PathBuf) {
        let t = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(t.path()).unwrap();
        std::fs::create_dir_all(root.join("lower/in/deeper")).unwrap();
        std::fs::create_dir(root.join("elsewhere")).unwrap();
        (t, root)
    }

    #[test]
    fn a_mount_point_inside_the_lower_directory_is_refused_with_both_paths() {
        let (_t, root) = dirs();
        for mp in ["lower/in", "lower/in/deeper", "lower/not-yet"] {
            let err = check(&root.join("lower"), &root.join(mp)).unwrap_err();
            assert!(matches!(err, CliError::Usage(_)), "{err}");
            let text = err.to_string();
            assert!(text.contains(&root.join(mp).display().to_string()), "{text}");
            assert!(text.contains("inside the lower directory"), "{text}");
        }
    }

    #[test]
    fn the_lower_directory_itself_a_sibling_and_an_ancestor_are_allowed() {
        let (_t, root) = dirs();
        let lower = root.join("lower");
        check(&lower, &lower).unwrap();
        check(&lower, &root.join("elsewhere")).unwrap();
        check(&lower, &root.join("lowerish")).unwrap(); // a name prefix is not a path prefix
        check(&root.join("lower/in"), &lower).unwrap();
    }

    #[test]
    fn a_mount_point_reached_through_a_symlink_into_the_lower_directory_is_refused() {
        let (_t, root) = dirs();
        std::os::unix::fs::symlink(root.join("lower"), root.join("link")).unwrap();
        // The caller passes the mount point canonical, as `mount::run` does.
        let mp = std::fs::canonicalize(root.join("link/in")).unwrap();
        assert!(check(&root.join("link"), &mp).is_err());
    }

    #[test]
    fn a_missing_lower_directory_is_a_usage_error() {
        let (_t, root) = dirs();
        let err = check(&root.join("absent"), &root.join("elsewhere")).unwrap_err();
        assert!(matches!(err, CliError::Usage(_)), "{err}");
    }
}
