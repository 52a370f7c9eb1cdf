//! Repair after reconciliation found a fault (SPEC §3.9, L16), in four steps:
//!
//! 1. **Freeze** the accounts the findings name (`account_freeze`): while frozen,
//!    [`crate::transfer()`] and [`crate::transfer_between()`] refuse any transfer touching
//!    them with [`LedgerError::AccountFrozen`] and record nothing — no key registration —
//!    so the same key succeeds after the repair (unlike a recorded INSUFFICIENT).
//! 2. **Entries are the record of fact**: the cached `account.balance` of each named
//!    account is rewritten from the sum of its entries, before and after logged.
//! 3. **Append, never edit**: a transaction whose entries do not sum to 0 gets an
//!    adjusting transaction (kind `ADJUST`, its own `ledger_txn` row and idempotency
//!    registration under client `repair`) with the missing counter-entry on the suspense
//!    account [`SYS_SUSPENSE`], linked to it in `ledger_adjustment`; reconciliation counts
//!    a transaction together with its adjustments (see [`crate::reconcile()`]). No
//!    existing `ledger_entry` row is changed or deleted.
//! 4. **Re-check, then unfreeze**: reconciliation runs again; only when it is clean are
//!    the accounts unfrozen. Otherwise they stay frozen and the report says what is left.
//!
//! Every step is logged in `repair_log`. Not corrected (they stay as findings, and the
//! accounts stay frozen): registrations without a transaction, transactions without a
//! registration, committed PENDING rows, and a transaction with no entries at all.

use futures_util::future::BoxFuture;
use serde::Serialize;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, IsolationLevel, Transaction};

use crate::error::LedgerError;
use crate::reconcile::{Findings, reconcile};

/// The suspense account: where an adjusting transaction books the amount that is missing
/// from an unbalanced transaction, until someone finds where it belongs. Created by the
/// first repair that needs it, with `allow_negative`.
pub const SYS_SUSPENSE: &str = "sys-suspense";
/// `ledger_txn.kind` of an adjusting transaction.
pub const ADJUST_KIND: &str = "ADJUST";
/// `client_id` of the repair's own transactions and registrations.
pub const REPAIR_CLIENT: &str = "repair";

/// DDL of the repair's tables (installed with the ledger's schema).
///
/// - `account_freeze`: one row per frozen account, naming the repair that froze it.
/// - `ledger_adjustment`: links an adjusting transaction to the transaction it completes.
/// - `repair_log`: what each repair did, step by step, with before and after values in
///   points.
pub const SCHEMA_SQL: &str = r#"
CREATE SEQUENCE repair_id_seq;

CREATE TABLE account_freeze (
    account_id text        PRIMARY KEY REFERENCES account (account_id),
    repair_id  bigint      NOT NULL,
    frozen_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE ledger_adjustment (
    adjusting_txn_id bigint PRIMARY KEY REFERENCES ledger_txn (txn_id),
    adjusts_txn_id   bigint NOT NULL REFERENCES ledger_txn (txn_id),
    note             text   NOT NULL
);

CREATE TABLE repair_log (
    log_id           bigserial   PRIMARY KEY,
    repair_id        bigint      NOT NULL,
    step             text        NOT NULL,
    account_id       text        NULL,
    txn_id           bigint      NULL,
    adjusting_txn_id bigint      NULL,
    before_value     bigint      NULL,
    after_value      bigint      NULL,
    note             text        NOT NULL,
    logged_at        timestamptz NOT NULL DEFAULT now()
);
"#;

// One statement: the first frozen account among the two, if any.
const FROZEN_SQL: &str = "\
SELECT account_id FROM account_freeze WHERE account_id IN ($1, $2) ORDER BY account_id LIMIT 1";

/// The first of `from`, `to` that is frozen, read inside the transfer's transaction.
///
/// Errors: [`LedgerError::Db`].
pub async fn frozen_account(
    tx: &Transaction<'_>,
    from: &str,
    to: &str,
) -> Result<Option<String>, LedgerError> {
    let row = tx
        .query_typed_opt(FROZEN_SQL, &[(&from, Type::TEXT), (&to, Type::TEXT)])
        .await?;
    Ok(row.map(|row| row.get(0)))
}

/// One line of `repair_log`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RepairLogLine {
    /// `freeze`, `adjust`, `rewrite-balance`, `recheck`, `unfreeze` or `stays-frozen`.
    pub step: String,
    /// The account, for `freeze`, `rewrite-balance`, `unfreeze`.
    pub account_id: Option<String>,
    /// The unbalanced transaction, for `adjust`.
    pub txn_id: Option<i64>,
    /// The adjusting transaction, for `adjust`.
    pub adjusting_txn_id: Option<i64>,
    /// Before, points: the stored balance, or the unbalanced transaction's sum.
    pub before: Option<i64>,
    /// After, points: the rewritten balance, or the sum with the adjustment (0).
    pub after: Option<i64>,
    /// What was done, in words.
    pub note: String,
}

