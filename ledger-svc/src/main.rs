//! `ledger-svc`: the points ledger as an HTTP service (SPEC §4), on hyper 1.x.
//!
//! Two listeners: the public one (health, balance, debits) and the admin one (health,
//! grants, and, with `--enable-fault-injection`, the fault routes). At start it prints one
//! line on stdout with the bound addresses, e.g.
//! `listening on 127.0.0.1:40123 admin 127.0.0.1:40124`; everything else goes to stderr,
//! first a line with the settings, among them `auth=tokens` (callers authenticate with
//! `--auth-tokens`, see `http::auth`) or `auth=off` (`X-Client-Id` trusted as declared,
//! the admin listener open to whoever reaches it).
//!
//! On SIGTERM or SIGINT it stops accepting, lets in-flight requests and transfers finish
//! for at most `--shutdown-grace-ms`, and exits: status 0 when everything drained,
//! [`EXIT_GRACE_EXCEEDED`] when the grace period ran out (open transactions then end with
//! the process, and PostgreSQL rolls them back). [`EXIT_STARTUP_FAILED`] when it could not
//! start (bad URL, address in use).

mod http;
mod pooler;
mod session;

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use deadpool_postgres::{Hook, HookError, Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::task::TaskTracker;

use crate::http::auth::TokenTable;
use crate::http::faults::FaultHooks;
use crate::http::listener::Listener;
use crate::http::state::{AppState, pool_wait_timeout};

/// Default number of pooled database connections.
const DEFAULT_POOL_SIZE: usize = 16;
/// Default longest wait for in-flight requests at shutdown, milliseconds.
const DEFAULT_SHUTDOWN_GRACE_MS: u64 = 5_000;
/// Connect timeout for a new database connection when the URL sets none, milliseconds.
const DB_CONNECT_TIMEOUT_MS: u64 = 5_000;
/// Longest verification round trip of a pooled connection, milliseconds; then the
/// connection is dropped and another one is taken or made.
const POOL_RECYCLE_TIMEOUT_MS: u64 = 5_000;
/// A pooled connection idle at least this long is verified with a round trip before it
/// is handed out; one used more recently is handed out after the driver's own check
/// (its socket is not closed), without a round trip. Milliseconds.
const POOL_VERIFY_IDLE_MS: u64 = 1_000;
/// `application_name` of the service's sessions (visible in `pg_stat_activity`).
const APPLICATION_NAME: &str = "ledger-svc";
/// Default longest wait of a service session for a lock (`lock_timeout`), milliseconds;
/// then the statement fails with SQLSTATE 55P03, the transfer rolls back and the client
/// gets 503 `UNKNOWN` with `Retry-After`. PostgreSQL docs, 20.11.2 "Statement Behavior".
const DEFAULT_LOCK_TIMEOUT_MS: u64 = 5_000;
/// Default longest run of one statement of a service session (`statement_timeout`),
/// milliseconds; then SQLSTATE 57014, rolled back, 503 `UNKNOWN`.
const DEFAULT_STATEMENT_TIMEOUT_MS: u64 = 10_000;
/// Default longest idle time of a service session inside an open transaction
/// (`idle_in_transaction_session_timeout`), milliseconds; then the server ends the
/// session (SQLSTATE 25P03) and rolls the transaction back, which frees its row locks
/// even when the service process itself is frozen.
const DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT_MS: u64 = 10_000;
/// Default interval between two key-retention sweeps, milliseconds (only with
/// `--key-retention-ms`).
const DEFAULT_KEY_SWEEP_INTERVAL_MS: u64 = 60_000;
/// Exit status when the shutdown grace period ran out before everything drained.
const EXIT_GRACE_EXCEEDED: i32 = 1;
/// Exit status of `--repair` when findings remain after the repair.
const EXIT_REPAIR_UNRESOLVED: i32 = 3;
/// Exit status when the service could not start.
const EXIT_STARTUP_FAILED: i32 = 2;

/// The points ledger over HTTP (SPEC §4).
#[derive(Debug, Parser)]
#[command(name = "ledger-svc", version)]
struct Args {
    /// PostgreSQL URL of the ledger database, e.g. postgresql://postgres@127.0.0.1:5432/ledger.
    #[arg(long)]
    database_url: String,
    /// Public listen address (port 0: any free port; the bound one is printed).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Admin listen address: grants and fault injection (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    admin_listen: SocketAddr,
    /// Number of pooled database connections.
    #[arg(long, default_value_t = DEFAULT_POOL_SIZE)]
    pool_size: usize,
    /// Threads that run requests: 0 (default) one per core (tokio's multi-thread
    /// scheduler); 1 a single-threaded runtime (tokio's current-thread scheduler: no
    /// wakeups between threads, the cheapest per request when PostgreSQL shares the few
    /// cores, see `./run.sh bench`); N > 1 that many.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u16).range(0..=1024))]
    worker_threads: u16,
    /// Serve the fault routes on the admin listener (otherwise they do not exist: 404).
    /// With `--auth-tokens` they also need an admin caller's token.
    #[arg(long)]
    enable_fault_injection: bool,
    /// Authenticate callers by bearer token: FILE lists one caller per line,
    /// `<sha256-hex of the token> <client-id> <yes|no: may use the admin listener>`
    /// (`#` comments and blank lines ignored). The caller's id then scopes the keys, an
    /// `X-Client-Id` must match it (else 403), a missing or unknown token is 401, and the
    /// admin listener needs an admin token. A line from a token:
    /// `printf '%s %s no\n' "$(printf '%s' "$TOKEN" | sha256sum | cut -d' ' -f1)" app-a`.
    /// Without it: no authentication (`X-Client-Id` trusted as declared).
    #[arg(long, value_name = "FILE")]
    auth_tokens: Option<PathBuf>,
    /// Longest wait for in-flight requests on SIGTERM/SIGINT, milliseconds.
    #[arg(long, default_value_t = DEFAULT_SHUTDOWN_GRACE_MS)]
    shutdown_grace_ms: u64,
    /// Credit debits to K redemption stripes `sys-redeem-NN` instead of the one
    /// `sys-redeem` row (0 or 1: the SPEC §3 design). Created at start if missing. Keep K
    /// fixed for a database: the stripe is part of a request's fingerprint.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=points_ledger::striping::MAX_REDEEM_STRIPES as i64))]
    redeem_stripes: u32,
    /// Do not serve: run the repair once on the database (freeze the accounts the
    /// findings name, append adjustments, rewrite cached balances from the entries,
    /// re-check, unfreeze when clean; `points_ledger::repair`), print its report as JSON on
    /// stdout and exit: 0 when the ledger ends clean, [`EXIT_REPAIR_UNRESOLVED`] when
    /// findings remain (the accounts then stay frozen).
    #[arg(long)]
    repair: bool,
    /// The bound of one request, milliseconds (at least 1): every debit, grant, transfer
    /// and spot event is answered within it, also when it queues behind other waiters
    /// (for a pooled connection, for a row lock held by a waiter that waits in turn).
    /// When it runs out, the running statement is cancelled, the transaction rolls back
    /// and the answer is 503 `UNKNOWN` (`request-timeout`) with nothing recorded; time
    /// held at an armed fault point does not count. See `http::bound`.
    #[arg(long, default_value_t = http::bound::DEFAULT_REQUEST_TIMEOUT_MS, value_parser = clap::value_parser!(u64).range(1..=i32::MAX as u64))]
    request_timeout_ms: u64,
    /// `lock_timeout` of the service's sessions, milliseconds (at least 1).
    #[arg(long, default_value_t = DEFAULT_LOCK_TIMEOUT_MS, value_parser = clap::value_parser!(u64).range(1..=i32::MAX as u64))]
    lock_timeout_ms: u64,
    /// `statement_timeout` of the service's sessions, milliseconds (at least 1).
    #[arg(long, default_value_t = DEFAULT_STATEMENT_TIMEOUT_MS, value_parser = clap::value_parser!(u64).range(1..=i32::MAX as u64))]
    statement_timeout_ms: u64,
    /// `idle_in_transaction_session_timeout` of the service's sessions, milliseconds (at
    /// least 1). A fault that holds a transaction longer than this ends with the session.
    #[arg(long, default_value_t = DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT_MS, value_parser = clap::value_parser!(u64).range(1..=i32::MAX as u64))]
    idle_in_transaction_timeout_ms: u64,
    /// Keep each idempotency record's response this long, milliseconds; then a sweep
    /// leaves a tombstone and the key answers 422 KEY_EXPIRED. 0 (default): keep forever.
    #[arg(long, default_value_t = 0)]
    key_retention_ms: u64,
    /// Interval between two retention sweeps, milliseconds (at least 1; only with
    /// `--key-retention-ms`).
    #[arg(long, default_value_t = DEFAULT_KEY_SWEEP_INTERVAL_MS, value_parser = clap::value_parser!(u64).range(1..))]
    key_sweep_interval_ms: u64,
    /// How debits and grants reach the database: `statements` (SPEC §3 as written: one
    /// transaction of separate statements, every hook point) or `onetrip` (the same work
    /// in one statement, `points_ledger::transfer_onetrip`; only the `after-commit` fault
    /// point exists, the others are refused with 409).
    #[arg(long, default_value = "statements")]
    transfer_mode: points_ledger::TransferMode,
    /// The database URL names a transaction pooler (PgBouncer, `pool_mode = transaction`):
    /// the service sends no startup `options` (the pooler refuses them), so its session
    /// bounds (`--lock-timeout-ms`, `--statement-timeout-ms`,
    /// `--idle-in-transaction-timeout-ms`, READ COMMITTED) must be the database's own; it
    /// reads them back at start and refuses to start, naming the `ALTER DATABASE` to run,
    /// when one differs. Its statements are unnamed in either case. See `pooler`.
    #[arg(long)]
    behind_transaction_pooler: bool,
    /// In `--transfer-mode batch`: most debits and grants one batch takes from the queue.
    #[arg(long, default_value_t = points_ledger::batcher::BATCH_MAX_REQUESTS as u64, value_parser = clap::value_parser!(u64).range(1..=4096))]
    batch_max_requests: u64,
    /// In `--transfer-mode batch`: drainers, each executing one batch at a time on one
    /// pooled connection, each draining its own lane (`points_ledger::batcher::lane_of`:
    /// the lane of a request's system account). Side by side only over
    /// `--redeem-stripes` (best as many as drainers): with the one sink, one drainer
    /// executes every debit.
    #[arg(long, default_value_t = points_ledger::batcher::BATCH_DRAINERS as u64, value_parser = clap::value_parser!(u64).range(1..=64))]
    batch_drainers: u64,
    /// A deliberate bug, for `./run.sh explore --planted-bug` (it proves the explorer's
    /// checker can fail) and R2's negative control only; see `http::planted`. Off by
    /// default.
    #[arg(long, value_enum)]
    planted_bug: Option<http::planted::PlantedBug>,
}

fn main() {
    let args = Args::parse();
    http::log::init();
    let mut builder = match args.worker_threads {
        1 => tokio::runtime::Builder::new_current_thread(),
        _ => tokio::runtime::Builder::new_multi_thread(),
    };
    if args.worker_threads > 1 {
        builder.worker_threads(usize::from(args.worker_threads));
    }
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("ledger-svc: cannot start the runtime: {error}");
            std::process::exit(EXIT_STARTUP_FAILED);
        }
    };
    let code = runtime.block_on(run(args));
    // Cancels transfers still running after the grace period; their connections close and
    // PostgreSQL rolls their transactions back.
    runtime.shutdown_timeout(Duration::from_millis(100));
    std::process::exit(code);
}

