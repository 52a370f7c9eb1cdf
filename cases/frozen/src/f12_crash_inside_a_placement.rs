//! F12 — the process placing an order is killed inside the placement (the seed's crash
//! rows), with the L9 machinery: a `crash-worker spot` child process runs the placement
//! up to a hook point, prints `PAUSED_IN_TX`, and is killed there with a real SIGKILL.
//! Claim: killed at `before-commit`, the backend rolls the transaction back: no freeze,
//! no order, no operation remains, and the same business id then freezes once; killed
//! at `after-commit`, the placement is committed and the same-id retry is a replay of
//! it: the same order, frozen once.
//! Setup: alice and carol deposit 10 000 USDT; each worker places BUY 1.0 @ 5000 (5005).
//! Checks: per stop point, what another session sees while the worker is paused, the
//! SIGKILL (signal 9, shell status 137), the worker's backend gone, the figures after,
//! and the same-id retry; at the end the invariant.
//! Fails if: any of those differs.

use std::time::{Duration, Instant};

use case_kit::{Case, Ctx};
use frozen_balances::{Asset, HookPoint, Market, Side};
use futures_util::FutureExt;
use launch::worker::CrashWorker;

use super::fixtures::{T, deposit, invariant, order, place};
use super::spot::balance_line;

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "F12",
        "crash inside a placement: worker SIGKILLed at before-commit and at after-commit",
        |ctx| run(ctx).boxed(),
    )
    .connections(3)
}

/// Longest wait for a killed worker's backend to leave `pg_stat_activity`, ms.
pub const BACKEND_EXIT_LIMIT_MS: u64 = 10_000;
/// Polling interval of that wait, milliseconds.
pub const POLL_MS: u64 = 5;

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let mut db = ctx.connect().await?;
    for (account, stop_at) in [
        ("alice", HookPoint::BeforeCommit),
        ("carol", HookPoint::AfterCommit),
    ] {
        killed_at(ctx, &mut db, account, stop_at).await?;
    }
    invariant(ctx, &mut db).await?;
    Ok(())
}

/// One stop point: `account` deposits 10 000 USDT, a worker places under
/// `place-12-<account>` and is SIGKILLed paused at `stop_at`; checks what another
/// session saw during the pause, the kill, the backend gone and the figures after, then
/// the same-id retry.
///
/// Errors: the worker could not start or pause; database errors.
async fn killed_at(
    ctx: &mut Ctx,
    db: &mut tokio_postgres::Client,
    account: &str,
    stop_at: HookPoint,
) -> anyhow::Result<()> {
    let business_id = format!("place-12-{account}");
    deposit(
        db,
        &format!("dep-12-{account}"),
        account,
        Asset::Usdt,
        10_000,
    )
    .await?;
    let mut worker = launch_worker(ctx, account, &business_id, stop_at)?;
    let paused = worker.wait_paused().await?;
    let backend = paused.backend_pid()?;
    ctx.note(format!("{stop_at}: worker paused backend_pid={backend}"));
    let (seen, expected) = match stop_at {
        HookPoint::AfterCommit => ("committed", "available=4995.000000 frozen=5005.000000"),
        _ => ("not visible", "available=10000.000000 frozen=0.000000"),
    };
    ctx.check_eq(
        format!("{stop_at}: USDT as another session sees it during the pause (the freeze {seen})"),
        expected.to_string(),
        balance_line(db, T, account, Asset::Usdt).await?,
    );

    let end = worker.kill().await?;
    ctx.check_eq(
        format!("{stop_at}: the worker ended by SIGKILL (shell status 137)"),
        137,
        end.shell_status(),
    );
    let gone = backend_gone(db, backend).await?;
    ctx.check(
        format!("{stop_at}: the worker's backend ended"),
        gone,
        format!("gone={gone}"),
    );
    let operations: i64 = db
        .query_one(
            "SELECT count(*) FROM balance_operation WHERE tenant_id = $1 AND business_id = $2",
            &[&T, &business_id],
        )
        .await?
        .get(0);
    ctx.check_eq(
        format!("{stop_at}: after the kill, operations under {business_id}, and USDT"),
        format!(
            "{} {expected}",
            i64::from(stop_at == HookPoint::AfterCommit)
        ),
        format!(
            "{operations} {}",
            balance_line(db, T, account, Asset::Usdt).await?
        ),
    );

    same_id_retry(ctx, db, account, &business_id, stop_at).await
}

/// Launches `crash-worker spot` placing BUY 1.0 @ 5000 for `account` under
/// `business_id`, to stop at `stop_at`.
///
/// Errors: the worker could not start.
fn launch_worker(
    ctx: &Ctx,
    account: &str,
    business_id: &str,
    stop_at: HookPoint,
) -> anyhow::Result<CrashWorker> {
    let args = vec![
        "spot".to_string(),
        "--database-url".into(),
        ctx.database_url()?,
        "--business-id".into(),
        business_id.into(),
        "--account".into(),
        account.into(),
        "--side".into(),
        "BUY".into(),
        "--quantity".into(),
        "1.0".into(),
        "--price".into(),
        "5000".into(),
        "--stop-at".into(),
        stop_at.as_str().into(),
    ];
    CrashWorker::launch(args)
}

/// Whether the backend `backend` has left `pg_stat_activity`, looking every [`POLL_MS`]
/// for at most [`BACKEND_EXIT_LIMIT_MS`].
///
/// Errors: database errors.
async fn backend_gone(db: &tokio_postgres::Client, backend: i32) -> anyhow::Result<bool> {
    let began = Instant::now();
    Ok(loop {
        let present = db
            .query_opt("SELECT 1 FROM pg_stat_activity WHERE pid = $1", &[&backend])
            .await?
            .is_some();
        if !present || began.elapsed() > Duration::from_millis(BACKEND_EXIT_LIMIT_MS) {
            break !present;
        }
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    })
}

/// The same-id retry after the kill: checks it is a replay exactly when the worker had
/// committed, and that `account` ends frozen once with one order.
///
/// Errors: the library's; database errors.
async fn same_id_retry(
    ctx: &mut Ctx,
    db: &mut tokio_postgres::Client,
    account: &str,
    business_id: &str,
    stop_at: HookPoint,
) -> anyhow::Result<()> {
    let req = order(
        business_id,
        account,
        Market::BtcUsdt,
        Side::Buy,
        "1.0",
        "5000",
    )?;
    let retry = place(db, &req).await?;
    ctx.note(format!(
        "{stop_at}: same-id retry: {} replayed={}",
        retry.outcome.as_str(),
        retry.replayed
    ));
    ctx.check_eq(
        format!("{stop_at}: the retry is a replay exactly when the worker had committed"),
        stop_at == HookPoint::AfterCommit,
        retry.replayed,
    );
    let orders: i64 = db
        .query_one(
            "SELECT count(*) FROM spot_order WHERE tenant_id = $1 AND account_id = $2",
            &[&T, &account],
        )
        .await?
        .get(0);
    ctx.check_eq(
        format!("{stop_at}: frozen once, one order"),
        "available=4995.000000 frozen=5005.000000 orders=1".to_string(),
        format!(
            "{} orders={orders}",
            balance_line(db, T, account, Asset::Usdt).await?
        ),
    );
    Ok(())
}
