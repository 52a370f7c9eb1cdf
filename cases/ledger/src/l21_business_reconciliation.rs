//! L21 — business reconciliation: orders against the ledger.
//! Claim: debits carry their redemption order id (`order_id` in the debit body, part of
//! the request and its fingerprint, stored on the debit's transaction), and a
//! reconciliation of the business system's orders against the ledger
//! (`points_ledger::reconcile_orders`) names the order paid twice that L11's reconciliation
//! cannot see. Three orders: `ord-2101` loses its response and is retried with the same
//! key (one debit), `ord-2102` loses its response and is retried under a NEW key, as L7's
//! naive client does (two debits, both balanced), `ord-2103` is paid plainly.
//! Checks: the same-key retry replays; the same key with another order id is 422 and
//! records nothing; L11's reconciliation finds nothing; the order reconciliation finds
//! exactly "order ord-2102 has 2 debits" and nothing about the other two.
//! Negative control: the new-key retry of `ord-2102` pays it twice, visible only to the
//! order reconciliation (`cases/ledger/tests/reconciliation_controls.rs` runs it with a same-key retry,
//! where the control's check must FAIL).
//! Fails if: any check above does not hold.

use std::time::Duration;

use futures_util::FutureExt;
use points_ledger::{HookPoint, Order, OrderFinding, reconcile, reconcile_orders};
use reqwest::header::CONTENT_TYPE;
use serde_json::json;
use tokio_postgres::Client;

use super::queries;
use case_kit::{Case, Ctx};
use launch::lost::give_up_once_held;
use launch::service::{CLIENT_TIMEOUT_MS, Reply, Service, ServiceOptions};

use super::http::{LedgerCalls, LedgerReply};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "L21",
        "business reconciliation: a new-key retry pays an order twice; only the orders see it",
        |ctx| run(ctx).boxed(),
    )
    // The service's pool (default size) and the case's two connections. Its data is
    // consistent by L11's rules (that is the point), so it stays clean.
    .connections(18)
}

/// How the client retries the order whose response was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryPlan {
    /// Under a new key (L7's naive client): the order is paid twice. The case's plan.
    NewKey,
    /// Under the same key: a replay, so no order is paid twice and the control's
    /// check must FAIL.
    SameKey,
}

/// The anomaly the negative control's check names.
pub const ANOMALY: &str =
    "a retry under a new key pays order ord-2102 twice; L11 sees nothing, the orders do";

/// Longest wait for the service to hold the committed response, milliseconds: it only
/// stops a hang.
const HELD_WAIT_MS: u64 = 10_000;
/// Safety bound of the after-commit pause should the case never release it, ms.
const PAUSE_BOUND_MS: u64 = 30_000;
const CLIENT: &str = "app-a";
const START_BALANCE: i64 = 100;
/// The orders: id, account, amount, the key of its first attempt.
const SAME_KEY_ORDER: (&str, &str, i64, &str) = ("ord-2101", "acct-0004", 30, "k-2101");
const NEW_KEY_ORDER: (&str, &str, i64, &str) = ("ord-2102", "acct-0005", 30, "k-2102");
const PLAIN_ORDER: (&str, &str, i64, &str) = ("ord-2103", "acct-0006", 25, "k-2104");
/// The naive retry's new key for `ord-2102`.
const NEW_KEY: &str = "k-2103";
/// An order id never placed, sent under `ord-2101`'s key.
const OTHER_ORDER: &str = "ord-2199";

/// The case under its own plan.
async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    run_with(ctx, RetryPlan::NewKey).await
}

/// The case with the retry of `ord-2102` made as `plan` says.
///
/// Errors: the service, the database or a request failed.
pub async fn run_with(ctx: &mut Ctx, plan: RetryPlan) -> anyhow::Result<()> {
    let service = start_service(ctx).await?;
    let db = ctx.connect().await?;
    grant_each_account(&service).await?;
    ctx.note(
        "a lost response: the service pauses after the commit; the client gives up once it sees the response held",
    );

    pay_same_key_order(ctx, &service, &db).await?;
    pay_new_key_order(ctx, &service, plan).await?;

    // ord-2103: paid plainly.
    let (order, account, amount, key) = PLAIN_ORDER;
    let plain = debit_for_order(&service, key, account, amount, order, None).await?;
    ctx.check_eq(
        "ord-2103: status and outcome",
        "201 OK".to_string(),
        plain.status_outcome(),
    );

    // L11's reconciliation: every transaction balances, so it finds nothing.
    let mut client = ctx.connect().await?;
    let findings = reconcile(&mut client).await?;
    ctx.check(
        "L11's reconciliation finds nothing",
        findings.is_clean(),
        findings.summary(),
    );

    let found = reconcile_the_orders(ctx, &db).await?;
    expose_paid_twice(ctx, &db, &found, findings.is_clean()).await?;

    service.stop_checked(ctx).await?;
    Ok(())
}

