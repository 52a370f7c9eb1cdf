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
use scratch_pg::patroni::PatroniCluster;
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
    /// Where the ledger's database runs: `single` (one scratch server) or `patroni`
    /// (etcd, two Patroni nodes on Debian's PostgreSQL 15 in `synchronous_mode`, the
    /// service through HAProxy; root; the nemesis adds `kill-leader`, `pause-leader`,
    /// `stop-standby` and `switchover` and drops `crash-postgres`; docs/explore.md).
    #[arg(long, value_parser = ["single", PATRONI], default_value = "single")]
    pub topology: String,
    /// Internal: the watchdog of a `--topology patroni` run (kills what is left of the
    /// cluster in this folder once the run's process is gone).
    #[arg(long, hide = true)]
    pub janitor_for: Option<PathBuf>,
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

    let mut servers = start_servers(&args, seed).await?;
    let duration_ms = args.duration_s * 1_000;
    let faults = fault_plan_of(seed, duration_ms, &mix(&args));
    write_fault_plan(&folder.join("faults.tsv"), &faults)?;

    if args.auth {
        launch::service::set_run_auth(true);
    }
    let launch = service_launch(&args, servers.database_url.clone(), &folder);
    let service = launch.start().await?;
    let gateway = Arc::new(Gateway::default());
    gateway.set(Some(&service));

    let started = Instant::now();
    let history = Arc::new(HistoryWriter::create(
        &folder.join("history.jsonl"),
        started,
    )?);
    let balances = initial_balances(&servers.config).await?;
    history.record(|t_us| Event::Setup {
        t_us,
        seed,
        clients: args.clients,
        duration_ms,
        planted_bug: args.planted_bug.clone(),
        topology: (args.topology == PATRONI).then(|| PATRONI.to_owned()),
        balances,
    });
    let mut nemesis = Nemesis {
        cluster: servers.cluster.clone(),
        patroni: servers.patroni.clone(),
        database: DATABASE.to_owned(),
        launch,
        service: Some(service),
        gateway: gateway.clone(),
        history: history.clone(),
        disk: servers.disk.take(),
    };
    let deadline = started + Duration::from_millis(duration_ms);
    let ops = load(seed, args.clients, started, deadline, &faults, &mut nemesis).await?;
    stop_service(&mut nemesis).await?;
    let final_state = read_final_state(&reading_config(&servers).await?).await?;
    std::fs::write(
        folder.join("final-state.json"),
        serde_json::to_string_pretty(&final_state)?,
    )?;
    write_operations(&folder.join("operations.tsv"), &ops)?;

    let code = check_and_report(&folder, &final_state, seed, args.clients)?;
    let facts = servers.facts.clone();
    remove_cluster(nemesis, servers.cluster, servers.pg_log.as_deref(), &folder);
    remove_patroni(servers.patroni, &folder);
    write_environment(&folder, seed, &args, &facts)?;
    let report_line = std::fs::read_to_string(folder.join("explore-line.txt"))?;
    print!("{report_line}");
    Ok(code)
}

/// `--topology patroni`.
pub const PATRONI: &str = "patroni";

/// The run's fault kinds: [`FaultKind::PATRONI`] on a Patroni cluster, else the four
/// (and `power-cut` with `--power-cut`).
fn mix(args: &Args) -> Vec<FaultKind> {
    if args.topology == PATRONI {
        FaultKind::PATRONI.to_vec()
    } else {
        FaultKind::mix(args.power_cut)
    }
}

/// The run's database servers: a single scratch cluster, or a Patroni cluster.
struct Servers {
    /// The single server, else `None`.
    cluster: Option<Arc<Mutex<Cluster>>>,
    /// The Patroni cluster, else `None`.
    patroni: Option<Arc<Mutex<PatroniCluster>>>,
    /// The server's settings (on a Patroni cluster, its first leader's).
    facts: scratch_pg::ServerFacts,
    /// `--power-cut`'s disk.
    disk: Option<PowerDisk>,
    /// What the service connects to (on a Patroni cluster, HAProxy).
    database_url: String,
    /// Where the harness reads the balances before the load (the first leader).
    config: tokio_postgres::Config,
    /// The single server's log.
    pg_log: Option<PathBuf>,
}

