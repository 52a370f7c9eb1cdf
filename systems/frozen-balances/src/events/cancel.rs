//! *cancel*: an order's remainder goes back from frozen to available (SPEC §8).

use serde::{Deserialize, Serialize};
use tokio_postgres::types::Type;
use tokio_postgres::{Client, Transaction};

use super::fill::{ORDER_COLUMNS, OrderRow};
use super::{
    Registration, begin, finish, hook_in_tx, register, retry_on_deadlock, write_movements,
};
use crate::asset::Asset;
use crate::decisions::{
    Deltas, Event, EventRequest, OrderStatus, Outcome, add_delta, check_id, recorded,
};
use crate::error::FrozenError;
use crate::hooks::{EventKind, HookPoint, Hooks};

/// A cancel of `order_id`, an order of `account_id`, with its own business id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CancelRequest {
    /// Tenant.
    pub tenant_id: String,
    /// The cancel's own business id (not the placement's).
    pub business_id: String,
    /// The account the order belongs to.
    pub account_id: String,
    /// The order.
    pub order_id: i64,
}

impl EventRequest for CancelRequest {
    const KIND: EventKind = EventKind::Cancel;

    fn tenant_id(&self) -> &str {
        &self.tenant_id
    }

    fn business_id(&self) -> &str {
        &self.business_id
    }

    /// `CANCEL|account|order`.
    fn payload(&self) -> String {
        format!("CANCEL|{}|{}", self.account_id, self.order_id)
    }
}

impl CancelRequest {
    /// Checks the ids before any database access: tenant, business and account id, a
    /// positive order id.
    ///
    /// Errors: [`FrozenError::Invalid`].
    pub fn check(&self) -> Result<(), FrozenError> {
        check_id("tenant id", &self.tenant_id)?;
        check_id("business id", &self.business_id)?;
        check_id("account id", &self.account_id)?;
        if self.order_id <= 0 {
            return Err(FrozenError::Invalid("order ids are positive".into()));
        }
        Ok(())
    }

    /// What the cancel releases of the open `order`: its remainder (minor units).
    ///
    /// Errors: [`FrozenError::InvariantViolated`] when the open order holds nothing.
    pub fn remainder(&self, order: &OrderRow) -> Result<i64, FrozenError> {
        let remainder = order.remainder();
        if remainder <= 0 {
            return Err(FrozenError::InvariantViolated(format!(
                "open order {} holds {remainder}",
                order.order_id
            )));
        }
        Ok(remainder)
    }

    /// The movement of the release: the account's `asset`, available +`remainder`,
    /// frozen −`remainder` (minor units).
    ///
    /// Errors: [`FrozenError::InvariantViolated`] (a delta overflow).
    pub fn release_deltas(&self, asset: Asset, remainder: i64) -> Result<Deltas, FrozenError> {
        let mut deltas = Deltas::new();
        add_delta(&mut deltas, &self.account_id, asset, remainder, -remainder)?;
        Ok(deltas)
    }
}

/// What a cancel reports, the same on every replay (except `replayed`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CancelResult {
    /// OK or ORDER_CLOSED.
    pub outcome: Outcome,
    /// The order.
    pub order_id: i64,
    /// The asset the order froze.
    pub asset: Asset,
    /// Released from frozen to available, minor units (0 when refused).
    pub released: i64,
    /// The order's status after the cancel (CANCELLED), or the status that refused it.
    pub order_status: OrderStatus,
    /// Read back from an earlier request with the same id; nothing executed now.
    #[serde(skip)]
    pub replayed: bool,
}

recorded!(CancelResult);

impl CancelResult {
    /// ORDER_CLOSED: `order` (of `asset`) is no longer open; nothing released.
    pub fn closed(order: &OrderRow, asset: Asset) -> CancelResult {
        CancelResult {
            outcome: Outcome::OrderClosed,
            order_id: order.order_id,
            asset,
            released: 0,
            order_status: order.status,
            replayed: false,
        }
    }

    /// OK: `order` (of `asset`) CANCELLED with `remainder` (minor units) released.
    pub fn released(order: &OrderRow, asset: Asset, remainder: i64) -> CancelResult {
        CancelResult {
            outcome: Outcome::Ok,
            released: remainder,
            order_status: OrderStatus::Cancelled,
            ..CancelResult::closed(order, asset)
        }
    }
}

// The order first, then its balance row: the same order of locks as a fill (orders, then
// balances), so a cancel and a fill of one order cannot deadlock.
fn lock_order_sql() -> String {
    format!(
        "SELECT {ORDER_COLUMNS} FROM spot_order \
         WHERE tenant_id = $1 AND order_id = $2 AND account_id = $3 FOR UPDATE"
    )
}

// Guarded by frozen >= remainder: a frozen balance below what the order holds is a bug,
// refused here rather than by the CHECK.
const RELEASE_SQL: &str = "\
UPDATE balance
SET available = available + $4, frozen = frozen - $4, version = version + 1
WHERE tenant_id = $1 AND account_id = $2 AND asset = $3 AND frozen >= $4
RETURNING frozen";

const CLOSE_ORDER_SQL: &str = "\
UPDATE spot_order SET released = released + $2, status = 'CANCELLED' WHERE order_id = $1";

