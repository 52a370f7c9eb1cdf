//! L25 — batched debits: one batch, each debit answered as alone; killed before COMMIT.
//! Claim: in the batch mode (`--transfer-mode batch`) a batch of debits executed in one
//! transaction gives each debit the answer it gets alone: an OK, an INSUFFICIENT, the
//! same key twice (executed once, the second a byte-for-byte replay), a key reused with
//! another amount (422, nothing recorded), an unknown account (404 NO_ACCOUNT); twenty
//! debits racing on one balance in one batch never overdraw it (the L3 race); sixteen
//! identical requests in one batch execute once (L8). A service killed with SIGKILL while
//! a batch is paused before its COMMIT has acknowledged none of it, leaves nothing, and
//! every retry with the same key executes exactly once.
//! Schedule: the service runs one drainer; the queue is held (`PUT /batch/hold`), the
//! requests are sent, `GET /batch` is read until it shows all of them queued, and the
//! queue is released: a drainer takes them as one batch (the batch sizes seen say so).
//! For the kill a `pause` is armed at `before-commit` before the release, and the kill
//! comes once the pause is seen holding.
//! Fails if: an answer differs from the one expected alone, a batch is not the size
//! queued, the balance is overdrawn, a key executes twice or never, a killed batch
//! answered anything or left a row, or a retry is not a fresh execution.
//!
//! Rust, not a file: the batcher's queue is held, read and released through the service's
//! admin routes (`PUT /batch/hold`, `GET /batch`) around each group of requests, and each
//! group's answers are compared with the answers its requests get alone; no verb drives
//! the batcher's queue.

use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::join_all;
use points_ledger::{HookPoint, TransferMode};
use serde_json::json;
use tokio_postgres::Client;

use super::http::{LedgerCalls, LedgerReply};
use super::queries;
use case_kit::{Case, Ctx};
use launch::service::{HELD_POLL_MS, Reply, Service, ServiceOptions};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "L25",
        "batched debits: one batch answered as alone; killed before COMMIT",
        |ctx| run(ctx).boxed(),
    )
    .connections(POOL_SIZE as u32 + 3)
    // It proves the batch itself, whatever the run's mode.
    .pin(TransferMode::RECORD_NAME, TransferMode::Batch)
}

/// Pooled connections of the service (one drainer uses one at a time).
const POOL_SIZE: usize = 4;
const CLIENT: &str = "app-l25";
/// Longest wait for the queued requests to show in `GET /batch`, or for a pause to hold,
/// or for the killed service's sessions to end, milliseconds (hang bounds only).
const OBSERVE_LIMIT_MS: u64 = 10_000;
/// Safety bound of the pause before COMMIT should the case never kill, milliseconds.
const PAUSE_BOUND_MS: u64 = 30_000;
/// The L3 race in one batch: debits of [`RACE_DEBIT`] on a balance of [`RACE_BALANCE`].
const RACERS: usize = 20;
const RACE_DEBIT: i64 = 10;
const RACE_BALANCE: i64 = 100;
/// L8 in one batch: identical requests with one key.
const SAME_KEY_REQUESTS: usize = 16;
/// Debits in the batch killed before its COMMIT.
const KILLED: usize = 5;

/// A service in the batch mode with one drainer (so a released queue is one batch).
async fn start_service(ctx: &Ctx) -> anyhow::Result<Service> {
    let options = ServiceOptions {
        fault_injection: true,
        pool_size: POOL_SIZE,
        extra_args: ["--transfer-mode", "batch", "--batch-drainers", "1"]
            .map(String::from)
            .to_vec(),
        ..ServiceOptions::default()
    }
    .with_clients(&[CLIENT]);
    Service::start(ctx, options).await
}

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let db = ctx.connect().await?;
    let service = start_service(ctx).await?;
    for (key, account, amount) in [
        ("g-2501", "acct-0001", 100),
        ("g-2503", "acct-0003", 50),
        ("g-2504", "acct-0004", 100),
        ("g-2505", "acct-0005", RACE_BALANCE),
        ("g-2506", "acct-0006", 100),
        ("g-2507", "acct-0007", 100),
    ] {
        service.grant("ops", key, account, amount).await?;
    }
    let first = service.debit_once(CLIENT, "k-used", "acct-0003", 5).await?;
    ctx.check_eq(
        "first use of k-used",
        "201 OK",
        first.status_outcome().as_str(),
    );
    mixed_batch(ctx, &service, &db).await?;
    race_batch(ctx, &service, &db).await?;
    same_key_batch(ctx, &service, &db).await?;
    let service = killed_before_commit(ctx, service, &db).await?;
    retries_execute_once(ctx, &service, &db).await?;
    let findings = points_ledger::reconcile(&mut ctx.connect().await?).await?;
    ctx.check(
        "the ledger reconciles",
        findings.is_clean(),
        findings.summary(),
    );
    service.stop_checked(ctx).await
}

