//! S6 — many writers (beyond the seed article's one connection): 32 connections in 4
//! crash-worker processes (8 each) apply distinct `−7` changes to 100 units at the same
//! moment, each in `BEGIN IMMEDIATE` with the store's busy timeout.
//! Claim: writers queue for the file's one write lock and each sees the units left by the
//! previous one: exactly 14 Applied, 18 Insufficient, 2 units, 14 rows; no writer runs out
//! of busy timeout.
//! Negative control, forced, every run: connection A begins a deferred transaction and
//! reads the units; connection B then commits a change; A writes → SQLite refuses A's
//! write at once with SQLITE_BUSY_SNAPSHOT (or SQLITE_BUSY), without calling A's busy
//! handler: waiting could not help, since A's snapshot is already stale (see LIMITS.md).
//! "At once" is an event, not a duration: A's busy handler counts its calls.
//! Fails if: the counts or units differ, a writer is busy, or the control's write succeeds
//! or SQLite called A's busy handler (it would have waited for the busy timeout).
//!
//! ```text
//! parent    4 workers x 8 connections open the file; READY x 4; create the start file
//! workers   32 x (BEGIN IMMEDIATE; ship-pN-MM -7; COMMIT or ROLLBACK) -> OUTCOME lines
//! A         BEGIN (deferred); SELECT units              -> 2
//! B         receive-6 +10 (BEGIN IMMEDIATE … COMMIT)    -> applied, 12
//! A         UPDATE stock SET units = 2 - 1              -> SQLITE_BUSY_SNAPSHOT at once
//! ```

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use inventory_store::naive::DeferredReadThenWrite;
use inventory_store::{BUSY_TIMEOUT_MS, Store, code_name, is_busy, reconcile};

use case_kit::{Case, Ctx};
use launch::worker::CrashWorker;

use super::{ITEM, outcome_kind, remove_database_files, seeded_store, units_of};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "S6",
        "32 connections in 4 processes ship 7 from 100; control: a deferred read-then-write gets BUSY_SNAPSHOT",
        |ctx| run(ctx).boxed(),
    )
}

const PROCESSES: usize = 4;
const CONNECTIONS_PER_PROCESS: usize = 8;
const DELTA: i64 = -7;
/// How long each worker may take to open its connections and print READY.
const READY_WAIT_MS: u64 = 30_000;
/// How long the parent waits for each OUTCOME line once the writers are released: the
/// busy timeout plus a margin, since the last writer may wait that long for the lock.
const OUTCOME_WAIT_MS: u64 = BUSY_TIMEOUT_MS + 20_000;
/// How long a worker may take to exit after its last line.
const EXIT_WAIT_MS: u64 = 10_000;
/// B's change in the control, committed between A's read and A's write.
const CONTROL_RESTOCK: i64 = 10;
/// What A tries to write (absolute: the units it read plus this).
const CONTROL_DELTA: i64 = -1;

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let store = seeded_store(ctx)?;
    let path = ctx.sqlite_path();
    let start_file = path.with_file_name(format!("{}.start", ctx.case_id()));
    remove_database_files(&start_file)?;

    let mut workers = launch_writers(&path, &start_file)?;
    release_when_ready(ctx, &mut workers, &start_file).await?;
    let outcomes = collect_outcomes(ctx, &mut workers).await?;
    check_outcomes(ctx, &store, &outcomes)?;

    forced_control(ctx, &path, ControlSchedule::BCommitsBetweenReadAndWrite)?;
    let findings = reconcile(store.connection())?;
    ctx.check(
        "the file reconciles",
        findings.is_empty(),
        format!("findings={}", findings.len()),
    );
    Ok(())
}

