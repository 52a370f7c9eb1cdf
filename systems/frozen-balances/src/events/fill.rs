//! *fill*: one fill's settlement between a BUY and a SELL order (SPEC §8).

use serde::{Deserialize, Serialize};
use tokio_postgres::types::Type;
use tokio_postgres::{Client, Row, Transaction};

use super::{
    Registration, apply, begin, ensure_rows, finish, hook_in_tx, lock_and_check, register,
    retry_on_deadlock, write_movements,
};
use crate::amount;
use crate::asset::{Asset, Market, Side};
use crate::decisions::{
    Deltas, Event, EventRequest, OrderStatus, Outcome, add_delta, check_id, recorded,
};
use crate::error::FrozenError;
use crate::hooks::{EventKind, HookPoint, Hooks};
use crate::schema::SYS_FEE;

/// A fill posted by the matching engine: `quantity` base units of `sell_order_id` bought
/// by `buy_order_id` at `price` quote units per whole base coin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FillRequest {
    /// Tenant of both orders.
    pub tenant_id: String,
    /// The fill's own business id.
    pub fill_id: String,
    /// The BUY order.
    pub buy_order_id: i64,
    /// The SELL order.
    pub sell_order_id: i64,
    /// Base units, a positive multiple of the lot.
    pub quantity: i64,
    /// Quote units per whole base coin, a positive multiple of the tick, between the sell
    /// limit and the buy limit.
    pub price: i64,
}

impl EventRequest for FillRequest {
    const KIND: EventKind = EventKind::Fill;

    fn tenant_id(&self) -> &str {
        &self.tenant_id
    }

    fn business_id(&self) -> &str {
        &self.fill_id
    }

    /// `FILL|buy_order|sell_order|quantity|price`.
    fn payload(&self) -> String {
        format!(
            "FILL|{}|{}|{}|{}",
            self.buy_order_id, self.sell_order_id, self.quantity, self.price
        )
    }
}

impl FillRequest {
    /// Checks the ids before any database access: tenant and fill id, two different
    /// positive order ids (quantity and price are checked against the orders, [`settle`]).
    ///
    /// Errors: [`FrozenError::Invalid`].
    pub fn check(&self) -> Result<(), FrozenError> {
        check_id("tenant id", &self.tenant_id)?;
        check_id("fill id", &self.fill_id)?;
        if self.buy_order_id == self.sell_order_id {
            return Err(FrozenError::Invalid(
                "a fill needs two different orders".into(),
            ));
        }
        if self.buy_order_id <= 0 || self.sell_order_id <= 0 {
            return Err(FrozenError::Invalid("order ids are positive".into()));
        }
        Ok(())
    }
}

/// What a fill reports, the same on every replay (except `replayed`). Minor units.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FillResult {
    /// OK or ORDER_CLOSED.
    pub outcome: Outcome,
    /// For ORDER_CLOSED: the order that was no longer open, and its status.
    pub closed_order: Option<(i64, OrderStatus)>,
    /// Quote amount of the fill, `quantity × price`.
    pub notional: i64,
    /// The buyer's fee, 10 bps of the notional rounded down (quote).
    pub buyer_fee: i64,
    /// The seller's fee, the same rule (quote).
    pub seller_fee: i64,
    /// The buyer's frozen quote taken by this fill: `quantity × limit + reserve share`, or
    /// the whole remainder on the order's final fill.
    pub buyer_frozen_taken: i64,
    /// Of that, returned to the buyer's available (price improvement, unused reserve).
    pub buyer_returned: i64,
    /// Quote credited to the seller's available, `notional − seller_fee`.
    pub seller_received: i64,
    /// The BUY order's status after the fill.
    pub buy_status: Option<OrderStatus>,
    /// The SELL order's status after the fill.
    pub sell_status: Option<OrderStatus>,
    /// Read back from an earlier request with the same id; nothing executed now.
    #[serde(skip)]
    pub replayed: bool,
}

recorded!(FillResult);

impl FillResult {
    /// The ORDER_CLOSED result when either order is no longer open (the first of BUY,
    /// SELL that is not), else `None`.
    pub fn closed(buy: &OrderRow, sell: &OrderRow) -> Option<FillResult> {
        let closed = [buy, sell]
            .into_iter()
            .find(|o| o.status != OrderStatus::Open)?;
        Some(FillResult {
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
        })
    }