/// Batches of `size` requests seen so far.
async fn batches_of(service: &Service, size: usize) -> anyhow::Result<u64> {
    Ok(service.batch_state().await?["sizes"][size]
        .as_u64()
        .unwrap_or(0))
}

/// Sends `requests` with the queue held, sees them all queued, releases them, and checks
/// that exactly one more batch of that size ran. Returns the replies in request order.
async fn as_one_batch(
    ctx: &mut Ctx,
    service: &Service,
    what: &str,
    requests: &[(&str, &str, i64)],
) -> anyhow::Result<Vec<Result<Reply, reqwest::Error>>> {
    let before = batches_of(service, requests.len()).await?;
    service.hold_batches(true).await?;
    let sent = join_all(
        requests
            .iter()
            .map(|(key, account, amount)| service.debit_once(CLIENT, key, account, *amount)),
    );
    let release = async {
        let queued = service.queued_within(requests.len() as u64, Duration::from_millis(OBSERVE_LIMIT_MS)).await?;
        service.hold_batches(false).await?;
        anyhow::Ok(queued)
    };
    let (replies, queued) = tokio::join!(sent, release);
    ctx.check_eq(
        format!("{what}: requests queued while held"),
        requests.len() as u64,
        queued?,
    );
    let after = batches_of(service, requests.len()).await?;
    ctx.check_eq(
        format!("{what}: batches of {} taken on release", requests.len()),
        before + 1,
        after,
    );
    Ok(replies)
}

/// An OK, an INSUFFICIENT, the same key twice, a reused key, an unknown account.
async fn mixed_batch(ctx: &mut Ctx, service: &Service, db: &Client) -> anyhow::Result<()> {
    let requests = [
        ("k-ok", "acct-0001", 30),
        ("k-poor", "acct-0002", 1),
        ("k-twice", "acct-0004", 20),
        ("k-twice", "acct-0004", 20),
        ("k-used", "acct-0003", 6),
        ("k-nobody", "acct-9999", 5),
    ];
    let recorded_before = queries::recorded(db).await?;
    let replies = as_one_batch(ctx, service, "mixed batch", &requests).await?;
    let shown: Vec<String> = replies
        .iter()
        .map(|reply| match reply {
            Ok(reply) => reply.summary(),
            Err(error) => format!("transport error: {error}"),
        })
        .collect();
    let expected = [
        "201 OK balance=70 replayed=false",
        "409 INSUFFICIENT balance=0 replayed=false",
        "201 OK balance=80",
        "201 OK balance=80",
        "422 KEY_REUSED balance=none replayed=false",
        "404 NO_ACCOUNT balance=0 replayed=false",
    ];
    for ((request, seen), wanted) in requests.iter().zip(&shown).zip(expected) {
        ctx.check(
            format!(
                "{} {} {}: answered as alone ({wanted})",
                request.0, request.1, request.2
            ),
            seen.starts_with(wanted),
            if seen.starts_with(wanted) {
                wanted
            } else {
                seen
            },
        );
    }
    let twice: Vec<&Reply> = replies[2..4]
        .iter()
        .filter_map(|r| r.as_ref().ok())
        .collect();
    let fresh = twice.iter().filter(|r| !r.replayed).count();
    let same_body = twice.len() == 2 && twice[0].body == twice[1].body;
    ctx.check_eq("k-twice: executed fresh once", 1, fresh);
    ctx.check(
        "k-twice: the replay is the first body byte for byte",
        same_body,
        if same_body {
            "2 bodies equal".to_owned()
        } else {
            format!("{twice:?}")
        },
    );
    ctx.check_eq(
        "k-twice: transactions",
        1,
        queries::txns_for_key(db, CLIENT, "k-twice").await?,
    );
    rows_written(ctx, db, recorded_before).await?;
    Ok(())
}