/// workers: 4 processes, 8 connections each, all open before the start; each waits for
/// `start_file` to exist.
///
/// Errors: a worker cannot be launched.
fn launch_writers(path: &Path, start_file: &Path) -> anyhow::Result<Vec<CrashWorker>> {
    let mut workers = Vec::new();
    for process in 0..PROCESSES {
        workers.push(CrashWorker::launch([
            "sqlite".to_string(),
            "writers".into(),
            "--file".into(),
            path.display().to_string(),
            "--connections".into(),
            CONNECTIONS_PER_PROCESS.to_string(),
            "--event-prefix".into(),
            format!("ship-p{process}-"),
            "--item".into(),
            ITEM.to_string(),
            "--delta".into(),
            DELTA.to_string(),
            "--start-file".into(),
            start_file.display().to_string(),
        ])?);
    }
    Ok(workers)
}

/// Checks every worker printed READY with its connections open (waiting up to
/// [`READY_WAIT_MS`] each), then creates `start_file`: the start barrier across processes,
/// which every worker polls for.
///
/// Errors: a worker's output cannot be read, the file cannot be written.
async fn release_when_ready(
    ctx: &mut Ctx,
    workers: &mut [CrashWorker],
    start_file: &Path,
) -> anyhow::Result<()> {
    let mut ready = 0;
    for worker in workers.iter_mut() {
        let line = worker
            .next_line(Duration::from_millis(READY_WAIT_MS))
            .await?
            .unwrap_or_default();
        ready += usize::from(line == format!("READY connections={CONNECTIONS_PER_PROCESS}"));
    }
    ctx.check_eq("worker processes ready", PROCESSES, ready);
    // The start barrier across processes: every worker polls for this file.
    std::fs::write(start_file, b"go\n")?;
    Ok(())
}

/// What the writers reported on their OUTCOME lines.
struct Outcomes {
    applied: usize,
    insufficient: usize,
    /// Any other outcome, as `outcome/code`.
    other: Vec<String>,
    event_ids: BTreeSet<String>,
    /// The slowest writer's time for its change, lock wait included, milliseconds.
    longest_ms: u64,
}

/// Reads each worker's OUTCOME lines (up to [`OUTCOME_WAIT_MS`] per line) until it ends,
/// and checks it exited 0 (within [`EXIT_WAIT_MS`]). Returns the outcomes counted.
///
/// Errors: a worker's output cannot be read or it does not exit.
async fn collect_outcomes(ctx: &mut Ctx, workers: &mut [CrashWorker]) -> anyhow::Result<Outcomes> {
    let (mut applied, mut insufficient, mut other) = (0usize, 0usize, Vec::new());
    let mut event_ids = BTreeSet::new();
    let mut longest_ms = 0u64;
    for worker in workers.iter_mut() {
        while let Some(line) = worker
            .next_line(Duration::from_millis(OUTCOME_WAIT_MS))
            .await?
        {
            if !line.starts_with("OUTCOME ") {
                continue;
            }
            let field = |key: &str| {
                line.split_whitespace()
                    .find_map(|word| word.strip_prefix(key))
                    .unwrap_or("")
                    .to_string()
            };
            event_ids.insert(field("event_id="));
            longest_ms = longest_ms.max(field("elapsed_ms=").parse().unwrap_or(0));
            match field("outcome=").as_str() {
                "applied" => applied += 1,
                "insufficient" => insufficient += 1,
                outcome => other.push(format!("{outcome}/{}", field("code="))),
            }
        }
        let end = worker.wait(Duration::from_millis(EXIT_WAIT_MS)).await?;
        ctx.check_eq("a writer process's exit status", 0, end.shell_status());
    }
    Ok(Outcomes {
        applied,
        insufficient,
        other,
        event_ids,
        longest_ms,
    })
}