    /// The OK result of `settlement`, with both orders' status after it.
    pub fn settled(
        settlement: &Settlement,
        buy_status: OrderStatus,
        sell_status: OrderStatus,
    ) -> FillResult {
        FillResult {
            outcome: Outcome::Ok,
            closed_order: None,
            notional: settlement.notional,
            buyer_fee: settlement.buyer_fee,
            seller_fee: settlement.seller_fee,
            buyer_frozen_taken: settlement.buyer_taken,
            buyer_returned: settlement.buyer_returned,
            seller_received: settlement.seller_received,
            buy_status: Some(buy_status),
            sell_status: Some(sell_status),
            replayed: false,
        }
    }
}

/// A locked order row.
#[derive(Debug, Clone)]
pub struct OrderRow {
    /// The order.
    pub order_id: i64,
    /// Its account.
    pub account_id: String,
    /// Its market (`BTC-USDT`).
    pub market: String,
    /// `BUY` or `SELL`.
    pub side: String,
    /// Ordered quantity, base units.
    pub quantity: i64,
    /// Limit, quote units per whole base coin.
    pub limit_price: i64,
    /// The asset its freeze holds.
    pub frozen_asset: String,
    /// The freeze, fee reserve included, minor units.
    pub frozen_amount: i64,
    /// The fee reserve inside the freeze (0 for a SELL).
    pub fee_reserve: i64,
    /// Base units filled so far.
    pub filled_quantity: i64,
    /// Of the freeze, paid out by fills.
    pub consumed: i64,
    /// Of the freeze, returned to available (price improvement, cancel).
    pub released: i64,
    /// Its status.
    pub status: OrderStatus,
}

impl OrderRow {
    pub(crate) fn from_row(row: &Row) -> Result<OrderRow, FrozenError> {
        Ok(OrderRow {
            order_id: row.try_get("order_id")?,
            account_id: row.try_get("account_id")?,
            market: row.try_get("market")?,
            side: row.try_get("side")?,
            quantity: row.try_get("quantity")?,
            limit_price: row.try_get("limit_price")?,
            frozen_asset: row.try_get("frozen_asset")?,
            frozen_amount: row.try_get("frozen_amount")?,
            fee_reserve: row.try_get("fee_reserve")?,
            filled_quantity: row.try_get("filled_quantity")?,
            consumed: row.try_get("consumed")?,
            released: row.try_get("released")?,
            status: OrderStatus::parse(row.try_get("status")?)?,
        })
    }

    /// What the order still holds of its freeze: original − consumed − released.
    pub fn remainder(&self) -> i64 {
        self.frozen_amount - self.consumed - self.released
    }

    /// The asset its freeze holds.
    ///
    /// Errors: [`FrozenError::InvariantViolated`] for an asset not known.
    pub fn asset(&self) -> Result<Asset, FrozenError> {
        self.frozen_asset
            .parse()
            .map_err(|_| FrozenError::InvariantViolated("order's frozen asset".into()))
    }
}

/// The columns of an [`OrderRow`], in its field order.
pub const ORDER_COLUMNS: &str = "order_id, account_id, market, side, quantity, \
     limit_price, frozen_asset, frozen_amount, fee_reserve, filled_quantity, consumed, \
     released, status";

// Both orders, locked in order_id order: the row locks are taken by the LockRows node
// above the sort, so in sorted order (docs, SELECT, "The Locking Clause").
fn lock_orders_sql() -> String {
    format!(
        "SELECT {ORDER_COLUMNS} FROM spot_order WHERE tenant_id = $1 AND order_id = ANY($2) \
         ORDER BY order_id FOR UPDATE"
    )
}

const SETTLE_ORDER_SQL: &str = "\
UPDATE spot_order
SET filled_quantity = filled_quantity + $2, consumed = consumed + $3, released = released + $4,
    status = CASE WHEN filled_quantity + $2 = quantity THEN 'FILLED' ELSE status END
WHERE order_id = $1
RETURNING status";