/// Starts ledger-svc with fault injection, for [`CLIENT`].
async fn start_service(ctx: &Ctx) -> anyhow::Result<Service> {
    Service::start(
        ctx,
        ServiceOptions {
            fault_injection: true,
            ..ServiceOptions::default()
        }
        .with_clients(&[CLIENT]),
    )
    .await
}

/// Grants [`START_BALANCE`] to each order's account (keys `g-2101`…`g-2103`).
async fn grant_each_account(service: &Service) -> anyhow::Result<()> {
    for (index, (_, account, _, _)) in [SAME_KEY_ORDER, NEW_KEY_ORDER, PLAIN_ORDER]
        .iter()
        .enumerate()
    {
        service
            .grant(
                "ops",
                &format!("g-210{}", index + 1),
                account,
                START_BALANCE,
            )
            .await?;
    }
    Ok(())
}

/// ord-2101: the response is lost, the client retries with the same key (checked to
/// replay); then the same key with another order id is checked to be 422 and to record
/// nothing.
async fn pay_same_key_order(ctx: &mut Ctx, service: &Service, db: &Client) -> anyhow::Result<()> {
    // ord-2101: the response is lost, the client retries with the same key.
    let (order, account, amount, key) = SAME_KEY_ORDER;
    lose_response(ctx, service, order, account, amount, key).await?;
    let retry = debit_for_order(service, key, account, amount, order, None).await?;
    ctx.note(format!("{order} same-key retry: {}", retry.summary()));
    ctx.check_eq(
        "same-key retry replays (201, Idempotent-Replayed)",
        "201 true".to_string(),
        format!("{} {}", retry.status, retry.replayed),
    );

    // The same key with another order id: another request, refused, nothing recorded.
    let before = recorded(db).await?;
    let reused = debit_for_order(service, key, account, amount, OTHER_ORDER, None).await?;
    ctx.note(format!(
        "{order}'s key with order {OTHER_ORDER}: {}",
        reused.summary()
    ));
    ctx.check_eq(
        "same key, another order id: status and outcome",
        "422 KEY_REUSED".to_string(),
        reused.status_outcome(),
    );
    ctx.check(
        "nothing recorded by the 422",
        recorded(db).await? == before,
        "rows unchanged",
    );
    Ok(())
}

/// ord-2102: the response is lost, the client retries as `plan` says (under a new key, or
/// the same one); the retry's reply is a note.
async fn pay_new_key_order(
    ctx: &mut Ctx,
    service: &Service,
    plan: RetryPlan,
) -> anyhow::Result<()> {
    // ord-2102: the response is lost, the client retries as `plan` says.
    let (order, account, amount, key) = NEW_KEY_ORDER;
    lose_response(ctx, service, order, account, amount, key).await?;
    let retry_key = match plan {
        RetryPlan::NewKey => NEW_KEY,
        RetryPlan::SameKey => key,
    };
    let retry = debit_for_order(service, retry_key, account, amount, order, None).await?;
    ctx.note(format!(
        "{order} retry under key {retry_key}: {}",
        retry.summary()
    ));
    Ok(())
}

/// The orders against the ledger ([`reconcile_orders`]): notes the findings and checks
/// they are exactly "ord-2102 paid by 2 debits". Returns the findings.
async fn reconcile_the_orders(ctx: &mut Ctx, db: &Client) -> anyhow::Result<Vec<OrderFinding>> {
    // The orders against the ledger.
    let orders: Vec<Order> = [SAME_KEY_ORDER, NEW_KEY_ORDER, PLAIN_ORDER]
        .iter()
        .map(|(order_id, account_id, amount, _)| Order {
            order_id: (*order_id).into(),
            account_id: (*account_id).into(),
            amount: *amount,
        })
        .collect();
    let found = reconcile_orders(db, &orders).await?;
    ctx.note(format!(
        "order reconciliation: {} finding(s) over {} orders",
        found.len(),
        orders.len()
    ));
    for finding in &found {
        ctx.note(format!("finding: {}", finding.describe()));
    }
    let expected = OrderFinding::PaidMoreThanOnce {
        order_id: NEW_KEY_ORDER.0.into(),
        debits: 2,
        keys: vec![
            format!("{CLIENT}/{}", NEW_KEY_ORDER.3),
            format!("{CLIENT}/{NEW_KEY}"),
        ],
    };
    ctx.check(
        "the order reconciliation names ord-2102, paid by 2 debits, and nothing else",
        found == [expected.clone()],
        format!("expected: {}", expected.describe()),
    );
    let names_other = found.iter().any(|finding| {
        let text = finding.describe();
        text.contains(SAME_KEY_ORDER.0) || text.contains(PLAIN_ORDER.0)
    });
    ctx.check(
        "no finding about ord-2101 (same-key retry) or ord-2103 (paid once)",
        !names_other,
        if names_other { "named" } else { "none" },
    );
    Ok(found)
}

