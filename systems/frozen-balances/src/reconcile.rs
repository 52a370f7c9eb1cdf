//! Per-asset reconciliation (SPEC §8): what the events promise, recomputed from the
//! records of fact, in one REPEATABLE READ, READ ONLY snapshot (PostgreSQL docs, 13.2.2),
//! so an event committing meanwhile is wholly visible or not at all.
//!
//! Amounts of different assets are never added together: every total is per tenant and
//! asset, so a BTC shortfall cannot hide behind a USDT surplus.

use serde::Serialize;
use tokio_postgres::{Client, IsolationLevel, Transaction};

use crate::amount::format_units;
use crate::asset::Asset;
use crate::error::FrozenError;

/// A balance row that differs from the sum of its movements. Minor units.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RowMismatch {
    /// Tenant.
    pub tenant_id: String,
    /// Account.
    pub account_id: String,
    /// Asset.
    pub asset: Asset,
    /// `balance.available`.
    pub available: i64,
    /// `balance.frozen`.
    pub frozen: i64,
    /// Sum of the row's `available_delta`s.
    pub movements_available: i64,
    /// Sum of the row's `frozen_delta`s.
    pub movements_frozen: i64,
}

/// The sum of `available + frozen` over all accounts of a tenant for one asset
/// (`sys-deposit` included): 0 when every event moved the asset between accounts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AssetTotal {
    /// Tenant.
    pub tenant_id: String,
    /// Asset.
    pub asset: Asset,
    /// The sum, minor units.
    pub total: i64,
}

/// An account whose frozen differs from the remainders of its open orders plus the
/// amounts of its withdrawals not yet settled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FrozenMismatch {
    /// Tenant.
    pub tenant_id: String,
    /// Account.
    pub account_id: String,
    /// Asset.
    pub asset: Asset,
    /// `balance.frozen`.
    pub frozen: i64,
    /// Sum of `frozen_amount − consumed − released` over its OPEN orders in this asset.
    pub open_remainders: i64,
    /// Sum of the amounts of its withdrawals not yet settled (`REQUESTED`, `BROADCAST`,
    /// `UNKNOWN`) in this asset.
    pub pending_withdrawals: i64,
}

/// A FILLED or CANCELLED order that still holds (or over-released) part of its freeze.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClosedOrderRemainder {
    /// Tenant.
    pub tenant_id: String,
    /// Order.
    pub order_id: i64,
    /// Its status.
    pub status: String,
    /// `frozen_amount − consumed − released` (≠ 0).
    pub remainder: i64,
}

/// An operation or movement named by a link finding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EventRef {
    /// Tenant.
    pub tenant_id: String,
    /// Business id.
    pub business_id: String,
    /// The operation's kind and outcome, or the movement's account and asset.
    pub what: String,
}

/// Everything [`reconcile`] found; each list sorted by its key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Findings {
    /// Balance rows ≠ the sum of their movements.
    pub row_mismatches: Vec<RowMismatch>,
    /// Every (tenant, asset) total, zero or not (the findings are the non-zero ones).
    pub asset_totals: Vec<AssetTotal>,
    /// Accounts whose frozen ≠ the remainders of their open orders + their pending
    /// withdrawals.
    pub frozen_mismatches: Vec<FrozenMismatch>,
    /// Closed orders with a remainder.
    pub closed_with_remainder: Vec<ClosedOrderRemainder>,
    /// Movements without an OK operation of the same (tenant, business id).
    pub movements_without_operation: Vec<EventRef>,
    /// OK operations that moved nothing (every OK event moves something).
    pub operations_without_movement: Vec<EventRef>,
    /// Committed operations still PENDING.
    pub pending_operations: Vec<EventRef>,
    /// Reversed network deposits whose shortfall is outstanding, and `sys-reorg` rows
    /// that are not minus their sum ([`crate::reorg`]; PostgreSQL only, empty on InnoDB).
    pub reorg_shortfalls: Vec<crate::reorg::Shortfall>,
}

impl Findings {
    /// The (tenant, asset) totals that are not 0.
    pub fn unbalanced_assets(&self) -> Vec<&AssetTotal> {
        self.asset_totals.iter().filter(|t| t.total != 0).collect()
    }

    /// Number of findings.
    pub fn count(&self) -> usize {
        self.row_mismatches.len()
            + self.unbalanced_assets().len()
            + self.frozen_mismatches.len()
            + self.closed_with_remainder.len()
            + self.movements_without_operation.len()
            + self.operations_without_movement.len()
            + self.pending_operations.len()
            + self.reorg_shortfalls.len()
    }

    /// Nothing found.
    pub fn is_clean(&self) -> bool {
        self.count() == 0
    }