/// Notes the outcomes and checks the split (14 Applied, 18 Insufficient, nothing else)
/// against the store's units and rows.
///
/// Errors: the store cannot be read.
fn check_outcomes(ctx: &mut Ctx, store: &Store, outcomes: &Outcomes) -> anyhow::Result<()> {
    let Outcomes {
        applied,
        insufficient,
        ref other,
        ref event_ids,
        longest_ms,
    } = *outcomes;
    ctx.note(format!(
        "applied={applied} insufficient={insufficient} other={} distinct_event_ids={}",
        other.len(),
        event_ids.len()
    ));
    // How long the slowest writer took for its change, lock wait included: timing, so for
    // the run record, not the transcript.
    ctx.record("writer_longest_ms", serde_json::Value::from(longest_ms));
    ctx.check_eq(
        "outcomes reported",
        32,
        applied + insufficient + other.len(),
    );
    ctx.check_eq("Applied = floor(100/7)", 14, applied);
    ctx.check_eq("Insufficient", 18, insufficient);
    ctx.check(
        "no writer ran out of busy timeout or failed otherwise",
        other.is_empty(),
        if other.is_empty() {
            "none".to_string()
        } else {
            other.join(",")
        },
    );
    ctx.check_eq("units", 2, units_of(store, ITEM)?);
    ctx.check_eq("rows", 14, store.change_count()?);
    Ok(())
}

/// When connection B commits relative to A's deferred read-then-write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlSchedule {
    /// A reads, B commits, A writes: the forced interleaving of the control.
    BCommitsBetweenReadAndWrite,
    /// B commits before A begins: nothing can go stale, so A's write succeeds and the
    /// control must report that it exposed nothing (a test does this).
    BCommitsFirst,
}

/// The negative control on the file at `path` (its [`ITEM`] present): A's deferred
/// read-then-write against B's committed change, scheduled by `schedule`. Checks that
/// A's write fails with a busy code, at once (SQLite never called A's busy handler), and
/// that only B's change is stored.
///
/// Errors: the file cannot be opened or read.
pub fn forced_control(ctx: &mut Ctx, path: &Path, schedule: ControlSchedule) -> anyhow::Result<()> {
    let mut connection_a = Store::open(path)?;
    let connection_b = Store::open(path)?;
    // A's busy handler counts its calls instead of waiting (the busy timeout comes back
    // after the write).
    let busy_calls = connection_a.count_busy_handler_calls()?;
    let units_before = units_of(&connection_b, ITEM)?;
    let b_step = |ctx: &mut Ctx| {
        let b = connection_b.apply_change("receive-6", ITEM, CONTROL_RESTOCK);
        ctx.note(format!(
            "B: receive-6 +{CONTROL_RESTOCK} -> {}",
            outcome_kind(&b)
        ));
        ctx.check_eq(
            "B's change commits (A's read does not block it)",
            "applied".to_string(),
            outcome_kind(&b),
        );
    };
    if schedule == ControlSchedule::BCommitsFirst {
        b_step(ctx);
    }
    let a = DeferredReadThenWrite::begin(&connection_a, ITEM)?;
    ctx.note(format!(
        "A: BEGIN (deferred); SELECT units -> {}",
        a.units_read()
    ));
    if schedule == ControlSchedule::BCommitsBetweenReadAndWrite {
        b_step(ctx);
    }
    busy_calls.store(0, Ordering::SeqCst);
    let started = Instant::now();
    let written = a.write(CONTROL_DELTA);
    let elapsed_ms = started.elapsed().as_millis();
    let calls = busy_calls.load(Ordering::SeqCst);
    connection_a.restore_busy_timeout()?;
    let code = match &written {
        Ok(_) => "none (the write succeeded)".to_string(),
        Err(error) => code_name(error),
    };
    ctx.note(format!("A: UPDATE -> {code} elapsed_ms={elapsed_ms}"));
    ctx.exposes(
        "a deferred read-then-write cannot write after another connection committed",
        written.as_ref().is_err_and(is_busy),
        format!("code={code}"),
    );
    ctx.check(
        "A's write failed at once: SQLite never called A's busy handler (waiting could not help)",
        written.is_err() && calls == 0,
        format!("busy_handler_calls={calls}"),
    );
    let out_of_transaction = connection_a.connection().is_autocommit();
    ctx.check(
        "A's connection is out of its transaction",
        out_of_transaction,
        if out_of_transaction { "yes" } else { "no" },
    );
    ctx.check_eq(
        "units: B's change only",
        units_before + CONTROL_RESTOCK,
        units_of(&connection_b, ITEM)?,
    );
    Ok(())
}
