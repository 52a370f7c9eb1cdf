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
