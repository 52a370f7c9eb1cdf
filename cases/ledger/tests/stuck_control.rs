//! L18's negative control can fail: run where no transaction is stuck (the control's
//! session takes no lock), the debit in front of the unbounded service is answered at
//! once, so the check `negative control exposes: <anomaly>` must report FAIL, while every
//! other check of the case still passes. Starts the debug `ledger-svc` next to the test
//! binary (`cargo build --bins` first).

use case_kit::{Env, Line};
use cases_ledger::{self as ledger, l18_stuck_transaction};

/// Seed of this test's environment (the case draws no random input).
const SEED: u64 = 18;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_unbounded_control_fails_when_nothing_is_stuck() {
    let env = Env::for_tests(SEED, &[&ledger::family()])
        .await
        .expect("scratch cluster and template");
    let mut ctx = env
        .test_ctx(&ledger::family(), "L18", "l18_nothing_stuck")
        .await
        .expect("clone the template");
    l18_stuck_transaction::run_with(&mut ctx, l18_stuck_transaction::ControlPlan { hold: false })
        .await
        .expect("L18 runs");
    let transcript = ctx.transcript();
    eprint!("L18 with nothing stuck in the control:\n{transcript}");
    let name = format!(
        "negative control exposes: {}",
        l18_stuck_transaction::anomaly()
    );
    let mut control = None;
    let mut other_failures = 0;
    for line in ctx.lines() {
        if let Line::Check(check) = line {
            if check.name == name {
                control = Some(check.passed);
            } else if !check.passed {
                other_failures += 1;
            }
        }
    }
    assert_eq!(
        control,
        Some(false),
        "the control claims its anomaly although nothing was stuck:\n{transcript}"
    );
    assert_eq!(other_failures, 0, "{transcript}");
}
