//! The naive designs the F negative controls (F6, F8) run against the real spot tables,
//! beside the events they refute: the mistakes the design article (seed 003) warns of,
//! written out so that each control shows its anomaly on the product's own schema.
//! Nothing here is used by the product.
//!
//! Every naive write still records what the product records (operation, movements,
//! order), so that the reconciliation sees exactly the anomaly and nothing else.

use crate::decisions::{EventRequest, payload_hash};
use crate::error::FrozenError;
use crate::{DEFAULT_TENANT, PlaceRequest};
use tokio_postgres::Client;

/// The tenant of every naive write.
const T: &str = DEFAULT_TENANT;

/// Writes the records of one placement of `req` (its freeze as [`PlaceRequest::freeze`]
/// computes it): the OK operation, the movement, and the OPEN order; no balance change
/// (the caller made it). Runs on whatever transaction or session `client` is in.
///
/// Errors: database errors.
pub async fn record_placement(
    client: &impl tokio_postgres::GenericClient,
    req: &PlaceRequest,
) -> Result<(), FrozenError> {
    let freeze = req.freeze()?;
    let (asset, amount) = (freeze.asset.as_str(), freeze.amount);
    let payload = req.payload();
    client
        .execute(
            "INSERT INTO balance_operation (tenant_id, business_id, kind, payload, \
             payload_hash, outcome, result) VALUES ($1, $2, 'PLACE', $3, $4, 'OK', '{}')",
            &[&T, &req.business_id, &payload, &payload_hash(&payload)],
        )
        .await?;
    client
        .execute(
            "INSERT INTO balance_movement (tenant_id, business_id, account_id, asset, \
             available_delta, frozen_delta) VALUES ($1, $2, $3, $4, $5, $6)",
            &[
                &T,
                &req.business_id,
                &req.account_id,
                &asset,
                &-amount,
                &amount,
            ],
        )
        .await?;
    client
        .execute(
            "INSERT INTO spot_order (tenant_id, account_id, place_business_id, market, side, \
             quantity, limit_price, frozen_asset, frozen_amount, fee_reserve) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
            &[
                &T,
                &req.account_id,
                &req.business_id,
                &req.market.as_str(),
                &req.side.as_str(),
                &req.quantity,
                &req.limit_price,
                &asset,
                &amount,
                &freeze.fee_reserve,
            ],
        )
        .await?;
    Ok(())
}

/// `(available, frozen)` of a balance row, read without a lock (a plain snapshot read).
///
/// Errors: database errors, no row.
pub async fn read_balance(
    client: &impl tokio_postgres::GenericClient,
    account: &str,
    asset: &str,
) -> Result<(i64, i64), FrozenError> {
    let row = client
        .query_one(
            "SELECT available, frozen FROM balance \
             WHERE tenant_id = $1 AND account_id = $2 AND asset = $3",
            &[&T, &account, &asset],
        )
        .await?;
    Ok((row.get(0), row.get(1)))
}

/// Writes the values the application computed (`available`, `frozen`) into a balance
/// row: the write of a read-modify-write, which trusts that nobody wrote in between.
///
/// Errors: database errors.
pub async fn write_balance(
    client: &impl tokio_postgres::GenericClient,
    account: &str,
    asset: &str,
    available: i64,
    frozen: i64,
) -> Result<(), FrozenError> {
    client
        .execute(
            "UPDATE balance SET available = $4, frozen = $5, version = version + 1 \
             WHERE tenant_id = $1 AND account_id = $2 AND asset = $3",
            &[&T, &account, &asset, &available, &frozen],
        )
        .await?;
    Ok(())
}

/// Whether an operation with `business_id` exists (the naive idempotency check, made
/// before the work instead of by registering first).
///
/// Errors: database errors.
pub async fn operation_exists(client: &Client, business_id: &str) -> Result<bool, FrozenError> {
    Ok(client
        .query_opt(
            "SELECT 1 FROM balance_operation WHERE tenant_id = $1 AND business_id = $2",
            &[&T, &business_id],
        )
        .await?
        .is_some())
}
