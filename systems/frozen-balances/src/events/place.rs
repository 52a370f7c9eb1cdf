//! *place*: an order freezes its funds (SPEC §8).

use serde::{Deserialize, Serialize};
use tokio_postgres::types::Type;
use tokio_postgres::{Client, Transaction};

use super::{
    Registration, begin, ensure_rows, finish, hook_in_tx, register, require_row, retry_on_deadlock,
    write_movements,
};
use crate::amount;
use crate::asset::{Asset, Market, Side};
use crate::decisions::{Deltas, Event, EventRequest, Outcome, add_delta, check_id, recorded};
use crate::error::FrozenError;
use crate::hooks::{EventKind, HookPoint, Hooks};
use crate::schema::is_system_account;

/// An order to place. Quantity in base units, limit in quote units per whole base coin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlaceRequest {
    /// Tenant; scopes the business id and owns the account.
    pub tenant_id: String,
    /// The placement's own business id (not the order id, which the product assigns).
    pub business_id: String,
    /// The trader's account (not a system account).
    pub account_id: String,
    /// The market.
    pub market: Market,
    /// BUY or SELL.
    pub side: Side,
    /// Quantity, base units, a positive multiple of the lot.
    pub quantity: i64,
    /// Limit price, quote units per whole base coin, a positive multiple of the tick.
    pub limit_price: i64,
}

impl EventRequest for PlaceRequest {
    const KIND: EventKind = EventKind::Place;

    fn tenant_id(&self) -> &str {
        &self.tenant_id
    }

    fn business_id(&self) -> &str {
        &self.business_id
    }

    /// The canonical payload: `PLACE|account|market|side|quantity|limit` (minor units).
    fn payload(&self) -> String {
        format!(
            "PLACE|{}|{}|{}|{}|{}",
            self.account_id,
            self.market.as_str(),
            self.side.as_str(),
            self.quantity,
            self.limit_price
        )
    }
}

impl PlaceRequest {
    /// Checks ids, steps and limits, and computes the freeze ([`amount::order_freeze`]).
    ///
    /// Errors: [`FrozenError::Invalid`] or [`FrozenError::Amount`].
    pub fn freeze(&self) -> Result<amount::Freeze, FrozenError> {
        check_id("tenant id", &self.tenant_id)?;
        check_id("business id", &self.business_id)?;
        check_id("account id", &self.account_id)?;
        if is_system_account(&self.account_id) {
            return Err(FrozenError::Invalid(format!(
                "{} is a system account",
                self.account_id
            )));
        }
        let market = self.market;
        let positive_multiple = |value: i64, step: i64| value > 0 && value % step == 0;
        if !positive_multiple(self.quantity, market.lot_units())
            || self.quantity > market.base().max_units()
        {
            return Err(FrozenError::Invalid(format!(
                "quantity {} units is not a positive multiple of the lot within the maximum",
                self.quantity
            )));
        }
        if !positive_multiple(self.limit_price, market.tick_units())
            || self.limit_price > market.max_price_units()
        {
            return Err(FrozenError::Invalid(format!(
                "limit price {} units is not a positive multiple of the tick within the maximum",
                self.limit_price
            )));
        }
        Ok(amount::order_freeze(
            market,
            self.side,
            self.quantity,
            self.limit_price,
        )?)
    }

    /// The balance rows a placement creates at 0 when missing: the account's base and
    /// quote rows of the market, `(account, asset, allow_negative)`.
    pub fn balance_rows(&self) -> [(&str, Asset, bool); 2] {
        [
            (&self.account_id, self.market.base(), false),
            (&self.account_id, self.market.quote(), false),
        ]
    }

    /// The movement of `freeze`: the account's `freeze.asset`, available −amount,
    /// frozen +amount (minor units).
    ///
    /// Errors: [`FrozenError::InvariantViolated`] (a delta overflow).
    pub fn freeze_deltas(&self, freeze: &amount::Freeze) -> Result<Deltas, FrozenError> {
        let mut deltas = Deltas::new();
        add_delta(
            &mut deltas,
            &self.account_id,
            freeze.asset,
            -freeze.amount,
            freeze.amount,
        )?;
        Ok(deltas)
    }
}

