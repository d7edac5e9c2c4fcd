//! Incidents: the failures the library reports on stderr, each one counted by its kind, so
//! that `nvstack stat` (`incidents` in `--json`) says how often each happened.
//!
//! An incident is a failure the engine survives and does not answer to a request with: a
//! background or pressure round that failed (the state stays correct in NVRAM and is tried
//! again), a step at unmount that left work for the next mount, and the like. Errors answered
//! to a request are counted in `errors` (`counters.rs`) instead. Every such failure goes
//! through [`Incidents::report`] (`Base::incident`): it is counted, then its line is written to
//! stderr as before. Nothing else in the library writes to stderr (checked by
//! `crates/core/tests/incidents.rs`; a line that is not a failure says why at its site).
//!
//! One failure may be reported twice, at two levels: a flush that made no progress
//! (`writeback_stalled`) is also the failure of the unmount that ran it (`writeback_failed`).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// The enum, its list and its names from one table, so that no kind can miss a counter or a
/// name.
macro_rules! kinds {
    ($($(#[doc = $doc:literal])* $kind:ident => $name:literal,)*) => {
        /// Every kind of failure the library reports. The names ([`Incident::name`]) are the
        /// keys of `incidents` in `nvstack stat --json`: kept once published.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum Incident {
            $($(#[doc = $doc])* $kind,)*
        }

        impl Incident {
            /// Every kind, in declaration order (the order of the counters).
            pub const ALL: &[Incident] = &[$(Incident::$kind,)*];

            /// The stable snake_case name (a key of `incidents` in `nvstack stat --json`).
            pub fn name(&self) -> &'static str {
                match self {
                    $(Incident::$kind => $name,)*
                }
            }
        }
    };
}

kinds! {
    /// A temp file's transform to a lower file failed (pressure, background, size trigger);
    /// it stays in NVRAM.
    TransformFailed => "transform_failed",
    /// A write-back round or flush failed (pressure, background, room, unmount); the pages
    /// stay dirty in NVRAM.
    WritebackFailed => "writeback_failed",
    /// A flush ended after three batches in a row freed nothing (pages rewritten meanwhile).
    WritebackStalled => "writeback_stalled",
    /// An asynchronous fetch of a patched page failed; the patch stays.
    FetchFailed => "fetch_failed",
    /// A checkpoint of the metadata journal failed (size, room, after a marker failure,
    /// unmount); the records stay in NVRAM.
    CheckpointFailed => "checkpoint_failed",
    /// Setting the journal's marker on the lower root failed (a checkpoint follows).
    MarkerFailed => "marker_failed",
    /// Settling pending directory times failed (when there are many, at unmount); they stay
    /// in NVRAM.
    DirTimesFailed => "dir_times_failed",
    /// NVRAM the engine meant to free stayed allocated: an empty record frame, the record and
    /// pages of a deleted cached file.
    FreeFailed => "free_failed",
    /// A syncfs of the lower file system when too many objects were unsynced failed.
    LowerSyncFailed => "lower_sync_failed",
    /// The route profile could not learn a file; it stays unlearned.
    RouteLearnFailed => "route_learn_failed",
    /// Re-keying records at journal replay met a damaged record (the mount is refused).
    RekeyFailed => "rekey_failed",
    /// The direct path could not make a log area or merge a log (kept for the next merge).
    DirectFailed => "direct_failed",
    /// A delegation's log failed validation: its valid prefix merged, the delegation ended.
    DirectRefusedLog => "direct_refused_log",
}

/// How many incidents of each kind were reported (relaxed atomics: observations).
#[derive(Debug, Default)]
pub struct Incidents {
    counts: [AtomicU64; Incident::ALL.len()],
}

impl Incidents {
    /// Counts an incident of `kind` and writes `message` to stderr (one line, as given).
    pub(crate) fn report(&self, kind: Incident, message: fmt::Arguments<'_>) {
        self.report_if(true, kind, message);
    }

    /// Counts an incident of `kind`; writes `message` only when `say` (for a site that says
    /// only some of its failures, e.g. the first and every power of two).
    pub(crate) fn report_if(&self, say: bool, kind: Incident, message: fmt::Arguments<'_>) {
        self.counts[kind as usize].fetch_add(1, Ordering::Relaxed);
        if say {
            eprintln!("{message}");
        }
    }

    /// The incidents of `kind` reported so far.
    pub(crate) fn count(&self, kind: Incident) -> u64 {
        self.counts[kind as usize].load(Ordering::Relaxed)
    }

    /// Every kind's name and count, zeros included, in [`Incident::ALL`]'s order.
    pub(crate) fn snapshot(&self) -> Vec<(&'static str, u64)> {
        Incident::ALL.iter().map(|&k| (k.name(), self.count(k))).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_is_listed_once_in_order_with_a_distinct_name() {
        for (i, k) in Incident::ALL.iter().enumerate() {
            assert_eq!(*k as usize, i, "{k:?}: ALL is in declaration order");
        }
        let names: std::collections::BTreeSet<_> =
            Incident::ALL.iter().map(Incident::name).collect();
        assert_eq!(names.len(), Incident::ALL.len());
    }

    #[test]
    fn a_report_counts_its_kind_only() {
        let i = Incidents::default();
        i.report(Incident::FetchFailed, format_args!("nvstack: test incident (ignore)"));
        i.report_if(false, Incident::FetchFailed, format_args!("not said"));
        let snap = i.snapshot();
        assert_eq!(snap.len(), Incident::ALL.len());
        for (name, n) in snap {
            assert_eq!(n, u64::from(name == "fetch_failed") * 2, "{name}");
        }
    }
}
