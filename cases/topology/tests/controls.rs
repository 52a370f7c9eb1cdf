//! The negative controls of family R can fail: each run without its fault (R1 with the
//! named statement straight to PostgreSQL, R2's with the service as built and with a
//! synchronous standby whose waits are cancelled, R3 with the standby's WAL receiver running and caught up, R4's
//! file with replay running and the standby caught up) must report its `negative control
//! exposes` check as FAIL; with the fault every check must pass. R2's own claims fail
//! against the service's earlier rule (the planted bug `trust-cancelled-commit`). R2, R3
//! and R4 are files, run with their faults taken out by edits of the file. R9's control
//! (a paused Patroni leader) loses acknowledged debits without `synchronous_mode` only:
//! run in `synchronous_mode`, its `exposes:` fails. R11's control (an asynchronous Patroni
//! promotion within `maximum_lag_on_failover`) loses the tail only with the standby's
//! receiver stopped: caught up, it loses nothing.
//!
//! One scratch PostgreSQL 16 cluster for the binaries; each run starts its own primary
//! and standby, as in a harness run.

use std::sync::Arc;

use case_kit::spec::{self, Spec};
use case_kit::{Ctx, Env};
use cases_topology::spec_engine::{PairEngine, SPEC_DIR};

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
    // R3 is a case file: as committed every check passes; with the receiver left
    // running and the standby waited for instead, nothing is lost and its exposes fails
    // (and the checks of what the stop forced: received_all, the lost keys, the retry).
    let env = Env::for_tests(SEED, &[&cases_topology::family()])
        .await
        .expect("scratch cluster");
    let name = "r03_async_standby_loses.spec";
    let failed = file_failed(&env, "R3", name, spec_file(name, &[])).await;
    assert!(
        failed.is_empty(),
        "as committed every check passes: {failed:?}"
    );
    let running = [
        ("f_stop: stop-receiver", "f_stop: wait-replayed"),
        ("f_received: received-all", "f_received: wait-replayed"),
    ];
    let failed = file_failed(&env, "R3", name, spec_file(name, &running)).await;
    assert!(
        failed
            .iter()
            .any(|f| f.contains("negative control exposes")),
        "with the receiver running the exposes check fails: {failed:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r4_overdraws_only_with_replay_paused() {
    // R4 is a case file: as committed every check passes; with the pause taken out and
    // the standby waited for instead, the read is fresh and only its exposes fails.
    let env = Env::for_tests(SEED, &[&cases_topology::family()])
        .await
        .expect("scratch cluster");
    let name = "r04_stale_read_decides_funds.spec";
    let failed = file_failed(&env, "R4", name, spec_file(name, &[])).await;
    assert!(
        failed.is_empty(),
        "as committed every check passes: {failed:?}"
    );
    let running = [
        ("s_pause: pause-replay", "s_pause: wait-replayed"),
        ("s_paused: wait-paused", "s_paused: wait-replayed"),
    ];
    let failed = file_failed(&env, "R4", name, spec_file(name, &running)).await;
    assert!(
        failed.len() == 1 && failed[0].contains("negative control exposes"),
        "with replay running only the exposes check fails: {failed:?}"
    );
}

/// The case file `name` with each `(from, to)` of `edits` applied, parsed.
fn spec_file(name: &str, edits: &[(&str, &str)]) -> Spec {
    spec::load_edited(std::path::Path::new(SPEC_DIR), name, edits).expect("the file")
}

