//! L3 — real concurrency: 32 threads on 32 connections each debit 7 from a balance of 100,
//! released together by a barrier.
//! Claim: the conditional UPDATE (`... WHERE balance >= amount`, re-evaluated on the newest
//! row version under READ COMMITTED — EvalPlanQual) never overdraws: exactly
//! floor(100/7) = 14 debits succeed, 18 are INSUFFICIENT, the balance ends at 2.
//! Fails if: any other split, any database error, or entries that disagree with the balance.

use std::time::Instant;

use futures_util::FutureExt;
use ledger_svc::{Outcome, debit_in, grant_in};

use super::queries;
use case_kit::{Case, Ctx};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "L3",
        "real concurrency: 32 threads debit 7 from 100",
        |ctx| run(ctx).boxed(),
    )
    .connections(34)
}

const ACCOUNT: &str = "acct-0003";
const THREADS: usize = 32;
const START_BALANCE: i64 = 100;
const DEBIT: i64 = 7;

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let mode = super::modes::mode(ctx);
    let mut db = ctx.connect().await?;
    grant_in(mode, &mut db, "ops", "g-0301", ACCOUNT, START_BALANCE).await?;

    let timed = ctx
        .race(THREADS, move |mut racer| async move {
            let key = format!("k-03-{:02}", racer.index);
            let began = Instant::now();
            let outcome = debit_in(mode, &mut racer.client, "app-l3", &key, ACCOUNT, DEBIT)
                .await
                .map(|result| result.outcome)
                .map_err(|error| error.to_string());
            (outcome, began, Instant::now())
        })
        .await?;
    let in_flight = max_in_flight(timed.iter().map(|(_, began, ended)| (*began, *ended)));
    let outcomes: Vec<Result<Outcome, String>> =
        timed.into_iter().map(|(outcome, _, _)| outcome).collect();

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

    // Evidence that they raced: half or more of the transfers were in flight at one
    // moment (a serialized run would show 1). The count varies, so only the verdict
    // goes into the transcript.
    ctx.check(
        "the debits overlapped: at least 16 of 32 in flight at one moment",
        in_flight >= THREADS / 2,
        format!("overlapped={}", in_flight >= THREADS / 2),
    );
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

/// The largest number of `(began, ended)` intervals that contain one moment.
fn max_in_flight(intervals: impl Iterator<Item = (Instant, Instant)>) -> usize {
    // +1 at each start, -1 at each end; ends sort before starts at the same instant.
    let mut events: Vec<(Instant, i32)> = intervals
        .flat_map(|(began, ended)| [(began, 1), (ended, -1)])
        .collect();
    events.sort_by_key(|&(at, delta)| (at, delta));
    let (mut current, mut most) = (0i32, 0i32);
    for (_, delta) in events {
        current += delta;
        most = most.max(current);
    }
    most as usize
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::max_in_flight;

    #[test]
    fn counts_overlap() {
        let t = Instant::now();
        let ms = |n| t + Duration::from_millis(n);
        assert_eq!(
            max_in_flight([(ms(0), ms(10)), (ms(5), ms(15)), (ms(12), ms(20))].into_iter()),
            2
        );
        assert_eq!(
            max_in_flight([(ms(0), ms(5)), (ms(5), ms(10))].into_iter()),
            1
        );
        assert_eq!(max_in_flight(std::iter::empty()), 0);
    }
}
