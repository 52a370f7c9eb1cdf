//! One exploration run: a scratch cluster and a database of its own, one ledger-svc with
//! fault injection, C clients and the nemesis for the duration, then the service stopped,
//! the final state read, the checker, and the evidence.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context as _;
use launch::power::PowerDisk;
use launch::service::ServiceOptions;
use scratch_pg::{Cluster, ClusterOptions};

use crate::checker::{self, Report};
use crate::client::{Counters, Gateway, run_client};
use crate::history::{self, Event, HistoryWriter};
use crate::nemesis::{Launch, Nemesis};
use crate::plan::{FaultKind, PlannedFault, PlannedOp, fault_plan_of};
use crate::report;
use crate::state::{self, FinalState};

/// Exit status when the checker found a violation.
pub const EXIT_VIOLATIONS: i32 = 1;
/// Exit status for a harness or usage error.
pub const EXIT_ERROR: i32 = 2;
/// Default load duration, seconds.
pub const DEFAULT_DURATION_S: u64 = 60;
/// Default number of concurrent clients.
pub const DEFAULT_CLIENTS: u32 = 8;
/// Interval between two status lines on stderr, milliseconds.
pub const STATUS_INTERVAL_MS: u64 = 5_000;
/// Longest wait, after the service stopped, for its database sessions to end before
/// the final state is read, milliseconds.
pub const SESSIONS_GONE_TIMEOUT_MS: u64 = 10_000;
/// The run's database.
const DATABASE: &str = "explore";

/// Random workloads against ledger-svc under a seeded nemesis, checked from the history.
#[derive(Debug, clap::Parser)]
#[command(name = "explore")]
pub struct Args {
    /// Seed of the operation and fault schedules [default: from the clock; printed first].
    #[arg(long)]
    pub seed: Option<u64>,
    /// Seconds of load.
    #[arg(long, default_value_t = DEFAULT_DURATION_S)]
    pub duration_s: u64,
    /// Concurrent clients.
    #[arg(long, default_value_t = DEFAULT_CLIENTS, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub clients: u32,
    /// Start the service with a planted bug (`reexecute-known-keys`: a known key is
    /// executed again under a derived key), to see the checker catch it.
    #[arg(long, value_parser = ["reexecute-known-keys"])]
    pub planted_bug: Option<String>,
    /// Where run records go (`<dir>/explore/<time>-<pid>/`, `<dir>/explore/latest`).
    #[arg(long, default_value = "evidence")]
    pub evidence_dir: PathBuf,
    /// Unprivileged user for initdb and postgres when run as root.
    #[arg(long, env = "LEDGER_PG_USER", default_value = scratch_pg::DEFAULT_SERVER_USER)]
    pub server_user: String,
    /// Folder holding postgres and initdb [default: PG_BIN, the cache, or npm pack].
    #[arg(long)]
    pub pg_bin: Option<PathBuf>,
    /// Start the service with `--auth-tokens` (`launch::service`'s tokens; each client an admin,
    /// since it grants under its own id) and send every request with its client's token.
    /// Also on with `LEDGER_HARNESS_AUTH=1`.
    #[arg(long)]
    pub auth: bool,
    /// How the service sends debits and grants to the database (`statements`, `onetrip`
    /// or `batch`; ledger-svc's `--transfer-mode`). A pause planned at a hook point the
    /// mode does not pass is refused by the service and recorded as a fault without
    /// effect.
    #[arg(long, env = points_ledger::TRANSFER_MODE_ENV, default_value = "statements")]
    pub transfer_mode: points_ledger::TransferMode,
    /// Put the data directory on a disk that forgets what was never synced
    /// (`forgetful-fs`; root and `/dev/fuse`) and add `power-cut` to the nemesis's mix:
    /// SIGKILL of the service and every postgres process, the unsynced data dropped,
    /// crash recovery.
    #[arg(long)]
    pub power_cut: bool,
    /// Do not run: check the history and final state saved in this run folder again.
    #[arg(long)]
    pub recheck: Option<PathBuf>,
}

