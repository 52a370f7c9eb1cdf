//! Family C against real targets: the Python implementation passes every case without
//! defects, and with each defect the case meant for it fails (and, among C1–C7, only
//! the cases listed beside it); ledger-svc passes every case; a target that does not
//! answer, answers garbage or closes connections gets failed checks with reasons, within
//! a bound. CI runs these with `cargo test --workspace` (docs/conformance.md, "In CI").

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use cases_conformance::outcome::CaseOutcome;
use cases_conformance::selfcheck::{self, DEFECTS};
use cases_conformance::suite::run_against;
use cases_conformance::target::TargetSpec;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn failing(outcomes: &[CaseOutcome]) -> BTreeSet<&'static str> {
    outcomes
        .iter()
        .filter(|o| o.failed() > 0)
        .map(|o| o.id)
        .collect()
}

fn transcript(outcomes: &[CaseOutcome]) -> String {
    outcomes.iter().map(CaseOutcome::transcript).collect()
}

async fn python(defect: Option<&str>, scratch: &Path) -> Vec<CaseOutcome> {
    let spec = selfcheck::python_target(defect, &scratch.join("db")).unwrap();
    let name = defect.unwrap_or("clean");
    run_against(spec, &[], 11, &scratch.join(name))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn python_without_defects_passes_every_case() {
    let scratch = tempfile::tempdir().unwrap();
    let outcomes = python(None, scratch.path()).await;
    assert_eq!(outcomes.len(), 8, "{}", transcript(&outcomes));
    assert!(
        outcomes
            .iter()
            .all(|o| o.failed() == 0 && o.passed() > 0 && o.not_run.is_none()),
        "{}",
        transcript(&outcomes)
    );
    for file in ["transcript.txt", "results.json", "junit.xml", "index.html"] {
        assert!(scratch.path().join("clean").join(file).exists(), "{file}");
    }
    let text = std::fs::read_to_string(scratch.path().join("clean/transcript.txt")).unwrap();
    assert!(text.starts_with("target: python clean at http://127.0.0.1:"));
    assert!(text.trim_end().ends_with("failed=0"), "{text}");
}

/// Runs the Python target with `defect`: the case meant for it fails and, among C1–C7,
/// exactly the cases `selfcheck::caught_among_c1_to_c7` lists.
async fn defect_is_caught(defect: &str) {
    let meant = DEFECTS.iter().find(|(d, _)| *d == defect).unwrap().1;
    let scratch = tempfile::tempdir().unwrap();
    let outcomes = python(Some(defect), scratch.path()).await;
    let caught = failing(&outcomes);
    println!("{defect} | {meant} | {caught:?}");
    assert!(
        caught.contains(meant),
        "--defect {defect}: {meant} passed\n{}",
        transcript(&outcomes)
    );
    let expected: BTreeSet<&str> = selfcheck::caught_among_c1_to_c7(defect)
        .iter()
        .copied()
        .collect();
    let deterministic: BTreeSet<&str> = caught.iter().copied().filter(|c| *c != "C8").collect();
    assert_eq!(
        deterministic,
        expected,
        "--defect {defect}: cases C1–C7 that failed\n{}",
        transcript(&outcomes)
    );
}

macro_rules! defect_tests {
    ($($test:ident: $defect:literal,)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $test() {
                defect_is_caught($defect).await;
            }
        )*

        /// Every defect of `selfcheck::DEFECTS` has its test above.
        #[test]
        fn every_defect_has_a_test() {
            let tested: BTreeSet<&str> = [$($defect),*].into_iter().collect();
            let listed: BTreeSet<&str> = DEFECTS.iter().map(|(d, _)| *d).collect();
            assert_eq!(tested, listed);
        }
    };
}

defect_tests! {
    reexecute_on_retry_is_caught_by_c1: "reexecute-on-retry",
    ignores_payload_is_caught_by_c2: "ignores-payload",
    key_race_is_caught_by_c3: "key-race",
    check_then_write_is_caught_by_c4: "check-then-write",
    key_in_memory_is_caught_by_c6: "key-in-memory",
    ack_before_commit_is_caught_by_c6: "ack-before-commit",
    lenient_input_is_caught_by_c7: "lenient-input",
}

