//! What R1's parts share: the pooler's size and the clients, the service's bounds (the
//! database's own behind the pooler), the service launched through the pooler, a holder
//! session straight to PostgreSQL whose lock the pooled sessions are seen waiting on,
//! and L7's lost response (every transfer mode has the `after-commit` point).

use std::sync::Arc;
use std::time::Duration;

use cases_ledger::http::{LedgerCalls, LedgerReply};
use launch::lost::give_up_once_held;
use launch::service::{Reply, Service, ServiceOptions};
use points_ledger::{HookPoint, TransferMode};
use scratch_pg::Cluster;
use scratch_pg::bouncer::Bouncer;
use serde_json::json;
use tokio_postgres::types::ToSql;

use crate::pair::LEDGER_DATABASE;
use case_kit::Ctx;

/// The pooler's server sessions for the ledger database.
pub const POOLER_POOL_SIZE: u32 = 4;
/// Concurrent clients of the service (and its own pool of connections to the pooler).
pub const CLIENTS: usize = 32;
/// The service's bounds, milliseconds: hang bounds only, far above the time a request
/// waits on the holder's lock or in the pooler's queue. Set on the database.
pub const SERVICE_BOUND_MS: u64 = 60_000;
/// Pause between two looks at `pg_stat_activity` or the batch queue, milliseconds
/// (pacing only).
pub const POLL_MS: u64 = 10;
/// The client id of every debit and grant.
pub const CLIENT: &str = "app-r1";
/// What a ledger account gets before its claim.
pub const START_BALANCE: i64 = 100;
/// The debit whose response is lost.
const LOST_DEBIT: i64 = 30;

/// A request under way: its reply, or the transport's error.
pub type Pending = tokio::task::JoinHandle<Result<Reply, reqwest::Error>>;

/// `postgresql://` URL of the ledger database through `bouncer`.
pub fn pooler_url(bouncer: &Bouncer) -> String {
    format!(
        "postgresql://postgres@127.0.0.1:{}/{LEDGER_DATABASE}",
        bouncer.port()
    )
}

/// Options of a service behind the pooler: [`CLIENTS`] pooled connections,
/// `--behind-transaction-pooler`, the four bounds at [`SERVICE_BOUND_MS`] (the database's
/// own), then `extra` (e.g. `--transfer-mode batch`).
pub fn service_options(fault_injection: bool, extra: &[&str]) -> ServiceOptions {
    let mut options = ServiceOptions::default().with_clients(&[CLIENT]);
    options.fault_injection = fault_injection;
    options.pool_size = CLIENTS;
    options.extra_args = vec!["--behind-transaction-pooler".into()];
    for bound in [
        "--request-timeout-ms",
        "--lock-timeout-ms",
        "--statement-timeout-ms",
        "--idle-in-transaction-timeout-ms",
    ] {
        options
            .extra_args
            .extend([bound.into(), SERVICE_BOUND_MS.to_string()]);
    }
    options
        .extra_args
        .extend(extra.iter().map(|arg| arg.to_string()));
    options
}

/// Launches `ledger-svc` through `bouncer` with `options`, logging to `log_name`.
///
/// Errors: the service did not start.
pub async fn launch(
    ctx: &Ctx,
    bouncer: &Bouncer,
    options: ServiceOptions,
    log_name: &str,
) -> anyhow::Result<Arc<Service>> {
    let log = ctx.log_file(log_name)?;
    Ok(Arc::new(
        Service::launch(&pooler_url(bouncer), log, options).await?,
    ))
}

/// Stops a service no task shares any more, checking its exit.
///
/// Errors: still shared; the stop failed.
pub async fn stop(ctx: &mut Ctx, service: Arc<Service>) -> anyhow::Result<()> {
    Arc::try_unwrap(service)
        .map_err(|_| anyhow::anyhow!("the service is still shared"))?
        .stop_checked(ctx)
        .await
}

/// Grants [`START_BALANCE`] to each of `accounts` (keys `g-r1-<tag>-<n>`).
///
/// Errors: transport errors or a refused grant.
pub async fn fund(service: &Service, tag: &str, accounts: &[String]) -> anyhow::Result<()> {
    for (n, account) in accounts.iter().enumerate() {
        let key = format!("g-r1-{tag}-{n}");
        service.grant("ops", &key, account, START_BALANCE).await?;
    }
    Ok(())
}

/// A debit of `amount` from `account` under `key`, spawned.
pub fn debit(service: &Arc<Service>, key: String, account: &str, amount: i64) -> Pending {
    let (service, account) = (service.clone(), account.to_owned());
    tokio::spawn(async move {
        let timeout = Duration::from_millis(SERVICE_BOUND_MS);
        service.debit(CLIENT, &key, &account, amount, timeout).await
    })
}

/// A holder session straight to PostgreSQL with the row lock `lock_sql` takes, open
/// until dropped or [`Holder::release`]d.
pub struct Holder {
    client: tokio_postgres::Client,
}

