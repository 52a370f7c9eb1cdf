//! The error type of the frozen-balance events.
//!
//! Business outcomes (INSUFFICIENT, ORDER_CLOSED) are not errors: they are recorded and
//! replayed as [`crate::Outcome`] values. A [`FrozenError`] means nothing of the event was
//! committed, except [`FrozenError::HookAborted`] at `after-commit`.

use std::fmt;

use crate::amount::AmountError;
use crate::hooks::HookPoint;

/// Why an event failed.
#[derive(Debug, thiserror::Error)]
pub enum FrozenError {
    /// The `(tenant_id, business_id)` is registered for another canonical payload (HTTP
    /// 422). Nothing was recorded by this call.
    #[error(
        "business id reused for a different payload (stored fingerprint {stored_hash}, this request {payload_hash})"
    )]
    PayloadMismatch {
        /// The stored payload's fingerprint.
        stored_hash: String,
        /// This request's fingerprint.
        payload_hash: String,
    },
    /// The request is invalid before any database access (ids, amounts, a system account).
    #[error("invalid request: {0}")]
    Invalid(String),
    /// An amount was refused ([`AmountError`]); nothing was recorded.
    #[error(transparent)]
    Amount(#[from] AmountError),
    /// The named order does not exist in the tenant (or, for a cancel, not for this
    /// account). Rolled back, not recorded: a retry runs afresh.
    #[error("order {0} does not exist")]
    NoOrder(i64),
    /// The account holds no balance row of the asset the event would freeze (a
    /// placement on a market whose asset it lacks, a withdrawal of an asset it never
    /// held). Rolled back before any row is created: not recorded, no balance row made
    /// (HTTP 404 `NO_BALANCE`; docs/withdrawals.md, "Assets an account does not hold").
    #[error("account {account_id} holds no {asset} balance")]
    NoBalance {
        /// Account.
        account_id: String,
        /// The asset it does not hold.
        asset: crate::asset::Asset,
    },
    /// The account owes a shortfall of the asset (a deposit reversed after it was
    /// partly spent, [`crate::reorg`]): its new freezes of that asset are refused until
    /// it is settled. Rolled back, not recorded (HTTP 409 `ON_HOLD`).
    #[error(
        "account {account_id} is on hold for {asset}: a reversed deposit left {shortfall} units unpaid"
    )]
    Held {
        /// Account.
        account_id: String,
        /// The asset held.
        asset: crate::asset::Asset,
        /// The outstanding shortfall, minor units.
        shortfall: i64,
    },
    /// A fill that does not fit its orders (sides, market, quantity above a remainder,
    /// price outside the limits). The matching engine's error; rolled back, not recorded.
    #[error("fill refused: {0}")]
    FillRejected(String),
    /// A bug or data changed behind the product's back: an assertion on the data failed
    /// (e.g. a reserve share below the fee, a frozen balance below what an order holds).
    /// Rolled back; never a negative frozen balance.
    #[error("invariant violated: {0}")]
    InvariantViolated(String),
    /// The registration is committed as `PENDING` (never done by this crate).
    #[error("operation ({tenant_id}, {business_id}) was committed as PENDING")]
    CommittedPending {
        /// Tenant.
        tenant_id: String,
        /// Business id.
        business_id: String,
    },
    /// A hook aborted the event at this point.
    #[error("event aborted by hook at {0}")]
    HookAborted(HookPoint),
    /// A deadlock (40P01) repeated on every one of the bounded attempts.
    #[error("deadlock on each of {attempts} attempts")]
    DeadlockRetriesExhausted {
        /// Attempts made.
        attempts: u32,
    },
    /// PostgreSQL or the connection failed (the transaction was rolled back).
    #[error("{}", DbDisplay { code: code.as_deref(), source })]
    Db {
        /// SQLSTATE, when the server sent one.
        code: Option<String>,
        /// The driver error.
        source: tokio_postgres::Error,
    },
}

impl FrozenError {
    /// The SQLSTATE of a [`FrozenError::Db`] error.
    pub fn sqlstate(&self) -> Option<&str> {
        match self {
            FrozenError::Db { code, .. } => code.as_deref(),
            _ => None,
        }
    }
}

impl From<tokio_postgres::Error> for FrozenError {
    fn from(source: tokio_postgres::Error) -> Self {
        FrozenError::Db {
            code: source.code().map(|c| c.code().to_owned()),
            source,
        }
    }
}

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
            Some(db) => write!(f, ": {}", db.message()),
            None => write!(f, ": {}", self.source),
        }
    }
}
