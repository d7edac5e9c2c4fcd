//! The table itself: it is deterministic (two runs on two plain directories of the same file
//! system give identical lines), every case runs, and the comparison reports differences.
//! The comparison with the mount is `crates/cli/tests/posix_table.rs`. This package having an
//! integration test is also what makes `cargo test --workspace` build the runner binary.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

const RUNNER: &str = env!("CARGO_BIN_EXE_nvstack-posixtest");

fn run_table(dir: &std::path::Path) -> String {
    let o = Command::new(RUNNER).arg(dir).arg("--json").output().unwrap();
    assert!(o.status.success(), "runner: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

#[test]
fn table_is_deterministic_on_one_file_system() {
    // The permission cases drop to nobody: the directories must be reachable for everyone.
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    for d in [&a, &b] {
        std::fs::create_dir(d).unwrap();
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let (la, lb) = (run_table(&a), run_table(&b));
    let cases = nvstack_posixtest::compare::parse(&la).unwrap();
    assert_eq!(cases.len(), nvstack_posixtest::cases::CASES.len());
    assert!(cases.iter().all(|c| !c.steps.is_empty()), "a case logged nothing");
    let other = nvstack_posixtest::compare::parse(&lb).unwrap();
    if let Some(report) = nvstack_posixtest::compare::diff("a", &cases, "b", &other) {
        panic!("two runs on the same file system differ:\n{report}");
    }
}

#[test]
fn compare_reports_a_changed_step_and_judges_known_differences() {
    use nvstack_posixtest::CaseLog;
    use nvstack_posixtest::compare::{diff, judge, parse_known};
    let log = |steps: &[&str]| CaseLog {
        case: "c".into(),
        steps: steps.iter().map(ToString::to_string).collect(),
    };
    let a = [log(&["open = ok", "write = 5", "close = ok"])];
    let b = [log(&["open = ok", "write = EIO", "close = ok"])];
    let report = diff("lower", &a, "mount", &b).unwrap();
    assert!(report.contains("  - write = 5\n  + write = EIO\n"), "{report}");
    assert!(diff("lower", &a, "mount", &a).is_none());

    let known = parse_known("# comment\nc  the mount cannot do it yet\n").unwrap();
    let v = judge("lower", &a, "mount", &b, &known);
    assert!(v.failures.is_empty() && v.known.contains("write = EIO"), "{v:?}");
    let v = judge("lower", &a, "mount", &a, &known);
    assert!(v.failures.contains("remove it from the list"), "{v:?}");
    assert!(parse_known("c\n").is_err(), "an entry without a reason is refused");
}

#[test]
fn runner_errors_are_exit_2_and_unknown_case_is_refused() {
    let o = Command::new(RUNNER).arg("/nonexistent-posixtest-dir").output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    let tmp = tempfile::tempdir().unwrap();
    let o = Command::new(RUNNER).arg(tmp.path()).args(["--case", "no_such_case"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
}
