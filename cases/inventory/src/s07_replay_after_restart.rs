//! S7 — replay after restart (beyond the seed article's `:memory:` database): apply five
//! events, close the file, and send the same five from a new process.
//! Claim: what the store committed is on disk: the new process (a crash-worker in SQLite
//! mode, its own connection) gets Replayed for all five and the units do not move.
//! Fails if: any of the five applies again, is refused, or the units change.
//!
//! ```text
//! store   receive-7a +1 … receive-7e +5   -> applied x 5, 115; close
//! worker  (new process) the same five     -> replayed x 5, 115
//! ```

use std::time::Duration;

use futures_util::FutureExt;
use inventory_store::{Change, Store};

use case_kit::{Case, Ctx};
use launch::worker::CrashWorker;

use super::{ITEM, START_UNITS, outcome_kind, seeded_store, units_of};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "S7",
        "replay after restart: 5 events replayed by a new process",
        |ctx| run(ctx).boxed(),
    )
}

/// How long the worker may take for each line and to exit.
const WORKER_WAIT_MS: u64 = 30_000;

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let changes: Vec<Change> = ["a", "b", "c", "d", "e"]
        .iter()
        .zip(1..)
        .map(|(suffix, delta)| Change {
            event_id: format!("receive-7{suffix}"),
            item: ITEM,
            delta,
        })
        .collect();
    let total: i64 = changes.iter().map(|change| change.delta).sum();
    apply_before_restart(ctx, &changes, total)?;
    let outcomes = replay_in_new_process(ctx, &changes).await?;
    ctx.check_eq("answers from the new process", 5, outcomes.len());
    ctx.check_eq(
        "replayed by the new process",
        5,
        outcomes
            .iter()
            .filter(|outcome| *outcome == "replayed")
            .count(),
    );
    let reopened = Store::open_existing(&ctx.sqlite_path())?;
    ctx.check_eq(
        "units after the restart",
        START_UNITS + total,
        units_of(&reopened, ITEM)?,
    );
    ctx.check_eq("rows", 5, reopened.change_count()?);
    Ok(())
}

/// store: applies `changes` on the case's own file and checks all five applied and the
/// units moved by `total`; the store is closed when it returns.
///
/// Errors: the file cannot be opened or read.
fn apply_before_restart(ctx: &mut Ctx, changes: &[Change], total: i64) -> anyhow::Result<()> {
    let store = seeded_store(ctx)?;
    let mut applied = 0;
    for change in changes {
        let result = store.apply_change(&change.event_id, change.item, change.delta);
        applied += usize::from(outcome_kind(&result) == "applied");
    }
    ctx.check_eq("applied before the restart", 5, applied);
    ctx.check_eq(
        "units before the restart",
        START_UNITS + total,
        units_of(&store, ITEM)?,
    );
    // The store is closed here: its connection ends with this function.
    Ok(())
}

/// worker: a new process, its own connection, the same `changes`. Checks it exits 0 and
/// notes its answers; returns each answer's outcome, in order.
///
/// Errors: the worker cannot be launched, its output read, or it does not exit within
/// [`WORKER_WAIT_MS`].
async fn replay_in_new_process(ctx: &mut Ctx, changes: &[Change]) -> anyhow::Result<Vec<String>> {
    let mut arguments = vec![
        "sqlite".to_string(),
        "apply".into(),
        "--file".into(),
        ctx.sqlite_path().display().to_string(),
    ];
    for change in changes {
        arguments.push("--change".into());
        arguments.push(change.to_json().to_string());
    }
    let mut worker = CrashWorker::launch(arguments)?;
    let mut outcomes = Vec::new();
    while let Some(line) = worker
        .next_line(Duration::from_millis(WORKER_WAIT_MS))
        .await?
    {
        if let Some(outcome) = line
            .split_whitespace()
            .find_map(|word| word.strip_prefix("outcome="))
        {
            outcomes.push(outcome.to_string());
        }
    }
    let end = worker.wait(Duration::from_millis(WORKER_WAIT_MS)).await?;
    ctx.check_eq("the new process's exit status", 0, end.shell_status());
    ctx.note(format!("new process: {}", outcomes.join(" ")));
    Ok(outcomes)
}
