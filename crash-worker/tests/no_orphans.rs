//! The crash-worker against a real PostgreSQL 16 cluster: it stops where it is told, it
//! gives up on its own after its pause limit, and no worker or postgres process outlives
//! its owner — also when the case that launched it fails or is cancelled midway.

use std::sync::Arc;
use std::time::{Duration, Instant};

use case_kit::{Ctx, Env, Family, Resource};
use cases_ledger::worker::WorkerSpec;
use launch::worker::{CrashWorker, EXIT_PAUSE_LIMIT, WorkerEnd};
use points_ledger::HookPoint;

/// The binary cargo built for these tests.
const WORKER: &str = env!("CARGO_BIN_EXE_crash-worker");
/// Bound of every polling wait in these tests.
const WAIT_LIMIT_MS: u64 = 30_000;

/// Whether `pid` still exists (a zombie, not yet reaped, counts as existing).
fn process_exists(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// pids of crash-worker processes whose command line contains `needle` (a database URL,
/// which holds the cluster's unique port).
fn workers_for(needle: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|raw| {
                    let args: Vec<String> = raw
                        .split(|b| *b == 0)
                        .map(|a| String::from_utf8_lossy(a).into_owned())
                        .collect();
                    args.first().is_some_and(|a| a.ends_with("crash-worker"))
                        && args.iter().any(|a| a == needle)
                })
                .unwrap_or(false)
        })
        .collect()
}

/// A fresh case database `name`, cloned from the template.
async fn fresh_database(env: &Env, name: &str) -> String {
    let admin = env.connect("postgres").await.expect("connect");
    admin
        .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        .await
        .expect("drop");
    admin
        .batch_execute(&format!(
            "CREATE DATABASE {name} TEMPLATE {}",
            cases_ledger::TEMPLATE_DATABASE
        ))
        .await
        .expect("create");
    name.to_string()
}

