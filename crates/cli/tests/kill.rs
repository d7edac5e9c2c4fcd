//! Process-level crash tests (level 2 of the three crash-test levels, docs/design.md section 9): the real daemon is SIGKILLed at random
//! moments and at persistence steps (failpoints: `NVSTACK_FAILPOINT=<step>:<n>`) while
//! - applications create, write, rename over temp and lower files, unlink, and temp files are
//!   transformed (`transform.<step>`): no hidden transform file may remain, a rename over an
//!   existing file never leaves it empty or missing;
//! - applications rewrite parts of existing lower files and truncate them while the page cache
//!   writes dirty pages back under pressure and on flush (`writeback.<step>`), their partial
//!   writes becoming patches in each non-blocking-write mode (`nbw.merged` after an
//!   asynchronous fetch);
//! - with temp files off, the same namespace workload makes journaled changes of lower objects
//!   while the metadata journal checkpoints (`checkpoint.<step>`), and the daemon that recovers
//!   after a kill dies again while it replays the records (`replay.applied`) or checkpoints them.
//!
//! After `nvstack mount` recovers, every file must show its last completed state (or, for the
//! operation the kill interrupted, its state before or after it), and after a clean unmount
//! the lower directory alone shows the same.
//!
//! Replay: `NVSTACK_SEED=<seed> cargo test -p nvstack --test kill -- --nocapture`; add
//! `NVSTACK_TRACE=1` for every step and `NVSTACK_KEEP_LOGS=<dir>` for the daemon logs.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_nvstack");
const NAMES: &[&str] = &["a", "b", "c", "d", "e", "victim"];
/// Enough names for the temp files' records to fill, empty and free several record frames
/// (eight records a frame).
const MANY_NAMES: &[&str] = &[
    "a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n", "o", "p", "q", "r", "s",
    "t", "u", "v", "w", "x", "victim",
];
/// Small, so that writes trigger size transforms.
const MAX_SIZE: &str = "48K";

fn skip() -> bool {
    common::skip("the kill tests")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// The seeded generator of the workload (replayable by seed).
struct Rng(rand_chacha::ChaCha8Rng);
impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(rand::SeedableRng::seed_from_u64(seed))
    }
    fn below(&mut self, n: u64) -> u64 {
        rand::Rng::random_range(&mut self.0, 0..n)
    }
}

/// What a name may hold: exactly one content (`None` = absent), or, after an interrupted
/// operation, any of several.
type Allowed = BTreeSet<Option<Vec<u8>>>;

struct Fixture {
    dir: tempfile::TempDir,
    shm: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("lower")).unwrap();
        std::fs::create_dir(dir.path().join("mnt")).unwrap();
        let shm = tempfile::Builder::new().prefix("nvstack-kill").tempdir_in("/dev/shm").unwrap();
        Fixture { dir, shm }
    }
    fn lower(&self) -> PathBuf {
        self.dir.path().join("lower")
    }
    fn mnt(&self) -> PathBuf {
        self.dir.path().join("mnt")
    }
    fn mount_with(&self, failpoint: Option<&str>, args: &[&str]) {
        let out = self.mount_command(failpoint, args);
        assert!(out.status.success(), "mount: {}", text(&out));
    }
    /// A mount whose daemon may die at its failpoint while it recovers: false then.
    fn try_mount_with(&self, failpoint: Option<&str>, args: &[&str]) -> bool {
        self.mount_command(failpoint, args).status.success()
    }
    fn mount_command(&self, failpoint: Option<&str>, args: &[&str]) -> Output {
        let mut c = Command::new(BIN);
        c.arg("mount")
            .arg(self.lower())
            .arg(self.mnt())
            .arg("--nvram")
            .arg(self.shm.path().join("region"))
            .args(args);
        match failpoint {
            Some(f) => c.env("NVSTACK_FAILPOINT", f),
            None => c.env_remove("NVSTACK_FAILPOINT"),
        };
        c.output().unwrap()
    }
    fn pid(&self) -> Option<i32> {
        let out = Command::new(BIN).args(["stat", "--json"]).arg(self.mnt()).output().ok()?;
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        v["mount"]["pid"].as_i64().map(|p| p as i32)
    }
    fn flush(&self) -> bool {
        Command::new(BIN).args(["flush", "-q"]).arg(self.mnt()).output().unwrap().status.success()
    }
    fn umount(&self) {
        let out = common::nvstack_umount(&self.mnt());
        assert!(out.status.success(), "umount: {}", text(&out));
    }
    /// Hidden transform files left in the lower directory.
    fn hidden(&self) -> Vec<String> {
        std::fs::read_dir(self.lower())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".nvstack-transform-"))
            .collect()
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let mnt = self.mnt();
        if !common::nvstack_umount(&mnt).status.success() {
            let _ = Command::new("fusermount3").arg("-uz").arg(&mnt).output();
        }
        common::remove_run_dir(&mnt);
    }
}

