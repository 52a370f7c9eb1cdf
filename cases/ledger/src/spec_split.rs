//! The key registry in another database as spec steps (L22): the naive design that keeps
//! the idempotency keys in a second database of the same cluster, so that a debit is two
//! commits (`crash-worker --registry-database-url`, `crash-worker/src/split_registry.rs`).
//!
//! - `call NAME: split-databases grant=ACCOUNT,… amount=N` makes the case's two extra
//!   databases, `<case database>_split` (the ledger's schema and seed, `points_ledger::
//!   schema`) and `<case database>_keys` (empty: the worker creates its `idem_registry`),
//!   each dropped first if a former run left it, and grants N to each account on the
//!   split ledger (keys `g-2200`, `g-2201`, … for client `ops`). The case's own database
//!   is not touched, so it stays clean for L11. Prints `ledger=split registry=keys
//!   granted=2`. Like `Ctx::extra_database`'s, the databases go with the scratch cluster.
//! - `call NAME: split-worker account=ID amount=N key=K commit-first=key|debit
//!   [client=C] [stop=between-commits]` runs that debit in a crash-worker on the split
//!   ledger and the registry, committing `commit-first`'s transaction first. With
//!   `stop=between-commits` it returns once the worker says it is paused between the two
//!   commits (`paused between the commits`), and the worker is left for `kill-worker`
//!   ([`super::spec_workers`]); without it, once the worker ended: `exit=0 outcome=OK
//!   replayed=true balance=60` (its `RESULT` line without the txn id, which varies).
//!   Either way a second line gives what another connection then sees:
//!   `key=OK ledger_balance=100 debits=0` (the key's outcome in the registry, or
//!   `key=none`; the account's balance on the split ledger; its DEBITs of N).

use std::time::Duration;

use case_kit::spec::Call;
use launch::worker::{CrashWorker, PausedWorkers};
use points_ledger::HookPoint;
use tokio_postgres::{Client, NoTls};

use super::queries;
use super::spec_workers::DEFAULT_CLIENT;
use super::worker::WorkerSpec;

/// Longest wait for a worker that runs to its end; it only stops a hang.
const WORKER_FINISH_LIMIT_MS: u64 = 20_000;

/// `url` with its database (the last path segment) replaced by `database`.
fn with_database(url: &str, database: &str) -> String {
    let (base, rest) = url.rsplit_once('/').unwrap_or((url, ""));
    match rest.split_once('?') {
        Some((_, query)) => format!("{base}/{database}?{query}"),
        None => format!("{base}/{database}"),
    }
}

/// The database at the end of `url`.
fn database_of(url: &str) -> &str {
    let last = url.rsplit('/').next().unwrap_or_default();
    last.split('?').next().unwrap_or_default()
}

async fn connect(url: &str) -> Result<Client, String> {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    tokio::spawn(connection);
    Ok(client)
}

/// The split ledger's and the registry's URLs, next to the case's database.
fn urls(case_url: &str) -> (String, String) {
    let own = database_of(case_url);
    (
        with_database(case_url, &format!("{own}_split")),
        with_database(case_url, &format!("{own}_keys")),
    )
}

