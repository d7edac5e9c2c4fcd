//! `nvstack flush MOUNTPOINT`: transform every temp file of a running mount into the lower
//! directory, write back every dirty page of the page cache and checkpoint the metadata
//! journal (the lower directory alone is then complete and durable), with a progress bar (the
//! daemon streams `progress DONE TOTAL` lines, and `phase writeback` between the two).

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;

use crate::error::{CliError, CliResult};

#[derive(Debug, clap::Args)]
pub struct FlushArgs {
    pub mountpoint: PathBuf,
    /// No progress bar (e.g. in scripts); the summary line is still printed.
    #[arg(long, short = 'q')]
    pub quiet: bool,
}

pub fn run(args: &FlushArgs) -> CliResult {
    let (mut stream, mountpoint) = super::control::connect(&args.mountpoint)?;
    let io = |e: std::io::Error| CliError::Other(format!("control socket: {e}"));
    stream.write_all(b"flush\n").map_err(io)?;
    stream.shutdown(std::net::Shutdown::Write).map_err(io)?;
    let bar = if args.quiet {
        indicatif::ProgressBar::hidden()
    } else {
        indicatif::ProgressBar::new(0).with_style(
            indicatif::ProgressStyle::with_template(
                "transforming temp files {bar:40} {pos}/{len} ({elapsed})",
            )
            .expect("static template"),
        )
    };
    for line in BufReader::new(stream).lines() {
        let line = line.map_err(io)?;
        if line == "phase writeback" {
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "writing back dirty pages {bar:40} {pos}/{len} ({elapsed})",
                )
                .expect("static template"),
            );
            bar.set_position(0);
            continue;
        }
        if let Some(rest) = line.strip_prefix("progress ") {
            let mut parts = rest.split_whitespace().map(|n| n.parse::<u64>().unwrap_or(0));
            let (done, total) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
            bar.set_length(total);
            bar.set_position(done);
            continue;
        }
        bar.finish_and_clear();
        let value: serde_json::Value = serde_json::from_str(&line)
            .map_err(|e| CliError::Other(format!("bad reply from the daemon: {e}: {line}")))?;
        if let Some(err) = value.get("error").filter(|e| !e.is_null()) {
            return Err(CliError::Other(format!(
                "flush: {} temp file(s) transformed, {} dirty page(s) written back, then: {}",
                value["transformed"],
                value["pages_written"],
                err.as_str().unwrap_or("error")
            )));
        }
        println!(
            "flushed {}: {} temp file(s) transformed, {} dirty page(s) written back, {} journal \
             record(s) checkpointed",
            mountpoint.display(),
            value["transformed"],
            value["pages_written"],
            value["journal_records_checkpointed"]
        );
        return Ok(());
    }
    Err(CliError::Other("the daemon closed the connection without a result".into()))
}
