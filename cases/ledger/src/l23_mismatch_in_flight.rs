//! L23 — a mismatched payload while the first request is in flight.
//! Claim: a debit of 20 under the key of a debit of 10 that is still running (paused at
//! the hook point `registered`, its key registered but not committed) does not race it
//! and is not answered early: it waits on the key (the unique index of `idem_request`,
//! PostgreSQL docs, INSERT "ON CONFLICT Clause"), and once the first commits it reads
//! the committed fingerprint, gets 422 `KEY_REUSED` and records nothing; the first
//! completes once (201, one transaction, balance 100 - 10).
//! Schedule: the first request is paused at `registered` (a fault of the service, not a
//! sleep) until the mismatched one is seen waiting on a lock in `pg_stat_activity`, and
//! is still unanswered 500 ms after it was sent; then the first is released.
//! Fails if: the mismatched request is answered before the first is released, does not
//! wait on a lock, gets anything but 422 KEY_REUSED, or leaves a row behind; or the
//! first is not one fresh 201 with one transaction and balance 90.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use points_ledger::HookPoint;
use serde_json::json;
use tokio_postgres::Client;

use super::modes::StatementsOnly;
use super::queries;
use case_kit::{AbortOnDrop, Case, Ctx};
use launch::service::{Reply, Service, ServiceOptions};

use super::http::{LedgerCalls, LedgerReply};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "L23",
        "mismatched payload while the first is in flight: it waits, then 422, nothing recorded",
        |ctx| run(ctx).boxed(),
    )
    // The service's pool (default size) and the case's observer connection.
    .connections(18)
    // It pauses the first request at registered: the statement transfer only.
    .statements_only()
}

const ACCOUNT: &str = "acct-0003";
const CLIENT: &str = "app-a";
const KEY: &str = "k-2301";
const START_BALANCE: i64 = 100;
const DEBIT: i64 = 10;
const OTHER_AMOUNT: i64 = 20;
/// Longest wait for the mismatched request to queue behind the paused first one,
/// milliseconds; below the client's own request timeout.
const WAITER_WAIT_MS: u64 = 8_000;
/// The mismatched request must still be unanswered this long after it was sent,
/// milliseconds.
const WAITER_HOLD_MS: u64 = 500;
/// Safety bound of the pause should the case never release it, milliseconds.
const PAUSE_BOUND_MS: u64 = 30_000;
/// Polling interval of the waits above, milliseconds.
const POLL_MS: u64 = 10;

/// Sessions of the service waiting on a lock in this database.
const WAITING_SQL: &str = "\
SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND application_name = 'ledger-svc'
  AND wait_event_type = 'Lock'";

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let service = start_service(ctx).await?;
    let db = ctx.connect().await?;
    service
        .grant("ops", "g-2301", ACCOUNT, START_BALANCE)
        .await?;
    let before = recorded(&db).await?;
    service
        .arm_fault(
            HookPoint::Registered,
            json!({"action": "pause", "hold_ms": PAUSE_BOUND_MS, "count": 1}),
        )
        .await?;

    let service = Arc::new(service);
    let first = pause_first(ctx, &service).await?;
    let mismatched = send_mismatched(ctx, &service, &db, &first).await?;
    let first = release_and_answer(ctx, &service, first, mismatched).await?;
    check_rows(ctx, &db, before).await?;
    check_retry_replays(ctx, &service, &first).await?;

    let service = Arc::into_inner(service)
        .ok_or_else(|| anyhow::anyhow!("the service handle is still shared"))?;
    service.stop_checked(ctx).await?;
    Ok(())
}

/// A request running on its own task: its reply, or the transport's error.
type InFlight = AbortOnDrop<Result<Reply, reqwest::Error>>;

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

/// The first request: registers the key, then pauses inside its transaction. Waits (up
/// to [`WAITER_WAIT_MS`]) for the pause and checks it; returns the request's task.
async fn pause_first(ctx: &mut Ctx, service: &Arc<Service>) -> anyhow::Result<InFlight> {
    let first = {
        let service = service.clone();
        AbortOnDrop::spawn(async move { service.debit_once(CLIENT, KEY, ACCOUNT, DEBIT).await })
    };
    let paused = service
        .held_within(HookPoint::Registered, Duration::from_millis(WAITER_WAIT_MS))
        .await?
        .holding;
    ctx.check_eq("first request paused at registered", 1, paused);
    Ok(first)
}

