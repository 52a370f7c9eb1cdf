//! `crash-worker`: runs one ledger transfer (`points_ledger::transfer`, SPEC §3) and stops
//! inside it at a named hook point, so that a parent process can kill it there with a real
//! signal (SPEC §6, L9).
//!
//! Protocol with the parent (`launch::worker` is the other side):
//!
//! - At the stop point the worker prints exactly one line, `PAUSED_IN_TX backend_pid=<pid>`
//!   (the PostgreSQL backend serving its connection), flushes stdout and waits. Before
//!   `after-commit` the transaction is open and holds its row and key locks meanwhile; at
//!   `after-commit` it is already committed (the marker keeps its name).
//! - The wait is bounded by `--pause-limit-ms` (default [`PAUSE_LIMIT_MS`]). When nobody
//!   killed the worker by then, it aborts the transfer (rolled back, except at
//!   `after-commit`) and exits with [`EXIT_PAUSE_LIMIT`], so it can never hang a run.
//! - Everything else (connecting, statements, waiting for locks) is bounded by
//!   [`WORK_LIMIT_MS`] on top of the pause; past that the exit status is [`EXIT_WORK_LIMIT`].
//! - A transfer that never passes the stop point (a replay, or a refusal that skips
//!   `entries-written`) completes: the worker prints `RESULT outcome=… replayed=…
//!   balance=… txn_id=…` and exits 0. Errors exit [`EXIT_FAILED`]; usage errors exit 2.
//!
//! The parent should start it with a parent-death signal
//! (`scratch_pg::process::spawn_tied`), so it never outlives the harness.
//!
//! With `--registry-database-url URL --commit-first key|debit` the worker runs the naive
//! split-registry design of case L22 instead (keys in another database, two commits; see
//! [`split_registry`]); the default path is unchanged.
//!
//! `crash-worker sqlite …` is the same worker on an SQLite inventory file instead (SPEC §9,
//! cases S5–S7): see [`sqlite`]. `crash-worker spot …` runs one order placement of the
//! frozen-balances system instead (SPEC §8, case F12): see [`spot`].

use std::future::Future;
use std::io::Write;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use points_ledger::{
    HookAbort, HookContext, HookPoint, Hooks, Kind, LedgerError, TransferRequest, transfer,
};

mod split_registry;
mod spot;
mod sqlite;

/// Default bound of the pause at the stop point, in milliseconds.
pub(crate) const PAUSE_LIMIT_MS: u64 = 60_000;
/// Bound of everything except the pause (connect, statements, lock waits), in milliseconds.
pub(crate) const WORK_LIMIT_MS: u64 = 30_000;
/// Connect timeout of the worker's one connection, in milliseconds.
const CONNECT_TIMEOUT_MS: u64 = 10_000;
/// First word of the line printed at the stop point.
pub(crate) const PAUSED_MARKER: &str = "PAUSED_IN_TX";
/// `application_name` of the worker's session, visible in `pg_stat_activity`.
const APPLICATION_NAME: &str = "crash-worker";

/// Exit status: a database or connection error.
pub(crate) const EXIT_FAILED: i32 = 1;
/// Exit status: paused for the whole pause limit without being killed.
pub(crate) const EXIT_PAUSE_LIMIT: i32 = 3;
/// Exit status: the work around the pause took longer than [`WORK_LIMIT_MS`].
pub(crate) const EXIT_WORK_LIMIT: i32 = 4;

/// Runs one transfer and stops inside it at a named hook point until killed.
#[derive(Debug, Parser)]
#[command(
    name = "crash-worker",
    version,
    after_help = "SQLite mode (an inventory file instead of a ledger): crash-worker sqlite --help\n\
                  Spot mode (one order placement): crash-worker spot --help"
)]
struct Args {
    /// Connection URL, e.g. postgresql://postgres@127.0.0.1:5432/case_l9.
    #[arg(long)]
    database_url: String,
    /// Client id (scopes the idempotency key).
    #[arg(long)]
    client_id: String,
    /// Idempotency key.
    #[arg(long)]
    key: String,
    /// The user account: debited for DEBIT, credited for GRANT.
    #[arg(long)]
    account: String,
    /// Points to move (a positive integer).
    #[arg(long)]
    amount: i64,
    /// DEBIT (account -> sys-redeem) or GRANT (sys-issuer -> account).
    #[arg(long, default_value = "DEBIT")]
    kind: Kind,
    /// Hook point to stop at: registered, entries-written, before-commit, after-commit.
    #[arg(long, default_value = "before-commit")]
    stop_at: HookPoint,
    /// How long to wait at the stop point before giving up, in milliseconds.
    #[arg(long, default_value_t = PAUSE_LIMIT_MS)]
    pause_limit_ms: u64,
    /// Split-registry mode (case L22, a naive design): keep the idempotency key in this
    /// other database of the cluster instead of the ledger's, so key and debit are two
    /// transactions; DEBIT only; `--stop-at` does not apply (see `--stop-between-commits`).
    #[arg(long, requires = "commit_first")]
    registry_database_url: Option<String>,
    /// Split-registry mode: which transaction commits first, the registry's `key` or the
    /// ledger's `debit`.
    #[arg(long, value_enum, requires = "registry_database_url")]
    commit_first: Option<split_registry::CommitFirst>,
    /// Split-registry mode: after the first commit, print `PAUSED_IN_TX backend_pid=<pid>`
    /// (the ledger's backend) and wait to be killed before the second.
    #[arg(long, requires = "registry_database_url")]
    stop_between_commits: bool,
}

fn main() {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if argv.get(1).is_some_and(|word| word == "sqlite") {
        std::process::exit(sqlite::main(argv));
    }
    if argv.get(1).is_some_and(|word| word == "spot") {
        std::process::exit(spot::main(argv));
    }
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let code = runtime.block_on(run(&args));
    drop(runtime);
    std::process::exit(code);
}

