//! `nvstack stat MOUNTPOINT [--json]`: the counters of a running mount.

use std::path::PathBuf;

use super::control;
use crate::error::CliResult;

#[derive(Debug, clap::Args)]
pub struct StatArgs {
    pub mountpoint: PathBuf,
    /// Print the raw JSON document (stable keys for tools).
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &StatArgs) -> CliResult {
    let value = control::ask(&args.mountpoint, "stat")?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&value).expect("json"));
        return Ok(());
    }
    print_overview(&value);
    print_caches(&value);
    print_durability(&value);
    print_routes(&value);
    print_direct(&value);
    print_requests(&value);
    print_incidents(&value);
    Ok(())
}

/// Failures the daemon survived and said on its stderr, by kind: the kinds that occurred, or
/// "none".
fn print_incidents(value: &serde_json::Value) {
    let Some(incidents) = value["incidents"].as_object() else { return };
    let list: Vec<String> = incidents
        .iter()
        .filter(|(_, v)| v.as_u64().unwrap_or(0) > 0)
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    if list.is_empty() {
        println!("incidents: none");
    } else {
        println!("incidents (failures survived, said on the daemon's stderr): {}", list.join(", "));
    }
}

/// Routes (docs/design.md section 14): opens served by the kernel from the lower file.
fn print_routes(value: &serde_json::Value) {
    let r = &value["passthrough"];
    if r["enabled"].as_bool() != Some(true) && r["opens_passthrough"].as_u64().unwrap_or(0) == 0 {
        println!("passthrough: off");
        return;
    }
    println!(
        "passthrough: {} opens in passthrough, {} on the NVRAM path; {} file(s) in the route \
         profile ({} learned by fsync, {} by O_SYNC, {} by small writes); {} passthrough fsyncs",
        r["opens_passthrough"],
        r["opens_nvram"],
        r["profile_files"],
        r["learned_fsync"],
        r["learned_sync_flag"],
        r["learned_small_writes"],
        r["fsyncs"]
    );
}

/// The direct path (docs/direct-path.md): delegations and what the library wrote.
fn print_direct(value: &serde_json::Value) {
    let d = &value["direct"];
    if d["enabled"].as_bool() != Some(true) {
        println!("direct path: off");
        return;
    }
    let nonzero = |v: &serde_json::Value| -> String {
        let list: Vec<String> = v
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(_, n)| n.as_u64().unwrap_or(0) > 0)
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        if list.is_empty() { "none".into() } else { list.join(", ") }
    };
    println!(
        "direct path: {} delegations held, {} granted (refused: {}); taken back or merged: {}; \
         the library's writes merged: {} ({} B) in {} merges, {} fsyncs answered by it; {} logs \
         refused; take-backs waited {} us (longest {} us, {} at the bound)",
        d["active"],
        d["granted"],
        nonzero(&d["refused_grants"]),
        nonzero(&d["taken_back"]),
        d["writes"],
        d["bytes"],
        d["merges"],
        d["fsyncs"],
        d["refused_logs"],
        d["take_back_wait_us"],
        d["take_back_wait_us_max"],
        d["wait_timeouts"]
    );
}

fn print_overview(value: &serde_json::Value) {
    let m = &value["mount"];
    println!("{} on {} (nvram {}, pid {})", m["lower"], m["mountpoint"], m["nvram"], m["pid"]);
    let n = &value["nvram"];
    println!(
        "nvram: {} consistency, {} persistence; frames {} used / {} free; undo max {} B; {} transactions",
        n["consistency"],
        n["persist_mode"],
        n["frames_used"],
        n["frames_free"],
        n["undo_bytes_max"],
        n["transactions_committed"]
    );
    println!(
        "apps:  read {} B, wrote {} B; lower: read {} B, wrote {} B",
        value["app"]["bytes_read"],
        value["app"]["bytes_written"],
        value["lower"]["bytes_read"],
        value["lower"]["bytes_written"]
    );
    let l = &value["lower_nodes"];
    println!(
        "nodes: {} known to the kernel, {} open files; lower descriptors {} held of at most {} \
         ({} released, reopened by handle {} times){}",
        value["inodes"],
        value["open_handles"],
        l["fds_held"],
        l["fds_limit"],
        l["released_now"],
        l["reopens"],
        if l["handles"].as_bool() == Some(false) {
            " - no file handles here: nodes keep their descriptors"
        } else {
            ""
        }
    );
}

/// "; pressure 12; size 3": the triggers that transformed temp files, in the JSON's order
/// (empty when none did).
fn by_trigger(transformed: &serde_json::Value) -> String {
    let Some(map) = transformed.as_object() else {
        return String::new();
    };
    map.iter()
        .filter_map(|(k, v)| v.as_u64().filter(|&n| n > 0).map(|n| format!("; {k} {n}")))
        .collect()
}

