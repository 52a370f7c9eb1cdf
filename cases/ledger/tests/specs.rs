//! The spec-file cases (`cases/ledger/specs/`, `case_kit::spec`):
//!
//! - a spec whose expected lock wait does not happen fails its snapshot: L-S1 with
//!   its transactions removed (each debit commits at once, so neither waits)
//!   differs from the committed `evidence/snapshots/L/L-S1.snap` exactly where the
//!   `<waiting ...>` was, while the unchanged spec matches it;
//! - a spec without permutation lines runs every order: L-S9 (two sessions, three
//!   steps) lists each of the 3 orders that keep b's two steps in order, each once;
//! - a spec file that cannot be parsed is still a case, one that fails with the reason.
//!
//! One scratch cluster with the ledger template for the binary.

use std::path::PathBuf;
use std::sync::Arc;

use case_kit::snapshot::{Mode, Snapshots, Verdict};
use case_kit::spec::{self, Spec};
use case_kit::{CaseReport, Env, Family};
use cases_ledger::{self as ledger, spec_calls};

const SEED: u64 = 20;

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("the workspace")
        .to_path_buf()
}

fn spec_file(name: &str) -> (String, Spec) {
    let text = std::fs::read_to_string(PathBuf::from(spec_calls::SPEC_DIR).join(name))
        .expect("read the spec");
    let spec = spec::parse(&text).expect("parse the spec");
    (format!("cases/ledger/specs/{name}"), spec)
}

async fn run(env: &Arc<Env>, family: &Family, id: &str, shown: String, spec: Spec) -> CaseReport {
    let case = spec::spec_case(id.to_string(), shown, Arc::new(spec), spec_calls::engine());
    let report = case_kit::run_case(env.clone(), family, &case).await;
    eprint!("{}", report.transcript());
    report
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
async fn spec_cases_wait_where_they_must_and_list_every_order() {
    let family = ledger::family();
    let env = Env::for_tests(SEED, &[&family])
        .await
        .expect("scratch cluster and template");

    // L-S1 as committed: matches its snapshot.
    let (shown, original) = spec_file("s1_debit_rechecks_newest_row.spec");
    let report = run(&env, &family, "L-S1", shown.clone(), original.clone()).await;
    assert_eq!(report.failed, 0, "L-S1 has a failed check");
    assert!(
        matches!(compare(&report), Verdict::Matched),
        "the unchanged L-S1 must match its snapshot"
    );

    // The lock removed: the sessions run without a transaction (no `BEGIN`), so each
    // debit commits at once and the other never waits. Every permutation still completes; only the
    // snapshot can tell, and it must.
    let mut unlocked = original;
    for session in &mut unlocked.sessions {
        session.setup.clear();
    }
    let report = run(&env, &family, "L-S1", shown, unlocked).await;
    assert_eq!(report.failed, 0, "the unlocked L-S1 still runs every step");
    match compare(&report) {
        Verdict::Differs { exists, diff, .. } => {
            assert!(exists, "L-S1.snap is committed");
            let lost: Vec<&str> = diff
                .lines()
                .filter(|line| line.starts_with('-') && line.contains("<waiting ...>"))
                .collect();
            assert_eq!(lost.len(), 2, "both waits are gone from the diff:\n{diff}");
        }
        other => panic!("the unlocked L-S1 must differ from its snapshot, got {other:?}"),
    }

    // L-S9: no permutation line, two sessions, three steps → every order, each once.
    let (shown, every) = spec_file("s9_debits_in_every_order.spec");
    assert!(every.permutations.is_empty());
    let report = run(&env, &family, "L-S9", shown, every).await;
    assert_eq!(report.failed, 0, "L-S9 has a failed check");
    let listed: Vec<String> = report
        .transcript()
        .lines()
        .filter_map(|line| {
            line.split_once("of 3: ")
                .map(|(_, order)| order.to_string())
        })
        .collect();
    // Every arrangement of the three steps with b_debit30 before b_debit50, by brute force.
    let steps = ["a_debit80", "b_debit30", "b_debit50"];
    let mut expected = Vec::new();
    for i in 0..3 {
        for j in 0..3 {
            for k in 0..3 {
                let order = [steps[i], steps[j], steps[k]];
                let distinct = i != j && j != k && i != k;
                let b_in_order = order.iter().position(|s| *s == "b_debit30")
                    < order.iter().position(|s| *s == "b_debit50");
                if distinct && b_in_order {
                    expected.push(order.join(" "));
                }
            }
        }
    }
    let mut sorted = listed.clone();
    sorted.sort();
    expected.sort();
    assert_eq!(sorted, expected, "every order, each once: {listed:?}");
}

#[test]
fn a_broken_spec_file_is_a_failing_case() {
    let dir = std::env::temp_dir().join(format!("spec-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    std::fs::write(dir.join("s1_broken.spec"), "title: t\nstep x: SELECT 1\n").expect("write");
    std::fs::write(dir.join("no_number.spec"), "title: t\n").expect("write");
    let cases = spec::cases_in("L", &dir, "specs", spec_calls::engine());
    std::fs::remove_dir_all(&dir).ok();
    let ids: Vec<&str> = cases.iter().map(|case| case.id.as_str()).collect();
    assert_eq!(ids, ["L-S1", "L-S-no_number.spec"]);
    assert!(cases.iter().all(|case| !case.clean));
    assert_eq!(cases[0].title, "spec file that cannot be run");
}

/// docs/adding-a-case.md shows L-S1, L3 (a race) and L-S14 (a kill) complete, the
/// README the last two without their comments: the
/// examples are the files that run.
#[test]
fn the_readme_example_is_the_spec_that_runs() {
    let readme = std::fs::read_to_string(workspace().join("docs/adding-a-case.md"))
        .expect("docs/adding-a-case.md");
    let spec = std::fs::read_to_string(
        PathBuf::from(spec_calls::SPEC_DIR).join("s1_debit_rechecks_newest_row.spec"),
    )
    .expect("L-S1");
    assert!(
        readme.contains(&format!("```text\n{spec}```")),
        "docs/adding-a-case.md's spec example differs from cases/ledger/specs/s1_debit_rechecks_newest_row.spec"
    );
    let lines = spec.lines().count();
    assert!((20..=40).contains(&lines), "the example has {lines} lines");
    for name in [
        "l03_real_concurrency.spec",
        "s14_killed_before_commit_same_key_proceeds.spec",
    ] {
        let example = std::fs::read_to_string(PathBuf::from(spec_calls::SPEC_DIR).join(name))
            .expect("the example spec");
        assert!(
            readme.contains(&format!("```text\n{example}```")),
            "docs/adding-a-case.md's example differs from cases/ledger/specs/{name}"
        );
        // The README's "Adding a case" shows the same two files without their comments.
        let front = std::fs::read_to_string(workspace().join("README.md")).expect("README.md");
        let bare: String = example
            .lines()
            .filter(|line| !line.trim_start().starts_with('#'))
            .map(|line| format!("{line}\n"))
            .collect();
        assert!(
            front.contains(&format!("```text\n{bare}```")),
            "README.md's example differs from cases/ledger/specs/{name} without its comments"
        );
    }
}
