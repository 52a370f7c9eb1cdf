//! L22 — the idempotency store in another database.
//! Claim: the key must be registered in the transaction that moves the points. Keeping
//! it in a second database of the same cluster (no shared transaction: a transaction
//! belongs to one database) makes the debit two commits, and a process killed between
//! them (crash-worker, SIGKILL) leaves one without the other:
//! - key committed first: the retry finds the key, replays OK, and nothing was debited
//!   (a lost debit: the client was told it paid);
//! - debit committed first: the retry finds no key and debits again (a double debit).
//!
//! The single-database design (today's `points_ledger::transfer`, key and debit in one
//! transaction) survives the same kill points with one debit: killed before its one
//! commit, the retry executes it once; killed after it, the retry replays it.
//! Setup: a debit of 40 from 100 per row. The split design's ledger and registry are two
//! extra databases of the case (`<db>_split`, `<db>_keys`), so the case's own database
//! holds only the single-database runs and stays clean for L11. Each retry is the same
//! design run again with the same key, to completion (the crash-worker without its stop
//! for the split design, `points_ledger::debit` for the single one).
//! Negative controls: the two split rows; `cases/ledger/tests/reconciliation_controls.rs` runs
//! them without the kill, where both controls' checks must FAIL.
//! Fails if: a worker does not stop, or does not end by SIGKILL; a split row does not
//! misbehave as predicted; a single-database row ends with anything but one debit of 40.

use std::time::Duration;

use futures_util::FutureExt;
use points_ledger::{HookPoint, debit, grant};

use super::modes::StatementsOnly;
use super::queries;
use super::worker::WorkerSpec;
use case_kit::{Case, Ctx};
use launch::worker::CrashWorker;

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "L22",
        "idempotency store in another database: a kill between its two commits loses or doubles a debit",
        |ctx| run(ctx).boxed(),
    )
    // Its own connections (case database, the split ledger, the registry) and a
    // worker's two.
    .connections(6)
    // It kills a worker at before-commit: the statement transfer only.
    .statements_only()
}

/// Whether the workers are killed between their commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillPlan {
    /// Stopped between the two commits (at the one commit's edges for the single
    /// database) and SIGKILLed there: the case's plan.
    BetweenCommits,
    /// The split design's workers run to the end without a stop: nothing is left half
    /// done, so both controls' checks must FAIL.
    NoKill,
}

/// The anomaly of the key-first control.
pub const KEY_FIRST_ANOMALY: &str =
    "key committed first: the retry replays OK and nothing was debited (a lost debit)";
/// The anomaly of the debit-first control.
pub const DEBIT_FIRST_ANOMALY: &str = "debit committed first: the retry debits again";

const CLIENT: &str = "app-a";
const START_BALANCE: i64 = 100;
const DEBIT: i64 = 40;
/// Longest wait for a worker that runs to completion, milliseconds.
const WORKER_FINISH_LIMIT_MS: u64 = 20_000;
/// The split design's rows: account and key.
const KEY_FIRST: (&str, &str) = ("acct-0004", "k-2201");
const DEBIT_FIRST: (&str, &str) = ("acct-0005", "k-2202");
/// The single-database rows: account and key, killed before and after the commit.
const ONE_DB_BEFORE: (&str, &str) = ("acct-0002", "k-2203");
const ONE_DB_AFTER: (&str, &str) = ("acct-0003", "k-2204");

/// What one row of the table shows after the kill and the retry.
struct Row {
    /// What the retry answered: `OK replayed=true balance=100`, say.
    retry: String,
    /// The retry was a replay of a stored outcome.
    replayed: bool,
    /// DEBIT transactions of 40 on the account.
    debits: i64,
    /// The account's balance afterwards.
    balance: i64,
}

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    run_with(ctx, KillPlan::BetweenCommits).await
}

