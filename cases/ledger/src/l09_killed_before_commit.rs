//! L9 — process killed before commit: a crash-worker child process runs the debit of 40
//! (client `app-a`, key `k-0901`) on a balance of 100 up to `before-commit` and is killed
//! there with a real SIGKILL.
//! Claim: a transaction whose client process dies before COMMIT leaves nothing behind. The
//! backend rolls it back; the same-key request that waited on the key's unique index then
//! runs as the first request (OK, not replayed, balance 60), and exactly one debit of 40
//! exists (SPEC §6 L9; PostgreSQL docs, INSERT "ON CONFLICT Clause" for the wait).
//! Fails if: the worker's debit is visible before it commits, the same-key request does
//! not wait for the worker's backend, the worker does not end by signal 9 (shell status
//! 137), or the figures afterwards are not OK / not replayed / 60 / one debit.
//!
//! Sessions and steps:
//!
//! ```text
//! worker   (child)  register k-0901; debit 40; entries; record OK; PAUSED_IN_TX
//! observer          pg_stat_activity says idle in transaction; balance is still 100
//! waiter            same-key debit of 40 ... waits on the key
//! parent            SIGKILL the worker
//! waiter            ... proceeds as the first request: OK, balance 60
//! ```

use std::time::{Duration, Instant};

use futures_util::FutureExt;
use points_ledger::{HookPoint, LedgerError, TransferResult, debit, grant};
use tokio_postgres::Client;

use super::modes::StatementsOnly;
use super::queries;
use case_kit::{AbortOnDrop, Case, Ctx};
use launch::worker::CrashWorker;

use super::worker::WorkerSpec;

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "L9",
        "process killed before commit: worker SIGKILLed at before-commit",
        |ctx| run(ctx).boxed(),
    )
    // Only its own database and its own child process are touched.
    .connections(5)
    // It holds a transfer open at before-commit: the statement transfer only.
    .statements_only()
}

const ACCOUNT: &str = "acct-0009";
const CLIENT: &str = "app-a";
const KEY: &str = "k-0901";
const START_BALANCE: i64 = 100;
const DEBIT: i64 = 40;
/// The same-key request must still be waiting this long after it was sent.
const WAITER_HOLD_MS: u64 = 500;
/// Longest wait for the same-key request to reach its lock wait in the server.
const LOCK_WAIT_LIMIT_MS: u64 = 10_000;
/// Longest wait for the same-key request to finish once the worker is dead.
const WAITER_FINISH_LIMIT_MS: u64 = 10_000;
/// Longest wait for the worker's backend to leave `pg_stat_activity` after the kill.
const BACKEND_EXIT_LIMIT_MS: u64 = 10_000;
/// Polling interval of the waits above.
const POLL_MS: u64 = 10;

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let mut observer = ctx.connect().await?;
    grant(&mut observer, "ops", "g-0901", ACCOUNT, START_BALANCE).await?;

    let (mut worker, worker_backend) = pause_worker(ctx).await?;
    check_worker_unseen(ctx, &observer, worker_backend).await?;
    let mut waiter = start_waiter(ctx, &observer, worker_backend).await?;

    // parent: a real SIGKILL, no chance to clean up.
    let end = worker.kill().await?;
    ctx.note(format!("worker SIGKILLed: {end}"));
    ctx.check_eq(
        "signal that ended the worker",
        "9".to_string(),
        end.signal()
            .map_or_else(|| "none".into(), |s| s.to_string()),
    );
    ctx.check_eq("worker's shell status (128 + 9)", 137, end.shell_status());

    let Some(result) = finish_waiter(ctx, &mut waiter).await else {
        return Ok(());
    };
    check_after_kill(ctx, &observer, worker_backend, &result).await
}

/// worker: launches the crash-worker child with the debit of 40 and waits until it pauses
/// just before COMMIT. Returns the worker and its backend's process id.
async fn pause_worker(ctx: &mut Ctx) -> anyhow::Result<(CrashWorker, i32)> {
    // worker: the debit, stopped just before COMMIT.
    let spec = WorkerSpec {
        database_url: ctx.database_url()?,
        client_id: CLIENT.into(),
        idem_key: KEY.into(),
        account: ACCOUNT.into(),
        amount: DEBIT,
        stop_at: HookPoint::BeforeCommit,
        pause_limit_ms: None,
    };
    let mut worker = CrashWorker::launch(spec.args())?;
    let paused = worker.wait_paused().await?;
    let worker_backend = paused.backend_pid()?;
    ctx.note(format!(
        "worker paused at before-commit backend_pid={worker_backend}"
    ));
    Ok((worker, worker_backend))
}

/// observer: checks that the worker's session is idle in transaction and that nothing of
/// its debit (balance, key registration) is visible to another session.
async fn check_worker_unseen(
    ctx: &mut Ctx,
    observer: &Client,
    worker_backend: i32,
) -> anyhow::Result<()> {
    // observer: the open transaction, and what another session sees meanwhile.
    let state = queries::session(observer, worker_backend)
        .await?
        .map_or_else(|| "(no session)".to_string(), |session| session.state);
    ctx.check_eq(
        "worker's session in pg_stat_activity",
        "idle in transaction".to_string(),
        state,
    );
    ctx.check_eq(
        "balance read by another session while the worker is paused",
        START_BALANCE,
        queries::existing_balance(observer, ACCOUNT).await?,
    );
    let registered = queries::request_for_key(observer, CLIENT, KEY).await?;
    ctx.check(
        "the worker's key registration is not visible to another session",
        registered.is_none(),
        if registered.is_none() {
            "none"
        } else {
            "visible"
        },
    );
    Ok(())
}

