//! L10 — database crash: PostgreSQL is stopped in immediate mode (no checkpoint) with one
//! debit committed and another still open, then started again (WAL recovery).
//! Claim: what was committed survives, what was not is gone, and the idempotency record
//! survives with it: a same-key retry of the committed debit replays its original result
//! (PostgreSQL docs, 30.3 "Write-Ahead Logging (WAL)" and 19.5 on fsync and
//! synchronous_commit, which must be on and are read back from the server).
//! Fails if: durability settings are not on, the balance is not 90, the open debit's
//! transaction is not `aborted`, or the retry does not replay the first result.
//!
//! Sessions and steps:
//!
//! ```text
//! a        grant 100; debit 10 with key k-1001 (commits: 90)
//! b        debit 20 with key k-1002, held open at before-commit (xid noted)
//! a        balance still 90; a grant to acct-0001 commits, flushing b's WAL too
//! server   immediate stop, start (WAL recovery); old connections are closed
//! c        reconnect; fsync, synchronous_commit; balance 90; b's xid aborted;
//!          same-key retry of k-1001 replays the first result
//! ```

use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use points_ledger::{
    HookAbort, HookContext, HookPoint, Hooks, LedgerError, TransferRequest, TransferResult, debit,
    grant, transfer,
};
use tokio::sync::oneshot;

use super::modes::StatementsOnly;
use super::queries;
use case_kit::{AbortOnDrop, Case, Ctx};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "L10",
        "database crash: immediate stop with one debit committed and one open",
        |ctx| run(ctx).boxed(),
    )
    // It restarts the cluster: nothing else may run meanwhile (Exclusive).
    .restarts_server(
        "stops the server in immediate mode (a crash) and starts it again for WAL recovery",
    )
    .connections(5)
    // It holds a transfer open at before-commit: the statement transfer only.
    .statements_only()
}

const ACCOUNT: &str = "acct-0010";
const CLIENT: &str = "app-a";
const COMMITTED_KEY: &str = "k-1001";
const COMMITTED_DEBIT: i64 = 10;
const OPEN_KEY: &str = "k-1002";
const OPEN_DEBIT: i64 = 20;
const START_BALANCE: i64 = 100;
/// Another client's committed grant, made while the debit of 20 is open.
const OTHER_ACCOUNT: &str = "acct-0001";
const OTHER_GRANT: i64 = 5;
/// Longest wait for the open debit to reach `before-commit`.
const HOLD_READY_LIMIT_MS: u64 = 10_000;
/// The open debit's own bound on how long it stays open (it is killed by the restart long
/// before; this only keeps a broken run from holding it forever).
const HOLD_LIMIT_MS: u64 = 60_000;
/// Longest time spent reconnecting after the restart.
const RECONNECT_LIMIT_MS: u64 = 15_000;
/// Pause between reconnection attempts.
const RECONNECT_PAUSE_MS: u64 = 100;

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let (mut a, before) = commit_first_debit(ctx).await?;
    let (open, held) = hold_open_debit(ctx, &a).await?;
    flush_open_debit_wal(ctx, &mut a, &held, &before).await?;

    // server: immediate stop (no checkpoint), start, WAL recovery.
    ctx.restart_cluster_immediate().await?;
    ctx.note("immediate stop and start: WAL recovery");
    let old_closed = a.simple_query("SELECT 1").await.is_err();
    ctx.check(
        "connections from before the crash are closed",
        old_closed,
        if old_closed { "closed" } else { "still open" },
    );
    drop(open); // its connection died with the server; end the task that held it

    // c: a new connection, as any client must open after a restart.
    let mut c = reconnect(ctx).await?;
    check_server_after_restart(ctx, &c, &before.started).await?;
    check_recovered_state(ctx, &c, &held).await?;
    check_same_key_retry(ctx, &mut c, &before.committed).await?;
    Ok(())
}

