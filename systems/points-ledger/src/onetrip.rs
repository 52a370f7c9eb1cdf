//! The one-round-trip transfer: the whole of SPEC §3 (register, conditional debit, credit,
//! transaction, entries, outcome) in one server-side function, called as one statement
//! in its own implicit transaction.
//!
//! [`transfer`](crate::transfer()) sends START TRANSACTION, the freeze check and four
//! statements and COMMIT, each a round trip (8–9 with a refusal or a replay's reads);
//! [`transfer_onetrip`] sends one: `SELECT * FROM ledger_transfer_onetrip(...)`, whose
//! PL/pgSQL body runs the same statements on the server. Same outcomes, same replay, same
//! fingerprint (computed here and compared here, by the same code), same lock order
//! (`from`, then `to`), same tables written in the same order. What differs:
//!
//! - **Hook points.** Only [`HookPoint::AfterCommit`](crate::HookPoint::AfterCommit)
//!   exists: `registered`, `entries-written` and `before-commit` lie inside the server's
//!   statement, where no client code can run, so [`transfer_onetrip`] never calls hooks
//!   there (LIMITS.md, "The one-trip transfer", says what this means for L7–L10).
//! - **Isolation.** A single statement cannot set its own isolation level; the function
//!   refuses to run unless the transaction is READ COMMITTED (SQLSTATE
//!   [`SQLSTATE_NOT_READ_COMMITTED`]), so it can never run under another level unnoticed.
//!   The service sets `default_transaction_isolation` on its sessions explicitly.
//! - **Errors raised by the function itself** carry our own SQLSTATEs (class `LD`, unused
//!   by PostgreSQL, docs Appendix A) and are mapped back to the same [`LedgerError`]s:
//!   a missing credit account, and our own balance arithmetic leaving the bigint range
//!   (checked in the UPDATEs' own WHERE clauses, so the arithmetic itself never
//!   overflows; a 22003 from a trigger stays [`LedgerError::Db`]).
//!
//! Inside a VOLATILE PL/pgSQL function under READ COMMITTED each statement takes a new
//! snapshot (PostgreSQL docs, 38.7 "Function Volatility Categories"), so the read after
//! `ON CONFLICT DO NOTHING` sees the row committed by the transaction it waited for,
//! exactly as the separate statement does; the conditional UPDATE re-checks the newest
//! row version after a wait (EvalPlanQual, docs 13.2.1) as it does outside a function.
//!
//! The function is installed by [`crate::schema::install`]. Its parameters are named and
//! called by name (`p_amount => $7`), so one more request field is one more parameter
//! with a `DEFAULT` and one more `=>` in [`ONETRIP_CALL_SQL`], as the debit's business
//! reference was added ([`TransferRequest::order_id`] as `p_order_id`, stored in
//! `ledger_txn.order_id` by the same INSERT as in the statement mode).

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Statement};

use crate::error::LedgerError;
use crate::transfer::{Hooks, TransferRequest, TransferResult, after_commit, replay};
use crate::vocabulary::Outcome;

/// The function's DDL, kept in [`crate::schema`] with the tables it writes (this path
/// stays for callers that name it here).
pub use crate::schema::ONETRIP_FUNCTION_SQL as FUNCTION_SQL;

/// SQLSTATE raised by the function when the transaction is not READ COMMITTED.
pub const SQLSTATE_NOT_READ_COMMITTED: &str = "LD001";
/// SQLSTATE raised by the function when the credited account does not exist (mapped to
/// [`LedgerError::CreditAccountMissing`]; the whole statement is rolled back).
pub const SQLSTATE_CREDIT_ACCOUNT_MISSING: &str = "LD002";
/// SQLSTATE raised by the function when `balance - amount` on `from` or
/// `balance + amount` on `to` would leave the bigint range (mapped to
/// [`LedgerError::OutOfRange`]; DETAIL is `from` or `to`).
pub const SQLSTATE_OUT_OF_RANGE: &str = "LD003";

/// How often the function tries to register when the conflicting row is not visible,
/// the bound [`crate::transfer()`] uses (see [`LedgerError::RegistrationVanished`]).
const REGISTER_ATTEMPTS: i32 = crate::transfer::REGISTER_ATTEMPTS as i32;

/// The one statement [`transfer_onetrip`] sends (parameters by name; see the module
/// documentation for adding a field).
const ONETRIP_CALL_SQL: &str = "\
SELECT status, account_id, request_hash, outcome, txn_id, balance_after
FROM ledger_transfer_onetrip(
    p_client_id => $1, p_idem_key => $2, p_request_hash => $3, p_kind => $4,
    p_from => $5, p_to => $6, p_amount => $7, p_attempts => $8, p_order_id => $9)";

/// The parameter types of the one-trip call, in order.
const ONETRIP_CALL_TYPES: [Type; 9] = [
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::INT8,
    Type::INT4,
    Type::TEXT,
];

/// The one-trip call prepared once on one connection (a named statement), as the batch
/// call is (`crate::batch::PreparedBatchCall`, which says why only on a connection of
/// its own): its later calls skip the calling statement's parse, analysis and plan.
#[derive(Debug, Clone)]
pub struct PreparedOnetripCall(Statement);

