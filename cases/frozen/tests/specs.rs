//! The F family's spec files (`cases/frozen/specs/`, the events as `call` steps through
//! `cases_frozen::spec_calls`):
//!
//! - every file there loads and names only operations and arguments the family offers
//!   (a file that does not becomes a case that fails with the reason);
//! - the operations refuse what they cannot run before anything runs;
//! - F5 as committed passes and matches its snapshot, and its expectation can fail: with
//!   room for two freezes (12 000 USDT instead of 6000) the same race gives `ok=2
//!   insufficient=30`, and the `outcomes` check and the balance check fail.
//!
//! One scratch cluster with the frozen template for the binary.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use case_kit::snapshot::{Mode, Snapshots, Verdict};
use case_kit::spec::{self, Action, Call, Calls, Spec};
use case_kit::{CaseReport, Env, Family};
use cases_frozen::{self as frozen, spec_calls};

const SEED: u64 = 32;

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("the workspace")
        .to_path_buf()
}

fn spec_file(name: &str) -> (String, Spec) {
    let shown = format!("cases/frozen/specs/{name}");
    let spec = spec::load(Path::new(spec_calls::SPEC_DIR), name, &shown).expect("load the spec");
    (shown, spec)
}

async fn run(env: &Arc<Env>, family: &Family, id: &str, shown: String, spec: Spec) -> CaseReport {
    let case = spec::spec_case(id.to_string(), shown, Arc::new(spec), spec_calls::engine());
    let report = case_kit::run_case(env.clone(), family, &case).await;
    eprint!("{}", report.transcript());
    report
}

fn failed_checks(report: &CaseReport) -> Vec<String> {
    report
        .transcript()
        .lines()
        .filter(|line| line.trim_start().starts_with("FAIL"))
        .map(String::from)
        .collect()
}

#[test]
fn every_f_spec_file_loads_with_the_familys_operations() {
    let cases = spec_calls::cases();
    assert!(
        !cases.is_empty(),
        "no spec file in {}",
        spec_calls::SPEC_DIR
    );
    for case in &cases {
        assert_ne!(
            case.title, "spec file that cannot be run",
            "{} does not load (run it to see why)",
            case.id
        );
        assert!(
            !case.id.contains("-S-"),
            "{}: a file is named f<NN>_<what>.spec or s<N>_<what>.spec",
            case.id
        );
    }
}

#[test]
fn the_operations_refuse_what_they_cannot_run() {
    let call = |text: &str| {
        let mut words = text.split_whitespace();
        let op = words.next().expect("an operation").to_string();
        let args = words
            .map(|w| {
                let (k, v) = w.split_once('=').expect("key=value");
                (k.to_string(), v.to_string())
            })
            .collect();
        Call { op, args, line: 0 }
    };
    let calls = spec_calls::FrozenCalls;
    for good in [
        "place account=alice side=BUY qty=1.0 price=5000 key=p-1 tenant=default",
        "cancel account=alice order=p-1 key=c-1 hold=before-commit",
        "post-place account=alice side=BUY qty=1 price=5000 key=p together=16",
    ] {
        assert_eq!(calls.check(&call(good)), Ok(()), "{good}");
    }
    for (text, expected) in [
        ("freeze account=alice", "unknown verb"),
        (
            "place account=alice side=BUY qty=1.0 key=p-1",
            "needs price=",
        ),
        (
            "deposit account=alice asset=USDT amount=1 key=d-1 colour=red",
            "takes no colour=",
        ),
        ("fill buy=a sell=b qty=0.1 price=1", "needs key="),
        // InnoDB's events take `fail=`; PostgreSQL's do not (both take `hold=`).
        (
            "place account=alice side=BUY qty=1.0 price=5000 key=p-1 fail=balances-updated",
            "takes no fail= on PostgreSQL",
        ),
        (
            "fill buy=a sell=b qty=0.1 price=1 key=f-1 hold=nowhere",
            "nowhere",
        ),
        (
            "place account=alice side=BUY qty=1.0 price=5000 key=p-1 fail-at=registered hold=before-commit",
            "either aborted or held",
        ),
        ("fill-cancel-rounds from=2", "needs rounds="),
        (
            "arm-fault point=spot-before-commit action=pause event=WITHDRAW",
            "WITHDRAW",
        ),
        (
            "place account=alice side=BUY qty=1.0 price=5000 key=p-1 fail-at=nowhere",
            "nowhere",
        ),
        (
            "worker account=alice side=BUY qty=1.0 price=5000 key=w stop=x",
            "x",
        ),
        ("kill-worker now=yes", "takes no now="),
        ("network-refuse count=many", "takes an integer"),
        (
            "post-place account=alice side=BUY qty=1 key=p",
            "needs price=",
        ),
    ] {
        let error = calls.check(&call(text)).expect_err(text);
        assert!(error.contains(expected), "{text}: {error}");
    }
}

fn compare(report: &CaseReport) -> Verdict {
    Snapshots::new(
        workspace().join("evidence/snapshots"),
        "evidence/snapshots".into(),
        Mode::ReadOnly,
        None,
    )
    .compare(report, true)
    .expect("read the snapshot")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f5_as_a_file_passes_and_its_expectation_can_fail() {
    let family = frozen::family();
    let env = Env::for_tests(SEED, &[&family])
        .await
        .expect("scratch cluster and template");
    let (shown, original) = spec_file("f05_orders_compete_for_too_little.spec");
    let report = run(&env, &family, "F5", shown.clone(), original.clone()).await;
    assert_eq!(report.failed, 0, "F5 has a failed check");
    assert!(
        matches!(compare(&report), Verdict::Matched),
        "the unchanged F5 must match its snapshot"
    );

    // Room for two freezes: the race and its hold are the same, the split is not.
    let mut roomy = original;
    for action in &mut roomy.setup {
        if let Action::Call(call) = action {
            for (key, value) in &mut call.args {
                if key == "amount" {
                    *value = "12000".into();
                }
            }
        }
    }
    let report = run(&env, &family, "F5", shown, roomy).await;
    let failed = failed_checks(&report);
    assert!(
        failed
            .iter()
            .any(|line| line.contains("outcomes") && line.contains("actual=ok=2 insufficient=30")),
        "the outcomes check must fail with ok=2: {failed:?}"
    );
    assert!(
        failed
            .iter()
            .any(|line| line.contains("available = 995000000")),
        "the balance check must fail: {failed:?}"
    );
}
