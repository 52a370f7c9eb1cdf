//! The naive debit that the negative controls L4, L5 and L6 run on purpose (SPEC §6),
//! beside the transfer it refutes ([`crate::transfer()`]).
//!
//! **Never use this for anything but a negative control.** It is the design the real
//! transfer exists to avoid: it reads the balance with a plain `SELECT` (no row lock, no
//! conditional `UPDATE`), decides in the application, and only then writes; and it
//! registers no idempotency key. Under READ COMMITTED two such transactions that read
//! before either writes both act on the same stale balance (PostgreSQL docs, 13.2.1
//! "Read Committed Isolation Level": a plain `SELECT` sees a snapshot taken at its start
//! and takes no lock). A caller that passes a barrier makes every participant read before
//! any writes.

use tokio::sync::Barrier;
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, IsolationLevel, Transaction};

/// How the naive debit writes the balance after its application-side check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BalanceWrite {
    /// `SET balance = <read> - amount`: the absolute value computed from the read, which
    /// overwrites whatever committed in between (the lost update of L4).
    AbsoluteFromRead,
    /// `SET balance = balance - amount`: relative to the newest row version, so no debit
    /// is lost, but the check made on the stale read no longer holds (L5, L6).
    Relative,
}

/// One naive debit: `amount` points from `account` to `sys-redeem`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NaiveDebit {
    /// Written to `ledger_txn.client_id`; no `idem_request` row is made.
    pub client_id: String,
    /// Written to `ledger_txn.idem_key`; must be unique per debit (the table's UNIQUE key).
    pub idem_key: String,
    /// Account debited.
    pub account: String,
    /// Points, > 0.
    pub amount: i64,
    /// How the debited account's balance is written.
    pub write: BalanceWrite,
}

/// What one naive debit did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NaiveOutcome {
    /// Committed: the naive code reports success to its caller.
    Committed,
    /// The application-side check refused: the balance read was below the amount.
    /// Nothing was written.
    RefusedByApplication,
    /// PostgreSQL refused a statement or the commit; the transaction was rolled back.
    /// `sqlstate` is the server's SQLSTATE (e.g. `"23514"` check_violation), `None` when
    /// the error did not come from the server.
    DatabaseError {
        /// SQLSTATE, five characters.
        sqlstate: Option<String>,
    },
}

impl NaiveOutcome {
    /// Whether this is a [`NaiveOutcome::DatabaseError`] with SQLSTATE 23514
    /// (check_violation), decided by the code, never by message text.
    pub fn is_check_violation(&self) -> bool {
        matches!(self, NaiveOutcome::DatabaseError { sqlstate: Some(code) }
            if code == SqlState::CHECK_VIOLATION.code())
    }
}

/// One participant's report: the balance it read (points; `None` if the read failed) and
/// its outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NaiveReport {
    /// The balance the naive `SELECT` returned.
    pub balance_read: Option<i64>,
    /// What happened after the read.
    pub outcome: NaiveOutcome,
}

impl NaiveReport {
    /// Whether the debit committed.
    pub fn committed(&self) -> bool {
        self.outcome == NaiveOutcome::Committed
    }
}

const READ_BALANCE_SQL: &str = "SELECT balance FROM account WHERE account_id = $1";
const WRITE_ABSOLUTE_SQL: &str = "UPDATE account SET balance = $2 WHERE account_id = $1";
const WRITE_RELATIVE_SQL: &str = "UPDATE account SET balance = balance - $2 WHERE account_id = $1";
const CREDIT_REDEEM_SQL: &str = "UPDATE account SET balance = balance + $2 WHERE account_id = $1";
const INSERT_TXN_SQL: &str =
    "INSERT INTO ledger_txn (client_id, idem_key, kind) VALUES ($1, $2, 'DEBIT') RETURNING txn_id";
const INSERT_ENTRIES_SQL: &str = "\
INSERT INTO ledger_entry (txn_id, account_id, amount)
VALUES ($1, $2, -$4::bigint), ($1, $3, $4::bigint)";