/// What session a learned before the open debit began: the server's start time, the WAL
/// position before the committed debit, and that debit's result.
struct BeforeCrash {
    /// `pg_postmaster_start_time()` as text.
    started: String,
    /// `pg_current_wal_insert_lsn()` as text, read just before the committed debit.
    wal_before_commit: String,
    /// The committed debit of 10 with key k-1001.
    committed: TransferResult,
}

/// a: grants 100, then commits the debit of 10 and checks its outcome and balance.
/// Returns session a's connection and what it learned; errors are database errors.
async fn commit_first_debit(
    ctx: &mut Ctx,
) -> anyhow::Result<(tokio_postgres::Client, BeforeCrash)> {
    let mut a = ctx.connect().await?;
    grant(&mut a, "ops", "g-1001", ACCOUNT, START_BALANCE).await?;
    let started: String = a
        .query_one("SELECT pg_postmaster_start_time()::text", &[])
        .await?
        .get(0);

    // a: the committed debit.
    let wal_before_commit: String = a
        .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
        .await?
        .get(0);
    let committed = debit(&mut a, CLIENT, COMMITTED_KEY, ACCOUNT, COMMITTED_DEBIT).await?;
    ctx.note(format!(
        "committed debit: outcome={} balance={}",
        committed.outcome, committed.balance
    ));
    ctx.check_eq(
        "committed debit's outcome",
        "OK".to_string(),
        committed.outcome.to_string(),
    );
    ctx.check_eq(
        "balance after the committed debit",
        START_BALANCE - COMMITTED_DEBIT,
        committed.balance,
    );
    let before = BeforeCrash {
        started,
        wal_before_commit,
        committed,
    };
    Ok((a, before))
}

/// b: starts the debit of 20 on its own connection and holds it at before-commit (up to
/// [`HOLD_READY_LIMIT_MS`] to get there), then checks from session `a` that the balance
/// is still 90. Returns the task holding the debit and what it reported.
async fn hold_open_debit(
    ctx: &mut Ctx,
    a: &tokio_postgres::Client,
) -> anyhow::Result<(AbortOnDrop<Result<TransferResult, LedgerError>>, Held)> {
    let mut b = ctx.connect().await?;
    let (ready, held) = oneshot::channel();
    let hold = HoldOpen {
        ready: Mutex::new(Some(ready)),
        limit: Duration::from_millis(HOLD_LIMIT_MS),
    };
    let open = AbortOnDrop::spawn(async move {
        let request = TransferRequest::debit(CLIENT, OPEN_KEY, ACCOUNT, OPEN_DEBIT);
        transfer(&mut b, &request, &hold).await
    });
    let held = tokio::time::timeout(Duration::from_millis(HOLD_READY_LIMIT_MS), held)
        .await
        .map_err(|_| anyhow::anyhow!("the open debit did not reach before-commit"))?
        .map_err(|_| anyhow::anyhow!("the open debit ended before reaching before-commit"))??;
    ctx.note("open debit of 20 held at before-commit");
    ctx.check_eq(
        "balance read by another session while the debit of 20 is open",
        START_BALANCE - COMMITTED_DEBIT,
        queries::existing_balance(a, ACCOUNT).await?,
    );
    Ok((open, held))
}

