//! The one error type of the ledger library.
//!
//! Business outcomes (INSUFFICIENT, NO_ACCOUNT) are *not* errors: they are recorded for
//! replay and returned as [`crate::Outcome`] values inside an `Ok`. A [`LedgerError`] means
//! the request was not executed (nothing of it was committed), except where a variant says
//! otherwise ([`LedgerError::HookAborted`] at [`HookPoint::AfterCommit`]).

use std::fmt;

use crate::vocabulary::HookPoint;

/// Why a ledger call failed.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// The `(client_id, idem_key)` pair is already registered for a request with a different
    /// fingerprint (SPEC §3 step 1; the HTTP layer maps it to 422 `KEY_REUSED`, following the
    /// IETF draft draft-ietf-httpapi-idempotency-key-header, which forbids reusing a key for a
    /// different payload). Nothing was recorded by this call.
    #[error(
        "idempotency key reused for a different request (stored fingerprint {stored_hash}, this request {request_hash})"
    )]
    KeyReused {
        /// The fingerprint stored with the first request for this key (32 lower-case hex chars).
        stored_hash: String,
        /// The fingerprint of the rejected request (32 lower-case hex chars).
        request_hash: String,
    },

    /// The key's record has expired (the retention sweep left only a tombstone, see
    /// [`crate::retention`]) or was removed by hand while its transaction still exists.
    /// The transfer is never executed again for this key: nothing was recorded by this
    /// call, and `txn_id` names the transaction the key once executed (`None` when it
    /// executed none: a refusal that was recorded and has since expired). The HTTP layer
    /// maps it to 422 `KEY_EXPIRED`.
    #[error("idempotency key expired (original transaction {txn_id:?}); nothing executed")]
    KeyExpired {
        /// `ledger_txn.txn_id` of the key's original transaction, if it executed one.
        txn_id: Option<i64>,
        /// `true` when a tombstone (outcome `EXPIRED`) was found; `false` when the record
        /// was gone and only the transaction's own `(client_id, idem_key)` remained.
        tombstone: bool,
    },

    /// The ledger's own balance arithmetic (`balance - amount` on the debited account or
    /// `balance + amount` on the credited one) would leave the 64-bit range of points
    /// (SQLSTATE 22003 raised by that expression itself, not by a trigger or a function it
    /// calls: the error carries no context and was reported by bigint addition or
    /// subtraction). The transaction was rolled back; nothing was recorded, so the
    /// request itself cannot be done (HTTP 400). A 22003 from anywhere else stays
    /// [`LedgerError::Db`].
    #[error("amount {amount} points would take the balance of {account} outside the 64-bit range")]
    OutOfRange {
        /// The account whose balance would overflow.
        account: String,
        /// The requested amount, points.
        amount: i64,
    },

    /// The amount (in points) is not a positive integer. Rejected before the database is
    /// touched, so nothing was recorded.
    #[error("invalid amount {0} points: an amount must be a positive integer")]
    InvalidAmount(i64),

    /// The named account is frozen by a repair ([`crate::repair()`]): the transfer was
    /// refused and rolled back before its key was registered, so nothing was recorded
    /// and the same key runs afresh once the account is unfrozen (HTTP: 503).
    #[error("account {0:?} is frozen for repair; nothing was recorded")]
    AccountFrozen(String),

    /// A transfer between two accounts names the same account twice. Rejected before the
    /// database is touched; nothing was recorded.
    #[error("a transfer needs two different accounts, got {0:?} twice")]
    SameAccount(String),

    /// The request's kind does not fit the operation called (e.g. a DEBIT given to
    /// [`crate::transfer_between()`]). Rejected before the database is touched.
    #[error("a {0} request cannot be executed by this operation")]
    InvalidKind(crate::vocabulary::Kind),

    /// The credited account (`to`, named here) does not exist. The whole transaction,
    /// including the idempotency registration and the debit of `from`, was rolled back, so a
    /// retry with the same key runs afresh.
    #[error("credit account {0:?} does not exist; transfer rolled back")]
    CreditAccountMissing(String),

    /// The key is registered, but its committed row still says `PENDING`. The transfer never
    /// commits a PENDING row, so this indicates a bug or data written behind the ledger's back.
    #[error("idempotency registration ({client_id}, {idem_key}) was committed as PENDING")]
    CommittedPending {
        /// Client id of the registration.
        client_id: String,
        /// Idempotency key of the registration.
        idem_key: String,
    },

    /// `INSERT ... ON CONFLICT DO NOTHING` reported a conflict on `(client_id, idem_key)`
    /// repeatedly, but the conflicting row was never visible to the follow-up SELECT. Only
    /// possible if registrations are deleted concurrently (not done by this library).
    /// The transaction was rolled back; nothing was recorded.
    #[error("idempotency registration ({client_id}, {idem_key}) conflicted but could not be read")]
    RegistrationVanished {
        /// Client id of the registration.
        client_id: String,
        /// Idempotency key of the registration.
        idem_key: String,
    },

    /// A [`crate::Hooks`] implementation returned [`crate::HookAbort`] at this point.
    /// Before [`HookPoint::AfterCommit`] the transaction was rolled back and nothing was
    /// recorded. At [`HookPoint::AfterCommit`] the transfer **is committed**: a retry with the
    /// same key replays it (this is how a lost response is simulated).
    #[error("transfer aborted by hook at {0}")]
    HookAborted(HookPoint),

    /// The batch this request was executed in ([`crate::batch`]) failed with a database
    /// error (the connection lost, a deadlock, a failed COMMIT): the batch's transaction
    /// was rolled back, or its COMMIT's reply was lost (then whether it committed is
    /// unknown until a retry with the same key tells). No request of the batch was
    /// acknowledged. The HTTP layer answers 503 `UNKNOWN`.
    #[error("the batch failed with a database error{}: {message}", code.as_deref().map(|c| format!(" [SQLSTATE {c}]")).unwrap_or_default())]
    BatchFailed {
        /// The SQLSTATE of the batch's error, `None` when the connection failed.
        code: Option<String>,
        /// The batch's error, shown.
        message: String,
    },

    /// Any error from PostgreSQL or the connection (the transaction, if any, was rolled back
    /// or died with the connection).
    #[error("{}", DbDisplay { code: code.as_deref(), source })]
    Db {
        /// The SQLSTATE (five characters, e.g. `"23514"` for a CHECK violation, `"40P01"`
        /// for a deadlock), or `None` when the error did not come from the server (for
        /// example "connection closed" after an immediate stop).
        code: Option<String>,
        /// The driver error.
        source: tokio_postgres::Error,
    },
}

