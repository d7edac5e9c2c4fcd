//! Every failure the library reports has a counter (`crates/core/src/base/incidents.rs`):
//! nothing in `crates/core/src` writes to stderr but `Incidents::report`, so a failure said on
//! stderr without being counted cannot come back. A line that is not a failure may still be
//! written, when the comment just above it says why: `// not an incident: <why>`.

mod common;

use std::path::Path;

use engine::Incident;

/// The one file allowed to write to stderr.
const REPORTER: &str = "base/incidents.rs";

/// What a comment just above a print must say for a print that is not a failure.
const EXCEPTION: &str = "// not an incident:";

/// Writes to stderr (`eprint!` and `eprintln!`, or the stream itself).
const PRINTS: [&str; 3] = ["eprintln!", "eprint!", "stderr()"];

/// `file:line` of every print in `src` (relative path `rel`) that is not excused by the
/// comment block just above it. Prints inside comments do not count.
fn unreported(rel: &str, src: &str) -> Vec<String> {
    let lines: Vec<&str> = src.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let code = line.find("//").map_or(*line, |at| &line[..at]);
        if !PRINTS.iter().any(|p| code.contains(p)) {
            continue;
        }
        let excused = lines[..i]
            .iter()
            .rev()
            .map(|l| l.trim_start())
            .take_while(|l| l.starts_with("//"))
            .any(|l| l.starts_with(EXCEPTION));
        if !excused {
            out.push(format!("{rel}:{}: {}", i + 1, line.trim()));
        }
    }
    out
}

#[test]
fn nothing_in_the_library_writes_to_stderr_but_the_incident_reporter() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    common::rust_sources(&src, &mut files);
    files.sort();
    assert!(files.len() > 50, "the sources were found: {}", files.len());
    let mut found = Vec::new();
    let mut reporter_prints = false;
    for path in &files {
        let rel = path.strip_prefix(&src).unwrap().to_string_lossy().replace('\\', "/");
        let text = std::fs::read_to_string(path).unwrap();
        if rel == REPORTER {
            reporter_prints = text.contains("eprintln!");
            continue;
        }
        found.extend(unreported(&rel, &text));
    }
    assert!(reporter_prints, "{REPORTER} is where incidents are said");
    assert!(
        found.is_empty(),
        "failures said on stderr without a counter: report them with `Base::incident` \
         (`base/incidents.rs`, a kind of `Incident`), or, for a line that is not a failure, say \
         why in a comment just above it (`{EXCEPTION} ...`):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_scan_sees_a_print_and_its_exception() {
    let bare = "fn f() {\n    eprintln!(\"nvstack: it failed\");\n}\n";
    assert_eq!(unreported("x.rs", bare).len(), 1);
    let excused = "fn f() {\n    // not an incident: a debugging aid\n    // (asked for)\n    \
                   eprintln!(\"x\");\n}\n";
    assert!(unreported("x.rs", excused).is_empty());
    let far = "// not an incident: too far\nlet a = 1;\neprint!(\"x\");\n";
    assert_eq!(unreported("x.rs", far).len(), 1, "only the comment block just above excuses");
    assert!(unreported("x.rs", "/// see eprintln! here\n// eprintln!(\"x\")\n").is_empty());
}

/// docs/design.md section 17 names every kind (the keys of `incidents` in `nvstack stat
/// --json`).
#[test]
fn the_design_document_names_every_incident_kind() {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/design.md"))
            .unwrap();
    let at = doc.find("## 17. Incidents").expect("docs/design.md section 17");
    let section = &doc[at..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |e| e + 3)];
    for kind in Incident::ALL {
        assert!(section.contains(&format!("`{}`", kind.name())), "{} in design.md 17", kind.name());
    }
}