/// Settles `req`: locks both orders (sorted by id), refuses (records ORDER_CLOSED) if
/// either is no longer open, checks that the fill fits both orders, asserts that the
/// buyer's released reserve share covers the buyer's fee, then locks the five balance
/// rows in sorted order and moves: the buyer's frozen quote − taken (of which notional +
/// fee paid, the rest back to available), the buyer's available base + quantity, the
/// seller's frozen base − quantity, the seller's available quote + notional − fee,
/// `sys-fee` + both fees. Hooks as for every event.
///
/// Errors: [`FrozenError::Invalid`] (ids, same order twice, quantity or price off its
/// step); [`FrozenError::NoOrder`], [`FrozenError::FillRejected`] (rolled back, not
/// recorded); [`FrozenError::InvariantViolated`] (a reserve share below the fee, a
/// frozen balance below what the order holds: rolled back, never a negative frozen);
/// [`FrozenError::PayloadMismatch`]; [`FrozenError::HookAborted`];
/// [`FrozenError::DeadlockRetriesExhausted`]; [`FrozenError::Db`].
pub async fn fill(
    client: &mut Client,
    req: &FillRequest,
    hooks: &dyn Hooks,
) -> Result<FillResult, FrozenError> {
    req.check()?;
    retry_on_deadlock!(fill_once(client, req, hooks))
}

/// One attempt of [`fill`]: registers, locks both orders, settles, commits (see there).
///
/// Errors: as [`fill`]; a deadlock (40P01) as [`FrozenError::Db`], for the retry.
async fn fill_once(
    client: &mut Client,
    req: &FillRequest,
    hooks: &dyn Hooks,
) -> Result<FillResult, FrozenError> {
    let event = Event::of(req);
    let tx = begin(client).await?;
    let operation_id = match register::<FillResult>(&tx, &event).await? {
        Registration::New(id) => id,
        Registration::Replay(result) => {
            tx.rollback().await?;
            return Ok(result);
        }
    };
    let tx = hook_in_tx(tx, hooks, &event, HookPoint::Registered).await?;
    let orders = lock_orders(&tx, req).await?;
    let (buy, sell) = match buy_and_sell(orders, req) {
        Ok(pair) => pair,
        Err(error) => return rollback_with(tx, error).await,
    };
    if let Some(result) = FillResult::closed(&buy, &sell) {
        return finish(
            tx,
            hooks,
            &event,
            operation_id,
            Outcome::OrderClosed,
            result,
        )
        .await;
    }
    let version = crate::rules::current_version(&tx).await?;
    let settlement = match settle_under(req, &buy, &sell, version) {
        Ok(settlement) => settlement,
        Err(error) => return rollback_with(tx, error).await,
    };
    let tx = move_balances(tx, req, &buy, &sell, &settlement).await?;
    let tx = hook_in_tx(tx, hooks, &event, HookPoint::BalancesUpdated).await?;
    let result = record_fill(&tx, &event, req, &buy, &sell, &settlement).await?;
    finish(tx, hooks, &event, operation_id, Outcome::Ok, result).await
}

/// Inside `tx`: locks the fill's two orders of the tenant, sorted by order id
/// ([`lock_orders_sql`]); those that exist, in that order.
///
/// Errors: [`FrozenError::Db`]; [`FrozenError::InvariantViolated`] (an unknown status).
async fn lock_orders(
    tx: &Transaction<'_>,
    req: &FillRequest,
) -> Result<Vec<OrderRow>, FrozenError> {
    let ids = vec![req.buy_order_id, req.sell_order_id];
    let rows = tx
        .query_typed(
            &lock_orders_sql(),
            &[(&req.tenant_id, Type::TEXT), (&ids, Type::INT8_ARRAY)],
        )
        .await?;
    rows.iter().map(OrderRow::from_row).collect()
}

/// The BUY and the SELL order of `req` among the locked `orders`.
///
/// Errors: [`FrozenError::NoOrder`] naming the first one missing (BUY first).
pub fn buy_and_sell(
    mut orders: Vec<OrderRow>,
    req: &FillRequest,
) -> Result<(OrderRow, OrderRow), FrozenError> {
    let take = |orders: &mut Vec<OrderRow>, id: i64| {
        orders
            .iter()
            .position(|o| o.order_id == id)
            .map(|i| orders.swap_remove(i))
            .ok_or(FrozenError::NoOrder(id))
    };
    let buy = take(&mut orders, req.buy_order_id)?;
    let sell = take(&mut orders, req.sell_order_id)?;
    Ok((buy, sell))
}

