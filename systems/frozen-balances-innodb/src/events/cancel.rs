//! *cancel* on InnoDB: an order's remainder goes back from frozen to available (SPEC §8).

use frozen_balances::events::check_id;
use frozen_balances::hooks::{EventKind, HookPoint, Hooks};
use frozen_balances::{
    Asset, CancelRequest, CancelResult, Deltas, FrozenError, OrderStatus, Outcome, add_delta,
};
use mysql_async::Transaction;

use super::fill::{lock_orders, order_asset};
use super::{Event, Tally, expect_one, retry_on_deadlock, run_once, write_movements};
use crate::InnoError;

// Guarded by frozen >= remainder: a frozen balance below what the order holds is a bug,
// refused here rather than by the CHECK.
const RELEASE_SQL: &str = "\
UPDATE balance SET available = available + ?, frozen = frozen - ?, version = version + 1
WHERE tenant_id = ? AND account_id = ? AND asset = ? AND frozen >= ?";

const CLOSE_ORDER_SQL: &str = "\
UPDATE spot_order SET released = released + ?, status = 'CANCELLED' WHERE order_id = ?";

/// Cancels `req.order_id` of `req.account_id` as `frozen_balances::cancel` does: locks the
/// order, releases its remainder, closes it, records OK; an order no longer open →
/// records ORDER_CLOSED. Hooks: `registered`, `balances-updated` (OK path),
/// `before-commit`, `after-commit`.
///
/// Errors: as [`super::place`]; [`FrozenError::NoOrder`] (rolled back, not recorded).
pub async fn cancel(
    conn: &mut mysql_async::Conn,
    req: &CancelRequest,
    hooks: &dyn Hooks,
    tally: &Tally,
) -> Result<CancelResult, InnoError> {
    check_id("tenant id", &req.tenant_id)?;
    check_id("business id", &req.business_id)?;
    check_id("account id", &req.account_id)?;
    if req.order_id <= 0 {
        return Err(FrozenError::Invalid("order ids are positive".into()).into());
    }
    retry_on_deadlock!(tally, cancel_once(conn, req, hooks, tally))
}

async fn cancel_once(
    conn: &mut mysql_async::Conn,
    req: &CancelRequest,
    hooks: &dyn Hooks,
    tally: &Tally,
) -> Result<CancelResult, InnoError> {
    let event = Event::new(
        EventKind::Cancel,
        &req.tenant_id,
        &req.business_id,
        req.payload(),
    );
    run_once(conn, &event, hooks, tally, async |tx| {
        release(tx, &event, req, hooks).await
    })
    .await
}

async fn release(
    tx: &mut Transaction<'_>,
    event: &Event<'_>,
    req: &CancelRequest,
    hooks: &dyn Hooks,
) -> Result<(Outcome, CancelResult), InnoError> {
    let order = lock_orders(tx, &req.tenant_id, &[req.order_id])
        .await?
        .into_iter()
        .find(|o| o.account_id == req.account_id)
        .ok_or(FrozenError::NoOrder(req.order_id))?;
    let asset: Asset = order_asset(&order)?;
    let mut result = CancelResult {
        outcome: Outcome::OrderClosed,
        order_id: order.order_id,
        asset,
        released: 0,
        order_status: order.status,
        replayed: false,
    };
    if order.status != OrderStatus::Open {
        return Ok((Outcome::OrderClosed, result));
    }
    let remainder = order.remainder();
    if remainder <= 0 {
        return Err(InnoError::invariant(format!(
            "open order {} holds {remainder}",
            order.order_id
        )));
    }
    tx.exec_drop(
        RELEASE_SQL,
        (
            remainder,
            remainder,
            &req.tenant_id,
            &req.account_id,
            asset.as_str(),
            remainder,
        ),
    )
    .await?;
    expect_one(
        tx,
        &format!("{} {asset}: frozen covering the remainder", req.account_id),
    )?;
    event.hook(hooks, HookPoint::BalancesUpdated).await?;
    let mut deltas = Deltas::new();
    add_delta(&mut deltas, &req.account_id, asset, remainder, -remainder)?;
    write_movements(tx, event, &deltas).await?;
    tx.exec_drop(CLOSE_ORDER_SQL, (remainder, order.order_id))
        .await?;
    expect_one(tx, "the cancelled order")?;
    result.outcome = Outcome::Ok;
    result.released = remainder;
    result.order_status = OrderStatus::Cancelled;
    Ok((Outcome::Ok, result))
}

use mysql_async::prelude::Queryable;
