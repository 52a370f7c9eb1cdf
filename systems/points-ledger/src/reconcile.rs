//! Reconciliation (SPEC §6 L11): recompute what the ledger's invariants promise and list
//! every violation.
//!
//! Four read-only queries run in one REPEATABLE READ transaction, so all of them see one
//! snapshot (PostgreSQL docs, 13.2.2 "Repeatable Read Isolation Level"): a transfer
//! committing meanwhile is either wholly visible or not at all, and a clean ledger under
//! concurrent load still reconciles clean.

use serde::Serialize;
use tokio_postgres::{Client, IsolationLevel, Transaction};

use crate::error::LedgerError;

/// I4 violation: an account whose cached balance differs from the sum of its entries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BalanceMismatch {
    /// The account.
    pub account_id: String,
    /// `account.balance`, points.
    pub stored: i64,
    /// Sum of the account's `ledger_entry.amount` (0 without entries), points.
    pub recomputed: i64,
}

/// I3 violation: a transaction with fewer than 2 entries or entries not summing to 0.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UnbalancedTxn {
    /// `ledger_txn.txn_id`.
    pub txn_id: i64,
    /// Number of entries (0 if it has none).
    pub entries: i64,
    /// Sum of its entries' amounts, points (0 if it has none).
    pub sum: i64,
}

/// An `idem_request` row named by a finding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RequestRef {
    /// `idem_request.client_id`.
    pub client_id: String,
    /// `idem_request.idem_key`.
    pub idem_key: String,
    /// `idem_request.outcome` as stored (`OK`, `PENDING`, ...).
    pub outcome: String,
    /// `idem_request.txn_id` as stored.
    pub txn_id: Option<i64>,
}

/// A `ledger_txn` row named by a finding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TxnRef {
    /// `ledger_txn.txn_id`.
    pub txn_id: i64,
    /// `ledger_txn.client_id`.
    pub client_id: String,
    /// `ledger_txn.idem_key`.
    pub idem_key: String,
}

/// Everything [`reconcile`] found. Each list is ordered deterministically (see the fields).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Findings {
    /// I4: accounts whose `balance` ≠ sum of their entries, ordered by `account_id`.
    pub balance_mismatches: Vec<BalanceMismatch>,
    /// I3: transactions with < 2 entries or a non-zero sum, ordered by `txn_id`.
    pub unbalanced_txns: Vec<UnbalancedTxn>,
    /// Registrations with outcome `OK` whose `txn_id` is NULL or names no `ledger_txn` row,
    /// and tombstones (outcome `EXPIRED`) whose `txn_id` names no `ledger_txn` row,
    /// ordered by `(client_id, idem_key)`. A tombstone keeps its key registered, so an
    /// expired transaction still has its request record (no `txns_without_request`).
    pub requests_without_txn: Vec<RequestRef>,
    /// `ledger_txn` rows with no `idem_request` of the same `(client_id, idem_key)`, ordered
    /// by `txn_id`.
    pub txns_without_request: Vec<TxnRef>,
    /// Committed registrations still `PENDING` (the transfer never commits one), ordered by
    /// `(client_id, idem_key)`.
    pub pending_requests: Vec<RequestRef>,
    /// Sum of all account balances, points; 0 in a consistent ledger, since every
    /// operation is a transfer between two accounts.
    pub global_sum: i64,
}

impl Findings {
    /// `true` when nothing was found: all lists empty and `global_sum == 0`.
    pub fn is_clean(&self) -> bool {
        self.count() == 0
    }

    /// Number of findings: the lengths of all lists, plus 1 if `global_sum != 0`.
    pub fn count(&self) -> usize {
        self.balance_mismatches.len()
            + self.unbalanced_txns.len()
            + self.requests_without_txn.len()
            + self.txns_without_request.len()
            + self.pending_requests.len()
            + usize::from(self.global_sum != 0)
    }

    /// One line, e.g. `balance_mismatches=0 unbalanced_txns=0 requests_without_txn=0
    /// txns_without_request=0 pending_requests=0 global_sum=0` (counts, and the sum in points).
    pub fn summary(&self) -> String {
        format!(
            "balance_mismatches={} unbalanced_txns={} requests_without_txn={} \
             txns_without_request={} pending_requests={} global_sum={}",
            self.balance_mismatches.len(),
            self.unbalanced_txns.len(),
            self.requests_without_txn.len(),
            self.txns_without_request.len(),
            self.pending_requests.len(),
            self.global_sum
        )
    }
}

