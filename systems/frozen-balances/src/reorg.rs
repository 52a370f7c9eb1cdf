//! A network deposit withdrawn by a reorganisation after it was credited (F25; seed 003
//! asks what the ledger does then). The ledger's answer (docs/withdrawals.md,
//! "A reorganisation after the credit"):
//!
//! - **Reversal.** The drop report reverses the credit in the report's transaction, under
//!   its own business id `chain:<tx id>#reversal` (kind `DEPOSIT_REVERSAL`): the amount
//!   goes back to `sys-deposit`; the account gives back what it still has available, up
//!   to the amount.
//! - **Shortfall.** What the account no longer has (frozen in orders or withdrawals,
//!   traded, withdrawn) is fronted by [`SYS_REORG`] (a system account that may go
//!   negative: the exchange's claim on the account) and recorded on the deposit
//!   (`chain_deposit.shortfall`, status `REVERSED`).
//! - **Hold.** While a shortfall of an asset is outstanding, the account's new freezes of
//!   that asset (placements, withdrawals) are refused (`FrozenError::Held`, checked with
//!   the balance row a freeze needs, `crate::events`); its open orders stay as they are.
//! - **Finding.** Every outstanding shortfall is a reconciliation finding
//!   (`reorg_shortfalls`), and `sys-reorg`'s balance must equal minus their sum.
//! - **Final.** A reversed transaction is never credited again, whatever the network
//!   reports of it later (as a deposit dropped before its credit, F16).

use serde::Serialize;
use tokio_postgres::Transaction;
use tokio_postgres::types::Type;

use crate::asset::Asset;
use crate::decisions::{Deltas, Event, add_delta};
use crate::error::FrozenError;
use crate::events::{apply, ensure_rows, lock_and_check, write_movements};
use crate::hooks::EventKind;
use crate::schema::SYS_DEPOSIT;

/// Fronts the part of a reversed deposit the account had already spent (allowed
/// negative): minus the sum of the outstanding shortfalls.
pub const SYS_REORG: &str = "sys-reorg";

const AVAILABLE_SQL: &str = "\
SELECT available FROM balance WHERE tenant_id = $1 AND account_id = $2 AND asset = $3 FOR UPDATE";

const REVERSAL_OPERATION_SQL: &str = "\
INSERT INTO balance_operation (tenant_id, business_id, kind, payload, payload_hash, outcome, result)
VALUES ($1, $2, 'DEPOSIT_REVERSAL', $3, $4, 'OK', $5::text::jsonb)";

const REVERSED_SQL: &str = "\
UPDATE chain_deposit SET status = 'REVERSED', shortfall = $3
WHERE tenant_id = $1 AND tx_id = $2";

/// A credited network deposit to reverse: the report's transaction id, account, asset
/// and amount, and the reversal's business id (`chain:<tx id>#reversal`).
pub(crate) struct Credited<'a> {
    /// Tenant.
    pub tenant_id: &'a str,
    /// The network's transaction id.
    pub tx_id: &'a str,
    /// The account credited.
    pub account_id: &'a str,
    /// The asset.
    pub asset: Asset,
    /// Minor units credited.
    pub amount: i64,
    /// The reversal's business id.
    pub business_id: String,
}

/// Reverses the credit `report` names inside the drop report's transaction (see the
/// module documentation); returns `(taken back, shortfall)` in minor units.
///
/// Errors: [`FrozenError::Db`]; [`FrozenError::InvariantViolated`] (delta overflow).
pub(crate) async fn reverse(
    tx: &Transaction<'_>,
    report: &Credited<'_>,
) -> Result<(i64, i64), FrozenError> {
    let (t, asset) = (&report.tenant_id, report.asset);
    ensure_rows(tx, t, &[(SYS_REORG, asset, true)]).await?;
    let available: i64 = tx
        .query_typed_one(
            AVAILABLE_SQL,
            &[
                (t, Type::TEXT),
                (&report.account_id, Type::TEXT),
                (&asset.as_str(), Type::TEXT),
            ],
        )
        .await?
        .try_get(0)?;
    let taken = available.clamp(0, report.amount);
    let shortfall = report.amount - taken;
    let mut deltas = Deltas::new();
    add_delta(&mut deltas, SYS_DEPOSIT, asset, report.amount, 0)?;
    if taken > 0 {
        add_delta(&mut deltas, report.account_id, asset, -taken, 0)?;
    }
    if shortfall > 0 {
        add_delta(&mut deltas, SYS_REORG, asset, -shortfall, 0)?;
    }
    let business_id = &report.business_id;
    let payload = format!(
        "DEPOSIT_REVERSAL|{}|{}|{}",
        report.account_id,
        asset.as_str(),
        report.amount
    );
    let event = Event::new(EventKind::Deposit, t, business_id, payload);
    lock_and_check(tx, t, &deltas).await?;
    let result = serde_json::json!({"outcome": "OK", "asset": asset, "amount": report.amount,
                                    "taken": taken, "shortfall": shortfall})
    .to_string();
    tx.execute_typed(
        REVERSAL_OPERATION_SQL,
        &[
            (&event.tenant_id, Type::TEXT),
            (&event.business_id, Type::TEXT),
            (&event.payload, Type::TEXT),
            (&event.hash, Type::TEXT),
            (&result, Type::TEXT),
        ],
    )
    .await?;
    apply(tx, t, &deltas).await?;
    write_movements(tx, &event, &deltas).await?;
    tx.execute_typed(
        REVERSED_SQL,
        &[
            (t, Type::TEXT),
            (&report.tx_id, Type::TEXT),
            (&shortfall, Type::INT8),
        ],
    )
    .await?;
    Ok((taken, shortfall))
}

/// A reversed deposit whose account had spent part of it: the exchange's open claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Shortfall {
    /// Tenant.
    pub tenant_id: String,
    /// The network's transaction id.
    pub tx_id: String,
    /// Account held.
    pub account_id: String,
    /// Asset.
    pub asset: Asset,
    /// Minor units fronted by [`SYS_REORG`].
    pub shortfall: i64,
}

/// Every outstanding shortfall, then `sys-reorg`'s balance per (tenant, asset) where it
/// is not minus their sum (as a [`Shortfall`] with tx id `sys-reorg` and the difference).
pub(crate) const SHORTFALLS_SQL: &str = "\
SELECT tenant_id, tx_id, account_id, asset, shortfall FROM chain_deposit
WHERE status = 'REVERSED' AND shortfall > 0
UNION ALL
SELECT b.tenant_id, 'sys-reorg', b.account_id, b.asset,
       (b.available + coalesce((SELECT sum(c.shortfall) FROM chain_deposit c
         WHERE c.tenant_id = b.tenant_id AND c.asset = b.asset AND c.status = 'REVERSED'), 0))::bigint
FROM balance b
WHERE b.account_id = 'sys-reorg' AND b.available + coalesce((SELECT sum(c.shortfall)
  FROM chain_deposit c WHERE c.tenant_id = b.tenant_id AND c.asset = b.asset
  AND c.status = 'REVERSED'), 0) <> 0
ORDER BY 1, 2";