async fn run(args: &Args) -> i32 {
    let limit_ms = args.pause_limit_ms.saturating_add(WORK_LIMIT_MS);
    match tokio::time::timeout(Duration::from_millis(limit_ms), work(args)).await {
        Ok(Ok(code)) => code,
        Ok(Err(error)) => {
            eprintln!("crash-worker: {error:#}");
            EXIT_FAILED
        }
        Err(_) => {
            eprintln!("crash-worker: gave up after limit_ms={limit_ms}");
            EXIT_WORK_LIMIT
        }
    }
}

/// Opens the worker's one connection (`application_name` [`APPLICATION_NAME`]) and
/// returns it with the pid of the backend serving it.
///
/// Errors: a bad URL, the connection or the query failed.
pub(crate) async fn connect(database_url: &str) -> anyhow::Result<(tokio_postgres::Client, i32)> {
    let mut config: tokio_postgres::Config =
        database_url.parse().context("parsing --database-url")?;
    config
        .application_name(APPLICATION_NAME)
        .connect_timeout(Duration::from_millis(CONNECT_TIMEOUT_MS));
    let (client, connection) = config
        .connect(tokio_postgres::NoTls)
        .await
        .context("connecting")?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let backend_pid: i32 = client
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .context("reading the backend pid")?
        .get(0);
    Ok((client, backend_pid))
}

async fn work(args: &Args) -> anyhow::Result<i32> {
    if let (Some(registry_url), Some(commit_first)) =
        (&args.registry_database_url, args.commit_first)
    {
        anyhow::ensure!(
            args.kind == Kind::Debit,
            "the split-registry mode runs debits only"
        );
        return split_registry::run(&split_registry::SplitArgs {
            ledger_url: &args.database_url,
            registry_url,
            client_id: &args.client_id,
            key: &args.key,
            account: &args.account,
            amount: args.amount,
            commit_first,
            stop_between_commits: args.stop_between_commits,
            pause_limit_ms: args.pause_limit_ms,
        })
        .await;
    }
    let (mut client, backend_pid) = connect(&args.database_url).await?;

    let request = match args.kind {
        Kind::Debit => {
            TransferRequest::debit(&args.client_id, &args.key, &args.account, args.amount)
        }
        Kind::Grant => {
            TransferRequest::grant(&args.client_id, &args.key, &args.account, args.amount)
        }
        Kind::Transfer => anyhow::bail!("the crash-worker runs debits and grants only"),
    };
    let hooks = StopAt {
        point: args.stop_at,
        stop: Stop::new(backend_pid, args.pause_limit_ms),
    };
    match transfer(&mut client, &request, &hooks).await {
        Ok(result) => {
            let txn_id = result
                .txn_id
                .map(|id| format!(" txn_id={id}"))
                .unwrap_or_default();
            println!(
                "RESULT outcome={} replayed={} balance={}{txn_id}",
                result.outcome, result.replayed, result.balance
            );
            Ok(0)
        }
        Err(LedgerError::HookAborted(point)) if hooks.stop.waited_out() => {
            let state = if point == HookPoint::AfterCommit {
                "the transfer stays committed"
            } else {
                "the transaction was rolled back"
            };
            eprintln!(
                "crash-worker: not killed within pause_limit_ms={} at {point}; {state}",
                args.pause_limit_ms
            );
            Ok(EXIT_PAUSE_LIMIT)
        }
        Err(error) => Err(error).context("transfer"),
    }
}

/// The stop at a hook point, whatever the system: print the marker line with the
/// backend's pid, then wait up to the pause limit (the parent kills the worker meanwhile).
pub(crate) struct Stop {
    backend_pid: i32,
    pause: Duration,
    /// Set when the whole pause passed without the process being killed.
    waited_out: AtomicBool,
}

impl Stop {
    /// A stop that announces `backend_pid` and waits `pause_limit_ms`.
    pub(crate) fn new(backend_pid: i32, pause_limit_ms: u64) -> Stop {
        Stop {
            backend_pid,
            pause: Duration::from_millis(pause_limit_ms),
            waited_out: AtomicBool::new(false),
        }
    }

    /// Prints `PAUSED_IN_TX backend_pid=<pid>` and waits; `Err` with the reason to abort
    /// when the pause ran out or nobody reads stdout any more.
    pub(crate) async fn pause(&self) -> Result<(), &'static str> {
        let announced = {
            let mut out = std::io::stdout().lock();
            writeln!(out, "{PAUSED_MARKER} backend_pid={}", self.backend_pid)
                .and_then(|()| out.flush())
        };
        // The parent closed our stdout: nobody is watching, so do not wait.
        if announced.is_err() {
            return Err("stdout closed; parent gone");
        }
        tokio::time::sleep(self.pause).await;
        self.waited_out.store(true, Ordering::SeqCst);
        Err("pause limit reached")
    }

    /// Whether the whole pause passed without a kill.
    pub(crate) fn waited_out(&self) -> bool {
        self.waited_out.load(Ordering::SeqCst)
    }
}

/// What a hook returns, in both systems: a boxed future that may be sent between threads
/// (the type of futures-util's `BoxFuture`, written with the standard library's own types).
type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Hooks that stop at one point of a transfer.
struct StopAt {
    point: HookPoint,
    stop: Stop,
}

impl Hooks for StopAt {
    fn at<'a>(&'a self, ctx: HookContext<'a>) -> BoxFuture<'a, Result<(), HookAbort>> {
        Box::pin(async move {
            if ctx.point != self.point {
                return Ok(());
            }
            self.stop.pause().await.map_err(HookAbort::new)
        })
    }
}
