//! The negative controls L4, L5 and L6 (spec files) can fail: run where the race cannot
//! happen (a single participant), each control's `negative control exposes` check must
//! report FAIL; so must L6's duplicate check when the client reuses its key. Run with the forced race, every check of each
//! control must pass. L13's REPEATABLE READ race (debits one after another), L14's
//! deadlock control (request-order transfers one after another; both files with
//! `run=one-by-one` on that step) and L17's keyless-retry controls (no dropped
//! connection, no cut answer) must likewise report FAIL without their fault.
//!
//! One scratch PostgreSQL 16 cluster (with the ledger template) for the whole binary,
//! one database per run, cloned from the template as `run_case` does.

use std::sync::Arc;

use std::path::Path;

use case_kit::spec::{self, Spec};
use case_kit::{Ctx, Env};
use cases_ledger::spec_calls;
use cases_ledger::{self as ledger};

/// Seed of this test's environment (the controls use no random input).
const SEED: u64 = 4;

/// A context for `case_id` on a fresh clone of the template named `database`.
async fn fresh_ctx(env: &Arc<Env>, case_id: &'static str, database: &str) -> Ctx {
    env.test_ctx(&ledger::family(), case_id, database)
        .await
        .expect("clone the template")
}

/// Whether the check `negative control exposes: <anomaly>` passed; panics if it is absent.
fn exposes_passed(ctx: &Ctx, anomaly: &str) -> bool {
    ctx.exposed(Some(anomaly))
        .unwrap_or_else(|| panic!("no check exposing {anomaly:?} in:\n{}", ctx.transcript()))
}

fn assert_control_failed(ctx: &Ctx, anomaly: &str, plan: &str) {
    // Shown by `cargo test -- --nocapture`, and with any failure.
    eprint!("{} under {plan}:\n{}", ctx.case_id(), ctx.transcript());
    assert!(
        !exposes_passed(ctx, anomaly),
        "{} under {plan}: the control claims to expose {anomaly:?} although the race \
         could not happen:\n{}",
        ctx.case_id(),
        ctx.transcript()
    );
}

fn assert_all_passed(ctx: &Ctx) {
    eprint!("{} as written:\n{}", ctx.case_id(), ctx.transcript());
    assert!(
        ctx.failed_checks().is_empty(),
        "{} as written has a failed check:\n{}",
        ctx.case_id(),
        ctx.transcript()
    );
}

/// The control's spec file, as the harness reads it.
fn control(file: &str) -> Spec {
    let dir = Path::new(spec_calls::SPEC_DIR);
    spec::load(dir, file, file).unwrap_or_else(|e| panic!("{e}"))
}

/// Runs `spec` as case `case_id` in a fresh database `database`.
async fn run_spec(env: &Arc<Env>, case_id: &'static str, database: &str, spec: &Spec) -> Ctx {
    let mut ctx = fresh_ctx(env, case_id, database).await;
    let calls = spec_calls::engine();
    spec::run(&mut ctx, database, spec, calls)
        .await
        .expect("the spec runs");
    ctx
}

const L4: &str = "l04_lost_update.spec";
const L5: &str = "l05_overdraft.spec";
const L6: &str = "l06_check_last_line.spec";
const LOST_UPDATE: &str = "lost update (debits reported as done, not in the balance)";
const OVERDRAFT: &str = "overdraft (an ordinary account below 0)";
const CHECK_STOPPED: &str =
    "overdraft attempts that only the CHECK stopped (SQLSTATE 23514, an exception)";
const DUPLICATE: &str = "double debit under two keys, which the CHECK lets pass";

/// L4, L5 and L6 are spec files (a `race call:` of 32 naive debits that meet at the
/// race's barrier between read and write). With one racer the race cannot happen, and
/// each control's `exposes:` must report FAIL; L6's duplicate part, with the key reused
/// as a correct client retries, likewise. As written, every check of each passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn negative_controls_fail_without_a_race_and_pass_with_one() {
    let env = Env::for_tests(SEED, &[&ledger::family()])
        .await
        .expect("scratch cluster and template");
    for (id, file, anomaly) in [
        ("L4", L4, LOST_UPDATE),
        ("L5", L5, OVERDRAFT),
        ("L6", L6, CHECK_STOPPED),
    ] {
        let mut single = control(file);
        single.race.as_mut().expect("a race").count = 1;
        let database = format!("{}_single", id.to_lowercase());
        let ctx = run_spec(&env, id, &database, &single).await;
        assert_control_failed(&ctx, anomaly, "one racer");
        if id == "L6" {
            // The duplicate part does not race: it is exposed whatever the race.
            assert!(exposes_passed(&ctx, DUPLICATE));
        }

        let database = format!("{}_forced", id.to_lowercase());
        let ctx = run_spec(&env, id, &database, &control(file)).await;
        assert_all_passed(&ctx);
        assert!(exposes_passed(&ctx, anomaly));
    }

    // The duplicate with the key reused, as a correct client retries: a replay, not a
    // second debit, so the duplicate check must fail.
    let text = std::fs::read_to_string(Path::new(spec_calls::SPEC_DIR).join(L6)).expect("read L6");
    let reused = text.replace("key=k-0602", "key=k-0601");
    assert_ne!(reused, text, "L6 sends its second debit under k-0602");
    let ctx = run_spec(
        &env,
        "L6",
        "l6_same_key",
        &spec::parse(&reused).expect("parses"),
    )
    .await;
    assert_control_failed(&ctx, DUPLICATE, "the key reused");
}

