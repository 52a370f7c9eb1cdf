//! Business reconciliation: the redemption orders of the business system against the
//! ledger's debits (`ledger_txn.order_id`, the business reference a debit carries).
//!
//! [`mod@crate::reconcile`] checks that the books are consistent with themselves: every
//! transaction balances, every balance is the sum of its entries. A debit made twice for
//! one order (a client that retried under a new key) passes all of that, since both
//! transactions balance. This asks the auditor's question instead: was each order paid
//! exactly once, by the account and amount of the order?
//!
//! One statement (so one snapshot) over the orders given and the debits in the ledger.

use serde::Serialize;
use tokio_postgres::Client;
use tokio_postgres::types::Type;

use crate::error::LedgerError;

/// A redemption order as the business system knows it: which account pays how much.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Order {
    /// The order id (what a debit carries in `order_id`).
    pub order_id: String,
    /// The account that pays it.
    pub account_id: String,
    /// Points, > 0.
    pub amount: i64,
}

/// One finding about one order id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum OrderFinding {
    /// The order was paid by more than one debit transaction (`debits` ≥ 2): points were
    /// taken more than once for one purchase.
    PaidMoreThanOnce {
        /// The order.
        order_id: String,
        /// Number of DEBIT transactions carrying it.
        debits: i64,
        /// Their `(client_id, idem_key)`, ordered by txn id.
        keys: Vec<String>,
    },
    /// The order has no debit at all.
    Unpaid {
        /// The order.
        order_id: String,
    },
    /// A debit of the order took another amount or from another account than the order
    /// names.
    WrongDebit {
        /// The order.
        order_id: String,
        /// The debited account.
        account_id: String,
        /// Points debited.
        amount: i64,
    },
    /// A debit carries an order id the business system does not know.
    UnknownOrder {
        /// The order id on the debit.
        order_id: String,
        /// Number of DEBIT transactions carrying it.
        debits: i64,
    },
}

impl OrderFinding {
    /// One line for a report, e.g. `order ord-2102 has 2 debits (app-a/k-2102,
    /// app-a/k-2103)`.
    pub fn describe(&self) -> String {
        match self {
            OrderFinding::PaidMoreThanOnce {
                order_id,
                debits,
                keys,
            } => format!("order {order_id} has {debits} debits ({})", keys.join(", ")),
            OrderFinding::Unpaid { order_id } => format!("order {order_id} has no debit"),
            OrderFinding::WrongDebit {
                order_id,
                account_id,
                amount,
            } => format!("order {order_id} was debited {amount} from {account_id}"),
            OrderFinding::UnknownOrder { order_id, debits } => {
                format!("unknown order {order_id} has {debits} debits")
            }
        }
    }
}

// The debits of the ledger by order id: the DEBIT transactions carrying one, with the
// account and amount of their negative entry. Then one row per finding, each tagged.
// The ORDER BY keeps the report stable.
const ORDER_RECONCILE_SQL: &str = "\
WITH orders AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[]) AS o(order_id, account_id, amount)
), debits AS (
    SELECT t.txn_id, t.order_id, t.client_id || '/' || t.idem_key AS key,
           e.account_id, -e.amount AS amount
    FROM ledger_txn t
    JOIN ledger_entry e ON e.txn_id = t.txn_id AND e.amount < 0
    WHERE t.kind = 'DEBIT' AND t.order_id IS NOT NULL
)
SELECT finding, order_id, debits, keys, account_id, amount FROM (
    SELECT 'paid_more_than_once' AS finding, d.order_id, count(*) AS debits,
           array_agg(d.key ORDER BY d.txn_id) AS keys, NULL::text AS account_id,
           NULL::bigint AS amount
    FROM debits d JOIN orders o USING (order_id)
    GROUP BY d.order_id HAVING count(*) > 1
    UNION ALL
    SELECT 'unpaid', o.order_id, 0, NULL, NULL, NULL
    FROM orders o WHERE NOT EXISTS (SELECT 1 FROM debits d WHERE d.order_id = o.order_id)
    UNION ALL
    SELECT 'wrong_debit', d.order_id, 1, NULL, d.account_id, d.amount
    FROM debits d JOIN orders o USING (order_id)
    WHERE d.account_id <> o.account_id OR d.amount <> o.amount
    UNION ALL
    SELECT 'unknown_order', d.order_id, count(*), NULL, NULL, NULL
    FROM debits d WHERE NOT EXISTS (SELECT 1 FROM orders o WHERE o.order_id = d.order_id)
    GROUP BY d.order_id
) AS findings
ORDER BY order_id, finding, account_id, amount";

/// Reconciles `orders` against the ledger's DEBIT transactions by order id, in one
/// statement (one snapshot, READ COMMITTED is enough for a single statement: PostgreSQL
/// docs 13.2.1). Returns the findings ordered by order id, then kind; empty when every
/// order was paid exactly once, by its account and amount, and no debit names an unknown
/// order. Writes nothing. Debits without an order id are not looked at.
///
/// Errors: [`LedgerError::Db`].
pub async fn reconcile_orders(
    client: &Client,
    orders: &[Order],
) -> Result<Vec<OrderFinding>, LedgerError> {
    let ids: Vec<&str> = orders.iter().map(|o| o.order_id.as_str()).collect();
    let accounts: Vec<&str> = orders.iter().map(|o| o.account_id.as_str()).collect();
    let amounts: Vec<i64> = orders.iter().map(|o| o.amount).collect();
    let rows = client
        .query_typed(
            ORDER_RECONCILE_SQL,
            &[
                (&ids, Type::TEXT_ARRAY),
                (&accounts, Type::TEXT_ARRAY),
                (&amounts, Type::INT8_ARRAY),
            ],
        )
        .await?;
    let mut findings = Vec::with_capacity(rows.len());
    for row in rows {
        let finding: &str = row.try_get("finding")?;
        let order_id: String = row.try_get("order_id")?;
        let debits: i64 = row.try_get("debits")?;
        findings.push(match finding {
            "paid_more_than_once" => OrderFinding::PaidMoreThanOnce {
                order_id,
                debits,
                keys: row.try_get("keys")?,
            },
            "unpaid" => OrderFinding::Unpaid { order_id },
            "wrong_debit" => OrderFinding::WrongDebit {
                order_id,
                account_id: row.try_get("account_id")?,
                amount: row.try_get("amount")?,
            },
            _ => OrderFinding::UnknownOrder { order_id, debits },
        });
    }
    Ok(findings)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptions() {
        let twice = OrderFinding::PaidMoreThanOnce {
            order_id: "ord-1".into(),
            debits: 2,
            keys: vec!["app-a/k-1".into(), "app-a/k-2".into()],
        };
        assert_eq!(
            twice.describe(),
            "order ord-1 has 2 debits (app-a/k-1, app-a/k-2)"
        );
        assert_eq!(
            OrderFinding::Unpaid {
                order_id: "ord-2".into()
            }
            .describe(),
            "order ord-2 has no debit"
        );
    }
}
