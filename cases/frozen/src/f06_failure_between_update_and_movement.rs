//! F6 — a failure between the balance update and the movement (the seed's table).
//! Claim: the freeze, its movement, its order and its operation commit together or not
//! at all, so a failure after the balance UPDATE leaves nothing, and the retry with the
//! same business id freezes once.
//! Setup: alice and carol deposit 20 000 USDT (room for two freezes). A hook fails the
//! placement at `balances-updated` (the balance row changed, no movement yet).
//! Checks: the failed placement left operations, movements, orders and balances as they
//! were; the retry freezes 5005 once; the invariant.
//! Negative control: the transaction that was declared but never applied: each
//! statement of the same placement runs in its own transaction (autocommit). The failure
//! at the same step leaves carol's freeze without a movement or an operation, and the
//! reconciliation names her balance row; the retry finds no operation under its id and
//! freezes again: 10 010 frozen, one order holding 5005.
//! Fails if: the product leaves a trace of the failed attempt or freezes twice, or the
//! control does not.

use case_kit::{Case, Ctx};
use frozen_balances::{Asset, EventKind, FrozenError, HookPoint, Market, NoHooks, Side};
use futures_util::FutureExt;

use super::fixtures::{FailAt, Plan, T, deposit, invariant, order};
use super::spot::{balance_line, recorded};
use frozen_balances::naive;

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "F6",
        "failure between balance update and movement: all or nothing; per-statement commits freeze twice",
        |ctx| run(ctx, Plan::Forced).boxed(),
    )
    .not_clean()
}

/// The case body; under [`Plan::Harmless`] the naive placement does not fail, so its
/// retry finds the operation and the control must not see a double freeze.
///
/// Errors: database errors.
pub async fn run(ctx: &mut Ctx, plan: Plan) -> anyhow::Result<()> {
    let mut db = ctx.connect().await?;
    product_all_or_nothing(ctx, &mut db).await?;
    // The control: the same placement, each statement its own transaction.
    per_statement_control(ctx, &mut db, plan).await
}

/// alice's placement fails at `balances-updated`: checks it failed there and left
/// nothing, then that the retry with the same id freezes once, and the invariant.
///
/// Errors: database errors.
async fn product_all_or_nothing(
    ctx: &mut Ctx,
    db: &mut tokio_postgres::Client,
) -> anyhow::Result<()> {
    deposit(db, "dep-0601", "alice", Asset::Usdt, 20_000).await?;
    let req = order(
        "place-0601",
        "alice",
        Market::BtcUsdt,
        Side::Buy,
        "1.0",
        "5000",
    )?;
    let before = recorded(db).await?;
    let fail = FailAt {
        kind: EventKind::Place,
        point: HookPoint::BalancesUpdated,
    };
    let failed = frozen_balances::place(db, &req, &fail).await;
    ctx.check(
        "the placement fails at balances-updated",
        matches!(
            failed,
            Err(FrozenError::HookAborted(HookPoint::BalancesUpdated))
        ),
        match &failed {
            Ok(r) => format!("{:?}", r.outcome),
            Err(e) => e.to_string(),
        },
    );
    ctx.check(
        "nothing of the failed attempt remains (operations, movements, orders, balances)",
        recorded(db).await? == before,
        "",
    );
    let retry = frozen_balances::place(db, &req, &NoHooks).await?;
    ctx.note(format!(
        "retry with the same id: {} replayed={}",
        retry.outcome.as_str(),
        retry.replayed
    ));
    ctx.check_eq(
        "alice USDT after the retry: frozen once",
        "available=14995.000000 frozen=5005.000000".to_string(),
        balance_line(db, T, "alice", Asset::Usdt).await?,
    );
    invariant(ctx, db).await?;
    Ok(())
}

/// The negative control on carol: the per-statement placement fails after the balance
/// update (under [`Plan::Forced`]), the reconciliation is asked whether it names her
/// row, and the retry under the same id freezes again.
///
/// Errors: database errors.
async fn per_statement_control(
    ctx: &mut Ctx,
    db: &mut tokio_postgres::Client,
    plan: Plan,
) -> anyhow::Result<()> {
    deposit(db, "dep-0602", "carol", Asset::Usdt, 20_000).await?;
    let naive_req = order(
        "place-0602",
        "carol",
        Market::BtcUsdt,
        Side::Buy,
        "1.0",
        "5000",
    )?;
    let first = per_statement_place(db, &naive_req, plan == Plan::Forced).await;
    ctx.note(format!(
        "per-statement placement: {}",
        match &first {
            Ok(()) => "completed".to_string(),
            Err(e) => e.to_string(),
        }
    ));
    let findings = frozen_balances::reconcile(db).await?;
    let named = findings
        .row_mismatches
        .iter()
        .any(|m| m.account_id == "carol" && m.asset == Asset::Usdt);
    ctx.note(format!(
        "after the attempt: carol USDT {}; reconciliation names carol USDT: {named}",
        balance_line(db, T, "carol", Asset::Usdt).await?
    ));
    per_statement_place(db, &naive_req, false).await?;
    let carol = balance_line(db, T, "carol", Asset::Usdt).await?;
    let orders: i64 = db
        .query_one(
            "SELECT count(*) FROM spot_order WHERE tenant_id = $1 AND account_id = 'carol'",
            &[&T],
        )
        .await?
        .get(0);
    ctx.note(format!(
        "after the retry: carol USDT {carol}, orders={orders}"
    ));
    ctx.exposes(
        "a balance change without movement or operation, named by the reconciliation; the retry freezes twice",
        named && carol == "available=9990.000000 frozen=10010.000000" && orders == 1,
        format!("named={named} carol USDT {carol} orders={orders}"),
    );
    Ok(())
}

/// The naive placement: looks for its operation first (and does nothing if found), then
/// runs each statement on its own (autocommit): the freeze UPDATE, then, unless `fail`
/// (the failure between the two steps), the operation, the movement and the order.
async fn per_statement_place(
    db: &tokio_postgres::Client,
    req: &frozen_balances::PlaceRequest,
    fail: bool,
) -> anyhow::Result<()> {
    if naive::operation_exists(db, &req.business_id).await? {
        return Ok(());
    }
    let freeze = req.freeze()?;
    let updated = db
        .execute(
            "UPDATE balance SET available = available - $3, frozen = frozen + $3, \
             version = version + 1 \
             WHERE tenant_id = $1 AND account_id = $2 AND asset = 'USDT' AND available >= $3",
            &[&T, &req.account_id, &freeze.amount],
        )
        .await?;
    anyhow::ensure!(updated == 1, "insufficient");
    anyhow::ensure!(!fail, "injected failure after the balance update");
    Ok(naive::record_placement(db, req).await?)
}
