//! Per-asset reconciliation on InnoDB (SPEC §8): the checks of
//! `frozen_balances::reconcile`, with its [`Findings`] type, in one consistent snapshot.
//!
//! The transaction is `START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY` at
//! REPEATABLE READ: every statement reads the snapshot taken at its start (plain
//! consistent reads, MySQL reference manual "Consistent Nonlocking Reads"), so an event
//! committing meanwhile is wholly visible or not at all, and the reads take no row or gap
//! locks: a reconciliation never blocks an event's INSERT into a gap it scanned, as a
//! locking read (`FOR SHARE`, or any read under SERIALIZABLE) would.

use frozen_balances::Asset;
use frozen_balances::reconcile::{
    AssetTotal, ClosedOrderRemainder, EventRef, Findings, FrozenMismatch, RowMismatch,
};
use mysql_async::prelude::Queryable;
use mysql_async::{IsolationLevel, Transaction, TxOpts};

use crate::InnoError;

const ROW_MISMATCH_SQL: &str = "\
SELECT b.tenant_id, b.account_id, b.asset, b.available, b.frozen,
       CAST(COALESCE(m.av, 0) AS SIGNED), CAST(COALESCE(m.fr, 0) AS SIGNED)
FROM balance b
LEFT JOIN (SELECT tenant_id, account_id, asset, SUM(available_delta) AS av, SUM(frozen_delta) AS fr
           FROM balance_movement GROUP BY tenant_id, account_id, asset) m
  ON m.tenant_id = b.tenant_id AND m.account_id = b.account_id AND m.asset = b.asset
WHERE b.available <> COALESCE(m.av, 0) OR b.frozen <> COALESCE(m.fr, 0)
ORDER BY b.tenant_id, b.account_id, b.asset";

const ASSET_TOTALS_SQL: &str = "\
SELECT tenant_id, asset, CAST(SUM(available + frozen) AS SIGNED)
FROM balance GROUP BY tenant_id, asset ORDER BY tenant_id, asset";

const FROZEN_MISMATCH_SQL: &str = "\
SELECT b.tenant_id, b.account_id, b.asset, b.frozen, CAST(COALESCE(o.rem, 0) AS SIGNED)
FROM balance b
LEFT JOIN (SELECT tenant_id, account_id, frozen_asset AS asset,
                  SUM(frozen_amount - consumed - released) AS rem
           FROM spot_order WHERE status = 'OPEN' GROUP BY tenant_id, account_id, frozen_asset) o
  ON o.tenant_id = b.tenant_id AND o.account_id = b.account_id AND o.asset = b.asset
WHERE b.frozen <> COALESCE(o.rem, 0)
ORDER BY b.tenant_id, b.account_id, b.asset";

const CLOSED_REMAINDER_SQL: &str = "\
SELECT tenant_id, order_id, status, frozen_amount - consumed - released
FROM spot_order WHERE status <> 'OPEN' AND frozen_amount - consumed - released <> 0
ORDER BY tenant_id, order_id";

const MOVEMENTS_WITHOUT_OPERATION_SQL: &str = "\
SELECT m.tenant_id, m.business_id, CONCAT(m.account_id, ' ', m.asset)
FROM balance_movement m
LEFT JOIN balance_operation o
  ON o.tenant_id = m.tenant_id AND o.business_id = m.business_id AND o.outcome = 'OK'
WHERE o.operation_id IS NULL
ORDER BY 1, 2, 3";

const OPERATIONS_WITHOUT_MOVEMENT_SQL: &str = "\
SELECT o.tenant_id, o.business_id, CONCAT(o.kind, ' ', o.outcome)
FROM balance_operation o
WHERE o.outcome = 'OK' AND NOT EXISTS (
    SELECT 1 FROM balance_movement m WHERE m.tenant_id = o.tenant_id AND m.business_id = o.business_id)
ORDER BY 1, 2";

const PENDING_SQL: &str = "\
SELECT tenant_id, business_id, CONCAT(kind, ' ', outcome)
FROM balance_operation WHERE outcome = 'PENDING' ORDER BY 1, 2";

