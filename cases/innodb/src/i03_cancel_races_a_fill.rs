//! I3 — a cancel racing a fill on InnoDB (F3's claim).
//! Claim: a cancel that arrives while a fill of the same order is inside its transaction
//! waits for the order's row lock, then sees the fill's result (a locking read reads the
//! latest committed version, not the REPEATABLE READ snapshot) and releases only what
//! is left: the fill and the cancel together never release or consume more than the
//! freeze.
//! Setup: alice deposits 10 000 USDT, bob 1 BTC; alice BUY 1.0 @ 5000, bob SELL 0.4 @
//! 4900. A hook holds the fill (0.4 @ 4900) at `balances-updated`, both orders locked;
//! the cancel of alice's order starts; the case waits until InnoDB shows it waiting for
//! a lock (`INNODB_TRX.trx_state = 'LOCK WAIT'`), then lets the fill commit.
//! Checks: the cancel waited (observed); fill OK; cancel OK releasing 3003 (5005 − 2002);
//! alice 8038.04 available, 0 frozen; the invariant.
//! Fails if: the cancel does not wait, releases the whole freeze, or the fill is refused.

use std::sync::Arc;

use case_kit::{Case, Ctx};
use frozen_balances::{Asset, CancelRequest, EventKind, HookPoint, NoHooks};
use frozen_balances_innodb::Tally;
use futures_util::FutureExt;

use crate::fixtures::{Db, two_orders, Gate, T, fill_request, invariant, line};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "I3",
        "cancel racing a fill on InnoDB: the cancel waits for the order lock and releases only the rest",
        |ctx| run(ctx).boxed(),
    )
}

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let db = Db::open(ctx).await?;
    let mut conn = db.connect().await?;
    let (buy_id, sell_id) = two_orders(&mut conn, "i3", "0.4").await?;

    let gate = Arc::new(Gate::new(EventKind::Fill, HookPoint::BalancesUpdated));
    let fill_req = fill_request("fill-i301", buy_id, sell_id, "0.4", "4900")?;
    let mut fill_conn = db.connect().await?;
    let held = gate.clone();
    let filling = tokio::spawn(async move {
        frozen_balances_innodb::fill(&mut fill_conn, &fill_req, held.as_ref(), &Tally::default())
            .await
    });
    gate.reached().await;
    let cancelling = start_cancel(&db, buy_id).await?;
    let waited = db.wait_for_lock_waiters(&mut conn, 1).await;
    ctx.check(
        "the cancel waits for a lock while the fill holds the order (INNODB_TRX: LOCK WAIT)",
        waited.is_ok(),
        match &waited {
            Ok(()) => "1 session waiting".to_string(),
            Err(e) => e.to_string(),
        },
    );
    gate.release();
    let filled = filling.await??;
    let cancelled = cancelling.await??;
    ctx.check_eq(
        "fill OK, then cancel OK releasing the rest: 3003 USDT",
        "OK OK 3003000000".to_string(),
        format!(
            "{} {} {}",
            filled.outcome.as_str(),
            cancelled.outcome.as_str(),
            cancelled.released
        ),
    );
    ctx.check_eq(
        "alice USDT: 10000 − 1960 − fee 1.96, nothing frozen",
        "available=8038.040000 frozen=0.000000".to_string(),
        line(&mut conn, "alice", Asset::Usdt).await?,
    );
    invariant(ctx, &mut conn).await?;
    Ok(())
}

type Cancelling = tokio::task::JoinHandle<
    Result<frozen_balances::CancelResult, frozen_balances_innodb::InnoError>,
>;

/// Starts alice's cancel of `order_id` on its own connection.
async fn start_cancel(db: &Db, order_id: i64) -> anyhow::Result<Cancelling> {
    let mut cancel_conn = db.connect().await?;
    let cancel_req = CancelRequest {
        tenant_id: T.into(),
        business_id: "cancel-i301".into(),
        account_id: "alice".into(),
        order_id,
    };
    Ok(tokio::spawn(async move {
        frozen_balances_innodb::cancel(&mut cancel_conn, &cancel_req, &NoHooks, &Tally::default())
            .await
    }))
}
