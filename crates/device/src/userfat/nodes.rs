//! FUSE inode numbers for a file system that has none.
//!
//! FAT names objects only by path, so the server keeps a table: inode number -> path (as the
//! volume spells it, `/`-separated, `""` for the root), counted by the kernel's lookups as the
//! FUSE protocol asks (a node lives until FORGET brings its count to zero).
//!
//! Invariants: (N1) `by_path` and the paths of live nodes are inverse maps; (N2) a node whose
//! object was removed or replaced keeps its number until forgotten but has no path (requests
//! on it answer ENOENT); (N3) the root is inode 1 and is never forgotten; (N4) at most
//! [`NODES_MAX`] nodes (a lookup past it fails with ENFILE).

use std::collections::HashMap;

/// Most inodes the server tracks at once.
pub(crate) const NODES_MAX: usize = 1 << 20;
pub(crate) const ROOT: u64 = 1;

#[derive(Debug)]
struct Node {
    path: Option<String>,
    lookups: u64,
}

#[derive(Debug)]
pub(crate) struct Nodes {
    by_ino: HashMap<u64, Node>,
    by_path: HashMap<String, u64>,
    next: u64,
}

impl Default for Nodes {
    fn default() -> Self {
        let mut n = Nodes { by_ino: HashMap::new(), by_path: HashMap::new(), next: ROOT + 1 };
        n.by_ino.insert(ROOT, Node { path: Some(String::new()), lookups: 1 });
        n.by_path.insert(String::new(), ROOT);
        n
    }
}

/// `parent/name`, or `name` under the root.
pub(crate) fn join(parent: &str, name: &str) -> String {
    if parent.is_empty() { name.to_string() } else { format!("{parent}/{name}") }
}

/// The parent's path and the last name of `path` (not the root).
pub(crate) fn split(path: &str) -> (&str, &str) {
    path.rsplit_once('/').unwrap_or(("", path))
}

impl Nodes {
    pub(crate) fn path(&self, ino: u64) -> Option<&str> {
        self.by_ino.get(&ino).and_then(|n| n.path.as_deref())
    }

    /// The node of `path`, if the kernel knows one.
    pub(crate) fn ino_of(&self, path: &str) -> Option<u64> {
        self.by_path.get(path).copied()
    }

    /// A lookup of `path`: its node (made if new) with one more reference.
    pub(crate) fn lookup(&mut self, path: &str) -> Option<u64> {
        if let Some(&ino) = self.by_path.get(path) {
            self.by_ino.get_mut(&ino).expect("N1").lookups += 1;
            return Some(ino);
        }
        if self.by_ino.len() >= NODES_MAX {
            return None;
        }
        let ino = self.next;
        self.next += 1;
        self.by_ino.insert(ino, Node { path: Some(path.to_string()), lookups: 1 });
        self.by_path.insert(path.to_string(), ino);
        Some(ino)
    }

    /// The kernel dropped `n` references; returns whether the node is gone.
    pub(crate) fn forget(&mut self, ino: u64, n: u64) -> bool {
        if ino == ROOT {
            return false;
        }
        let Some(node) = self.by_ino.get_mut(&ino) else { return false };
        node.lookups = node.lookups.saturating_sub(n);
        if node.lookups > 0 {
            return false;
        }
        let node = self.by_ino.remove(&ino).expect("present");
        if let Some(p) = node.path {
            self.by_path.remove(&p);
        }
        true
    }

    /// The object at `path` is gone (N2).
    pub(crate) fn removed(&mut self, path: &str) {
        if let Some(ino) = self.by_path.remove(path) {
            self.by_ino.get_mut(&ino).expect("N1").path = None;
        }
    }

    /// `from` is now at `to`, with everything under it; whatever was at `to` is gone.
    pub(crate) fn renamed(&mut self, from: &str, to: &str) {
        self.removed(to);
        let prefix = format!("{from}/");
        let moved: Vec<(String, u64)> = self
            .by_path
            .iter()
            .filter(|(p, _)| p.as_str() == from || p.starts_with(&prefix))
            .map(|(p, &i)| (p.clone(), i))
            .collect();
        for (old, ino) in moved {
            let new = format!("{to}{}", &old[from.len()..]);
            self.by_path.remove(&old);
            self.by_path.insert(new.clone(), ino);
            self.by_ino.get_mut(&ino).expect("N1").path = Some(new);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_are_counted_and_forget_frees() {
        let mut n = Nodes::default();
        let a = n.lookup("a").unwrap();
        assert_eq!(n.lookup("a"), Some(a));
        assert!(!n.forget(a, 1));
        assert_eq!(n.path(a), Some("a"));
        assert!(n.forget(a, 1));
        assert_eq!(n.path(a), None);
        assert_eq!(n.ino_of("a"), None);
        assert!(!n.forget(ROOT, 100));
        assert_eq!(n.path(ROOT), Some(""));
    }

    #[test]
    fn rename_moves_a_subtree_and_drops_the_target() {
        let mut n = Nodes::default();
        let d = n.lookup("d").unwrap();
        let f = n.lookup("d/f").unwrap();
        let other = n.lookup("dd/x").unwrap();
        let target = n.lookup("e").unwrap();
        n.renamed("d", "e");
        assert_eq!(n.path(d), Some("e"));
        assert_eq!(n.path(f), Some("e/f"));
        assert_eq!(n.path(other), Some("dd/x"), "a sibling with the same prefix stays");
        assert_eq!(n.path(target), None);
        assert_eq!(n.ino_of("e/f"), Some(f));
        assert_eq!(n.ino_of("d/f"), None);
    }

    #[test]
    fn paths_split_and_join() {
        assert_eq!(join("", "a"), "a");
        assert_eq!(join("a", "b"), "a/b");
        assert_eq!(split("a/b/c"), ("a/b", "c"));
        assert_eq!(split("c"), ("", "c"));
    }
}
