//! L4 — negative control, lost update: 32 naive debits of 7 each read a balance of 100,
//! meet at a barrier, then each writes back the absolute value it computed, `balance = 93`.
//! Claim (about the naive design, see `naive.rs`): all 32 report success, the balance ends
//! at 93 while the entries record 224 debited; reconciliation finds the lost update
//! (stored 93 vs recomputed -124) and the 32 transactions that have no idempotency
//! registration.
//! Fails if: no update was lost (e.g. the writes did not overlap), or the figures or the
//! reconciliation findings differ.

use futures_util::FutureExt;
use points_ledger::{grant_in, reconcile};

use super::naive::{self, BalanceWrite, NaiveDebit, RacePlan, Tally};
use super::queries;
use case_kit::{Case, Ctx};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "L4",
        "negative control, lost update: 32 threads read 100, each writes balance = 93",
        |ctx| run_with(ctx, RacePlan::FORCED).boxed(),
    )
    // Broken on purpose: the balance disagrees with the entries.
    .not_clean()
    .connections(34)
}

/// The anomaly named by this control's `negative control exposes:` check.
pub const ANOMALY: &str = "lost update (debits reported as done, not in the balance)";

const ACCOUNT: &str = "acct-0004";
const CLIENT_ID: &str = "naive-l4";
const START_BALANCE: i64 = 100;
const DEBIT: i64 = 7;

/// L4 under `plan`: [`RacePlan::FORCED`] in a run; a plan where the race cannot happen
/// makes the control's `negative control exposes` check fail.
///
/// Errors: connection or SQL errors outside the naive debits.
pub async fn run_with(ctx: &mut Ctx, plan: RacePlan) -> anyhow::Result<()> {
    let mode = super::modes::mode(ctx);
    let mut db = ctx.connect().await?;
    grant_in(mode, &mut db, "ops", "g-0401", ACCOUNT, START_BALANCE).await?;

    let reports = naive::run_race(ctx, plan, |index| NaiveDebit {
        client_id: CLIENT_ID.into(),
        idem_key: format!("k-04-{index:02}"),
        account: ACCOUNT.into(),
        amount: DEBIT,
        write: BalanceWrite::AbsoluteFromRead,
    })
    .await?;
    let tally = Tally::of(&reports, START_BALANCE);
    let balance = queries::existing_balance(&db, ACCOUNT).await?;
    let debited_by_entries = -debits_in_entries(&db).await?;
    ctx.note(format!(
        "participants={} read_100={} reported_ok={} balance={balance} debited_by_entries={debited_by_entries}",
        reports.len(),
        tally.read_start_balance,
        tally.committed
    ));
    // The figures of a forced race (SPEC §6): 32, 93, 224, -124.
    let participants = naive::RACE_PARTICIPANTS;
    let expected_balance = START_BALANCE - DEBIT;
    let expected_debited = participants as i64 * DEBIT;
    let expected_recomputed = START_BALANCE - expected_debited;
    ctx.check_eq(
        "naive debits reported as successes",
        participants,
        tally.committed,
    );
    ctx.check_eq(
        "balance written back from the stale read = 100 - 7",
        expected_balance,
        balance,
    );
    ctx.check_eq(
        "points debited according to the entries = 32*7",
        expected_debited,
        debited_by_entries,
    );

    check_reconciliation(ctx, &mut db, expected_balance, expected_recomputed).await?;

    // The verdict: debits reported as done whose points never left the balance.
    let fell_by = START_BALANCE - balance;
    let lost_points = debited_by_entries - fell_by;
    let misbehaved = tally.committed as i64 * DEBIT == debited_by_entries && lost_points > 0;
    ctx.exposes(
        ANOMALY,
        misbehaved,
        format!(
            "reported_ok={} balance_fell_by={fell_by} lost_points={lost_points}",
            tally.committed
        ),
    );
    Ok(())
}

/// The ledger's own reconciliation on this database: checks it finds the account's stored
/// `expected_balance` against `expected_recomputed` from the entries, and the 32 naive
/// transactions without an idempotency registration.
async fn check_reconciliation(
    ctx: &mut Ctx,
    db: &mut tokio_postgres::Client,
    expected_balance: i64,
    expected_recomputed: i64,
) -> anyhow::Result<()> {
    let participants = naive::RACE_PARTICIPANTS;
    let findings = reconcile(db).await?;
    ctx.note(format!("reconcile: {}", findings.summary()));
    let mismatch = findings
        .balance_mismatches
        .iter()
        .find(|m| m.account_id == ACCOUNT);
    if let Some(mismatch) = mismatch {
        ctx.note(format!(
            "{ACCOUNT} stored={} recomputed={}",
            mismatch.stored, mismatch.recomputed
        ));
    }
    ctx.check(
        format!(
            "reconciliation finds {ACCOUNT} stored {expected_balance} vs recomputed {expected_recomputed}"
        ),
        mismatch.is_some_and(|m| m.stored == expected_balance && m.recomputed == expected_recomputed),
        mismatch
            .map(|m| format!("stored={} recomputed={}", m.stored, m.recomputed))
            .unwrap_or_else(|| "no mismatch on acct-0004".into()),
    );
    let unregistered = findings
        .txns_without_request
        .iter()
        .filter(|t| t.client_id == CLIENT_ID)
        .count();
    ctx.check_eq(
        "transactions without an idempotency registration",
        participants,
        findings.txns_without_request.len(),
    );
    ctx.check_eq(
        "of them written by the naive debit",
        findings.txns_without_request.len(),
        unregistered,
    );
    Ok(())
}

/// Sum of the naive debits' entries on the account (points, negative).
async fn debits_in_entries(db: &tokio_postgres::Client) -> anyhow::Result<i64> {
    let row = db
        .query_one(
            "SELECT COALESCE(SUM(e.amount), 0)::bigint FROM ledger_entry e \
             JOIN ledger_txn t USING (txn_id) \
             WHERE e.account_id = $1 AND t.kind = 'DEBIT'",
            &[&ACCOUNT],
        )
        .await?;
    Ok(row.get(0))
}