/// L7's control (a file): with the retry sent under the lost key instead of a new one,
/// there is no second debit, and its `exposes:` must report FAIL; as written it passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_response_control_fails_when_the_retry_keeps_its_key() {
    const L7: &str = "l07_response_lost_after_commit.spec";
    const TWICE: &str = "a retry under a new key debits twice (balance 40)";
    let env = Env::for_tests(SEED, &[&ledger::family()])
        .await
        .expect("scratch cluster and template");
    let text = std::fs::read_to_string(Path::new(spec_calls::SPEC_DIR).join(L7)).expect("L7");
    let kept = text.replace("key=k-0703", "key=k-0702");
    assert_ne!(kept, text, "L7 retries under k-0703");
    let spec = spec::parse(&kept).expect("parses");
    let ctx = run_spec(&env, "L7", "l7_same_key", &spec).await;
    assert_control_failed(&ctx, TWICE, "the key kept");
    let ctx = run_spec(&env, "L7", "l7_new_key", &control(L7)).await;
    assert_all_passed(&ctx);
}

/// L13's REPEATABLE READ race and L14's deadlock control (files), run where the fault
/// cannot happen (the debits, the request-order transfers one after another:
/// `run=one-by-one`), and L17's keyless-retry controls (no dropped connection and no cut
/// answer) must report FAIL; as written every check of each passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadlock_and_keyless_retry_controls_fail_without_their_fault() {
    let env = Env::for_tests(SEED, &[&ledger::family()])
        .await
        .expect("scratch cluster and template");
    // Each file, the call made to run one by one, its control, and the checks that may
    // fail with it: the control and what the race forced (L13: acct-0006's 31 refusals,
    // its balance of 93 and its one debit).
    for (id, file, call, anomaly, may_fail) in [
        (
            "L13",
            "l13_strategies.spec",
            "strategy=repeatable-read account=acct-0006",
            "REPEATABLE READ without a retry hands 40001 to its callers",
            &[
                "step repeatable shows",
                "rows of SELECT a.account_id, a.balance",
                "rows of SELECT regexp_replace(idem_key",
            ][..],
        ),
        (
            "L14",
            "l14_any_to_any.spec",
            "retry=no",
            "locking in request order deadlocks (40P01) between opposite transfers",
            &["step no_retry shows"][..],
        ),
    ] {
        let text = std::fs::read_to_string(Path::new(spec_calls::SPEC_DIR).join(file))
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        let serial = text.replace(call, &format!("{call} run=one-by-one"));
        assert_eq!(
            serial.matches("run=one-by-one").count(),
            1,
            "{file}: {call}"
        );
        let spec = spec::parse(&serial).expect("parses");
        let database = format!("{}_one_by_one", id.to_lowercase());
        let ctx = run_spec(&env, id, &database, &spec).await;
        assert_control_failed(&ctx, anomaly, "one after another");
        let verdict = format!("negative control exposes: {anomaly}");
        for failed in ctx.failed_checks() {
            assert!(
                failed.name == verdict || may_fail.iter().any(|p| failed.name.starts_with(p)),
                "{id} one after another: {:?} failed too:\n{}",
                failed.name,
                ctx.transcript()
            );
        }
        let database = format!("{}_raced", id.to_lowercase());
        let ctx = run_spec(&env, id, &database, &control(file)).await;
        assert_all_passed(&ctx);
        assert!(exposes_passed(&ctx, anomaly));
    }
    l17_controls_fail_without_their_faults(&env).await;
}

/// L17's file with its four fault steps taken out (no dropped connection behind either
/// proxy, no cut answer): nothing is retried, the keyless endpoint debits once, and both
/// `exposes:` must report FAIL; as written every check passes.
async fn l17_controls_fail_without_their_faults(env: &Arc<Env>) {
    const L17: &str = "l17_network_fault_proxy.spec";
    const FAULTS: [&str; 4] = [
        "call drop:",
        "call drop_naive:",
        "call cut:",
        "call cut_naive:",
    ];
    let text = std::fs::read_to_string(Path::new(spec_calls::SPEC_DIR).join(L17)).expect("L17");
    let lines = text.lines();
    let kept: Vec<&str> = lines
        .filter(|line| !FAULTS.iter().any(|f| line.trim_start().starts_with(f)))
        .collect();
    assert_eq!(
        kept.len() + FAULTS.len(),
        text.lines().count(),
        "L17's fault steps"
    );
    let quiet = spec::parse(&kept.join("\n")).expect("parses");
    let ctx = run_spec(env, "L17", "l17_no_faults", &quiet).await;
    for anomaly in [
        "the proxy's own retry of a keyless debit debits twice",
        "a client's retry of a keyless debit after a cut answer debits twice",
    ] {
        assert_control_failed(&ctx, anomaly, "no fault");
    }
    let ctx = run_spec(env, "L17", "l17_faults", &control(L17)).await;
    assert_all_passed(&ctx);
}
