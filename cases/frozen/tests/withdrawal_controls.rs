//! The withdrawal negative controls of F14 and F15 can fail: run where the fault cannot
//! happen, each control's `negative control exposes` check must report FAIL, and with
//! the fault every check of the control must pass.
//!
//! - F14's naive executor (retry under a new id; F14 is a spec file, run with its
//!   `network-drop` before carol's broadcast taken out) with the network answering
//!   normally: no answer is lost, so it never retries, and only one transfer goes out.
//! - F15's call inside the freezing transaction with the network answering at once and
//!   the placement started only after the naive transaction ended: it cannot be blocked.
//!
//! One scratch PostgreSQL 16 cluster with the F template, one database per run, a fresh
//! `net-standin` per run; the binaries are the debug ones (`cargo build --bins`).

use std::path::Path;
use std::sync::Arc;

use case_kit::spec;
use case_kit::{Ctx, Env};
use cases_frozen::fixtures::Plan;
use cases_frozen::network::StandIn;
use cases_frozen::{self as frozen, f15_no_external_call_under_a_lock as f15, spec_calls};

/// Seed of this test's environment (the controls use no random input).
const SEED: u64 = 13;

async fn fresh_ctx(env: &Arc<Env>, case_id: &'static str, database: &str) -> Ctx {
    env.test_ctx(&frozen::family(), case_id, database)
        .await
        .expect("clone the template")
}

fn exposes_passed(ctx: &Ctx, anomaly: &str) -> bool {
    ctx.exposed(Some(anomaly))
        .unwrap_or_else(|| panic!("no check exposing {anomaly:?} in:\n{}", ctx.transcript()))
}

fn all_passed(ctx: &Ctx) -> bool {
    ctx.failed_checks().is_empty()
}

/// F14's file and the anomaly its control exposes.
const F14: &str = "f14_lost_answer_and_a_crash.spec";
const F14_ANOMALY: &str = "a retry under a new id sends a second transfer for one withdrawal";

/// Runs the spec text `text` as F14 in a fresh database `database` (the case's own
/// operations: its network and executors, ended with the case).
async fn run_spec_text(env: &Arc<Env>, database: &str, text: &str) -> Ctx {
    let mut ctx = fresh_ctx(env, "F14", database).await;
    let parsed = spec::parse(text).expect("F14 parses");
    spec::run(&mut ctx, database, &parsed, spec_calls::engine())
        .await
        .expect("F14 runs");
    eprint!("F14 ({database}):\n{}", ctx.transcript());
    ctx
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn withdrawal_controls_fail_without_the_fault_and_pass_with_it() {
    let env = Env::for_tests(SEED, &[&frozen::family()])
        .await
        .expect("scratch cluster and template");

    // F14 (a file) without the lost answer of carol's broadcast: one transfer, so the
    // control must FAIL; as written, every check holds.
    let text =
        std::fs::read_to_string(Path::new(spec_calls::SPEC_DIR).join(F14)).expect("read F14");
    let no_drop = text.replacen("  call carol_drop: network-drop count=1\n", "", 1);
    assert_ne!(no_drop, text, "F14 drops the answer to carol's broadcast");
    let ctx = run_spec_text(&env, "f14_no_drop", &no_drop).await;
    assert!(
        !exposes_passed(&ctx, F14_ANOMALY),
        "the F14 control claims two transfers although no answer was lost:\n{}",
        ctx.transcript()
    );
    let ctx = run_spec_text(&env, "f14_drop", &text).await;
    assert!(all_passed(&ctx), "F14 failed:\n{}", ctx.transcript());
    assert!(exposes_passed(&ctx, F14_ANOMALY));

    // F15 without a hold, the placement after the naive transaction: the control must FAIL.
    let mut ctx = fresh_ctx(&env, "F15", "f15_no_hold").await;
    let net = StandIn::start(&ctx).await.expect("stand-in");
    f15::run_control(&mut ctx, &net, Plan::Harmless)
        .await
        .expect("F15 control runs");
    eprint!("F15 control, no hold:\n{}", ctx.transcript());
    assert!(
        !exposes_passed(&ctx, f15::ANOMALY),
        "the F15 control claims a blocked placement although the naive transaction had ended:\n{}",
        ctx.transcript()
    );
    drop(net);

    // F15 with the hold: every check holds.
    let mut ctx = fresh_ctx(&env, "F15", "f15_hold").await;
    let net = StandIn::start(&ctx).await.expect("stand-in");
    f15::run_control(&mut ctx, &net, Plan::Forced)
        .await
        .expect("F15 control runs");
    eprint!("F15 control, hold:\n{}", ctx.transcript());
    assert!(
        all_passed(&ctx),
        "F15 control failed:\n{}",
        ctx.transcript()
    );
    assert!(exposes_passed(&ctx, f15::ANOMALY));
}