impl LedgerError {
    /// The SQLSTATE of a [`LedgerError::Db`] or [`LedgerError::BatchFailed`] error reported
    /// by the server (e.g. `"23514"`),
    /// `None` for every other variant and for errors without a server response.
    pub fn sqlstate(&self) -> Option<&str> {
        match self {
            LedgerError::Db { code, .. } | LedgerError::BatchFailed { code, .. } => code.as_deref(),
            _ => None,
        }
    }
}

impl From<tokio_postgres::Error> for LedgerError {
    /// Keeps the SQLSTATE (`err.code()`) next to the driver error.
    fn from(source: tokio_postgres::Error) -> Self {
        LedgerError::Db {
            code: source.code().map(|c| c.code().to_owned()),
            source,
        }
    }
}

/// Display of a driver error: tokio-postgres's own Display says only "db error" for server
/// errors, so the server's message (and detail, when present) is shown instead.
struct DbDisplay<'a> {
    code: Option<&'a str>,
    source: &'a tokio_postgres::Error,
}

impl fmt::Display for DbDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("database error")?;
        if let Some(code) = self.code {
            write!(f, " [SQLSTATE {code}]")?;
        }
        match self.source.as_db_error() {
            Some(db) => {
                write!(f, ": {}", db.message())?;
                if let Some(detail) = db.detail() {
                    write!(f, " (DETAIL: {detail})")?;
                }
                Ok(())
            }
            None => write!(f, ": {}", self.source),
        }
    }
}