impl PreparedOnetripCall {
    /// Prepares the call on `client`.
    ///
    /// Errors: [`LedgerError::Db`] (the function is not installed: SQLSTATE 42883).
    pub async fn prepare(client: &Client) -> Result<PreparedOnetripCall, LedgerError> {
        Ok(PreparedOnetripCall(
            client
                .prepare_typed(ONETRIP_CALL_SQL, &ONETRIP_CALL_TYPES)
                .await?,
        ))
    }
}

/// Executes `req` at most once per `(client_id, idem_key)` with exactly the outcomes,
/// replay and fingerprint of [`crate::transfer()`], in one round trip: one statement in
/// its own implicit transaction (the connection must not be inside a transaction, and
/// its transactions must be READ COMMITTED, the default). The statement's end is the
/// commit; then [`HookPoint::AfterCommit`](crate::HookPoint::AfterCommit) runs on every
/// committing path (OK, INSUFFICIENT, NO_ACCOUNT), the only hook point of this mode; a
/// replay runs none.
///
/// Errors: as [`crate::transfer()`] (the same variants, in the same situations), plus
/// [`LedgerError::Db`] with SQLSTATE [`SQLSTATE_NOT_READ_COMMITTED`] when the session's
/// transactions are not READ COMMITTED, and SQLSTATE 42883 when the function is not
/// installed. On every error except `HookAborted(AfterCommit)` nothing was committed.
pub async fn transfer_onetrip(
    client: &Client,
    req: &TransferRequest,
    hooks: &dyn Hooks,
) -> Result<TransferResult, LedgerError> {
    transfer_onetrip_prepared(client, None, req, hooks).await
}

/// [`transfer_onetrip`] with the call `prepared` on this connection
/// ([`PreparedOnetripCall`]), or unnamed when `None`.
pub async fn transfer_onetrip_prepared(
    client: &Client,
    prepared: Option<&PreparedOnetripCall>,
    req: &TransferRequest,
    hooks: &dyn Hooks,
) -> Result<TransferResult, LedgerError> {
    if req.amount <= 0 {
        return Err(LedgerError::InvalidAmount(req.amount));
    }
    let request_hash = req.request_hash();
    let kind = req.kind.as_str();
    let params: [&(dyn ToSql + Sync); 9] = [
        &req.client_id,
        &req.idem_key,
        &request_hash,
        &kind,
        &req.from,
        &req.to,
        &req.amount,
        &REGISTER_ATTEMPTS,
        &req.order_id,
    ];
    let row = match prepared {
        Some(PreparedOnetripCall(statement)) => client.query_one(statement, &params).await,
        None => {
            let typed: Vec<(&(dyn ToSql + Sync), Type)> = params
                .iter()
                .zip(ONETRIP_CALL_TYPES.iter())
                .map(|(param, ty)| (*param, ty.clone()))
                .collect();
            client.query_typed_one(ONETRIP_CALL_SQL, &typed).await
        }
    }
    .map_err(|error| own_error(error, req))?;
    let status: &str = row.try_get("status")?;
    match status {
        "executed" => {
            let outcome: &str = row.try_get("outcome")?;
            let Ok(outcome) = outcome.parse::<Outcome>() else {
                return Err(LedgerError::CommittedPending {
                    client_id: req.client_id.clone(),
                    idem_key: req.idem_key.clone(),
                });
            };
            let balance: Option<i64> = row.try_get("balance_after")?;
            let result = TransferResult {
                outcome,
                txn_id: row.try_get("txn_id")?,
                balance: balance.unwrap_or(0),
                replayed: false,
            };
            after_commit(hooks, req, result).await
        }
        "stored" => replay(req, &request_hash, &row),
        "orphan" => Err(LedgerError::KeyExpired {
            txn_id: row.try_get("txn_id")?,
            tombstone: false,
        }),
        "frozen" => Err(LedgerError::AccountFrozen(row.try_get("account_id")?)),
        _ => Err(LedgerError::RegistrationVanished {
            client_id: req.client_id.clone(),
            idem_key: req.idem_key.clone(),
        }),
    }
}

/// Maps the function's own SQLSTATEs back to the errors [`crate::transfer()`] reports;
/// everything else stays [`LedgerError::Db`].
fn own_error(error: tokio_postgres::Error, req: &TransferRequest) -> LedgerError {
    let Some(db) = error.as_db_error() else {
        return LedgerError::from(error);
    };
    match db.code().code() {
        SQLSTATE_CREDIT_ACCOUNT_MISSING => LedgerError::CreditAccountMissing(req.to.clone()),
        SQLSTATE_OUT_OF_RANGE => LedgerError::OutOfRange {
            account: if db.detail() == Some("from") {
                req.from.clone()
            } else {
                req.to.clone()
            },
            amount: req.amount,
        },
        _ => LedgerError::from(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_call_names_every_parameter_of_the_function() {
        for name in [
            "p_client_id",
            "p_idem_key",
            "p_request_hash",
            "p_kind",
            "p_from",
            "p_to",
            "p_amount",
            "p_attempts",
            "p_order_id",
        ] {
            assert!(FUNCTION_SQL.contains(name), "{name}");
            assert!(ONETRIP_CALL_SQL.contains(&format!("{name} =>")), "{name}");
        }
    }
}
