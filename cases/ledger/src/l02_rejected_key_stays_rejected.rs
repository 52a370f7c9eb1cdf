//! L2 — a rejected key stays rejected, over HTTP.
//! Claim: an idempotency key records the *outcome* of its first request, refusals
//! included. A debit of 1 from a balance of 0 is 409 INSUFFICIENT; after a grant makes it
//! affordable, a retry with the same key still gets the recorded 409 (replayed, same
//! body), and only a new key executes.
//! Fails if: the first debit is not 409 INSUFFICIENT, the retry executes or is not marked
//! replayed, or the new key does not succeed with balance 9.

use futures_util::FutureExt;
use tokio_postgres::Client;

use super::queries;
use case_kit::{Case, Ctx};
use launch::service::{Reply, Service, ServiceOptions};

use super::http::{LedgerCalls, LedgerReply};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "L2",
        "a rejected key stays rejected: 409 INSUFFICIENT is replayed after a grant",
        |ctx| run(ctx).boxed(),
    )
    .connections(18)
}

const ACCOUNT: &str = "acct-0002";
const CLIENT: &str = "app-a";
const REJECTED_KEY: &str = "k-0201";
const NEW_KEY: &str = "k-0202";
const DEBIT: i64 = 1;
const GRANT: i64 = 10;

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let service = Service::start(ctx, ServiceOptions::default().with_clients(&[CLIENT])).await?;
    let db = ctx.connect().await?;
    ctx.check_eq(
        "starting balance",
        0,
        queries::existing_balance(&db, ACCOUNT).await?,
    );

    // Step 1: debit 1 from 0 → refused, and the refusal is recorded under the key.
    let first = service
        .debit_once(CLIENT, REJECTED_KEY, ACCOUNT, DEBIT)
        .await?;
    ctx.note(format!("debit 1 with {REJECTED_KEY}: {}", first.summary()));
    ctx.check_eq(
        "first debit: status and outcome",
        "409 INSUFFICIENT".to_string(),
        first.status_outcome(),
    );
    ctx.check_eq("first debit is not a replay", false, first.replayed);

    // Step 2: make the debit affordable.
    let granted = service.grant("ops", "g-0201", ACCOUNT, GRANT).await?;
    ctx.note(format!(
        "grant 10 on the admin listener: {}",
        granted.summary()
    ));
    ctx.check_eq(
        "balance after the grant",
        GRANT,
        queries::existing_balance(&db, ACCOUNT).await?,
    );

    retry_rejected_key(ctx, &service, &db, &first).await?;
    debit_new_key(ctx, &service, &db).await?;

    service.stop_checked(ctx).await?;
    Ok(())
}

/// Step 3: the same key again → the recorded refusal, replayed, nothing executed. Checks
/// the retry's answer against `first` and the unchanged balance.
async fn retry_rejected_key(
    ctx: &mut Ctx,
    service: &Service,
    db: &Client,
    first: &Reply,
) -> anyhow::Result<()> {
    let retry = service
        .debit_once(CLIENT, REJECTED_KEY, ACCOUNT, DEBIT)
        .await?;
    ctx.note(format!("retry with {REJECTED_KEY}: {}", retry.summary()));
    ctx.check_eq(
        "retry: status and outcome",
        "409 INSUFFICIENT".to_string(),
        retry.status_outcome(),
    );
    ctx.check_eq(
        "retry carries Idempotent-Replayed: true",
        true,
        retry.replayed,
    );
    ctx.check(
        "retry body equals the first response's body",
        retry.body == first.body,
        format!("recorded balance={}", retry.balance_text()),
    );
    ctx.check_eq(
        "balance unchanged by the retry",
        GRANT,
        queries::existing_balance(db, ACCOUNT).await?,
    );
    Ok(())
}

/// Step 4: a new key is a new request → executes. Checks its answer, the one debit, and
/// that the rejected key is still recorded as INSUFFICIENT without a transaction.
async fn debit_new_key(ctx: &mut Ctx, service: &Service, db: &Client) -> anyhow::Result<()> {
    let fresh = service.debit_once(CLIENT, NEW_KEY, ACCOUNT, DEBIT).await?;
    ctx.note(format!("debit 1 with {NEW_KEY}: {}", fresh.summary()));
    ctx.check_eq(
        "new key: status and outcome",
        "201 OK".to_string(),
        fresh.status_outcome(),
    );
    ctx.check_eq("new key is not a replay", false, fresh.replayed);
    ctx.check_eq(
        "balance reported by the new key",
        (GRANT - DEBIT).to_string(),
        fresh.balance_text(),
    );
    ctx.check_eq(
        "debit transactions on the account",
        1,
        queries::count_txns(db, ACCOUNT, "DEBIT").await?,
    );
    let recorded: (String, Option<i64>) = {
        let row = db
            .query_one(
                "SELECT outcome, txn_id FROM idem_request WHERE client_id = $1 AND idem_key = $2",
                &[&CLIENT, &REJECTED_KEY],
            )
            .await?;
        (row.get(0), row.get(1))
    };
    ctx.check(
        "the rejected key is recorded as INSUFFICIENT without a transaction",
        recorded == ("INSUFFICIENT".to_string(), None),
        format!("outcome={} txn={}", recorded.0, recorded.1.is_some()),
    );
    Ok(())
}