/// What a placement reports, the same on every replay (except `replayed`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlaceResult {
    /// OK or INSUFFICIENT.
    pub outcome: Outcome,
    /// The new order's id (OK only).
    pub order_id: Option<i64>,
    /// The asset frozen (or that would have been).
    pub frozen_asset: Asset,
    /// The freeze, fee reserve included, minor units (also when refused: what it needed).
    pub frozen_amount: i64,
    /// The fee reserve inside `frozen_amount` (0 for a SELL).
    pub fee_reserve: i64,
    /// Available of `frozen_asset` after the freeze (OK) or when refused (INSUFFICIENT).
    pub available: i64,
    /// Read back from an earlier request with the same id; nothing executed now.
    #[serde(skip)]
    pub replayed: bool,
}

recorded!(PlaceResult);

impl PlaceResult {
    /// INSUFFICIENT: `freeze` refused with `available` (minor units) left as it was.
    pub fn refused(freeze: &amount::Freeze, available: i64) -> PlaceResult {
        PlaceResult {
            outcome: Outcome::Insufficient,
            order_id: None,
            frozen_asset: freeze.asset,
            frozen_amount: freeze.amount,
            fee_reserve: freeze.fee_reserve,
            available,
            replayed: false,
        }
    }

    /// OK: `freeze` taken for the new order `order_id`, `available` (minor units) left.
    pub fn placed(freeze: &amount::Freeze, order_id: i64, available: i64) -> PlaceResult {
        PlaceResult {
            outcome: Outcome::Ok,
            order_id: Some(order_id),
            ..PlaceResult::refused(freeze, available)
        }
    }
}

// The conditional freeze: if a concurrent transaction changed the row, PostgreSQL waits
// and re-evaluates the WHERE on the new version (docs, 13.2.1 "Read Committed Isolation
// Level"), so "enough available?" and "freeze it" are one evaluation.
const FREEZE_SQL: &str = "\
UPDATE balance
SET available = available - $4, frozen = frozen + $4, version = version + 1
WHERE tenant_id = $1 AND account_id = $2 AND asset = $3 AND available >= $4
RETURNING available";

const AVAILABLE_SQL: &str = "\
SELECT available FROM balance WHERE tenant_id = $1 AND account_id = $2 AND asset = $3";

const INSERT_ORDER_SQL: &str = "\
INSERT INTO spot_order (tenant_id, account_id, place_business_id, market, side, quantity,
                        limit_price, frozen_asset, frozen_amount, fee_reserve)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
RETURNING order_id";

/// Places `req`: registers its business id, freezes `quantity × limit` plus the fee
/// reserve (BUY, quote asset) or `quantity` (SELL, base asset) with a conditional
/// UPDATE, writes the movement and the order, records OK. Not enough available → records
/// INSUFFICIENT and changes nothing else. An account with no balance row of the asset
/// it would freeze is refused before anything is created; its missing row of the other
/// asset of the market (the one a fill credits) is created at 0. Hooks: `registered`, `balances-updated` (OK path), `before-commit`,
/// `after-commit`.
///
/// Errors: [`FrozenError::Invalid`] / [`FrozenError::Amount`] before any database
/// access; [`FrozenError::PayloadMismatch`]; [`FrozenError::NoBalance`] (rolled back, not
/// recorded); [`FrozenError::HookAborted`]; [`FrozenError::Db`].
pub async fn place(
    client: &mut Client,
    req: &PlaceRequest,
    hooks: &dyn Hooks,
) -> Result<PlaceResult, FrozenError> {
    let freeze = req.freeze()?;
    retry_on_deadlock!(place_once(client, req, freeze, hooks))
}

