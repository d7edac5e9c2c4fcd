//! The one table of frame kinds: every kind of frame a mounted region may hold, its number (the
//! descriptor's `kind`, `txn::FrameTag`), the room that owns it, what it holds and what the
//! descriptor's `owner` and `index` name. The rooms take their kind numbers from here; start-up
//! refuses a region with a frame of a kind not in the table ([`check_known`]); `nvstack check`
//! does the same and `nvstack inspect` names every kind from it; docs/design.md's table of frame
//! kinds is this table (`crates/core/tests/design_tables.rs` compares them).
//!
//! Numbers are distinctive (two letters of the room and a serial) so that no layer reads
//! another's frames by mistake. Kinds of formats this version no longer writes stay in the
//! table with `made: false`: a region that still holds one is read (records of the earlier
//! unpacked formats, changed and freed as before) or refused with the way out named (their
//! room's scan says which).

use txn::Pool;

/// A temp file's record alone in a frame (regions written before records were packed).
pub const TEMP_RECORD: u32 = 0x5446_0001;
/// One 4 KiB page of a temp file's data.
pub const TEMP_DATA: u32 = 0x5446_0002;
/// A lower directory's pending times (TempFFS's overlay).
pub const DIR_TIMES: u32 = 0x5446_0003;
/// Eight slots of temp-file records.
pub const TEMP_RECORDS: u32 = 0x5446_0004;
/// A cached file's record alone in a frame (regions written before records were packed).
pub const CACHE_RECORD: u32 = 0x5043_0001;
/// One 4 KiB dirty page of a cached file.
pub const CACHE_PAGE: u32 = 0x5043_0002;
/// One patch in a frame of its own (the format before packed patches: refused).
pub const PATCH_V1: u32 = 0x5043_0003;
/// 64 slots of one cached file's patches.
pub const PATCHES: u32 = 0x5043_0004;
/// Eight slots of cached-file records.
pub const CACHE_RECORDS: u32 = 0x5043_0005;
/// One redo record in a frame of its own (the format before packed records: refused).
pub const REDO_V1: u32 = 0x4d4a_0001;
/// Sixteen slots of metadata-journal redo records.
pub const REDO: u32 = 0x4d4a_0002;
/// The route profile (files that take the NVRAM path).
pub const PROFILE: u32 = 0x5250_0001;

/// One row of the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameKind {
    pub kind: u32,
    /// What `nvstack inspect` calls its frames.
    pub name: &'static str,
    /// The room that owns it (a folder of `crates/core/src`).
    pub room: &'static str,
    /// What the frame holds.
    pub holds: &'static str,
    /// What the descriptor's owner and index name (`-`: nothing, 0).
    pub owner: &'static str,
    pub index: &'static str,
    /// Still written by this version (false: only read, or refused).
    pub made: bool,
}

/// Every kind a mounted region may hold.
pub const KINDS: [FrameKind; 12] = [
    FrameKind {
        kind: TEMP_RECORDS,
        name: "temp-file records",
        room: "tempfs",
        holds: "eight slots of 512 bytes, each free (zero) or a temp-file record",
        owner: "-",
        index: "-",
        made: true,
    },
    FrameKind {
        kind: TEMP_RECORD,
        name: "temp-file record (unpacked)",
        room: "tempfs",
        holds: "one temp-file record at offset 0 (read, changed and freed; never made)",
        owner: "-",
        index: "-",
        made: false,
    },
    FrameKind {
        kind: TEMP_DATA,
        name: "temp-file data pages",
        room: "tempfs",
        holds: "4 KiB of a temp file's data",
        owner: "the record's place",
        index: "page number",
        made: true,
    },
    FrameKind {
        kind: DIR_TIMES,
        name: "pending directory times",
        room: "tempfs",
        holds: "a directory-times record",
        owner: "-",
        index: "-",
        made: true,
    },
    FrameKind {
        kind: CACHE_RECORDS,
        name: "cached-file records",
        room: "cache",
        holds: "eight slots of 512 bytes, each free (zero) or a cached-file record",
        owner: "-",
        index: "-",
        made: true,
    },
    FrameKind {
        kind: CACHE_RECORD,
        name: "cached-file record (unpacked)",
        room: "cache",
        holds: "one cached-file record at offset 0 (read, changed and freed; never made)",
        owner: "-",
        index: "-",
        made: false,
    },
    FrameKind {
        kind: CACHE_PAGE,
        name: "cached dirty pages",
        room: "cache",
        holds: "one 4 KiB dirty page of a lower file",
        owner: "the record's place",
        index: "page number",
        made: true,
    },
    FrameKind {
        kind: PATCHES,
        name: "patches",
        room: "cache",
        holds: "64 slots of 64 bytes: one file's patches, each a run of slots",
        owner: "the record's place",
        index: "-",
        made: true,
    },
    FrameKind {
        kind: PATCH_V1,
        name: "patch (unpacked)",
        room: "cache",
        holds: "one patch (refused: mount with the version that wrote it first)",
        owner: "the record's place",
        index: "page number",
        made: false,
    },
    FrameKind {
        kind: REDO,
        name: "metadata-journal records",
        room: "journal",
        holds: "sixteen slots of 256 bytes: redo records, each a run of slots",
        owner: "-",
        index: "-",
        made: true,
    },
    FrameKind {
        kind: REDO_V1,
        name: "metadata-journal record (unpacked)",
        room: "journal",
        holds: "one redo record (refused: mount with the version that wrote it first)",
        owner: "-",
        index: "-",
        made: false,
    },
    FrameKind {
        kind: PROFILE,
        name: "route profile",
        room: "route",
        holds: "the route profile: a ring of hashes of the handles of files that take the NVRAM path",
        owner: "-",
        index: "-",
        made: true,
    },
];

const _: () = {
    // Kind numbers are unique: a kind names one row.
    let mut i = 0;
    while i < KINDS.len() {
        let mut j = i + 1;
        while j < KINDS.len() {
            assert!(KINDS[i].kind != KINDS[j].kind, "a kind number is in the table once");
            j += 1;
        }
        i += 1;
    }
};

/// The table's row of `kind`.
pub fn of(kind: u32) -> Option<&'static FrameKind> {
    KINDS.iter().find(|k| k.kind == kind)
}

/// Every allocated frame of the region is of a kind in the table; the first that is not is
/// damage (or another program's region), named with its frame and kind.
pub fn check_known(pool: &Pool) -> Result<(), nvram::Error> {
    for (frame, tag) in pool.allocated_frames()? {
        if of(tag.kind).is_none() {
            return Err(nvram::Error::corrupt(
                nvram::Area::Frame(frame.0),
                format!(
                    "a frame of kind {:#x}, which no part of the mount writes (a region of \
                     another kind, or damage)",
                    tag.kind
                ),
            ));
        }
    }
    Ok(())
}