/// Runs an operation of this module (see the module documentation); a paused worker is
/// handed to `workers`, where `kill-worker` finds it.
///
/// Errors: a database or the worker could not be used, the worker did not pause or end.
pub async fn run(workers: &PausedWorkers, call: &Call) -> Result<String, String> {
    let text = |e: anyhow::Error| format!("{e:#}");
    let (split_url, keys_url) = urls(workers.database_url());
    if call.op == "split-databases" {
        return make_databases(workers.database_url(), call).await;
    }
    let arg = |name: &str| call.arg(name).unwrap_or_default();
    let amount: i64 = arg("amount").parse().map_err(|_| "amount=N".to_string())?;
    let client_id = call.arg("client").unwrap_or(DEFAULT_CLIENT);
    let mut args = WorkerSpec {
        database_url: split_url.clone(),
        client_id: client_id.into(),
        idem_key: arg("key").into(),
        account: arg("account").into(),
        amount,
        stop_at: HookPoint::BeforeCommit,
        pause_limit_ms: None,
    }
    .args();
    args.extend(["--registry-database-url".into(), keys_url.clone()]);
    args.extend(["--commit-first".into(), arg("commit-first").into()]);
    let mut worker;
    let first = if call.arg("stop").is_some() {
        args.push("--stop-between-commits".into());
        worker = CrashWorker::launch(args).map_err(text)?;
        worker.wait_paused().await.map_err(text)?;
        workers.keep(worker).await;
        "paused between the commits".to_string()
    } else {
        let limit = Duration::from_millis(WORKER_FINISH_LIMIT_MS);
        worker = CrashWorker::launch(args).map_err(text)?;
        let line = worker.next_line(limit).await.map_err(text)?;
        let end = worker.wait(limit).await.map_err(text)?;
        let line = line.unwrap_or_default();
        let result = line.strip_prefix("RESULT ").unwrap_or(&line);
        let result = result
            .split_whitespace()
            .filter(|w| !w.starts_with("txn_id="));
        let result: Vec<&str> = result.collect();
        format!("exit={} {}", end.shell_status(), result.join(" "))
    };
    let state = seen(&split_url, &keys_url, client_id, call, amount).await?;
    Ok(format!("{first}\n{state}"))
}

/// What another connection sees of the row: the key's outcome in the registry, the
/// account's balance and its DEBITs of `amount` on the split ledger.
async fn seen(
    split_url: &str,
    keys_url: &str,
    client_id: &str,
    call: &Call,
    amount: i64,
) -> Result<String, String> {
    let text = |e: anyhow::Error| format!("{e:#}");
    let (account, key) = (call.arg("account").unwrap_or_default(), call.arg("key"));
    let keys = connect(keys_url).await?;
    let registered = keys
        .query_opt(
            "SELECT outcome FROM idem_registry WHERE client_id = $1 AND idem_key = $2",
            &[&client_id, &key.unwrap_or_default()],
        )
        .await
        .map_err(|e| e.to_string())?;
    let key = registered.map_or("none".to_string(), |row| row.get(0));
    let split = connect(split_url).await?;
    let balance = queries::existing_balance(&split, account)
        .await
        .map_err(text)?;
    let debits = queries::debits_of(&split, account, amount)
        .await
        .map_err(text)?;
    Ok(format!(
        "key={key} ledger_balance={balance} debits={debits}"
    ))
}

/// `split-databases grant=… amount=N` (see the module documentation).
async fn make_databases(case_url: &str, call: &Call) -> Result<String, String> {
    let sql = |e: tokio_postgres::Error| e.to_string();
    let (split_url, keys_url) = urls(case_url);
    let admin = connect(case_url).await?;
    for url in [&split_url, &keys_url] {
        let name = database_of(url);
        let drop = format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)");
        admin.batch_execute(&drop).await.map_err(sql)?;
        let create = format!("CREATE DATABASE \"{name}\" TEMPLATE template0");
        admin.batch_execute(&create).await.map_err(sql)?;
    }
    let mut split = connect(&split_url).await?;
    points_ledger::schema::install(&split)
        .await
        .map_err(|e| e.to_string())?;
    points_ledger::schema::seed(&split)
        .await
        .map_err(|e| e.to_string())?;
    let amount: i64 = call
        .arg("amount")
        .unwrap_or_default()
        .parse()
        .map_err(|_| "amount=N")?;
    let accounts: Vec<&str> = call.arg("grant").unwrap_or_default().split(',').collect();
    for (n, account) in accounts.iter().enumerate() {
        let key = format!("g-220{n}");
        points_ledger::grant(&mut split, "ops", &key, account, amount)
            .await
            .map_err(|e| e.to_string())?;
    }
    Ok(format!(
        "ledger=split registry=keys granted={}",
        accounts.len()
    ))
}
