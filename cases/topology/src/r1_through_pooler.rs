//! R1 — the ledger through a transaction pooler: PgBouncer (Debian 12's 1.18) in
//! `pool_mode = transaction`, a pool of [`POOLER_POOL_SIZE`] server sessions for
//! [`CLIENTS`] concurrent clients of `ledger-svc` (started with
//! `--behind-transaction-pooler`), once per transfer mode (statements, onetrip).
//! Claims, in each mode:
//! - the L3 race: 32 debits of 7 from 100 at once; a holder session (straight to
//!   PostgreSQL) locks the account until all four pooled server sessions are seen
//!   waiting on a lock (`pg_stat_activity.wait_event_type = 'Lock'`; the other 28
//!   requests queue in the pooler), then rolls back: 14 OK, 18 INSUFFICIENT, balance 2;
//! - L8's same key at once: 16 requests with one key, held the same way: one executed,
//!   15 replayed with its txn id, one transaction for the key;
//! - L7's lost response: the service pauses after the commit (fault `after-commit`), the
//!   client gives up once the answer is seen held (`launch::lost`), the same-key retry
//!   replays the committed result (balance 70, one transaction).
//!
//! The service's session bounds are the database's own (`ALTER DATABASE … SET`): the
//! pooler refuses the startup packet's `options`, and the service refuses to start when
//! the bounds it reads back through the pooler differ (checked here too).
//!
//! Negative control (forced, counted): a named prepared statement (tokio-postgres
//! `prepare`, then `query`) is prepared on the pooler's only server session; a second
//! client then holds that session in an open transaction, so each of the first client's
//! [`NAMED_RUNS`] executions runs on another server session, where the statement does not
//! exist (SQLSTATE 26000). In the same layout the service's way (`query_typed`, an
//! unnamed statement) passes every time. Shown able to fail (a test) straight to
//! PostgreSQL, where no pooler moves the session.
//!
//! Fails if: any count, balance, replay or transaction count above differs; the service
//! starts with bounds that differ from the database's; the ledger does not reconcile.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cases_ledger::http::{LedgerCalls, LedgerReply};
use futures_util::FutureExt;
use launch::lost::give_up_once_held;
use launch::service::{Service, ServiceOptions};
use points_ledger::{HookPoint, TransferMode, reconcile};
use scratch_pg::Cluster;
use scratch_pg::bouncer::{Bouncer, BouncerOptions};
use serde_json::json;
use tokio_postgres::types::Type;

use crate::pair::{self, LEDGER_DATABASE};
use case_kit::{Case, Ctx};

/// The case's registration; set aside where PgBouncer cannot be had (not cached and not
/// root).
pub fn case() -> Case {
    Case::new(
        "R1",
        "through PgBouncer in transaction pooling: the L3 race, L7's lost response and L8's same key hold",
        |ctx| run(ctx).boxed(),
    )
    .requires(unavailable)
}

/// What the negative control exposes.
pub const ANOMALY: &str = "a named prepared statement fails through a transaction pooler (26000)";
/// The pooler's server sessions for the ledger database.
pub const POOLER_POOL_SIZE: u32 = 4;
/// Concurrent clients of the service (and its own pool of connections to the pooler).
pub const CLIENTS: usize = 32;
/// Executions of the named statement (and of the unnamed one) in the control.
pub const NAMED_RUNS: usize = 16;
/// The service's bounds, milliseconds: hang bounds only, far above the time a request
/// waits on the holder's lock or in the pooler's queue. Set on the database.
const SERVICE_BOUND_MS: u64 = 60_000;
/// Pause between two looks at `pg_stat_activity`, milliseconds (pacing only).
const POLL_MS: u64 = 10;
const CLIENT: &str = "app-r1";
const RACE_DEBIT: i64 = 7;
const SAME_KEY_REQUESTS: usize = 16;
const SAME_KEY_DEBIT: i64 = 10;
const LOST_DEBIT: i64 = 30;
const START_BALANCE: i64 = 100;

/// Why R1 cannot run here, or `None`: PgBouncer's binaries are cached or fetchable (may
/// fetch them, about 1 MB).
pub fn unavailable() -> Option<String> {
    scratch_pg::bouncer::resolve(&scratch_pg::binaries::default_cache_dir())
        .err()
        .map(|error| format!("PgBouncer unavailable: {error}"))
}

/// Where the control's two clients connect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Through the pooler (the case).
    Pooler,
    /// Straight to PostgreSQL (the control's test: nothing moves the session).
    Direct,
}

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    run_with(ctx, Route::Pooler).await
}