/// Runs `spec` (the file `name`) as case `id`; returns its failed checks.
async fn file_failed(env: &Arc<Env>, id: &str, name: &str, spec: Spec) -> Vec<String> {
    let shown = format!("cases/topology/specs/{name}");
    let engine = Arc::new(PairEngine::default());
    let case = spec::spec_case(id.into(), shown, Arc::new(spec), engine);
    let report = case_kit::run_case(env.clone(), &cases_topology::family(), &case).await;
    let transcript = report.transcript();
    eprint!("{transcript}");
    let failed = transcript.lines();
    let failed = failed.filter(|line| line.trim_start().starts_with("FAIL"));
    failed.map(String::from).collect()
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

/// R2's file.
const R2: &str = "r02_sync_failover.spec";

/// R2's control without the asynchronous standby: a synchronous one, whose COMMITs are
/// seen waiting and cancelled before the answers, as the earlier rule's control does.
const R2_ASYNC_MADE_SYNC: [(&str, &str); 3] = [
    (
        "a_pair: new-pair replication=asynchronous",
        "a_pair: new-pair replication=synchronous",
    ),
    (
        "  call a_answers: answers group=async",
        "  call a_waiting: syncrep-waits group=async\n  step a_cancel: SELECT count(*) FILTER \
         (WHERE pg_cancel_backend(pid)) > 0 AS signalled FROM pg_stat_activity WHERE \
         datname = current_database() AND wait_event = 'SyncRep'\n  call a_answers: answers group=async",
    ),
    ("a_send a_answers", "a_send a_waiting a_cancel a_answers"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r2_controls_lose_acknowledged_debits_only_with_their_fault() {
    // R2 is a case file: as committed every check passes; with its controls' faults taken
    // out (the service as built instead of the earlier rule; a synchronous standby whose
    // waits are cancelled instead of an asynchronous one) neither control acknowledges a
    // debit, nothing is lost, and only the controls' checks fail, both exposes among them.
    let env = Env::for_tests(SEED, &[&cases_topology::family()])
        .await
        .expect("scratch cluster");
    let failed = file_failed(&env, "R2", R2, spec_file(R2, &[])).await;
    assert!(
        failed.is_empty(),
        "as committed every check passes: {failed:?}"
    );
    let mut edits = vec![(" planted=trust-cancelled-commit", "")];
    edits.extend(R2_ASYNC_MADE_SYNC);
    let failed = file_failed(&env, "R2", R2, spec_file(R2, &edits)).await;
    for anomaly in ["(trusted cancelled commit)", "(asynchronous standby)"] {
        assert!(
            failed
                .iter()
                .any(|f| f.contains("negative control exposes") && f.contains(anomaly)),
            "without its fault the control {anomaly} does not expose: {failed:?}"
        );
    }
    let controls = ["exposes", "step t_", "step a_"];
    assert!(
        failed
            .iter()
            .all(|f| controls.iter().any(|c| f.contains(c))),
        "without the controls' faults only the controls' checks fail: {failed:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r2_claims_fail_against_the_earlier_rule() {
    // Every service of R2's own schedule started with the planted bug
    // `trust-cancelled-commit` (COMMIT's success trusted after the server's warning, a
    // replay answered without its cover): the debits whose waits were cancelled are
    // acknowledged, so is their same-key retry while the standby is stopped, and the
    // failover takes them away.
    let env = Env::for_tests(SEED, &[&cases_topology::family()])
        .await
        .expect("scratch cluster");
    let planted = |from: &'static str| (from, format!("{from} planted=trust-cancelled-commit"));
    let edits: Vec<(&str, String)> = [
        "pair-service name=long",
        "pair-service name=short",
        "pair-service name=batch",
        "pair-service name=killed",
    ]
    .into_iter()
    .map(planted)
    .collect();
    let edits: Vec<(&str, &str)> = edits.iter().map(|(f, t)| (*f, t.as_str())).collect();
    let failed = file_failed(&env, "R2", R2, spec_file(R2, &edits)).await;
    for claim in [
        "step b_answers shows 503 UNKNOWN=8",
        "step c_answers shows 503 UNKNOWN=8",
        "step rb_answers shows 503 UNKNOWN=8",
        "step n_astray shows astray=0",
    ] {
        assert!(
            failed.iter().any(|f| f.contains(claim)),
            "against the earlier rule {claim:?} did not fail: {failed:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r9_loses_acknowledged_debits_only_without_synchronous_mode() {
    use cases_topology::r9_patroni_paused_leader as r9;
    if let Some(why) = cases_topology::managed::unavailable() {
        eprintln!("R9's control not run: {why}");
        return;
    }
    let env = Env::for_tests(SEED, &[&cases_topology::family()])
        .await
        .expect("scratch cluster");
    let mut asynchronous = fresh_ctx(&env, "R9", "r9_asynchronous").await;
    r9::control(&mut asynchronous, false).await.unwrap();
    assert_all_passed(&asynchronous);
    let mut synchronous = fresh_ctx(&env, "R9", "r9_synchronous").await;
    r9::control(&mut synchronous, true).await.unwrap();
    assert_control_failed(&synchronous, r9::ANOMALY);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r11_loses_the_tail_only_with_the_receiver_stopped() {
    use cases_topology::r11_patroni_async_lag as r11;
    if let Some(why) = cases_topology::managed::unavailable() {
        eprintln!("R11's control not run: {why}");
        return;
    }
    let env = Env::for_tests(SEED, &[&cases_topology::family()])
        .await
        .expect("scratch cluster");
    let mut stopped = fresh_ctx(&env, "R11", "r11_stopped").await;
    r11::control(&mut stopped, true).await.unwrap();
    assert_all_passed(&stopped);
    let mut running = fresh_ctx(&env, "R11", "r11_running").await;
    r11::control(&mut running, false).await.unwrap();
    assert_control_failed(&running, r11::ANOMALY);
}