/// Runs `args`; returns the exit status.
///
/// Errors: anything that stops the run itself (cluster, service, files).
pub async fn run(args: Args) -> anyhow::Result<i32> {
    if let Some(folder) = &args.recheck {
        return recheck(folder);
    }
    let seed = args.seed.unwrap_or_else(seed_from_clock);
    announce(seed, &args);
    let folder = run_folder(&args.evidence_dir)?;
    println!("evidence: {}", folder.display());

    let (cluster, facts, disk) = start_cluster(&args, seed).await?;
    let pg_log = cluster.log_path().to_path_buf();
    let config = cluster.config(DATABASE);
    let database_url = cluster.url(DATABASE);
    let cluster = Arc::new(Mutex::new(cluster));

    let duration_ms = args.duration_s * 1_000;
    let faults = fault_plan_of(seed, duration_ms, &FaultKind::mix(args.power_cut));
    write_fault_plan(&folder.join("faults.tsv"), &faults)?;

    if args.auth {
        launch::service::set_run_auth(true);
    }
    let launch = service_launch(&args, database_url, &folder);
    let service = launch.start().await?;
    let gateway = Arc::new(Gateway::default());
    gateway.set(Some(&service));

    let started = Instant::now();
    let history = Arc::new(HistoryWriter::create(
        &folder.join("history.jsonl"),
        started,
    )?);
    let balances = initial_balances(&config).await?;
    history.record(|t_us| Event::Setup {
        t_us,
        seed,
        clients: args.clients,
        duration_ms,
        planted_bug: args.planted_bug.clone(),
        balances,
    });
    let mut nemesis = Nemesis {
        cluster: cluster.clone(),
        launch,
        service: Some(service),
        gateway: gateway.clone(),
        history: history.clone(),
        disk,
    };
    let deadline = started + Duration::from_millis(duration_ms);
    let ops = load(seed, args.clients, started, deadline, &faults, &mut nemesis).await?;
    stop_service(&mut nemesis).await?;
    let final_state = read_final_state(&config).await?;
    std::fs::write(
        folder.join("final-state.json"),
        serde_json::to_string_pretty(&final_state)?,
    )?;
    write_operations(&folder.join("operations.tsv"), &ops)?;

    let code = check_and_report(&folder, &final_state, seed, args.clients)?;
    remove_cluster(nemesis, cluster, &pg_log, &folder);
    write_environment(&folder, seed, &args, &facts)?;
    let report_line = std::fs::read_to_string(folder.join("explore-line.txt"))?;
    print!("{report_line}");
    Ok(code)
}

/// Copies PostgreSQL's log (`pg_log`) into the run folder and removes the cluster: it
/// goes (immediate stop, folder removed) when the last handle drops, the nemesis's
/// first.
fn remove_cluster(
    mut nemesis: Nemesis,
    cluster: Arc<Mutex<Cluster>>,
    pg_log: &Path,
    folder: &Path,
) {
    let disk = nemesis.disk.take();
    drop(nemesis);
    let cluster = Arc::try_unwrap(cluster)
        .ok()
        .map(|m| m.into_inner().unwrap_or_else(|p| p.into_inner()));
    let _ = std::fs::copy(pg_log, folder.join("postgres.log"));
    drop(cluster);
    // The disk goes after the cluster stopped (`--power-cut`).
    if disk.is_some() {
        drop(disk);
        crate::power::cleanup();
    }
}

/// A seed from the clock: nanoseconds since the Unix epoch (1 if the clock is before it).
fn seed_from_clock() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1)
}

/// Prints the run's first line: its seed and options, and the command that replays it.
fn announce(seed: u64, args: &Args) {
    let mut planted = args
        .planted_bug
        .as_deref()
        .map(|bug| format!(" --planted-bug {bug}"))
        .unwrap_or_default();
    if args.power_cut {
        planted.push_str(" --power-cut");
    }
    if args.transfer_mode != points_ledger::TransferMode::default() {
        planted.push_str(&format!(" --transfer-mode {}", args.transfer_mode));
    }
    println!(
        "seed={seed} duration_s={} clients={}{planted} (replay: ./run.sh explore --seed {seed} --duration-s {} --clients {}{planted})",
        args.duration_s, args.clients, args.duration_s, args.clients
    );
}

