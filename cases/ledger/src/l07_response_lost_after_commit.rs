//! L7 — response lost after commit: a retry with the same key does not debit twice.
//! Claim: a client that times out cannot know whether its debit happened; retrying with
//! the key it created when it decided to act replays the committed result instead of
//! debiting again.
//! Setup: balance 100. The service commits the debit of 30, then (fault `after-commit`,
//! action `pause`) withholds the response; the client gives up the moment the service is
//! seen holding it (`launch::lost`: an event, not a client timer racing a server
//! timer), and only then is the pause released, into a closed connection.
//! Checks: the client got no response; by then the balance is already 70; the same-key retry
//! is 201 with `Idempotent-Replayed: true` and the first attempt's txn id and balance;
//! exactly one transaction for the key.
//! Negative control: the same lost response followed by a retry under a NEW key debits
//! twice (balance 40), and reconciliation finds nothing wrong, since both transactions
//! balance: only the key tells a retry from a second purchase.
//! Fails if: any of the checks above does not hold, or the naive retry does not debit twice.

use std::time::Duration;

use futures_util::FutureExt;
use points_ledger::{HookPoint, reconcile};
use serde_json::json;
use tokio_postgres::Client;

use super::modes::StatementsOnly;
use super::queries;
use case_kit::{Case, Ctx};
use launch::lost::give_up_once_held;
use launch::service::{Service, ServiceOptions};

use super::http::{LedgerCalls, LedgerReply};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "L7",
        "response lost after commit: same-key retry replays, a new key debits twice",
        |ctx| run(ctx).boxed(),
    )
    .connections(20)
    // Its fault point needs the statement transfer (LIMITS.md, "The one-trip transfer").
    .statements_only()
}

/// Longest wait for the service to hold the committed response, milliseconds: it only
/// stops a hang.
const HELD_WAIT_MS: u64 = 10_000;
/// Safety bound of the after-commit pause should the case never release it, ms.
const PAUSE_BOUND_MS: u64 = 30_000;
const CLIENT: &str = "app-a";
const START_BALANCE: i64 = 100;
const DEBIT: i64 = 30;
/// The positive path's account and key.
const ACCOUNT: &str = "acct-0007";
const KEY: &str = "k-0701";
/// The negative control's account, its lost key and the naive retry's new key.
const NAIVE_ACCOUNT: &str = "acct-0008";
const NAIVE_LOST_KEY: &str = "k-0702";
const NAIVE_NEW_KEY: &str = "k-0703";

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let service = start_service(ctx).await?;
    let db = ctx.connect().await?;
    service
        .grant("ops", "g-0701", ACCOUNT, START_BALANCE)
        .await?;
    service
        .grant("ops", "g-0702", NAIVE_ACCOUNT, START_BALANCE)
        .await?;
    ctx.note(
        "the service pauses after the commit; the client gives up once it sees the response held",
    );

    same_key_retry(ctx, &service, &db).await?;
    new_key_retry(ctx, &service, &db).await?;

    service.stop_checked(ctx).await?;
    Ok(())
}

/// Starts ledger-svc with fault injection, for [`CLIENT`].
async fn start_service(ctx: &Ctx) -> anyhow::Result<Service> {
    Service::start(
        ctx,
        ServiceOptions {
            fault_injection: true,
            clients: vec![CLIENT.into()],
            ..ServiceOptions::default()
        },
    )
    .await
}

/// The positive path: loses the response, retries with the same key. Checks the balance
/// was already debited when the client gave up, and that the retry replays the first
/// attempt (txn id, balance) with one transaction for the key.
async fn same_key_retry(ctx: &mut Ctx, service: &Service, db: &Client) -> anyhow::Result<()> {
    let lost = lose_response(ctx, service, ACCOUNT, KEY).await?;
    let balance_at_timeout = queries::existing_balance(db, ACCOUNT).await?;
    ctx.note(format!(
        "after the client gave up: balance={balance_at_timeout}"
    ));
    ctx.check_eq(
        "balance already debited when the client gave up",
        START_BALANCE - DEBIT,
        balance_at_timeout,
    );
    ctx.check_eq(
        "the response was still withheld at that moment",
        true,
        lost.still_held,
    );

    let retry = service.debit_once(CLIENT, KEY, ACCOUNT, DEBIT).await?;
    ctx.note(format!("same-key retry: {}", retry.summary()));
    ctx.check_eq(
        "retry: status and outcome",
        "201 OK".to_string(),
        retry.status_outcome(),
    );
    ctx.check_eq(
        "retry carries Idempotent-Replayed: true",
        true,
        retry.replayed,
    );
    let executed = executed_txn(db, KEY).await?;
    ctx.check(
        "retry reports the txn id of the transaction the first attempt executed",
        retry.txn_id().is_some() && retry.txn_id() == executed,
        if retry.txn_id() == executed {
            "same"
        } else {
            "different"
        },
    );
    ctx.check_eq(
        "retry reports the first attempt's balance (100 - 30)",
        START_BALANCE - DEBIT,
        retry.balance().unwrap_or(i64::MIN),
    );
    ctx.check_eq(
        "transactions for the key",
        1,
        queries::txns_for_key(db, CLIENT, KEY).await?,
    );
    ctx.check_eq(
        "balance after the retry",
        START_BALANCE - DEBIT,
        queries::existing_balance(db, ACCOUNT).await?,
    );
    Ok(())
}