/// Creates the missing balance rows the fill credits (buyer's base, seller's quote,
/// `sys-fee`'s quote) at 0, locks the five rows in sorted order and checks the
/// settlement's deltas against them, then applies them. On a failed check rolls `tx`
/// back; else returns it.
///
/// Errors: those of [`lock_and_check`] (rolled back); [`FrozenError::Db`].
async fn move_balances<'t>(
    tx: Transaction<'t>,
    req: &FillRequest,
    buy: &OrderRow,
    sell: &OrderRow,
    settlement: &Settlement,
) -> Result<Transaction<'t>, FrozenError> {
    ensure_rows(&tx, &req.tenant_id, &settlement.credited_rows(buy, sell)).await?;
    let deltas = &settlement.deltas;
    if let Err(error) = lock_and_check(&tx, &req.tenant_id, deltas).await {
        return rollback_with(tx, error).await;
    }
    apply(&tx, &req.tenant_id, deltas).await?;
    Ok(tx)
}

/// Inside `tx`, after the balances moved: writes the movements, settles both orders
/// (filled quantity, consumed, released, status) and returns the OK result.
///
/// Errors: [`FrozenError::Db`]; [`FrozenError::InvariantViolated`] (an unknown status).
async fn record_fill(
    tx: &Transaction<'_>,
    event: &Event<'_>,
    req: &FillRequest,
    buy: &OrderRow,
    sell: &OrderRow,
    settlement: &Settlement,
) -> Result<FillResult, FrozenError> {
    write_movements(tx, event, &settlement.deltas).await?;
    let buy_status = settle_order(
        tx,
        buy.order_id,
        req.quantity,
        settlement.buyer_paid,
        settlement.buyer_returned,
    )
    .await?;
    let sell_status =
        settle_order(tx, sell.order_id, req.quantity, settlement.seller_taken, 0).await?;
    Ok(FillResult::settled(settlement, buy_status, sell_status))
}

async fn rollback_with<T>(tx: Transaction<'_>, error: FrozenError) -> Result<T, FrozenError> {
    let _ = tx.rollback().await;
    Err(error)
}

async fn settle_order(
    tx: &Transaction<'_>,
    order_id: i64,
    quantity: i64,
    consumed: i64,
    released: i64,
) -> Result<OrderStatus, FrozenError> {
    let row = tx
        .query_typed_one(
            SETTLE_ORDER_SQL,
            &[
                (&order_id, Type::INT8),
                (&quantity, Type::INT8),
                (&consumed, Type::INT8),
                (&released, Type::INT8),
            ],
        )
        .await?;
    OrderStatus::parse(row.try_get("status")?)
}

/// The figures of one fill, minor units.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settlement {
    /// Quote amount, `quantity × price`.
    pub notional: i64,
    /// The buyer's fee (quote).
    pub buyer_fee: i64,
    /// The seller's fee (quote).
    pub seller_fee: i64,
    /// The buyer's frozen quote taken.
    pub buyer_taken: i64,
    /// The market.
    pub market: Market,
    /// Notional plus the buyer fee.
    pub buyer_paid: i64,
    /// Of `buyer_taken`, returned to the buyer's available.
    pub buyer_returned: i64,
    /// The seller's frozen base taken.
    pub seller_taken: i64,
    /// Quote credited to the seller, `notional − seller_fee`.
    pub seller_received: i64,
    /// The balance changes, in lock order.
    pub deltas: Deltas,
}

impl Settlement {
    /// The balance rows the fill credits, created at 0 when missing: the buyer's base,
    /// the seller's quote and `sys-fee`'s quote, `(account, asset, allow_negative)`.
    pub fn credited_rows<'o>(
        &self,
        buy: &'o OrderRow,
        sell: &'o OrderRow,
    ) -> [(&'o str, Asset, bool); 3] {
        let market = self.market;
        [
            (&buy.account_id, market.base(), false),
            (&sell.account_id, market.quote(), false),
            (SYS_FEE, market.quote(), false),
        ]
    }
}

/// Checks that the fill fits both (open, locked) orders and computes its settlement
/// under rounding rule version 1, asserting SPEC §8's rounding rule before anything is
/// written ([`settle_under`]; the InnoDB system's rule).
pub fn settle(
    req: &FillRequest,
    buy: &OrderRow,
    sell: &OrderRow,
) -> Result<Settlement, FrozenError> {
    settle_under(req, buy, sell, 1)
}

