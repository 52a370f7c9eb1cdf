//! L19 — key retention: an expired key is answered, never executed again.
//! Claim: with a retention window (`--key-retention-ms`), a key replays its stored
//! response inside the window; once the window has passed, the sweep leaves a tombstone
//! (fingerprint and txn id kept, stored response dropped), and a retry with the same key
//! gets 422 `KEY_EXPIRED` naming the original transaction, executes nothing, and leaves
//! the balance alone; an expired refusal names no transaction; reconciliation stays
//! clean (the tombstone still pairs the transaction with its request record).
//! Setup: ledger-svc with a window of 1500 ms and a sweep every 100 ms; balance 100.
//! Steps: a debit of 30 (201), its retry while the case holds the record `FOR SHARE` (the
//! sweep skips locked records, so the retry is inside the window by construction, not by
//! timing) (replayed), a refused debit of 1000
//! (409); wait until the sweep turned both into tombstones; retry both keys; then the
//! same debit under a new key.
//! Fails if: the retry inside the window does not replay, a tombstone lost its
//! fingerprint or txn id or kept its response, an expired key executes or answers
//! anything but 422 `KEY_EXPIRED` with the original txn id, or reconciliation has
//! findings.

use std::time::{Duration, Instant};

use futures_util::FutureExt;
use tokio_postgres::Client;

use super::queries;
use case_kit::{Case, Ctx};
use launch::service::{Reply, Service, ServiceOptions};

use super::http::{LedgerCalls, LedgerReply};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "L19",
        "key retention: after the window an expired key answers 422 KEY_EXPIRED and executes nothing",
        |ctx| run(ctx).boxed(),
    )
    .connections(8)
}

/// The retention window of the case's service, milliseconds (`--key-retention-ms`).
const RETENTION_MS: u64 = 1_500;
/// The sweep interval of the case's service, milliseconds (`--key-sweep-interval-ms`).
const SWEEP_INTERVAL_MS: u64 = 100;
/// Longest wait for the sweep to leave both tombstones, milliseconds.
const TOMBSTONE_WAIT_MS: u64 = 10_000;
const POOL_SIZE: usize = 4;
const ACCOUNT: &str = "acct-0003";
const CLIENT: &str = "app-l19";
const START_BALANCE: i64 = 100;
const DEBIT: i64 = 30;
const TOO_MUCH: i64 = 1_000;
const KEY: &str = "k-1901";
const REFUSED_KEY: &str = "k-1902";
const NEW_KEY: &str = "k-1903";

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let service = start_service(ctx).await?;
    let db = ctx.connect().await?;
    ctx.note(format!(
        "retention window {RETENTION_MS} ms (--key-retention-ms), sweep every {SWEEP_INTERVAL_MS} ms"
    ));
    service
        .grant("ops", "g-1901", ACCOUNT, START_BALANCE)
        .await?;

    let first = debit_and_retry_inside_window(ctx, &service).await?;
    let refused = service
        .debit_once(CLIENT, REFUSED_KEY, ACCOUNT, TOO_MUCH)
        .await?;
    ctx.note(format!("refused debit: {}", refused.summary()));
    let original_txn = first.txn_id();

    wait_for_tombstones(ctx, &db).await?;
    check_tombstone(ctx, &db, original_txn).await?;
    check_expired_retries(ctx, &service, &db, original_txn).await?;

    // A new operation takes a new key.
    let new = service.debit_once(CLIENT, NEW_KEY, ACCOUNT, DEBIT).await?;
    ctx.note(format!("the same debit under a new key: {}", new.summary()));
    ctx.check_eq(
        "a new key executes (100 - 30 - 30)",
        "201 OK balance=40 replayed=false".to_string(),
        new.summary(),
    );

    let mut client = ctx.connect().await?;
    let findings = points_ledger::reconcile(&mut client).await?;
    ctx.check(
        "reconciliation with tombstones: no findings",
        findings.is_clean(),
        findings.summary(),
    );
    service.stop_checked(ctx).await?;
    Ok(())
}

/// Starts ledger-svc with the case's retention window and sweep interval.
async fn start_service(ctx: &Ctx) -> anyhow::Result<Service> {
    Service::start(
        ctx,
        ServiceOptions {
            pool_size: POOL_SIZE,
            extra_args: vec![
                "--key-retention-ms".into(),
                RETENTION_MS.to_string(),
                "--key-sweep-interval-ms".into(),
                SWEEP_INTERVAL_MS.to_string(),
            ],
            clients: vec![CLIENT.into()],
            ..ServiceOptions::default()
        },
    )
    .await
}