/// The rows the mixed batch wrote: k-ok, k-poor, k-twice and k-nobody are recorded,
/// k-ok and k-twice have a transaction with two entries each, k-used's 422 wrote nothing.
async fn rows_written(
    ctx: &mut Ctx,
    db: &Client,
    recorded_before: (i64, i64, i64),
) -> anyhow::Result<()> {
    let recorded_after = queries::recorded(db).await?;
    let wanted = (
        recorded_before.0 + 4,
        recorded_before.1 + 2,
        recorded_before.2 + 4,
    );
    ctx.check(
        "rows written by the batch (requests, transactions, entries): k-ok, k-poor, k-twice, k-nobody",
        recorded_after == wanted,
        format!("before={recorded_before:?} after={recorded_after:?}"),
    );
    Ok(())
}

/// L3 in one batch: twenty debits of 10 on a balance of 100.
async fn race_batch(ctx: &mut Ctx, service: &Service, db: &Client) -> anyhow::Result<()> {
    let keys: Vec<String> = (0..RACERS).map(|n| format!("k-race-{n:02}")).collect();
    let requests: Vec<(&str, &str, i64)> = keys
        .iter()
        .map(|key| (key.as_str(), "acct-0005", RACE_DEBIT))
        .collect();
    let replies = as_one_batch(ctx, service, "race batch", &requests).await?;
    let count = |status: u16| {
        replies
            .iter()
            .filter(|r| r.as_ref().is_ok_and(|r| r.status == status))
            .count()
    };
    let wins = (RACE_BALANCE / RACE_DEBIT) as usize;
    ctx.check_eq("race: 201 OK", wins, count(201));
    ctx.check_eq("race: 409 INSUFFICIENT", RACERS - wins, count(409));
    ctx.check_eq(
        "race: balance, never below 0",
        0,
        queries::existing_balance(db, "acct-0005").await?,
    );
    ctx.check_eq(
        "race: debits recorded",
        wins as i64,
        queries::debits_of(db, "acct-0005", RACE_DEBIT).await?,
    );
    Ok(())
}

/// L8 in one batch: sixteen identical requests with one key.
async fn same_key_batch(ctx: &mut Ctx, service: &Service, db: &Client) -> anyhow::Result<()> {
    let requests = vec![("k-same", "acct-0006", 10); SAME_KEY_REQUESTS];
    let replies = as_one_batch(ctx, service, "same-key batch", &requests).await?;
    let replies: Vec<&Reply> = replies.iter().filter_map(|r| r.as_ref().ok()).collect();
    let fresh = replies.iter().filter(|r| !r.replayed).count();
    let bodies: std::collections::BTreeSet<String> = replies
        .iter()
        .map(|r| format!("{} {}", r.status, r.body))
        .collect();
    ctx.check_eq("same key: answers", SAME_KEY_REQUESTS, replies.len());
    ctx.check_eq("same key: executed fresh", 1, fresh);
    ctx.check_eq(
        "same key: distinct answers (status and body)",
        1,
        bodies.len(),
    );
    ctx.check_eq(
        "same key: transactions",
        1,
        queries::txns_for_key(db, CLIENT, "k-same").await?,
    );
    ctx.check_eq(
        "same key: balance",
        90,
        queries::existing_balance(db, "acct-0006").await?,
    );
    Ok(())
}

/// The keys of the batch killed before its COMMIT.
fn killed_keys() -> Vec<String> {
    (1..=KILLED).map(|n| format!("k-kill-{n}")).collect()
}

/// Sessions of the service in this database, and those inside a transaction.
const SESSIONS_SQL: &str = "\
SELECT count(*), count(*) FILTER (WHERE state = 'idle in transaction') FROM pg_stat_activity
WHERE datname = current_database() AND application_name = 'ledger-svc'";

/// Holds the queue, queues [`KILLED`] debits, arms a pause at `before-commit`, releases,
/// and SIGKILLs the service once the pause holds; checks that nothing was answered or
/// left. Returns a fresh service on the same database.
async fn killed_before_commit(
    ctx: &mut Ctx,
    service: Service,
    db: &Client,
) -> anyhow::Result<Service> {
    let pause = json!({"action": "pause", "hold_ms": PAUSE_BOUND_MS, "count": 1});
    service.arm_fault(HookPoint::BeforeCommit, pause).await?;
    service.hold_batches(true).await?;
    let keys = killed_keys();
    let sent = join_all(
        keys.iter()
            .map(|key| service.debit_once(CLIENT, key, "acct-0007", 10)),
    );
    let kill = async {
        let queued = service.queued_within(KILLED as u64, Duration::from_millis(OBSERVE_LIMIT_MS)).await?;
        service.hold_batches(false).await?;
        let limit = Duration::from_millis(OBSERVE_LIMIT_MS);
        let held = service.held_within(HookPoint::BeforeCommit, limit).await?;
        let sessions = db.query_one(SESSIONS_SQL, &[]).await?;
        let balance = queries::existing_balance(db, "acct-0007").await?;
        service.sigkill_now()?;
        anyhow::Ok((queued, held.holding, sessions.get::<_, i64>(1), balance))
    };
    let (replies, observed) = tokio::join!(sent, kill);
    let (queued, holding, in_transaction, balance) = observed?;
    ctx.check_eq("kill: requests queued while held", KILLED as u64, queued);
    ctx.check_eq("kill: the batch paused at before-commit", 1, holding);
    ctx.check_eq(
        "kill: the batch's transaction open in the server",
        1,
        in_transaction,
    );
    ctx.check_eq(
        "kill: balance before COMMIT (nothing visible)",
        100,
        balance,
    );
    let status = service.kill()?;
    use std::os::unix::process::ExitStatusExt;
    ctx.check(
        "kill: the service ended by SIGKILL",
        status.signal() == Some(9),
        status,
    );
    nothing_answered_or_left(ctx, db, &replies).await?;
    start_service(ctx).await
}

