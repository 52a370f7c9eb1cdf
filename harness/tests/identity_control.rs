//! The borrowed-identity negative controls can fail. L24's (B sends A's client id and
//! key; a case file, its service switched to `auth=on`) and F20's (B declares A's tenant: A's placement, a cancel of A's order, a read of
//! A's balances), each on a service started with `--auth-tokens`, where B's own token
//! cannot borrow A's id or tenant, must report their `negative control exposes` check as
//! FAIL; on a service without authentication every check of each control passes.
//!
//! One scratch PostgreSQL 16 cluster (with both templates) for the binary, one database
//! per run; the `ledger-svc` binary must be built (`cargo build --bins`).

use case_kit::{Ctx, Family};
use cases_frozen::{self as frozen, f20_borrowed_tenant};
use cases_ledger::{self as ledger, spec_calls};
use futures_util::future::BoxFuture;
use launch::service::Auth;

/// Seed of this test's environment (the controls use no random input).
const SEED: u64 = 24;

/// A control's body: the case's `run_control`, with or without tokens.
type Control = for<'c> fn(&'c mut Ctx, Auth) -> BoxFuture<'c, anyhow::Result<()>>;

/// Runs `control` of case `id` with tokens (its `negative control exposes: anomaly` must
/// FAIL) and without (every check passes, the anomaly exposed), each on a fresh database.
async fn control_fails_when_callers_authenticate(
    family: Family,
    id: &'static str,
    control: Control,
    anomaly: &str,
) {
    let env = case_kit::Env::for_tests(SEED, &[&family])
        .await
        .expect("scratch cluster and template");
    let database = |auth: &str| format!("{}_{auth}", id.to_lowercase());
    let mut ctx = env
        .test_ctx(&family, id, &database("with_tokens"))
        .await
        .expect("clone the template");
    control(&mut ctx, Auth::On).await.expect("the control runs");
    eprint!("{id}'s control with tokens:\n{}", ctx.transcript());
    assert_eq!(
        ctx.exposed(Some(anomaly)),
        Some(false),
        "the control claims the leak although B had to use its own token:\n{}",
        ctx.transcript()
    );

    let mut ctx = env
        .test_ctx(&family, id, &database("without_tokens"))
        .await
        .expect("clone the template");
    control(&mut ctx, Auth::Off)
        .await
        .expect("the control runs");
    eprint!(
        "{id}'s control without authentication:\n{}",
        ctx.transcript()
    );
    assert!(
        ctx.failed_checks().is_empty(),
        "{id}'s control without authentication has a failed check:\n{}",
        ctx.transcript()
    );
    assert_eq!(ctx.exposed(Some(anomaly)), Some(true));
}

/// L24 is a file: its control runs on a service started `auth=off`. Started `auth=on`
/// instead, B must use its own token, and the control's `exposes:` must FAIL; as
/// written every check passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn borrowed_identity_control_fails_when_callers_authenticate() {
    use case_kit::spec;
    const ANOMALY: &str =
        "B, declaring A's client id, receives A's stored response (txn id and balance)";
    let family = ledger::family();
    let env = case_kit::Env::for_tests(SEED, &[&family])
        .await
        .expect("scratch cluster and template");
    let path = std::path::Path::new(spec_calls::SPEC_DIR).join("l24_borrowed_identity.spec");
    let text = std::fs::read_to_string(path).expect("L24's file");
    let with_tokens = text.replace("auth=off", "auth=on");
    assert_ne!(
        with_tokens, text,
        "L24's control starts its service auth=off"
    );
    for (database, text, exposed) in [
        ("l24_with_tokens", &with_tokens, false),
        ("l24", &text, true),
    ] {
        let mut ctx = env
            .test_ctx(&family, "L24", database)
            .await
            .expect("clone the template");
        let spec = spec::parse(text).expect("L24 parses");
        spec::run(&mut ctx, database, &spec, spec_calls::engine())
            .await
            .expect("the spec runs");
        eprint!("L24 ({database}):\n{}", ctx.transcript());
        assert_eq!(
            ctx.exposed(Some(ANOMALY)),
            Some(exposed),
            "{}",
            ctx.transcript()
        );
        if exposed {
            assert!(ctx.failed_checks().is_empty(), "{}", ctx.transcript());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn borrowed_tenant_control_fails_when_callers_authenticate() {
    control_fails_when_callers_authenticate(
        frozen::family(),
        "F20",
        |ctx, auth| Box::pin(f20_borrowed_tenant::run_control(ctx, auth)),
        f20_borrowed_tenant::ANOMALY,
    )
    .await;
}
