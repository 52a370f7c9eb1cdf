//! R1 — the ledger through a transaction pooler: PgBouncer (Debian 12's 1.18) in
//! `pool_mode = transaction`, a pool of [`POOLER_POOL_SIZE`] server sessions for
//! [`CLIENTS`] concurrent clients of `ledger-svc` (started with
//! `--behind-transaction-pooler`), in every transfer mode and on the spot routes.
//! Claims, in the statement and the one-trip transfer:
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
//! The same three in the batch transfer, where the queue forms in the service's batcher
//! rather than in the pooler ([`crate::pooled_batch`]), and on the frozen balances' spot
//! routes: a placement race, one business id sixteen times at once, a lost placement
//! response ([`crate::pooled_spot`]).
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
//! starts with bounds that differ from the database's; the ledger or the frozen balances
//! do not reconcile.
//!
//! Rust, not a file: PgBouncer in front of the case's own cluster, the same three claims
//! run in every transfer mode and on the spot routes through one pooler, and the control's
//! named prepared statement moved between server sessions by a second client's open
//! transaction; the pair's engine has no pooler and no service of its own.

use std::sync::Arc;

use cases_ledger::http::LedgerReply;
use futures_util::FutureExt;
use launch::service::{Service, ServiceOptions};
use points_ledger::{TransferMode, reconcile};
use scratch_pg::Cluster;
use scratch_pg::bouncer::{Bouncer, BouncerOptions};
use tokio_postgres::types::Type;

use crate::pair::{self, LEDGER_DATABASE};
use crate::pooled::{
    self, ACCOUNT_LOCK_SQL, SERVICE_BOUND_MS, START_BALANCE, balance, count, debit, held_at_once,
    txns_for_key,
};
use crate::{pooled_batch, pooled_spot};
use case_kit::{Case, Ctx};

pub use crate::pooled::{CLIENTS, POOLER_POOL_SIZE};

/// The case's registration; set aside where PgBouncer cannot be had (not cached and not
/// root).
pub fn case() -> Case {
    Case::new(
        "R1",
        "through PgBouncer in transaction pooling: the L3 race, L7's lost response and L8's same key hold in every transfer mode and on the spot routes",
        |ctx| run(ctx).boxed(),
    )
    .requires(unavailable)
}

/// What the negative control exposes.
pub const ANOMALY: &str = "a named prepared statement fails through a transaction pooler (26000)";
/// Executions of the named statement (and of the unnamed one) in the control.
pub const NAMED_RUNS: usize = 16;
const RACE_DEBIT: i64 = 7;
const SAME_KEY_REQUESTS: usize = 16;
const SAME_KEY_DEBIT: i64 = 10;

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
    let (primary, bouncer) = start(ctx).await?;
    named_statement_control(ctx, bouncer.port()).await?;
    refuses_other_bounds(ctx, &bouncer).await?;
    for (n, mode) in [TransferMode::Statements, TransferMode::OneTrip]
        .into_iter()
        .enumerate()
    {
        through_service(ctx, &primary, &bouncer, mode, n).await?;
    }
    pooled_batch::through_batch(ctx, &primary, &bouncer, 7).await?;
    let mut db = primary.connect(LEDGER_DATABASE).await?;
    let findings = reconcile(&mut db).await?;
    ctx.check(
        "the ledger reconciles clean",
        findings.is_clean(),
        findings.summary(),
    );
    pooled_spot::through_spot(ctx, &primary, &bouncer).await?;
    crate::pooled_syncrep::through_syncrep(ctx, &primary, &bouncer).await
}

/// Only the negative control, with its clients on `route` (its test: it must fail
/// straight to PostgreSQL).
///
/// Errors: the node or the pooler did not start; SQL errors.
pub async fn control(ctx: &mut Ctx, route: Route) -> anyhow::Result<()> {
    let (primary, bouncer) = start(ctx).await?;
    let port = match route {
        Route::Pooler => bouncer.port(),
        Route::Direct => primary.port(),
    };
    named_statement_control(ctx, port).await
}

/// The primary with the database's bounds set, and the pooler in front of it.
async fn start(ctx: &mut Ctx) -> anyhow::Result<(Cluster, Bouncer)> {
    let primary = pair::start_primary(ctx).await?;
    set_database_bounds(&primary).await?;
    let bouncer = start_bouncer(ctx, &primary).await?;
    ctx.note(format!(
        "pooler: {} pool_mode=transaction default_pool_size={POOLER_POOL_SIZE} clients={CLIENTS}",
        bouncer.version_text()
    ));
    Ok((primary, bouncer))
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

/// Starts the service through the pooler in `mode` (with fault injection) and runs the
/// three claims; account numbers start at `3 * n + 1`.
async fn through_service(
    ctx: &mut Ctx,
    primary: &Cluster,
    bouncer: &Bouncer,
    mode: TransferMode,
    n: usize,
) -> anyhow::Result<()> {
    let options = pooled::service_options(true, &["--transfer-mode", mode.as_str()]);
    let service = pooled::launch(ctx, bouncer, options, &format!("ledger-svc-{mode}")).await?;
    let accounts: Vec<String> = (1..=3)
        .map(|k| points_ledger::test_account((3 * n + k) as u32))
        .collect();
    pooled::fund(&service, mode.as_str(), &accounts).await?;
    race(ctx, primary, &service, mode, &accounts[0]).await?;
    same_key(ctx, primary, &service, mode, &accounts[1]).await?;
    pooled::lost_response(ctx, primary, &service, mode, &accounts[2]).await?;
    pooled::stop(ctx, service).await
}

/// The L3 race through the pooler: [`CLIENTS`] debits of 7 from 100 at once.
async fn race(
    ctx: &mut Ctx,
    primary: &Cluster,
    service: &Arc<Service>,
    mode: TransferMode,
    account: &str,
) -> anyhow::Result<()> {
    let (replies, waiting) = held_at_once(primary, ACCOUNT_LOCK_SQL, &[&account], || {
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
    let (ok, insufficient) = (
        count(&replies, "201 OK"),
        count(&replies, "409 INSUFFICIENT"),
    );
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
    let (replies, waiting) = held_at_once(primary, ACCOUNT_LOCK_SQL, &[&account], || {
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

/// The service started through the pooler with a bound the database does not have
/// (`--lock-timeout-ms` 1 ms off) must refuse to start, naming the `ALTER DATABASE`.
///
/// Errors: the log cannot be read.
async fn refuses_other_bounds(ctx: &mut Ctx, bouncer: &Bouncer) -> anyhow::Result<()> {
    let url = pooled::pooler_url(bouncer);
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