/// Starts the scratch cluster (100 connections; with `--power-cut` its data directory on
/// a forgetful disk) and prints its settings, then creates the run's database with the
/// ledger's schema and seeded accounts (with `--power-cut` checkpointed and written
/// back; the disk cut under `reorder` with strict names, its cuts' seeds from the run's
/// `seed`). Returns the cluster, the server's facts and the disk.
///
/// Errors: the disk or the cluster did not start, or a statement failed.
async fn start_cluster(
    args: &Args,
    seed: u64,
) -> anyhow::Result<(Cluster, scratch_pg::ServerFacts, Option<PowerDisk>)> {
    let mut options = ClusterOptions {
        pg_bin: args.pg_bin.clone(),
        server_user: args.server_user.clone(),
        ..ClusterOptions::default()
    };
    options.max_connections = 100;
    let disk = if args.power_cut {
        let (disk, data_dir) = crate::power::mount(seed)?;
        options.dir = Some(crate::power::work_dir().join("pg"));
        options.data_dir = Some(data_dir);
        Some(disk)
    } else {
        None
    };
    let cluster = tokio::task::spawn_blocking(move || Cluster::start(options))
        .await?
        .context("starting the scratch cluster")?;
    let facts = cluster.server_facts().await?;
    println!(
        "postgres {} (fsync={} synchronous_commit={} full_page_writes={})",
        facts.server_version, facts.fsync, facts.synchronous_commit, facts.full_page_writes
    );
    cluster.create_database(DATABASE, None).await?;
    {
        let client = cluster.connect(DATABASE).await?;
        points_ledger::schema::install(&client).await?;
        points_ledger::schema::seed(&client).await?;
        if let Some(disk) = &disk {
            client.batch_execute("CHECKPOINT").await?;
            disk.sync_all()?;
            println!("data directory on a forgetful disk (power-cut in the nemesis's mix)");
        }
    }
    Ok((cluster, facts, disk))
}

/// How to start the service on `database_url`: fault injection on, two pooled
/// connections per client (at least 4), the planted bug if any, every client known and
/// an admin (each grants under its own id), its log in the run folder.
fn service_launch(args: &Args, database_url: String, folder: &Path) -> Launch {
    let client_ids: Vec<String> = (0..args.clients).map(crate::plan::client_id).collect();
    let mut extra_args = vec!["--transfer-mode".to_owned(), args.transfer_mode.to_string()];
    if let Some(bug) = &args.planted_bug {
        extra_args.extend(["--planted-bug".to_owned(), bug.clone()]);
    }
    Launch {
        database_url,
        log_path: folder.join("ledger-svc.log"),
        options: ServiceOptions {
            fault_injection: true,
            pool_size: (args.clients as usize * 2).max(4),
            extra_args,
            clients: client_ids.clone(),
            admins: client_ids,
            ..ServiceOptions::default()
        },
    }
}

/// Every account's balance before the load, on a connection of its own.
///
/// Errors: connecting or the query failed.
async fn initial_balances(
    config: &tokio_postgres::Config,
) -> anyhow::Result<std::collections::BTreeMap<String, i64>> {
    let (client, connection) = config.connect(tokio_postgres::NoTls).await?;
    let task = tokio::spawn(connection);
    let balances = state::balances(&client).await?;
    drop(client);
    let _ = task.await;
    Ok(balances)
}

/// The load: `clients` clients on their seeded schedules and the nemesis on `faults`,
/// from `started` until `deadline`, with status lines on stderr; then every fault
/// undone and the history's `end` line written. Returns every operation invoked, in
/// `(client, index)` order.
///
/// Errors: a client task panicked, or the nemesis could not bring the service or
/// PostgreSQL back.
async fn load(
    seed: u64,
    clients: u32,
    started: Instant,
    deadline: Instant,
    faults: &[PlannedFault],
    nemesis: &mut Nemesis,
) -> anyhow::Result<Vec<PlannedOp>> {
    let history = nemesis.history.clone();
    let counters = Arc::new(Counters::default());
    let invoked: Arc<Mutex<Vec<PlannedOp>>> = Arc::default();
    let mut tasks = Vec::new();
    for client in 0..clients {
        tasks.push(tokio::spawn(run_client(
            seed,
            client,
            deadline,
            nemesis.gateway.clone(),
            history.clone(),
            counters.clone(),
            invoked.clone(),
        )));
    }
    let status = tokio::spawn(status_lines(counters.clone(), history.clone(), started));
    let nemesis_result = nemesis.run(faults, started, deadline).await;
    for task in tasks {
        task.await?;
    }
    status.abort();
    nemesis_result?;
    nemesis.restore().await?;
    history.record(|t_us| Event::End { t_us });
    history.flush()?;
    let mut ops = invoked.lock().unwrap_or_else(|p| p.into_inner()).clone();
    ops.sort_by_key(|op| (op.client, op.index));
    Ok(ops)
}

