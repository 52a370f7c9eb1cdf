//! The withdrawal negative controls of F14 and F15 can fail: run where the fault cannot
//! happen, each control's `negative control exposes` check must report FAIL, and with
//! the fault every check of the control must pass.
//!
//! - F14's naive executor (retry under a new id) with the network answering normally:
//!   no answer is lost, so it never retries, and only one transfer goes out.
//! - F15's call inside the freezing transaction with no hold on the network's answer:
//!   the lock is held only for a moment, so the placement does not wait.
//!
//! One scratch PostgreSQL 16 cluster with the F template, one database per run, a fresh
//! `net-standin` per run; the binaries are the debug ones (`cargo build --bins`).

use std::sync::Arc;

use case_kit::{Ctx, Env, Line, Resource};
use cases::frozen::network::StandIn;
use cases::frozen::{
    self, f14_lost_answer_and_a_crash as f14, f15_no_external_call_under_a_lock as f15,
};

/// Seed of this test's environment (the controls use no random input).
const SEED: u64 = 13;

async fn fresh_ctx(env: &Arc<Env>, case_id: &'static str, database: &str) -> Ctx {
    let admin = env.connect("postgres").await.expect("connect as admin");
    admin
        .batch_execute(&format!(
            "CREATE DATABASE \"{database}\" TEMPLATE {}",
            frozen::TEMPLATE_DATABASE
        ))
        .await
        .expect("clone the template");
    Ctx::new(
        env.clone(),
        "F",
        case_id,
        Resource::Database(database.to_owned()),
    )
}

fn transcript(ctx: &Ctx) -> String {
    ctx.lines()
        .iter()
        .map(|line| line.render() + "\n")
        .collect()
}

fn exposes_passed(ctx: &Ctx, anomaly: &str) -> bool {
    let name = format!("negative control exposes: {anomaly}");
    ctx.lines()
        .iter()
        .find_map(|line| match line {
            Line::Check(check) if check.name == name => Some(check.passed),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no check {name:?} in:\n{}", transcript(ctx)))
}

fn all_passed(ctx: &Ctx) -> bool {
    !ctx.lines()
        .iter()
        .any(|line| matches!(line, Line::Check(check) if !check.passed))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn withdrawal_controls_fail_without_the_fault_and_pass_with_it() {
    let env = Env::for_tests(SEED, &[&frozen::family()])
        .await
        .expect("scratch cluster and template");

    // F14 without a lost answer: one transfer, so the control must FAIL.
    let mut ctx = fresh_ctx(&env, "F14", "f14_no_drop").await;
    let net = StandIn::start(&ctx).await.expect("stand-in");
    f14::run_control(&mut ctx, &net, false)
        .await
        .expect("F14 control runs");
    eprint!("F14 control, answer not dropped:\n{}", transcript(&ctx));
    assert!(
        !exposes_passed(&ctx, f14::ANOMALY),
        "the F14 control claims two transfers although no answer was lost:\n{}",
        transcript(&ctx)
    );
    drop(net);

    // F14 with the lost answer: every check holds.
    let mut ctx = fresh_ctx(&env, "F14", "f14_drop").await;
    let net = StandIn::start(&ctx).await.expect("stand-in");
    f14::run_control(&mut ctx, &net, true)
        .await
        .expect("F14 control runs");
    eprint!("F14 control, answer dropped:\n{}", transcript(&ctx));
    assert!(
        all_passed(&ctx),
        "F14 control failed:\n{}",
        transcript(&ctx)
    );
    assert!(exposes_passed(&ctx, f14::ANOMALY));
    drop(net);

    // F15 without a hold: the lock is short, so the control must FAIL.
    let mut ctx = fresh_ctx(&env, "F15", "f15_no_hold").await;
    let net = StandIn::start(&ctx).await.expect("stand-in");
    f15::run_control(&mut ctx, &net, 0)
        .await
        .expect("F15 control runs");
    eprint!("F15 control, no hold:\n{}", transcript(&ctx));
    assert!(
        !exposes_passed(&ctx, f15::ANOMALY),
        "the F15 control claims a wait although the network answered at once:\n{}",
        transcript(&ctx)
    );
    drop(net);

    // F15 with the hold: every check holds.
    let mut ctx = fresh_ctx(&env, "F15", "f15_hold").await;
    let net = StandIn::start(&ctx).await.expect("stand-in");
    f15::run_control(&mut ctx, &net, f15::HOLD_MS)
        .await
        .expect("F15 control runs");
    eprint!("F15 control, hold:\n{}", transcript(&ctx));
    assert!(
        all_passed(&ctx),
        "F15 control failed:\n{}",
        transcript(&ctx)
    );
    assert!(exposes_passed(&ctx, f15::ANOMALY));
}
