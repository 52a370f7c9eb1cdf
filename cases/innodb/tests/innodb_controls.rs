//! The I-family negative controls can fail: each runs under a plan where its fault
//! cannot happen ([`Plan::Harmless`]: no registration that rolls back behind I4's
//! sixteen placements, I10's naive registration after the winner committed, I11's UPDATE
//! changing its row, I12's second read not locking), and its `negative control exposes`
//! check must report FAIL. Under the forced plan, as `./run.sh` runs them, every check
//! passes.
//!
//! One scratch MariaDB for the whole binary (fetched into the project's cache on first
//! use, as root), one database per case and plan; the server is stopped and its folder
//! removed at the end.

use case_kit::{Ctx, Env};
use cases_innodb::fixtures::Plan;
use cases_innodb::{
    self as innodb, i04_sixteen_inserters_deadlock as i04,
    i10_read_inside_the_failed_transaction as i10, i11_affected_rows as i11,
    i12_gap_locks_of_a_locking_read as i12,
};

/// Seed of this test's environment (the controls use no random input).
const SEED: u64 = 34;

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

async fn run(env: &std::sync::Arc<Env>, case_id: &'static str, plan: Plan) -> Ctx {
    let mut ctx = env
        .test_ctx(&innodb::family(), case_id, &format!("{case_id}_{plan:?}"))
        .await
        .expect("a context");
    let result = match case_id {
        "I4" => i04::run(&mut ctx, plan).await,
        "I10" => i10::run(&mut ctx, plan).await,
        "I11" => i11::run(&mut ctx, plan).await,
        "I12" => i12::run(&mut ctx, plan).await,
        other => panic!("no control {other}"),
    };
    result.unwrap_or_else(|e| panic!("{case_id} under {plan:?} fails to run: {e:#}"));
    eprint!("{case_id} under {plan:?}:\n{}", ctx.transcript());
    ctx
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn innodb_controls_fail_where_the_fault_cannot_happen() {
    let parent = tempfile::Builder::new()
        .prefix("innodb-controls")
        .tempdir()
        .expect("a temporary folder");
    std::fs::set_permissions(
        parent.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    let options = scratch_mariadb::ServerOptions::new(parent.path().join("mariadb"));
    let server = tokio::task::spawn_blocking(move || scratch_mariadb::Server::start(options))
        .await
        .expect("join")
        .expect("a scratch MariaDB");
    innodb::server::install(server);
    let env = Env::for_tests(SEED, &[&innodb::family()])
        .await
        .expect("an environment");
    for case_id in ["I4", "I10", "I11", "I12"] {
        let ctx = run(&env, case_id, Plan::Harmless).await;
        assert!(
            exposes(&ctx).iter().all(|passed| !passed),
            "{case_id}: a control claims to expose its anomaly although the fault could \
             not happen:\n{}",
            ctx.transcript()
        );
        let ctx = run(&env, case_id, Plan::Forced).await;
        assert!(
            ctx.failed_checks().is_empty() && exposes(&ctx).iter().all(|passed| *passed),
            "{case_id} under the forced plan has a failed check:\n{}",
            ctx.transcript()
        );
    }
    drop(innodb::server::take());
}
