//! S5 — killed mid-change (beyond the seed article, which ran in memory): a crash-worker
//! child process opens the file, applies `ship-2 −30` to 100 units and is SIGKILLed at
//! each hook point of the change in turn (a fresh file each time).
//! Claim: after a real SIGKILL, the file reopened by another process (this one) passes
//! `PRAGMA integrity_check`; a change killed before COMMIT left no row and 100 units, and
//! the same id then applies once (70); a change killed after COMMIT is there (70, one row)
//! and the retry is Replayed.
//! Fails if: the worker does not stop where told or does not end by signal 9, another
//! connection sees the uncommitted change, the file is not sound, or the rows, units or
//! retry outcome differ from the above.
//!
//! ```text
//! worker   (child)  BEGIN IMMEDIATE; event row; stock; … PAUSED_IN_TX point=<p>
//! observer          reads units and rows while the worker waits (WAL: not blocked)
//! parent            SIGKILL the worker
//! checker           reopen: integrity_check, rows, units; retry ship-2 -30
//! ```

use std::path::Path;

use futures_util::FutureExt;
use inventory_store::{ChangePoint, Store};

use case_kit::{Case, Ctx};
use launch::worker::CrashWorker;

use super::{
    ITEM, START_UNITS, open_with_item, outcome_kind, remove_database_files, rows_for, units_of,
};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "S5",
        "worker SIGKILLed at each hook point of a change; the file reopens sound",
        |ctx| run(ctx).boxed(),
    )
}

const EVENT: &str = "ship-2";
const DELTA: i64 = -30;

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let path = ctx.sqlite_path();
    ctx.record(
        "sqlite_version",
        serde_json::Value::from(inventory_store::sqlite_version()),
    );
    let change = serde_json::json!({"event_id": EVENT, "item": ITEM, "delta": DELTA}).to_string();
    for point in ChangePoint::ALL {
        kill_at(ctx, &path, &change, point).await?;
    }
    Ok(())
}

/// One hook point: a fresh file, the worker stopped at `point` with `change`, what
/// another connection sees meanwhile, the SIGKILL, and the file reopened after it.
///
/// Errors: the file cannot be opened or read, the worker cannot be launched or killed.
async fn kill_at(
    ctx: &mut Ctx,
    path: &Path,
    change: &str,
    point: ChangePoint,
) -> anyhow::Result<()> {
    let mut worker = pause_worker_at(ctx, path, change, point).await?;

    // observer: what another connection sees while the worker waits.
    let committed = point.is_committed();
    let (expected_units, expected_rows) = if committed {
        (START_UNITS + DELTA, 1)
    } else {
        (START_UNITS, 0)
    };
    {
        let observer = Store::open_existing(path)?;
        ctx.check_eq(
            format!("{point}: units seen by another connection during the pause"),
            expected_units,
            units_of(&observer, ITEM)?,
        );
        ctx.check_eq(
            format!("{point}: rows seen by another connection during the pause"),
            expected_rows,
            rows_for(&observer, EVENT)?,
        );
    }

    // parent: a real SIGKILL.
    let end = worker.kill().await?;
    ctx.check_eq(
        format!("{point}: signal that ended the worker"),
        "9".to_string(),
        end.signal()
            .map_or_else(|| format!("none ({end})"), |s| s.to_string()),
    );
    ctx.check_eq(format!("{point}: shell status"), 137, end.shell_status());

    check_reopened(ctx, path, point, expected_units, expected_rows)
}

/// A fresh file with 100 units, closed before the worker opens it; then the worker
/// applying `change`, stopped at `point` (checked). Returns the paused worker.
///
/// Errors: the file cannot be made, the worker cannot be launched or does not pause.
async fn pause_worker_at(
    ctx: &mut Ctx,
    path: &Path,
    change: &str,
    point: ChangePoint,
) -> anyhow::Result<CrashWorker> {
    // A fresh file with 100 units, closed before the worker opens it.
    remove_database_files(path)?;
    drop(open_with_item(path, ITEM, START_UNITS)?);

    // worker: the change, stopped at `point`.
    let mut worker = CrashWorker::launch([
        "sqlite".to_string(),
        "apply".into(),
        "--file".into(),
        path.display().to_string(),
        "--change".into(),
        change.to_string(),
        "--stop-at".into(),
        point.as_str().into(),
    ])?;
    let paused = worker.wait_paused().await?;
    let stopped_at = paused.fields.get("point").cloned().unwrap_or_default();
    ctx.note(format!(
        "{point}: worker paused, worker_pid={}",
        paused.fields.get("worker_pid").map_or("?", String::as_str)
    ));
    ctx.check_eq(
        format!("{point}: the worker stopped there"),
        point.as_str().to_string(),
        stopped_at,
    );
    Ok(worker)
}

/// checker: reopens the file after the kill and checks it is sound with
/// `expected_rows` and `expected_units`; then retries the same id (replayed if the
/// change had committed at `point`, else applied once).
///
/// Errors: the file cannot be opened or read.
fn check_reopened(
    ctx: &mut Ctx,
    path: &Path,
    point: ChangePoint,
    expected_units: i64,
    expected_rows: i64,
) -> anyhow::Result<()> {
    let checker = Store::open_existing(path)?;
    ctx.check_eq(
        format!("{point}: integrity_check after reopening"),
        "ok".to_string(),
        checker.integrity_check()?,
    );
    ctx.check_eq(
        format!("{point}: rows for ship-2 after the kill"),
        expected_rows,
        rows_for(&checker, EVENT)?,
    );
    ctx.check_eq(
        format!("{point}: units after the kill"),
        expected_units,
        units_of(&checker, ITEM)?,
    );
    let retry = checker.apply_change(EVENT, ITEM, DELTA);
    let expected_retry = if point.is_committed() {
        "replayed"
    } else {
        "applied"
    };
    ctx.note(format!(
        "{point}: retry ship-2 -30 -> {}",
        outcome_kind(&retry)
    ));
    ctx.check_eq(
        format!("{point}: retry of the same id"),
        expected_retry.to_string(),
        outcome_kind(&retry),
    );
    ctx.check_eq(
        format!("{point}: units after the retry"),
        START_UNITS + DELTA,
        units_of(&checker, ITEM)?,
    );
    ctx.check_eq(
        format!("{point}: rows for ship-2 after the retry"),
        1,
        rows_for(&checker, EVENT)?,
    );
    Ok(())
}