    /// One line of counts, e.g. `row_mismatches=0 unbalanced_assets=0 frozen_mismatches=0
    /// closed_with_remainder=0 movements_without_operation=0 operations_without_movement=0
    /// pending_operations=0`, then ` reorg_shortfalls=N` when N > 0 (F25).
    pub fn summary(&self) -> String {
        let shortfalls = match self.reorg_shortfalls.len() {
            0 => String::new(),
            n => format!(" reorg_shortfalls={n}"),
        };
        format!(
            "row_mismatches={} unbalanced_assets={} frozen_mismatches={} \
             closed_with_remainder={} movements_without_operation={} \
             operations_without_movement={} pending_operations={}{shortfalls}",
            self.row_mismatches.len(),
            self.unbalanced_assets().len(),
            self.frozen_mismatches.len(),
            self.closed_with_remainder.len(),
            self.movements_without_operation.len(),
            self.operations_without_movement.len(),
            self.pending_operations.len()
        )
    }

    /// The per-asset totals of `tenant_id` as text, e.g. `BTC=0.00000000 USDT=0.000000`:
    /// every seeded asset ([`Asset::SEEDED`]), and ETH when the tenant has ETH rows.
    pub fn totals_text(&self, tenant_id: &str) -> String {
        let mut parts = Vec::new();
        for asset in Asset::ALL {
            let found = self
                .asset_totals
                .iter()
                .find(|t| t.tenant_id == tenant_id && t.asset == asset);
            if found.is_none() && !Asset::SEEDED.contains(&asset) {
                continue;
            }
            let total = found.map_or(0, |t| t.total);
            parts.push(format!("{asset}={}", format_units(asset, total)));
        }
        parts.join(" ")
    }

    /// One line per finding, naming tenant, account or order and asset, amounts as
    /// decimal text. Empty when clean.
    pub fn lines(&self) -> Vec<String> {
        let mut lines = Vec::new();
        for m in &self.row_mismatches {
            let a = m.asset;
            lines.push(format!(
                "row {}/{} {a}: stored available={} frozen={}, movements sum to available={} frozen={}",
                m.tenant_id,
                m.account_id,
                format_units(a, m.available),
                format_units(a, m.frozen),
                format_units(a, m.movements_available),
                format_units(a, m.movements_frozen)
            ));
        }
        for t in self.unbalanced_assets() {
            lines.push(format!(
                "asset {} of tenant {}: available+frozen over all accounts sums to {}, not 0",
                t.asset,
                t.tenant_id,
                format_units(t.asset, t.total)
            ));
        }
        for m in &self.frozen_mismatches {
            let a = m.asset;
            lines.push(format!(
                "frozen {}/{} {a}: {} held, open orders' remainders {} + pending withdrawals {}",
                m.tenant_id,
                m.account_id,
                format_units(a, m.frozen),
                format_units(a, m.open_remainders),
                format_units(a, m.pending_withdrawals)
            ));
        }
        for o in &self.closed_with_remainder {
            lines.push(format!(
                "order {}/{} is {} with a remainder of {} units",
                o.tenant_id, o.order_id, o.status, o.remainder
            ));
        }
        for (label, list) in [
            (
                "movement without an OK operation",
                &self.movements_without_operation,
            ),
            (
                "OK operation without a movement",
                &self.operations_without_movement,
            ),
            ("operation committed PENDING", &self.pending_operations),
        ] {
            for e in list {
                lines.push(format!(
                    "{label}: {}/{} {}",
                    e.tenant_id, e.business_id, e.what
                ));
            }
        }
        for s in &self.reorg_shortfalls {
            lines.push(format!(
                "reorg {}/{} {} of {}: {} fronted by sys-reorg",
                s.tenant_id,
                s.tx_id,
                s.asset,
                s.account_id,
                format_units(s.asset, s.shortfall)
            ));
        }
        lines
    }
}

// SUM(bigint) is numeric; cast back to bigint (a tampered sum past the range errors 22003).
const ROW_MISMATCH_SQL: &str = "\
SELECT b.tenant_id, b.account_id, b.asset, b.available, b.frozen,
       COALESCE(m.available, 0)::bigint AS movements_available,
       COALESCE(m.frozen, 0)::bigint AS movements_frozen
FROM balance b
LEFT JOIN (
    SELECT tenant_id, account_id, asset,
           SUM(available_delta) AS available, SUM(frozen_delta) AS frozen
    FROM balance_movement GROUP BY tenant_id, account_id, asset
) m ON m.tenant_id = b.tenant_id AND m.account_id = b.account_id AND m.asset = b.asset
WHERE b.available <> COALESCE(m.available, 0) OR b.frozen <> COALESCE(m.frozen, 0)
ORDER BY b.tenant_id, b.account_id, b.asset";

