//! L3 — real concurrency: 32 threads on 32 connections each debit 7 from a balance of 100,
//! released together by a barrier.
//! Claim: the conditional UPDATE (`... WHERE balance >= amount`, re-evaluated on the newest
//! row version under READ COMMITTED — EvalPlanQual) never overdraws: exactly
//! floor(100/7) = 14 debits succeed, 18 are INSUFFICIENT, the balance ends at 2.
//! Fails if: any other split, any database error, or entries that disagree with the balance.

use futures_util::FutureExt;
use ledger_svc::{Outcome, debit, grant};

use crate::framework::{Case, Ctx, Schedule};
use crate::queries;

/// The case's registration.
pub fn case() -> Case {
    Case {
        id: "L3",
        title: "real concurrency: 32 threads debit 7 from 100",
        schedule: Schedule::Concurrent,
        clean: true,
        run: |ctx| run(ctx).boxed(),
    }
}

const ACCOUNT: &str = "acct-0003";
const THREADS: usize = 32;
const START_BALANCE: i64 = 100;
const DEBIT: i64 = 7;

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let mut db = ctx.connect().await?;
    grant(&mut db, "ops", "g-0301", ACCOUNT, START_BALANCE).await?;

    let outcomes = ctx
        .race(THREADS, |mut racer| async move {
            let key = format!("k-03-{:02}", racer.index);
            debit(&mut racer.client, "app-l3", &key, ACCOUNT, DEBIT)
                .await
                .map(|result| result.outcome)
                .map_err(|error| error.to_string())
        })
        .await?;

    let ok = outcomes
        .iter()
        .filter(|o| matches!(o, Ok(Outcome::Ok)))
        .count();
    let insufficient = outcomes
        .iter()
        .filter(|o| matches!(o, Ok(Outcome::Insufficient)))
        .count();
    let errors: Vec<&String> = outcomes.iter().filter_map(|o| o.as_ref().err()).collect();
    let balance = queries::existing_balance(&db, ACCOUNT).await?;
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
        queries::count_txns(&db, ACCOUNT, "DEBIT").await?,
    );
    ctx.check_eq(
        "balance recomputed from entries",
        balance,
        queries::sum_of_entries(&db, ACCOUNT).await?,
    );
    Ok(())
}
