//! PostgreSQL's own isolation specs, carried unchanged with their expected output
//! (`cases/ledger/specs/s10…s12`, each with its `.about` and `.out`):
//!
//! - each runs as its case does and its transcript, in PostgreSQL's expected-output
//!   layout, means what PostgreSQL's expected file says (the case's own check, which
//!   compares the two with `case_kit::spec::same_meaning`);
//! - the comparison can fail: read-only-anomaly-3 with s3's transaction no longer
//!   `DEFERRABLE` runs, but s3 no longer waits for a safe snapshot, so its transcript
//!   differs from the expected file and the check fails, naming the first line where
//!   they part;
//! - a race as one file (L3, converted from Rust) counts its outcomes, and a wrong `expect:` fails;
//! - a kill as one file (L-S14): the same-key debit waits behind a paused crash-worker,
//!   which ends by SIGKILL; the debit is then paid once.
//!
//! One scratch cluster with the ledger template for the binary.

use std::path::Path;
use std::sync::Arc;

use case_kit::spec::{self, Spec};
use case_kit::{CaseReport, Env, Family};
use cases_ledger::{self as ledger, spec_calls};

const SEED: u64 = 32;

const UPSTREAM: [(&str, &str); 3] = [
    ("L-S10", "s10_read-only-anomaly-3.spec"),
    ("L-S11", "s11_deadlock-simple.spec"),
    ("L-S12", "s12_deadlock-soft-2.spec"),
];

fn load(name: &str) -> (String, Spec) {
    let shown = format!("cases/ledger/specs/{name}");
    let spec = spec::load(Path::new(spec_calls::SPEC_DIR), name, &shown).expect("load the spec");
    (shown, spec)
}

async fn run(env: &Arc<Env>, family: &Family, id: &str, shown: String, spec: Spec) -> CaseReport {
    let case = spec::spec_case(id.to_string(), shown, Arc::new(spec), spec_calls::engine());
    let report = case_kit::run_case(env.clone(), family, &case).await;
    eprint!("{}", report.transcript());
    report
}

fn meaning_check(report: &CaseReport) -> (bool, String) {
    let check = report
        .checks()
        .find(|check| check.name.starts_with("the transcript means what"))
        .expect("an upstream spec checks its transcript against the expected file");
    (check.passed, format!("{check:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_specs_mean_what_their_expected_files_say() {
    let family = ledger::family();
    let env = Env::for_tests(SEED, &[&family])
        .await
        .expect("scratch cluster and template");
    for (id, name) in UPSTREAM {
        let (shown, spec) = load(name);
        assert!(!spec.upstream.is_empty(), "{name} says where it comes from");
        let report = run(&env, &family, id, shown, spec).await;
        let (passed, check) = meaning_check(&report);
        assert!(passed, "{id}: {check}");
        assert_eq!(report.failed, 0, "{id} has a failed check");
    }

    // The negative control: without DEFERRABLE, s3 reads at once (no safe-snapshot
    // wait), so the transcript no longer means what the expected file says.
    let (shown, mut spec) = load(UPSTREAM[0].1);
    let s3 = spec
        .sessions
        .iter_mut()
        .find(|s| s.name == "s3")
        .expect("s3");
    s3.setup = vec![s3.setup[0].replace(" DEFERRABLE", "")];
    let report = run(&env, &family, "L-S10", shown, spec).await;
    let (passed, check) = meaning_check(&report);
    assert!(
        !passed,
        "without DEFERRABLE the comparison must fail: {check}"
    );
    assert!(check.contains("s3r"), "the difference is at s3r: {check}");
}

/// A race as one file (L3): it passes as written, and its `expect:` can fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_race_spec_counts_outcomes_and_its_expectation_can_fail() {
    let family = ledger::family();
    let env = Env::for_tests(SEED + 1, &[&family])
        .await
        .expect("scratch cluster and template");
    let (shown, spec) = load("l03_real_concurrency.spec");
    let report = run(&env, &family, "L3", shown.clone(), spec.clone()).await;
    assert_eq!(report.failed, 0, "L3 has a failed check");
    assert!(report.transcript().contains("ok=14 insufficient=18"));

    let mut wrong = spec;
    wrong.race.as_mut().expect("a race").expect = Some("ok=15 insufficient=17".into());
    let report = run(&env, &family, "L3", shown, wrong).await;
    let outcomes = report
        .checks()
        .find(|check| check.name == "outcomes")
        .expect("the outcomes check");
    assert!(
        !outcomes.passed,
        "a wrong expectation must fail: {outcomes:?}"
    );
    assert_eq!(report.failed, 1, "only the outcomes check fails");
}

/// A kill as one file (L-S14): the same-key debit is shown waiting behind the paused
/// crash-worker, the worker ends by SIGKILL, the debit is then paid once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_spec_shows_the_wait_and_the_signal() {
    let family = ledger::family();
    let env = Env::for_tests(SEED + 2, &[&family])
        .await
        .expect("scratch cluster and template");
    let (shown, spec) = load("s14_killed_before_commit_same_key_proceeds.spec");
    let report = run(&env, &family, "L-S14", shown, spec).await;
    assert_eq!(report.failed, 0, "L-S14 has a failed check");
    let transcript = report.transcript();
    for expected in [
        "step b_same_key: debit account=acct-0009 amount=40 key=k-kill client=app-a <waiting ...>",
        "signal=9 shell_status=137",
        "step b_same_key: <... completed>",
        "outcome=OK balance=60",
    ] {
        assert!(transcript.contains(expected), "{expected:?} missing");
    }
}
