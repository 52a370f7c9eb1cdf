//! Reads for callers and cases: balances per asset and the freeze record of an order.

use serde::Serialize;
use tokio_postgres::Client;
use tokio_postgres::types::Type;

use crate::asset::Asset;
use crate::error::FrozenError;
use crate::events::OrderStatus;

/// One asset's balance of an account, minor units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct AssetBalance {
    /// The asset.
    pub asset: Asset,
    /// Spendable.
    pub available: i64,
    /// Held by open orders.
    pub frozen: i64,
}

/// The balances of `account_id` in `tenant_id`, one per asset row, ordered by asset name
/// (`BTC`, `USDT`); empty when the account has no rows.
///
/// Errors: [`FrozenError::Db`].
pub async fn balances(
    client: &Client,
    tenant_id: &str,
    account_id: &str,
) -> Result<Vec<AssetBalance>, FrozenError> {
    let rows = client
        .query_typed(
            "SELECT asset, available, frozen FROM balance \
             WHERE tenant_id = $1 AND account_id = $2 ORDER BY asset",
            &[(&tenant_id, Type::TEXT), (&account_id, Type::TEXT)],
        )
        .await?;
    rows.iter()
        .map(|row| {
            let asset: &str = row.try_get("asset")?;
            Ok(AssetBalance {
                asset: asset.parse().map_err(|_| {
                    FrozenError::InvariantViolated(format!("unknown asset {asset}"))
                })?,
                available: row.try_get("available")?,
                frozen: row.try_get("frozen")?,
            })
        })
        .collect()
}

/// The balance of one asset (0 and 0 when the row does not exist).
///
/// Errors: [`FrozenError::Db`].
pub async fn balance(
    client: &Client,
    tenant_id: &str,
    account_id: &str,
    asset: Asset,
) -> Result<AssetBalance, FrozenError> {
    Ok(balances(client, tenant_id, account_id)
        .await?
        .into_iter()
        .find(|b| b.asset == asset)
        .unwrap_or(AssetBalance {
            asset,
            available: 0,
            frozen: 0,
        }))
}

/// An order's freeze record, minor units.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OrderRecord {
    /// Id.
    pub order_id: i64,
    /// Owner.
    pub account_id: String,
    /// `BUY` or `SELL`.
    pub side: String,
    /// Ordered quantity, base units.
    pub quantity: i64,
    /// Filled so far, base units.
    pub filled_quantity: i64,
    /// The original freeze, fee reserve included.
    pub frozen_amount: i64,
    /// Paid by fills out of the freeze.
    pub consumed: i64,
    /// Returned to available (price improvement, unused reserve, cancel).
    pub released: i64,
    /// Status.
    pub status: OrderStatus,
}

impl OrderRecord {
    /// What the order still holds: `frozen_amount − consumed − released`.
    pub fn remainder(&self) -> i64 {
        self.frozen_amount - self.consumed - self.released
    }
}

/// The order `order_id` of `tenant_id`, if it exists.
///
/// Errors: [`FrozenError::Db`].
pub async fn order(
    client: &Client,
    tenant_id: &str,
    order_id: i64,
) -> Result<Option<OrderRecord>, FrozenError> {
    let row = client
        .query_typed_opt(
            "SELECT order_id, account_id, side, quantity, filled_quantity, frozen_amount, \
             consumed, released, status FROM spot_order WHERE tenant_id = $1 AND order_id = $2",
            &[(&tenant_id, Type::TEXT), (&order_id, Type::INT8)],
        )
        .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    Ok(Some(OrderRecord {
        order_id: row.try_get("order_id")?,
        account_id: row.try_get("account_id")?,
        side: row.try_get("side")?,
        quantity: row.try_get("quantity")?,
        filled_quantity: row.try_get("filled_quantity")?,
        frozen_amount: row.try_get("frozen_amount")?,
        consumed: row.try_get("consumed")?,
        released: row.try_get("released")?,
        status: OrderStatus::parse(row.try_get("status")?)?,
    }))
}
