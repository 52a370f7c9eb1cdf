//! The withdrawal negative controls of F14 and F15 can fail: run where the fault cannot
//! happen, each control's `negative control exposes` check must report FAIL, and with
//! the fault every check of the control must pass.
//!
//! - F14's naive executor (retry under a new id; F14 is a spec file, run with its
//!   `network-drop` before carol's broadcast taken out) with the network answering
//!   normally: no answer is lost, so it never retries, and only one transfer goes out.
//! - F15's call inside the freezing transaction (F15 is a spec file, run with its
//!   `network-hold` before the naive withdrawal taken out): the network answers at once,
//!   the naive transaction has ended before the placement is sent, so it cannot be
//!   blocked.
//!
//! One scratch PostgreSQL 16 cluster with the F template, one database per run, a fresh
//! `net-standin` per run; the binaries are the debug ones (`cargo build --bins`).

use std::path::Path;
use std::sync::Arc;

use case_kit::spec;
use case_kit::{Ctx, Env};
use cases_frozen::{self as frozen, spec_calls};

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

/// F15's file and the anomaly its control exposes.
const F15: &str = "f15_no_external_call_under_a_lock.spec";
const F15_ANOMALY: &str =
    "a call inside the freezing transaction makes a placement on the same row wait for the network";

/// Runs the spec text `text` as `case_id` in a fresh database `database` (the case's own
/// operations: its network and executors, ended with the case).
async fn run_spec_text(env: &Arc<Env>, case_id: &'static str, database: &str, text: &str) -> Ctx {
    let mut ctx = fresh_ctx(env, case_id, database).await;
    let parsed = spec::parse(text).unwrap_or_else(|e| panic!("{case_id} parses: {e}"));
    spec::run(&mut ctx, database, &parsed, spec_calls::engine())
        .await
        .unwrap_or_else(|e| panic!("{case_id} runs: {e:#}"));
    eprint!("{case_id} ({database}):\n{}", ctx.transcript());
    ctx
}

/// The file `file` as written, and with `edits` (each `(from, to)`, replaced once).
fn file_and_edited(file: &str, edits: &[(&str, &str)]) -> (String, String) {
    let text = std::fs::read_to_string(Path::new(spec_calls::SPEC_DIR).join(file))
        .unwrap_or_else(|e| panic!("{file}: {e}"));
    let mut edited = text.clone();
    for (from, to) in edits {
        let next = edited.replacen(from, to, 1);
        assert_ne!(next, edited, "{file} no longer holds {from:?}");
        edited = next;
    }
    (text, edited)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn withdrawal_controls_fail_without_the_fault_and_pass_with_it() {
    let env = Env::for_tests(SEED, &[&frozen::family()])
        .await
        .expect("scratch cluster and template");

    // F14 (a file) without the lost answer of carol's broadcast: one transfer, so the
    // control must FAIL; as written, every check holds.
    let (text, no_drop) =
        file_and_edited(F14, &[("  call carol_drop: network-drop count=1\n", "")]);
    let ctx = run_spec_text(&env, "F14", "f14_no_drop", &no_drop).await;
    assert!(
        !exposes_passed(&ctx, F14_ANOMALY),
        "the F14 control claims two transfers although no answer was lost:\n{}",
        ctx.transcript()
    );
    let ctx = run_spec_text(&env, "F14", "f14_drop", &text).await;
    assert!(all_passed(&ctx), "F14 failed:\n{}", ctx.transcript());
    assert!(exposes_passed(&ctx, F14_ANOMALY));

    // F15 (a file) without the hold of the naive withdrawal's answer: it ends before the
    // placement is sent, so the control must FAIL (and the release that follows finds
    // nothing held); as written, every check holds.
    let (text, no_hold) = file_and_edited(
        F15,
        &[
            ("  call hold_naive: network-hold\n", ""),
            (" hold_naive naive ", " naive "),
        ],
    );
    let ctx = run_spec_text(&env, "F15", "f15_no_hold", &no_hold).await;
    assert!(
        !exposes_passed(&ctx, F15_ANOMALY),
        "the F15 control claims a blocked placement although the naive transaction had ended:\n{}",
        ctx.transcript()
    );
    // Nothing was held, so the release finds nothing to release: that check fails too.
    let failed: Vec<&str> = ctx
        .failed_checks()
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(
        failed,
        [
            "step release_naive shows released=1",
            &format!("negative control exposes: {F15_ANOMALY}")
        ],
        "F15 without the hold fails more than its control:\n{}",
        ctx.transcript()
    );
    let ctx = run_spec_text(&env, "F15", "f15_hold", &text).await;
    assert!(all_passed(&ctx), "F15 failed:\n{}", ctx.transcript());
    assert!(exposes_passed(&ctx, F15_ANOMALY));
}