/// The negative control's verdict: ord-2102 paid twice (by the order reconciliation and
/// its debit count) while L11's reconciliation was clean (`l11_clean`).
async fn expose_paid_twice(
    ctx: &mut Ctx,
    db: &Client,
    found: &[OrderFinding],
    l11_clean: bool,
) -> anyhow::Result<()> {
    let paid_twice = found.iter().any(|finding| {
        matches!(finding, OrderFinding::PaidMoreThanOnce { order_id, debits: 2, .. }
            if order_id == NEW_KEY_ORDER.0)
    });
    let debits = queries::count_txns(db, NEW_KEY_ORDER.1, "DEBIT").await?;
    let balance = queries::existing_balance(db, NEW_KEY_ORDER.1).await?;
    ctx.exposes(
        ANOMALY,
        paid_twice && debits == 2 && l11_clean,
        format!(
            "debit_txns={debits} balance={balance} order_finding={paid_twice} l11_clean={l11_clean}"
        ),
    );
    Ok(())
}

/// `POST /accounts/{account}/debits` with body `amount=N&order_id=ORDER` as [`CLIENT`],
/// timing out after `timeout_ms` (default [`CLIENT_TIMEOUT_MS`]; a bound against a hang).
///
/// Errors: the transport's error (`is_timeout()` for a timeout).
async fn debit_for_order(
    service: &Service,
    key: &str,
    account: &str,
    amount: i64,
    order: &str,
    timeout_ms: Option<u64>,
) -> Result<Reply, reqwest::Error> {
    let request = service
        .http()
        .post(service.public_url(&format!("/accounts/{account}/debits")))
        .header("x-client-id", CLIENT)
        .header("idempotency-key", key)
        .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(format!("amount={amount}&order_id={order}"))
        .timeout(Duration::from_millis(
            timeout_ms.unwrap_or(CLIENT_TIMEOUT_MS),
        ));
    service.send(request).await
}

/// Arms an `after-commit` pause for one request, debits `amount` for `order` and gives up
/// the moment the service holds the committed response ([`give_up_once_held`], as L7):
/// checks the client had no response and the service had committed; releases the pause.
async fn lose_response(
    ctx: &mut Ctx,
    service: &Service,
    order: &str,
    account: &str,
    amount: i64,
    key: &str,
) -> anyhow::Result<()> {
    // Arming resets the fault's counters, so `fired` counts this request only.
    service
        .arm_fault(
            HookPoint::AfterCommit,
            json!({"action": "pause", "hold_ms": PAUSE_BOUND_MS, "count": 1}),
        )
        .await?;
    let attempt = debit_for_order(service, key, account, amount, order, Some(PAUSE_BOUND_MS));
    let gave_up = give_up_once_held(
        service,
        HookPoint::AfterCommit,
        attempt,
        Duration::from_millis(HELD_WAIT_MS),
    )
    .await?;
    let gave_up_first = gave_up.answered.is_none();
    let state = gave_up.state;
    ctx.check(
        format!("{order}: the client gave up without a response after the service had committed"),
        gave_up_first && state.fired >= 1,
        format!(
            "gave_up={gave_up_first} after_commit_fired={}",
            state.fired >= 1
        ),
    );
    service.release_fault(HookPoint::AfterCommit).await?;
    Ok(())
}

/// Rows in idem_request, ledger_txn and ledger_entry.
async fn recorded(db: &tokio_postgres::Client) -> anyhow::Result<(i64, i64, i64)> {
    let row = db
        .query_one(
            "SELECT (SELECT count(*) FROM idem_request), (SELECT count(*) FROM ledger_txn), \
             (SELECT count(*) FROM ledger_entry)",
            &[],
        )
        .await?;
    Ok((row.get(0), row.get(1), row.get(2)))
}
