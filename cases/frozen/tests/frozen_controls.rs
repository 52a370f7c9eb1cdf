//! The F-family negative controls can fail: each runs where its fault cannot happen and
//! its `negative control exposes` check must report FAIL. The spec files F6, F7, F8, F9,
//! F18, F19, F21, F22 and F24 run with their fault taken out ([`SPEC_CONTROLS`]: no failure after the
//! update, the retry under the lost business id, no pause of F8's first holders (so the
//! second reads only once the first is done), the naive settlements of a pair one after
//! the other, the current price equal to the limit, a single fill). As written (as
//! `./run.sh` runs them), every check passes.
//!
//! One scratch PostgreSQL 16 cluster (with the frozen template) for the whole binary,
//! one database per run. F7 starts the debug `ledger-svc` (`cargo build --bins` first).

use std::path::Path;
use std::sync::Arc;

use case_kit::spec;
use case_kit::{Ctx, Env};
use cases_frozen::{self as frozen, spec_calls};

/// Seed of this test's environment (the controls use no random input).
const SEED: u64 = 12;

/// A context for `case_id` on a fresh clone of the template named `database`.
async fn fresh_ctx(env: &Arc<Env>, case_id: &'static str, database: &str) -> Ctx {
    env.test_ctx(&frozen::family(), case_id, database)
        .await
        .expect("clone the template")
}

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

fn all_passed(ctx: &Ctx) -> bool {
    ctx.failed_checks().is_empty()
}

/// The controls written as spec files, each with the edits that take its fault away
/// (`(from, to)`, each replaced once): F6's naive placement without its failure, F7's
/// retry under the lost business id, F8's first holders without their pauses (each
/// second holder reads once the first is done), F9's request-order settlements without
/// `at-once=yes` (one after the other), F18's naive cancel at the limit price itself
/// (the recomputation happens to give the freeze record's figure), F19's order filled by
/// a single fill of 1.0 (no second fill to swallow), F21's naive placement without the
/// script's refund on judy's row (no writer skips the lock), F22's unchecked placements
/// on 12 000 USDT (their second freeze fits, so the ignored count hides nothing), F24
/// without the change of rule (one version: recomputing with the current rule is right).
type Edits = &'static [(&'static str, &'static str)];
const SPEC_CONTROLS: [(&str, &str, Edits); 9] = [
    (
        "F6",
        "f06_failure_between_update_and_movement.spec",
        &[("\n    fail=after-update", "")],
    ),
    (
        "F7",
        "f07_response_lost_after_commit.spec",
        &[("key=place-0703", "key=place-0702")],
    ),
    (
        "F8",
        "f08_lock_released_before_commit.spec",
        &[
            (
                "release=before-commit pause=before-commit",
                "release=before-commit",
            ),
            ("lease-ms=100 pause=after-read", "lease-ms=100"),
        ],
    ),
    (
        "F9",
        "f09_deadlocks_between_opposite_trades.spec",
        &[("order=request pairs=4 at-once=yes", "order=request pairs=4")],
    ),
    (
        "F18",
        "f18_release_at_the_current_price.spec",
        &[("current=4900", "current=5000")],
    ),
    (
        "F19",
        "f19_order_id_as_business_id.spec",
        &[(
            "qty=0.5 price=4900 key=order-3\n  call order_fill_b: fill buy=#3 sell=#4 qty=0.5",
            "qty=1.0",
        )],
    ),
    (
        "F21",
        "f21_a_writer_that_skips_the_lock.spec",
        &[("n_judy s_judy s_resume", "n_judy s_resume")],
    ),
    (
        "F22",
        "f22_affected_rows_ignored.spec",
        &[
            (
                "account=mia asset=USDT amount=6000",
                "account=mia asset=USDT amount=12000",
            ),
            (
                "account=nina asset=USDT amount=6000",
                "account=nina asset=USDT amount=12000",
            ),
        ],
    ),
    (
        "F24",
        "f24_the_rounding_rules_version.spec",
        &[("fill_v1 rule_v2 release_v1", "fill_v1 release_v1")],
    ),
];

/// Runs the spec text `text` as `case_id` in a fresh database `database`.
async fn run_spec_text(env: &Arc<Env>, case_id: &'static str, database: &str, text: &str) -> Ctx {
    let mut ctx = fresh_ctx(env, case_id, database).await;
    let parsed = spec::parse(text).unwrap_or_else(|e| panic!("{case_id}: {e}"));
    spec::run(&mut ctx, database, &parsed, spec_calls::engine())
        .await
        .unwrap_or_else(|e| panic!("{case_id} fails to run: {e:#}"));
    eprint!("{case_id} ({database}):\n{}", ctx.transcript());
    ctx
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_spec_controls_fail_where_the_fault_cannot_happen() {
    let env = Env::for_tests(SEED, &[&frozen::family()])
        .await
        .expect("scratch cluster and template");
    for (case_id, file, edits) in SPEC_CONTROLS {
        let text = std::fs::read_to_string(Path::new(spec_calls::SPEC_DIR).join(file))
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        let mut edited = text.clone();
        for (fault, harmless) in edits {
            let next = edited.replacen(fault, harmless, 1);
            assert_ne!(next, edited, "{file} no longer holds {fault:?}");
            edited = next;
        }
        let database = format!("{}_harmless", case_id.to_lowercase());
        let ctx = run_spec_text(&env, case_id, &database, &edited).await;
        assert!(
            exposes(&ctx).iter().all(|passed| !passed),
            "{case_id}: the control claims to expose its anomaly without its fault:\n{}",
            ctx.transcript()
        );
        let database = format!("{}_forced", case_id.to_lowercase());
        let ctx = run_spec_text(&env, case_id, &database, &text).await;
        assert!(
            all_passed(&ctx) && exposes(&ctx).iter().all(|passed| *passed),
            "{case_id} as written has a failed check:\n{}",
            ctx.transcript()
        );
    }
}
