//! The error type of the InnoDB events: the engine-independent refusals of
//! `frozen_balances` ([`FrozenError`]), or the server's and the client's errors.

use frozen_balances::FrozenError;

/// MariaDB error `ER_DUP_ENTRY`: a duplicate key (SQLSTATE 23000).
pub const ER_DUP_ENTRY: u16 = 1062;
/// MariaDB error `ER_LOCK_DEADLOCK`: InnoDB chose this transaction as a deadlock victim
/// and rolled it back (SQLSTATE 40001).
pub const ER_LOCK_DEADLOCK: u16 = 1213;
/// MariaDB error `ER_LOCK_WAIT_TIMEOUT` (only the statement is rolled back).
pub const ER_LOCK_WAIT_TIMEOUT: u16 = 1205;

/// Why an event failed.
#[derive(Debug, thiserror::Error)]
pub enum InnoError {
    /// A refusal shared with the PostgreSQL system: an invalid request, a payload
    /// mismatch, a hook abort, no such order, a fill that does not fit, exhausted
    /// deadlock retries, an invariant.
    #[error(transparent)]
    Frozen(#[from] FrozenError),
    /// The server's error, with its MariaDB error code (1062, 1213, …) and SQLSTATE.
    #[error("MariaDB error {code} ({state}): {message}")]
    Server {
        /// The MariaDB error code.
        code: u16,
        /// The SQLSTATE.
        state: String,
        /// The server's message.
        message: String,
    },
    /// The client or the connection failed.
    #[error("MariaDB client: {0}")]
    Client(String),
}

impl InnoError {
    /// The MariaDB error code of a [`InnoError::Server`] error.
    pub fn code(&self) -> Option<u16> {
        match self {
            InnoError::Server { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// An invariant violation with `text`.
    pub(crate) fn invariant(text: impl Into<String>) -> InnoError {
        InnoError::Frozen(FrozenError::InvariantViolated(text.into()))
    }
}

impl From<mysql_async::Error> for InnoError {
    fn from(error: mysql_async::Error) -> Self {
        match error {
            mysql_async::Error::Server(server) => InnoError::Server {
                code: server.code,
                state: server.state,
                message: server.message,
            },
            other => InnoError::Client(other.to_string()),
        }
    }
}