const ASSET_TOTALS_SQL: &str = "\
SELECT tenant_id, asset, SUM(available::numeric + frozen::numeric)::bigint AS total
FROM balance GROUP BY tenant_id, asset ORDER BY tenant_id, asset";

// Frozen is held by open orders (their remainders) and by withdrawals the network has
// not settled yet (REQUESTED, BROADCAST, UNKNOWN: their whole amount).
const FROZEN_MISMATCH_SQL: &str = "\
SELECT b.tenant_id, b.account_id, b.asset, b.frozen, COALESCE(o.held, 0)::bigint AS held,
       COALESCE(w.held, 0)::bigint AS withdrawing
FROM balance b
LEFT JOIN (
    SELECT tenant_id, account_id, frozen_asset AS asset,
           SUM(frozen_amount - consumed - released) AS held
    FROM spot_order WHERE status = 'OPEN' GROUP BY tenant_id, account_id, frozen_asset
) o ON o.tenant_id = b.tenant_id AND o.account_id = b.account_id AND o.asset = b.asset
LEFT JOIN (
    SELECT tenant_id, account_id, asset, SUM(amount) AS held
    FROM withdrawal WHERE status IN ('REQUESTED', 'BROADCAST', 'UNKNOWN')
    GROUP BY tenant_id, account_id, asset
) w ON w.tenant_id = b.tenant_id AND w.account_id = b.account_id AND w.asset = b.asset
WHERE b.frozen <> COALESCE(o.held, 0) + COALESCE(w.held, 0)
ORDER BY b.tenant_id, b.account_id, b.asset";

const CLOSED_REMAINDER_SQL: &str = "\
SELECT tenant_id, order_id, status, frozen_amount - consumed - released AS remainder
FROM spot_order
WHERE status <> 'OPEN' AND frozen_amount - consumed - released <> 0
ORDER BY tenant_id, order_id";

const MOVEMENTS_WITHOUT_OPERATION_SQL: &str = "\
SELECT m.tenant_id, m.business_id, m.account_id || ' ' || m.asset AS what
FROM balance_movement m
WHERE NOT EXISTS (
    SELECT 1 FROM balance_operation o
    WHERE o.tenant_id = m.tenant_id AND o.business_id = m.business_id AND o.outcome = 'OK'
)
ORDER BY m.tenant_id, m.business_id, m.account_id, m.asset";

const OPERATIONS_WITHOUT_MOVEMENT_SQL: &str = "\
SELECT o.tenant_id, o.business_id, o.kind || ' ' || o.outcome AS what
FROM balance_operation o
WHERE o.outcome = 'OK' AND NOT EXISTS (
    SELECT 1 FROM balance_movement m
    WHERE m.tenant_id = o.tenant_id AND m.business_id = o.business_id
)
ORDER BY o.tenant_id, o.business_id";

const PENDING_SQL: &str = "\
SELECT tenant_id, business_id, kind || ' ' || outcome AS what
FROM balance_operation WHERE outcome = 'PENDING'
ORDER BY tenant_id, business_id";

/// Runs every check in one REPEATABLE READ, READ ONLY transaction; writes nothing.
///
/// Errors: [`FrozenError::Db`]; [`FrozenError::InvariantViolated`] for an asset name the
/// product does not know (the CHECK on `balance.asset` forbids one).
pub async fn reconcile(client: &mut Client) -> Result<Findings, FrozenError> {
    let tx = client
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await?;
    let row_mismatches = row_mismatches(&tx).await?;
    let asset_totals = asset_totals(&tx).await?;
    let frozen_mismatches = frozen_mismatches(&tx).await?;
    let closed_with_remainder = closed_with_remainder(&tx).await?;
    let movements_without_operation = event_refs(&tx, MOVEMENTS_WITHOUT_OPERATION_SQL).await?;
    let operations_without_movement = event_refs(&tx, OPERATIONS_WITHOUT_MOVEMENT_SQL).await?;
    let pending_operations = event_refs(&tx, PENDING_SQL).await?;
    let reorg_shortfalls = shortfalls(&tx).await?;
    tx.commit().await?;
    Ok(Findings {
        row_mismatches,
        asset_totals,
        frozen_mismatches,
        closed_with_remainder,
        movements_without_operation,
        operations_without_movement,
        pending_operations,
        reorg_shortfalls,
    })
}

