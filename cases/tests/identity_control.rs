//! L24's negative control can fail: the same attack (B sends A's client id and key) on a
//! service started with `--auth-tokens`, where B's own token cannot borrow A's id, must
//! report its `negative control exposes` check as FAIL; on a service without
//! authentication every check of the control passes.
//!
//! One scratch PostgreSQL 16 cluster (with the ledger template) for the binary, one
//! database per run; the `ledger-svc` binary must be built (`cargo build --bins`).

use case_kit::service::Auth;
use cases::ledger::{self, l24_borrowed_identity};

/// Seed of this test's environment (the control uses no random input).
const SEED: u64 = 24;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn borrowed_identity_control_fails_when_callers_authenticate() {
    let env = case_kit::Env::for_tests(SEED, &[&ledger::family()])
        .await
        .expect("scratch cluster and template");

    let mut ctx = env
        .test_ctx(&ledger::family(), "L24", "l24_with_tokens")
        .await
        .expect("clone the template");
    l24_borrowed_identity::run_control(&mut ctx, Auth::On)
        .await
        .expect("L24's control runs");
    eprint!("L24's control with tokens:\n{}", ctx.transcript());
    assert_eq!(
        ctx.exposed(Some(l24_borrowed_identity::ANOMALY)),
        Some(false),
        "the control claims the leak although B had to use its own token:\n{}",
        ctx.transcript()
    );

    let mut ctx = env
        .test_ctx(&ledger::family(), "L24", "l24_without_tokens")
        .await
        .expect("clone the template");
    l24_borrowed_identity::run_control(&mut ctx, Auth::Off)
        .await
        .expect("L24's control runs");
    eprint!(
        "L24's control without authentication:\n{}",
        ctx.transcript()
    );
    assert!(
        ctx.failed_checks().is_empty(),
        "L24's control without authentication has a failed check:\n{}",
        ctx.transcript()
    );
    assert_eq!(
        ctx.exposed(Some(l24_borrowed_identity::ANOMALY)),
        Some(true)
    );
}