/// Negative control: the same lost response, then a retry under a new key; the control
/// sees whether it debits twice, and reconciliation is checked to find nothing wrong.
async fn new_key_retry(ctx: &mut Ctx, service: &Service, db: &Client) -> anyhow::Result<()> {
    lose_response(ctx, service, NAIVE_ACCOUNT, NAIVE_LOST_KEY).await?;
    let naive = service
        .debit_once(CLIENT, NAIVE_NEW_KEY, NAIVE_ACCOUNT, DEBIT)
        .await?;
    ctx.note(format!("new-key retry: {}", naive.summary()));
    let naive_balance = queries::existing_balance(db, NAIVE_ACCOUNT).await?;
    let naive_debits = queries::count_txns(db, NAIVE_ACCOUNT, "DEBIT").await?;
    ctx.exposes(
        "a retry under a new key debits twice (balance 40)",
        naive_balance == START_BALANCE - 2 * DEBIT && naive_debits == 2,
        format!("balance={naive_balance} debit_txns={naive_debits}"),
    );
    let mut client = ctx.connect().await?;
    let findings = reconcile(&mut client).await?;
    ctx.check(
        "reconciliation finds nothing wrong (both transactions balance)",
        findings.is_clean(),
        findings.summary(),
    );
    Ok(())
}

/// What [`lose_response`] saw once the client had given up.
struct Lost {
    /// The after-commit hold was still running (the response not yet sent or dropped).
    still_held: bool,
}

/// Arms an `after-commit` pause for one request, debits 30 and gives up the moment the
/// service holds the committed response ([`give_up_once_held`]); checks that the client
/// had no response and that, at that moment, the service had committed (the fault fired)
/// and was withholding the response; then releases the pause.
async fn lose_response(
    ctx: &mut Ctx,
    service: &Service,
    account: &str,
    key: &str,
) -> anyhow::Result<Lost> {
    service
        .arm_fault(
            HookPoint::AfterCommit,
            json!({"action": "pause", "hold_ms": PAUSE_BOUND_MS, "count": 1}),
        )
        .await?;
    let attempt = service.debit(
        CLIENT,
        key,
        account,
        DEBIT,
        Duration::from_millis(PAUSE_BOUND_MS),
    );
    let gave_up = give_up_once_held(
        service,
        HookPoint::AfterCommit,
        attempt,
        Duration::from_millis(HELD_WAIT_MS),
    )
    .await?;
    ctx.check(
        format!("{key}: the client gave up without a response"),
        gave_up.answered.is_none(),
        match &gave_up.answered {
            None => "gave up".to_string(),
            Some(Ok(reply)) => format!("got {}", reply.summary()),
            Some(Err(_)) => "a transport error first".to_string(),
        },
    );
    let state = gave_up.state;
    ctx.check(
        format!("{key}: the service had committed before the client gave up"),
        state.fired >= 1,
        format!("after_commit_fired={}", state.fired >= 1),
    );
    service.release_fault(HookPoint::AfterCommit).await?;
    Ok(Lost {
        still_held: state.holding >= 1,
    })
}

/// The id of the transaction executed for (`CLIENT`, `key`), read from `ledger_txn` (the
/// record of fact), not from the idempotency record the replay itself is built from.
async fn executed_txn(db: &tokio_postgres::Client, key: &str) -> anyhow::Result<Option<i64>> {
    let row = db
        .query_opt(
            "SELECT txn_id FROM ledger_txn WHERE client_id = $1 AND idem_key = $2",
            &[&CLIENT, &key],
        )
        .await?;
    Ok(row.map(|row| row.get(0)))
}
