//! The negative controls of family R can fail: each run without its fault (R1 with the
//! named statement straight to PostgreSQL, R3 with the
//! standby's WAL receiver running and caught up) must report its `negative control
//! exposes` check as FAIL; with the fault every check must pass.
//!
//! One scratch PostgreSQL 16 cluster for the binaries; each run starts its own primary
//! and standby, as in a harness run.

use std::sync::Arc;

use case_kit::{Ctx, Env};
use cases_topology::r3_async_standby_loses::{self as r3, Receiver};

/// Seed of this test's environment (the controls use no random input).
const SEED: u64 = 31;

async fn fresh_ctx(env: &Arc<Env>, case_id: &str, database: &str) -> Ctx {
    env.test_ctx(&cases_topology::family(), case_id, database)
        .await
        .expect("a database for the case")
}

fn exposes_passed(ctx: &Ctx, anomaly: &str) -> bool {
    ctx.exposed(Some(anomaly))
        .unwrap_or_else(|| panic!("no check exposing {anomaly:?} in:\n{}", ctx.transcript()))
}

fn assert_all_passed(ctx: &Ctx) {
    eprint!("{} with its fault:\n{}", ctx.case_id(), ctx.transcript());
    assert!(
        ctx.failed_checks().is_empty(),
        "{} with its fault has a failed check:\n{}",
        ctx.case_id(),
        ctx.transcript()
    );
}

fn assert_control_failed(ctx: &Ctx, anomaly: &str) {
    eprint!("{} without its fault:\n{}", ctx.case_id(), ctx.transcript());
    assert!(
        !exposes_passed(ctx, anomaly),
        "{} claims to expose {anomaly:?} without its fault:\n{}",
        ctx.case_id(),
        ctx.transcript()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r3_loses_debits_only_with_the_receiver_stopped() {
    let env = Env::for_tests(SEED, &[&cases_topology::family()])
        .await
        .expect("scratch cluster");
    let mut stopped = fresh_ctx(&env, "R3", "r3_stopped").await;
    r3::run_with(&mut stopped, Receiver::Stopped).await.unwrap();
    assert_all_passed(&stopped);
    let mut running = fresh_ctx(&env, "R3", "r3_running").await;
    r3::run_with(&mut running, Receiver::Running).await.unwrap();
    assert_control_failed(&running, r3::ANOMALY);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r4_overdraws_only_with_replay_paused() {
    use cases_topology::r4_stale_read_decides_funds::{self as r4, Replay};
    let env = Env::for_tests(SEED, &[&cases_topology::family()])
        .await
        .expect("scratch cluster");
    let mut paused = fresh_ctx(&env, "R4", "r4_paused").await;
    r4::run_with(&mut paused, Replay::Paused).await.unwrap();
    assert_all_passed(&paused);
    let mut running = fresh_ctx(&env, "R4", "r4_running").await;
    r4::run_with(&mut running, Replay::Running).await.unwrap();
    assert_control_failed(&running, r4::ANOMALY);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r5_splits_only_when_the_old_primary_returns_as_it_was() {
    use cases_topology::r5_old_primary_returns::{self as r5, Return};
    let env = Env::for_tests(SEED, &[&cases_topology::family()])
        .await
        .expect("scratch cluster");
    let mut as_it_was = fresh_ctx(&env, "R5", "r5_as_it_was").await;
    r5::control(&mut as_it_was, Return::AsItWas).await.unwrap();
    assert_all_passed(&as_it_was);
    let mut as_standby = fresh_ctx(&env, "R5", "r5_as_standby").await;
    r5::control(&mut as_standby, Return::AsStandby)
        .await
        .unwrap();
    assert_control_failed(&as_standby, r5::ANOMALY);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r1_named_statements_fail_only_through_the_pooler() {
    use cases_topology::r1_through_pooler::{self as r1, Route};
    if let Some(reason) = r1::unavailable() {
        eprintln!("R1's control not run: {reason}");
        return;
    }
    let env = Env::for_tests(SEED, &[&cases_topology::family()])
        .await
        .expect("scratch cluster");
    let mut pooled = fresh_ctx(&env, "R1", "r1_pooler").await;
    r1::control(&mut pooled, Route::Pooler).await.unwrap();
    assert_all_passed(&pooled);
    let mut direct = fresh_ctx(&env, "R1", "r1_direct").await;
    r1::control(&mut direct, Route::Direct).await.unwrap();
    assert_control_failed(&direct, r1::ANOMALY);
}