/// Starts the service (or one `--repair`), serves until SIGTERM or SIGINT, and returns
/// the exit status: [`EXIT_STARTUP_FAILED`] when it could not start, else what
/// [`shutdown`] says.
async fn run(args: Args) -> i32 {
    let (pool, database) = match build_pool(&args) {
        Ok(pool) => pool,
        Err(error) => {
            eprintln!("ledger-svc: {error:#}");
            return EXIT_STARTUP_FAILED;
        }
    };
    if args.behind_transaction_pooler {
        let wanted = pooler::wanted_bounds(
            args.lock_timeout_ms,
            args.statement_timeout_ms,
            args.idle_in_transaction_timeout_ms,
        );
        if let Err(error) = pooler::check_bounds(&pool, &database, &wanted).await {
            eprintln!("ledger-svc: {error}");
            return EXIT_STARTUP_FAILED;
        }
    }
    if args.repair {
        return run_repair(&pool).await;
    }
    let started = match start(&args, pool).await {
        Ok(started) => started,
        Err(error) => {
            eprintln!("ledger-svc: {error}");
            return EXIT_STARTUP_FAILED;
        }
    };
    let Started {
        state,
        public,
        admin,
        public_addr,
        admin_addr,
    } = started;
    print_settings(&args, &database, &state);
    {
        let mut stdout = std::io::stdout().lock();
        let _ = writeln!(stdout, "listening on {public_addr} admin {admin_addr}");
        let _ = stdout.flush();
    }
    let (stop, stopped) = watch::channel(false);
    let public_loop = tokio::spawn(http::server::serve(
        public,
        Listener::Public,
        state.clone(),
        stopped.clone(),
    ));
    let admin_loop = tokio::spawn(http::server::serve(
        admin,
        Listener::Admin,
        state.clone(),
        stopped,
    ));
    let signal = wait_for_signal().await;
    eprintln!("ledger-svc: {signal} received; shutting down");
    let _ = stop.send(true);
    let grace = Duration::from_millis(args.shutdown_grace_ms);
    shutdown(public_loop, admin_loop, &state, grace).await
}

