//! `conformance` (`./run.sh conformance`): family C against a running service that speaks
//! the debit contract (`--target-url`), or `--self-check` against both bundled targets.
//! docs/conformance.md.
//!
//! Exit status: 0 when every check passed, 1 when one failed, 2 on a usage or harness
//! error (the evidence could not be written, no PostgreSQL for the self-check).

use std::path::PathBuf;

use cases_conformance::selfcheck;
use cases_conformance::target::TargetSpec;
use clap::Parser;

/// Runs family C against one target, or the self-check.
#[derive(Debug, Parser)]
#[command(name = "conformance")]
struct Args {
    /// Where the debit contract is served: `http://HOST:PORT` (also `--target`).
    #[arg(long, alias = "target", required_unless_present = "self_check")]
    target_url: Option<String>,
    /// ledger-svc's admin listener (`http://HOST:PORT`): balances are granted there.
    #[arg(long)]
    admin_url: Option<String>,
    /// Starts the target (`sh -c`): run first and after each kill; the suite stops it.
    #[arg(long)]
    start_command: Option<String>,
    /// Kills the target (`sh -c`, exit 0 expected) [default: SIGKILL of what the suite
    /// started].
    #[arg(long)]
    kill_command: Option<String>,
    /// A pid to SIGKILL instead of a kill command.
    #[arg(long)]
    kill_pid: Option<u32>,
    /// `sh -c "<command> ACCOUNT AMOUNT"` makes ACCOUNT exist and adds AMOUNT points.
    #[arg(long)]
    setup_command: Option<String>,
    /// The target's name in the evidence [default: its URL].
    #[arg(long)]
    label: Option<String>,
    /// Only these cases (C1 … C8).
    #[arg(long, value_delimiter = ',')]
    cases: Vec<String>,
    /// Seed of C8's workload [default: from the clock].
    #[arg(long)]
    seed: Option<u64>,
    /// Run against ledger-svc in each transfer mode and the Python target with and
    /// without each defect; print the defect table.
    #[arg(long, conflicts_with = "target_url")]
    self_check: bool,
    /// Where run records go (`<dir>/conformance/runs/<time>-<pid>/`, `<dir>/conformance/latest`).
    #[arg(long, default_value = "evidence")]
    evidence_dir: PathBuf,
    /// Unprivileged user for initdb and postgres when run as root (self-check).
    #[arg(long, env = "LEDGER_PG_USER", default_value = scratch_pg::DEFAULT_SERVER_USER)]
    server_user: String,
    /// Folder holding postgres and initdb (self-check) [default: PG_BIN, the cache, or npm].
    #[arg(long)]
    pg_bin: Option<PathBuf>,
}

fn main() {
    let args = Args::parse();
    if let Some(unknown) = args.cases.iter().find(|id| {
        !cases_conformance::suite::CASES
            .iter()
            .any(|c| c.id == id.as_str())
    }) {
        eprintln!("conformance: no case {unknown:?} (C1 … C8)");
        std::process::exit(2);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let code = runtime.block_on(async {
        tokio::select! {
            result = run(args) => result.unwrap_or_else(|error| {
                eprintln!("conformance error: {error:#}");
                2
            }),
            code = interrupted() => code,
        }
    });
    runtime.shutdown_timeout(std::time::Duration::from_millis(500));
    std::process::exit(code);
}

async fn run(args: Args) -> anyhow::Result<i32> {
    let seed = args.seed.unwrap_or_else(selfcheck::seed_from_clock);
    let folder = selfcheck::run_folder(&args.evidence_dir)?;
    println!("seed={seed} evidence: {}", folder.display());
    if args.self_check {
        return selfcheck::self_check(&selfcheck::SelfCheck {
            seed,
            folder,
            server_user: args.server_user,
            pg_bin: args.pg_bin,
            cases: args.cases,
        })
        .await;
    }
    let url = args.target_url.unwrap_or_default();
    let spec = TargetSpec {
        label: args.label.unwrap_or_else(|| url.clone()),
        url: url.trim_end_matches('/').to_owned(),
        admin_url: args.admin_url.map(|u| u.trim_end_matches('/').to_owned()),
        start_command: args.start_command,
        kill_command: args.kill_command,
        kill_pid: args.kill_pid,
        setup_command: args.setup_command,
    };
    let outcomes = cases_conformance::suite::run_against(spec, &args.cases, seed, &folder).await?;
    let transcript = std::fs::read_to_string(folder.join("transcript.txt"))?;
    // The SUMMARY line last, as every run prints it.
    let (body, summary) = transcript
        .trim_end()
        .rsplit_once('\n')
        .unwrap_or(("", transcript.trim_end()));
    println!("{body}");
    println!("evidence: {} (index.html, junit.xml)", folder.display());
    println!("{summary}");
    Ok(i32::from(outcomes.iter().any(|o| o.failed() > 0)))
}

/// Waits for SIGINT, SIGTERM or SIGHUP; returns 128 + the signal. A target the suite
/// started is a tied child (parent-death SIGKILL) and dies with this process; the
/// self-check's scratch cluster is stopped and removed.
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
    eprintln!("conformance: {name} received; stopping the targets and postgres");
    scratch_pg::cleanup_all_clusters();
    selfcheck::cleanup();
    code
}