/// The same key with another amount, while the first is paused: checks that it waits on
/// the first one's key, that neither is answered after [`WAITER_HOLD_MS`], and that the
/// balance is untouched. Returns the mismatched request's task.
async fn send_mismatched(
    ctx: &mut Ctx,
    service: &Arc<Service>,
    db: &Client,
    first: &InFlight,
) -> anyhow::Result<InFlight> {
    // The same key with another amount, while the first is paused.
    let sent = Instant::now();
    let mismatched = {
        let service = service.clone();
        AbortOnDrop::spawn(
            async move { service.debit_once(CLIENT, KEY, ACCOUNT, OTHER_AMOUNT).await },
        )
    };
    let deadline = sent + Duration::from_millis(WAITER_WAIT_MS);
    let waiting = loop {
        let waiting: i64 = db.query_one(WAITING_SQL, &[]).await?.get(0);
        if waiting >= 1 || mismatched.is_finished() || Instant::now() >= deadline {
            break waiting;
        }
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    };
    tokio::time::sleep_until((sent + Duration::from_millis(WAITER_HOLD_MS)).into()).await;
    ctx.check_eq(
        "the mismatched request waits on the first one's key (pg_stat_activity, wait_event_type=Lock)",
        1,
        waiting,
    );
    let unanswered = !mismatched.is_finished() && !first.is_finished();
    ctx.check(
        "after 500 ms neither request is answered",
        unanswered,
        if unanswered {
            "both waiting"
        } else {
            "answered"
        },
    );
    ctx.check_eq(
        "balance while the first is paused",
        START_BALANCE,
        queries::existing_balance(db, ACCOUNT).await?,
    );
    Ok(mismatched)
}

/// Releases the first: it commits, then the mismatched one reads its fingerprint. Checks
/// both answers (201 fresh, 422 `KEY_REUSED`); returns the first's reply.
async fn release_and_answer(
    ctx: &mut Ctx,
    service: &Service,
    first: InFlight,
    mismatched: InFlight,
) -> anyhow::Result<Reply> {
    let released = service.release_fault(HookPoint::Registered).await?;
    ctx.check_eq("paused requests released", 1, released);
    let first = first.await??;
    let mismatched = mismatched.await??;
    ctx.note(format!("first (amount {DEBIT}): {}", first.summary()));
    ctx.note(format!(
        "same key, amount {OTHER_AMOUNT}: {}",
        mismatched.summary()
    ));
    ctx.check_eq(
        "first: status and outcome",
        "201 OK".to_string(),
        first.status_outcome(),
    );
    ctx.check_eq("first executed fresh", false, first.replayed);
    ctx.check_eq(
        "mismatched: status and outcome",
        "422 KEY_REUSED".to_string(),
        mismatched.status_outcome(),
    );
    ctx.check_eq("mismatched is not a replay", false, mismatched.replayed);
    Ok(first)
}

/// Checks that nothing but the first debit's own rows were added since `before` (one
/// request, one transaction, two entries), no debit of 20, and the balance.
async fn check_rows(ctx: &mut Ctx, db: &Client, before: (i64, i64, i64)) -> anyhow::Result<()> {
    let after = recorded(db).await?;
    let expected = (before.0 + 1, before.1 + 1, before.2 + 2);
    ctx.check(
        "rows added: the first debit's only (1 request, 1 transaction, 2 entries)",
        after == expected,
        format!("before={before:?} after={after:?}"),
    );
    ctx.check_eq(
        "transactions for the key",
        1,
        queries::txns_for_key(db, CLIENT, KEY).await?,
    );
    ctx.check_eq(
        "debits of 20 on the account",
        0,
        queries::debits_of(db, ACCOUNT, OTHER_AMOUNT).await?,
    );
    ctx.check_eq(
        "balance after both",
        START_BALANCE - DEBIT,
        queries::existing_balance(db, ACCOUNT).await?,
    );
    Ok(())
}

/// A retry of the first request: checks it still replays `first` (the 422 changed
/// nothing).
async fn check_retry_replays(
    ctx: &mut Ctx,
    service: &Service,
    first: &Reply,
) -> anyhow::Result<()> {
    let retry = service.debit_once(CLIENT, KEY, ACCOUNT, DEBIT).await?;
    ctx.note(format!("retry of the first: {}", retry.summary()));
    ctx.check(
        "retry of the first replays its transaction",
        retry.status == 201 && retry.replayed && retry.txn_id() == first.txn_id(),
        format!(
            "status={} replayed={} same_txn={}",
            retry.status,
            retry.replayed,
            retry.txn_id() == first.txn_id()
        ),
    );
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
