//! The naive designs the F controls refute, as spec operations (`spec_calls`):
//!
//! - `naive-cancel order=ORDER key=K current=4900` → `outcome=OK released=4904.900000
//!   status=CANCELLED available=… frozen=…`: one transaction, the order locked, the
//!   operation and the movement recorded as the product does; but the release is
//!   `remaining quantity × current price` plus its fee reserve, recomputed, instead of
//!   the freeze record's remainder (original − consumed − released; SPEC §8). F18.
//! - `naive-place account=A side=BUY qty=1.0 price=5000 key=K [fail=after-update]` →
//!   `outcome=OK available=… frozen=…` (USDT): the placement with each statement in its
//!   own transaction (autocommit): it looks for its operation (`outcome=FOUND` if there
//!   is one, and does nothing), updates the balance, then, unless `fail=after-update`
//!   (an error between the two steps), records the operation, movement and order. F6.
//! - `unchecked-place account=A side=BUY qty=1.0 price=5000 key=K [batch=yes]` →
//!   `outcome=OK available=… frozen=…` (USDT): the placement in one transaction that
//!   never reads its freeze's affected-row count; with `batch=yes` its four statements
//!   sent as one batch. A refused freeze is reported OK, its records written. F22.

use frozen_balances::amount::{format_units, order_freeze, parse_price};
use frozen_balances::events::payload_hash;
use frozen_balances::{Asset, EventRequest, Market, PlaceRequest, Side, naive};
use tokio_postgres::Client;

/// The naive cancel of the BUY `order_id` of `tenant` on BTC-USDT at `current` (decimal
/// text): returns the owner and what it released, in USDT units.
///
/// Errors: a price off the tick; no such order; database errors.
pub async fn cancel_at_current_price(
    db: &mut Client,
    tenant: &str,
    business_id: &str,
    order_id: i64,
    current: &str,
) -> anyhow::Result<(String, i64)> {
    let market = Market::BtcUsdt;
    let tx = db.transaction().await?;
    let row = tx
        .query_one(
            "SELECT account_id, quantity - filled_quantity FROM spot_order \
             WHERE tenant_id = $1 AND order_id = $2 FOR UPDATE",
            &[&tenant, &order_id],
        )
        .await?;
    let (account, remaining): (String, i64) = (row.get(0), row.get(1));
    let release = order_freeze(market, Side::Buy, remaining, parse_price(market, current)?)?.amount;
    tx.execute(
        "UPDATE balance SET available = available + $3, frozen = frozen - $3, \
         version = version + 1 WHERE tenant_id = $1 AND account_id = $2 AND asset = 'USDT'",
        &[&tenant, &account, &release],
    )
    .await?;
    let payload = format!("CANCEL|{account}|{order_id}");
    tx.execute(
        "INSERT INTO balance_operation (tenant_id, business_id, kind, payload, payload_hash, \
         outcome, result) VALUES ($1, $2, 'CANCEL', $3, $4, 'OK', '{}')",
        &[&tenant, &business_id, &payload, &payload_hash(&payload)],
    )
    .await?;
    tx.execute(
        "INSERT INTO balance_movement (tenant_id, business_id, account_id, asset, \
         available_delta, frozen_delta) VALUES ($1, $2, $3, 'USDT', $4, $5)",
        &[&tenant, &business_id, &account, &release, &-release],
    )
    .await?;
    tx.execute(
        "UPDATE spot_order SET released = released + $2, status = 'CANCELLED' \
         WHERE tenant_id = $3 AND order_id = $1",
        &[&order_id, &release, &tenant],
    )
    .await?;
    tx.commit().await?;
    Ok((account, release))
}

/// `released=…` of a naive cancel, in whole USDT.
pub fn released(units: i64) -> String {
    format!("released={}", format_units(Asset::Usdt, units))
}

