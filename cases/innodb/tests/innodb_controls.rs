//! The I-family negative controls can fail: each runs where its fault cannot happen,
//! and its `negative control exposes` check must report FAIL. I4 (Rust) runs under
//! [`Plan::Harmless`] (no registration that rolls back behind the sixteen placements)
//! and under the forced plan, as `./run.sh` runs it, where every check passes. I10, I11,
//! I12, I13 and I14 are case files (`cases/innodb/specs/`): each runs here as committed, where
//! every check passes, and with one edit removing its fault, where its exposes check,
//! and only it, must fail: I10's naive registration sent after the winner was released
//! (its snapshot then includes the winner), I11's UPDATEs changing the row (`+ 1`, then
//! `- 1`), I12's second read without `LOCK IN SHARE MODE`, I13 without the script's
//! refund of judy (no writer beside the naive read-then-write), I14 with 12 000 USDT for
//! mia (her batched freeze fits).
//!
//! Then the engine's wait observation beyond InnoDB's own lock table: a file (a
//! constant here, not a case of the run) whose `ALTER TABLE` waits for the metadata lock of a
//! transaction that read the table, and whose `GET_LOCK` waits for a user lock held by
//! another session. Both must print `<waiting ...>` and `<... completed>`, so that the
//! steps behind them are sent: a wait the runner did not see would leave the
//! permutation stuck until the step bound (300 s) failed it.
//!
//! One scratch MariaDB for the whole binary (fetched into the project's cache on first
//! use, as root), one database per case and plan; the server is stopped and its folder
//! removed at the end.

use std::path::Path;
use std::sync::Arc;

use case_kit::spec;
use case_kit::{CaseReport, Ctx, Env};
use cases_innodb::fixtures::Plan;
use cases_innodb::spec_engine::{MariaDbEngine, SPEC_DIR};
use cases_innodb::{self as innodb, i04_sixteen_inserters_deadlock as i04};

/// Seed of this test's environment (the controls use no random input).
const SEED: u64 = 34;

/// The verdicts of every `negative control exposes: …` check, in order; panics if none.
fn exposes(ctx: &Ctx) -> Vec<bool> {
    let verdicts = ctx.exposed_all();
    assert!(
        !verdicts.is_empty(),
        "no negative control check in:\n{}",
        ctx.transcript()
    );
    verdicts
}

async fn run(env: &std::sync::Arc<Env>, case_id: &'static str, plan: Plan) -> Ctx {
    let mut ctx = env
        .test_ctx(&innodb::family(), case_id, &format!("{case_id}_{plan:?}"))
        .await
        .expect("a context");
    let result = match case_id {
        "I4" => i04::run(&mut ctx, plan).await,
        other => panic!("no control {other}"),
    };
    result.unwrap_or_else(|e| panic!("{case_id} under {plan:?} fails to run: {e:#}"));
    eprint!("{case_id} under {plan:?}:\n{}", ctx.transcript());
    ctx
}

/// Runs the file `name`, its text changed by `edits`, as case `id`; returns the report.
async fn run_file(env: &Arc<Env>, id: &str, name: &str, edits: &[(&str, &str)]) -> CaseReport {
    let parsed = spec::load_edited(Path::new(SPEC_DIR), name, edits).expect("the file");
    let report = run_spec(env, id, format!("cases/innodb/specs/{name}"), parsed).await;
    eprint!("{id} {edits:?}:\n{}", report.transcript());
    report
}

/// Runs `parsed` (shown as `shown`) as case `id` on the MariaDB engine; returns the report.
async fn run_spec(env: &Arc<Env>, id: &str, shown: String, parsed: spec::Spec) -> CaseReport {
    let engine = Arc::new(MariaDbEngine::default());
    let case = spec::spec_case(id.into(), shown, Arc::new(parsed), engine);
    case_kit::run_case(env.clone(), &innodb::family(), &case).await
}

/// Text replacements applied to a case file before it runs: `(from, to)`.
type Edits<'a> = &'a [(&'a str, &'a str)];

/// The report's failed checks.
fn failed(report: &CaseReport) -> Vec<String> {
    let lines = report.transcript();
    let failed = lines.lines().filter(|l| l.trim_start().starts_with("FAIL"));
    failed.map(String::from).collect()
}