/// The case under `plan`.
///
/// Errors: setup, a worker or a query failed.
pub async fn run_with(ctx: &mut Ctx, plan: KillPlan) -> anyhow::Result<()> {
    let split_db = ctx.extra_database("split").await?;
    let keys_db = ctx.extra_database("keys").await?;
    let split_url = ctx.database_url()?.replace(ctx.database(), &split_db);
    let keys_url = ctx.database_url()?.replace(ctx.database(), &keys_db);
    let mut split = ctx.connect_to(&split_db).await?;
    let mut own = ctx.connect().await?;
    grant_rows(&mut split, &mut own).await?;

    let key_first = split_row(ctx, plan, &split_url, &keys_url, KEY_FIRST, "key").await?;
    let debit_first = split_row(ctx, plan, &split_url, &keys_url, DEBIT_FIRST, "debit").await?;
    let (before, after) = {
        let before = one_db_row(ctx, &mut own, HookPoint::BeforeCommit, ONE_DB_BEFORE).await?;
        let after = one_db_row(ctx, &mut own, HookPoint::AfterCommit, ONE_DB_AFTER).await?;
        (before, after)
    };
    let rows = Rows {
        key_first,
        debit_first,
        before,
        after,
    };
    note_table(ctx, plan, &rows);
    check_rows(ctx, &rows);
    Ok(())
}

/// The four rows of the table: the split design's two, the single database's two.
struct Rows {
    /// Split design, key committed first.
    key_first: Row,
    /// Split design, debit committed first.
    debit_first: Row,
    /// One database, killed before its commit.
    before: Row,
    /// One database, killed after its commit.
    after: Row,
}

/// Grants [`START_BALANCE`] to the split rows' accounts on the split ledger (`split`)
/// and to the single-database rows' accounts on the case's database (`own`).
async fn grant_rows(
    split: &mut tokio_postgres::Client,
    own: &mut tokio_postgres::Client,
) -> anyhow::Result<()> {
    for (n, (account, _)) in [KEY_FIRST, DEBIT_FIRST].iter().enumerate() {
        grant(split, "ops", &format!("g-220{n}"), account, START_BALANCE).await?;
    }
    for (n, (account, _)) in [ONE_DB_BEFORE, ONE_DB_AFTER].iter().enumerate() {
        grant(own, "ops", &format!("g-221{n}"), account, START_BALANCE).await?;
    }
    Ok(())
}

/// One table, three rows (the single database's two share one), as notes; under
/// [`KillPlan::NoKill`] the kill column says "not killed".
fn note_table(ctx: &mut Ctx, plan: KillPlan, rows: &Rows) {
    let Rows {
        key_first,
        debit_first,
        before,
        after,
    } = rows;
    ctx.note(format!(
        "{:<28} | {:<15} | {:<32} | {:<30} | debits | balance",
        "design", "commits", "killed", "retry"
    ));
    let killed = |what: &str| match plan {
        KillPlan::BetweenCommits => what.to_string(),
        KillPlan::NoKill => "not killed".to_string(),
    };
    ctx.note(format!(
        "{:<28} | {:<15} | {:<32} | {:<30} | {:<6} | {}",
        "key registry in 2nd db",
        "key, then debit",
        killed("key committed, debit not"),
        key_first.retry,
        key_first.debits,
        key_first.balance
    ));
    ctx.note(format!(
        "{:<28} | {:<15} | {:<32} | {:<30} | {:<6} | {}",
        "key registry in 2nd db",
        "debit, then key",
        killed("debit committed, key not"),
        debit_first.retry,
        debit_first.debits,
        debit_first.balance
    ));
    let retries = format!("{} / {}", before.retry, after.retry);
    let debits = format!("{} / {}", before.debits, after.debits);
    let balances = format!("{} / {}", before.balance, after.balance);
    ctx.note(format!(
        "{:<28} | {:<15} | {:<32} | {retries:<30} | {debits:<6} | {balances}",
        "one database (ledger-svc)", "one", "before it / after it",
    ));
}

