//! The rooms of the engine and their edges (ARCHITECTURE.md, "Rooms and their edges"), checked
//! from the source: every folder of `crates/core/src` is a room, and a room uses only the rooms
//! before it in [`ORDER`]; no file uses, directly or through others, a file that uses it back
//! (no import cycle among files). A folder's `mod.rs` may name its own children (it declares
//! them, holds their types and re-exports them) while they add to it: those edges from a parent
//! to its children do not count, every other one does - between siblings, across folders. A
//! use is any `crate::`, `super::`, `self::` or child-module path outside comments and
//! `#[cfg(test)]` modules, resolved to the deepest module file it names (a path through a
//! re-export resolves to the module that re-exports, so the check is conservative; a `super::`
//! inside an inline module names the file itself).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The rooms, lowest first: each may use only those before it. `lib.rs` may use every room.
const ORDER: [&str; 7] = ["base", "journal", "cache", "tempfs", "route", "direct", "engine"];

/// `a/b.rs` and `a/b/mod.rs` are module `[a, b]`; `lib.rs` is the crate root `[]`.
fn module_of(rel: &str) -> Vec<String> {
    let mut parts: Vec<String> = rel.trim_end_matches(".rs").split('/').map(String::from).collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts
}

/// The text without comments and without `#[cfg(test)]` modules (unit tests are not part of
/// the structure; their `super::` means the file itself).
fn code(src: &str) -> String {
    let mut out = String::new();
    for line in src.lines() {
        let line = line.find("//").map_or(line, |i| &line[..i]);
        out.push_str(line);
        out.push('\n');
    }
    while let Some(at) = out.find("#[cfg(test)]") {
        let rest = &out[at..];
        let Some(open) = rest.find('{') else { break };
        if !rest[..open].contains("mod ") {
            out.replace_range(at..at + "#[cfg(test)]".len(), "");
            continue;
        }
        let end = block_end(rest, open).unwrap_or(rest.len());
        out.replace_range(at..at + end, "");
    }
    out
}

/// Just past the brace that closes the block opened at `open` (a `{` of `text`).
fn block_end(text: &str, open: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (i, c) in text[open..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(open + i + 1);
                }
            }
            _ => {}
        }
    }
    None
}

fn ident_len(s: &str) -> usize {
    s.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(s.len())
}

/// The module paths a path text names: `a::b::{c::D, e}` after a prefix gives `prefix/a/b/c/D`
/// and `prefix/a/b/e` (the resolver keeps the deepest existing module of each).
fn paths(prefix: &[String], text: &str, out: &mut Vec<Vec<String>>) {
    let mut segs = prefix.to_vec();
    let mut rest = text;
    loop {
        let n = ident_len(rest);
        if n == 0 {
            break;
        }
        segs.push(rest[..n].to_string());
        rest = &rest[n..];
        if let Some(r) = rest.strip_prefix("::") {
            rest = r;
        } else {
            out.push(segs);
            return;
        }
    }
    let Some(inner) = rest.strip_prefix('{') else {
        out.push(segs);
        return;
    };
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                let item = inner[start..i].trim();
                if !item.is_empty() {
                    if item == "self" { out.push(segs.clone()) } else { paths(&segs, item, out) }
                }
                return;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                let item = inner[start..i].trim();
                if item == "self" {
                    out.push(segs.clone());
                } else if !item.is_empty() {
                    paths(&segs, item, out);
                }
                start = i + 1;
            }
            _ => {}
        }
    }
}

/// The byte ranges of the inline modules (`mod name { ... }`) of a file's code: a `super::`
/// inside one names the file's own module, not its parent.
fn inline_modules(text: &str) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    for (at, _) in text.match_indices("mod ") {
        let boundary = text[..at].chars().next_back().is_none_or(|c| !c.is_ascii_alphanumeric());
        let rest = &text[at + 4..];
        let name = ident_len(rest.trim_start());
        let after = rest.trim_start()[name..].trim_start();
        if !boundary || name == 0 || !after.starts_with('{') {
            continue; // `mod x;` (a file of its own) or not a module
        }
        let open = text.len() - after.len();
        if let Some(end) = block_end(text, open) {
            out.push(at..end);
        }
    }
    out
}

/// Every file of the crate with the files it uses.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    common::rust_sources(&src, &mut files);
    let rel = |p: &Path| p.strip_prefix(&src).expect("in src").to_string_lossy().replace('\\', "/");
    let modules: BTreeMap<Vec<String>, String> =
        files.iter().map(|p| (module_of(&rel(p)), rel(p))).collect();
    let resolve =
        |segs: &[String]| (0..=segs.len()).rev().find_map(|n| modules.get(&segs[..n]).cloned());
    let mut edges = BTreeMap::new();
    for path in &files {
        let me = rel(path);
        let module = module_of(&me);
        let text = code(&std::fs::read_to_string(path).expect("read"));
        let inline = inline_modules(&text);
        let mut used = BTreeSet::new();
        for (at, _) in text.match_indices("::") {
            let before = &text[..at];
            let word_start = before
                .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .map_or(0, |i| i + 1);
            let word = &before[word_start..];
            let mut base: Vec<String> = match word {
                "crate" => Vec::new(),
                "self" => module.clone(),
                // In an inline module: the file's own module (a use of itself, not counted).
                "super" if inline.iter().any(|r| r.contains(&at)) => module.clone(),
                "super" => module[..module.len().saturating_sub(1)].to_vec(),
                // A child module named without `self::` (`use space::Space;` in a mod.rs).
                child
                    if modules
                        .contains_key(&[module.clone(), vec![child.to_string()]].concat()) =>
                {
                    let mut m = module.clone();
                    m.push(child.to_string());
                    let target = &modules[&m];
                    if before[..word_start].ends_with("::") {
                        continue;
                    }
                    if *target != me {
                        used.insert(target.clone());
                    }
                    m
                }
                _ => continue,
            };
            // Only the start of a path (`super::super::` is one path, read from its first word).
            if before[..word_start].ends_with("::") {
                continue;
            }
            let mut rest = &text[at + 2..];
            while let Some(r) = rest.strip_prefix("super::") {
                base.pop();
                rest = r;
            }
            let mut named = Vec::new();
            paths(&base, rest, &mut named);
            for segs in named {
                if let Some(target) = resolve(&segs)
                    && target != me
                {
                    used.insert(target);
                }
            }
        }
        edges.insert(me, used);
    }
    edges
}