/// Polls `sql` (one bool, no parameters) until it is true; false after [`WAIT_LIMIT_MS`].
async fn eventually(client: &tokio_postgres::Client, sql: &str) -> bool {
    let deadline = Instant::now() + Duration::from_millis(WAIT_LIMIT_MS);
    loop {
        let holds: bool = client.query_one(sql, &[]).await.expect(sql).get(0);
        if holds || Instant::now() > deadline {
            return holds;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Drops the last reference to `env` (stopping the cluster) and asserts the postmaster is
/// gone.
fn shut_down(env: Arc<Env>) {
    let postmaster = env
        .cluster()
        .unwrap()
        .postmaster_pid()
        .expect("cluster running");
    let env = Arc::try_unwrap(env).unwrap_or_else(|_| panic!("env still shared"));
    drop(env);
    assert!(
        !process_exists(postmaster),
        "postmaster {postmaster} outlived the cluster value"
    );
}

/// The ledger family, whose template the tests clone.
fn ledger() -> Family {
    cases_ledger::family()
}

/// A test environment with the ledger's template.
async fn ledger_env(seed: u64) -> Arc<Env> {
    Env::for_tests(seed, &[&ledger()]).await.expect("cluster")
}

fn spec(url: &str, key: &str, stop_at: HookPoint, pause_limit_ms: Option<u64>) -> Vec<String> {
    WorkerSpec {
        database_url: url.to_string(),
        client_id: "app-t".into(),
        idem_key: key.into(),
        account: "acct-0001".into(),
        amount: 40,
        stop_at,
        pause_limit_ms,
    }
    .args()
}

/// At every hook point the worker stops, reports its backend, and — not killed — gives up
/// on its own after its pause limit with status 3; only at after-commit does the debit stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_stops_at_each_point_and_gives_up_on_its_own() {
    let env = ledger_env(1).await;
    let db = fresh_database(&env, "worker_points").await;
    let url = env.url(&db).unwrap();
    let mut client = env.connect(&db).await.unwrap();
    points_ledger::grant(&mut client, "ops", "g-1", "acct-0001", 1000)
        .await
        .unwrap();

    let mut balance = 1000;
    for (n, point) in HookPoint::ALL.into_iter().enumerate() {
        let key = format!("k-point-{n}");
        let mut worker =
            CrashWorker::launch_binary(WORKER.as_ref(), spec(&url, &key, point, Some(300)))
                .unwrap();
        let pid = worker.pid();
        let paused = worker.wait_paused().await.unwrap();
        let state: String = client
            .query_one(
                "SELECT state FROM pg_stat_activity WHERE pid = $1",
                &[&paused.backend_pid().unwrap()],
            )
            .await
            .unwrap()
            .get(0);
        let expected_state = if point == HookPoint::AfterCommit {
            "idle"
        } else {
            "idle in transaction"
        };
        assert_eq!(state, expected_state, "session at {point}");

        let end = worker
            .wait(Duration::from_millis(WAIT_LIMIT_MS))
            .await
            .unwrap();
        assert_eq!(
            end,
            WorkerEnd::Exited(EXIT_PAUSE_LIMIT),
            "at {point}: {}",
            worker.stderr()
        );
        assert!(
            worker.stderr().contains("pause_limit_ms=300"),
            "{}",
            worker.stderr()
        );
        assert!(!process_exists(pid), "worker {pid} reaped");

        if point == HookPoint::AfterCommit {
            balance -= 40;
        }
        let row = client
            .query_one(
                "SELECT (SELECT balance FROM account WHERE account_id = 'acct-0001'), \
                 (SELECT count(*) FROM idem_request WHERE idem_key = $1)",
                &[&key],
            )
            .await
            .unwrap();
        assert_eq!(
            (row.get::<_, i64>(0), row.get::<_, i64>(1)),
            (balance, i64::from(point == HookPoint::AfterCommit)),
            "after giving up at {point}"
        );
    }
    drop(client);
    shut_down(env);
}

/// Dropping the handle of a paused worker kills and reaps it at once; its backend then
/// rolls the transaction back and ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_handle_kills_the_worker() {
    let env = ledger_env(2).await;
    let db = fresh_database(&env, "worker_drop").await;
    let url = env.url(&db).unwrap();
    let mut client = env.connect(&db).await.unwrap();
    points_ledger::grant(&mut client, "ops", "g-1", "acct-0001", 100)
        .await
        .unwrap();

    let mut worker = CrashWorker::launch_binary(
        WORKER.as_ref(),
        spec(&url, "k-drop", HookPoint::BeforeCommit, None),
    )
    .unwrap();
    let pid = worker.pid();
    let paused = worker.wait_paused().await.unwrap();
    assert_eq!(workers_for(&url), vec![pid]);
    drop(worker);
    assert!(
        !process_exists(pid),
        "worker {pid} killed and reaped on drop"
    );
    assert!(workers_for(&url).is_empty());

    let backend_gone = format!(
        "SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = {})",
        paused.backend_pid().unwrap()
    );
    assert!(eventually(&client, &backend_gone).await, "backend ended");
    let row = client
        .query_one(
            "SELECT (SELECT balance FROM account WHERE account_id = 'acct-0001'), \
             (SELECT count(*) FROM idem_request WHERE idem_key = 'k-drop')",
            &[],
        )
        .await
        .unwrap();
    assert_eq!((row.get::<_, i64>(0), row.get::<_, i64>(1)), (100, 0));
    drop(client);
    shut_down(env);
}

/// A worker that exits before pausing (here: it cannot connect) is reported with its
/// status and stderr instead of being waited for until the timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_fails_early_is_reported() {
    let mut worker = CrashWorker::launch_binary(
        WORKER.as_ref(),
        spec(
            "postgresql://postgres@127.0.0.1:1/nowhere",
            "k-fail",
            HookPoint::BeforeCommit,
            None,
        ),
    )
    .unwrap();
    let pid = worker.pid();
    let error = worker.wait_paused().await.expect_err("cannot connect");
    let message = format!("{error:#}");
    assert!(
        message.contains("exited with status 1") && message.contains("connecting"),
        "{message}"
    );
    assert!(!process_exists(pid));
}