/// What [`repair`] did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RepairReport {
    /// The repair's id (`repair_id_seq`); the key of its log lines.
    pub repair_id: i64,
    /// Reconciliation before the repair.
    pub before: Findings,
    /// The accounts frozen, sorted.
    pub frozen: Vec<String>,
    /// Its log, in order.
    pub log: Vec<RepairLogLine>,
    /// Reconciliation after the repair.
    pub after: Findings,
    /// Whether the accounts were unfrozen (only when `after` is clean).
    pub unfrozen: bool,
}

/// Called by [`repair`] while the accounts are frozen, before anything is corrected.
pub trait RepairHooks: Send + Sync {
    /// The accounts are frozen (sorted).
    fn frozen<'a>(&'a self, accounts: &'a [String]) -> BoxFuture<'a, ()>;
}

/// Hooks that do nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoRepairHooks;

impl RepairHooks for NoRepairHooks {
    fn frozen<'a>(&'a self, _accounts: &'a [String]) -> BoxFuture<'a, ()> {
        Box::pin(std::future::ready(()))
    }
}

const LOG_SQL: &str = "\
INSERT INTO repair_log (repair_id, step, account_id, txn_id, adjusting_txn_id, before_value, after_value, note)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)";

// The entries of a transaction together with those of its adjustments.
const GROUP_SUM_SQL: &str = "\
SELECT COUNT(e.entry_id) AS entries, COALESCE(SUM(e.amount), 0)::bigint AS total
FROM ledger_entry e
WHERE e.txn_id = $1
   OR e.txn_id IN (SELECT adjusting_txn_id FROM ledger_adjustment WHERE adjusts_txn_id = $1)";

/// Runs the four steps on the connected ledger (see the module documentation) and
/// returns what it did. A clean ledger is left alone (nothing frozen, empty log).
///
/// Errors: [`LedgerError::Db`], e.g. SQLSTATE 23514 when a rewritten balance would be
/// negative on an account that may not go negative; the correction is then rolled back
/// and the accounts stay frozen.
pub async fn repair(
    client: &mut Client,
    hooks: &dyn RepairHooks,
) -> Result<RepairReport, LedgerError> {
    let before = reconcile(client).await?;
    let repair_id: i64 = client
        .query_one("SELECT nextval('repair_id_seq')", &[])
        .await?
        .get(0);
    if before.is_clean() {
        return Ok(RepairReport {
            repair_id,
            after: before.clone(),
            before,
            frozen: Vec::new(),
            log: Vec::new(),
            unfrozen: false,
        });
    }

    let (accounts, unbalanced) = accounts_named(client, &before).await?;
    freeze(client, repair_id, &accounts).await?;
    hooks.frozen(&accounts).await;
    correct(client, repair_id, &accounts, &unbalanced).await?;
    let (after, unfrozen) = recheck(client, repair_id, &accounts).await?;
    let log_lines = read_log(client, repair_id).await?;
    Ok(RepairReport {
        repair_id,
        before,
        frozen: accounts,
        log: log_lines,
        after,
        unfrozen,
    })
}

