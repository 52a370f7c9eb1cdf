//! The final database as the checker sees it: read with the checker's own queries (not
//! the service's code), all in one REPEATABLE READ READ ONLY transaction, so every
//! table is seen at one instant (PostgreSQL docs, 13.2.2 "Repeatable Read Isolation
//! Level"). Serialized as `final-state.json` beside the history, so the checker can be
//! re-run from the evidence alone (`explore --recheck FOLDER`).

use serde::{Deserialize, Serialize};
use tokio_postgres::{Client, Transaction};

/// One `account` row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccountRow {
    /// `account_id`.
    pub account_id: String,
    /// The cached balance, points.
    pub balance: i64,
    /// `allow_negative`.
    pub allow_negative: bool,
}

/// One `ledger_txn` row with its entries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnRow {
    /// `txn_id`.
    pub txn_id: i64,
    /// `client_id`.
    pub client_id: String,
    /// `idem_key`.
    pub idem_key: String,
    /// `kind` (`DEBIT`, `GRANT`, …).
    pub kind: String,
    /// `(account_id, amount)` of each entry, in `entry_id` order.
    pub entries: Vec<(String, i64)>,
}

/// One `idem_request` row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestRow {
    /// `client_id`.
    pub client_id: String,
    /// `idem_key`.
    pub idem_key: String,
    /// `outcome`.
    pub outcome: String,
    /// `txn_id`.
    pub txn_id: Option<i64>,
}

/// Everything the checker reads from the final database.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinalState {
    /// Every account.
    pub accounts: Vec<AccountRow>,
    /// Every transaction with its entries.
    pub txns: Vec<TxnRow>,
    /// Every idempotency record.
    pub requests: Vec<RequestRow>,
}

/// Reads every account balance (for the history's setup line).
///
/// Errors: the query failed.
pub async fn balances(
    client: &Client,
) -> Result<std::collections::BTreeMap<String, i64>, tokio_postgres::Error> {
    let rows = client
        .query(
            "SELECT account_id, balance FROM account ORDER BY account_id",
            &[],
        )
        .await?;
    Ok(rows.iter().map(|row| (row.get(0), row.get(1))).collect())
}

/// Reads the final state in one snapshot.
///
/// Errors: a query failed.
pub async fn read(client: &mut Client) -> Result<FinalState, tokio_postgres::Error> {
    let tx = client
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await?;
    let accounts = read_accounts(&tx).await?;
    let txns = read_txns(&tx).await?;
    let requests = read_requests(&tx).await?;
    tx.commit().await?;
    Ok(FinalState {
        accounts,
        txns,
        requests,
    })
}

/// Every `account` row, in `account_id` order.
///
/// Errors: the query failed.
async fn read_accounts(tx: &Transaction<'_>) -> Result<Vec<AccountRow>, tokio_postgres::Error> {
    Ok(tx
        .query(
            "SELECT account_id, balance, allow_negative FROM account ORDER BY account_id",
            &[],
        )
        .await?
        .iter()
        .map(|row| AccountRow {
            account_id: row.get(0),
            balance: row.get(1),
            allow_negative: row.get(2),
        })
        .collect())
}

/// Every `ledger_txn` row with its `ledger_entry` rows, in `txn_id` then `entry_id`
/// order (a transaction without entries has none).
///
/// Errors: the query failed.
async fn read_txns(tx: &Transaction<'_>) -> Result<Vec<TxnRow>, tokio_postgres::Error> {
    let mut txns: Vec<TxnRow> = Vec::new();
    for row in tx
        .query(
            "SELECT t.txn_id, t.client_id, t.idem_key, t.kind, e.account_id, e.amount \
             FROM ledger_txn t LEFT JOIN ledger_entry e ON e.txn_id = t.txn_id \
             ORDER BY t.txn_id, e.entry_id",
            &[],
        )
        .await?
    {
        let txn_id: i64 = row.get(0);
        if txns.last().is_none_or(|last| last.txn_id != txn_id) {
            txns.push(TxnRow {
                txn_id,
                client_id: row.get(1),
                idem_key: row.get(2),
                kind: row.get(3),
                entries: Vec::new(),
            });
        }
        let account: Option<String> = row.get(4);
        let amount: Option<i64> = row.get(5);
        if let (Some(account), Some(amount)) = (account, amount) {
            txns.last_mut()
                .expect("pushed above")
                .entries
                .push((account, amount));
        }
    }
    Ok(txns)
}

/// Every `idem_request` row, in `(client_id, idem_key)` order.
///
/// Errors: the query failed.
async fn read_requests(tx: &Transaction<'_>) -> Result<Vec<RequestRow>, tokio_postgres::Error> {
    Ok(tx
        .query(
            "SELECT client_id, idem_key, outcome, txn_id FROM idem_request \
             ORDER BY client_id, idem_key",
            &[],
        )
        .await?
        .iter()
        .map(|row| RequestRow {
            client_id: row.get(0),
            idem_key: row.get(1),
            outcome: row.get(2),
            txn_id: row.get(3),
        })
        .collect())
}