/// The two NVRAM caches: temp files and the page cache (only when used).
fn print_caches(value: &serde_json::Value) {
    let t = &value["tempfiles"];
    if t["enabled"].as_bool() == Some(true) || t["created"].as_u64().unwrap_or(0) > 0 {
        println!(
            "tempfiles: {} created, {} deleted in NVRAM, {} transformed ({} B{}), {} resident \
             ({} pages, records in {} frames), average span {:.1} blocks",
            t["created"],
            t["deleted_in_nvram"],
            t["transformed_total"],
            t["bytes_transformed"],
            by_trigger(&t["transformed"]),
            t["files_resident"],
            t["pages_resident"],
            t["record_frames"],
            t["span_blocks_avg"].as_f64().unwrap_or(0.0)
        );
    }
    let cache = &value["cache"];
    let wb = &value["writeback"];
    if cache["enabled"].as_bool() == Some(true) || cache["files"].as_u64().unwrap_or(0) > 0 {
        println!(
            "cache: {} files (records in {} frames), {} dirty pages ({} inactive); {} hits, {} \
             fetches",
            cache["files"],
            cache["record_frames"],
            wb["pages_dirty"],
            wb["pages_inactive_dirty"],
            cache["hits"],
            cache["fetches"]
        );
        println!(
            "writeback ({}): {} pages in {} batches, {} requests, {} repeated, inter-request \
             distance {} blocks, {} syncs, {} writes waited for room",
            wb["policy"].as_str().unwrap_or("?"),
            wb["pages_written"],
            wb["batches"],
            wb["requests"],
            wb["repeated_pages"],
            wb["inter_request_distance_blocks"],
            wb["syncs"],
            wb["room_waits"]
        );
        let n = &value["nbw"];
        // The reasons a write still read its page first, those that occurred.
        let reasons: Vec<String> = n["writer_wait_reasons"]
            .as_object()
            .map(|m| {
                m.iter()
                    .filter(|(_, v)| v.as_u64().unwrap_or(0) > 0)
                    .map(|(k, v)| format!("{v} {k}"))
                    .collect()
            })
            .unwrap_or_default();
        let reasons =
            if reasons.is_empty() { String::new() } else { format!(" ({})", reasons.join(", ")) };
        println!(
            "nbw ({}): {} patches created, {} in NVRAM ({} B in {} of at most {} frames, {} \
             moved); {} completed without a read; fetches: {} async ({} paused at the high \
             watermark, {} failed), {} on read, {} on write-back; {} reads from patches; {} \
             writes waited{}",
            n["mode"].as_str().unwrap_or("?"),
            n["patches_created"],
            n["patches"],
            n["patch_bytes"],
            n["patch_frames"],
            n["patch_limit"],
            n["patches_moved"],
            n["pages_completed_without_fetch"],
            n["fetches_async"],
            n["fetches_paused"],
            n["fetches_failed"],
            n["fetches_on_read"],
            n["fetches_on_writeback"],
            n["reads_served_from_patches"],
            n["writer_waits"],
            reasons
        );
    }
}

/// What durability calls cost: fsync and the metadata journal.
fn print_durability(value: &serde_json::Value) {
    let fs = &value["fsync"];
    println!(
        "fsync: {} calls ({} files, {} directories, {} temp files), {} waited on the lower file \
         system; {} lower syncfs",
        fs["calls"],
        fs["file_calls"],
        fs["dir_calls"],
        fs["temp_calls"],
        fs["waited_on_lower"],
        fs["lower_syncfs"]
    );
    if fs["requests"] == "spare" {
        println!(
            "fsync requests spared (--fsync-requests spare): the kernel was told {} time(s) \
             not to send them and returns fsync itself; {} lower changes synced by their own \
             operation",
            fs["spared"], fs["eager_syncs"]
        );
    }
    if fs["sync_requests"].as_u64().unwrap_or(0) > 0 {
        println!("nvstack sync: {} requests", fs["sync_requests"]);
    }
    let j = &value["journal"];
    if j["enabled"].as_bool() == Some(true) {
        println!(
            "journal: {} records in NVRAM ({} B of {}), {} written, {} creations annulled by \
             their removal, {} not journaled, {} checkpoints ({} ms), {} replayed at mount",
            j["records"],
            j["bytes"],
            j["size_max"],
            j["records_total"],
            j["records_annulled"],
            j["not_journaled"],
            j["checkpoints"],
            j["checkpoint_ms_total"],
            j["replayed_at_mount"]
        );
    }
    let g = &j["group"];
    if g["protection"].as_bool() == Some(true) || g["group_commits"].as_u64().unwrap_or(0) > 0 {
        println!(
            "group commits (journal mode): {} ({} forced by a full group), {} operations not yet \
             committed; {} stray stores trapped",
            g["group_commits"],
            g["group_commits_forced"],
            g["group_operations"],
            j["trapped_writes"]
        );
    }
}

fn print_requests(value: &serde_json::Value) {
    if let Some(requests) = value["requests"].as_object() {
        let list: Vec<String> = requests.iter().map(|(k, v)| format!("{k} {v}")).collect();
        println!("requests: {}", list.join(", "));
    }
    let f = &value["fuse"];
    if f["spin_us"].as_u64().unwrap_or(0) > 0 {
        println!(
            "spinning reader (window {} us learned from the gaps between requests, at most {}; \
             a miss valued at {} us): {} requests taken while spinning, {} windows expired, {} \
             readers added while every reader was busy",
            f["spin_window_us"],
            f["spin_window_max_us"],
            f["spin_us"],
            f["spin_hits"],
            f["spin_expired"],
            f["readers_added"]
        );
    } else if f.is_object() {
        println!("spinning reader: off (--spin-us 0)");
    }
    if let Some(errors) = value["errors"].as_object().filter(|e| !e.is_empty()) {
        let list: Vec<String> = errors.iter().map(|(k, v)| format!("{k} {v}")).collect();
        println!("errors returned: {}", list.join(", "));
    }
    if let Some(retries) = value["retries"].as_object().filter(|r| !r.is_empty()) {
        let list: Vec<String> = retries.iter().map(|(k, v)| format!("{k} {v}")).collect();
        println!("attempts retried after NVRAM was full (not errors): {}", list.join(", "));
    }
}