/// [`settle`] with the fee computed by rounding rule `version` ([`crate::rules`]): the
/// reserve share must still cover it, or the fill is refused as an invariant.
///
/// Errors: as [`settle`]; an unknown version.
pub fn settle_under(
    req: &FillRequest,
    buy: &OrderRow,
    sell: &OrderRow,
    version: i32,
) -> Result<Settlement, FrozenError> {
    let market = check_fits(req, buy, sell)?;
    let q = req.quantity;
    let overflow = || FrozenError::InvariantViolated("settlement arithmetic overflows".into());
    let notional = amount::notional_units(market, q, req.price)?;
    let fee = crate::rules::fee_units(version, notional)?;
    let buyer_fee = fee;
    let seller_fee = fee;
    let buyer_paid = notional.checked_add(buyer_fee).ok_or_else(overflow)?;
    let buyer_taken = buyer_taken(market, q, buy, buyer_fee)?;
    if buyer_taken < buyer_paid || buyer_taken > buy.remainder() {
        return Err(FrozenError::InvariantViolated(format!(
            "order {}: takes {buyer_taken} of a remainder {} to pay {buyer_paid}",
            buy.order_id,
            buy.remainder()
        )));
    }
    let buyer_returned = buyer_taken - buyer_paid;
    let seller_taken = q;
    if seller_taken > sell.remainder() {
        return Err(FrozenError::InvariantViolated(format!(
            "order {}: takes {seller_taken} of a remainder {}",
            sell.order_id,
            sell.remainder()
        )));
    }
    let seller_received = notional - seller_fee;
    let fees = buyer_fee.checked_add(seller_fee).ok_or_else(overflow)?;
    let (base, quote) = (market.base(), market.quote());
    let mut deltas = Deltas::new();
    add_delta(
        &mut deltas,
        &buy.account_id,
        quote,
        buyer_returned,
        -buyer_taken,
    )?;
    add_delta(&mut deltas, &buy.account_id, base, q, 0)?;
    add_delta(&mut deltas, &sell.account_id, base, 0, -seller_taken)?;
    add_delta(&mut deltas, &sell.account_id, quote, seller_received, 0)?;
    add_delta(&mut deltas, SYS_FEE, quote, fees, 0)?;
    Ok(Settlement {
        market,
        notional,
        buyer_fee,
        seller_fee,
        buyer_taken,
        buyer_paid,
        buyer_returned,
        seller_taken,
        seller_received,
        deltas,
    })
}

/// Checks that the fill fits both orders: a BUY and a SELL on one known market, quantity
/// and price on their steps, quantity within what each order has left, price between the
/// sell limit and the buy limit. Returns the market.
///
/// Errors: [`FrozenError::FillRejected`] (the orders do not take this fill);
/// [`FrozenError::Invalid`] (quantity or price off its step).
fn check_fits(req: &FillRequest, buy: &OrderRow, sell: &OrderRow) -> Result<Market, FrozenError> {
    let rejected = |text: String| Err(FrozenError::FillRejected(text));
    let Ok(market) = buy.market.parse::<Market>() else {
        return rejected(format!("order {} has an unknown market", buy.order_id));
    };
    if buy.side != Side::Buy.as_str() || sell.side != Side::Sell.as_str() {
        return rejected(format!(
            "order {} must be a BUY and order {} a SELL",
            buy.order_id, sell.order_id
        ));
    }
    if sell.market != market.as_str() {
        return rejected(format!("both orders must be on {market}"));
    }
    let q = req.quantity;
    if q <= 0 || q % market.lot_units() != 0 {
        return Err(FrozenError::Invalid(
            "fill quantity must be a positive multiple of the lot".into(),
        ));
    }
    if req.price <= 0
        || req.price % market.tick_units() != 0
        || req.price > market.max_price_units()
    {
        return Err(FrozenError::Invalid(
            "fill price must be a positive multiple of the tick within the maximum".into(),
        ));
    }
    for order in [buy, sell] {
        if q > order.quantity - order.filled_quantity {
            return rejected(format!(
                "quantity {q} exceeds the {} units left of order {}",
                order.quantity - order.filled_quantity,
                order.order_id
            ));
        }
    }
    if req.price > buy.limit_price || req.price < sell.limit_price {
        return rejected(format!(
            "price {} is outside [sell limit {}, buy limit {}]",
            req.price, sell.limit_price, buy.limit_price
        ));
    }
    Ok(market)
}

