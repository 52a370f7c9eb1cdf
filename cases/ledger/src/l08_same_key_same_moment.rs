//! L8 — same key, same moment: 16 identical requests with one key execute once.
//! Claim: concurrent requests with one (client id, key) produce one transaction and one
//! response: the first registers the key, the others wait on it (the unique index of
//! `idem_request`) and then replay its committed result. A key reused for another payload
//! is refused (422) without recording anything; the same key string under another client
//! id is an independent request.
//! Schedule: the first request to register is paused at the hook point `registered`
//! until all 15 others are seen waiting on a lock in `pg_stat_activity`, so the requests
//! really overlap (a named hook, not a sleep); then it is released.
//! Fails if: more or fewer than 1 fresh and 15 replayed, more than one distinct response,
//! the 422 records anything, or the other client's request is not a fresh 201.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use futures_util::future::join_all;
use points_ledger::HookPoint;
use serde_json::json;
use tokio_postgres::Client;

use super::modes::StatementsOnly;
use super::queries;
use case_kit::{Case, Ctx};
use launch::service::{Reply, Service, ServiceOptions};

use super::http::{LedgerCalls, LedgerReply};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "L8",
        "same key, same moment: 16 requests, 1 executed, 15 replayed",
        |ctx| run(ctx).boxed(),
    )
    .connections(20)
    // Its fault point needs the statement transfer (LIMITS.md, "The one-trip transfer").
    .statements_only()
}

const REQUESTS: usize = 16;
/// Pool large enough for every request to hold its own connection at once.
const POOL_SIZE: usize = REQUESTS + 4;
/// Longest wait for the other requests to queue behind the paused first one,
/// milliseconds; below the client's own request timeout.
const WAITERS_WAIT_MS: u64 = 8_000;
/// Safety bound of the pause should the case never release it, milliseconds.
const PAUSE_BOUND_MS: u64 = 30_000;
const ACCOUNT: &str = "acct-0008";
const CLIENT: &str = "app-a";
const OTHER_CLIENT: &str = "app-b";
const KEY: &str = "k-0801";
const START_BALANCE: i64 = 100;
const DEBIT: i64 = 10;
const OTHER_AMOUNT: i64 = 20;

/// Sessions of the service waiting on a lock in this database.
const WAITING_SQL: &str = "\
SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND application_name = 'ledger-svc'
  AND wait_event_type = 'Lock'";

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let service = start_service(ctx).await?;
    let db = ctx.connect().await?;
    service
        .grant("ops", "g-0801", ACCOUNT, START_BALANCE)
        .await?;
    service
        .arm_fault(
            HookPoint::Registered,
            json!({"action": "pause", "hold_ms": PAUSE_BOUND_MS, "count": 1}),
        )
        .await?;

    let replies = send_together(ctx, &service, &db).await?;
    let txn_ids = check_one_execution(ctx, &db, replies).await?;
    check_key_reused(ctx, &service, &db).await?;
    check_other_client(ctx, &service, &db, &txn_ids).await?;

    service.stop_checked(ctx).await?;
    Ok(())
}

/// Starts ledger-svc with fault injection and a pool of [`POOL_SIZE`].
async fn start_service(ctx: &Ctx) -> anyhow::Result<Service> {
    Service::start(
        ctx,
        ServiceOptions {
            fault_injection: true,
            pool_size: POOL_SIZE,
            clients: vec![CLIENT.into(), OTHER_CLIENT.into()],
            ..ServiceOptions::default()
        },
    )
    .await
}