/// L9 (its file, the kill left out) cancelled midway — while its worker is paused and
/// the same-key request waits —
/// leaves no worker process, no open transaction and no committed debit; then the cluster
/// stops with no postgres process left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn l9_cancelled_midway_leaves_no_process() {
    let env = ledger_env(9).await;
    let db = fresh_database(&env, "case_l9").await;
    let url = env.url(&db).unwrap();
    let observer = env.connect(&db).await.unwrap();
    // L9's file without its last step (the kill): the case then waits for the same-key
    // debit until it is cancelled, however fast it runs.
    let file = "l09_killed_before_commit.spec";
    let dir = std::path::Path::new(cases_ledger::spec_calls::SPEC_DIR);
    let mut spec = case_kit::spec::load(dir, file, file).expect("L9's file");
    let kill = spec.permutations[0].pop().expect("the kill");
    assert_eq!(kill.name, "w_kill");
    let calls = cases_ledger::spec_calls::engine();
    let case = case_kit::spec::spec_case("L9".into(), file.into(), Arc::new(spec), calls);
    let mut ctx = Ctx::new(env.clone(), "L", "L9", Resource::Database(db));

    let blocked = "SELECT EXISTS (SELECT 1 FROM pg_stat_activity \
                   WHERE datname = current_database() AND wait_event_type = 'Lock')";
    let running_workers = {
        let body = (case.body)(&mut ctx);
        tokio::select! {
            outcome = body => panic!("L9 ended before it was cancelled: {outcome:?}"),
            // Collected inside the branch: select! drops the other branch (the case)
            // before it runs a handler.
            seen = async {
                let waiting = eventually(&observer, blocked).await;
                (waiting, workers_for(&url))
            } => {
                assert!(seen.0, "L9's same-key request never waited");
                seen.1
            }
        }
        // select! dropped the case's future there: it was cancelled in the middle.
    };
    assert_eq!(running_workers.len(), 1, "one worker ran mid-case");
    assert!(
        workers_for(&url).is_empty(),
        "no crash-worker survives the cancelled case"
    );
    assert!(!process_exists(running_workers[0]));
    let all_idle = "SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity \
                    WHERE datname = current_database() AND pid <> pg_backend_pid())";
    assert!(
        eventually(&observer, all_idle).await,
        "the case's sessions ended"
    );
    let row = observer
        .query_one(
            "SELECT (SELECT balance FROM account WHERE account_id = 'acct-0009'), \
             (SELECT count(*) FROM ledger_txn WHERE idem_key = 'k-0901')",
            &[],
        )
        .await
        .unwrap();
    assert_eq!((row.get::<_, i64>(0), row.get::<_, i64>(1)), (100, 0));
    drop(observer);
    drop(ctx);
    shut_down(env);
}

/// L9 and L10 as the harness runs them: every check passes, the transcript shows the kill
/// and the recovery figures, and nothing is left running afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn l9_and_l10_pass_and_leave_no_process() {
    let env = ledger_env(10).await;
    let url = env.url(&Env::database_for("L9")).unwrap();
    let mut transcripts = String::new();
    for id in ["L9", "L10"] {
        let family = ledger();
        let case = family.cases.iter().find(|case| case.id == id).unwrap();
        let report = case_kit::run_case(env.clone(), &family, case).await;
        let transcript = report.transcript();
        assert_eq!(report.failed, 0, "{transcript}");
        assert!(report.passed >= 5, "{transcript}");
        transcripts.push_str(&transcript);
    }
    assert!(
        transcripts.contains("signal=9 shell_status=137"),
        "{transcripts}"
    );
    assert!(
        transcripts.contains("fsync=on synchronous_commit=on"),
        "{transcripts}"
    );
    assert!(workers_for(&url).is_empty());
    shut_down(env);
}
