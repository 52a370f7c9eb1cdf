//! What an interrupted run leaves (docs/reading-a-run.md): the signal path writes
//! `results.json` with `"status": "interrupted"`, the cases that had finished with their
//! checks, and the ids of those that had not; the finished cases' raw transcripts are
//! already in the folder (each is written as soon as the case ends). The run's last
//! line is `INTERRUPTED signal=SIGINT passed=N failed=M cases_finished=K/T`, never a
//! SUMMARY line (that one is for completed runs only, so a CI parser is not misled),
//! and `evidence/latest` is left where it was: only a completed run moves it
//! (`RunFolder::finish`). A harness error after the folder was made leaves the same
//! record with `"status": "error"` ([`record_error`]).

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

use case_kit::CaseReport;

/// The run in progress, as the signal path sees it.
struct Progress {
    /// The run's evidence folder (`evidence/runs/<stamp>-<pid>/`).
    dir: PathBuf,
    seed: u64,
    launched: Instant,
    /// Every selected case id, in selection order.
    selected: Vec<String>,
    /// The cases that have finished, in the order they finished.
    finished: Vec<CaseReport>,
}

/// Where the run is.
enum State {
    /// No evidence folder yet (building the selection, starting PostgreSQL).
    Before,
    /// Cases are running or being compared.
    Running(Progress),
    /// The run's record is complete.
    Done,
}

static STATE: Mutex<State> = Mutex::new(State::Before);

fn state() -> std::sync::MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|p| p.into_inner())
}

/// The evidence folder exists: from now on a signal writes an interrupted record there.
pub fn begin(dir: PathBuf, seed: u64, launched: Instant, selected: Vec<String>) {
    *state() = State::Running(Progress {
        dir,
        seed,
        launched,
        selected,
        finished: Vec::new(),
    });
}

/// One case has finished: its raw transcript goes into the folder now (so an
/// interrupted run keeps it), and its checks count for the interrupted record.
pub fn case_finished(report: &CaseReport) {
    if let State::Running(progress) = &mut *state() {
        let _ = std::fs::write(
            progress.dir.join(format!("{}.txt", report.id)),
            report.transcript(),
        );
        progress.finished.push(report.clone());
    }
}

/// The run's record is complete (`results.json` written, `latest` moved): a signal from
/// now on changes nothing in the folder.
pub fn complete() {
    *state() = State::Done;
}

/// The error path: a harness error ended the run after its evidence folder was made;
/// writes `results.json` with `"status": "error"`, the message and the finished cases,
/// so the folder says what happened. Nothing when there is no folder or the record is
/// complete.
pub fn record_error(message: &str) {
    let progress = match std::mem::replace(&mut *state(), State::Done) {
        State::Running(progress) => progress,
        _ => return,
    };
    let (_, unfinished) = counts(&progress);
    let line = format!("harness error: {message}");
    if crate::evidence::write_interrupted(
        &progress.dir,
        &progress.finished,
        &unfinished,
        crate::evidence::Incomplete::Error(message),
        progress.seed,
        progress.launched.elapsed().as_millis(),
        &line,
    )
    .is_ok()
    {
        eprintln!(
            "harness: the failed run is recorded in {} (evidence/latest unchanged)",
            progress.dir.display()
        );
    }
}

/// Passed and failed checks of the finished cases, and the ids not finished.
fn counts(progress: &Progress) -> ((usize, usize), Vec<String>) {
    let passed: usize = progress.finished.iter().map(|r| r.passed).sum();
    let failed: usize = progress.finished.iter().map(|r| r.failed).sum();
    let unfinished: Vec<String> = progress
        .selected
        .iter()
        .filter(|id| !progress.finished.iter().any(|r| &r.id == *id))
        .cloned()
        .collect();
    ((passed, failed), unfinished)
}

/// The signal path: writes the interrupted record (when the evidence folder exists and
/// the run's record was not complete) and returns the run's last line.
pub fn record(signal: &str) -> String {
    let progress = match std::mem::replace(&mut *state(), State::Done) {
        State::Running(progress) => progress,
        State::Before => {
            return format!(
                "INTERRUPTED signal={signal} passed=0 failed=0 cases_finished=0 \
                 (before any case started; no evidence folder was made)"
            );
        }
        State::Done => {
            return format!(
                "INTERRUPTED signal={signal} after the run's record was written \
                 (see evidence/latest)"
            );
        }
    };
    let ((passed, failed), unfinished) = counts(&progress);
    let wall_ms = progress.launched.elapsed().as_millis();
    let line = format!(
        "INTERRUPTED signal={signal} passed={passed} failed={failed} cases_finished={}/{}",
        progress.finished.len(),
        progress.selected.len()
    );
    if let Err(error) = crate::evidence::write_interrupted(
        &progress.dir,
        &progress.finished,
        &unfinished,
        crate::evidence::Incomplete::Signal(signal),
        progress.seed,
        wall_ms,
        &line,
    ) {
        eprintln!(
            "harness: could not write the interrupted record in {}: {error:#}",
            progress.dir.display()
        );
    } else {
        eprintln!(
            "harness: interrupted run recorded in {} (evidence/latest unchanged)",
            progress.dir.display()
        );
    }
    if let Some(evidence_dir) = progress.dir.parent().and_then(Path::parent) {
        crate::evidence::prune_runs(evidence_dir, crate::evidence::keep_runs());
    }
    line
}