/// The per-statement placement of `req` (see the module documentation): `FOUND` when
/// its operation exists, `OK` when it ran every statement.
///
/// Errors: `insufficient` (no row updated); `injected failure after the balance update`
/// when `fail`, the balance already changed; database errors.
pub async fn place_per_statement(
    db: &Client,
    req: &PlaceRequest,
    fail: bool,
) -> anyhow::Result<&'static str> {
    if naive::operation_exists(db, &req.business_id).await? {
        return Ok("FOUND");
    }
    let freeze = req.freeze()?;
    let updated = db
        .execute(
            "UPDATE balance SET available = available - $3, frozen = frozen + $3, \
             version = version + 1 \
             WHERE tenant_id = $1 AND account_id = $2 AND asset = 'USDT' AND available >= $3",
            &[&req.tenant_id, &req.account_id, &freeze.amount],
        )
        .await?;
    anyhow::ensure!(updated == 1, "insufficient");
    anyhow::ensure!(!fail, "injected failure after the balance update");
    naive::record_placement(db, req).await?;
    Ok("OK")
}

/// Text as an SQL string literal (single quotes doubled).
fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// The placement of `req` that never reads its freeze's affected-row count (F22): in one
/// transaction, the conditional freeze (`… AND available >= amount`), then the records
/// of an accepted placement (operation OK, movement, OPEN order) whatever the UPDATE
/// did. With `batched`, the four statements go as one simple-query batch
/// (`batch_execute`, one implicit transaction, PostgreSQL docs §55.2.2.1): an UPDATE
/// that matched no row is no error, so the batch succeeds. Either way a refused freeze
/// is reported `OK` and leaves a movement and an order with no balance change.
///
/// Errors: a request the library refuses; database errors.
pub async fn place_unchecked(
    db: &mut Client,
    req: &PlaceRequest,
    batched: bool,
) -> anyhow::Result<&'static str> {
    let freeze = req.freeze()?;
    if !batched {
        let tx = db.transaction().await?;
        // The count execute returns is dropped: the mistake this design shows.
        let _ = tx
            .execute(
                "UPDATE balance SET available = available - $3, frozen = frozen + $3, \
                 version = version + 1 WHERE tenant_id = $1 AND account_id = $2 \
                 AND asset = $4 AND available >= $3",
                &[
                    &req.tenant_id,
                    &req.account_id,
                    &freeze.amount,
                    &freeze.asset.as_str(),
                ],
            )
            .await?;
        naive::record_placement(&tx, req).await?;
        tx.commit().await?;
        return Ok("OK");
    }
    let (tenant, account) = (literal(&req.tenant_id), literal(&req.account_id));
    let (key, asset, amount) = (
        literal(&req.business_id),
        literal(freeze.asset.as_str()),
        freeze.amount,
    );
    let payload = req.payload();
    let batch = format!(
        "UPDATE balance SET available = available - {amount}, frozen = frozen + {amount}, \
         version = version + 1 WHERE tenant_id = {tenant} AND account_id = {account} \
         AND asset = {asset} AND available >= {amount}; \
         INSERT INTO balance_operation (tenant_id, business_id, kind, payload, payload_hash, \
         outcome, result) VALUES ({tenant}, {key}, 'PLACE', {}, {}, 'OK', '{{}}'); \
         INSERT INTO balance_movement (tenant_id, business_id, account_id, asset, \
         available_delta, frozen_delta) VALUES ({tenant}, {key}, {account}, {asset}, \
         {}, {amount}); \
         INSERT INTO spot_order (tenant_id, account_id, place_business_id, market, side, \
         quantity, limit_price, frozen_asset, frozen_amount, fee_reserve) VALUES ({tenant}, \
         {account}, {key}, {}, {}, {}, {}, {asset}, {amount}, {})",
        literal(&payload),
        literal(&payload_hash(&payload)),
        -amount,
        literal(req.market.as_str()),
        literal(req.side.as_str()),
        req.quantity,
        req.limit_price,
        freeze.fee_reserve,
    );
    db.batch_execute(&batch).await?;
    Ok("OK")
}
