//! The rounding rule's version (F23's sibling, F24; seed 003: when the rule that turns a
//! fill into amounts changes, each movement must record which version computed it, or
//! reconciliation cannot recompute it).
//!
//! The rule in force is one row, `rounding_rule.version` ([`crate::schema::SCHEMA_SQL`]);
//! every movement records the version in force when it was written
//! (`balance_movement.rule_version`, its default `current_rule_version()`). A fill reads
//! the version with `FOR SHARE` before it settles ([`current_version`]), so a change of
//! the rule (`UPDATE rounding_rule SET version = 2`, an exclusive row lock) waits for the
//! fills in flight and none settles under one version and records another.
//!
//! - version 1: a fill's fee is [`crate::amount::FEE_BPS`] of its notional rounded
//!   **down** ([`crate::amount::fee_units`]);
//! - version 2: the same rate rounded **half up** (`500.6` units → 501). The reserve,
//!   rounded up at placement, still covers it.
//!
//! [`reconcile_fills`] recomputes each OK fill's fee movement and the seller's quote
//! movement with the version they record.

use serde::Serialize;
use tokio_postgres::{Client, GenericClient, IsolationLevel};

use crate::amount::{self, BPS_PER_WHOLE, FEE_BPS};
use crate::asset::Market;
use crate::error::FrozenError;
use crate::schema::SYS_FEE;

/// The versions this library can compute.
pub const VERSIONS: [i32; 2] = [1, 2];

/// A fill's fee on `notional` quote units under rule `version`.
///
/// Errors: [`FrozenError::InvariantViolated`] for a version this library does not know.
pub fn fee_units(version: i32, notional: i64) -> Result<i64, FrozenError> {
    match version {
        1 => Ok(amount::fee_units(notional)),
        2 => {
            let numerator = i128::from(notional) * i128::from(FEE_BPS);
            let whole = i128::from(BPS_PER_WHOLE);
            Ok(((numerator * 2 + whole) / (whole * 2)) as i64)
        }
        other => Err(FrozenError::InvariantViolated(format!(
            "rounding rule version {other} is unknown"
        ))),
    }
}

const CURRENT_SQL: &str = "SELECT version FROM rounding_rule FOR SHARE";

/// The rule in force, its row share-locked until the caller's transaction ends (see the
/// module documentation).
///
/// Errors: [`FrozenError::Db`].
pub async fn current_version(tx: &impl GenericClient) -> Result<i32, FrozenError> {
    Ok(tx.query_one(CURRENT_SQL, &[]).await?.try_get(0)?)
}

/// An OK fill whose recorded amounts differ from what its recorded version computes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RuleMismatch {
    /// Tenant.
    pub tenant_id: String,
    /// The fill's business id.
    pub business_id: String,
    /// The version its movements record (the smallest, when they disagree).
    pub recorded_version: i32,
    /// The version its fees were recomputed with: the recorded one, or the rule in force
    /// (`assume_current`).
    pub computed_with: i32,
    /// Whether its movements record more than one version.
    pub mixed_versions: bool,
    /// The fees moved to `sys-fee` (quote units).
    pub fees_moved: i64,
    /// The fees its version computes (both sides).
    pub fees_computed: i64,
}

/// What [`reconcile_fills`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RuleFindings {
    /// OK fills recomputed.
    pub fills: usize,
    /// Those whose amounts their version does not compute.
    pub mismatches: Vec<RuleMismatch>,
}

impl RuleFindings {
    /// `fills=2 rule_mismatches=1`, then per mismatch `| fill default/fill-2 recorded v1:
    /// fees moved 1002 units, v1 computes 1000`.
    pub fn summary(&self) -> String {
        let mut text = format!(
            "fills={} rule_mismatches={}",
            self.fills,
            self.mismatches.len()
        );
        for m in &self.mismatches {
            text.push_str(&format!(
                " | fill {}/{} recorded v{}{}: fees moved {} units, v{} computes {}",
                m.tenant_id,
                m.business_id,
                m.recorded_version,
                if m.mixed_versions { " (mixed)" } else { "" },
                m.fees_moved,
                m.computed_with,
                m.fees_computed
            ));
        }
        text
    }
}

/// Each OK fill with its fee movement, the version(s) its movements record, and its
/// quantity, price and market (from the payload `FILL|buy|sell|qty|price` and the BUY).
const FILLS_SQL: &str = "\
SELECT o.tenant_id, o.business_id, split_part(o.payload, '|', 4)::bigint AS quantity,
       split_part(o.payload, '|', 5)::bigint AS price, b.market,
       min(m.rule_version) AS low, max(m.rule_version) AS high,
       coalesce(sum(m.available_delta) FILTER (WHERE m.account_id = $1), 0)::bigint AS fees
FROM balance_operation o
JOIN spot_order b ON b.tenant_id = o.tenant_id
     AND b.order_id = split_part(o.payload, '|', 2)::bigint
JOIN balance_movement m ON m.tenant_id = o.tenant_id AND m.business_id = o.business_id
WHERE o.kind = 'FILL' AND o.outcome = 'OK'
GROUP BY 1, 2, 3, 4, 5
ORDER BY 1, 2";

/// Recomputes every OK fill's fees (both sides, moved to `sys-fee`) with the version its
/// movements record, or, with `assume_current`, with the rule in force now (the design
/// that records no version, F24's control), in one REPEATABLE READ snapshot.
///
/// Errors: [`FrozenError::Db`]; an unknown market or version as
/// [`FrozenError::InvariantViolated`].
pub async fn reconcile_fills(
    client: &mut Client,
    assume_current: bool,
) -> Result<RuleFindings, FrozenError> {
    let tx = client
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await?;
    let current: i32 = tx
        .query_one("SELECT version FROM rounding_rule", &[])
        .await?
        .try_get(0)?;
    let rows = tx.query(FILLS_SQL, &[&SYS_FEE]).await?;
    tx.commit().await?;
    let mut findings = RuleFindings::default();
    for row in rows {
        let market: Market = row
            .try_get::<_, String>("market")?
            .parse()
            .map_err(|_| FrozenError::InvariantViolated("a fill of an unknown market".into()))?;
        let (low, high): (i32, i32) = (row.try_get("low")?, row.try_get("high")?);
        let version = if assume_current { current } else { low };
        let notional =
            amount::notional_units(market, row.try_get("quantity")?, row.try_get("price")?)?;
        let computed = 2 * fee_units(version, notional)?;
        let moved: i64 = row.try_get("fees")?;
        findings.fills += 1;
        if moved != computed || (!assume_current && low != high) {
            findings.mismatches.push(RuleMismatch {
                tenant_id: row.try_get("tenant_id")?,
                business_id: row.try_get("business_id")?,
                recorded_version: low,
                computed_with: version,
                mixed_versions: low != high,
                fees_moved: moved,
                fees_computed: computed,
            });
        }
    }
    Ok(findings)
}

#[cfg(test)]
mod tests {
    use super::fee_units;

    #[test]
    fn version_1_rounds_down_version_2_half_up() {
        // 10 bps of 500 600 units is 500.6; of 500 500, 500.5; of 500 499, 500.499.
        assert_eq!(fee_units(1, 500_600).unwrap(), 500);
        assert_eq!(fee_units(2, 500_600).unwrap(), 501);
        assert_eq!(fee_units(1, 500_500).unwrap(), 500);
        assert_eq!(fee_units(2, 500_500).unwrap(), 501);
        assert_eq!(fee_units(2, 500_499).unwrap(), 500);
        assert_eq!(fee_units(2, 0).unwrap(), 0);
        assert!(fee_units(3, 1).is_err());
    }
}