/// waiter: sends the same-key debit on its own connection, waits (up to
/// [`LOCK_WAIT_LIMIT_MS`]) for it to reach a lock wait and [`WAITER_HOLD_MS`] in all, and
/// checks that it is still waiting, on a lock held by the worker's backend. Returns the
/// task running the debit.
async fn start_waiter(
    ctx: &mut Ctx,
    observer: &Client,
    worker_backend: i32,
) -> anyhow::Result<AbortOnDrop<Result<TransferResult, LedgerError>>> {
    // waiter: the same-key debit on its own connection.
    let mut waiter_client = ctx.connect().await?;
    let waiter_backend: i32 = waiter_client
        .query_one("SELECT pg_backend_pid()", &[])
        .await?
        .get(0);
    let sent = Instant::now();
    let waiter =
        AbortOnDrop::spawn(
            async move { debit(&mut waiter_client, CLIENT, KEY, ACCOUNT, DEBIT).await },
        );
    let deadline = sent + Duration::from_millis(LOCK_WAIT_LIMIT_MS);
    let waits_on = loop {
        let session = queries::session(observer, waiter_backend).await?;
        let waits_on = session
            .map(|s| format!("{}/{}", s.wait_event_type, s.wait_event))
            .unwrap_or_else(|| "(no session)".into());
        if waits_on.starts_with("Lock/") || waiter.is_finished() || Instant::now() > deadline {
            break waits_on;
        }
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    };
    tokio::time::sleep_until((sent + Duration::from_millis(WAITER_HOLD_MS)).into()).await;
    ctx.check(
        "same-key debit still waiting after 500 ms",
        !waiter.is_finished(),
        if waiter.is_finished() {
            "finished"
        } else {
            "waiting"
        },
    );
    ctx.check(
        "same-key debit waits on a lock",
        waits_on.starts_with("Lock/"),
        format!("wait_event={waits_on}"),
    );
    let blockers = queries::blocking_pids(observer, waiter_backend).await?;
    let by_worker = blockers.contains(&worker_backend);
    ctx.check(
        "same-key debit is blocked by the worker's backend (pg_blocking_pids)",
        by_worker,
        format!("blockers={} worker_among_them={by_worker}", blockers.len()),
    );
    Ok(waiter)
}

/// waiter: waits (up to [`WAITER_FINISH_LIMIT_MS`]) for the same-key debit to finish once
/// the worker is dead and checks it ran as the first request (OK, not replayed, 60).
/// Returns its result, or `None` after a failed check when it erred or did not finish.
async fn finish_waiter(
    ctx: &mut Ctx,
    waiter: &mut AbortOnDrop<Result<TransferResult, LedgerError>>,
) -> Option<TransferResult> {
    // waiter: proceeds once the backend has rolled the worker's transaction back.
    let finished =
        tokio::time::timeout(Duration::from_millis(WAITER_FINISH_LIMIT_MS), waiter).await;
    let result = match finished {
        Ok(Ok(Ok(result))) => result,
        Ok(Ok(Err(error))) => {
            ctx.check("same-key debit finished", false, format!("error: {error}"));
            return None;
        }
        Ok(Err(join_error)) => {
            ctx.check("same-key debit finished", false, join_error);
            return None;
        }
        Err(_) => {
            ctx.check(
                "same-key debit finished",
                false,
                format!("still waiting after wait_ms={WAITER_FINISH_LIMIT_MS}"),
            );
            return None;
        }
    };
    ctx.note(format!(
        "same-key debit: outcome={} replayed={} balance={}",
        result.outcome, result.replayed, result.balance
    ));
    ctx.check_eq(
        "same-key debit's outcome",
        "OK".to_string(),
        result.outcome.to_string(),
    );
    ctx.check_eq(
        "same-key debit executed fresh (not replayed)",
        false,
        result.replayed,
    );
    ctx.check_eq(
        "balance reported by the same-key debit",
        START_BALANCE - DEBIT,
        result.balance,
    );
    Some(result)
}

/// observer: waits (up to [`BACKEND_EXIT_LIMIT_MS`]) for the worker's backend to end, then
/// checks the figures: balance 60, one debit of 40, one ledger_txn row and the key's
/// record naming the same-key debit's transaction.
async fn check_after_kill(
    ctx: &mut Ctx,
    observer: &Client,
    worker_backend: i32,
    result: &TransferResult,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_millis(BACKEND_EXIT_LIMIT_MS);
    let backend_gone = loop {
        let gone = queries::session(observer, worker_backend).await?.is_none();
        if gone || Instant::now() > deadline {
            break gone;
        }
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    };
    ctx.check(
        "the worker's backend ended",
        backend_gone,
        if backend_gone { "gone" } else { "still there" },
    );

    ctx.check_eq(
        "stored balance",
        START_BALANCE - DEBIT,
        queries::existing_balance(observer, ACCOUNT).await?,
    );
    ctx.check_eq(
        "debits of 40 on the account",
        1,
        queries::debits_of(observer, ACCOUNT, DEBIT).await?,
    );
    ctx.check_eq(
        "ledger_txn rows for the key",
        1,
        queries::txns_for_key(observer, CLIENT, KEY).await?,
    );
    let recorded = queries::request_for_key(observer, CLIENT, KEY).await?;
    ctx.check(
        "the key's record says OK with the same-key debit's transaction",
        recorded == Some(("OK".to_string(), result.txn_id)),
        match &recorded {
            Some((outcome, txn_id)) => {
                format!("outcome={outcome} same_txn={}", *txn_id == result.txn_id)
            }
            None => "no record".into(),
        },
    );
    ctx.check_eq(
        "balance recomputed from entries",
        START_BALANCE - DEBIT,
        queries::sum_of_entries(observer, ACCOUNT).await?,
    );
    Ok(())
}