fn content(rng: &mut Rng) -> Vec<u8> {
    // Up to 80 KiB: some stay below the size limit, some cross it.
    let len = rng.below(80 << 10) as usize;
    let byte = 1 + rng.below(250) as u8;
    let mut v = vec![byte; len];
    if len > 0 {
        v[0] = byte.wrapping_add(1);
    }
    v
}

/// One application operation on the mount; updates `model` with what may now be there. An
/// error means the daemon died under it: both outcomes stay allowed.
fn step(
    f: &Fixture,
    scenario: &Scenario,
    rng: &mut Rng,
    model: &mut BTreeMap<String, Allowed>,
) -> String {
    let names = scenario.names;
    let name = names[rng.below(names.len() as u64) as usize];
    let path = f.mnt().join(name);
    let current = model.get(name).cloned().unwrap_or_else(|| BTreeSet::from([None]));
    let mut op = rng.below(6);
    if op == 5 && scenario.flush_odds > 1 && rng.below(scenario.flush_odds) != 0 {
        op = 0; // most flush draws write instead: temp files accumulate
    }
    match op {
        0 | 1 => {
            let new = content(rng);
            let ok = std::fs::write(&path, &new).is_ok();
            let mut allowed = if ok { Allowed::new() } else { current.clone() };
            allowed.insert(Some(new.clone()));
            if !ok {
                // Interrupted between create, truncate and the write requests the kernel
                // split write(2) into (each one atomic): a prefix at a page boundary.
                for k in (0..new.len()).step_by(4096) {
                    allowed.insert(Some(new[..k].to_vec()));
                }
            }
            model.insert(name.into(), allowed);
            format!("write {name} {}", new.len())
        }
        2 => {
            let to = scenario.names[rng.below(scenario.names.len() as u64) as usize];
            let ok = std::fs::rename(&path, f.mnt().join(to));
            let from_now = current.clone();
            match ok {
                Ok(()) => {
                    if to != name {
                        model.insert(to.into(), from_now);
                        model.insert(name.into(), BTreeSet::from([None]));
                    }
                }
                Err(e)
                    if e.kind() == std::io::ErrorKind::NotFound
                        && current == BTreeSet::from([None]) => {}
                Err(_) => {
                    // Either renamed or not; never an empty or missing target when the source
                    // existed (the auto_da_alloc lesson).
                    let mut t = model.get(to).cloned().unwrap_or_else(|| BTreeSet::from([None]));
                    t.extend(from_now.iter().cloned());
                    model.insert(to.into(), t);
                    let mut s = current.clone();
                    s.insert(None);
                    model.insert(name.into(), s);
                }
            }
            format!("rename {name} {to}")
        }
        3 => {
            let ok = std::fs::remove_file(&path);
            match ok {
                Ok(()) => {
                    model.insert(name.into(), BTreeSet::from([None]));
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(_) => {
                    let mut s = current;
                    s.insert(None);
                    model.insert(name.into(), s);
                }
            }
            format!("unlink {name}")
        }
        4 => {
            // Overwrite in place (same length): old or new, never a mix of lengths.
            if let Ok(mut old) = std::fs::read(&path) {
                let new: Vec<u8> = old.iter().map(|b| b.wrapping_add(7)).collect();
                let ok = std::fs::OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .and_then(|mut file| std::io::Write::write_all(&mut file, &new))
                    .is_ok();
                let mut allowed = if ok { Allowed::new() } else { current };
                if !ok {
                    // Each write request is atomic; write(2) may be several.
                    for k in (0..old.len()).step_by(4096) {
                        let mut mix = new[..k].to_vec();
                        mix.extend_from_slice(&old[k..]);
                        allowed.insert(Some(mix));
                    }
                    allowed.insert(Some(std::mem::take(&mut old)));
                }
                allowed.insert(Some(new));
                model.insert(name.into(), allowed);
            }
            format!("overwrite {name}")
        }
        _ => {
            let ok = f.flush();
            format!("flush {ok}")
        }
    }
}

/// After recovery: every name shows an allowed state; the model becomes what is there.
fn verify(
    f: &Fixture,
    names: &[&str],
    model: &mut BTreeMap<String, Allowed>,
    seed: u64,
    round: usize,
) {
    for &name in names {
        let got = std::fs::read(f.mnt().join(name)).ok();
        let allowed = model.get(name).cloned().unwrap_or_else(|| BTreeSet::from([None]));
        assert!(
            allowed.contains(&got),
            "seed {seed} round {round}: {name} holds {:?} ({} bytes), allowed: {:?}",
            got.as_ref().map(|g| g.first().copied()),
            got.as_ref().map_or(0, Vec::len),
            allowed
                .iter()
                .map(|a| a.as_ref().map(|v| (v.len(), v.first().copied())))
                .collect::<Vec<_>>()
        );
        model.insert(name.into(), BTreeSet::from([got]));
    }
    let listed: BTreeSet<String> = std::fs::read_dir(f.mnt())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let expected: BTreeSet<String> =
        model.iter().filter(|(_, a)| !a.contains(&None)).map(|(n, _)| n.clone()).collect();
    assert_eq!(listed, expected, "seed {seed} round {round}: readdir");
    assert!(
        f.hidden().is_empty(),
        "seed {seed} round {round}: hidden files left: {:?}",
        f.hidden()
    );
}

/// A process that is gone or a zombie (the daemon is an orphan; whoever reaps it may be slow).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with(|c| c != 'Z' && c != 'X'))
        })
        .unwrap_or(false)
}

