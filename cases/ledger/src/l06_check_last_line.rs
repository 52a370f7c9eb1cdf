//! L6 — the CHECK as last line: L5's naive code on a table that keeps the CHECK
//! `balance_non_negative`, and a duplicate that no constraint catches.
//! Claim (about the naive design, see `naive.rs`): all 32 naive debits of 7 pass the
//! application-side check on a stale read of 100; the CHECK stops the overdraft, but as an
//! exception, not a business outcome: 14 commit, 18 fail with SQLSTATE 23514
//! (check_violation), the balance stays at 2. Separately, one business request sent twice
//! under two idempotency keys through the real ledger debits twice (100 -> 40): both
//! debits pass the CHECK. Overdraft and duplication are separate problems.
//! Fails if: no write hit the CHECK (e.g. the writes did not overlap), the duplicate was
//! not executed twice, or the figures differ.

use futures_util::FutureExt;
use points_ledger::{Outcome, debit_in, grant_in};

use super::naive::{self, BalanceWrite, NaiveDebit, RacePlan, Tally};
use super::queries;
use case_kit::{Case, Ctx};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "L6",
        "the CHECK as last line: L5's code with the CHECK; a duplicate under two keys passes it",
        |ctx| run_with(ctx, RacePlan::FORCED).boxed(),
    )
    // Broken on purpose: naive transactions without idempotency records.
    .not_clean()
    .connections(34)
}

/// The anomaly of the race: writes the application-side check let through on a stale
/// read, stopped only by the CHECK as SQLSTATE 23514.
pub const RACE_ANOMALY: &str =
    "overdraft attempts that only the CHECK stopped (SQLSTATE 23514, an exception)";
/// The anomaly of the duplicate: one business request executed twice under two keys.
pub const DUPLICATE_ANOMALY: &str = "double debit under two keys, which the CHECK lets pass";

const RACE_ACCOUNT: &str = "acct-0006";
const RACE_CLIENT_ID: &str = "naive-l6";
const START_BALANCE: i64 = 100;
const DEBIT: i64 = 7;

const DUPLICATE_ACCOUNT: &str = "acct-0007";
const DUPLICATE_CLIENT_ID: &str = "app-l6";
/// The two keys of the one business request: the client lost the first response and
/// retried under a freshly made key.
const DUPLICATE_KEYS: [&str; 2] = ["k-0601", "k-0602"];
const DUPLICATE_AMOUNT: i64 = 30;

/// L6 under `plan` (the race part; the duplicate part does not race):
/// [`RacePlan::FORCED`] in a run; a plan where the race cannot happen makes the
/// [`RACE_ANOMALY`] check fail.
///
/// Errors: connection or SQL errors outside the naive debits.
pub async fn run_with(ctx: &mut Ctx, plan: RacePlan) -> anyhow::Result<()> {
    let mode = super::modes::mode(ctx);
    let mut db = ctx.connect().await?;
    grant_in(mode, &mut db, "ops", "g-0601", RACE_ACCOUNT, START_BALANCE).await?;

    let reports = naive::run_race(ctx, plan, |index| NaiveDebit {
        client_id: RACE_CLIENT_ID.into(),
        idem_key: format!("k-06-{index:02}"),
        account: RACE_ACCOUNT.into(),
        amount: DEBIT,
        write: BalanceWrite::Relative,
    })
    .await?;
    let tally = Tally::of(&reports, START_BALANCE);
    let balance = queries::existing_balance(&db, RACE_ACCOUNT).await?;
    ctx.note(format!(
        "participants={} read_100={} passed_application_check={} ok={} sqlstate_23514={} other_errors={} balance={balance}",
        reports.len(),
        tally.read_start_balance,
        reports.len() - tally.refused_by_application,
        tally.committed,
        tally.check_violations,
        tally.other_errors
    ));

    // The figures of a forced race (SPEC §6): 14 OK, 18 x 23514, balance 2.
    let participants = naive::RACE_PARTICIPANTS;
    let expected_ok = (START_BALANCE / DEBIT) as usize;
    ctx.check_eq(
        "naive debits committed = floor(100/7)",
        expected_ok,
        tally.committed,
    );
    ctx.check_eq(
        "failed with SQLSTATE 23514 check_violation = 32 - 14",
        participants - expected_ok,
        tally.check_violations,
    );
    ctx.check_eq("other database errors", 0, tally.other_errors);
    ctx.check_eq(
        "balance = 100 - 14*7",
        START_BALANCE - expected_ok as i64 * DEBIT,
        balance,
    );
    // The failed writes were attempts the application had approved: an exception where
    // a business outcome (INSUFFICIENT) should have been.
    ctx.exposes(
        RACE_ANOMALY,
        tally.check_violations > 0,
        format!(
            "passed_application_check={} sqlstate_23514={}",
            reports.len() - tally.refused_by_application,
            tally.check_violations
        ),
    );

    run_duplicate(ctx, DUPLICATE_KEYS).await
}

/// The duplicate part of L6: grants 100 to acct-0007, then sends one business request
/// (debit 30) twice through the real ledger, under `keys[0]` and then `keys[1]`, and checks
/// that both were executed (100 -> 40) while the CHECK held. In a run the keys differ
/// (`k-0601`, `k-0602`); with one key reused, as a correct client does, the second send is
/// a replay and the [`DUPLICATE_ANOMALY`] check fails.
///
/// Errors: connection or SQL errors.
pub async fn run_duplicate(ctx: &mut Ctx, keys: [&str; 2]) -> anyhow::Result<()> {
    let mode = super::modes::mode(ctx);
    let mut db = ctx.connect().await?;
    grant_in(
        mode,
        &mut db,
        "ops",
        "g-0602",
        DUPLICATE_ACCOUNT,
        START_BALANCE,
    )
    .await?;
    let mut results = Vec::new();
    for key in keys {
        let result = debit_in(
            mode,
            &mut db,
            DUPLICATE_CLIENT_ID,
            key,
            DUPLICATE_ACCOUNT,
            DUPLICATE_AMOUNT,
        )
        .await?;
        ctx.note(format!(
            "debit {DUPLICATE_AMOUNT} with key {key}: outcome={} balance={} replayed={}",
            result.outcome, result.balance, result.replayed
        ));
        results.push(result);
    }
    let duplicate_balance = queries::existing_balance(&db, DUPLICATE_ACCOUNT).await?;
    let debit_txns = queries::count_txns(&db, DUPLICATE_ACCOUNT, "DEBIT").await?;
    let executed = results
        .iter()
        .filter(|r| r.outcome == Outcome::Ok && !r.replayed)
        .count();
    ctx.check_eq("both sends accepted and executed", keys.len(), executed);
    ctx.check_eq(
        "balance = 100 - 2*30",
        START_BALANCE - keys.len() as i64 * DUPLICATE_AMOUNT,
        duplicate_balance,
    );
    ctx.check_eq(
        "debit transactions for the one request",
        keys.len() as i64,
        debit_txns,
    );
    ctx.exposes(
        DUPLICATE_ANOMALY,
        executed == keys.len() && debit_txns > 1 && duplicate_balance >= 0,
        format!("executed={executed} debit_txns={debit_txns} balance={duplicate_balance}"),
    );
    Ok(())
}
