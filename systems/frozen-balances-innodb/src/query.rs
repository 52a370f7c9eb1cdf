//! Balances, orders and counts, for callers and cases.

use frozen_balances::Asset;
use frozen_balances::amount::format_units;
use mysql_async::prelude::Queryable;

use crate::InnoError;

/// `(available, frozen)` of one balance row, minor units; `(0, 0)` when it does not exist.
///
/// Errors: the server's.
pub async fn balance<Q: Queryable>(
    conn: &mut Q,
    tenant_id: &str,
    account_id: &str,
    asset: Asset,
) -> Result<(i64, i64), InnoError> {
    let row: Option<(i64, i64)> = conn
        .exec_first(
            "SELECT available, frozen FROM balance WHERE tenant_id = ? AND account_id = ? AND asset = ?",
            (tenant_id, account_id, asset.as_str()),
        )
        .await?;
    Ok(row.unwrap_or((0, 0)))
}

/// One balance row as `available=<decimal> frozen=<decimal>` in the asset's scale.
///
/// Errors: the server's.
pub async fn balance_line<Q: Queryable>(
    conn: &mut Q,
    tenant_id: &str,
    account_id: &str,
    asset: Asset,
) -> Result<String, InnoError> {
    let (available, frozen) = balance(conn, tenant_id, account_id, asset).await?;
    Ok(format!(
        "available={} frozen={}",
        format_units(asset, available),
        format_units(asset, frozen)
    ))
}

/// Rows of the four tables, as `operations=N movements=N orders=N balances=N`.
///
/// Errors: the server's.
pub async fn counts<Q: Queryable>(conn: &mut Q) -> Result<String, InnoError> {
    let row: Option<(i64, i64, i64, i64)> = conn
        .query_first(
            "SELECT (SELECT COUNT(*) FROM balance_operation), (SELECT COUNT(*) FROM balance_movement), \
             (SELECT COUNT(*) FROM spot_order), (SELECT COUNT(*) FROM balance)",
        )
        .await?;
    let (o, m, s, b) = row.unwrap_or_default();
    Ok(format!(
        "operations={o} movements={m} orders={s} balances={b}"
    ))
}

/// Everything the events record, as text in key order: every operation (kind, business
/// id, outcome), movement, order and balance row. Two equal texts mean nothing changed.
///
/// Errors: the server's.
pub async fn recorded<Q: Queryable>(conn: &mut Q) -> Result<String, InnoError> {
    let parts = [
        "SELECT CONCAT_WS(' ', tenant_id, business_id, kind, outcome) FROM balance_operation ORDER BY operation_id",
        "SELECT CONCAT_WS(' ', tenant_id, business_id, account_id, asset, available_delta, frozen_delta) FROM balance_movement ORDER BY movement_id",
        "SELECT CONCAT_WS(' ', order_id, account_id, status, frozen_amount, consumed, released) FROM spot_order ORDER BY order_id",
        "SELECT CONCAT_WS(' ', tenant_id, account_id, asset, available, frozen) FROM balance ORDER BY tenant_id, account_id, asset",
    ];
    let mut text = String::new();
    for sql in parts {
        let rows: Vec<String> = conn.query(sql).await?;
        text.push_str(&rows.join("\n"));
        text.push_str("\n--\n");
    }
    Ok(text)
}