/// Starts the servers `args` ask for.
///
/// Errors: [`start_cluster`]'s or [`start_patroni`]'s.
async fn start_servers(args: &Args, seed: u64) -> anyhow::Result<Servers> {
    if args.topology == PATRONI {
        anyhow::ensure!(!args.power_cut, "--power-cut runs on a single server only");
        return start_patroni(args).await;
    }
    let (cluster, facts, disk) = start_cluster(args, seed).await?;
    Ok(Servers {
        pg_log: Some(cluster.log_path().to_path_buf()),
        config: cluster.config(DATABASE),
        database_url: cluster.url(DATABASE),
        cluster: Some(Arc::new(Mutex::new(cluster))),
        patroni: None,
        facts,
        disk,
    })
}

/// Where the final state is read: the single server, or the Patroni cluster's leader
/// once it is healthy.
///
/// Errors: the Patroni cluster not healthy within its bound.
async fn reading_config(servers: &Servers) -> anyhow::Result<tokio_postgres::Config> {
    let Some(cluster) = &servers.patroni else {
        return Ok(servers.config.clone());
    };
    crate::patroni::blocking(cluster, |c| {
        let leader = crate::patroni::wait_healthy(c)?;
        eprintln!(
            "explore: reading the final state on the leader {}",
            c.nodes()[leader].name
        );
        Ok(crate::patroni::node_config(c, leader, DATABASE))
    })
    .await
}

/// Starts the Patroni cluster (and its janitor), creates the run's database with the
/// ledger's schema and seeded accounts on its leader, and prints its settings.
///
/// Errors: the cluster did not start, or a statement failed.
async fn start_patroni(args: &Args) -> anyhow::Result<Servers> {
    let (janitor, pipe) = crate::patroni::spawn_janitor()?;
    // The pipe stays open for the process's life: its end (exit or kill -9) starts the
    // janitor, which finds nothing left after a clean end.
    std::mem::forget(pipe);
    drop(janitor);
    let user = args.server_user.clone();
    let cluster = tokio::task::spawn_blocking(move || crate::patroni::start(&user)).await??;
    let leader = cluster.leader().context("no leader")?;
    let admin = connect(&crate::patroni::node_config(&cluster, leader, "postgres")).await?;
    admin
        .batch_execute(&format!("CREATE DATABASE {DATABASE}"))
        .await?;
    let facts = patroni_facts(&admin).await?;
    let config = crate::patroni::node_config(&cluster, leader, DATABASE);
    let client = connect(&config).await?;
    points_ledger::schema::install(&client).await?;
    points_ledger::schema::seed(&client).await?;
    println!(
        "patroni: {} nodes, leader {}, synchronous_mode, HAProxy on {}; postgres {} (fsync={} synchronous_commit={})",
        cluster.nodes().len(),
        cluster.nodes()[leader].name,
        cluster.haproxy_port(),
        facts.server_version,
        facts.fsync,
        facts.synchronous_commit
    );
    Ok(Servers {
        database_url: crate::patroni::haproxy_url(&cluster, DATABASE),
        config,
        patroni: Some(Arc::new(Mutex::new(cluster))),
        cluster: None,
        facts,
        disk: None,
        pg_log: None,
    })
}