/// A started service: its state and its two bound listeners with their addresses.
struct Started {
    state: Arc<AppState>,
    public: TcpListener,
    admin: TcpListener,
    public_addr: SocketAddr,
    admin_addr: SocketAddr,
}

/// Everything that may fail at start, in order: the token file, the two listeners and
/// their addresses, the redemption stripes; then the key sweep is started. The error is
/// the start-up line's text (without the `ledger-svc: ` prefix).
async fn start(args: &Args, pool: Pool) -> Result<Started, String> {
    let auth = match &args.auth_tokens {
        Some(path) => Some(Arc::new(TokenTable::load(path).map_err(|e| e.to_string())?)),
        None => None,
    };
    let (public, admin) = bind(args).await.map_err(|error| format!("{error:#}"))?;
    let (public_addr, admin_addr) = match (public.local_addr(), admin.local_addr()) {
        (Ok(p), Ok(a)) => (p, a),
        (Err(error), _) | (_, Err(error)) => {
            return Err(format!("cannot read the bound address: {error}"));
        }
    };
    let faults = args
        .enable_fault_injection
        .then(|| Arc::new(FaultHooks::new()));
    let batcher = (args.transfer_mode == points_ledger::TransferMode::Batch).then(|| {
        let limits = points_ledger::batcher::BatchLimits {
            max_requests: args.batch_max_requests as usize,
            drainers: args.batch_drainers as usize,
        };
        http::batch::start(
            pool.clone(),
            faults.clone(),
            limits,
            !args.behind_transaction_pooler,
        )
    });
    let state = Arc::new(AppState {
        pool,
        faults,
        tasks: TaskTracker::new(),
        redeem_stripes: args.redeem_stripes,
        transfer_mode: args.transfer_mode,
        batcher,
        planted_bug: args.planted_bug,
        auth,
        request_timeout_ms: args.request_timeout_ms,
        cancels_at_bound: !args.behind_transaction_pooler,
    });
    if let Some(bug) = args.planted_bug {
        eprintln!("ledger-svc: PLANTED BUG {bug:?} is on (for ./run.sh explore only)");
    }
    if args.redeem_stripes > 1 {
        let created = match state.pool.get().await {
            Ok(client) => {
                points_ledger::striping::create_redeem_stripes(&client, args.redeem_stripes)
                    .await
                    .map_err(|error| error.to_string())
            }
            Err(error) => Err(error.to_string()),
        };
        if let Err(error) = created {
            return Err(format!("cannot create the redemption stripes: {error}"));
        }
    }
    if args.key_retention_ms > 0 {
        tokio::spawn(sweep_keys(
            state.pool.clone(),
            args.key_retention_ms,
            Duration::from_millis(args.key_sweep_interval_ms),
        ));
    }
    Ok(Started {
        state,
        public,
        admin,
        public_addr,
        admin_addr,
    })
}

