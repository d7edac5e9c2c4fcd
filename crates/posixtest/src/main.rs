//! `nvstack-posixtest DIR [--json] [--case NAME]...`: runs the POSIX table inside DIR.
//! `nvstack-posixtest --compare A.jsonl B.jsonl`: compares two `--json` outputs, prints a diff
//! per differing case and exits 1 if any differs. `--list` prints the case names.
//!
//! Exit status: 0 = ran (or compared equal), 1 = the compared runs differ, 2 = the runner's own
//! error (bad arguments, DIR unusable). A case's errno is data, never a failure.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use nvstack_posixtest::{cases, compare, run_case};

/// Runs a table of POSIX scenarios and prints their normalized results, one case per line.
#[derive(Debug, Parser)]
#[command(name = "nvstack-posixtest", version, about, long_about = None)]
struct Args {
    /// The directory to run in (each case gets DIR/<case>, recreated). Run as root for the
    /// permission cases (they drop to uid/gid 65534 in a forked child).
    #[arg(required_unless_present_any = ["list", "compare"])]
    dir: Option<PathBuf>,
    /// One JSON line per case: {"case": NAME, "steps": [...]}. Default: readable text.
    #[arg(long)]
    json: bool,
    /// Run only this case (repeatable).
    #[arg(long = "case", value_name = "NAME")]
    cases: Vec<String>,
    /// Print the case names and exit.
    #[arg(long)]
    list: bool,
    /// Compare two --json outputs (the first is the reference, normally the lower directory).
    #[arg(long, num_args = 2, value_names = ["A", "B"], conflicts_with = "dir")]
    compare: Option<Vec<PathBuf>>,
    /// With --compare: a file of cases allowed to differ (`CASE  reason` a line); a listed case
    /// that is identical fails the comparison.
    #[arg(long, value_name = "FILE", requires = "compare")]
    known: Option<PathBuf>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.list {
        for c in cases::CASES {
            println!("{}", c.name);
        }
        return ExitCode::SUCCESS;
    }
    if let Some(files) = &args.compare {
        return compare_files(&files[0], &files[1], args.known.as_ref());
    }
    let dir = args.dir.clone().expect("clap requires DIR");
    if !dir.is_dir() {
        eprintln!("nvstack-posixtest: {} is not a directory", dir.display());
        return ExitCode::from(2);
    }
    let mut selected = Vec::new();
    for name in &args.cases {
        let Some(case) = cases::find(name) else {
            eprintln!("nvstack-posixtest: no case {name:?} (see --list)");
            return ExitCode::from(2);
        };
        selected.push(case);
    }
    if selected.is_empty() {
        selected = cases::CASES.iter().collect();
    }
    // SAFETY: umask has no preconditions. Modes of created objects depend on it.
    unsafe { libc::umask(0o022) };
    for case in selected {
        let log = match run_case(&dir, case) {
            Ok(log) => log,
            Err(e) => {
                eprintln!("nvstack-posixtest: preparing {}: {e}", dir.join(case.name).display());
                return ExitCode::from(2);
            }
        };
        if args.json {
            println!("{}", serde_json::to_string(&log).expect("log to json"));
        } else {
            println!("{}:", log.case);
            for s in &log.steps {
                println!("    {s}");
            }
        }
    }
    ExitCode::SUCCESS
}

fn compare_files(a: &PathBuf, b: &PathBuf, known: Option<&PathBuf>) -> ExitCode {
    let read =
        |p: &PathBuf| std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()));
    let parsed = (|| {
        let la = compare::parse(&read(a)?)?;
        let lb = compare::parse(&read(b)?)?;
        let known = match known {
            Some(k) => compare::parse_known(&read(k)?)?,
            None => std::collections::BTreeMap::new(),
        };
        Ok::<_, String>((la, lb, known))
    })();
    let (la, lb, known) = match parsed {
        Ok(x) => x,
        Err(e) => {
            eprintln!("nvstack-posixtest: {e}");
            return ExitCode::from(2);
        }
    };
    let verdict =
        compare::judge(&a.display().to_string(), &la, &b.display().to_string(), &lb, &known);
    print!("{}", verdict.known);
    if verdict.failures.is_empty() {
        println!("{} cases compared: no unexpected difference", la.len());
        ExitCode::SUCCESS
    } else {
        print!("{}", verdict.failures);
        ExitCode::from(1)
    }
}