/// A listener that treats every connection as `behaviour` says.
async fn broken_target(behaviour: &'static str) -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((mut stream, _)) = listener.accept().await {
            let mut buffer = [0u8; 4096];
            let _ = stream.read(&mut buffer).await;
            match behaviour {
                "garbage" => {
                    let _ = stream.write_all(b"hello there\r\n\r\n{not http").await;
                }
                "close" => {}
                // silent: keep the connection open, never answer
                _ => held.push(stream),
            }
        }
    });
    (url, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broken_targets_fail_with_reasons_within_a_bound() {
    let scratch = tempfile::tempdir().unwrap();
    let cases: Vec<String> = ["C1", "C3", "C6", "C7"].map(String::from).to_vec();
    let nothing = {
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", free.local_addr().unwrap())
    };
    let mut targets = vec![("nothing listening", nothing, None)];
    for behaviour in ["silent", "garbage", "close"] {
        let (url, task) = broken_target(behaviour).await;
        targets.push((behaviour, url, Some(task)));
    }
    for (name, url, _task) in &targets {
        let started = Instant::now();
        let spec = TargetSpec {
            label: name.to_string(),
            url: url.clone(),
            ..TargetSpec::default()
        };
        let outcomes = run_against(
            spec,
            &cases,
            1,
            &scratch.path().join(name.replace(' ', "-")),
        )
        .await
        .unwrap();
        let took = started.elapsed();
        let text = transcript(&outcomes);
        assert!(
            took < Duration::from_millis(6 * cases_conformance::REQUEST_TIMEOUT_MS),
            "{name}: {took:?}\n{text}"
        );
        for outcome in &outcomes {
            if outcome.id == "C6" {
                assert!(
                    outcome
                        .not_run
                        .as_deref()
                        .is_some_and(|r| r.contains("kill")),
                    "{name}: {text}"
                );
                continue;
            }
            assert!(
                outcome.failed() >= 1,
                "{name}: {} passed\n{text}",
                outcome.id
            );
        }
        let unexplained = outcomes.iter().flat_map(|o| &o.lines).any(|line| {
            matches!(line, case_kit::Line::Check(c)
                if !c.passed && c.actual.as_deref().is_none_or(str::is_empty))
        });
        assert!(!unexplained, "a failure without a reason:\n{text}");
        println!("{name}: {took:?}\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ledger_svc_passes_every_case_in_each_mode() {
    let scratch = tempfile::tempdir().unwrap();
    let options = scratch_pg::ClusterOptions {
        max_connections: 100,
        ..Default::default()
    };
    let cluster = tokio::task::spawn_blocking(move || scratch_pg::Cluster::start(options))
        .await
        .unwrap()
        .unwrap();
    cluster.create_database("conformance", None).await.unwrap();
    {
        let client = cluster.connect("conformance").await.unwrap();
        points_ledger::schema::install(&client).await.unwrap();
        points_ledger::schema::seed(&client).await.unwrap();
    }
    // Started by the suite through its start command, in each transfer mode: every
    // case, C6's kill included.
    for mode in selfcheck::MODES {
        let spec = selfcheck::ledger_target(mode, &cluster.url("conformance")).unwrap();
        let outcomes = run_against(spec, &[], 5, &scratch.path().join(mode))
            .await
            .unwrap();
        assert!(
            outcomes
                .iter()
                .all(|o| o.failed() == 0 && o.passed() > 0 && o.not_run.is_none()),
            "{mode}: {}",
            transcript(&outcomes)
        );
    }
    // Already running, known by its URLs only: C6 is not run (no kill, no start), the
    // rest pass.
    let service = launch::service::Service::launch(
        &cluster.url("conformance"),
        scratch.path().join("ledger-svc.log"),
        launch::service::ServiceOptions {
            auth: launch::service::Auth::Off,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let spec = TargetSpec {
        label: "ledger-svc running".into(),
        url: service.public_url(""),
        admin_url: Some(service.admin_url("")),
        ..TargetSpec::default()
    };
    let outcomes = run_against(spec, &[], 6, &scratch.path().join("running"))
        .await
        .unwrap();
    let text = transcript(&outcomes);
    for outcome in &outcomes {
        if outcome.id == "C6" {
            assert!(outcome.not_run.is_some(), "{text}");
        } else {
            assert!(outcome.failed() == 0 && outcome.passed() > 0, "{text}");
        }
    }
    service.stop().await.unwrap();
}

/// Without a setup command (or admin URL) the accounts of a fresh target have no points:
/// the cases are listed as not run with that reason, not failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cases_without_points_are_not_run() {
    let scratch = tempfile::tempdir().unwrap();
    let spec = TargetSpec {
        setup_command: None,
        ..selfcheck::python_target(None, &scratch.path().join("db")).unwrap()
    };
    let cases: Vec<String> = ["C1", "C4"].map(String::from).to_vec();
    let outcomes = run_against(spec, &cases, 1, &scratch.path().join("run"))
        .await
        .unwrap();
    let text = transcript(&outcomes);
    for outcome in &outcomes {
        assert_eq!(outcome.failed() + outcome.passed(), 0, "{text}");
        assert!(
            outcome
                .not_run
                .as_deref()
                .is_some_and(|r| r.contains("--setup-command")),
            "{text}"
        );
    }
}