/// Runs every check in one consistent, read-only snapshot (see the module). Withdrawals
/// do not exist on this engine, so `pending_withdrawals` is always 0.
///
/// Errors: [`InnoError::Server`]; [`InnoError::Frozen`] for an asset not known.
pub async fn reconcile(conn: &mut mysql_async::Conn) -> Result<Findings, InnoError> {
    let mut options = TxOpts::default();
    options
        .with_isolation_level(IsolationLevel::RepeatableRead)
        .with_consistent_snapshot(true)
        .with_readonly(true);
    let mut tx = conn.start_transaction(options).await?;
    let findings = Findings {
        row_mismatches: row_mismatches(&mut tx).await?,
        asset_totals: asset_totals(&mut tx).await?,
        frozen_mismatches: frozen_mismatches(&mut tx).await?,
        closed_with_remainder: closed_with_remainder(&mut tx).await?,
        movements_without_operation: event_refs(&mut tx, MOVEMENTS_WITHOUT_OPERATION_SQL).await?,
        operations_without_movement: event_refs(&mut tx, OPERATIONS_WITHOUT_MOVEMENT_SQL).await?,
        pending_operations: event_refs(&mut tx, PENDING_SQL).await?,
        reorg_shortfalls: Vec::new(),
    };
    tx.commit().await?;
    Ok(findings)
}

fn asset(text: &str) -> Result<Asset, InnoError> {
    text.parse()
        .map_err(|_| InnoError::invariant(format!("unknown asset {text}")))
}

type MismatchRow = (String, String, String, i64, i64, i64, i64);

async fn row_mismatches(tx: &mut Transaction<'_>) -> Result<Vec<RowMismatch>, InnoError> {
    let rows: Vec<MismatchRow> = tx.query(ROW_MISMATCH_SQL).await?;
    rows.into_iter()
        .map(|(tenant_id, account_id, a, available, frozen, mav, mfr)| {
            Ok(RowMismatch {
                tenant_id,
                account_id,
                asset: asset(&a)?,
                available,
                frozen,
                movements_available: mav,
                movements_frozen: mfr,
            })
        })
        .collect()
}

async fn asset_totals(tx: &mut Transaction<'_>) -> Result<Vec<AssetTotal>, InnoError> {
    let rows: Vec<(String, String, i64)> = tx.query(ASSET_TOTALS_SQL).await?;
    rows.into_iter()
        .map(|(tenant_id, a, total)| {
            Ok(AssetTotal {
                tenant_id,
                asset: asset(&a)?,
                total,
            })
        })
        .collect()
}

async fn frozen_mismatches(tx: &mut Transaction<'_>) -> Result<Vec<FrozenMismatch>, InnoError> {
    let rows: Vec<(String, String, String, i64, i64)> = tx.query(FROZEN_MISMATCH_SQL).await?;
    rows.into_iter()
        .map(|(tenant_id, account_id, a, frozen, open_remainders)| {
            Ok(FrozenMismatch {
                tenant_id,
                account_id,
                asset: asset(&a)?,
                frozen,
                open_remainders,
                pending_withdrawals: 0,
            })
        })
        .collect()
}

async fn closed_with_remainder(
    tx: &mut Transaction<'_>,
) -> Result<Vec<ClosedOrderRemainder>, InnoError> {
    let rows: Vec<(String, i64, String, i64)> = tx.query(CLOSED_REMAINDER_SQL).await?;
    Ok(rows
        .into_iter()
        .map(
            |(tenant_id, order_id, status, remainder)| ClosedOrderRemainder {
                tenant_id,
                order_id,
                status,
                remainder,
            },
        )
        .collect())
}

async fn event_refs(tx: &mut Transaction<'_>, sql: &str) -> Result<Vec<EventRef>, InnoError> {
    let rows: Vec<(String, String, String)> = tx.query(sql).await?;
    Ok(rows
        .into_iter()
        .map(|(tenant_id, business_id, what)| EventRef {
            tenant_id,
            business_id,
            what,
        })
        .collect())
}