fn room(file: &str) -> &str {
    file.split('/').next().map_or(file, |r| r.trim_end_matches(".rs"))
}

#[test]
fn every_room_uses_only_the_rooms_before_it() {
    let rank = |r: &str| ORDER.iter().position(|&o| o == r);
    let mut wrong = Vec::new();
    for (file, used) in graph() {
        let from = room(&file);
        if from == "lib" {
            continue;
        }
        let Some(mine) = rank(from) else {
            wrong.push(format!("{file}: room {from} is not in ORDER"));
            continue;
        };
        for target in used {
            let to = room(&target);
            if to != from && rank(to).is_none_or(|theirs| theirs >= mine) {
                wrong.push(format!("{file} ({from}) uses {target} ({to})"));
            }
        }
    }
    assert!(wrong.is_empty(), "edges against the rooms' order:\n{}", wrong.join("\n"));
}

/// Whether `child` is a file of the folder whose `mod.rs` (or `lib.rs`) is `parent`, or the
/// `mod.rs` of a folder in it.
fn is_child(parent: &str, child: &str) -> bool {
    let dir = |f: &str| f.rsplit_once('/').map_or(String::new(), |(d, _)| d.to_string());
    if !(parent.ends_with("mod.rs") || parent == "lib.rs") || parent == child {
        return false;
    }
    let (pd, cd) = (dir(parent), dir(child));
    cd == pd || (child.ends_with("/mod.rs") && dir(&cd) == pd)
}

/// Depth-first search from `v` for a back edge; the cycle it closes.
fn visit(
    v: &str,
    edges: &BTreeMap<String, BTreeSet<String>>,
    state: &mut BTreeMap<String, u8>,
    stack: &mut Vec<String>,
) -> Option<Vec<String>> {
    state.insert(v.to_string(), 1);
    stack.push(v.to_string());
    for w in edges.get(v).into_iter().flatten() {
        match state.get(w.as_str()) {
            Some(1) => {
                let from = stack.iter().position(|s| s == w).expect("on the stack");
                let mut cycle = stack[from..].to_vec();
                cycle.push(w.clone());
                return Some(cycle);
            }
            Some(_) => {}
            None => {
                if let Some(c) = visit(w, edges, state, stack) {
                    return Some(c);
                }
            }
        }
    }
    stack.pop();
    state.insert(v.to_string(), 2);
    None
}

#[test]
fn no_file_of_the_engine_is_part_of_an_import_cycle() {
    let mut edges = graph();
    for (file, used) in &mut edges {
        used.retain(|target| !is_child(file, target));
    }
    let mut state = BTreeMap::new();
    for v in edges.keys() {
        if !state.contains_key(v.as_str())
            && let Some(cycle) = visit(v, &edges, &mut state, &mut Vec::new())
        {
            panic!("an import cycle: {}", cycle.join(" -> "));
        }
    }
}

#[test]
fn the_checker_sees_uses_of_every_kind() {
    // A check that cannot fail is no check: the graph must contain edges written each way.
    let edges = graph();
    let uses = |from: &str, to: &str| edges.get(from).is_some_and(|u| u.contains(to));
    assert!(uses("engine/mod.rs", "base/mod.rs"), "use crate::base::{{...}}");
    assert!(uses("cache/nbw.rs", "cache/mod.rs"), "use super::...");
    assert!(uses("journal/checkpoint.rs", "journal/mod.rs"), "use super::{{Journal, ...}}");
    assert!(uses("tempfs/listing.rs", "tempfs/overlay/mod.rs"), "use super::overlay::{{...}}");
    assert!(uses("base/mod.rs", "base/space.rs"), "use space::Space (a child module)");
    assert!(
        !uses("base/sync.rs", "base/mod.rs"),
        "`use super::Rank` inside sync.rs's inline `mod check` names sync.rs itself"
    );
    assert!(edges.len() > 50, "every file read: {}", edges.len());
    assert_eq!(room("engine/ops/io.rs"), "engine");
    assert!(
        is_child("cache/mod.rs", "cache/nbw.rs") && is_child("cache/mod.rs", "cache/policy/mod.rs")
    );
    assert!(!is_child("cache/nbw.rs", "cache/ops.rs"), "siblings are not parent and child");
    assert!(!is_child("cache/mod.rs", "cache/policy/zones.rs"), "a grandchild is not a child");
}