/// The settings line on stderr, then one line per token-table fact.
fn print_settings(args: &Args, database: &str, state: &AppState) {
    eprintln!(
        "ledger-svc: database={database} pool_size={} worker_threads={} redeem_stripes={} \
         request_timeout_ms={} lock_timeout_ms={} statement_timeout_ms={} idle_in_transaction_timeout_ms={} key_retention_ms={} \
         transfer_mode={} batch_max_requests={} batch_drainers={} fault_injection={} auth={}",
        args.pool_size,
        match args.worker_threads {
            0 => "per-core".to_owned(),
            n => n.to_string(),
        },
        args.redeem_stripes,
        args.request_timeout_ms,
        args.lock_timeout_ms,
        args.statement_timeout_ms,
        args.idle_in_transaction_timeout_ms,
        args.key_retention_ms,
        args.transfer_mode,
        args.batch_max_requests,
        args.batch_drainers,
        if args.enable_fault_injection {
            "on"
        } else {
            "off"
        },
        match &state.auth {
            Some(table) => format!(
                "tokens(callers={} admins={})",
                table.callers(),
                table.admins()
            ),
            None => "off(X-Client-Id and X-Tenant-Id trusted as declared, admin listener \
                     unauthenticated)"
                .into(),
        }
    );
    if let Some(table) = &state.auth {
        for line in table.describe() {
            eprintln!("ledger-svc: {line}");
        }
    }
}