/// a: commits another client's grant so that the open debit's WAL reaches disk, and checks
/// that, and that no checkpoint has happened since the committed debit.
async fn flush_open_debit_wal(
    ctx: &mut Ctx,
    a: &mut tokio_postgres::Client,
    held: &Held,
    before: &BeforeCrash,
) -> anyhow::Result<()> {
    // Another client's commit flushes the WAL up to its commit record, which lies after the
    // open debit's records (one WAL for all sessions): recovery then meets that transaction
    // and must roll it back, instead of never learning of it. (A commit that wrote nothing
    // but its xid would not flush: PostgreSQL flushes only when the transaction wrote WAL.)
    grant(a, "ops", "g-1002", OTHER_ACCOUNT, OTHER_GRANT).await?;
    let flushed: bool = a
        .query_one(
            "SELECT pg_current_wal_flush_lsn() >= $1::text::pg_lsn",
            &[&held.insert_lsn],
        )
        .await?
        .get(0);
    ctx.check(
        "the open debit's WAL reached disk before the crash",
        flushed,
        format!("flushed={flushed}"),
    );

    // Checked last before the crash: no checkpoint has happened since the commit, so
    // only WAL replay can bring the debit back.
    let after_checkpoint: bool = a
        .query_one(
            "SELECT redo_lsn <= $1::text::pg_lsn FROM pg_control_checkpoint()",
            &[&before.wal_before_commit],
        )
        .await?
        .get(0);
    ctx.check(
        "the committed debit lies after the last checkpoint (only WAL replay restores it)",
        after_checkpoint,
        format!("after_checkpoint={after_checkpoint}"),
    );
    Ok(())
}

/// c: checks the durability settings (fsync, synchronous_commit, full_page_writes are on)
/// and that the postmaster start time moved past `started_before`.
async fn check_server_after_restart(
    ctx: &mut Ctx,
    c: &tokio_postgres::Client,
    started_before: &str,
) -> anyhow::Result<()> {
    let settings = c
        .query_one(
            "SELECT current_setting('fsync'), current_setting('synchronous_commit'), \
             current_setting('full_page_writes')",
            &[],
        )
        .await?;
    let (fsync, synchronous_commit, full_page_writes): (String, String, String) =
        (settings.get(0), settings.get(1), settings.get(2));
    ctx.note(format!(
        "after the restart: fsync={fsync} synchronous_commit={synchronous_commit} full_page_writes={full_page_writes}"
    ));
    ctx.check_eq("fsync", "on".to_string(), fsync);
    ctx.check_eq("synchronous_commit", "on".to_string(), synchronous_commit);
    ctx.check_eq("full_page_writes", "on".to_string(), full_page_writes);
    let restarted: bool = c
        .query_one(
            "SELECT pg_postmaster_start_time() > $1::text::timestamptz",
            &[&started_before],
        )
        .await?
        .get(0);
    ctx.check(
        "the server was restarted (postmaster start time moved)",
        restarted,
        format!("restarted={restarted}"),
    );
    Ok(())
}

/// c: checks what recovery left: balance 90 (also from entries), the other client's grant,
/// the open debit's transaction `aborted` and its key neither recorded nor registered.
async fn check_recovered_state(
    ctx: &mut Ctx,
    c: &tokio_postgres::Client,
    held: &Held,
) -> anyhow::Result<()> {
    let balance = queries::existing_balance(c, ACCOUNT).await?;
    ctx.note(format!("after recovery: balance={balance}"));
    ctx.check_eq(
        "balance after recovery (10 kept, 20 gone)",
        START_BALANCE - COMMITTED_DEBIT,
        balance,
    );
    ctx.check_eq(
        "balance recomputed from entries",
        START_BALANCE - COMMITTED_DEBIT,
        queries::sum_of_entries(c, ACCOUNT).await?,
    );
    ctx.check_eq(
        "balance of acct-0001 (granted while the debit of 20 was open)",
        OTHER_GRANT,
        queries::existing_balance(c, OTHER_ACCOUNT).await?,
    );
    let status: Option<String> = c
        .query_one("SELECT pg_xact_status($1::text::xid8)", &[&held.xid])
        .await?
        .get(0);
    let status = status.unwrap_or_else(|| "(unknown)".into());
    ctx.check_eq(
        "status of the open debit's transaction (pg_xact_status)",
        "aborted".to_string(),
        status,
    );
    ctx.check_eq(
        "ledger_txn rows for the open debit's key",
        0,
        queries::txns_for_key(c, CLIENT, OPEN_KEY).await?,
    );
    ctx.check(
        "the open debit's key is not registered",
        queries::request_for_key(c, CLIENT, OPEN_KEY)
            .await?
            .is_none(),
        "",
    );
    Ok(())
}

