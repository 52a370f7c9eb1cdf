//! The negative controls of L20–L22 can fail: each runs under a plan where its fault
//! cannot happen, and its check `negative control exposes: <anomaly>` must report FAIL.
//!
//! - L20 (a case file) with `writes=none`, no writes and no forced debit between two
//!   reads: the separate statements see one unchanging ledger and report nothing.
//! - L21 (a case file) with the lost order retried under the SAME key: a replay, no
//!   order paid twice.
//! - L22 (a case file) with the split-registry workers run to the end, not stopped and
//!   killed between their two commits: each retry replays, one debit each, so neither
//!   control misbehaves.
//!
//! L21 starts the debug `ledger-svc`, L22 the debug `crash-worker`, next to the test
//! binary (`cargo build --bins` first). One scratch PostgreSQL 16 cluster (with the ledger template) per test, one
//! database per run, cloned from the template as `run_case` does.

use std::sync::Arc;

use case_kit::{Ctx, Env};
use cases_ledger::{self as ledger, spec_calls};

/// Seed of this test's environment (the controls draw no random input that matters).
const SEED: u64 = 21;

/// A context for `case_id` on a fresh clone of the template named `database`.
async fn fresh_ctx(env: &Arc<Env>, case_id: &'static str, database: &str) -> Ctx {
    env.test_ctx(&ledger::family(), case_id, database)
        .await
        .expect("clone the template")
}

/// Asserts that the check exposing `anomaly` exists and FAILED.
fn assert_control_failed(ctx: &Ctx, anomaly: &str, plan: &str) {
    eprint!("{} under {plan}:\n{}", ctx.case_id(), ctx.transcript());
    let exposed = ctx
        .exposed(Some(anomaly))
        .unwrap_or_else(|| panic!("no check exposing {anomaly:?} in:\n{}", ctx.transcript()));
    assert!(
        !exposed,
        "{} under {plan}: the control claims {anomaly:?} although its fault could not \
         happen:\n{}",
        ctx.case_id(),
        ctx.transcript()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn l21_same_key_retry_pays_no_order_twice() {
    use case_kit::spec;
    const ANOMALY: &str =
        "a retry under a new key pays order ord-2102 twice; L11 sees nothing, the orders do";
    let env = Env::for_tests(SEED, &[&ledger::family()])
        .await
        .expect("scratch cluster and template");
    let path = std::path::Path::new(spec_calls::SPEC_DIR).join("l21_business_reconciliation.spec");
    let text = std::fs::read_to_string(path).expect("L21's file");
    let same_key = text.replace("key=k-2103", "key=k-2102");
    assert_ne!(same_key, text, "L21 retries ord-2102 under k-2103");
    for (database, text, exposed) in [("l21_same_key", &same_key, false), ("l21", &text, true)] {
        let mut ctx = fresh_ctx(&env, "L21", database).await;
        let calls = spec_calls::engine();
        let spec = spec::parse(text).expect("L21 parses");
        spec::run(&mut ctx, database, &spec, calls)
            .await
            .expect("the spec runs");
        if !exposed {
            assert_control_failed(&ctx, ANOMALY, "a same-key retry");
            continue;
        }
        eprint!("L21 as written:\n{}", ctx.transcript());
        assert_eq!(
            ctx.exposed(Some(ANOMALY)),
            Some(true),
            "{}",
            ctx.transcript()
        );
        assert!(ctx.failed_checks().is_empty(), "{}", ctx.transcript());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn l20_separate_statements_find_nothing_without_writes() {
    use case_kit::spec;
    const ANOMALY: &str =
        "separate READ COMMITTED statements report findings in a consistent ledger under writes";
    let env = Env::for_tests(SEED, &[&ledger::family()])
        .await
        .expect("scratch cluster and template");
    let path =
        std::path::Path::new(spec_calls::SPEC_DIR).join("l20_reconciliation_during_writes.spec");
    let text = std::fs::read_to_string(path).expect("L20's file");
    // The writers stop at once and no debit is forced: nothing changes between two reads.
    let quiet = text.replace("writes=forced", "writes=none");
    assert_ne!(quiet, text, "L20 forces writes between the reads");
    for (database, text, exposed) in [("l20_quiet", &quiet, false), ("l20", &text, true)] {
        let mut ctx = fresh_ctx(&env, "L20", database).await;
        let calls = spec_calls::engine();
        let spec = spec::parse(text).expect("L20 parses");
        spec::run(&mut ctx, database, &spec, calls)
            .await
            .expect("the spec runs");
        if !exposed {
            assert_control_failed(&ctx, ANOMALY, "no writes between the reads");
            continue;
        }
        eprint!("L20 as written:\n{}", ctx.transcript());
        assert!(ctx.failed_checks().is_empty(), "{}", ctx.transcript());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn l22_split_registry_without_a_kill_debits_once() {
    use case_kit::spec;
    const KEY_FIRST: &str =
        "key committed first: the retry replays OK and nothing was debited (a lost debit)";
    const DEBIT_FIRST: &str = "debit committed first: the retry debits again";
    let env = Env::for_tests(SEED, &[&ledger::family()])
        .await
        .expect("scratch cluster and template");
    let path =
        std::path::Path::new(spec_calls::SPEC_DIR).join("l22_registry_in_another_database.spec");
    let text = std::fs::read_to_string(path).expect("L22's file");
    // The split workers run to their end: nothing is left between the two commits.
    let no_kill = text.replace(" stop=between-commits", "");
    assert_ne!(
        no_kill, text,
        "L22 stops its split workers between the commits"
    );
    for (database, text, exposed) in [("l22_no_kill", &no_kill, false), ("l22", &text, true)] {
        let mut ctx = fresh_ctx(&env, "L22", database).await;
        let calls = spec_calls::engine();
        let spec = spec::parse(text).expect("L22 parses");
        spec::run(&mut ctx, database, &spec, calls)
            .await
            .expect("the spec runs");
        if !exposed {
            assert_control_failed(&ctx, KEY_FIRST, "no kill between the commits");
            assert_control_failed(&ctx, DEBIT_FIRST, "no kill between the commits");
            continue;
        }
        eprint!("L22 as written:\n{}", ctx.transcript());
        assert!(ctx.failed_checks().is_empty(), "{}", ctx.transcript());
    }
}
