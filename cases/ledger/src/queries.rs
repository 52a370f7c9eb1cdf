//! Read-only queries the cases use to look at the ledger directly (SPEC §2 tables).

use tokio_postgres::Client;

/// The stored (cached) balance of `account`, in points; `None` if it does not exist.
///
/// Errors: database errors.
pub async fn balance(client: &Client, account: &str) -> anyhow::Result<Option<i64>> {
    let row = client
        .query_opt(
            "SELECT balance FROM account WHERE account_id = $1",
            &[&account],
        )
        .await?;
    Ok(row.map(|row| row.get(0)))
}

/// The stored balance of an account that must exist.
///
/// Errors: database errors, or the account is missing.
pub async fn existing_balance(client: &Client, account: &str) -> anyhow::Result<i64> {
    balance(client, account)
        .await?
        .ok_or_else(|| anyhow::anyhow!("account {account} does not exist"))
}

/// The entries of one transaction as `(account_id, amount)`, ordered by entry id.
///
/// Errors: database errors.
pub async fn entries_of(client: &Client, txn_id: i64) -> anyhow::Result<Vec<(String, i64)>> {
    let rows = client
        .query(
            "SELECT account_id, amount FROM ledger_entry WHERE txn_id = $1 ORDER BY entry_id",
            &[&txn_id],
        )
        .await?;
    Ok(rows.iter().map(|row| (row.get(0), row.get(1))).collect())
}

/// How many transactions of `kind` (`DEBIT`/`GRANT`) have an entry on `account`.
///
/// Errors: database errors.
pub async fn count_txns(client: &Client, account: &str, kind: &str) -> anyhow::Result<i64> {
    let row = client
        .query_one(
            "SELECT count(DISTINCT t.txn_id) FROM ledger_txn t JOIN ledger_entry e USING (txn_id) \
             WHERE e.account_id = $1 AND t.kind = $2",
            &[&account, &kind],
        )
        .await?;
    Ok(row.get(0))
}

/// The sum of `account`'s entries: its balance recomputed from the record of fact.
///
/// Errors: database errors.
pub async fn sum_of_entries(client: &Client, account: &str) -> anyhow::Result<i64> {
    let row = client
        .query_one(
            "SELECT COALESCE(SUM(amount), 0)::bigint FROM ledger_entry WHERE account_id = $1",
            &[&account],
        )
        .await?;
    Ok(row.get(0))
}

/// One session as `pg_stat_activity` shows it (PostgreSQL docs, 28.2.3
/// "pg_stat_activity"): `state` (e.g. `idle in transaction`) and what it waits for
/// (`wait_event_type`/`wait_event`, e.g. `Lock`/`transactionid`; empty when not waiting).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    /// `state`, e.g. `active`, `idle`, `idle in transaction`.
    pub state: String,
    /// `wait_event_type`, e.g. `Lock`, `Client`; empty when not waiting.
    pub wait_event_type: String,
    /// `wait_event`, e.g. `transactionid`, `ClientRead`; empty when not waiting.
    pub wait_event: String,
}

/// The session served by backend `pid`, or `None` when no such backend exists (ended).
///
/// Errors: database errors.
pub async fn session(client: &Client, pid: i32) -> anyhow::Result<Option<Session>> {
    let row = client
        .query_opt(
            "SELECT COALESCE(state, ''), COALESCE(wait_event_type, ''), COALESCE(wait_event, '') \
             FROM pg_stat_activity WHERE pid = $1",
            &[&pid],
        )
        .await?;
    Ok(row.map(|row| Session {
        state: row.get(0),
        wait_event_type: row.get(1),
        wait_event: row.get(2),
    }))
}

/// The backends that block backend `pid` (`pg_blocking_pids`, PostgreSQL docs 9.26
/// "System Information Functions").
///
/// Errors: database errors.
pub async fn blocking_pids(client: &Client, pid: i32) -> anyhow::Result<Vec<i32>> {
    let row = client
        .query_one("SELECT pg_blocking_pids($1)", &[&pid])
        .await?;
    Ok(row.get(0))
}

/// How many `ledger_txn` rows exist for `(client_id, idem_key)` (at most 1 by I2).
///
/// Errors: database errors.
pub async fn txns_for_key(client: &Client, client_id: &str, idem_key: &str) -> anyhow::Result<i64> {
    let row = client
        .query_one(
            "SELECT count(*) FROM ledger_txn WHERE client_id = $1 AND idem_key = $2",
            &[&client_id, &idem_key],
        )
        .await?;
    Ok(row.get(0))
}

/// Every recorded `idem_request` of `client_id` as `(idem_key, outcome, txn_id)`, by key.
///
/// Errors: database errors.
pub async fn requests_of(
    client: &Client,
    client_id: &str,
) -> anyhow::Result<Vec<(String, String, Option<i64>)>> {
    let rows = client
        .query(
            "SELECT idem_key, outcome, txn_id FROM idem_request WHERE client_id = $1 \
             ORDER BY idem_key",
            &[&client_id],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2)))
        .collect())
}

/// Row counts of `idem_request`, `ledger_txn` and `ledger_entry`: what a refused
/// request must leave alone.
///
/// Errors: database errors.
pub async fn recorded(client: &Client) -> anyhow::Result<(i64, i64, i64)> {
    let row = client
        .query_one(
            "SELECT (SELECT count(*) FROM idem_request), (SELECT count(*) FROM ledger_txn), \
             (SELECT count(*) FROM ledger_entry)",
            &[],
        )
        .await?;
    Ok((row.get(0), row.get(1), row.get(2)))
}

/// The recorded `idem_request` of `(client_id, idem_key)` as `(outcome, txn_id)`, or
/// `None` when the key is not registered (committed).
///
/// Errors: database errors.
pub async fn request_for_key(
    client: &Client,
    client_id: &str,
    idem_key: &str,
) -> anyhow::Result<Option<(String, Option<i64>)>> {
    let row = client
        .query_opt(
            "SELECT outcome, txn_id FROM idem_request WHERE client_id = $1 AND idem_key = $2",
            &[&client_id, &idem_key],
        )
        .await?;
    Ok(row.map(|row| (row.get(0), row.get(1))))
}

/// How many DEBIT transactions took exactly `amount` points from `account`.
///
/// Errors: database errors.
pub async fn debits_of(client: &Client, account: &str, amount: i64) -> anyhow::Result<i64> {
    let row = client
        .query_one(
            "SELECT count(*) FROM ledger_entry e JOIN ledger_txn t USING (txn_id) \
             WHERE t.kind = 'DEBIT' AND e.account_id = $1 AND e.amount = -$2::bigint",
            &[&account, &amount],
        )
        .await?;
    Ok(row.get(0))
}