/// After the kill: no debit of the killed batch was answered, the service's sessions
/// ended, and nothing of the batch is in the ledger.
async fn nothing_answered_or_left(
    ctx: &mut Ctx,
    db: &Client,
    replies: &[Result<Reply, reqwest::Error>],
) -> anyhow::Result<()> {
    let keys = killed_keys();
    let answered: Vec<u16> = replies
        .iter()
        .filter_map(|r| r.as_ref().ok())
        .map(|r| r.status)
        .collect();
    ctx.check(
        "kill: no debit of the batch was answered",
        answered.is_empty(),
        format!("{answered:?}"),
    );
    let sessions_ended = sessions_gone(db).await?;
    ctx.check(
        "kill: the service's sessions ended (its transaction rolled back)",
        sessions_ended,
        "pg_stat_activity",
    );
    let left = db
        .query_one(
            "SELECT count(*) FROM idem_request WHERE client_id = $1 AND idem_key = ANY($2)",
            &[&CLIENT, &keys],
        )
        .await?
        .get::<_, i64>(0);
    ctx.check_eq("kill: key records left by the killed batch", 0, left);
    ctx.check_eq(
        "kill: balance after the kill",
        100,
        queries::existing_balance(db, "acct-0007").await?,
    );
    Ok(())
}

/// Whether the service's sessions left `pg_stat_activity` (looked at every
/// [`HELD_POLL_MS`], bounded by [`OBSERVE_LIMIT_MS`] against a hang).
async fn sessions_gone(db: &Client) -> anyhow::Result<bool> {
    let look = async {
        loop {
            let row = db.query_one(SESSIONS_SQL, &[]).await?;
            if row.get::<_, i64>(0) == 0 {
                return anyhow::Ok(());
            }
            tokio::time::sleep(Duration::from_millis(HELD_POLL_MS)).await;
        }
    };
    match tokio::time::timeout(Duration::from_millis(OBSERVE_LIMIT_MS), look).await {
        Ok(done) => done.map(|()| true),
        Err(_) => Ok(false),
    }
}

/// Every killed debit retried with its key on a new service: executed now, exactly once;
/// a second retry replays it.
async fn retries_execute_once(ctx: &mut Ctx, service: &Service, db: &Client) -> anyhow::Result<()> {
    let keys = killed_keys();
    let first = join_all(
        keys.iter()
            .map(|key| service.debit_once(CLIENT, key, "acct-0007", 10)),
    )
    .await;
    let fresh = first
        .iter()
        .filter(|r| r.as_ref().is_ok_and(|r| r.status == 201 && !r.replayed))
        .count();
    ctx.check_eq("retry: executed fresh", KILLED, fresh);
    let again = join_all(
        keys.iter()
            .map(|key| service.debit_once(CLIENT, key, "acct-0007", 10)),
    )
    .await;
    let replayed = again
        .iter()
        .filter(|r| r.as_ref().is_ok_and(|r| r.status == 201 && r.replayed))
        .count();
    ctx.check_eq("retry again: replayed", KILLED, replayed);
    let mut once = 0;
    for key in &keys {
        once += usize::from(queries::txns_for_key(db, CLIENT, key).await? == 1);
    }
    ctx.check_eq("retry: keys with exactly one transaction", KILLED, once);
    ctx.check_eq(
        "retry: balance",
        100 - 10 * KILLED as i64,
        queries::existing_balance(db, "acct-0007").await?,
    );
    Ok(())
}