/// Waits until the kernel has aborted the connection of the killed daemon `pid` (once its
/// /dev/fuse descriptors are gone the mount point answers ENOTCONN).
fn wait_stale(f: &Fixture, pid: i32, seed: u64, round: usize) {
    let mut waited = 0;
    let mounted = || {
        std::fs::read_to_string("/proc/self/mountinfo").unwrap().contains(f.mnt().to_str().unwrap())
    };
    let stale = || {
        let c = std::ffi::CString::new(f.mnt().to_str().unwrap()).unwrap();
        // SAFETY: statvfs fills the zeroed struct (statfs is never answered from a cache).
        let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
        let rc = unsafe { libc::statvfs(c.as_ptr(), &raw mut s) };
        rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOTCONN)
    };
    while mounted() && !stale() {
        if waited == 100 {
            let tasks: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
                .map(|d| {
                    d.filter_map(|t| {
                        let t = t.ok()?;
                        let stat = std::fs::read_to_string(t.path().join("stat")).ok()?;
                        let wchan =
                            std::fs::read_to_string(t.path().join("wchan")).unwrap_or_default();
                        Some(format!("{} {wchan}", stat.rsplit_once(')')?.1.get(..3)?))
                    })
                    .collect()
                })
                .unwrap_or_default();
            panic!(
                "seed {seed} round {round}: the mount did not go stale; daemon tasks: {tasks:?}"
            );
        }
        std::thread::sleep(Duration::from_millis(20));
        waited += 1;
    }
}

/// Where a round's daemons die: `work` in the daemon the workload runs on (`None`: at a random
/// moment), `recovery` in the daemon that recovers after that kill (`None`: it lives).
#[derive(Clone, Copy, Debug)]
struct Kill {
    work: Option<&'static str>,
    recovery: Option<&'static str>,
}

/// A kill test over the namespace workload of `step`: how to mount, and where to die.
struct Scenario {
    name: &'static str,
    args: &'static [&'static str],
    kills: &'static [Kill],
    /// The file names of the workload (`NAMES`, or `MANY_NAMES`).
    names: &'static [&'static str],
    /// One in this many of the workload's flush draws flushes (the others write).
    flush_odds: u64,
    /// Temp files made (small, the first names) before the first round.
    prefill: usize,
}

const fn at_work(point: &'static str) -> Kill {
    Kill { work: Some(point), recovery: None }
}

const TEMPFS: Scenario = Scenario {
    name: "tempfs",
    args: &["--size", "32M", "--tempfile-max-size", MAX_SIZE],
    kills: &[
        at_work("transform.marked"),
        at_work("transform.copied"),
        at_work("transform.renamed"),
        at_work("transform.freed"),
    ],
    names: NAMES,
    flush_odds: 1,
    prefill: 0,
};

/// The workload over 25 names, starting from 24 small temp files (three record frames),
/// flushing one in eight times it would and keeping temp files in NVRAM across unmounts:
/// temp-file records fill, empty and free record frames (`crate::slots`), with kills at random moments and at
/// transform steps (whose last one frees the record's slot).
const RECORDS: Scenario = Scenario {
    name: "records",
    args: &["--size", "32M", "--tempfile-max-size", MAX_SIZE, "--keep-tempfiles"],
    kills: &[at_work("transform.marked"), at_work("transform.freed")],
    names: MANY_NAMES,
    flush_odds: 8,
    prefill: 24,
};

