//! Transfers between any two user accounts (SPEC §3.5, L14).
//!
//! A debit locks `from` then `sys-redeem`, a grant `sys-issuer` then the user: no two of
//! them can each hold a row the other wants next. Once points move between two *user*
//! accounts, a transfer A→B and a transfer B→A would lock the same two rows in opposite
//! orders, and two of them running at once can deadlock (SQLSTATE 40P01). PostgreSQL's
//! docs, 13.3.4 "Deadlocks", name the remedy used here: every transaction takes its
//! locks in one agreed order. [`transfer_between`] locks the two account rows in sorted
//! order of their ids, whichever is debited, so no cycle can form.
//!
//! Otherwise it is the same idempotent transaction as [`crate::transfer()`]: the key is
//! registered first, a known key replays, the debit is conditional, the refusal is
//! recorded, and the entries, the transaction and the outcome commit together.

use tokio_postgres::types::Type;
use tokio_postgres::{Client, IsolationLevel, Transaction};

use crate::error::LedgerError;
use crate::transfer::{self, Hooks, KeyKnown, TransferRequest, TransferResult};
use crate::vocabulary::{Kind, Outcome};

// Takes the row lock of one account (docs, SELECT, "The Locking Clause"); no row when the
// account does not exist.
const LOCK_ACCOUNT_SQL: &str = "SELECT 1 FROM account WHERE account_id = $1 FOR UPDATE";

/// A transfer of `amount` points from user account `from` to user account `to` under
/// `(client_id, idem_key)`: the [`TransferRequest`] of kind [`Kind::Transfer`].
pub fn between(
    client_id: impl Into<String>,
    idem_key: impl Into<String>,
    from: impl Into<String>,
    to: impl Into<String>,
    amount: i64,
) -> TransferRequest {
    TransferRequest {
        client_id: client_id.into(),
        idem_key: idem_key.into(),
        kind: Kind::Transfer,
        from: from.into(),
        to: to.into(),
        amount,
        order_id: None,
    }
}

/// The two accounts of a transfer in the order their rows are locked: sorted by id
/// (byte order of the text, as `ORDER BY account_id` with the C collation would give;
/// any fixed total order would do, it only has to be the same for everyone).
pub fn lock_order<'a>(from: &'a str, to: &'a str) -> [&'a str; 2] {
    if from <= to { [from, to] } else { [to, from] }
}

/// Executes a [`Kind::Transfer`] request at most once per `(client_id, idem_key)`, in one
/// READ COMMITTED transaction:
///
/// 1. register the key (a known key replays, or is [`LedgerError::KeyReused`]);
/// 2. lock both account rows in [`lock_order`] (`SELECT … FOR UPDATE`);
/// 3. the conditional debit of `from` (`WHERE balance >= amount`); refused → record
///    INSUFFICIENT (or NO_ACCOUNT when `from` does not exist) and commit;
/// 4. credit `to`, write the transaction and its two entries, record OK, commit.
///
/// Reported balance: `from`'s balance after (OK) or when refused (INSUFFICIENT). Hooks
/// run at [`crate::HookPoint::BeforeCommit`] and [`crate::HookPoint::AfterCommit`].
///
/// Errors: [`LedgerError::InvalidAmount`] (`amount <= 0`) and
/// [`LedgerError::SameAccount`] (`from == to`), both before any database access;
/// [`LedgerError::AccountFrozen`] (nothing recorded);
/// [`LedgerError::InvalidKind`] when the request is not a [`Kind::Transfer`];
/// [`LedgerError::KeyReused`], [`LedgerError::CreditAccountMissing`] (`to` does not
/// exist; rolled back), [`LedgerError::HookAborted`], [`LedgerError::Db`]. On every
/// error except `HookAborted(AfterCommit)` nothing was committed.
pub async fn transfer_between(
    client: &mut Client,
    req: &TransferRequest,
    hooks: &dyn Hooks,
) -> Result<TransferResult, LedgerError> {
    if req.kind != Kind::Transfer {
        return Err(LedgerError::InvalidKind(req.kind));
    }
    if req.amount <= 0 {
        return Err(LedgerError::InvalidAmount(req.amount));
    }
    if req.from == req.to {
        return Err(LedgerError::SameAccount(req.from.clone()));
    }
    let request_hash = req.request_hash();
    let tx = client
        .build_transaction()
        .isolation_level(IsolationLevel::ReadCommitted)
        .start()
        .await?;

    if let Some(account) = crate::repair::frozen_account(&tx, &req.from, &req.to).await? {
        let _ = tx.rollback().await;
        return Err(LedgerError::AccountFrozen(account));
    }

    // 1. Register, or replay.
    if !transfer::register(&tx, req, &request_hash).await? {
        let known = match transfer::read_registration(&tx, req).await? {
            Some(row) => KeyKnown::Stored(row),
            None => KeyKnown::Vanished,
        };
        tx.rollback().await?;
        return known.answer(req, &request_hash);
    }

    // 2. Both row locks, in the one agreed order.
    if !lock_both(&tx, req).await? {
        let _ = tx.rollback().await;
        return Err(LedgerError::CreditAccountMissing(req.to.clone()));
    }

    // 3. The conditional debit (the row is already ours: no wait, no re-evaluation).
    let Some(balance) = transfer::conditional_debit(&tx, req).await? else {
        let result = transfer::record_refusal(&tx, req).await?;
        return transfer::commit(tx, hooks, req, result).await;
    };

    // 4. Credit, entries, outcome.
    let (_, txn_id) = match transfer::credit_and_record(&tx, req).await {
        Ok(recorded) => recorded,
        Err(error) => {
            let _ = tx.rollback().await;
            return Err(error);
        }
    };
    transfer::record_ok(&tx, req, txn_id, balance).await?;
    let result = TransferResult {
        outcome: Outcome::Ok,
        txn_id: Some(txn_id),
        balance,
        replayed: false,
    };
    transfer::commit(tx, hooks, req, result).await
}

/// Step 2 inside `tx`: takes the row locks of `req.from` and `req.to` in
/// [`lock_order`]; whether `to` exists (a missing row takes no lock).
///
/// Errors: [`LedgerError::Db`].
async fn lock_both(tx: &Transaction<'_>, req: &TransferRequest) -> Result<bool, LedgerError> {
    let mut exists = [false; 2];
    for (slot, account) in lock_order(&req.from, &req.to).into_iter().enumerate() {
        exists[slot] = tx
            .query_typed_opt(LOCK_ACCOUNT_SQL, &[(&account, Type::TEXT)])
            .await?
            .is_some();
    }
    let [first, _] = lock_order(&req.from, &req.to);
    let to_exists = if first == req.to {
        exists[0]
    } else {
        exists[1]
    };
    Ok(to_exists)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_order_is_sorted_whatever_the_direction() {
        assert_eq!(
            lock_order("acct-0002", "acct-0001"),
            ["acct-0001", "acct-0002"]
        );
        assert_eq!(
            lock_order("acct-0001", "acct-0002"),
            ["acct-0001", "acct-0002"]
        );
    }

    #[test]
    fn between_is_a_transfer() {
        let req = between("app", "k", "acct-0001", "acct-0002", 5);
        assert_eq!(req.kind, Kind::Transfer);
        assert_eq!(
            req.request_hash(),
            crate::request_hash(Kind::Transfer, "acct-0001", "acct-0002", 5)
        );
    }
}
