//! Comparing two runs: the JSON-lines outputs of the table on the lower directory and on the
//! mount. A case differs when its step lists differ; the report shows, per case, the first
//! differing step with a few steps of context, in the style of a unified diff.

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::CaseLog;

/// Parses JSON lines into case logs (blank lines are skipped).
pub fn parse(text: &str) -> Result<Vec<CaseLog>, String> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).map_err(|e| format!("bad line {l:?}: {e}")))
        .collect()
}

/// Parses a known-differences file: `CASE  reason` a line, `#` comments. Every case needs a
/// reason.
pub fn parse_known(text: &str) -> Result<BTreeMap<String, String>, String> {
    let mut known = BTreeMap::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let (case, reason) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
        if reason.trim().is_empty() {
            return Err(format!("known difference {case:?} has no reason"));
        }
        known.insert(case.to_string(), reason.trim().to_string());
    }
    Ok(known)
}

/// The verdict of a comparison with a list of known differences.
#[derive(Debug, Default)]
pub struct Verdict {
    /// The report of the differences that fail the comparison (empty = pass).
    pub failures: String,
    /// The report of the known differences (printed, not failing).
    pub known: String,
}

/// Compares like `diff`, but a case listed in `known` may differ (its diff goes to
/// `Verdict::known`); a listed case that no longer differs is a failure (the list must shrink).
pub fn judge(
    a_name: &str,
    a: &[CaseLog],
    b_name: &str,
    b: &[CaseLog],
    known: &BTreeMap<String, String>,
) -> Verdict {
    let mut v = Verdict::default();
    for case in a
        .iter()
        .map(|c| &c.case)
        .chain(b.iter().map(|c| &c.case).filter(|n| !a.iter().any(|c| &c.case == *n)))
    {
        let pick =
            |l: &[CaseLog]| l.iter().filter(|c| &c.case == case).cloned().collect::<Vec<_>>();
        let report = diff(a_name, &pick(a), b_name, &pick(b));
        let body = |r: &str, skip: usize| {
            r.lines().skip(skip).filter(|l| !l.ends_with("cases differ")).fold(
                String::new(),
                |mut acc, l| {
                    let _ = writeln!(acc, "{l}");
                    acc
                },
            )
        };
        match (report, known.get(case.as_str())) {
            (None, None) => {}
            (Some(r), None) => v.failures += &body(&r, 0),
            (Some(r), Some(why)) => {
                let _ = writeln!(v.known, "known difference {case} ({why}):");
                v.known += &body(&r, 1);
            }
            (None, Some(_)) => {
                // Only a case that ran on both sides can be said to have stopped differing.
                if a.iter().any(|c| &c.case == case) {
                    let _ = writeln!(
                        v.failures,
                        "case {case}: listed as a known difference but identical now: remove it from the list"
                    );
                }
            }
        }
    }
    v
}

/// A readable report of every difference between `a` (named `a_name`) and `b`, or `None` when
/// both hold the same cases with the same steps.
pub fn diff(a_name: &str, a: &[CaseLog], b_name: &str, b: &[CaseLog]) -> Option<String> {
    let am: BTreeMap<&str, &CaseLog> = a.iter().map(|c| (c.case.as_str(), c)).collect();
    let bm: BTreeMap<&str, &CaseLog> = b.iter().map(|c| (c.case.as_str(), c)).collect();
    let mut out = String::new();
    let mut differing = 0;
    for name in am.keys().chain(bm.keys().filter(|k| !am.contains_key(*k))) {
        match (am.get(name), bm.get(name)) {
            (Some(x), Some(y)) if x.steps == y.steps => {}
            (Some(x), Some(y)) => {
                differing += 1;
                let _ = writeln!(out, "case {name}: differs (-{a_name} +{b_name})");
                out += &steps_diff(&x.steps, &y.steps);
            }
            (Some(_), None) => {
                differing += 1;
                let _ = writeln!(out, "case {name}: only in {a_name}");
            }
            (None, _) => {
                differing += 1;
                let _ = writeln!(out, "case {name}: only in {b_name}");
            }
        }
    }
    (differing > 0)
        .then(|| format!("{out}{differing} of {} cases differ\n", am.len().max(bm.len())))
}

/// A line diff by longest common subsequence (the logs are at most a few hundred steps), with
/// two lines of context around each change.
fn steps_diff(a: &[String], b: &[String]) -> String {
    let (n, m) = (a.len(), b.len());
    let mut lcs = vec![vec![0u32; m + 1]; n + 1];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[i][j] =
                if a[i] == b[j] { lcs[i + 1][j + 1] + 1 } else { lcs[i + 1][j].max(lcs[i][j + 1]) };
        }
    }
    let mut ops: Vec<(char, &str)> = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < n || j < m {
        if i < n && j < m && a[i] == b[j] {
            ops.push((' ', &a[i]));
            i += 1;
            j += 1;
        } else if i < n && (j == m || lcs[i + 1][j] >= lcs[i][j + 1]) {
            ops.push(('-', &a[i]));
            i += 1;
        } else {
            ops.push(('+', &b[j]));
            j += 1;
        }
    }
    let near =
        |k: usize| ops[k.saturating_sub(2)..(k + 3).min(ops.len())].iter().any(|(c, _)| *c != ' ');
    let mut out = String::new();
    let mut skipped = false;
    for (k, (c, line)) in ops.iter().enumerate() {
        if near(k) {
            if skipped {
                out += "    ...\n";
                skipped = false;
            }
            let _ = writeln!(out, "  {c} {line}");
        } else {
            skipped = true;
        }
    }
    out
}
