//! The journal's byte tables in docs/design.md (marked `<!-- txn layout: NAME -->`) are the
//! code's `LAYOUT` constants: same fields, offsets and sizes. (The other tables are checked by
//! `crates/core/tests/design_tables.rs`, which knows the engine's.)

use nvram::layout::Field;

const DESIGN: &str = include_str!("../../../docs/design.md");

fn document_table(name: &str) -> Vec<(usize, usize, String)> {
    let marker = format!("<!-- txn layout: {name} -->");
    let at = DESIGN.find(&marker).unwrap_or_else(|| panic!("docs/design.md has no {marker}"));
    DESIGN[at + marker.len()..]
        .lines()
        .skip_while(|l| l.trim().is_empty())
        .take_while(|l| l.starts_with('|'))
        .filter_map(|row| {
            let cells: Vec<&str> = row.trim_matches('|').split('|').map(str::trim).collect();
            Some((cells[0].parse().ok()?, cells[1].parse().ok()?, cells[2].to_lowercase()))
        })
        .collect()
}

fn check(name: &str, code: &[Field]) {
    let doc = document_table(name);
    assert_eq!(
        doc.len(),
        code.len(),
        "{name}: {} rows in the document, {} in the code",
        doc.len(),
        code.len()
    );
    for ((offset, size, text), &(code_offset, code_size, field)) in doc.iter().zip(code) {
        assert_eq!((*offset, *size), (code_offset, code_size), "{name}, field {field:?}");
        assert!(text.contains(field), "{name}, field {field:?}: the document calls it {text:?}");
    }
}

#[test]
fn the_journal_tables_in_the_design_document_are_the_codes() {
    check("journal header", txn::journal::HEADER_LAYOUT);
    check("group log entry", txn::journal::ENTRY_LAYOUT);
}
