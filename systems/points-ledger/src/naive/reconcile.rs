//! The naive reconciliation of L20's negative control: L11's checks made from separate
//! READ COMMITTED statements, compared in the client, as a reconciler does that reads
//! one table at a time.
//!
//! Each of L11's four queries is a single statement, and a single statement sees one
//! snapshot even under READ COMMITTED (PostgreSQL docs, 13.2.1 "Read Committed Isolation
//! Level"), so running those four as four statements would never contradict itself: a
//! finding needs two reads of different moments. This reconciler reads what L11's I4
//! check and its request/transaction links compare — the stored balances, then the sums
//! of the entries; the key records, then the transactions — each as its own statement, so
//! each read takes a new snapshot (13.2.1), and a transfer that commits between two of
//! them is half seen. The I3 check and the global sum stay single statements, as in L11.
//! It reports in L11's [`Findings`] shape.

use std::collections::{BTreeMap, BTreeSet};

use crate::{BalanceMismatch, Findings, RequestRef, TxnRef, UnbalancedTxn};
use tokio_postgres::Client;

/// Number of statements [`naive_reconcile`] runs; its pause comes after each but the last.
pub const NAIVE_STATEMENTS: usize = 6;

/// The statement after which L20 commits its forced debit: 1 = after reading the stored
/// balances, before summing the entries.
pub const BALANCES_READ: usize = 1;

/// L11's checks from [`NAIVE_STATEMENTS`] separate statements on `client` in autocommit
/// (READ COMMITTED, the server's default), awaiting `pause(n)` after statement `n`
/// (1-based): 1 stored balances, 2 sums of entries per account, 3 L11's I3 query,
/// 4 key records, 5 transactions, 6 the global sum. Writes nothing.
///
/// Errors: database errors.
pub async fn naive_reconcile<F, Fut>(
    client: &Client,
    mut pause: F,
) -> Result<Findings, tokio_postgres::Error>
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = ()>,
{
    let stored = per_account(client, "SELECT account_id, balance FROM account").await?;
    pause(1).await;
    let sums = per_account(
        client,
        "SELECT account_id, SUM(amount)::bigint FROM ledger_entry GROUP BY account_id",
    )
    .await?;
    pause(2).await;
    let unbalanced_txns = unbalanced_txns(client).await?;
    pause(3).await;
    let requests = request_refs(client).await?;
    pause(4).await;
    let txns = txn_refs(client).await?;
    pause(5).await;
    let global_sum: i64 = client
        .query_one("SELECT COALESCE(SUM(balance), 0)::bigint FROM account", &[])
        .await?
        .get(0);

    Ok(compare(
        &stored,
        &sums,
        unbalanced_txns,
        &requests,
        &txns,
        global_sum,
    ))
}

/// One statement whose rows are (account id, points): a map by account id.
///
/// Errors: database errors.
async fn per_account(
    client: &Client,
    sql: &str,
) -> Result<BTreeMap<String, i64>, tokio_postgres::Error> {
    Ok(client
        .query(sql, &[])
        .await?
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect())
}

/// L11's I3 query: transactions with fewer than two entries or entries not summing to 0.
///
/// Errors: database errors.
async fn unbalanced_txns(client: &Client) -> Result<Vec<UnbalancedTxn>, tokio_postgres::Error> {
    Ok(client
        .query(
            "SELECT t.txn_id, COUNT(e.entry_id), COALESCE(SUM(e.amount), 0)::bigint \
             FROM ledger_txn t LEFT JOIN ledger_entry e USING (txn_id) \
             GROUP BY t.txn_id HAVING COUNT(e.entry_id) < 2 OR COALESCE(SUM(e.amount), 0) <> 0 \
             ORDER BY t.txn_id",
            &[],
        )
        .await?
        .iter()
        .map(|row| UnbalancedTxn {
            txn_id: row.get(0),
            entries: row.get(1),
            sum: row.get(2),
        })
        .collect())
}

/// Every key record (client id, key, outcome, txn id), by client id and key.
///
/// Errors: database errors.
async fn request_refs(client: &Client) -> Result<Vec<RequestRef>, tokio_postgres::Error> {
    Ok(client
        .query(
            "SELECT client_id, idem_key, outcome, txn_id FROM idem_request \
             ORDER BY client_id, idem_key",
            &[],
        )
        .await?
        .iter()
        .map(|row| RequestRef {
            client_id: row.get(0),
            idem_key: row.get(1),
            outcome: row.get(2),
            txn_id: row.get(3),
        })
        .collect())
}

/// Every transaction (txn id, client id, key), by txn id.
///
/// Errors: database errors.
async fn txn_refs(client: &Client) -> Result<Vec<TxnRef>, tokio_postgres::Error> {
    Ok(client
        .query(
            "SELECT txn_id, client_id, idem_key FROM ledger_txn ORDER BY txn_id",
            &[],
        )
        .await?
        .iter()
        .map(|row| TxnRef {
            txn_id: row.get(0),
            client_id: row.get(1),
            idem_key: row.get(2),
        })
        .collect())
}

/// Compares what the separate statements read, in the client, into L11's [`Findings`]:
/// `stored` balances against entry `sums` per account, key records against transactions
/// both ways, and the PENDING records.
fn compare(
    stored: &BTreeMap<String, i64>,
    sums: &BTreeMap<String, i64>,
    unbalanced_txns: Vec<UnbalancedTxn>,
    requests: &[RequestRef],
    txns: &[TxnRef],
    global_sum: i64,
) -> Findings {
    let balance_mismatches = stored
        .iter()
        .filter_map(|(account_id, &stored)| {
            let recomputed = sums.get(account_id).copied().unwrap_or(0);
            (stored != recomputed).then(|| BalanceMismatch {
                account_id: account_id.clone(),
                stored,
                recomputed,
            })
        })
        .collect();
    let txn_ids: BTreeSet<i64> = txns.iter().map(|txn| txn.txn_id).collect();
    let keys: BTreeSet<(&str, &str)> = requests
        .iter()
        .map(|r| (r.client_id.as_str(), r.idem_key.as_str()))
        .collect();
    let requests_without_txn = requests
        .iter()
        .filter(|r| r.outcome == "OK" && !r.txn_id.is_some_and(|id| txn_ids.contains(&id)))
        .cloned()
        .collect();
    let txns_without_request = txns
        .iter()
        .filter(|t| !keys.contains(&(t.client_id.as_str(), t.idem_key.as_str())))
        .cloned()
        .collect();
    let pending_requests = requests
        .iter()
        .filter(|r| r.outcome == "PENDING")
        .cloned()
        .collect();
    Findings {
        balance_mismatches,
        unbalanced_txns,
        requests_without_txn,
        txns_without_request,
        pending_requests,
        global_sum,
    }
}