/// The case, with the control's clients on `route`.
///
/// Errors: a node, the pooler or the service did not start; SQL or HTTP errors.
pub async fn run_with(ctx: &mut Ctx, route: Route) -> anyhow::Result<()> {
    let primary = pair::start_primary(ctx).await?;
    set_database_bounds(&primary).await?;
    let bouncer = start_bouncer(ctx, &primary).await?;
    ctx.note(format!(
        "pooler: {} pool_mode=transaction default_pool_size={POOLER_POOL_SIZE} clients={CLIENTS}",
        bouncer.version_text()
    ));
    let control_port = match route {
        Route::Pooler => bouncer.port(),
        Route::Direct => primary.port(),
    };
    named_statement_control(ctx, control_port).await?;
    refuses_other_bounds(ctx, &bouncer).await?;
    for (n, mode) in [TransferMode::Statements, TransferMode::OneTrip]
        .into_iter()
        .enumerate()
    {
        through_service(ctx, &primary, &bouncer, mode, n).await?;
    }
    let mut db = primary.connect(LEDGER_DATABASE).await?;
    let findings = reconcile(&mut db).await?;
    ctx.check(
        "the ledger reconciles clean",
        findings.is_clean(),
        findings.summary(),
    );
    Ok(())
}

/// The service's bounds as the database's own, for every new session (the pooler's).
async fn set_database_bounds(primary: &Cluster) -> anyhow::Result<()> {
    let client = primary.connect(LEDGER_DATABASE).await?;
    for name in [
        "lock_timeout",
        "statement_timeout",
        "idle_in_transaction_session_timeout",
    ] {
        client
            .batch_execute(&format!(
                "ALTER DATABASE {LEDGER_DATABASE} SET {name} = {SERVICE_BOUND_MS}"
            ))
            .await?;
    }
    client
        .batch_execute(&format!(
            "ALTER DATABASE {LEDGER_DATABASE} SET default_transaction_isolation = 'read committed'"
        ))
        .await?;
    Ok(())
}

async fn start_bouncer(ctx: &Ctx, primary: &Cluster) -> anyhow::Result<Bouncer> {
    let options = BouncerOptions {
        dir: ctx.own_folder("pgbouncer")?,
        server_port: primary.port(),
        database: LEDGER_DATABASE.into(),
        user: "postgres".into(),
        pool_mode: "transaction".into(),
        pool_size: POOLER_POOL_SIZE,
        max_client_conn: 4 * CLIENTS as u32,
        server_user: scratch_pg::DEFAULT_SERVER_USER.into(),
    };
    Ok(tokio::task::spawn_blocking(move || Bouncer::start(options)).await??)
}

async fn connect(port: u16) -> anyhow::Result<tokio_postgres::Client> {
    let url = format!("postgresql://postgres@127.0.0.1:{port}/{LEDGER_DATABASE}");
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}

/// The negative control: a named statement prepared on the only server session, that
/// session then held by another client's open transaction, the statement executed
/// [`NAMED_RUNS`] times; then the same with unnamed statements.
async fn named_statement_control(ctx: &mut Ctx, port: u16) -> anyhow::Result<()> {
    const SQL: &str = "SELECT $1::int4 + 1";
    let named = connect(port).await?;
    let statement = named.prepare(SQL).await?;
    let mut holder = connect(port).await?;
    let hold = holder.transaction().await?;
    hold.batch_execute("SELECT 1").await?;
    let (mut missing, mut other) = (0, Vec::new());
    for n in 0..NAMED_RUNS as i32 {
        match named.query(&statement, &[&n]).await {
            Ok(_) => {}
            Err(error)
                if error.code()
                    == Some(&tokio_postgres::error::SqlState::INVALID_SQL_STATEMENT_NAME) =>
            {
                missing += 1
            }
            Err(error) => other.push(error.to_string()),
        }
    }
    let mut unnamed_ok = 0;
    for n in 0..NAMED_RUNS as i32 {
        if named.query_typed(SQL, &[(&n, Type::INT4)]).await.is_ok() {
            unnamed_ok += 1;
        }
    }
    hold.rollback().await?;
    ctx.note(format!(
        "named statement: {missing} of {NAMED_RUNS} executions failed with 26000 prepared statement does not exist"
    ));
    ctx.exposes(
        ANOMALY,
        missing == NAMED_RUNS,
        format!("26000 on {missing} of {NAMED_RUNS}"),
    );
    ctx.check(
        "no other error from the named statement",
        other.is_empty(),
        other.join("; "),
    );
    ctx.check_eq(
        "unnamed statements (query_typed) that passed in the same layout",
        NAMED_RUNS,
        unnamed_ok,
    );
    Ok(())
}