/// `--repair`: one repair, its report on stdout.
async fn run_repair(pool: &Pool) -> i32 {
    let mut client = match pool.get().await {
        Ok(client) => client,
        Err(error) => {
            eprintln!("ledger-svc: no database connection: {error}");
            return EXIT_STARTUP_FAILED;
        }
    };
    match points_ledger::repair(&mut client, &points_ledger::NoRepairHooks).await {
        Ok(report) => {
            println!(
                "{}",
                serde_json::to_string_pretty(&report).unwrap_or_default()
            );
            if report.after.is_clean() {
                0
            } else {
                EXIT_REPAIR_UNRESOLVED
            }
        }
        Err(error) => {
            eprintln!("ledger-svc: repair failed: {error}");
            EXIT_REPAIR_UNRESOLVED
        }
    }
}

fn build_pool(args: &Args) -> anyhow::Result<(Pool, String)> {
    let mut config: tokio_postgres::Config = args
        .database_url
        .parse()
        .map_err(|_| anyhow::anyhow!("--database-url is not a valid PostgreSQL URL"))?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(Duration::from_millis(DB_CONNECT_TIMEOUT_MS));
    }
    if config.get_application_name().is_none() {
        config.application_name(APPLICATION_NAME);
    }
    // The bounds of every service session, set at connection start (the startup packet's
    // `options`, PostgreSQL docs 20.1.4 "Parameter Interaction via the Shell"), so no
    // session of the pool ever runs without them; other sessions are not affected.
    // The isolation level too: the one-trip transfer runs in an implicit transaction,
    // which takes the session's default (it refuses any but READ COMMITTED).
    let bounds = format!(
        "-c lock_timeout={} -c statement_timeout={} -c idle_in_transaction_session_timeout={} \
         -c default_transaction_isolation=read\\ committed",
        args.lock_timeout_ms, args.statement_timeout_ms, args.idle_in_transaction_timeout_ms
    );
    // Behind a transaction pooler the bounds are the database's own (checked at start,
    // `pooler::check_bounds`): PgBouncer refuses a startup packet with `options`.
    if !args.behind_transaction_pooler {
        let options = match config.get_options() {
            Some(existing) if !existing.is_empty() => format!("{existing} {bounds}"),
            _ => bounds,
        };
        config.options(&options);
    }
    let database = config.get_dbname().unwrap_or("(default)").to_owned();
    // Fast: a connection whose socket the driver saw closed (an immediate restart of the
    // server closes them all) is dropped and replaced, never handed out; no round trip.
    // A connection idle for POOL_VERIFY_IDLE_MS or longer is also verified with one
    // (`verify_idle`), which catches a connection that died while nobody used it; under
    // load connections are reused within milliseconds and never pay for it. A request on
    // a connection that dies anyway gets 503 UNKNOWN, and the dead connection is dropped.
    // Every session ends at a server WARNING, so a COMMIT whose wait for the synchronous
    // standby was cancelled is never answered as committed (`session`).
    let sessions = session::WarningEndsSession {
        trust_warnings: args.planted_bug == Some(http::planted::PlantedBug::TrustCancelledCommit),
    };
    let manager = Manager::from_connect(
        config,
        sessions,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    let pool = Pool::builder(manager)
        .max_size(args.pool_size)
        .wait_timeout(Some(pool_wait_timeout()))
        .create_timeout(Some(Duration::from_millis(DB_CONNECT_TIMEOUT_MS)))
        .recycle_timeout(Some(Duration::from_millis(POOL_RECYCLE_TIMEOUT_MS)))
        .pre_recycle(Hook::async_fn(|client, metrics| {
            Box::pin(verify_idle(client, metrics.last_used()))
        }))
        .runtime(Runtime::Tokio1)
        .build()
        .map_err(|error| anyhow::anyhow!("cannot build the connection pool: {error}"))?;
    Ok((pool, database))
}

