//! *fill* on InnoDB: one fill's settlement between a BUY and a SELL order (SPEC §8). The
//! figures come from `frozen_balances::settle`, shared with the PostgreSQL system.

use frozen_balances::events::check_id;
use frozen_balances::hooks::{EventKind, HookPoint, Hooks};
use frozen_balances::schema::SYS_FEE;
use frozen_balances::{
    Asset, FillRequest, FillResult, FrozenError, ORDER_COLUMNS, OrderRow, OrderStatus, Outcome,
    Settlement, settle,
};
use mysql_async::prelude::Queryable;
use mysql_async::{Row, Transaction};

use super::{
    Event, Tally, apply, ensure_rows, expect_one, lock_and_check, retry_on_deadlock, run_once,
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
    check_id("tenant id", &req.tenant_id)?;
    check_id("fill id", &req.fill_id)?;
    if req.buy_order_id == req.sell_order_id {
        return Err(FrozenError::Invalid("a fill needs two different orders".into()).into());
    }
    if req.buy_order_id <= 0 || req.sell_order_id <= 0 {
        return Err(FrozenError::Invalid("order ids are positive".into()).into());
    }
    retry_on_deadlock!(tally, fill_once(conn, req, hooks, tally))
}

async fn fill_once(
    conn: &mut mysql_async::Conn,
    req: &FillRequest,
    hooks: &dyn Hooks,
    tally: &Tally,
) -> Result<FillResult, InnoError> {
    let event = Event::new(EventKind::Fill, &req.tenant_id, &req.fill_id, req.payload());
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
    let mut orders =
        lock_orders(tx, &req.tenant_id, &[req.buy_order_id, req.sell_order_id]).await?;
    let mut take = |id: i64| {
        orders
            .iter()
            .position(|o| o.order_id == id)
            .map(|i| orders.swap_remove(i))
            .ok_or(FrozenError::NoOrder(id))
    };
    let buy = take(req.buy_order_id)?;
    let sell = take(req.sell_order_id)?;
    if let Some(closed) = [&buy, &sell]
        .into_iter()
        .find(|o| o.status != OrderStatus::Open)
    {
        return Ok((Outcome::OrderClosed, closed_result(&buy, &sell, closed)));
    }
    let settlement = settle(req, &buy, &sell)?;
    let market = settlement.market;
    ensure_rows(
        tx,
        &req.tenant_id,
        &[
            (&buy.account_id, market.base(), false),
            (&sell.account_id, market.quote(), false),
            (SYS_FEE, market.quote(), false),
        ],
    )
    .await?;
    lock_and_check(tx, &req.tenant_id, &settlement.deltas).await?;
    apply(tx, &req.tenant_id, &settlement.deltas).await?;
    event.hook(hooks, HookPoint::BalancesUpdated).await?;
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
    Ok((Outcome::Ok, ok_result(&settlement, buy_status, sell_status)))
}

fn closed_result(buy: &OrderRow, sell: &OrderRow, closed: &OrderRow) -> FillResult {
    FillResult {
        outcome: Outcome::OrderClosed,
        closed_order: Some((closed.order_id, closed.status)),
        notional: 0,
        buyer_fee: 0,
        seller_fee: 0,
        buyer_frozen_taken: 0,
        buyer_returned: 0,
        seller_received: 0,
        buy_status: Some(buy.status),
        sell_status: Some(sell.status),
        replayed: false,
    }
}

fn ok_result(s: &Settlement, buy_status: OrderStatus, sell_status: OrderStatus) -> FillResult {
    FillResult {
        outcome: Outcome::Ok,
        closed_order: None,
        notional: s.notional,
        buyer_fee: s.buyer_fee,
        seller_fee: s.seller_fee,
        buyer_frozen_taken: s.buyer_taken,
        buyer_returned: s.buyer_returned,
        seller_received: s.seller_received,
        buy_status: Some(buy_status),
        sell_status: Some(sell_status),
        replayed: false,
    }
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

/// The asset an order's freeze holds.
pub(crate) fn order_asset(order: &OrderRow) -> Result<Asset, InnoError> {
    order
        .frozen_asset
        .parse()
        .map_err(|_| InnoError::invariant("order's frozen asset"))
}