/// The buyer's frozen quote this fill takes (minor units): the order's whole remainder on
/// its final fill, else `q × limit` plus the fill's share of the fee reserve.
///
/// Errors: [`FrozenError::InvariantViolated`] when that share is below `buyer_fee` (SPEC
/// §8's rounding rule broken) or the arithmetic overflows; [`FrozenError::Amount`].
fn buyer_taken(market: Market, q: i64, buy: &OrderRow, buyer_fee: i64) -> Result<i64, FrozenError> {
    let overflow = || FrozenError::InvariantViolated("settlement arithmetic overflows".into());
    let buy_final = buy.filled_quantity + q == buy.quantity;
    Ok(if buy_final {
        buy.remainder()
    } else {
        let share = amount::reserve_share_units(buy.fee_reserve, q, buy.quantity);
        // SPEC §8: the reserve was rounded up at placement so that each fill's share of
        // it covers that fill's fee. If not, the freeze would not pay the fill.
        if share < buyer_fee {
            return Err(FrozenError::InvariantViolated(format!(
                "order {}: reserve share {share} below the fill's fee {buyer_fee}",
                buy.order_id
            )));
        }
        amount::notional_units(market, q, buy.limit_price)?
            .checked_add(share)
            .ok_or_else(overflow)?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(id: i64, side: Side, quantity: i64, limit: i64) -> OrderRow {
        let freeze = amount::order_freeze(Market::BtcUsdt, side, quantity, limit).unwrap();
        OrderRow {
            order_id: id,
            account_id: if side == Side::Buy { "alice" } else { "bob" }.into(),
            market: "BTC-USDT".into(),
            side: side.as_str().into(),
            quantity,
            limit_price: limit,
            frozen_asset: freeze.asset.as_str().into(),
            frozen_amount: freeze.amount,
            fee_reserve: freeze.fee_reserve,
            filled_quantity: 0,
            consumed: 0,
            released: 0,
            status: OrderStatus::Open,
        }
    }

    fn request(quantity: i64, price: i64) -> FillRequest {
        FillRequest {
            tenant_id: "t".into(),
            fill_id: "f".into(),
            buy_order_id: 1,
            sell_order_id: 2,
            quantity,
            price,
        }
    }

    /// SPEC §8 F1's first fill: 0.4 @ 4900 against BUY 1.0 @ 5000.
    #[test]
    fn f1_first_fill_figures() {
        let buy = order(1, Side::Buy, 100_000_000, 5_000_000_000);
        let sell = order(2, Side::Sell, 100_000_000, 4_900_000_000);
        let s = settle(&request(40_000_000, 4_900_000_000), &buy, &sell).unwrap();
        assert_eq!(s.notional, 1_960_000_000);
        assert_eq!(s.buyer_fee, 1_960_000);
        assert_eq!(s.buyer_taken, 2_002_000_000);
        assert_eq!(s.buyer_returned, 40_040_000);
        assert_eq!(s.seller_received, 1_958_040_000);
        let total: i64 = s
            .deltas
            .iter()
            .filter(|((_, asset), _)| *asset == "USDT")
            .map(|(_, d)| d.available + d.frozen)
            .sum();
        assert_eq!(total, 0, "USDT moves only between accounts");
    }

    /// A corrupted reserve (0 instead of the rounded-up share) is a bug, not a negative
    /// frozen: the assertion refuses before anything is written.
    #[test]
    fn reserve_share_below_fee_is_refused() {
        let mut buy = order(1, Side::Buy, 20_000, 5_000_050_000);
        buy.fee_reserve = 0;
        let sell = order(2, Side::Sell, 20_000, 5_000_050_000);
        let error = settle(&request(10_000, 5_000_050_000), &buy, &sell).unwrap_err();
        assert!(
            matches!(&error, FrozenError::InvariantViolated(text) if text.contains("reserve share 0 below the fill's fee 500")),
            "{error}"
        );
    }

    #[test]
    fn fills_that_do_not_fit_are_rejected() {
        let buy = order(1, Side::Buy, 100_000_000, 5_000_000_000);
        let sell = order(2, Side::Sell, 100_000_000, 4_900_000_000);
        for (qty, price) in [
            (200_000_000, 4_900_000_000),
            (10_000, 5_000_010_000),
            (10_000, 4_899_990_000),
        ] {
            assert!(matches!(
                settle(&request(qty, price), &buy, &sell),
                Err(FrozenError::FillRejected(_))
            ));
        }
        assert!(matches!(
            settle(&request(10_000, 4_900_000_000), &sell, &buy),
            Err(FrozenError::FillRejected(_))
        ));
    }
}