/// Cancels `req.order_id`: locks the order; if it is no longer open, records
/// ORDER_CLOSED; else releases its remainder (original freeze − consumed − released,
/// from the freeze record, never from a current price) and marks it CANCELLED.
///
/// Errors: [`FrozenError::Invalid`]; [`FrozenError::NoOrder`] (no such order of this
/// account; not recorded); [`FrozenError::InvariantViolated`];
/// [`FrozenError::PayloadMismatch`]; [`FrozenError::HookAborted`]; [`FrozenError::Db`].
pub async fn cancel(
    client: &mut Client,
    req: &CancelRequest,
    hooks: &dyn Hooks,
) -> Result<CancelResult, FrozenError> {
    req.check()?;
    retry_on_deadlock!(cancel_once(client, req, hooks))
}

/// One attempt of [`cancel`]: registers, locks the order, releases it, commits (see
/// there).
///
/// Errors: as [`cancel`]; a deadlock (40P01) as [`FrozenError::Db`], for the retry.
async fn cancel_once(
    client: &mut Client,
    req: &CancelRequest,
    hooks: &dyn Hooks,
) -> Result<CancelResult, FrozenError> {
    let event = Event::of(req);
    let tx = begin(client).await?;
    let operation_id = match register::<CancelResult>(&tx, &event).await? {
        Registration::New(id) => id,
        Registration::Replay(result) => {
            tx.rollback().await?;
            return Ok(result);
        }
    };
    let tx = hook_in_tx(tx, hooks, &event, HookPoint::Registered).await?;
    let (tx, order) = lock_order(tx, req).await?;
    let asset = order.asset()?;
    if order.status != OrderStatus::Open {
        let result = CancelResult::closed(&order, asset);
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
    let (tx, remainder) = release(tx, req, &order, asset).await?;
    let tx = hook_in_tx(tx, hooks, &event, HookPoint::BalancesUpdated).await?;
    let result = close_order(&tx, &event, req, &order, asset, remainder).await?;
    finish(tx, hooks, &event, operation_id, Outcome::Ok, result).await
}

/// Locks the order `req.order_id` of `req.account_id` ([`lock_order_sql`]) and returns
/// `tx` with it. When there is no such order rolls `tx` back.
///
/// Errors: [`FrozenError::NoOrder`] (rolled back, not recorded); [`FrozenError::Db`];
/// [`FrozenError::InvariantViolated`] (an unknown status).
async fn lock_order<'t>(
    tx: Transaction<'t>,
    req: &CancelRequest,
) -> Result<(Transaction<'t>, OrderRow), FrozenError> {
    let row = tx
        .query_typed_opt(
            &lock_order_sql(),
            &[
                (&req.tenant_id, Type::TEXT),
                (&req.order_id, Type::INT8),
                (&req.account_id, Type::TEXT),
            ],
        )
        .await?;
    let Some(row) = row else {
        let _ = tx.rollback().await;
        return Err(FrozenError::NoOrder(req.order_id));
    };
    let order = OrderRow::from_row(&row)?;
    Ok((tx, order))
}

/// Releases the open `order`'s remainder on the account's `asset` row (frozen →
/// available, guarded by frozen ≥ remainder) and returns `tx` with the remainder (minor
/// units). When the order holds nothing or the row's frozen is below the remainder
/// rolls `tx` back.
///
/// Errors: [`FrozenError::InvariantViolated`] (rolled back); [`FrozenError::Db`].
async fn release<'t>(
    tx: Transaction<'t>,
    req: &CancelRequest,
    order: &OrderRow,
    asset: Asset,
) -> Result<(Transaction<'t>, i64), FrozenError> {
    let remainder = match req.remainder(order) {
        Ok(remainder) => remainder,
        Err(error) => {
            let _ = tx.rollback().await;
            return Err(error);
        }
    };
    let asset_name = asset.as_str();
    let released = tx
        .query_typed_opt(
            RELEASE_SQL,
            &[
                (&req.tenant_id, Type::TEXT),
                (&req.account_id, Type::TEXT),
                (&asset_name, Type::TEXT),
                (&remainder, Type::INT8),
            ],
        )
        .await?;
    if released.is_none() {
        let _ = tx.rollback().await;
        return Err(FrozenError::InvariantViolated(format!(
            "{} {asset_name}: frozen below order {}'s remainder {remainder}",
            req.account_id, order.order_id
        )));
    }
    Ok((tx, remainder))
}

/// Inside `tx`, after the release: writes its movement, marks the order CANCELLED with
/// `remainder` released (minor units) and returns the OK result.
///
/// Errors: [`FrozenError::Db`]; [`FrozenError::InvariantViolated`] (delta overflow).
async fn close_order(
    tx: &Transaction<'_>,
    event: &Event<'_>,
    req: &CancelRequest,
    order: &OrderRow,
    asset: Asset,
    remainder: i64,
) -> Result<CancelResult, FrozenError> {
    write_movements(tx, event, &req.release_deltas(asset, remainder)?).await?;
    tx.execute_typed(
        CLOSE_ORDER_SQL,
        &[(&order.order_id, Type::INT8), (&remainder, Type::INT8)],
    )
    .await?;
    Ok(CancelResult::released(order, asset, remainder))
}
