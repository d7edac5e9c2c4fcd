//! One source for each byte table: every persistent structure's table is a `LAYOUT` constant
//! next to the code that encodes it (asserted contiguous at compile time), and docs/design.md
//! shows the same tables, each after a `<!-- layout: NAME -->` marker. This test reads the
//! document and requires, for every marked table, the same fields at the same offsets with the
//! same sizes (rows whose offset or size is not a number - a variable-length tail such as a
//! path or an undo record's payload - are the code's too: not in its fixed table).

use nvram::layout::Field;

const DESIGN: &str = include_str!("../../../docs/design.md");

/// One row of a document table: (offset, size, field text).
type Row = (String, String, String);

/// The tables of the document, by marker name.
fn document_tables() -> Vec<(String, Vec<Row>)> {
    let mut tables = Vec::new();
    let mut lines = DESIGN.lines();
    while let Some(line) = lines.next() {
        let Some(name) = line.strip_prefix("<!-- layout: ").and_then(|r| r.strip_suffix(" -->"))
        else {
            continue;
        };
        let mut rows = Vec::new();
        for row in lines.by_ref() {
            if !row.starts_with('|') {
                break;
            }
            let cells: Vec<String> =
                row.trim_matches('|').split('|').map(|c| c.trim().to_string()).collect();
            if cells.len() < 3 || cells[0] == "offset" || cells[0].starts_with("---") {
                continue;
            }
            rows.push((cells[0].clone(), cells[1].clone(), cells[2].clone()));
        }
        tables.push((name.to_string(), rows));
    }
    tables
}

fn code_table(name: &str) -> Option<&'static [Field]> {
    Some(match name {
        "superblock" => nvram::layout::SUPERBLOCK_LAYOUT,
        "binding" => engine::binding::LAYOUT,
        "undo slot header" => txn::undo::SLOT_HEADER_LAYOUT,
        "undo record" => txn::undo::RECORD_HEADER_LAYOUT,
        "descriptor" => txn::frames::DESCRIPTOR_LAYOUT,
        "temp-file record" => engine::tempfs::record::LAYOUT,
        "directory-times record" => engine::tempfs::overlay::times::LAYOUT,
        "cached-file record" => engine::cache::record::LAYOUT,
        "redo record" => engine::journal::record::LAYOUT,
        "patch" => engine::cache::patch::LAYOUT,
        "route profile" => engine::route::profile::LAYOUT,
        _ => return None,
    })
}

#[test]
fn every_byte_table_in_the_design_document_is_the_codes() {
    let tables = document_tables();
    let names: Vec<&str> = tables.iter().map(|(n, _)| n.as_str()).collect();
    for expected in [
        "superblock",
        "binding",
        "undo slot header",
        "undo record",
        "descriptor",
        "temp-file record",
        "directory-times record",
        "cached-file record",
        "redo record",
        "patch",
        "route profile",
    ] {
        assert!(names.contains(&expected), "docs/design.md has no table marked {expected:?}");
    }
    for (name, rows) in tables {
        let code = code_table(&name).unwrap_or_else(|| panic!("no code table named {name:?}"));
        let fixed: Vec<&Row> = rows
            .iter()
            .filter(|(o, s, _)| o.parse::<usize>().is_ok() && s.parse::<usize>().is_ok())
            .collect();
        assert_eq!(
            fixed.len(),
            code.len(),
            "{name}: the document has {} fixed fields, the code {}",
            fixed.len(),
            code.len()
        );
        for ((offset, size, text), &(code_offset, code_size, field)) in fixed.into_iter().zip(code)
        {
            let at = format!("{name}, field {field:?}");
            assert_eq!(offset.parse::<usize>().unwrap(), code_offset, "{at}: offset");
            assert_eq!(size.parse::<usize>().unwrap(), code_size, "{at}: size");
            assert!(text.to_lowercase().contains(field), "{at}: the document calls it {text:?}");
        }
    }
}

/// The table of frame kinds in docs/design.md (after `<!-- frame kinds -->`) is the code's
/// (`engine::base::frames::KINDS`), row for row.
#[test]
fn the_frame_kinds_in_the_design_document_are_the_codes() {
    let at =
        DESIGN.find("<!-- frame kinds -->").expect("docs/design.md marks its table of frame kinds");
    let rows: Vec<Vec<String>> = DESIGN[at..]
        .lines()
        .skip(1)
        .take_while(|l| l.starts_with('|'))
        .map(|l| l.trim_matches('|').split('|').map(|c| c.trim().to_string()).collect::<Vec<_>>())
        .filter(|c| c[0] != "kind" && !c[0].starts_with("---"))
        .collect();
    let code: Vec<Vec<String>> = engine::base::frames::KINDS
        .iter()
        .map(|k| {
            let hex = format!("{:08x}", k.kind);
            vec![
                format!("0x{}_{}", &hex[..4], &hex[4..]),
                k.name.to_string(),
                k.room.to_string(),
                k.holds.to_string(),
                k.owner.to_string(),
                k.index.to_string(),
                (if k.made { "yes" } else { "no" }).to_string(),
            ]
        })
        .collect();
    assert_eq!(rows, code, "docs/design.md's frame kinds differ from base/frames.rs");
}