/// The verdicts: the two split rows' negative controls (a lost debit, a double debit) and
/// the single database's checks (one debit of 40 either way).
fn check_rows(ctx: &mut Ctx, rows: &Rows) {
    let Rows {
        key_first,
        debit_first,
        before,
        after,
    } = rows;
    ctx.exposes(
        KEY_FIRST_ANOMALY,
        key_first.replayed && key_first.debits == 0 && key_first.balance == START_BALANCE,
        format!(
            "retry replayed={} debits={} balance={}",
            key_first.replayed, key_first.debits, key_first.balance
        ),
    );
    ctx.exposes(
        DEBIT_FIRST_ANOMALY,
        !debit_first.replayed && debit_first.debits == 2,
        format!(
            "retry replayed={} debits={} balance={}",
            debit_first.replayed, debit_first.debits, debit_first.balance
        ),
    );
    ctx.check(
        "one database, killed before its commit: the retry executes it, one debit, balance 60",
        !before.replayed && before.debits == 1 && before.balance == START_BALANCE - DEBIT,
        format!(
            "replayed={} debits={} balance={}",
            before.replayed, before.debits, before.balance
        ),
    );
    ctx.check(
        "one database, killed after its commit: the retry replays it, one debit, balance 60",
        after.replayed && after.debits == 1 && after.balance == START_BALANCE - DEBIT,
        format!(
            "replayed={} debits={} balance={}",
            after.replayed, after.debits, after.balance
        ),
    );
}

/// A split-design row: the worker on the split ledger and the registry, committing
/// `commit_first` first; under [`KillPlan::BetweenCommits`] stopped between the commits
/// and SIGKILLed there; then the retry (the same worker, same key, no stop).
async fn split_row(
    ctx: &mut Ctx,
    plan: KillPlan,
    split_url: &str,
    keys_url: &str,
    (account, key): (&str, &str),
    commit_first: &str,
) -> anyhow::Result<Row> {
    let args =
        |stop: bool| split_worker_args(split_url, keys_url, (account, key), commit_first, stop);
    let split = ctx.connect_to(&database_of(split_url)).await?;
    let keys = ctx.connect_to(&database_of(keys_url)).await?;
    match plan {
        KillPlan::BetweenCommits => {
            kill_between_commits(ctx, args(true), &keys, &split, (account, key), commit_first)
                .await?;
        }
        KillPlan::NoKill => {
            let (result, end) = run_to_end(args(false)).await?;
            ctx.note(format!(
                "{commit_first} first, not killed: {result} ({end})"
            ));
        }
    }
    retry_row(ctx, args(false), &split, account, commit_first).await
}

/// The crash-worker's arguments for the split design: the debit of [`DEBIT`] with `key`
/// from `account` on the split ledger, the registry at `keys_url`, `commit_first` first,
/// and, if `stop`, a stop between the two commits.
fn split_worker_args(
    split_url: &str,
    keys_url: &str,
    (account, key): (&str, &str),
    commit_first: &str,
    stop: bool,
) -> Vec<String> {
    let mut args = WorkerSpec {
        database_url: split_url.to_string(),
        client_id: CLIENT.into(),
        idem_key: key.into(),
        account: account.into(),
        amount: DEBIT,
        stop_at: HookPoint::BeforeCommit,
        pause_limit_ms: None,
    }
    .args();
    args.extend([
        "--registry-database-url".to_string(),
        keys_url.to_string(),
        "--commit-first".into(),
        commit_first.into(),
    ]);
    if stop {
        args.push("--stop-between-commits".into());
    }
    args
}

/// Launches the split design's worker with `args` (stopping between its commits), notes
/// what the registry (`keys`) and the split ledger (`split`) hold there, SIGKILLs it and
/// checks it ended by signal 9.
async fn kill_between_commits(
    ctx: &mut Ctx,
    args: Vec<String>,
    keys: &tokio_postgres::Client,
    split: &tokio_postgres::Client,
    (account, key): (&str, &str),
    commit_first: &str,
) -> anyhow::Result<()> {
    let mut worker = CrashWorker::launch(args)?;
    let paused = worker.wait_paused().await?;
    ctx.note(format!(
        "{commit_first} first: paused between the commits backend_pid={}",
        paused.backend_pid()?
    ));
    let registered: Option<String> = keys
        .query_opt(
            "SELECT outcome FROM idem_registry WHERE client_id = $1 AND idem_key = $2",
            &[&CLIENT, &key],
        )
        .await?
        .map(|row| row.get(0));
    let balance = queries::existing_balance(split, account).await?;
    ctx.note(format!(
        "{commit_first} first, between the commits: key={} balance={balance}",
        registered.as_deref().unwrap_or("none")
    ));
    let end = worker.kill().await?;
    ctx.check_eq(
        format!("{commit_first} first: the worker's shell status (128 + 9)"),
        137,
        end.shell_status(),
    );
    Ok(())
}

