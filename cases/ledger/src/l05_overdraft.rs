//! L5 — negative control, overdraft: the CHECK `balance_non_negative` is dropped from this
//! case's own database; 32 naive debits of 7 each read a balance of 100, pass the
//! application-side check, meet at a barrier, then write `balance = balance - 7`.
//! Claim (about the naive design, see `naive.rs`): no debit is lost, but all 32 pass a
//! check made on a stale read, and the balance ends at 100 - 224 = -124 on an account
//! that must never go below 0.
//! Fails if: the balance did not go below 0 (e.g. the writes did not overlap), or the
//! figures differ.

use futures_util::FutureExt;
use points_ledger::grant_in;

use super::naive::{self, BalanceWrite, NaiveDebit, RacePlan, Tally};
use super::queries;
use case_kit::{Case, Ctx};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "L5",
        "negative control, overdraft: check in the application, then balance = balance - 7, no CHECK",
        |ctx| run_with(ctx, RacePlan::FORCED).boxed(),
    )
    // Broken on purpose: an ordinary account below 0, and no idempotency records.
    .not_clean()
    .connections(34)
}

/// The anomaly named by this control's `negative control exposes:` check.
pub const ANOMALY: &str = "overdraft (an ordinary account below 0)";

const ACCOUNT: &str = "acct-0005";
const CLIENT_ID: &str = "naive-l5";
const START_BALANCE: i64 = 100;
const DEBIT: i64 = 7;

/// L5 under `plan`: [`RacePlan::FORCED`] in a run; a plan where the race cannot happen
/// makes the control's `negative control exposes` check fail.
///
/// Errors: connection or SQL errors outside the naive debits.
pub async fn run_with(ctx: &mut Ctx, plan: RacePlan) -> anyhow::Result<()> {
    let mode = super::modes::mode(ctx);
    let mut db = ctx.connect().await?;
    // Only in this case's own database (a clone of the template).
    db.batch_execute("ALTER TABLE account DROP CONSTRAINT balance_non_negative")
        .await?;
    let checks_left: i64 = db
        .query_one(
            "SELECT count(*) FROM pg_constraint \
             WHERE conrelid = 'account'::regclass AND contype = 'c'",
            &[],
        )
        .await?
        .get(0);
    ctx.check_eq("CHECK constraints left on account", 0, checks_left);
    grant_in(mode, &mut db, "ops", "g-0501", ACCOUNT, START_BALANCE).await?;

    let reports = naive::run_race(ctx, plan, |index| NaiveDebit {
        client_id: CLIENT_ID.into(),
        idem_key: format!("k-05-{index:02}"),
        account: ACCOUNT.into(),
        amount: DEBIT,
        write: BalanceWrite::Relative,
    })
    .await?;
    let tally = Tally::of(&reports, START_BALANCE);
    let balance = queries::existing_balance(&db, ACCOUNT).await?;
    ctx.note(format!(
        "participants={} read_100={} passed_application_check={} reported_ok={} balance={balance}",
        reports.len(),
        tally.read_start_balance,
        reports.len() - tally.refused_by_application,
        tally.committed
    ));

    // The figures of a forced race (SPEC §6): 32 successes, -124.
    let participants = naive::RACE_PARTICIPANTS;
    ctx.check_eq(
        "naive debits reported as successes",
        participants,
        tally.committed,
    );
    ctx.check_eq(
        "balance = 100 - 32*7",
        START_BALANCE - participants as i64 * DEBIT,
        balance,
    );
    // The relative write loses nothing: the entries agree with the balance, so the
    // overdraft is invisible to the balance-vs-entries reconciliation.
    ctx.check_eq(
        "balance recomputed from entries",
        balance,
        queries::sum_of_entries(&db, ACCOUNT).await?,
    );

    let allow_negative: bool = db
        .query_one(
            "SELECT allow_negative FROM account WHERE account_id = $1",
            &[&ACCOUNT],
        )
        .await?
        .get(0);
    ctx.exposes(
        ANOMALY,
        !allow_negative && balance < 0,
        format!("{ACCOUNT} balance={balance} allow_negative={allow_negative}"),
    );
    Ok(())
}