/// 16 identical requests, sent together; meanwhile, waits (up to [`WAITERS_WAIT_MS`]) for
/// 15 of them to queue on the key held by the paused first one, releases it, and checks
/// both. Returns the requests' replies.
async fn send_together(
    ctx: &mut Ctx,
    service: &Service,
    db: &Client,
) -> anyhow::Result<Vec<Result<Reply, reqwest::Error>>> {
    // 16 identical requests, sent together; meanwhile, wait for 15 of them to queue on
    // the key held by the paused first one, then release it.
    let requests = join_all((0..REQUESTS).map(|_| service.debit_once(CLIENT, KEY, ACCOUNT, DEBIT)));
    let release = async {
        let deadline = Instant::now() + Duration::from_millis(WAITERS_WAIT_MS);
        let mut waiting: i64;
        loop {
            waiting = db.query_one(WAITING_SQL, &[]).await?.get(0);
            if waiting >= (REQUESTS - 1) as i64 || Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let released = service.release_fault(HookPoint::Registered).await?;
        anyhow::Ok((waiting, released))
    };
    let (replies, released) = tokio::join!(requests, release);
    let (waiting, released) = released?;
    ctx.note(format!(
        "while the first request was paused at registered: {waiting} requests waited on its key"
    ));
    ctx.check_eq(
        "requests queued behind the first (pg_stat_activity, wait_event_type=Lock)",
        (REQUESTS - 1) as i64,
        waiting,
    );
    ctx.check_eq("paused requests released", 1, released);
    Ok(replies)
}

/// Checks that of the 16 replies one executed and 15 replayed the same 201, and that the
/// key has one transaction and the balance one debit. Returns the replies' txn ids.
async fn check_one_execution(
    ctx: &mut Ctx,
    db: &Client,
    replies: Vec<Result<Reply, reqwest::Error>>,
) -> anyhow::Result<BTreeSet<Option<i64>>> {
    let errors = replies.iter().filter(|r| r.is_err()).count();
    let replies: Vec<Reply> = replies.into_iter().filter_map(Result::ok).collect();
    let fresh = replies.iter().filter(|r| !r.replayed).count();
    let replayed = replies.iter().filter(|r| r.replayed).count();
    let distinct: BTreeSet<String> = replies
        .iter()
        .map(|r| format!("{} {}", r.status, r.body))
        .collect();
    let statuses: BTreeSet<u16> = replies.iter().map(|r| r.status).collect();
    let balances: BTreeSet<Option<i64>> = replies.iter().map(Reply::balance).collect();
    let txn_ids: BTreeSet<Option<i64>> = replies.iter().map(Reply::txn_id).collect();
    ctx.note(format!(
        "{REQUESTS} responses: fresh={fresh} replayed={replayed} distinct={} statuses={} \
         balances={} errors={errors}",
        distinct.len(),
        listed(statuses.iter().map(u16::to_string)),
        listed(
            replies
                .iter()
                .map(Reply::balance_text)
                .collect::<BTreeSet<_>>()
        ),
    ));
    ctx.check_eq("transport errors", 0, errors);
    ctx.check_eq("executed fresh", 1, fresh);
    ctx.check_eq("replayed", REQUESTS - 1, replayed);
    ctx.check_eq("distinct responses (status and body)", 1, distinct.len());
    ctx.check(
        "that response is 201 with one txn id and one balance",
        statuses == BTreeSet::from([201])
            && txn_ids.len() == 1
            && txn_ids.iter().all(Option::is_some)
            && balances == BTreeSet::from([Some(START_BALANCE - DEBIT)]),
        format!(
            "statuses={} txn_ids={} balances={}",
            listed(statuses.iter().map(u16::to_string)),
            txn_ids.len(),
            listed(
                replies
                    .iter()
                    .map(Reply::balance_text)
                    .collect::<BTreeSet<_>>()
            ),
        ),
    );
    ctx.check_eq(
        "transactions for the key",
        1,
        queries::txns_for_key(db, CLIENT, KEY).await?,
    );
    ctx.check_eq(
        "balance after 16 requests",
        START_BALANCE - DEBIT,
        queries::existing_balance(db, ACCOUNT).await?,
    );
    Ok(txn_ids)
}

/// The same key with another amount: checks it is refused (422 `KEY_REUSED`) and records
/// nothing.
async fn check_key_reused(ctx: &mut Ctx, service: &Service, db: &Client) -> anyhow::Result<()> {
    let before = recorded(db).await?;
    let reused = service
        .debit_once(CLIENT, KEY, ACCOUNT, OTHER_AMOUNT)
        .await?;
    ctx.note(format!(
        "same key, amount {OTHER_AMOUNT}: {}",
        reused.summary()
    ));
    ctx.check_eq(
        "same key, other amount: status and outcome",
        "422 KEY_REUSED".to_string(),
        reused.status_outcome(),
    );
    let after = recorded(db).await?;
    ctx.check(
        "nothing recorded by the 422 (requests, transactions, entries)",
        after == before,
        format!("before={before:?} after={after:?}"),
    );
    ctx.check_eq(
        "balance unchanged by the 422",
        START_BALANCE - DEBIT,
        queries::existing_balance(db, ACCOUNT).await?,
    );
    Ok(())
}

/// The same key string under another client id: checks it is an independent request with
/// its own transaction (none of `txn_ids`).
async fn check_other_client(
    ctx: &mut Ctx,
    service: &Service,
    db: &Client,
    txn_ids: &BTreeSet<Option<i64>>,
) -> anyhow::Result<()> {
    let other = service
        .debit_once(OTHER_CLIENT, KEY, ACCOUNT, DEBIT)
        .await?;
    ctx.note(format!(
        "client {OTHER_CLIENT}, same key: {}",
        other.summary()
    ));
    ctx.check_eq(
        "another client id: status and outcome",
        "201 OK".to_string(),
        other.status_outcome(),
    );
    ctx.check_eq("another client id is not a replay", false, other.replayed);
    ctx.check(
        "another client id gets its own transaction",
        other.txn_id().is_some() && !txn_ids.contains(&other.txn_id()),
        if txn_ids.contains(&other.txn_id()) {
            "same txn"
        } else {
            "own txn"
        },
    );
    ctx.check_eq(
        "balance after the other client's debit",
        START_BALANCE - 2 * DEBIT,
        queries::existing_balance(db, ACCOUNT).await?,
    );
    Ok(())
}

/// `a,b,c`: distinct values for a transcript line.
fn listed(values: impl IntoIterator<Item = String>) -> String {
    values.into_iter().collect::<Vec<_>>().join(",")
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
