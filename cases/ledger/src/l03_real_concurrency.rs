//! L3 — real concurrency: 32 threads on 32 connections each debit 7 from a balance of 100,
//! released together by a barrier.
//! Claim: the conditional UPDATE (`... WHERE balance >= amount`, re-evaluated on the newest
//! row version under READ COMMITTED — EvalPlanQual) never overdraws: exactly
//! floor(100/7) = 14 debits succeed, 18 are INSUFFICIENT, the balance ends at 2.
//! Schedule: the race is forced, not read off a clock. A holder session takes the
//! account's row (`SELECT … FOR UPDATE` in an open transaction) before the barrier; the
//! case waits until all 32 debits are seen waiting on a lock at one moment
//! (`pg_stat_activity`, `wait_event_type = 'Lock'`), then the holder rolls back and the
//! 32 proceed, each on the row version the one before it left.
//! Fails if: not all 32 are seen queued on the row (within a bound that only stops a
//! hang), any other split, any database error, or entries that disagree with the balance.

use std::time::Duration;

use futures_util::FutureExt;
use points_ledger::{Outcome, debit_in, grant_in};

use super::queries;
use case_kit::locks::release_once_queued;
use case_kit::{Case, Ctx};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "L3",
        "real concurrency: 32 threads debit 7 from 100",
        |ctx| run(ctx).boxed(),
    )
    // The racers, the case's own connection and the holder.
    .connections(THREADS as u32 + 2)
}

const ACCOUNT: &str = "acct-0003";
const THREADS: usize = 32;
const START_BALANCE: i64 = 100;
const DEBIT: i64 = 7;
/// Longest wait for the 32 debits to queue behind the held row, milliseconds: it only
/// stops a hang (a loaded machine gets them there later, never not).
const QUEUE_WAIT_MS: u64 = 60_000;
/// The holder's lock on the contested row.
const HOLD_ROW_SQL: &str = "SELECT 1 FROM account WHERE account_id = $1 FOR UPDATE";

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let mode = super::modes::mode(ctx);
    let mut db = ctx.connect().await?;
    grant_in(mode, &mut db, "ops", "g-0301", ACCOUNT, START_BALANCE).await?;

    // The holder takes the row first; every debit then queues behind it.
    let mut holder = ctx.connect().await?;
    let hold = holder.transaction().await?;
    hold.execute(HOLD_ROW_SQL, &[&ACCOUNT]).await?;
    ctx.note(format!(
        "holder: SELECT … FOR UPDATE on {ACCOUNT}, kept until the debits queue behind it"
    ));

    let racing = ctx.race(THREADS, move |mut racer| async move {
        let key = format!("k-03-{:02}", racer.index);
        debit_in(mode, &mut racer.client, "app-l3", &key, ACCOUNT, DEBIT)
            .await
            .map(|result| result.outcome)
            .map_err(|error| error.to_string())
    });
    // Let go of the row once all are seen queued on it (or the bound stopped a hang).
    let limit = Duration::from_millis(QUEUE_WAIT_MS);
    let release = release_once_queued(&db, hold, THREADS as i64, limit);
    let (outcomes, waiting) = tokio::join!(racing, release);
    let outcomes: Vec<Result<Outcome, String>> = outcomes?;
    let waiting = waiting?;
    // Evidence that they raced: all 32 waited on the held row at one moment (a
    // serialized run could show at most 1); then the holder rolled back.
    ctx.check_eq(
        "all 32 debits waited on the held row at one moment (pg_stat_activity, wait_event_type=Lock)",
        THREADS as i64,
        waiting,
    );
    check_outcomes(ctx, &db, &outcomes).await
}

/// Counts the 32 debits' `outcomes` and checks the split (14 OK, 18 INSUFFICIENT, no
/// database error) against the balance, the debit transactions and the entries.
async fn check_outcomes(
    ctx: &mut Ctx,
    db: &tokio_postgres::Client,
    outcomes: &[Result<Outcome, String>],
) -> anyhow::Result<()> {
    let ok = outcomes
        .iter()
        .filter(|o| matches!(o, Ok(Outcome::Ok)))
        .count();
    let insufficient = outcomes
        .iter()
        .filter(|o| matches!(o, Ok(Outcome::Insufficient)))
        .count();
    let errors: Vec<&String> = outcomes.iter().filter_map(|o| o.as_ref().err()).collect();
    let balance = queries::existing_balance(db, ACCOUNT).await?;
    ctx.note(format!(
        "ok={ok} insufficient={insufficient} balance={balance}"
    ));

    let expected_ok = (START_BALANCE / DEBIT) as usize;
    ctx.check_eq("successes = floor(100/7)", expected_ok, ok);
    ctx.check_eq(
        "insufficient = 32 - 14",
        THREADS - expected_ok,
        insufficient,
    );
    let first_error = errors
        .first()
        .map(|e| format!(", first: {e}"))
        .unwrap_or_default();
    ctx.check_eq("database errors", 0, errors.len());
    if !first_error.is_empty() {
        ctx.note(format!("errors{first_error}"));
    }
    ctx.check_eq(
        "balance = 100 - 14*7",
        START_BALANCE - expected_ok as i64 * DEBIT,
        balance,
    );
    ctx.check_eq(
        "debit transactions",
        expected_ok as i64,
        queries::count_txns(db, ACCOUNT, "DEBIT").await?,
    );
    ctx.check_eq(
        "balance recomputed from entries",
        balance,
        queries::sum_of_entries(db, ACCOUNT).await?,
    );
    Ok(())
}