/// The same workload with the background transformer moving temp files from 1 % of their
/// share on (about 70 frames of the 32 MiB region): transforms run on the daemon's own thread
/// beside the workload's requests, and the kills at transform steps land in its rounds too.
const BACKGROUND: Scenario = Scenario {
    name: "background",
    args: &["--size", "32M", "--tempfile-max-size", MAX_SIZE, "--tempfile-background", "1"],
    kills: &[at_work("transform.marked"), at_work("transform.copied"), at_work("transform.freed")],
    names: NAMES,
    flush_odds: 1,
    prefill: 0,
};

/// Temp files off: every create, rename and unlink is a change of lower objects, journaled; a
/// journal of two frames (8 KiB: 10-25 packed records) and no timed checkpoints, so that
/// checkpoints run every few operations and a killed daemon leaves records. A daemon killed between a record's commit
/// and the marker (`journal.committed`) leaves a record replay must judge by state: its
/// successor dies replaying it.
const JOURNAL: Scenario = Scenario {
    name: "journal",
    args: &[
        "--size",
        "32M",
        "--tempfiles",
        "off",
        "--journal-size",
        "8K",
        "--checkpoint-interval",
        "0",
    ],
    kills: &[
        at_work("checkpoint.synced"),
        Kill { work: Some("journal.committed"), recovery: Some("replay.applied") },
        at_work("checkpoint.freed"),
        Kill { work: None, recovery: Some("checkpoint.synced") },
        at_work("journal.committed"),
    ],
    names: NAMES,
    flush_odds: 1,
    prefill: 0,
};

/// The tree a seed starts from: a lower file `victim` to rename over (created, transformed,
/// and so a plain lower file) and the scenario's prefilled temp files; returns the record
/// frames their records take (checked: eight a frame).
fn start_tree(
    f: &Fixture,
    scenario: &Scenario,
    seed: u64,
    model: &mut BTreeMap<String, Allowed>,
) -> u64 {
    f.mount_with(None, scenario.args);
    std::fs::write(f.mnt().join("victim"), b"the lower victim").unwrap();
    assert!(f.flush());
    model.insert("victim".into(), BTreeSet::from([Some(b"the lower victim".to_vec())]));
    for (i, &name) in scenario.names.iter().take(scenario.prefill).enumerate() {
        let content = vec![b'p' + (i % 8) as u8; 100 + i];
        std::fs::write(f.mnt().join(name), &content).unwrap();
        model.insert(name.into(), BTreeSet::from([Some(content)]));
    }
    let out = Command::new(BIN).args(["stat", "--json"]).arg(f.mnt()).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let record_frames = v["tempfiles"]["record_frames"].as_u64().unwrap_or(0);
    assert_eq!(
        record_frames,
        scenario.prefill.div_ceil(8) as u64,
        "{} seed {seed}: the prefilled records' frames",
        scenario.name
    );
    f.umount();
    record_frames
}