/// Points the clients' gateway at nothing and stops the service (SIGTERM), printing
/// how it ended.
///
/// Errors: stopping failed.
async fn stop_service(nemesis: &mut Nemesis) -> anyhow::Result<()> {
    nemesis.gateway.set(None);
    if let Some(service) = nemesis.service.take() {
        let status = service.stop().await?;
        eprintln!("explore: ledger-svc stopped ({status})");
    }
    Ok(())
}

/// The final database, read once no ledger-svc session is left, on a connection of
/// its own.
///
/// Errors: connecting or a query failed, or sessions stayed open too long.
async fn read_final_state(config: &tokio_postgres::Config) -> anyhow::Result<FinalState> {
    let (mut client, connection) = config.connect(tokio_postgres::NoTls).await?;
    let task = tokio::spawn(connection);
    wait_for_sessions_gone(&client).await?;
    let final_state = state::read(&mut client).await?;
    drop(client);
    let _ = task.await;
    Ok(final_state)
}

/// Checks the run folder's history against `final_state`, writes the report files and
/// prints the summary; returns the exit status. The last line is kept in
/// `explore-line.txt` for the caller to print last.
fn check_and_report(
    folder: &Path,
    final_state: &FinalState,
    seed: u64,
    clients: u32,
) -> anyhow::Result<i32> {
    let history_path = folder.join("history.jsonl");
    let events = history::read(&history_path)?;
    let raw: Vec<String> = std::fs::read_to_string(&history_path)?
        .lines()
        .map(str::to_owned)
        .collect();
    let report = checker::check(&events, final_state);
    report::timeline(&folder.join("timeline.svg"), &events, clients)?;
    std::fs::write(
        folder.join("violations.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    let table = report::summary_table(&report);
    let violations = report::violations_text(&report, &raw);
    let line = explore_line(seed, &report);
    std::fs::write(
        folder.join("report.md"),
        format!("# Exploration seed={seed}\n\n{table}\n## Violations\n\n{violations}\n`{line}`\n"),
    )?;
    print!("{table}");
    if !report.groups.is_empty() {
        println!(
            "violations by kind (first and smallest excerpt; full report: {}):",
            folder.join("report.md").display()
        );
        print!("{violations}");
        println!("replay: ./run.sh explore --seed {seed} (see the first line for all options)");
    }
    std::fs::write(folder.join("explore-line.txt"), format!("{line}\n"))?;
    evidence_pages::write(
        &folder.join("timeline.html"),
        &evidence_pages::explore::render(folder),
    )?;
    println!("timeline: {}", folder.join("timeline.html").display());
    Ok(if report.violations.is_empty() {
        0
    } else {
        EXIT_VIOLATIONS
    })
}

/// `EXPLORE seed=N ops=… faults=… violations=…`.
fn explore_line(seed: u64, report: &Report) -> String {
    // `power-cut` is named only when the run had one (`--power-cut`): the line of a
    // run without it keeps its four kinds.
    let faults: Vec<String> = FaultKind::ALL
        .iter()
        .filter(|kind| {
            **kind != FaultKind::PowerCut
                || report
                    .counts
                    .faults
                    .get(kind.as_str())
                    .copied()
                    .unwrap_or(0)
                    > 0
        })
        .map(|kind| {
            format!(
                "{}:{}",
                kind.as_str(),
                report
                    .counts
                    .faults
                    .get(kind.as_str())
                    .copied()
                    .unwrap_or(0)
            )
        })
        .collect();
    let kinds: Vec<String> = report
        .groups
        .iter()
        .map(|g| format!("{}:{}", g.kind, g.count))
        .collect();
    format!(
        "EXPLORE seed={seed} ops={} faults={} ({}) violations={}{}",
        report.counts.ops,
        report.faults_total(),
        faults.join(" "),
        report.violations.len(),
        if kinds.is_empty() {
            String::new()
        } else {
            format!(" ({})", kinds.join(" "))
        }
    )
}

/// `explore --recheck FOLDER`.
fn recheck(folder: &Path) -> anyhow::Result<i32> {
    let final_state: FinalState = serde_json::from_str(
        &std::fs::read_to_string(folder.join("final-state.json"))
            .context("reading final-state.json")?,
    )?;
    let events = history::read(&folder.join("history.jsonl"))?;
    let (seed, clients) = events
        .iter()
        .find_map(|(_, e)| match e {
            Event::Setup { seed, clients, .. } => Some((*seed, *clients)),
            _ => None,
        })
        .context("the history has no setup line")?;
    let code = check_and_report(folder, &final_state, seed, clients)?;
    print!(
        "{}",
        std::fs::read_to_string(folder.join("explore-line.txt"))?
    );
    Ok(code)
}

/// `<evidence>/explore/<UTC time>-<pid>/`, and `<evidence>/explore/latest` pointing at it.
fn run_folder(evidence: &Path) -> anyhow::Result<PathBuf> {
    let stamp = humantime::format_rfc3339_seconds(SystemTime::now())
        .to_string()
        .replace(':', "");
    let root = evidence.join("explore");
    let folder = root.join(format!("{stamp}-{}", std::process::id()));
    std::fs::create_dir_all(&folder).with_context(|| format!("creating {}", folder.display()))?;
    let latest = root.join("latest");
    let _ = std::fs::remove_file(&latest);
    let _ = std::os::unix::fs::symlink(folder.file_name().expect("named"), &latest);
    Ok(folder)
}

fn write_fault_plan(path: &Path, faults: &[crate::plan::PlannedFault]) -> anyhow::Result<()> {
    let mut text = String::from(
        "# the seed's fault schedule: planned start (ms after the load starts), kind, hook point, down or hold time (ms)\nindex\tat_ms\tkind\tpoint\thold_ms\n",
    );
    for fault in faults {
        text.push_str(&format!(
            "{}\t{}\t{}\t{}\t{}\n",
            fault.index,
            fault.at_ms,
            fault.kind.as_str(),
            fault.point.as_deref().unwrap_or("-"),
            fault.hold_ms
        ));
    }
    std::fs::write(path, text)?;
    Ok(())
}

fn write_operations(path: &Path, ops: &[PlannedOp]) -> anyhow::Result<()> {
    let mut text = String::from(
        "# the seed's operation schedule, as far as each client got: every operation invoked\nclient\tindex\tkey\tkind\taccount\tamount\treuse_of\tmax_attempts\tbackoff_ms\n",
    );
    for op in ops {
        text.push_str(&format!(
            "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\n",
            op.client,
            op.index,
            op.key,
            op.payload.kind.as_str(),
            op.payload.account,
            op.payload.amount,
            op.reuse_of.map_or("-".to_owned(), |i| i.to_string()),
            op.max_attempts,
            op.backoff_ms
        ));
    }
    std::fs::write(path, text)?;
    Ok(())
}

fn write_environment(
    folder: &Path,
    seed: u64,
    args: &Args,
    facts: &scratch_pg::ServerFacts,
) -> anyhow::Result<()> {
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned());
    let environment = serde_json::json!({
        "command": std::env::args().collect::<Vec<_>>(),
        "seed": seed,
        "duration_s": args.duration_s,
        "clients": args.clients,
        "planted_bug": args.planted_bug,
        "git_commit": commit,
        "postgres": facts,
        "client_timeout_ms": crate::client::CLIENT_TIMEOUT_MS,
    });
    std::fs::write(
        folder.join("environment.json"),
        serde_json::to_string_pretty(&environment)?,
    )?;
    Ok(())
}

/// A status line on stderr every [`STATUS_INTERVAL_MS`].
async fn status_lines(counters: Arc<Counters>, history: Arc<HistoryWriter>, started: Instant) {
    let mut ticks = tokio::time::interval(Duration::from_millis(STATUS_INTERVAL_MS));
    ticks.tick().await;
    loop {
        ticks.tick().await;
        let _ = history.flush();
        eprintln!(
            "explore: t={}s ops={} attempts={} ok={} fail={} info={}",
            started.elapsed().as_secs(),
            counters.ops.load(Ordering::Relaxed),
            counters.attempts.load(Ordering::Relaxed),
            counters.ok.load(Ordering::Relaxed),
            counters.fail.load(Ordering::Relaxed),
            counters.info.load(Ordering::Relaxed),
        );
    }
}

/// Waits until no ledger-svc session is left in `pg_stat_activity` (a killed service's
/// backends end when they notice), at most [`SESSIONS_GONE_TIMEOUT_MS`].
async fn wait_for_sessions_gone(client: &tokio_postgres::Client) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_millis(SESSIONS_GONE_TIMEOUT_MS);
    loop {
        let row = client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'ledger-svc'",
                &[],
            )
            .await?;
        let left: i64 = row.get(0);
        if left == 0 {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{left} ledger-svc sessions still open {SESSIONS_GONE_TIMEOUT_MS} ms after it stopped"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
