//! *fill* on InnoDB: one fill's settlement between a BUY and a SELL order (SPEC §8). The
//! figures come from `frozen_balances::settle`, shared with the PostgreSQL system.

use frozen_balances::hooks::{HookPoint, Hooks};
use frozen_balances::{
    Event, FillRequest, FillResult, ORDER_COLUMNS, OrderRow, OrderStatus, Outcome, buy_and_sell,
    settle,
};
use mysql_async::prelude::Queryable;
use mysql_async::{Row, Transaction};

use super::{
    Tally, apply, ensure_rows, expect_one, hook, lock_and_check, retry_on_deadlock, run_once,
    write_movements,
};
use crate::InnoError;

const SETTLE_ORDER_SQL: &str = "\
UPDATE spot_order
SET status = CASE WHEN filled_quantity + ? = quantity THEN 'FILLED' ELSE status END,
    filled_quantity = filled_quantity + ?, consumed = consumed + ?, released = released + ?
WHERE order_id = ?";

const ORDER_STATUS_SQL: &str = "SELECT status FROM spot_order WHERE order_id = ?";

/// Settles `req` as `frozen_balances::fill` does: locks both orders (by id), computes
/// the settlement, moves the balances, records the fill; an order no longer open →
/// records ORDER_CLOSED. Hooks: `registered`, `balances-updated` (OK path),
/// `before-commit`, `after-commit`.
///
/// Errors: as [`super::place`]; [`FrozenError::NoOrder`], [`FrozenError::FillRejected`]
/// (rolled back, not recorded).
pub async fn fill(
    conn: &mut mysql_async::Conn,
    req: &FillRequest,
    hooks: &dyn Hooks,
    tally: &Tally,
) -> Result<FillResult, InnoError> {
    req.check()?;
    retry_on_deadlock!(tally, fill_once(conn, req, hooks, tally))
}

async fn fill_once(
    conn: &mut mysql_async::Conn,
    req: &FillRequest,
    hooks: &dyn Hooks,
    tally: &Tally,
) -> Result<FillResult, InnoError> {
    let event = Event::of(req);
    run_once(conn, &event, hooks, tally, async |tx| {
        settle_in(tx, &event, req, hooks).await
    })
    .await
}

async fn settle_in(
    tx: &mut Transaction<'_>,
    event: &Event<'_>,
    req: &FillRequest,
    hooks: &dyn Hooks,
) -> Result<(Outcome, FillResult), InnoError> {
    let orders = lock_orders(tx, &req.tenant_id, &[req.buy_order_id, req.sell_order_id]).await?;
    let (buy, sell) = buy_and_sell(orders, req)?;
    if let Some(result) = FillResult::closed(&buy, &sell) {
        return Ok((Outcome::OrderClosed, result));
    }
    let settlement = settle(req, &buy, &sell)?;
    ensure_rows(tx, &req.tenant_id, &settlement.credited_rows(&buy, &sell)).await?;
    lock_and_check(tx, &req.tenant_id, &settlement.deltas).await?;
    apply(tx, &req.tenant_id, &settlement.deltas).await?;
    hook(event, hooks, HookPoint::BalancesUpdated).await?;
    write_movements(tx, event, &settlement.deltas).await?;
    let buy_status = settle_order(
        tx,
        &buy,
        req.quantity,
        settlement.buyer_paid,
        settlement.buyer_returned,
    )
    .await?;
    let sell_status = settle_order(tx, &sell, req.quantity, settlement.seller_taken, 0).await?;
    Ok((
        Outcome::Ok,
        FillResult::settled(&settlement, buy_status, sell_status),
    ))
}

async fn settle_order(
    tx: &mut Transaction<'_>,
    order: &OrderRow,
    quantity: i64,
    consumed: i64,
    released: i64,
) -> Result<OrderStatus, InnoError> {
    tx.exec_drop(
        SETTLE_ORDER_SQL,
        (quantity, quantity, consumed, released, order.order_id),
    )
    .await?;
    expect_one(tx, &format!("order {}", order.order_id))?;
    let status: Option<String> = tx.exec_first(ORDER_STATUS_SQL, (order.order_id,)).await?;
    Ok(OrderStatus::parse(&status.unwrap_or_default())?)
}

/// Locks the orders `ids` of `tenant_id` in order-id order (`FOR UPDATE`; InnoDB locks
/// the primary-key records as it scans them, in key order).
///
/// Errors: the server's; [`FrozenError::InvariantViolated`] on a status not known.
pub(crate) async fn lock_orders(
    tx: &mut Transaction<'_>,
    tenant_id: &str,
    ids: &[i64],
) -> Result<Vec<OrderRow>, InnoError> {
    let mut sorted = ids.to_vec();
    sorted.sort_unstable();
    let placeholders = vec!["?"; sorted.len()].join(", ");
    let sql = format!(
        "SELECT {ORDER_COLUMNS} FROM spot_order WHERE order_id IN ({placeholders}) \
         AND tenant_id = ? ORDER BY order_id FOR UPDATE"
    );
    let mut params: Vec<mysql_async::Value> = sorted.iter().map(|id| (*id).into()).collect();
    params.push(tenant_id.into());
    let rows: Vec<Row> = tx.exec(sql, params).await?;
    rows.into_iter().map(order_row).collect()
}

/// An [`OrderRow`] from a row of [`ORDER_COLUMNS`].
///
/// Errors: [`FrozenError::InvariantViolated`] on a NULL, a type or a status not known.
pub fn order_row(mut row: Row) -> Result<OrderRow, InnoError> {
    fn col<T: mysql_async::prelude::FromValue>(row: &mut Row, name: &str) -> Result<T, InnoError> {
        row.take_opt(name)
            .ok_or_else(|| InnoError::invariant(format!("no column {name}")))?
            .map_err(|e| InnoError::invariant(format!("column {name}: {e}")))
    }
    let status: String = col(&mut row, "status")?;
    Ok(OrderRow {
        order_id: col(&mut row, "order_id")?,
        account_id: col(&mut row, "account_id")?,
        market: col(&mut row, "market")?,
        side: col(&mut row, "side")?,
        quantity: col(&mut row, "quantity")?,
        limit_price: col(&mut row, "limit_price")?,
        frozen_asset: col(&mut row, "frozen_asset")?,
        frozen_amount: col(&mut row, "frozen_amount")?,
        fee_reserve: col(&mut row, "fee_reserve")?,
        filled_quantity: col(&mut row, "filled_quantity")?,
        consumed: col(&mut row, "consumed")?,
        released: col(&mut row, "released")?,
        status: OrderStatus::parse(&status)?,
    })
}
