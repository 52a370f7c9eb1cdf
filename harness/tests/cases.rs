//! The cases as cargo tests (libtest-mimic, so `cargo test` and nextest list and filter
//! them by id): `cargo test -p harness --test cases -- --list`, `... -- --exact L3`.
//!
//! - every registered case of every family (`harness::families()`) is a test that fails
//!   when the case has a failed check; its transcript is the failure message;
//! - the template `L0` runs too, so the file engineers copy keeps compiling and passing;
//! - `CANARY` passes only when the canary case FAILS, exactly on its deliberately false
//!   check: a runner that lost failures would turn it red.
//!
//! One environment per test process (a scratch cluster for the PostgreSQL families),
//! made by the first test that needs it (so `--list` starts nothing). Independent cases run in parallel on the test threads;
//! Exclusive and Last cases take the cluster alone (a write lock). Snapshots are compared
//! by `./run.sh`, not here: what a Last case reconciles depends on which cases ran
//! before it, which libtest's order does not fix.
//!
//! The seed: `LEDGER_SEED=N` replays a run; otherwise it is drawn from the clock and
//! printed to stderr.

use std::sync::{Arc, OnceLock, RwLock};
use std::time::SystemTime;

use case_kit::{Case, CaseReport, Env, Family, Line, Schedule};
use libtest_mimic::{Arguments, Failed, Trial};

/// Worker threads of the shared runtime (connection tasks; racers have their own threads).
const RUNTIME_WORKER_THREADS: usize = 2;

static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
static ENV: OnceLock<Result<Arc<Env>, String>> = OnceLock::new();
static FAMILIES: OnceLock<Vec<Family>> = OnceLock::new();
/// Concurrent cases share it (read); Exclusive and Last cases hold it alone (write).
static CLUSTER_TURN: RwLock<()> = RwLock::new(());

fn runtime() -> &'static tokio::runtime::Runtime {
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(RUNTIME_WORKER_THREADS)
            .enable_all()
            .build()
            .expect("tokio runtime")
    })
}

fn seed() -> u64 {
    std::env::var("LEDGER_SEED")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        })
}

fn env() -> Result<Arc<Env>, Failed> {
    ENV.get_or_init(|| {
        let seed = seed();
        eprintln!("cases: seed={seed} (replay with LEDGER_SEED={seed})");
        let env = runtime()
            .block_on(Env::for_tests(seed, &families().iter().collect::<Vec<_>>()))
            .map_err(|error| format!("scratch cluster for the cases: {error:#}"))?;
        start_mariadb(&env)?;
        Ok(env)
    })
    .clone()
    .map_err(Failed::from)
}

/// Family I's scratch MariaDB, in the environment's own folder, handed to the family
/// (stopped at the end of `main`).
fn start_mariadb(env: &Arc<Env>) -> Result<(), String> {
    let Some(folder) = env.test_folder() else {
        return Ok(());
    };
    let options = scratch_mariadb::ServerOptions::new(folder.join("mariadb"));
    let server = scratch_mariadb::Server::start(options)
        .map_err(|error| format!("scratch MariaDB for family I: {error}"))?;
    cases_innodb::server::install(server);
    Ok(())
}

fn families() -> &'static [Family] {
    FAMILIES.get_or_init(harness::families)
}

fn run(family: &'static Family, case: &'static Case) -> Result<CaseReport, Failed> {
    let env = env()?;
    let report = if case.schedule == Schedule::Concurrent {
        let _turn = CLUSTER_TURN.read().unwrap_or_else(|p| p.into_inner());
        runtime().block_on(case_kit::run_case(env, family, case))
    } else {
        let _turn = CLUSTER_TURN.write().unwrap_or_else(|p| p.into_inner());
        runtime().block_on(case_kit::run_case(env, family, case))
    };
    Ok(report)
}

/// A registered case (or the template): passes when every check passed.
fn expect_pass(family: &'static Family, case: &'static Case) -> Result<(), Failed> {
    let report = run(family, case)?;
    if report.failed == 0 {
        Ok(())
    } else {
        Err(Failed::from(format!(
            "{} of {} checks failed\n{}",
            report.failed,
            report.failed + report.passed,
            report.transcript()
        )))
    }
}

/// The canary: passes only when the case failed on exactly its deliberately false check
/// and on nothing else.
fn expect_canary_failure(family: &'static Family, case: &'static Case) -> Result<(), Failed> {
    let report = run(family, case)?;
    let failed: Vec<&str> = report
        .lines
        .iter()
        .filter_map(|line| match line {
            Line::Check(check) if !check.passed => Some(check.name.as_str()),
            _ => None,
        })
        .collect();
    if failed == [harness::CANARY_CHECK] && report.failed == 1 && report.passed >= 1 {
        Ok(())
    } else {
        Err(Failed::from(format!(
            "the canary must fail on exactly {:?}; it failed on {failed:?}\n{}",
            harness::CANARY_CHECK,
            report.transcript()
        )))
    }
}

fn main() {
    let args = Arguments::from_args();
    let mut trials = Vec::new();
    for family in families() {
        for case in &family.cases {
            trials.push(Trial::test(case.id.as_str(), move || {
                expect_pass(family, case)
            }));
        }
        for case in &family.extras {
            if case.id == harness::CANARY_ID {
                trials.push(Trial::test(case.id.as_str(), move || {
                    expect_canary_failure(family, case)
                }));
            } else {
                trials.push(Trial::test(case.id.as_str(), move || {
                    expect_pass(family, case)
                }));
            }
        }
    }
    let conclusion = libtest_mimic::run(&args, trials);
    // The shared cluster and folder live in a static that is never dropped: stop and
    // remove them here.
    scratch_pg::cleanup_all_clusters();
    drop(cases_innodb::server::take());
    if let Some(Ok(env)) = ENV.get()
        && let Some(folder) = env.test_folder()
    {
        let _ = std::fs::remove_dir_all(folder);
    }
    conclusion.exit();
}