/// One attempt of [`place`]: registers, freezes, records the order, commits (see there).
///
/// Errors: as [`place`]; a deadlock (40P01) as [`FrozenError::Db`], for the retry.
async fn place_once(
    client: &mut Client,
    req: &PlaceRequest,
    freeze: amount::Freeze,
    hooks: &dyn Hooks,
) -> Result<PlaceResult, FrozenError> {
    let event = Event::of(req);
    let tx = begin(client).await?;
    let operation_id = match register::<PlaceResult>(&tx, &event).await? {
        Registration::New(id) => id,
        Registration::Replay(result) => {
            tx.rollback().await?;
            return Ok(result);
        }
    };
    let tx = hook_in_tx(tx, hooks, &event, HookPoint::Registered).await?;
    let Some(available) = freeze_funds(&tx, req, &freeze).await? else {
        let result = refusal(&tx, req, &freeze).await?;
        return finish(
            tx,
            hooks,
            &event,
            operation_id,
            Outcome::Insufficient,
            result,
        )
        .await;
    };
    let tx = hook_in_tx(tx, hooks, &event, HookPoint::BalancesUpdated).await?;
    let result = record_order(&tx, &event, req, &freeze, available).await?;
    finish(tx, hooks, &event, operation_id, Outcome::Ok, result).await
}

/// Inside `tx`: refuses an account without a row of the frozen asset
/// ([`super::require_row`]), creates its missing row of the other asset at 0, then freezes `freeze.amount` with the conditional UPDATE; the available left
/// (minor units), or `None` when there was not enough (nothing changed).
///
/// Errors: [`FrozenError::NoBalance`]; [`FrozenError::Db`].
async fn freeze_funds(
    tx: &Transaction<'_>,
    req: &PlaceRequest,
    freeze: &amount::Freeze,
) -> Result<Option<i64>, FrozenError> {
    require_row(tx, &req.tenant_id, &req.account_id, freeze.asset).await?;
    ensure_rows(tx, &req.tenant_id, &req.balance_rows()).await?;
    let asset = freeze.asset.as_str();
    let frozen = tx
        .query_typed_opt(
            FREEZE_SQL,
            &[
                (&req.tenant_id, Type::TEXT),
                (&req.account_id, Type::TEXT),
                (&asset, Type::TEXT),
                (&freeze.amount, Type::INT8),
            ],
        )
        .await?;
    Ok(match frozen {
        Some(row) => Some(row.try_get("available")?),
        None => None,
    })
}

/// Inside `tx`, after a refused freeze: the INSUFFICIENT result, with the available of
/// the asset (minor units) read now.
///
/// Errors: [`FrozenError::Db`].
async fn refusal(
    tx: &Transaction<'_>,
    req: &PlaceRequest,
    freeze: &amount::Freeze,
) -> Result<PlaceResult, FrozenError> {
    let asset = freeze.asset.as_str();
    let available: i64 = tx
        .query_typed_one(
            AVAILABLE_SQL,
            &[
                (&req.tenant_id, Type::TEXT),
                (&req.account_id, Type::TEXT),
                (&asset, Type::TEXT),
            ],
        )
        .await?
        .try_get("available")?;
    Ok(PlaceResult::refused(freeze, available))
}

/// Inside `tx`, after the freeze: writes its movement and the order row, and returns the
/// OK result with the new order id and `available` (minor units, after the freeze).
///
/// Errors: [`FrozenError::Db`]; [`FrozenError::InvariantViolated`] (delta overflow).
async fn record_order(
    tx: &Transaction<'_>,
    event: &Event<'_>,
    req: &PlaceRequest,
    freeze: &amount::Freeze,
    available: i64,
) -> Result<PlaceResult, FrozenError> {
    write_movements(tx, event, &req.freeze_deltas(freeze)?).await?;
    let (market_name, side) = (req.market.as_str(), req.side.as_str());
    let asset = freeze.asset.as_str();
    let order_id: i64 = tx
        .query_typed_one(
            INSERT_ORDER_SQL,
            &[
                (&req.tenant_id, Type::TEXT),
                (&req.account_id, Type::TEXT),
                (&req.business_id, Type::TEXT),
                (&market_name, Type::TEXT),
                (&side, Type::TEXT),
                (&req.quantity, Type::INT8),
                (&req.limit_price, Type::INT8),
                (&asset, Type::TEXT),
                (&freeze.amount, Type::INT8),
                (&freeze.fee_reserve, Type::INT8),
            ],
        )
        .await?
        .try_get("order_id")?;
    Ok(PlaceResult::placed(freeze, order_id, available))
}