/// A session on `config` (its connection driven by a task of its own).
///
/// Errors: the connection failed.
async fn connect(config: &tokio_postgres::Config) -> anyhow::Result<tokio_postgres::Client> {
    let (client, connection) = config.connect(tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}

/// The leader's settings, as scratch-pg's `server_facts` reads a single server's.
///
/// Errors: a query failed.
async fn patroni_facts(client: &tokio_postgres::Client) -> anyhow::Result<scratch_pg::ServerFacts> {
    let mut values = Vec::new();
    for sql in [
        "SELECT version()",
        "SHOW server_version",
        "SHOW fsync",
        "SHOW synchronous_commit",
        "SHOW full_page_writes",
    ] {
        values.push(client.query_one(sql, &[]).await?.get::<_, String>(0));
    }
    let mut values = values.into_iter();
    let mut next = || values.next().unwrap_or_default();
    Ok(scratch_pg::ServerFacts {
        version: next(),
        server_version: next(),
        fsync: next(),
        synchronous_commit: next(),
        full_page_writes: next(),
    })
}

/// Copies each node's Patroni log into the run folder (`patroni-<node>.log`) and stops
/// the Patroni cluster (its processes killed, its folder removed).
fn remove_patroni(cluster: Option<Arc<Mutex<PatroniCluster>>>, folder: &Path) {
    let Some(cluster) = cluster else {
        return;
    };
    if let Ok(cluster) = Arc::try_unwrap(cluster) {
        let cluster = cluster.into_inner().unwrap_or_else(|p| p.into_inner());
        for (index, node) in cluster.nodes().iter().enumerate() {
            let _ = std::fs::write(
                folder.join(format!("patroni-{}.log", node.name)),
                cluster.log_of(index),
            );
        }
    }
    crate::patroni::cleanup();
}

/// Copies PostgreSQL's log (`pg_log`) into the run folder and removes the cluster: it
/// goes (immediate stop, folder removed) when the last handle drops, the nemesis's
/// first.
fn remove_cluster(
    mut nemesis: Nemesis,
    cluster: Option<Arc<Mutex<Cluster>>>,
    pg_log: Option<&Path>,
    folder: &Path,
) {
    let disk = nemesis.disk.take();
    drop(nemesis);
    let cluster = cluster.and_then(|cluster| {
        Arc::try_unwrap(cluster)
            .ok()
            .map(|m| m.into_inner().unwrap_or_else(|p| p.into_inner()))
    });
    if let Some(pg_log) = pg_log {
        let _ = std::fs::copy(pg_log, folder.join("postgres.log"));
    }
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
    if args.topology == PATRONI {
        planted.push_str(" --topology patroni");
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
    if args.topology == PATRONI {
        let bound = crate::patroni::REQUEST_BOUND_MS.to_string();
        extra_args.extend(["--request-timeout-ms".to_owned(), bound]);
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
    let topology = topology_of(&events);
    let missing = missing_kinds(&report, topology.as_deref());
    report::timeline(&folder.join("timeline.svg"), &events, clients)?;
    std::fs::write(
        folder.join("violations.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    let table = report::summary_table(&report, &shown_kinds(&report, topology.as_deref()));
    let violations = report::violations_text(&report, &raw);
    let line = explore_line(seed, &report, topology.as_deref());
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
    if !missing.is_empty() {
        println!(
            "fault kinds that never took effect in a run with a full round of them: {}",
            missing.join(", ")
        );
    }
    std::fs::write(folder.join("explore-line.txt"), format!("{line}\n"))?;
    evidence_pages::write(
        &folder.join("timeline.html"),
        &evidence_pages::explore::render(folder),
    )?;
    println!("timeline: {}", folder.join("timeline.html").display());
    Ok(if report.violations.is_empty() && missing.is_empty() {
        0
    } else {
        EXIT_VIOLATIONS
    })
}

/// `EXPLORE seed=N ops=… faults=… (kind:count …) violations=…`, then
/// ` missing-faults=kind,…` when a kind of the mix never took effect in a run long
/// enough to include it ([`missing_kinds`]).
fn explore_line(seed: u64, report: &Report, topology: Option<&str>) -> String {
    let count = |kind: &FaultKind| (report.counts.faults.get(kind.as_str()).copied()).unwrap_or(0);
    let shown = shown_kinds(report, topology);
    let faults: Vec<String> = shown
        .iter()
        .map(|kind| format!("{}:{}", kind.as_str(), count(kind)))
        .collect();
    let kinds: Vec<String> = report
        .groups
        .iter()
        .map(|g| format!("{}:{}", g.kind, g.count))
        .collect();
    let missing = missing_kinds(report, topology);
    format!(
        "EXPLORE seed={seed} ops={} faults={} ({}) violations={}{}{}",
        report.counts.ops,
        report.faults_total(),
        faults.join(" "),
        report.violations.len(),
        if kinds.is_empty() {
            String::new()
        } else {
            format!(" ({})", kinds.join(" "))
        },
        if missing.is_empty() {
            String::new()
        } else {
            format!(" missing-faults={}", missing.join(","))
        }
    )
}

/// The fault kinds a run's line and table name: a single server's four, and
/// `power-cut` only when the run had one (`--power-cut`); a Patroni run's seven.
pub fn shown_kinds(report: &Report, topology: Option<&str>) -> Vec<FaultKind> {
    let count = |kind: &FaultKind| (report.counts.faults.get(kind.as_str()).copied()).unwrap_or(0);
    FaultKind::ALL
        .into_iter()
        .filter(|kind| match topology {
            Some(PATRONI) => FaultKind::PATRONI.contains(kind),
            _ => FaultKind::BASIC.contains(kind) || count(kind) > 0,
        })
        .collect()
}

/// On a Patroni cluster, the kinds of [`FaultKind::PATRONI`] with no fault that took
/// effect although the nemesis started at least a full round of them (the schedule
/// deals each kind once per round, so such a run included every kind): a failure of
/// the run. Empty for a single server, and for a run too short for a full round.
pub fn missing_kinds(report: &Report, topology: Option<&str>) -> Vec<&'static str> {
    let started = report.faults_total() + report.counts.faults_without_effect;
    if topology != Some(PATRONI) || started < FaultKind::PATRONI.len() {
        return Vec::new();
    }
    FaultKind::PATRONI
        .iter()
        .filter(|kind| {
            report
                .counts
                .faults
                .get(kind.as_str())
                .copied()
                .unwrap_or(0)
                == 0
        })
        .map(|kind| kind.as_str())
        .collect()
}

/// The history's topology (`patroni`), from its setup line.
fn topology_of(events: &[(usize, Event)]) -> Option<String> {
    events.iter().find_map(|(_, event)| match event {
        Event::Setup { topology, .. } => topology.clone(),
        _ => None,
    })
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
        "topology": args.topology,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn report(counts: &[(FaultKind, usize)], without_effect: usize) -> Report {
        let mut faults = std::collections::BTreeMap::new();
        for kind in FaultKind::ALL {
            faults.insert(kind.as_str().to_owned(), 0);
        }
        for (kind, count) in counts {
            faults.insert(kind.as_str().to_owned(), *count);
        }
        Report {
            counts: checker::Counts {
                faults,
                faults_without_effect: without_effect,
                ..checker::Counts::default()
            },
            violations: Vec::new(),
            groups: Vec::new(),
        }
    }

    #[test]
    fn a_patroni_kind_without_effect_in_a_full_round_is_missing() {
        let all: Vec<(FaultKind, usize)> = FaultKind::PATRONI.iter().map(|k| (*k, 1)).collect();
        assert!(missing_kinds(&report(&all, 0), Some(PATRONI)).is_empty());
        // A stop-standby that saw no COMMIT waiting: a full round started, one kind
        // never took effect.
        let mut short: Vec<(FaultKind, usize)> = all.clone();
        short.retain(|(kind, _)| *kind != FaultKind::StopStandby);
        assert_eq!(
            missing_kinds(&report(&short, 1), Some(PATRONI)),
            vec!["stop-standby"]
        );
        let line = explore_line(1, &report(&short, 1), Some(PATRONI));
        assert!(line.contains("stop-standby:0"), "{line}");
        assert!(line.ends_with(" missing-faults=stop-standby"), "{line}");
        // Too short for a full round: nothing is missing; a single server never is.
        assert!(missing_kinds(&report(&short[..3], 0), Some(PATRONI)).is_empty());
        assert!(missing_kinds(&report(&[], 9), None).is_empty());
        let single = explore_line(1, &report(&[(FaultKind::Pause, 2)], 0), None);
        assert!(
            single.contains("(kill-service:0 crash-postgres:0 pause:2 withhold:0) violations=0"),
            "{single}"
        );
    }
}