/// Starts the service through the pooler in `mode` and runs the three claims; account
/// numbers start at `3 * n + 1`.
async fn through_service(
    ctx: &mut Ctx,
    primary: &Cluster,
    bouncer: &Bouncer,
    mode: TransferMode,
    n: usize,
) -> anyhow::Result<()> {
    let url = format!(
        "postgresql://postgres@127.0.0.1:{}/{LEDGER_DATABASE}",
        bouncer.port()
    );
    let mut options = ServiceOptions::default().with_clients(&[CLIENT]);
    options.fault_injection = true;
    options.pool_size = CLIENTS;
    options.extra_args = vec![
        "--transfer-mode".into(),
        mode.as_str().into(),
        "--behind-transaction-pooler".into(),
    ];
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
    let log = ctx.log_file(&format!("ledger-svc-{mode}"))?;
    let service = Arc::new(Service::launch(&url, log, options).await?);
    let accounts: Vec<String> = (1..=3)
        .map(|k| points_ledger::test_account((3 * n + k) as u32))
        .collect();
    for (k, account) in accounts.iter().enumerate() {
        let key = format!("g-r1-{mode}-{k}");
        service.grant("ops", &key, account, START_BALANCE).await?;
    }
    race(ctx, primary, &service, mode, &accounts[0]).await?;
    same_key(ctx, primary, &service, mode, &accounts[1]).await?;
    lost_response(ctx, primary, &service, mode, &accounts[2]).await?;
    Arc::try_unwrap(service)
        .map_err(|_| anyhow::anyhow!("the service is still shared"))?
        .stop_checked(ctx)
        .await
}

type Pending = tokio::task::JoinHandle<Result<launch::service::Reply, reqwest::Error>>;

/// Sends the requests `send` spawns while a holder straight to PostgreSQL locks
/// `account` (`SELECT … FOR UPDATE`), until all the pooler's server sessions are seen
/// waiting on a lock; then rolls the holder back and returns the replies in request
/// order with the count seen waiting.
///
/// Errors: SQL errors, transport errors, not seen waiting within the bound.
async fn held_at_once(
    primary: &Cluster,
    account: &str,
    send: impl FnOnce() -> Vec<Pending>,
) -> anyhow::Result<(Vec<launch::service::Reply>, usize)> {
    let mut holder = primary.connect(LEDGER_DATABASE).await?;
    let lock = holder.transaction().await?;
    lock.execute(
        "SELECT 1 FROM account WHERE account_id = $1 FOR UPDATE",
        &[&account],
    )
    .await?;
    let requests = send();
    let waiting = waiting_on_lock(primary, POOLER_POOL_SIZE as usize).await?;
    lock.rollback().await?;
    let mut replies = Vec::new();
    for request in requests {
        replies.push(request.await??);
    }
    Ok((replies, waiting))
}

fn debit(service: &Arc<Service>, key: String, account: &str, amount: i64) -> Pending {
    let (service, account) = (service.clone(), account.to_owned());
    tokio::spawn(async move {
        let timeout = Duration::from_millis(SERVICE_BOUND_MS);
        service.debit(CLIENT, &key, &account, amount, timeout).await
    })
}

/// The L3 race through the pooler: [`CLIENTS`] debits of 7 from 100 at once.
async fn race(
    ctx: &mut Ctx,
    primary: &Cluster,
    service: &Arc<Service>,
    mode: TransferMode,
    account: &str,
) -> anyhow::Result<()> {
    let (replies, waiting) = held_at_once(primary, account, || {
        (0..CLIENTS)
            .map(|c| {
                debit(
                    service,
                    format!("k-r1-{mode}-race-{c:02}"),
                    account,
                    RACE_DEBIT,
                )
            })
            .collect()
    })
    .await?;
    let count = |outcome: &str| {
        replies
            .iter()
            .filter(|r| r.status_outcome() == outcome)
            .count()
    };
    let (ok, insufficient) = (count("201 OK"), count("409 INSUFFICIENT"));
    ctx.check_eq(
        format!("{mode}: race: server sessions seen waiting on the holder's lock"),
        POOLER_POOL_SIZE as usize,
        waiting,
    );
    ctx.check_eq(
        format!("{mode}: race: 32 debits of 7 from 100 → OK, INSUFFICIENT, other"),
        format!("{:?}", (14, 18, 0)),
        format!("{:?}", (ok, insufficient, CLIENTS - ok - insufficient)),
    );
    let db = primary.connect(LEDGER_DATABASE).await?;
    ctx.check_eq(
        format!("{mode}: race: balance after the race"),
        START_BALANCE - 14 * RACE_DEBIT,
        balance(&db, account).await?,
    );
    Ok(())
}