/// The file `name` (case `id`) as committed passes; with `harmless` applied, its exposes
/// check, and only it, fails.
async fn file_can_fail(env: &Arc<Env>, id: &str, name: &str, harmless: &[(&str, &str)]) {
    let report = run_file(env, id, name, &[]).await;
    assert!(failed(&report).is_empty(), "{}", report.transcript());
    let report = run_file(env, id, name, harmless).await;
    let failed = failed(&report);
    assert!(
        !failed.is_empty()
            && failed
                .iter()
                .all(|f| f.contains("negative control exposes")),
        "{id} without its fault: only the exposes check fails:\n{}",
        report.transcript()
    );
}

/// A case file (parsed here, not a case of the run) whose steps wait for locks above InnoDB: a metadata lock (`alter` behind
/// `read`'s open transaction) and a user lock (`wait` behind `take`).
const WAITS_ABOVE_INNODB: &str = "\
title: waits InnoDB's lock table does not show
claim: a step waiting for a metadata lock or for a user lock is seen waiting, and the
  steps behind it are sent
fails: a wait not seen: the permutation stays stuck until the step bound
system: frozen_balances_innodb
clean: yes
session r
  step read: START TRANSACTION; SELECT COUNT(*) AS n FROM balance
  step commit: COMMIT
session a
  step alter: ALTER TABLE balance COMMENT = 'altered behind a reader'
session u
  step take: SELECT GET_LOCK('innodb-waits', 0) AS got
  step free: SELECT RELEASE_LOCK('innodb-waits') AS freed
session w
  step wait: SELECT GET_LOCK('innodb-waits', 300) AS got
permutation: read alter commit take wait free
shows: take got=1
shows: wait got=1
";

/// [`WAITS_ABOVE_INNODB`] passes, `alter` and `wait` each seen waiting and completed.
async fn waits_above_innodb_are_seen(env: &Arc<Env>) {
    let parsed = spec::parse(WAITS_ABOVE_INNODB).expect("the file parses");
    let report = run_spec(env, "IW1", "WAITS_ABOVE_INNODB".into(), parsed).await;
    let transcript = report.transcript();
    assert!(failed(&report).is_empty(), "{transcript}");
    for step in ["alter", "wait"] {
        let waited = format!("step {step}: ");
        assert!(
            transcript
                .lines()
                .any(|l| l.contains(&waited) && l.ends_with("<waiting ...>")),
            "{step} not seen waiting:\n{transcript}"
        );
        let completed = format!("step {step}: <... completed>");
        assert!(
            transcript.contains(&completed),
            "{step} not completed:\n{transcript}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn innodb_controls_fail_where_the_fault_cannot_happen() {
    let parent = tempfile::Builder::new()
        .prefix("innodb-controls")
        .tempdir()
        .expect("a temporary folder");
    std::fs::set_permissions(
        parent.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    let options = scratch_mariadb::ServerOptions::new(parent.path().join("mariadb"));
    let server = tokio::task::spawn_blocking(move || scratch_mariadb::Server::start(options))
        .await
        .expect("join")
        .expect("a scratch MariaDB");
    innodb::server::install(server);
    let env = Env::for_tests(SEED, &[&innodb::family()])
        .await
        .expect("an environment");
    let files: [(&str, &str, Edits); 5] = [
        (
            "I10",
            "i10_read_inside_the_failed_transaction.spec",
            &[(
                "first second naive release_first",
                "first second release_first naive",
            )],
        ),
        (
            "I11",
            "i11_affected_rows.spec",
            &[
                ("available + 0", "available + 1"),
                ("available - 0", "available - 1"),
            ],
        ),
        (
            "I12",
            "i12_gap_locks_of_a_locking_read.spec",
            &[(" LOCK IN SHARE MODE", "")],
        ),
        (
            "I13",
            "i13_a_writer_that_skips_the_lock.spec",
            &[("n_read s_judy n_reread", "n_read n_reread")],
        ),
        (
            "I14",
            "i14_affected_rows_ignored_in_a_batch.spec",
            &[(
                "account=mia asset=USDT amount=6000",
                "account=mia asset=USDT amount=12000",
            )],
        ),
    ];
    for (id, name, harmless) in files {
        file_can_fail(&env, id, name, harmless).await;
    }
    let ctx = run(&env, "I4", Plan::Harmless).await;
    assert!(
        exposes(&ctx).iter().all(|passed| !passed),
        "I4: a control claims to expose its anomaly although the fault could not happen:\n{}",
        ctx.transcript()
    );
    let ctx = run(&env, "I4", Plan::Forced).await;
    assert!(
        ctx.failed_checks().is_empty() && exposes(&ctx).iter().all(|passed| *passed),
        "I4 under the forced plan has a failed check:\n{}",
        ctx.transcript()
    );
    waits_above_innodb_are_seen(&env).await;
    drop(innodb::server::take());
}