/// The debit of 30, then its retry while the case holds the key's record `FOR SHARE` (so
/// the sweep cannot expire it meanwhile); checks that the retry replays. Returns the first
/// debit's reply.
async fn debit_and_retry_inside_window(ctx: &mut Ctx, service: &Service) -> anyhow::Result<Reply> {
    let first = service.debit_once(CLIENT, KEY, ACCOUNT, DEBIT).await?;
    // Keep the record inside its window while the retry runs, whatever the machine's
    // load: the sweep skips locked records (FOR UPDATE SKIP LOCKED), and a replay takes no
    // lock on it. The record must still be live when locked: a database fact, no clock.
    let keeper = ctx.connect().await?;
    keeper.batch_execute("BEGIN").await?;
    let live_when_locked: bool = keeper
        .query_one(
            "SELECT outcome <> 'EXPIRED' FROM idem_request \
             WHERE client_id = $1 AND idem_key = $2 FOR SHARE",
            &[&CLIENT, &KEY],
        )
        .await?
        .get(0);
    let inside = service.debit_once(CLIENT, KEY, ACCOUNT, DEBIT).await?;
    keeper.batch_execute("COMMIT").await?;
    ctx.note(format!("debit: {}", first.summary()));
    ctx.note(format!(
        "retry inside the window (its record held FOR SHARE, so no sweep expires it): {}",
        inside.summary()
    ));
    ctx.check(
        "the record was still inside its window when held",
        live_when_locked,
        live_when_locked,
    );
    ctx.check_eq(
        "the retry inside the window replays the first answer",
        "201 OK balance=70 replayed=true".to_string(),
        inside.summary(),
    );
    Ok(first)
}

/// Waits (up to [`TOMBSTONE_WAIT_MS`]) for the sweep to expire every record of the case's
/// client, checks none is left live, and notes how long it took.
async fn wait_for_tombstones(ctx: &mut Ctx, db: &Client) -> anyhow::Result<()> {
    // The window passes: wait for the sweep to leave both tombstones (the grant's too).
    let deadline = Instant::now() + Duration::from_millis(TOMBSTONE_WAIT_MS);
    let waited = Instant::now();
    loop {
        let live: i64 = db
            .query_one(
                "SELECT count(*) FROM idem_request WHERE client_id = $1 AND outcome <> 'EXPIRED'",
                &[&CLIENT],
            )
            .await?
            .get(0);
        if live == 0 || Instant::now() >= deadline {
            ctx.check_eq("records of the case's client left un-expired", 0, live);
            break;
        }
        tokio::time::sleep(Duration::from_millis(SWEEP_INTERVAL_MS / 2)).await;
    }
    ctx.note(format!(
        "tombstones after waited_ms={}",
        waited.elapsed().as_millis()
    ));
    Ok(())
}

/// Checks the debit's tombstone: fingerprint and `original_txn` kept, stored response
/// dropped, expiry exactly creation + window.
async fn check_tombstone(
    ctx: &mut Ctx,
    db: &Client,
    original_txn: Option<i64>,
) -> anyhow::Result<()> {
    let tombstone = db
        .query_one(
            "SELECT length(request_hash) AS hash_chars, txn_id, balance_after IS NULL AS dropped, \
                    expired_at = created_at + interval '1500 milliseconds' AS expiry_exact \
             FROM idem_request WHERE client_id = $1 AND idem_key = $2",
            &[&CLIENT, &KEY],
        )
        .await?;
    let hash_chars: i32 = tombstone.get("hash_chars");
    let kept_txn: Option<i64> = tombstone.get("txn_id");
    let dropped: bool = tombstone.get("dropped");
    let expiry_exact: bool = tombstone.get("expiry_exact");
    ctx.check_eq(
        "tombstone keeps the fingerprint (32 hex chars)",
        32,
        hash_chars,
    );
    ctx.check(
        "tombstone keeps the original txn id",
        kept_txn.is_some() && kept_txn == original_txn,
        if kept_txn == original_txn {
            "same"
        } else {
            "different"
        },
    );
    ctx.check_eq(
        "tombstone dropped the stored response (balance_after NULL)",
        true,
        dropped,
    );
    ctx.check_eq("tombstone's expiry = creation + window", true, expiry_exact);

    Ok(())
}

/// Retries both keys after the window: the debit's answers 422 `KEY_EXPIRED` naming
/// `original_txn` and executes nothing; the refusal's answers 422 naming no transaction.
async fn check_expired_retries(
    ctx: &mut Ctx,
    service: &Service,
    db: &Client,
    original_txn: Option<i64>,
) -> anyhow::Result<()> {
    let expired = service.debit_once(CLIENT, KEY, ACCOUNT, DEBIT).await?;
    ctx.note(format!("retry after the window: {}", expired.summary()));
    ctx.check_eq(
        "retry after the window: status and outcome",
        "422 KEY_EXPIRED".to_string(),
        expired.status_outcome(),
    );
    ctx.check(
        "the 422 names the original transaction",
        expired.txn_id().is_some() && expired.txn_id() == original_txn,
        if expired.txn_id() == original_txn {
            "same txn id"
        } else {
            "another txn id"
        },
    );
    ctx.check_eq(
        "transactions for the key",
        1,
        queries::txns_for_key(db, CLIENT, KEY).await?,
    );
    ctx.check_eq(
        "balance unchanged by the expired retry (100 - 30)",
        START_BALANCE - DEBIT,
        queries::existing_balance(db, ACCOUNT).await?,
    );
    let expired_refusal = service
        .debit_once(CLIENT, REFUSED_KEY, ACCOUNT, TOO_MUCH)
        .await?;
    ctx.note(format!(
        "retry of the refusal after the window: {} txn_id={}",
        expired_refusal.summary(),
        expired_refusal.body["txn_id"]
    ));
    ctx.check_eq(
        "expired refusal: 422 KEY_EXPIRED naming no transaction",
        "422 KEY_EXPIRED null".to_string(),
        format!(
            "{} {}",
            expired_refusal.status_outcome(),
            expired_refusal.body["txn_id"]
        ),
    );

    Ok(())
}
