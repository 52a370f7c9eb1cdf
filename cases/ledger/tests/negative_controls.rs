//! The negative controls L4, L5 and L6 can fail: run where the race cannot happen (the
//! naive debits one after another without a barrier, or a single participant), each
//! control's `negative control exposes` check must report FAIL; so must L6's duplicate
//! check when the client reuses its key. Run with the forced race, every check of each
//! control must pass. L13's REPEATABLE READ row (debits one after another), L14's
//! deadlock control (request-order transfers one after another) and L17's keyless-retry
//! controls (no dropped connection, no cut answer) must likewise report FAIL without
//! their fault.
//!
//! One scratch PostgreSQL 16 cluster (with the ledger template) for the whole binary,
//! one database per run, cloned from the template as `run_case` does.

use std::sync::Arc;

use case_kit::{Ctx, Env};
use cases_ledger::naive::{RACE_PARTICIPANTS, RacePlan};
use cases_ledger::{self as ledger, l04_lost_update, l05_overdraft, l06_check_last_line};

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

fn assert_control_failed(ctx: &Ctx, anomaly: &str, plan: RacePlan) {
    // Shown by `cargo test -- --nocapture`, and with any failure.
    eprint!("{} under {plan:?}:\n{}", ctx.case_id(), ctx.transcript());
    assert!(
        !exposes_passed(ctx, anomaly),
        "{} under {plan:?}: the control claims to expose {anomaly:?} although the race \
         could not happen:\n{}",
        ctx.case_id(),
        ctx.transcript()
    );
}

fn assert_all_passed(ctx: &Ctx) {
    eprint!(
        "{} under the forced race:\n{}",
        ctx.case_id(),
        ctx.transcript()
    );
    assert!(
        ctx.failed_checks().is_empty(),
        "{} under the forced race has a failed check:\n{}",
        ctx.case_id(),
        ctx.transcript()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn negative_controls_fail_without_a_race_and_pass_with_one() {
    let env = Env::for_tests(SEED, &[&ledger::family()])
        .await
        .expect("scratch cluster and template");
    let no_race = [
        ("serial", RacePlan::serial(RACE_PARTICIPANTS)),
        ("single", RacePlan::forced(1)),
    ];

    for (label, plan) in no_race {
        let mut ctx = fresh_ctx(&env, "L4", &format!("l4_{label}")).await;
        l04_lost_update::run_with(&mut ctx, plan)
            .await
            .expect("L4 runs");
        assert_control_failed(&ctx, l04_lost_update::ANOMALY, plan);

        let mut ctx = fresh_ctx(&env, "L5", &format!("l5_{label}")).await;
        l05_overdraft::run_with(&mut ctx, plan)
            .await
            .expect("L5 runs");
        assert_control_failed(&ctx, l05_overdraft::ANOMALY, plan);

        let mut ctx = fresh_ctx(&env, "L6", &format!("l6_{label}")).await;
        l06_check_last_line::run_with(&mut ctx, plan)
            .await
            .expect("L6 runs");
        assert_control_failed(&ctx, l06_check_last_line::RACE_ANOMALY, plan);
        // The duplicate part does not race: it is exposed whatever the plan.
        assert!(exposes_passed(&ctx, l06_check_last_line::DUPLICATE_ANOMALY));
    }

    // The duplicate with the key reused, as a correct client retries: a replay, not a
    // second debit, so the duplicate check must fail.
    let mut ctx = fresh_ctx(&env, "L6", "l6_same_key").await;
    l06_check_last_line::run_duplicate(&mut ctx, ["k-0601", "k-0601"])
        .await
        .expect("L6 duplicate part runs");
    eprint!("L6 duplicate with one key reused:\n{}", ctx.transcript());
    assert!(
        !exposes_passed(&ctx, l06_check_last_line::DUPLICATE_ANOMALY),
        "the duplicate check passed although the key was reused:\n{}",
        ctx.transcript()
    );

    // The same code with the forced race: every check holds.
    let plan = RacePlan::FORCED;
    let mut ctx = fresh_ctx(&env, "L4", "l4_forced").await;
    l04_lost_update::run_with(&mut ctx, plan)
        .await
        .expect("L4 runs");
    assert_all_passed(&ctx);
    assert!(exposes_passed(&ctx, l04_lost_update::ANOMALY));

    let mut ctx = fresh_ctx(&env, "L5", "l5_forced").await;
    l05_overdraft::run_with(&mut ctx, plan)
        .await
        .expect("L5 runs");
    assert_all_passed(&ctx);
    assert!(exposes_passed(&ctx, l05_overdraft::ANOMALY));

    let mut ctx = fresh_ctx(&env, "L6", "l6_forced").await;
    l06_check_last_line::run_with(&mut ctx, plan)
        .await
        .expect("L6 runs");
    assert_all_passed(&ctx);
    assert!(exposes_passed(&ctx, l06_check_last_line::RACE_ANOMALY));
}

/// L14's deadlock control and L17's keyless-retry controls, run where the fault cannot
/// happen (request-order transfers one after another; no dropped connection and no cut
/// answer), must report FAIL; under the case's own plan they pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadlock_and_keyless_retry_controls_fail_without_their_fault() {
    use cases_ledger::{l13_strategies, l14_any_to_any, l17_network_fault_proxy};
    let env = Env::for_tests(SEED, &[&ledger::family()])
        .await
        .expect("scratch cluster and template");

    let mut ctx = fresh_ctx(&env, "L13", "l13_serial").await;
    l13_strategies::run_with(&mut ctx, l13_strategies::Interleaving::Serial)
        .await
        .expect("L13 runs");
    eprint!("L13 serial:\n{}", ctx.transcript());
    assert!(
        !exposes_passed(&ctx, l13_strategies::ANOMALY),
        "L13 claims 40001 with serial debits:\n{}",
        ctx.transcript()
    );

    let mut ctx = fresh_ctx(&env, "L14", "l14_serial").await;
    l14_any_to_any::run_with(&mut ctx, l14_any_to_any::LockPlan::Serial)
        .await
        .expect("L14 runs");
    eprint!("L14 serial:\n{}", ctx.transcript());
    assert!(
        !exposes_passed(&ctx, l14_any_to_any::ANOMALY),
        "L14 claims a deadlock with serial transfers:\n{}",
        ctx.transcript()
    );
    let mut ctx = fresh_ctx(&env, "L14", "l14_forced").await;
    l14_any_to_any::run_with(&mut ctx, l14_any_to_any::LockPlan::ForcedCycle)
        .await
        .expect("L14 runs");
    assert_all_passed(&ctx);

    let mut ctx = fresh_ctx(&env, "L17", "l17_no_faults").await;
    l17_network_fault_proxy::run_with(&mut ctx, l17_network_fault_proxy::NetworkPlan::NoFaults)
        .await
        .expect("L17 runs");
    eprint!("L17 without faults:\n{}", ctx.transcript());
    for anomaly in [
        l17_network_fault_proxy::PROXY_RETRY_ANOMALY,
        l17_network_fault_proxy::CLIENT_RETRY_ANOMALY,
    ] {
        assert!(
            !exposes_passed(&ctx, anomaly),
            "L17 claims {anomaly:?} without a fault:\n{}",
            ctx.transcript()
        );
    }
    let mut ctx = fresh_ctx(&env, "L17", "l17_faults").await;
    l17_network_fault_proxy::run_with(&mut ctx, l17_network_fault_proxy::NetworkPlan::Faults)
        .await
        .expect("L17 runs");
    assert_all_passed(&ctx);
}
