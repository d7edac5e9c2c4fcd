//! nvstack-posixtest: a data-driven table of POSIX scenarios whose observable results must be
//! identical on the lower directory and on an nvstack mount (go-fuse `posixtest` style, but run
//! twice and compared instead of asserting expected values, so the lower file system is the
//! oracle).
//!
//! Each case runs in a fresh subdirectory `DIR/<case>` and produces a log of steps
//! (`"what = outcome"`). Outcomes are normalized: errno names, data digests, the stat fields that
//! two correct file systems agree on (never inode numbers, device ids or absolute times; times
//! appear as relations such as "mtime changed"). One JSON line per case:
//! `{"case":"rename_exchange","steps":["put(f, 4 \"file\") = ok", ...]}`.
//!
//! An errno is data, never a runner failure; the runner fails only on its own errors (the
//! directory cannot be prepared, a forked child cannot be made).

// Reasoned allows:
// - syscall results are cast to usize/u32 only after `sys::check` has turned -1 into an error,
//   and uid/gid/flag values cross the C ABI as the kernel defines them (u32 -1 is "unchanged").
#![allow(clippy::cast_sign_loss, clippy::cast_possible_wrap)]
// - the cases read like the syscall sequences they are: `c` the context, `d` a DIR stream, `s` a
//   statfs, `a`/`b` the two sides of a comparison.
#![allow(clippy::many_single_char_names)]

pub mod cases;
pub mod compare;
pub mod ctx;
pub mod sys;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// The log of one case.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CaseLog {
    pub case: String,
    pub steps: Vec<String>,
}

/// Runs `case` in a fresh `dir/<name>` (removed first if it exists), mode 0755, owned by the
/// runner. The process umask must be 022 (`main` sets it).
pub fn run_case(dir: &Path, case: &cases::Case) -> std::io::Result<CaseLog> {
    let sub = dir.join(case.name);
    if sub.symlink_metadata().is_ok() {
        std::fs::remove_dir_all(&sub)?;
    }
    std::fs::create_dir(&sub)?;
    std::fs::set_permissions(&sub, std::fs::Permissions::from_mode(0o755))?;
    let mut ctx = ctx::Ctx::new(&sub);
    (case.run)(&mut ctx);
    Ok(CaseLog { case: case.name.to_string(), steps: ctx.steps })
}