/// Runs one naive debit on `client`, in one READ COMMITTED transaction:
///
/// 1. `SELECT balance` (no lock);
/// 2. application-side check `read >= amount`;
/// 3. waits at `barrier` if given — always, whether the check passed or the read failed,
///    so that no other participant is left waiting;
/// 4. if the check passed: writes the balance as `req.write` says, credits `sys-redeem`
///    relatively, inserts the `ledger_txn` row and its two entries, and commits.
///
/// No `idem_request` row is written. Errors are outcomes here, not `Err`: a refused
/// statement is reported as [`NaiveOutcome::DatabaseError`] with its SQLSTATE.
pub async fn naive_debit(
    client: &mut Client,
    req: &NaiveDebit,
    barrier: Option<&Barrier>,
) -> NaiveReport {
    let started = client
        .build_transaction()
        .isolation_level(IsolationLevel::ReadCommitted)
        .start()
        .await;
    let transaction = match started {
        Ok(transaction) => transaction,
        Err(error) => {
            meet(barrier).await;
            return NaiveReport {
                balance_read: None,
                outcome: database_error(Some(&error)),
            };
        }
    };
    let read = transaction
        .query_opt(READ_BALANCE_SQL, &[&req.account])
        .await
        .map(|row| row.map(|row| row.get::<_, i64>(0)));
    meet(barrier).await;
    let balance_read = match read {
        Ok(balance_read) => balance_read,
        Err(error) => {
            return NaiveReport {
                balance_read: None,
                outcome: database_error(Some(&error)),
            };
        }
    };
    // A missing account reads as "not enough": the naive design has nothing better.
    if balance_read.is_none_or(|balance| balance < req.amount) {
        // Dropping the transaction rolls it back.
        drop(transaction);
        return NaiveReport {
            balance_read,
            outcome: NaiveOutcome::RefusedByApplication,
        };
    }
    let read_value = balance_read.unwrap_or_default();
    let written = write_debit(transaction, req, read_value).await;
    NaiveReport {
        balance_read,
        outcome: match written {
            Ok(()) => NaiveOutcome::Committed,
            Err(error) => database_error(Some(&error)),
        },
    }
}

/// Step 4 of [`naive_debit`], once its check passed on `read_value`: writes the balance as
/// `req.write` says, credits `sys-redeem` relatively, inserts the `ledger_txn` row and its
/// two entries, and commits `transaction`.
///
/// Errors: the first statement (or the commit) PostgreSQL refused; the transaction is then
/// rolled back as it is dropped.
async fn write_debit(
    transaction: Transaction<'_>,
    req: &NaiveDebit,
    read_value: i64,
) -> Result<(), tokio_postgres::Error> {
    match req.write {
        BalanceWrite::AbsoluteFromRead => {
            let new_balance = read_value - req.amount;
            transaction
                .execute(WRITE_ABSOLUTE_SQL, &[&req.account, &new_balance])
                .await?
        }
        BalanceWrite::Relative => {
            transaction
                .execute(WRITE_RELATIVE_SQL, &[&req.account, &req.amount])
                .await?
        }
    };
    transaction
        .execute(CREDIT_REDEEM_SQL, &[&crate::SYS_REDEEM, &req.amount])
        .await?;
    let txn_id: i64 = transaction
        .query_one(INSERT_TXN_SQL, &[&req.client_id, &req.idem_key])
        .await?
        .get(0);
    transaction
        .execute(
            INSERT_ENTRIES_SQL,
            &[&txn_id, &req.account, &crate::SYS_REDEEM, &req.amount],
        )
        .await?;
    transaction.commit().await
}

async fn meet(barrier: Option<&Barrier>) {
    if let Some(barrier) = barrier {
        barrier.wait().await;
    }
}

fn database_error(error: Option<&tokio_postgres::Error>) -> NaiveOutcome {
    NaiveOutcome::DatabaseError {
        sqlstate: error.and_then(|e| e.code()).map(|c| c.code().to_owned()),
    }
}
