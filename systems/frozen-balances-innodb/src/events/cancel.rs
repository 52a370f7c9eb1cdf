//! *cancel* on InnoDB: an order's remainder goes back from frozen to available (SPEC §8).

use frozen_balances::hooks::{HookPoint, Hooks};
use frozen_balances::{CancelRequest, CancelResult, Event, FrozenError, OrderStatus, Outcome};
use mysql_async::Transaction;
use mysql_async::prelude::Queryable;

use super::fill::lock_orders;
use super::{Tally, expect_one, hook, retry_on_deadlock, run_once, write_movements};
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
    req.check()?;
    retry_on_deadlock!(tally, cancel_once(conn, req, hooks, tally))
}

async fn cancel_once(
    conn: &mut mysql_async::Conn,
    req: &CancelRequest,
    hooks: &dyn Hooks,
    tally: &Tally,
) -> Result<CancelResult, InnoError> {
    let event = Event::of(req);
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
    let asset = order.asset()?;
    if order.status != OrderStatus::Open {
        return Ok((Outcome::OrderClosed, CancelResult::closed(&order, asset)));
    }
    let remainder = req.remainder(&order)?;
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
    hook(event, hooks, HookPoint::BalancesUpdated).await?;
    write_movements(tx, event, &req.release_deltas(asset, remainder)?).await?;
    tx.exec_drop(CLOSE_ORDER_SQL, (remainder, order.order_id))
        .await?;
    expect_one(tx, "the cancelled order")?;
    Ok((
        Outcome::Ok,
        CancelResult::released(&order, asset, remainder),
    ))
}
