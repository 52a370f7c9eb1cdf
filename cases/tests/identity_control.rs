//! The borrowed-identity negative controls can fail. L24's (B sends A's client id and
//! key) and F20's (B declares A's tenant: A's placement, a cancel of A's order, a read of
//! A's balances), each on a service started with `--auth-tokens`, where B's own token
//! cannot borrow A's id or tenant, must report their `negative control exposes` check as
//! FAIL; on a service without authentication every check of each control passes.
//!
//! One scratch PostgreSQL 16 cluster (with both templates) for the binary, one database
//! per run; the `ledger-svc` binary must be built (`cargo build --bins`).

use case_kit::service::Auth;
use cases::frozen::{self, f20_borrowed_tenant};
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn borrowed_tenant_control_fails_when_callers_authenticate() {
    let env = case_kit::Env::for_tests(SEED, &[&frozen::family()])
        .await
        .expect("scratch cluster and template");

    let mut ctx = env
        .test_ctx(&frozen::family(), "F20", "f20_with_tokens")
        .await
        .expect("clone the template");
    f20_borrowed_tenant::run_control(&mut ctx, Auth::On)
        .await
        .expect("F20's control runs");
    eprint!("F20's control with tokens:\n{}", ctx.transcript());
    assert_eq!(
        ctx.exposed(Some(f20_borrowed_tenant::ANOMALY)),
        Some(false),
        "the control claims the leak although B had to use its own token:\n{}",
        ctx.transcript()
    );

    let mut ctx = env
        .test_ctx(&frozen::family(), "F20", "f20_without_tokens")
        .await
        .expect("clone the template");
    f20_borrowed_tenant::run_control(&mut ctx, Auth::Off)
        .await
        .expect("F20's control runs");
    eprint!(
        "F20's control without authentication:\n{}",
        ctx.transcript()
    );
    assert!(
        ctx.failed_checks().is_empty(),
        "F20's control without authentication has a failed check:\n{}",
        ctx.transcript()
    );
    assert_eq!(ctx.exposed(Some(f20_borrowed_tenant::ANOMALY)), Some(true));
}