/// The retry: the same worker run to the end with `args` (no stop); checks it exited 0
/// and reads the row off the split ledger (`split`). The retry's answer keeps no txn id.
async fn retry_row(
    ctx: &mut Ctx,
    args: Vec<String>,
    split: &tokio_postgres::Client,
    account: &str,
    commit_first: &str,
) -> anyhow::Result<Row> {
    let (retry, end) = run_to_end(args).await?;
    ctx.check_eq(
        format!("{commit_first} first: the retry's worker exited 0"),
        0,
        end,
    );
    let retry = retry
        .strip_prefix("RESULT outcome=")
        .unwrap_or(&retry)
        .to_string();
    // `OK replayed=… balance=…[ txn_id=…]`: the txn id varies, keep it out.
    let retry: String = retry
        .split_whitespace()
        .filter(|word| !word.starts_with("txn_id="))
        .collect::<Vec<_>>()
        .join(" ");
    Ok(Row {
        replayed: retry.contains("replayed=true"),
        retry,
        debits: queries::debits_of(split, account, DEBIT).await?,
        balance: queries::existing_balance(split, account).await?,
    })
}

/// A single-database row: the crash-worker's default path (`points_ledger::transfer`)
/// stopped at `stop_at` and SIGKILLed, then the same-key retry in this process.
async fn one_db_row(
    ctx: &mut Ctx,
    own: &mut tokio_postgres::Client,
    stop_at: HookPoint,
    (account, key): (&str, &str),
) -> anyhow::Result<Row> {
    let spec = WorkerSpec {
        database_url: ctx.database_url()?,
        client_id: CLIENT.into(),
        idem_key: key.into(),
        account: account.into(),
        amount: DEBIT,
        stop_at,
        pause_limit_ms: None,
    };
    let mut worker = CrashWorker::launch(spec.args())?;
    worker.wait_paused().await?;
    let end = worker.kill().await?;
    ctx.check_eq(
        format!("one database, stopped at {stop_at}: the worker's shell status (128 + 9)"),
        137,
        end.shell_status(),
    );
    let result = debit(own, CLIENT, key, account, DEBIT).await?;
    Ok(Row {
        retry: format!(
            "{} replayed={} balance={}",
            result.outcome, result.replayed, result.balance
        ),
        replayed: result.replayed,
        debits: queries::debits_of(own, account, DEBIT).await?,
        balance: queries::existing_balance(own, account).await?,
    })
}

/// Runs a worker that does not stop to its end: its `RESULT …` line and exit status.
///
/// Errors: it printed no line or did not end within [`WORKER_FINISH_LIMIT_MS`].
async fn run_to_end(args: Vec<String>) -> anyhow::Result<(String, i32)> {
    let limit = Duration::from_millis(WORKER_FINISH_LIMIT_MS);
    let mut worker = CrashWorker::launch(args)?;
    let line = worker.next_line(limit).await?.unwrap_or_default();
    let end = worker.wait(limit).await?;
    if end.shell_status() != 0 {
        anyhow::bail!(
            "the worker {end}: {line}; stderr: {}",
            worker.stderr().trim()
        );
    }
    Ok((line, end.shell_status()))
}

/// The database name at the end of a connection URL.
fn database_of(url: &str) -> String {
    url.rsplit('/')
        .next()
        .unwrap_or_default()
        .split('?')
        .next()
        .unwrap_or_default()
        .to_string()
}
