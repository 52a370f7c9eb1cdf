//! L1 — normal path: grant 1000, debit 300.
//! Claim: the debit leaves 700, and its transaction has exactly 2 entries summing to 0
//! (−300 on the account, +300 on sys-redeem).
//! Fails if: an outcome is not OK, the balance is not 700, or the entries differ.

use futures_util::FutureExt;
use points_ledger::{Outcome, SYS_REDEEM, debit_in, grant_in};

use super::queries;
use case_kit::{Case, Ctx};

/// The case's registration.
pub fn case() -> Case {
    Case::new("L1", "normal path: grant 1000, debit 300", |ctx| {
        run(ctx).boxed()
    })
}

const ACCOUNT: &str = "acct-0001";

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let mode = super::modes::mode(ctx);
    let mut db = ctx.connect().await?;

    let granted = grant_in(mode, &mut db, "ops", "g-0101", ACCOUNT, 1000).await?;
    ctx.check_eq(
        "grant outcome",
        Outcome::Ok.as_str(),
        granted.outcome.as_str(),
    );
    ctx.check_eq("balance after grant", 1000, granted.balance);

    let debited = debit_in(mode, &mut db, "app-a", "k-0101", ACCOUNT, 300).await?;
    ctx.note(format!(
        "debit outcome={} balance={}",
        debited.outcome.as_str(),
        debited.balance
    ));
    ctx.check_eq(
        "debit outcome",
        Outcome::Ok.as_str(),
        debited.outcome.as_str(),
    );
    ctx.check_eq("balance reported by the debit", 700, debited.balance);
    ctx.check_eq(
        "stored balance",
        700,
        queries::existing_balance(&db, ACCOUNT).await?,
    );

    let Some(txn_id) = debited.txn_id else {
        ctx.check("debit has a transaction id", false, "none");
        return Ok(());
    };
    let entries = queries::entries_of(&db, txn_id).await?;
    ctx.check_eq("entries of the debit", 2, entries.len());
    ctx.check_eq(
        "sum of the debit's entries",
        0,
        entries.iter().map(|(_, amount)| amount).sum::<i64>(),
    );
    let expected = vec![(ACCOUNT.to_string(), -300), (SYS_REDEEM.to_string(), 300)];
    ctx.check(
        "entries are -300 on the account, +300 on sys-redeem",
        entries == expected,
        format!("{entries:?}"),
    );
    let recorded: (String, Option<i64>) = {
        let row = db
            .query_one(
                "SELECT outcome, txn_id FROM idem_request WHERE client_id = 'app-a' AND idem_key = 'k-0101'",
                &[],
            )
            .await?;
        (row.get(0), row.get(1))
    };
    ctx.check(
        "idempotency record says OK with the same transaction",
        recorded == ("OK".to_string(), Some(txn_id)),
        format!(
            "outcome={} same_txn={}",
            recorded.0,
            recorded.1 == Some(txn_id)
        ),
    );
    Ok(())
}