/// c: the client retries the committed debit with the same key; checks that it replays
/// `committed` (outcome, transaction id, balance) and wrote nothing new.
async fn check_same_key_retry(
    ctx: &mut Ctx,
    c: &mut tokio_postgres::Client,
    committed: &TransferResult,
) -> anyhow::Result<()> {
    let retry = debit(c, CLIENT, COMMITTED_KEY, ACCOUNT, COMMITTED_DEBIT).await?;
    ctx.note(format!(
        "same-key retry: outcome={} replayed={} balance={}",
        retry.outcome, retry.replayed, retry.balance
    ));
    ctx.check_eq(
        "retry's outcome",
        "OK".to_string(),
        retry.outcome.to_string(),
    );
    ctx.check_eq("retry replayed", true, retry.replayed);
    let same_txn = retry.txn_id.is_some() && retry.txn_id == committed.txn_id;
    ctx.check(
        "retry returns the original transaction id",
        same_txn,
        format!("same_txn={same_txn}"),
    );
    ctx.check_eq(
        "retry returns the original balance",
        committed.balance,
        retry.balance,
    );
    ctx.check_eq(
        "ledger_txn rows for the committed key",
        1,
        queries::txns_for_key(c, CLIENT, COMMITTED_KEY).await?,
    );
    ctx.check_eq(
        "debit transactions on the account",
        1,
        queries::count_txns(c, ACCOUNT, "DEBIT").await?,
    );
    Ok(())
}

/// What the open debit reports from inside its transaction at `before-commit`.
struct Held {
    /// `pg_current_xact_id()` as text.
    xid: String,
    /// `pg_current_wal_insert_lsn()` as text: the end of the open debit's WAL so far.
    insert_lsn: String,
}

/// Hooks that hold the transfer open at `before-commit`: report the transaction id, then
/// wait (up to `limit`) for the server to go away under it.
struct HoldOpen {
    ready: Mutex<Option<oneshot::Sender<anyhow::Result<Held>>>>,
    limit: Duration,
}

impl Hooks for HoldOpen {
    fn at<'a>(&'a self, ctx: HookContext<'a>) -> BoxFuture<'a, Result<(), HookAbort>> {
        Box::pin(async move {
            if ctx.point != HookPoint::BeforeCommit {
                return Ok(());
            }
            let Some(transaction) = ctx.transaction else {
                return Err(HookAbort::new("no transaction at before-commit"));
            };
            let held = transaction
                .query_one(
                    "SELECT pg_current_xact_id()::text, pg_current_wal_insert_lsn()::text",
                    &[],
                )
                .await
                .map(|row| Held {
                    xid: row.get(0),
                    insert_lsn: row.get(1),
                })
                .map_err(anyhow::Error::from);
            let failed = held.is_err();
            let sender = self.ready.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let Some(sender) = sender {
                let _ = sender.send(held);
            }
            if failed {
                return Err(HookAbort::new("could not read the transaction id"));
            }
            tokio::time::sleep(self.limit).await;
            Err(HookAbort::new("held open for the whole limit"))
        })
    }
}

/// Opens a new connection to the case's database, retrying for up to
/// [`RECONNECT_LIMIT_MS`] (the server may still be finishing recovery).
async fn reconnect(ctx: &Ctx) -> anyhow::Result<tokio_postgres::Client> {
    let deadline = Instant::now() + Duration::from_millis(RECONNECT_LIMIT_MS);
    loop {
        match ctx.connect().await {
            Ok(client) => return Ok(client),
            Err(error) if Instant::now() > deadline => {
                return Err(error.context(format!(
                    "reconnecting after the restart for limit_ms={RECONNECT_LIMIT_MS}"
                )));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(RECONNECT_PAUSE_MS)).await,
        }
    }
}