/// The pool's check before it hands out a connection last handed out `idle` ago: none
/// below [`POOL_VERIFY_IDLE_MS`] (the pool's Fast check already refused a closed one);
/// from there, an empty query answered within [`POOL_RECYCLE_TIMEOUT_MS`], else the
/// connection is dropped and the pool takes or makes another.
async fn verify_idle(
    client: &mut deadpool_postgres::ClientWrapper,
    idle: Duration,
) -> Result<(), HookError> {
    if idle < Duration::from_millis(POOL_VERIFY_IDLE_MS) {
        return Ok(());
    }
    match tokio::time::timeout(
        Duration::from_millis(POOL_RECYCLE_TIMEOUT_MS),
        client.simple_query(""),
    )
    .await
    {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(error)) => Err(HookError::Backend(error)),
        Err(_) => Err(HookError::message("no answer to the verification query")),
    }
}

/// Every `interval`, turns the records older than `window_ms` into tombstones
/// (`points_ledger::retention::sweep`). Runs until the process ends; a failed sweep is
/// logged and tried again at the next interval.
async fn sweep_keys(pool: Pool, window_ms: u64, interval: Duration) {
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let swept = match pool.get().await {
            Ok(client) => points_ledger::retention::sweep(&client, window_ms)
                .await
                .map_err(|error| error.to_string()),
            Err(error) => Err(error.to_string()),
        };
        match swept {
            Ok(0) => {}
            Ok(count) => {
                tracing::info!(target: "ledger_svc::retention", expired = count, "key sweep")
            }
            Err(error) => {
                tracing::warn!(target: "ledger_svc::retention", %error, "key sweep failed")
            }
        }
    }
}

async fn bind(args: &Args) -> anyhow::Result<(TcpListener, TcpListener)> {
    let public = TcpListener::bind(args.listen)
        .await
        .map_err(|error| anyhow::anyhow!("cannot listen on {}: {error}", args.listen))?;
    let admin = TcpListener::bind(args.admin_listen)
        .await
        .map_err(|error| anyhow::anyhow!("cannot listen on {}: {error}", args.admin_listen))?;
    Ok((public, admin))
}

async fn wait_for_signal() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut terminate), Ok(mut interrupt)) => tokio::select! {
            _ = terminate.recv() => "SIGTERM",
            _ = interrupt.recv() => "SIGINT",
        },
        _ => {
            eprintln!("ledger-svc: cannot install signal handlers; running until killed");
            std::future::pending().await
        }
    }
}

/// Drains both listeners' connections and the transfer tasks within `grace`.
async fn shutdown(
    public_loop: tokio::task::JoinHandle<hyper_util::server::graceful::GracefulShutdown>,
    admin_loop: tokio::task::JoinHandle<hyper_util::server::graceful::GracefulShutdown>,
    state: &AppState,
    grace: Duration,
) -> i32 {
    let deadline = tokio::time::Instant::now() + grace;
    let (public, admin) = match (public_loop.await, admin_loop.await) {
        (Ok(public), Ok(admin)) => (public, admin),
        _ => {
            eprintln!("ledger-svc: an accept loop failed");
            return EXIT_GRACE_EXCEEDED;
        }
    };
    let open = public.count() + admin.count();
    // GracefulShutdown::shutdown never ends while a request is held, hence the deadline.
    let connections_drained = tokio::time::timeout_at(deadline, async {
        tokio::join!(public.shutdown(), admin.shutdown());
    })
    .await
    .is_ok();
    state.tasks.close();
    let tasks_drained = tokio::time::timeout_at(deadline, state.tasks.wait())
        .await
        .is_ok();
    if connections_drained && tasks_drained {
        eprintln!("ledger-svc: stopped ({open} open connections and all transfers drained)");
        0
    } else {
        eprintln!(
            "ledger-svc: grace of {} ms ran out (connections drained: {connections_drained}, \
             transfers finished: {tasks_drained}); exiting",
            grace.as_millis()
        );
        EXIT_GRACE_EXCEEDED
    }
}