// I4. SUM(bigint) is numeric in PostgreSQL, hence the casts back to bigint.
// ANCHOR: balance_mismatch (quoted by docs/articles/points-ledger.md; `./run.sh cite --check`)
const BALANCE_MISMATCH_SQL: &str = "\
SELECT a.account_id, a.balance AS stored, COALESCE(e.total, 0)::bigint AS recomputed
FROM account a
LEFT JOIN (
    SELECT account_id, SUM(amount) AS total FROM ledger_entry GROUP BY account_id
) e ON e.account_id = a.account_id
WHERE a.balance <> COALESCE(e.total, 0)
ORDER BY a.account_id";
// ANCHOR_END: balance_mismatch

// I3. LEFT JOIN so that a transaction without any entry shows up with 0 entries. A
// repair's adjusting transaction (`ledger_adjustment`, crate::repair) counts together
// with the transaction it completes, not on its own.
const UNBALANCED_TXN_SQL: &str = "\
WITH grouped AS (
    SELECT COALESCE(a.adjusts_txn_id, e.txn_id) AS txn_id, e.entry_id, e.amount
    FROM ledger_entry e
    LEFT JOIN ledger_adjustment a ON a.adjusting_txn_id = e.txn_id
)
SELECT t.txn_id, COUNT(g.entry_id) AS entries, COALESCE(SUM(g.amount), 0)::bigint AS total
FROM ledger_txn t
LEFT JOIN grouped g ON g.txn_id = t.txn_id
WHERE NOT EXISTS (SELECT 1 FROM ledger_adjustment a WHERE a.adjusting_txn_id = t.txn_id)
GROUP BY t.txn_id
HAVING COUNT(g.entry_id) < 2 OR COALESCE(SUM(g.amount), 0) <> 0
ORDER BY t.txn_id";

// Links between registrations and transactions: three lists tagged by `finding`, each in
// the order documented on `Findings`.
const LINKS_SQL: &str = "\
SELECT finding, client_id, idem_key, outcome, txn_id
FROM (
    SELECT 'request_without_txn' AS finding, r.client_id, r.idem_key, r.outcome, r.txn_id
    FROM idem_request r
    WHERE (r.outcome = 'OK'
           AND (r.txn_id IS NULL
                OR NOT EXISTS (SELECT 1 FROM ledger_txn t WHERE t.txn_id = r.txn_id)))
       OR (r.outcome = 'EXPIRED' AND r.txn_id IS NOT NULL
           AND NOT EXISTS (SELECT 1 FROM ledger_txn t WHERE t.txn_id = r.txn_id))
    UNION ALL
    SELECT 'txn_without_request', t.client_id, t.idem_key, NULL, t.txn_id
    FROM ledger_txn t
    WHERE NOT EXISTS (
        SELECT 1 FROM idem_request r WHERE r.client_id = t.client_id AND r.idem_key = t.idem_key
    )
    UNION ALL
    SELECT 'pending_request', r.client_id, r.idem_key, r.outcome, r.txn_id
    FROM idem_request r
    WHERE r.outcome = 'PENDING'
) AS links
ORDER BY finding,
         CASE WHEN finding = 'txn_without_request' THEN txn_id END,
         client_id, idem_key";

const GLOBAL_SUM_SQL: &str = "SELECT COALESCE(SUM(balance), 0)::bigint AS total FROM account";

/// Number of queries [`reconcile`] runs (I4, I3, the links, the global sum), in that
/// order; [`reconcile_with`] calls its pause after each but the last.
pub const RECONCILE_QUERIES: usize = 4;

/// Checks invariants I3 and I4, the links between `idem_request` and `ledger_txn`, and the
/// global sum of balances, in one REPEATABLE READ, READ ONLY transaction (one snapshot),
/// then commits it. Writes nothing.
///
/// Errors: [`LedgerError::Db`] only (e.g. SQLSTATE 22003 if a sum overflows bigint).
pub async fn reconcile(client: &mut Client) -> Result<Findings, LedgerError> {
    reconcile_with(client, |_| std::future::ready(())).await
}