impl Holder {
    /// Opens a transaction on `primary` and runs `lock_sql` (a `SELECT … FOR UPDATE`).
    ///
    /// Errors: SQL errors.
    pub async fn lock(
        primary: &Cluster,
        lock_sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> anyhow::Result<Holder> {
        let client = primary.connect(LEDGER_DATABASE).await?;
        client.batch_execute("BEGIN").await?;
        client.execute(lock_sql, params).await?;
        Ok(Holder { client })
    }

    /// Rolls the holder's transaction back: the lock goes.
    ///
    /// Errors: SQL errors.
    pub async fn release(self) -> anyhow::Result<()> {
        self.client.batch_execute("ROLLBACK").await?;
        Ok(())
    }
}

/// The row lock on a ledger account.
pub const ACCOUNT_LOCK_SQL: &str = "SELECT 1 FROM account WHERE account_id = $1 FOR UPDATE";

/// Sends the requests `send` spawns while a holder locks a row (`lock_sql`), until all
/// the pooler's server sessions are seen waiting on a lock (the other requests queue in
/// the pooler); then rolls the holder back and returns the replies in request order
/// with the count seen waiting.
///
/// Errors: SQL errors, transport errors, not seen waiting within the bound.
pub async fn held_at_once(
    primary: &Cluster,
    lock_sql: &str,
    params: &[&(dyn ToSql + Sync)],
    send: impl FnOnce() -> Vec<Pending>,
) -> anyhow::Result<(Vec<Reply>, usize)> {
    let holder = Holder::lock(primary, lock_sql, params).await?;
    let requests = send();
    let waiting = waiting_on_lock(primary, POOLER_POOL_SIZE as usize).await?;
    holder.release().await?;
    Ok((replies(requests).await?, waiting))
}

/// The replies of `requests`, in order.
///
/// Errors: a task panicked; a transport error.
pub async fn replies(requests: Vec<Pending>) -> anyhow::Result<Vec<Reply>> {
    let mut replies = Vec::new();
    for request in requests {
        replies.push(request.await??);
    }
    Ok(replies)
}

/// How many of `replies` have `status_outcome` `outcome` (e.g. `201 OK`).
pub fn count(replies: &[Reply], outcome: &str) -> usize {
    replies
        .iter()
        .filter(|reply| reply.status_outcome() == outcome)
        .count()
}

/// Waits until at least `want` sessions of the ledger database wait on a lock
/// (`pg_stat_activity.wait_event_type = 'Lock'`); returns the count seen then.
///
/// Errors: SQL errors; not seen within [`SERVICE_BOUND_MS`].
pub async fn waiting_on_lock(primary: &Cluster, want: usize) -> anyhow::Result<usize> {
    crate::syncrep::sessions_waiting(primary, crate::syncrep::Wait::Lock, want, SERVICE_BOUND_MS)
        .await
}

/// A ledger account's balance.
///
/// Errors: SQL errors; no such account.
pub async fn balance(db: &tokio_postgres::Client, account: &str) -> anyhow::Result<i64> {
    Ok(db
        .query_one(
            "SELECT balance FROM account WHERE account_id = $1",
            &[&account],
        )
        .await?
        .get(0))
}

/// Ledger transactions recorded for [`CLIENT`]'s `key`.
///
/// Errors: SQL errors.
pub async fn txns_for_key(db: &tokio_postgres::Client, key: &str) -> anyhow::Result<i64> {
    cases_ledger::queries::txns_for_key(db, CLIENT, key).await
}

/// L7 through the pooler: the response lost after the commit (fault `pause` at
/// `after-commit`, the client gives up once it is seen held), the same-key retry.
///
/// Errors: SQL, transport or fault-route errors.
pub async fn lost_response(
    ctx: &mut Ctx,
    primary: &Cluster,
    service: &Arc<Service>,
    mode: TransferMode,
    account: &str,
) -> anyhow::Result<()> {
    let key = format!("k-r1-{mode}-lost");
    service
        .arm_fault(
            HookPoint::AfterCommit,
            json!({"action": "pause", "hold_ms": SERVICE_BOUND_MS, "count": 1}),
        )
        .await?;
    let bound = Duration::from_millis(SERVICE_BOUND_MS);
    let attempt = service.debit(CLIENT, &key, account, LOST_DEBIT, bound);
    let gave_up = give_up_once_held(service, HookPoint::AfterCommit, attempt, bound).await?;
    let db = primary.connect(LEDGER_DATABASE).await?;
    let balance_then = balance(&db, account).await?;
    service.release_fault(HookPoint::AfterCommit).await?;
    ctx.check_eq(
        format!("{mode}: lost response: gave up unanswered while held, balance then"),
        format!("{:?}", (true, true, START_BALANCE - LOST_DEBIT)),
        format!(
            "{:?}",
            (
                gave_up.answered.is_none(),
                gave_up.state.holding >= 1,
                balance_then
            )
        ),
    );
    let retry = service
        .debit_once(CLIENT, &key, account, LOST_DEBIT)
        .await?;
    ctx.check_eq(
        format!("{mode}: lost response: same-key retry → status, replayed, balance"),
        format!(
            "{:?}",
            ("201 OK".to_owned(), true, Some(START_BALANCE - LOST_DEBIT))
        ),
        format!(
            "{:?}",
            (retry.status_outcome(), retry.replayed, retry.balance())
        ),
    );
    ctx.check_eq(
        format!("{mode}: lost response: transactions for the key, balance"),
        format!("{:?}", (1, START_BALANCE - LOST_DEBIT)),
        format!(
            "{:?}",
            (txns_for_key(&db, &key).await?, balance(&db, account).await?)
        ),
    );
    Ok(())
}