/// The outstanding shortfalls of reversed deposits and the `sys-reorg` rows that differ
/// from minus their sum ([`crate::reorg::SHORTFALLS_SQL`]).
///
/// Errors: [`FrozenError::Db`]; [`FrozenError::InvariantViolated`] (an unknown asset).
async fn shortfalls(tx: &Transaction<'_>) -> Result<Vec<crate::reorg::Shortfall>, FrozenError> {
    let mut found = Vec::new();
    for row in tx.query_typed(crate::reorg::SHORTFALLS_SQL, &[]).await? {
        found.push(crate::reorg::Shortfall {
            tenant_id: row.try_get("tenant_id")?,
            tx_id: row.try_get("tx_id")?,
            account_id: row.try_get("account_id")?,
            asset: asset(row.try_get("asset")?)?,
            shortfall: row.try_get("shortfall")?,
        });
    }
    Ok(found)
}

/// An asset name read from the database.
///
/// Errors: [`FrozenError::InvariantViolated`] for a name the product does not know.
fn asset(text: &str) -> Result<Asset, FrozenError> {
    text.parse()
        .map_err(|_| FrozenError::InvariantViolated(format!("unknown asset {text}")))
}

/// The balance rows whose stored available or frozen differs from the sum of their
/// movements ([`ROW_MISMATCH_SQL`]), by tenant, account, asset.
///
/// Errors: [`FrozenError::Db`]; [`FrozenError::InvariantViolated`] (an unknown asset).
async fn row_mismatches(tx: &Transaction<'_>) -> Result<Vec<RowMismatch>, FrozenError> {
    let mut found = Vec::new();
    for row in tx.query_typed(ROW_MISMATCH_SQL, &[]).await? {
        found.push(RowMismatch {
            tenant_id: row.try_get("tenant_id")?,
            account_id: row.try_get("account_id")?,
            asset: asset(row.try_get("asset")?)?,
            available: row.try_get("available")?,
            frozen: row.try_get("frozen")?,
            movements_available: row.try_get("movements_available")?,
            movements_frozen: row.try_get("movements_frozen")?,
        });
    }
    Ok(found)
}

/// Per tenant and asset, available + frozen over all accounts ([`ASSET_TOTALS_SQL`]).
///
/// Errors: [`FrozenError::Db`]; [`FrozenError::InvariantViolated`] (an unknown asset).
async fn asset_totals(tx: &Transaction<'_>) -> Result<Vec<AssetTotal>, FrozenError> {
    let mut found = Vec::new();
    for row in tx.query_typed(ASSET_TOTALS_SQL, &[]).await? {
        found.push(AssetTotal {
            tenant_id: row.try_get("tenant_id")?,
            asset: asset(row.try_get("asset")?)?,
            total: row.try_get("total")?,
        });
    }
    Ok(found)
}

/// The balance rows whose frozen differs from their open orders' remainders plus their
/// pending withdrawals ([`FROZEN_MISMATCH_SQL`]).
///
/// Errors: [`FrozenError::Db`]; [`FrozenError::InvariantViolated`] (an unknown asset).
async fn frozen_mismatches(tx: &Transaction<'_>) -> Result<Vec<FrozenMismatch>, FrozenError> {
    let mut found = Vec::new();
    for row in tx.query_typed(FROZEN_MISMATCH_SQL, &[]).await? {
        found.push(FrozenMismatch {
            tenant_id: row.try_get("tenant_id")?,
            account_id: row.try_get("account_id")?,
            asset: asset(row.try_get("asset")?)?,
            frozen: row.try_get("frozen")?,
            open_remainders: row.try_get("held")?,
            pending_withdrawals: row.try_get("withdrawing")?,
        });
    }
    Ok(found)
}

/// The orders no longer open that still hold a remainder ([`CLOSED_REMAINDER_SQL`]).
///
/// Errors: [`FrozenError::Db`].
async fn closed_with_remainder(
    tx: &Transaction<'_>,
) -> Result<Vec<ClosedOrderRemainder>, FrozenError> {
    let mut found = Vec::new();
    for row in tx.query_typed(CLOSED_REMAINDER_SQL, &[]).await? {
        found.push(ClosedOrderRemainder {
            tenant_id: row.try_get("tenant_id")?,
            order_id: row.try_get("order_id")?,
            status: row.try_get("status")?,
            remainder: row.try_get("remainder")?,
        });
    }
    Ok(found)
}

/// The events one of the link checks finds (`sql` selects `tenant_id`, `business_id`,
/// `what`).
///
/// Errors: [`FrozenError::Db`].
async fn event_refs(tx: &Transaction<'_>, sql: &str) -> Result<Vec<EventRef>, FrozenError> {
    let mut found = Vec::new();
    for row in tx.query_typed(sql, &[]).await? {
        found.push(EventRef {
            tenant_id: row.try_get("tenant_id")?,
            business_id: row.try_get("business_id")?,
            what: row.try_get("what")?,
        });
    }
    Ok(found)
}