/// The accounts the findings name, sorted and without duplicates, and the ids of the
/// unbalanced transactions. When there are unbalanced transactions, their accounts and
/// [`SYS_SUSPENSE`] are among them, and [`SYS_SUSPENSE`] is created if missing.
///
/// Errors: [`LedgerError::Db`].
async fn accounts_named(
    client: &mut Client,
    before: &Findings,
) -> Result<(Vec<String>, Vec<i64>), LedgerError> {
    let mut accounts: Vec<String> = before
        .balance_mismatches
        .iter()
        .map(|m| m.account_id.clone())
        .collect();
    let unbalanced: Vec<i64> = before.unbalanced_txns.iter().map(|t| t.txn_id).collect();
    if !unbalanced.is_empty() {
        let rows = client
            .query(
                "SELECT DISTINCT account_id FROM ledger_entry WHERE txn_id = ANY($1)",
                &[&unbalanced],
            )
            .await?;
        accounts.extend(rows.iter().map(|row| row.get::<_, String>(0)));
        accounts.push(SYS_SUSPENSE.to_owned());
        client
            .execute(
                "INSERT INTO account (account_id, allow_negative, balance) VALUES ($1, true, 0) \
                 ON CONFLICT (account_id) DO NOTHING",
                &[&SYS_SUSPENSE],
            )
            .await?;
    }
    accounts.sort();
    accounts.dedup();
    Ok((accounts, unbalanced))
}

/// Step 1: freezes `accounts` under `repair_id`, one log line each, in one committed
/// transaction.
///
/// Errors: [`LedgerError::Db`].
async fn freeze(
    client: &mut Client,
    repair_id: i64,
    accounts: &[String],
) -> Result<(), LedgerError> {
    let tx = client.transaction().await?;
    for account in accounts {
        tx.execute(
            "INSERT INTO account_freeze (account_id, repair_id) VALUES ($1, $2) \
             ON CONFLICT (account_id) DO NOTHING",
            &[account, &repair_id],
        )
        .await?;
        log(
            &tx,
            repair_id,
            "freeze",
            Some(account),
            None,
            None,
            None,
            None,
            "writes refused",
        )
        .await?;
    }
    tx.commit().await?;
    Ok(())
}

/// Steps 2 and 3, in one transaction holding the rows: a transfer that checked the freeze
/// just before it was committed finishes first (we wait for its row lock). Locks
/// `accounts` in order, adjusts each of `unbalanced`, rewrites the cached balances that
/// differ from their entries, commits.
///
/// Errors: [`LedgerError::Db`] (e.g. SQLSTATE 23514 for a rewritten balance below 0 on an
/// account that may not go negative; everything is rolled back).
async fn correct(
    client: &mut Client,
    repair_id: i64,
    accounts: &[String],
    unbalanced: &[i64],
) -> Result<(), LedgerError> {
    let tx = client
        .build_transaction()
        .isolation_level(IsolationLevel::ReadCommitted)
        .start()
        .await?;
    for account in accounts {
        tx.query_opt(
            "SELECT 1 FROM account WHERE account_id = $1 FOR UPDATE",
            &[account],
        )
        .await?;
    }
    for txn_id in unbalanced {
        adjust(&tx, repair_id, *txn_id).await?;
    }
    for account in accounts {
        rewrite_balance(&tx, repair_id, account).await?;
    }
    tx.commit().await?;
    Ok(())
}

/// Step 2 for one locked account: when its cached balance differs from the sum of its
/// entries (points), rewrites it and logs before and after.
///
/// Errors: [`LedgerError::Db`].
async fn rewrite_balance(
    tx: &Transaction<'_>,
    repair_id: i64,
    account: &String,
) -> Result<(), LedgerError> {
    let row = tx
        .query_one(
            "SELECT a.balance, COALESCE((SELECT SUM(amount) FROM ledger_entry \
             WHERE account_id = a.account_id), 0)::bigint \
             FROM account a WHERE a.account_id = $1",
            &[account],
        )
        .await?;
    let (stored, recomputed): (i64, i64) = (row.get(0), row.get(1));
    if stored != recomputed {
        tx.execute(
            "UPDATE account SET balance = $2 WHERE account_id = $1",
            &[account, &recomputed],
        )
        .await?;
        log(
            tx,
            repair_id,
            "rewrite-balance",
            Some(account),
            None,
            None,
            Some(stored),
            Some(recomputed),
            "cached balance rewritten from the entries",
        )
        .await?;
    }
    Ok(())
}