/// Kills of one seed: (all, at a failpoint, at a failpoint during recovery), and the most
/// record frames the temp files' records took (after the prefill, after each recovery).
fn run_seed(scenario: &Scenario, seed: u64, rounds: usize) -> (usize, usize, usize, u64) {
    let f = Fixture::new();
    let mount = |failpoint: Option<&str>| f.mount_with(failpoint, scenario.args);
    let trace = std::env::var_os("NVSTACK_TRACE").is_some();
    let mut rng = Rng::new(seed);
    let mut model: BTreeMap<String, Allowed> = BTreeMap::new();
    let mut record_frames = start_tree(&f, scenario, seed, &mut model);
    let (mut kills, mut failpoint_kills, mut recovery_kills) = (0, 0, 0);
    for round in 0..rounds {
        // Every other round dies at a step (the n-th time it is reached), the others at a
        // random moment.
        let kill = (round % 2 == 0).then(|| scenario.kills[(round / 2) % scenario.kills.len()]);
        let work = kill.and_then(|k| k.work).map(|p| format!("{p}:{}", 1 + rng.below(3)));
        // Recovery checkpoints once and replays the few records a kill left: its first time.
        let recovery = kill.and_then(|k| k.recovery).map(|p| format!("{p}:1"));
        mount(work.as_deref());
        let pid = f.pid().expect("daemon pid");
        // A round whose recovery must die is killed by the loop below right after a change
        // that may leave a record (not at a random moment, which may follow a flush).
        let kill_after = 3 + rng.below(20) as usize;
        let killer = (work.is_none() && recovery.is_none()).then(|| {
            let delay = Duration::from_millis(5 + rng.below(60));
            std::thread::spawn(move || {
                std::thread::sleep(delay);
                // SAFETY: kill(2) of the daemon we started.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            })
        });
        for i in 0..40 {
            let done = step(&f, scenario, &mut rng, &mut model);
            if trace {
                eprintln!("{} seed {seed} round {round}: {done}", scenario.name);
            }
            let changed = done.starts_with("write ") || done.starts_with("unlink");
            if work.is_none() && recovery.is_some() && i >= kill_after && changed {
                // SAFETY: kill(2) of the daemon we started.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            if !alive(pid) {
                break;
            }
        }
        if let Some(k) = killer {
            k.join().unwrap();
        }
        let died = !alive(pid);
        if died && work.is_some() {
            failpoint_kills += 1;
        }
        if !died {
            // The failpoint was never reached in this round: stop the daemon the hard way.
            // SAFETY: as above.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        kills += 1;
        wait_stale(&f, pid, seed, round);
        if let Some(point) = &recovery {
            // Recovery dies at its step (the mount fails) or never reaches it.
            if f.try_mount_with(Some(point), scenario.args) {
                verify(&f, scenario.names, &mut model, seed, round);
                f.umount();
            } else {
                kills += 1;
                failpoint_kills += 1;
                recovery_kills += 1;
            }
        }
        if trace {
            eprintln!(
                "{} seed {seed} round {round}: died {died} at {work:?}, recovery {recovery:?}",
                scenario.name
            );
        }
        mount(None);
        verify(&f, scenario.names, &mut model, seed, round);
        let out = Command::new(BIN).args(["stat", "--json"]).arg(f.mnt()).output().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        record_frames = record_frames.max(v["tempfiles"]["record_frames"].as_u64().unwrap_or(0));
        f.umount();
    }
    // A flush and a clean unmount transform and checkpoint everything: the lower directory
    // alone shows the files.
    mount(None);
    assert!(f.flush(), "{} seed {seed}: the final flush", scenario.name);
    f.umount();
    for &name in scenario.names {
        let got = std::fs::read(f.lower().join(name)).ok();
        assert_eq!(
            BTreeSet::from([got]),
            model[name],
            "{} seed {seed}: after unmount the lower directory shows {name}",
            scenario.name
        );
    }
    assert!(f.hidden().is_empty());
    (kills, failpoint_kills, recovery_kills, record_frames)
}

fn seeds(default: std::ops::RangeInclusive<u64>) -> Vec<u64> {
    match std::env::var("NVSTACK_SEED") {
        Ok(s) => vec![s.parse().expect("NVSTACK_SEED is a number")],
        Err(_) => default.collect(),
    }
}

/// Runs `scenario` over `default` seeds (or NVSTACK_SEED) and checks that at least
/// `at_least` kills landed at a transform step; prints the most record frames seen.
fn kill_at_transforms(
    scenario: &Scenario,
    default: std::ops::RangeInclusive<u64>,
    rounds: usize,
    at_least: usize,
) {
    let (mut kills, mut at_steps, mut record_frames) = (0, 0, 0);
    for seed in seeds(default) {
        let (k, s, _, r) = run_seed(scenario, seed, rounds);
        kills += k;
        at_steps += s;
        record_frames = record_frames.max(r);
    }
    let name = scenario.name;
    eprintln!(
        "{name} kill test: {kills} SIGKILLs, {at_steps} of them at a transform step; up to \
         {record_frames} record frames after the prefill and each recovery"
    );
    assert!(at_steps >= at_least, "too few kills at transform steps: {at_steps}");
}

#[test]
fn sigkill_during_temp_file_operations_and_transforms_loses_nothing_completed() {
    if skip() {
        return;
    }
    kill_at_transforms(&TEMPFS, 11..=15, 16, 20);
}

#[test]
fn sigkill_while_temp_file_records_fill_and_empty_record_frames_loses_nothing_completed() {
    if skip() {
        return;
    }
    // Every seed starts from three record frames (checked by `start_tree`); how many remain
    // after each recovery depends on where the kills land, so it is reported, not asserted.
    kill_at_transforms(&RECORDS, 31..=33, 12, 6);
}

#[test]
fn sigkill_while_the_background_transformer_runs_loses_nothing_completed() {
    if skip() {
        return;
    }
    kill_at_transforms(&BACKGROUND, 21..=23, 10, 10);
    // With these arguments the thread does transform what the workload leaves (6 files of 12
    // pages and their record frame: 73 frames over a mark of 34, 1 % of the 3,426 frames of
    // the temp files' share of the region's 3,807).
    let f = Fixture::new();
    f.mount_with(None, BACKGROUND.args);
    for i in 0..6u8 {
        std::fs::write(f.mnt().join(format!("bg{i}")), vec![i; 48 << 10]).unwrap();
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let out = Command::new(BIN).args(["stat", "--json"]).arg(f.mnt()).output().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        if v["tempfiles"]["transformed"]["background"].as_u64().unwrap_or(0) > 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no background transform: {}",
            v["tempfiles"]
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    f.umount();
}

#[test]
fn sigkill_during_journaled_changes_checkpoints_and_replay_loses_nothing_completed() {
    if skip() {
        return;
    }
    let (mut kills, mut at_steps, mut in_recovery) = (0, 0, 0);
    let runs = seeds(31..=34).len();
    for seed in seeds(31..=34) {
        let (k, s, r, _) = run_seed(&JOURNAL, seed, 16);
        kills += k;
        at_steps += s;
        in_recovery += r;
    }
    eprintln!(
        "journal kill test: {kills} SIGKILLs, {at_steps} at a checkpoint or replay step, \
         {in_recovery} of them during recovery"
    );
    assert!(at_steps >= 3 * runs, "too few kills at checkpoint and replay steps: {at_steps}");
    assert!(in_recovery >= runs, "too few kills during recovery: {in_recovery}");
}

// ---------------------------------------------------------------------------------------------
// The page cache: rewrites of existing lower files, write-back under pressure and on flush.

const FILES: [&str; 4] = ["r0", "r1", "r2", "r3"];
const FILE_SIZE: usize = 160 << 10;
const WB_STEPS: [&str; 2] = ["writeback.written", "writeback.freed"];
/// A small region (about 1,400 frames) with low watermarks: pressure write-back runs often.
/// The NVRAM path for every open: the rewrites are what the test is about (in passthrough the
/// kernel would write the lower files itself; crates/cli/tests/routes.rs).
const CACHE_MOUNT: [&str; 14] = [
    "--passthrough",
    "off",
    "--size",
    "8M",
    "--tempfiles",
    "off",
    "--dirty-high",
    "3",
    "--dirty-low",
    "1",
    "--writeback-batch",
    "8",
    "--max-dirty-age",
    "0",
];

/// One rewrite (pwrite of up to 12 KiB: a single FUSE request, so atomic), truncate or flush;
/// `model[i]` holds the contents file i may have (one, or several after an interrupted
/// request). Returns what was done and whether it succeeded: the first step that fails must
/// be the last of the round (the daemon is dying), since `model` keeps only that step's
/// alternatives.
fn cache_step(f: &Fixture, rng: &mut Rng, model: &mut [Vec<Vec<u8>>]) -> (String, bool) {
    use std::os::unix::fs::FileExt;
    let i = rng.below(FILES.len() as u64) as usize;
    let path = f.mnt().join(FILES[i]);
    let before = model[i][0].clone();
    match rng.below(20) {
        0 => {
            let ok = f.flush();
            (format!("flush {ok}"), ok)
        }
        1 => {
            let size = rng.below(FILE_SIZE as u64) as usize;
            let ok = std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .and_then(|file| file.set_len(size as u64))
                .is_ok();
            let mut after = before.clone();
            after.resize(size, 0);
            model[i] = if ok { vec![after] } else { vec![before, after] };
            (format!("truncate {} {size} {ok}", FILES[i]), ok)
        }
        _ => {
            // Hot region (the first 16 KiB) or anywhere, up to 12 KiB, sometimes beyond the end.
            let off = if rng.below(2) == 0 {
                rng.below(16 << 10)
            } else {
                rng.below(FILE_SIZE as u64 + 8192)
            } as usize;
            let len = 1 + rng.below(12 << 10) as usize;
            let byte = 1 + rng.below(250) as u8;
            let ok = std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .and_then(|file| file.write_all_at(&vec![byte; len], off as u64))
                .is_ok();
            // The first `upto` bytes of the write done.
            let done = |upto: usize| {
                let mut v = before.clone();
                if v.len() < upto {
                    v.resize(upto, 0);
                }
                v[off..upto].fill(byte);
                v
            };
            model[i] = if ok {
                vec![done(off + len)]
            } else {
                // Interrupted: each FUSE write request is atomic, but the kernel sends a
                // write that starts inside a page it does not cache as several requests
                // (that page alone first), so any prefix ending at a page boundary may be done.
                let mut allowed = vec![before.clone(), done(off + len)];
                let first = (off / 4096 + 1) * 4096;
                allowed.extend((first..off + len).step_by(4096).map(done));
                allowed
            };
            (format!("write {} {off}+{len} byte {byte} {ok}", FILES[i]), ok)
        }
    }
}

fn verify_files(dir: &Path, model: &mut [Vec<Vec<u8>>], what: &str) {
    for (i, name) in FILES.iter().enumerate() {
        let got = std::fs::read(dir.join(name)).unwrap();
        if !model[i].contains(&got) {
            let diff = |want: &Vec<u8>| {
                let first = want.iter().zip(&got).position(|(a, b)| a != b);
                let last = want.iter().zip(&got).rposition(|(a, b)| a != b);
                match (first, last) {
                    (Some(f), Some(l)) => format!(
                        "{} bytes; differs in {f}..={l}: got {:?}.., want {:?}..",
                        want.len(),
                        &got[f..(f + 4).min(got.len())],
                        &want[f..(f + 4).min(want.len())]
                    ),
                    _ => format!("{} bytes; same prefix", want.len()),
                }
            };
            panic!(
                "{what}: {name} has {} bytes, allowed: {:?}",
                got.len(),
                model[i].iter().map(diff).collect::<Vec<_>>()
            );
        }
        model[i] = vec![got];
    }
}

fn run_cache_seed(seed: u64, rounds: usize) -> (usize, usize, u64) {
    let f = Fixture::new();
    let mut rng = Rng::new(seed);
    let mut model: Vec<Vec<Vec<u8>>> = Vec::new();
    for (i, name) in FILES.iter().enumerate() {
        let content: Vec<u8> = (0..FILE_SIZE).map(|k| (k / 4096 + i) as u8).collect();
        std::fs::write(f.lower().join(name), &content).unwrap();
        model.push(vec![content]);
    }
    let (mut kills, mut at_steps, mut written) = (0, 0, 0u64);
    // Non-blocking writes in each mode that makes patches; the asynchronous ones also die
    // right after merging a fetched page.
    let nbw = ["lazy", "async-bg", "async-fg"][(seed % 3) as usize];
    let mut args = CACHE_MOUNT.to_vec();
    args.extend(["--nbw", nbw]);
    // Odd seeds: rounds above the mark run in the daemon's background writer (the default),
    // so kills at write-back steps land in its thread; even seeds: in the request of the
    // writer that passed the mark (`--writeback-background off`).
    args.extend(["--writeback-background", if seed % 2 == 1 { "on" } else { "off" }]);
    let steps: &[&str] =
        if nbw == "lazy" { &WB_STEPS } else { &[WB_STEPS[0], "nbw.merged", WB_STEPS[1]] };
    for round in 0..rounds {
        let failpoint = (round % 2 == 0)
            .then(|| format!("{}:{}", steps[(round / 2) % steps.len()], 1 + rng.below(4)));
        f.mount_with(failpoint.as_deref(), &args);
        let pid = f.pid().expect("daemon pid");
        let sent = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let killer = failpoint.is_none().then(|| {
            let delay = Duration::from_millis(20 + rng.below(200));
            let sent = std::sync::Arc::clone(&sent);
            std::thread::spawn(move || {
                std::thread::sleep(delay);
                sent.store(true, std::sync::atomic::Ordering::SeqCst);
                // SAFETY: kill(2) of the daemon we started.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            })
        });
        for _ in 0..300 {
            let (done, ok) = cache_step(&f, &mut rng, &mut model);
            if std::env::var_os("NVSTACK_TRACE").is_some() {
                eprintln!("seed {seed} round {round}: {done}");
            }
            if !ok {
                // Only the kill may fail a step: the random one was sent, or the failpoint's
                // lets the daemon die. (The process outlives the failed request for a moment.)
                let by_kill = sent.load(std::sync::atomic::Ordering::SeqCst)
                    || (failpoint.is_some()
                        && (0..500).any(|_| {
                            std::thread::sleep(Duration::from_millis(10));
                            !alive(pid)
                        }));
                assert!(by_kill, "seed {seed} round {round}: {done} failed on a live daemon");
                break;
            }
            if !alive(pid) {
                break;
            }
        }
        if let Some(k) = killer {
            k.join().unwrap();
        }
        if alive(pid) {
            // SAFETY: as above.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        } else {
            at_steps += usize::from(failpoint.is_some());
        }
        kills += 1;
        wait_stale(&f, pid, seed, round);
        f.mount_with(None, &args);
        verify_files(&f.mnt(), &mut model, &format!("seed {seed} round {round} after recovery"));
        let out = Command::new(BIN).args(["stat", "--json"]).arg(f.mnt()).output().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        written += v["writeback"]["pages_dirty"].as_u64().unwrap_or(0);
        f.umount();
    }
    // A clean unmount writes back everything: the lower directory alone shows the files.
    verify_files(&f.lower(), &mut model, &format!("seed {seed}: the lower directory"));
    (kills, at_steps, written)
}

#[test]
fn sigkill_during_rewrites_and_write_back_loses_no_completed_write() {
    if skip() {
        return;
    }
    let seeds: Vec<u64> = match std::env::var("NVSTACK_SEED") {
        Ok(s) => vec![s.parse().expect("NVSTACK_SEED is a number")],
        Err(_) => (21..=26).collect(),
    };
    let (mut kills, mut at_steps, mut recovered) = (0, 0, 0);
    let runs = seeds.len();
    for seed in seeds {
        let (k, s, r) = run_cache_seed(seed, 10);
        kills += k;
        at_steps += s;
        recovered += r;
    }
    eprintln!(
        "cache kill test: {kills} SIGKILLs, {at_steps} at a write-back step; {recovered} dirty \
         pages found in NVRAM after recovery"
    );
    assert!(at_steps >= 2 * runs, "too few kills at write-back steps: {at_steps}");
    assert!(recovered > 0, "no dirty page was ever recovered: the test did not test the cache");
}

// ---------------------------------------------------------------------------------------------
// Journal mode: operations are durable at the next group commit (fsync, fdatasync, the clock).

/// A log of numbered 64-byte lines appended with fdatasync every few lines, and mail-style
/// deliveries (write tmp/N, fsync, rename into new/, fsync new/), under `--consistency
/// journal`, SIGKILLed at random moments. After recovery the log is a run of whole lines from
/// the first (a group loses whole operations, never part of one) at least as long as the last
/// acknowledged fdatasync, and every acknowledged delivery is in new/ with its content.
fn run_journal_mode_seed(seed: u64, rounds: usize) -> (u64, u64) {
    let f = Fixture::new();
    let args = ["--size", "32M", "--consistency", "journal"];
    let mut rng = Rng::new(seed);
    let line = |n: u64| format!("{n:0>63}\n").into_bytes();
    let mut lines_acked = 0u64;
    let mut next_line = 0u64;
    let mut delivered: Vec<u64> = Vec::new();
    f.mount_with(None, &args);
    std::fs::create_dir(f.mnt().join("tmp")).unwrap();
    std::fs::create_dir(f.mnt().join("new")).unwrap();
    let new_dir = std::fs::File::open(f.mnt().join("new")).unwrap();
    new_dir.sync_all().unwrap();
    drop(new_dir);
    f.umount();
    for round in 0..rounds {
        f.mount_with(None, &args);
        let pid = f.pid().expect("daemon pid");
        let delay = Duration::from_millis(20 + rng.below(150));
        let killer = std::thread::spawn(move || {
            std::thread::sleep(delay);
            // SAFETY: kill(2) of the daemon we started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        });
        let mut work = || -> std::io::Result<()> {
            use std::io::Write;
            let mut log =
                std::fs::OpenOptions::new().create(true).append(true).open(f.mnt().join("log"))?;
            loop {
                for _ in 0..=rng.below(4) {
                    log.write_all(&line(next_line))?;
                    next_line += 1;
                }
                log.sync_data()?;
                lines_acked = next_line;
                if rng.below(3) == 0 {
                    let n = seed * 1000 + delivered.len() as u64;
                    let tmp = f.mnt().join("tmp").join(n.to_string());
                    std::fs::write(&tmp, line(n))?;
                    std::fs::File::open(&tmp)?.sync_all()?;
                    std::fs::rename(&tmp, f.mnt().join("new").join(n.to_string()))?;
                    std::fs::File::open(f.mnt().join("new"))?.sync_all()?;
                    delivered.push(n);
                }
            }
        };
        let _ = work(); // ends with the daemon: ENOTCONN
        killer.join().unwrap();
        wait_stale(&f, pid, seed, round);
        f.mount_with(None, &args);
        let log = std::fs::read(f.mnt().join("log")).unwrap_or_default();
        assert_eq!(log.len() % 64, 0, "seed {seed} round {round}: a partial line in the log");
        let kept = log.len() as u64 / 64;
        for (i, got) in log.chunks(64).enumerate() {
            assert_eq!(got, line(i as u64), "seed {seed} round {round}: line {i}");
        }
        assert!(
            kept >= lines_acked,
            "seed {seed} round {round}: {kept} lines after recovery, {lines_acked} acknowledged"
        );
        for n in &delivered {
            let got = std::fs::read(f.mnt().join("new").join(n.to_string()));
            assert_eq!(got.ok(), Some(line(*n)), "seed {seed} round {round}: delivery {n}");
        }
        // What survived is what the next round appends to.
        next_line = kept;
        lines_acked = kept;
        f.umount();
    }
    (lines_acked, delivered.len() as u64)
}

#[test]
fn sigkill_in_journal_mode_loses_nothing_acknowledged() {
    if skip() {
        return;
    }
    let (mut lines, mut deliveries) = (0, 0);
    for seed in seeds(51..=54) {
        let (l, d) = run_journal_mode_seed(seed, 8);
        lines += l;
        deliveries += d;
    }
    eprintln!(
        "journal mode kill test: {lines} acknowledged log lines and {deliveries} acknowledged \
         deliveries survived SIGKILLs"
    );
    assert!(lines > 0 && deliveries > 0, "the workload acknowledged nothing");
}