/// L8 through the pooler: [`SAME_KEY_REQUESTS`] requests with one key at once.
async fn same_key(
    ctx: &mut Ctx,
    primary: &Cluster,
    service: &Arc<Service>,
    mode: TransferMode,
    account: &str,
) -> anyhow::Result<()> {
    let key = format!("k-r1-{mode}-same");
    let (replies, waiting) = held_at_once(primary, account, || {
        (0..SAME_KEY_REQUESTS)
            .map(|_| debit(service, key.clone(), account, SAME_KEY_DEBIT))
            .collect()
    })
    .await?;
    let created = replies.iter().filter(|r| r.status_outcome() == "201 OK");
    let executed = created.clone().filter(|r| !r.replayed).count();
    let replayed = created.clone().filter(|r| r.replayed).count();
    let txn_ids: std::collections::BTreeSet<Option<i64>> = created.map(|r| r.txn_id()).collect();
    ctx.check_eq(
        format!("{mode}: same key: server sessions seen waiting on a lock"),
        POOLER_POOL_SIZE as usize,
        waiting,
    );
    ctx.check_eq(
        format!("{mode}: same key: 16 requests → executed, replayed, distinct txn ids"),
        format!("{:?}", (1, SAME_KEY_REQUESTS - 1, 1)),
        format!("{:?}", (executed, replayed, txn_ids.len())),
    );
    let db = primary.connect(LEDGER_DATABASE).await?;
    ctx.check_eq(
        format!("{mode}: same key: transactions for the key, balance"),
        format!("{:?}", (1, START_BALANCE - SAME_KEY_DEBIT)),
        format!(
            "{:?}",
            (txns_for_key(&db, &key).await?, balance(&db, account).await?)
        ),
    );
    Ok(())
}

/// L7 through the pooler: the response lost after the commit, the same-key retry.
async fn lost_response(
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

async fn balance(db: &tokio_postgres::Client, account: &str) -> anyhow::Result<i64> {
    Ok(db
        .query_one(
            "SELECT balance FROM account WHERE account_id = $1",
            &[&account],
        )
        .await?
        .get(0))
}

async fn txns_for_key(db: &tokio_postgres::Client, key: &str) -> anyhow::Result<i64> {
    Ok(db
        .query_one(
            "SELECT count(*) FROM ledger_txn WHERE client_id = $1 AND idem_key = $2",
            &[&CLIENT, &key],
        )
        .await?
        .get(0))
}

/// Waits until `want` sessions of the ledger database wait on a lock.
///
/// Errors: SQL errors; not seen within [`SERVICE_BOUND_MS`].
async fn waiting_on_lock(primary: &Cluster, want: usize) -> anyhow::Result<usize> {
    let observer = primary.connect(LEDGER_DATABASE).await?;
    let deadline = Instant::now() + Duration::from_millis(SERVICE_BOUND_MS);
    loop {
        let seen: i64 = observer
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE datname = $1 AND wait_event_type = 'Lock'",
                &[&LEDGER_DATABASE],
            )
            .await?
            .get(0);
        if seen as usize >= want {
            return Ok(seen as usize);
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "only {seen} of {want} sessions seen waiting on a lock"
        );
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    }
}

/// The service started through the pooler with a bound the database does not have
/// (`--lock-timeout-ms` 1 ms off) must refuse to start, naming the `ALTER DATABASE`.
///
/// Errors: the log cannot be read.
async fn refuses_other_bounds(ctx: &mut Ctx, bouncer: &Bouncer) -> anyhow::Result<()> {
    let url = format!(
        "postgresql://postgres@127.0.0.1:{}/{LEDGER_DATABASE}",
        bouncer.port()
    );
    let options = ServiceOptions {
        extra_args: vec![
            "--behind-transaction-pooler".into(),
            "--lock-timeout-ms".into(),
            (SERVICE_BOUND_MS - 1).to_string(),
        ],
        ..ServiceOptions::default()
    };
    let log = ctx.log_file("ledger-svc-refused")?;
    let started = Service::launch(&url, log.clone(), options).await;
    let text = std::fs::read_to_string(&log)?;
    let refusal = text
        .lines()
        .find(|line| line.contains("--behind-transaction-pooler"))
        .unwrap_or_default()
        .to_owned();
    ctx.check(
        "behind the pooler, a lock_timeout other than the database's: the service refuses to start, naming the ALTER DATABASE",
        started.is_err() && refusal.contains("ALTER DATABASE"),
        refusal,
    );
    Ok(())
}