/// Step 4: reconciles again and, in one committed transaction, logs the re-check and
/// unfreezes `accounts` only when clean (else logs that they stay frozen). Returns the
/// findings and whether the accounts were unfrozen.
///
/// Errors: [`LedgerError::Db`].
async fn recheck(
    client: &mut Client,
    repair_id: i64,
    accounts: &[String],
) -> Result<(Findings, bool), LedgerError> {
    let after = reconcile(client).await?;
    let unfrozen = after.is_clean();
    let tx = client.transaction().await?;
    log(
        &tx,
        repair_id,
        "recheck",
        None,
        None,
        None,
        None,
        None,
        &after.summary(),
    )
    .await?;
    if unfrozen {
        tx.execute(
            "DELETE FROM account_freeze WHERE repair_id = $1",
            &[&repair_id],
        )
        .await?;
        for account in accounts {
            log(
                &tx,
                repair_id,
                "unfreeze",
                Some(account),
                None,
                None,
                None,
                None,
                "writes accepted again",
            )
            .await?;
        }
    } else {
        log(
            &tx,
            repair_id,
            "stays-frozen",
            None,
            None,
            None,
            None,
            None,
            "findings remain",
        )
        .await?;
    }
    tx.commit().await?;
    Ok((after, unfrozen))
}

/// The repair's `repair_log` lines, in order.
///
/// Errors: [`LedgerError::Db`].
async fn read_log(client: &Client, repair_id: i64) -> Result<Vec<RepairLogLine>, LedgerError> {
    let rows = client
        .query(
            "SELECT step, account_id, txn_id, adjusting_txn_id, before_value, after_value, note \
             FROM repair_log WHERE repair_id = $1 ORDER BY log_id",
            &[&repair_id],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|row| RepairLogLine {
            step: row.get(0),
            account_id: row.get(1),
            txn_id: row.get(2),
            adjusting_txn_id: row.get(3),
            before: row.get(4),
            after: row.get(5),
            note: row.get(6),
        })
        .collect())
}

/// Step 3 for one transaction: when its entries (with any earlier adjustments) do not
/// sum to 0, appends an adjusting transaction with the counter-entry on [`SYS_SUSPENSE`].
async fn adjust(tx: &Transaction<'_>, repair_id: i64, txn_id: i64) -> Result<(), LedgerError> {
    let row = tx.query_one(GROUP_SUM_SQL, &[&txn_id]).await?;
    let sum: i64 = row.get(1);
    if sum == 0 {
        // No entries at all (or already adjusted): nothing to append.
        log(
            tx,
            repair_id,
            "unresolved",
            None,
            Some(txn_id),
            None,
            Some(0),
            None,
            "transaction without entries: nothing to adjust",
        )
        .await?;
        return Ok(());
    }
    let key = format!("repair-{repair_id}-txn-{txn_id}");
    let adjusting: i64 = tx
        .query_one(
            "INSERT INTO ledger_txn (client_id, idem_key, kind) VALUES ($1, $2, $3) RETURNING txn_id",
            &[&REPAIR_CLIENT, &key, &ADJUST_KIND],
        )
        .await?
        .get(0);
    tx.execute(
        "INSERT INTO ledger_entry (txn_id, account_id, amount) VALUES ($1, $2, $3)",
        &[&adjusting, &SYS_SUSPENSE, &(-sum)],
    )
    .await?;
    let note = format!("counter-entry of {} on {SYS_SUSPENSE}", -sum);
    tx.execute(
        "INSERT INTO ledger_adjustment (adjusting_txn_id, adjusts_txn_id, note) VALUES ($1, $2, $3)",
        &[&adjusting, &txn_id, &note],
    )
    .await?;
    // Registered like any transfer, so the request/transaction links stay whole; the
    // fingerprint names what it adjusts (it is never replayed).
    tx.execute(
        "INSERT INTO idem_request (client_id, idem_key, request_hash, outcome, txn_id) \
         VALUES ($1, $2, $3, 'OK', $4)",
        &[
            &REPAIR_CLIENT,
            &key,
            &format!("adjusts:{txn_id}:{}", -sum),
            &adjusting,
        ],
    )
    .await?;
    log(
        tx,
        repair_id,
        "adjust",
        Some(SYS_SUSPENSE),
        Some(txn_id),
        Some(adjusting),
        Some(sum),
        Some(0),
        &note,
    )
    .await?;
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn log(
    tx: &Transaction<'_>,
    repair_id: i64,
    step: &str,
    account: Option<&str>,
    txn_id: Option<i64>,
    adjusting_txn_id: Option<i64>,
    before: Option<i64>,
    after: Option<i64>,
    note: &str,
) -> Result<(), LedgerError> {
    tx.execute(
        LOG_SQL,
        &[
            &repair_id,
            &step,
            &account,
            &txn_id,
            &adjusting_txn_id,
            &before,
            &after,
            &note,
        ],
    )
    .await?;
    Ok(())
}