/// [`reconcile`], awaiting `pause(n)` after its query `n` (1-based, 1 to
/// [`RECONCILE_QUERIES`] - 1) inside the open snapshot: for a case that commits a
/// transfer between two of the queries and shows that the snapshot does not see it
/// (L20). `reconcile` is this with a pause that returns at once.
///
/// Errors: as [`reconcile`].
pub async fn reconcile_with<F, Fut>(
    client: &mut Client,
    mut pause: F,
) -> Result<Findings, LedgerError>
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let tx = client
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await?;

    let balance_mismatches = balance_mismatches(&tx).await?;
    pause(1).await;
    let unbalanced_txns = unbalanced_txns(&tx).await?;
    pause(2).await;
    let (requests_without_txn, txns_without_request, pending_requests) = links(&tx).await?;
    pause(3).await;
    let global_sum: i64 = tx
        .query_typed_one(GLOBAL_SUM_SQL, &[])
        .await?
        .try_get("total")?;
    tx.commit().await?;

    Ok(Findings {
        balance_mismatches,
        unbalanced_txns,
        requests_without_txn,
        txns_without_request,
        pending_requests,
        global_sum,
    })
}

/// I4 inside the snapshot: the accounts whose cached balance differs from the sum of
/// their entries ([`BALANCE_MISMATCH_SQL`]), by account id.
///
/// Errors: [`LedgerError::Db`].
async fn balance_mismatches(tx: &Transaction<'_>) -> Result<Vec<BalanceMismatch>, LedgerError> {
    let mut balance_mismatches = Vec::new();
    for row in tx.query_typed(BALANCE_MISMATCH_SQL, &[]).await? {
        balance_mismatches.push(BalanceMismatch {
            account_id: row.try_get("account_id")?,
            stored: row.try_get("stored")?,
            recomputed: row.try_get("recomputed")?,
        });
    }
    Ok(balance_mismatches)
}

/// I3 inside the snapshot: the transactions (with their adjustments) whose entries are
/// fewer than two or do not sum to 0 ([`UNBALANCED_TXN_SQL`]), by txn id.
///
/// Errors: [`LedgerError::Db`].
async fn unbalanced_txns(tx: &Transaction<'_>) -> Result<Vec<UnbalancedTxn>, LedgerError> {
    let mut unbalanced_txns = Vec::new();
    for row in tx.query_typed(UNBALANCED_TXN_SQL, &[]).await? {
        unbalanced_txns.push(UnbalancedTxn {
            txn_id: row.try_get("txn_id")?,
            entries: row.try_get("entries")?,
            sum: row.try_get("total")?,
        });
    }
    Ok(unbalanced_txns)
}

/// The links between registrations and transactions inside the snapshot ([`LINKS_SQL`]):
/// requests without their transaction, transactions without a request, and pending
/// requests, each in the order documented on [`Findings`].
///
/// Errors: [`LedgerError::Db`].
async fn links(
    tx: &Transaction<'_>,
) -> Result<(Vec<RequestRef>, Vec<TxnRef>, Vec<RequestRef>), LedgerError> {
    let mut requests_without_txn = Vec::new();
    let mut txns_without_request = Vec::new();
    let mut pending_requests = Vec::new();
    for row in tx.query_typed(LINKS_SQL, &[]).await? {
        let finding: &str = row.try_get("finding")?;
        let client_id: String = row.try_get("client_id")?;
        let idem_key: String = row.try_get("idem_key")?;
        let txn_id: Option<i64> = row.try_get("txn_id")?;
        match finding {
            "txn_without_request" => txns_without_request.push(TxnRef {
                // NOT NULL in ledger_txn.
                txn_id: txn_id.unwrap_or_default(),
                client_id,
                idem_key,
            }),
            _ => {
                let request = RequestRef {
                    client_id,
                    idem_key,
                    outcome: row.try_get("outcome")?,
                    txn_id,
                };
                if finding == "pending_request" {
                    pending_requests.push(request);
                } else {
                    requests_without_txn.push(request);
                }
            }
        }
    }
    Ok((requests_without_txn, txns_without_request, pending_requests))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clean() -> Findings {
        Findings {
            balance_mismatches: vec![],
            unbalanced_txns: vec![],
            requests_without_txn: vec![],
            txns_without_request: vec![],
            pending_requests: vec![],
            global_sum: 0,
        }
    }

    #[test]
    fn clean_findings() {
        let f = clean();
        assert!(f.is_clean());
        assert_eq!(f.count(), 0);
        assert_eq!(
            f.summary(),
            "balance_mismatches=0 unbalanced_txns=0 requests_without_txn=0 \
             txns_without_request=0 pending_requests=0 global_sum=0"
        );
    }

    #[test]
    fn global_sum_counts_as_a_finding() {
        let mut f = clean();
        f.global_sum = 5;
        f.balance_mismatches.push(BalanceMismatch {
            account_id: "acct-0001".into(),
            stored: 5,
            recomputed: 0,
        });
        assert!(!f.is_clean());
        assert_eq!(f.count(), 2);
        assert!(f.summary().ends_with("global_sum=5"));
    }
}
