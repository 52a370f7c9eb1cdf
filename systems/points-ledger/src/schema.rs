//! The ledger's tables (SPEC §2) and the seeded accounts (SPEC §6).
//!
//! Table, column and constraint names are a contract: the cases query them directly and
//! one case drops the CHECK `balance_non_negative` by name.

use tokio_postgres::Client;
use tokio_postgres::types::Type;

use crate::error::LedgerError;

/// Account id of the issuer: the source of all points. It may go negative; its negative
/// balance equals the total issued (SPEC §2).
pub const SYS_ISSUER: &str = "sys-issuer";

/// Account id of the redemption sink: the destination of every debit (SPEC §2).
pub const SYS_REDEEM: &str = "sys-redeem";

/// Account ids starting with this prefix are reserved for system accounts
/// ([`SYS_ISSUER`], [`SYS_REDEEM`] and its stripes `sys-redeem-NN`).
pub const SYSTEM_ACCOUNT_PREFIX: &str = "sys-";

/// Whether `account_id` names a system account (see [`SYSTEM_ACCOUNT_PREFIX`]); the
/// public HTTP routes refuse them.
pub fn is_system_account(account_id: &str) -> bool {
    account_id.starts_with(SYSTEM_ACCOUNT_PREFIX)
}

/// Number of seeded ordinary accounts (`acct-0001` … `acct-0010`, SPEC §6).
pub const TEST_ACCOUNT_COUNT: u32 = 10;

/// The id of seeded test account `n` (1-based): `test_account(1) == "acct-0001"`.
/// Numbers above 9999 get more digits (`acct-10000`); [`seed`] creates 1..=[`TEST_ACCOUNT_COUNT`].
pub fn test_account(n: u32) -> String {
    format!("acct-{n:04}")
}

/// DDL for the four ledger tables, their constraints and indexes (SPEC §2).
///
/// - `account`: `balance` in points, a cached value derived from `ledger_entry`; the CHECK
///   `balance_non_negative` allows a negative balance only where `allow_negative`.
/// - `idem_request`: one row per `(client_id, idem_key)`; `outcome` is `PENDING` only inside
///   the registering transaction; `txn_id` is set for `OK`; `balance_after` is the balance
///   reported to the client (points). `EXPIRED` marks a tombstone left by the retention
///   sweep ([`crate::retention`]): the stored response (`balance_after`, the outcome) is
///   gone, the fingerprint and `txn_id` stay, and `expired_at` says when the record
///   expired (set exactly for `EXPIRED`, CHECK `idem_request_tombstone_check`).
/// - `ledger_txn`: one row per executed transfer; its own `UNIQUE (client_id, idem_key)`
///   guarantees one key never produces two transactions, even if idempotency logic failed.
///   `order_id` is the business reference a debit carries (a redemption order id,
///   [`crate::TransferRequest::order_id`]), NULL without one; deliberately not unique:
///   the ledger records what it was asked, and a reconciliation of orders against the
///   ledger is what finds an order paid twice (index `ledger_txn_order_id_idx`).
/// - `ledger_entry`: the record of fact, signed amounts in points (never 0).
///
/// Plain `CREATE` statements: running it twice fails with SQLSTATE 42P07.
pub const SCHEMA_SQL: &str = r#"
CREATE TABLE account (
    account_id     text    PRIMARY KEY,
    allow_negative boolean NOT NULL DEFAULT false,
    balance        bigint  NOT NULL DEFAULT 0,
    CONSTRAINT balance_non_negative CHECK (allow_negative OR balance >= 0)
);

CREATE TABLE idem_request (
    client_id     text        NOT NULL,
    idem_key      text        NOT NULL,
    request_hash  text        NOT NULL,
    outcome       text        NOT NULL
        CONSTRAINT idem_request_outcome_check
        CHECK (outcome IN ('PENDING', 'OK', 'INSUFFICIENT', 'NO_ACCOUNT', 'EXPIRED')),
    txn_id        bigint      NULL,
    balance_after bigint      NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    expired_at    timestamptz NULL,
    CONSTRAINT idem_request_tombstone_check
        CHECK ((outcome = 'EXPIRED') = (expired_at IS NOT NULL)),
    PRIMARY KEY (client_id, idem_key)
);

CREATE TABLE ledger_txn (
    txn_id     bigserial   PRIMARY KEY,
    client_id  text        NOT NULL,
    idem_key   text        NOT NULL,
    kind       text        NOT NULL
        CONSTRAINT ledger_txn_kind_check CHECK (kind IN ('DEBIT', 'GRANT', 'TRANSFER', 'ADJUST')),
    created_at timestamptz NOT NULL DEFAULT now(),
    order_id   text        NULL,
    CONSTRAINT ledger_txn_client_id_idem_key_key UNIQUE (client_id, idem_key)
);

CREATE TABLE ledger_entry (
    entry_id   bigserial PRIMARY KEY,
    txn_id     bigint    NOT NULL REFERENCES ledger_txn (txn_id),
    account_id text      NOT NULL REFERENCES account (account_id),
    amount     bigint    NOT NULL CONSTRAINT ledger_entry_amount_check CHECK (amount <> 0)
);

CREATE INDEX ledger_entry_account_id_idx ON ledger_entry (account_id);
CREATE INDEX ledger_entry_txn_id_idx ON ledger_entry (txn_id);
CREATE INDEX ledger_txn_order_id_idx ON ledger_txn (order_id) WHERE order_id IS NOT NULL;
"#;

/// Creates the tables of [`SCHEMA_SQL`] and the repair's ([`crate::repair::SCHEMA_SQL`])
/// in the connected database, and the one-trip transfer's function
/// ([`crate::onetrip::FUNCTION_SQL`]).
///
/// The statements run as one simple-protocol query string, which PostgreSQL executes as a
/// single implicit transaction: either all tables exist afterwards or none.
///
/// Errors: [`LedgerError::Db`] (e.g. SQLSTATE 42P07 if a table already exists).
pub async fn install(client: &Client) -> Result<(), LedgerError> {
    client.batch_execute(SCHEMA_SQL).await?;
    client.batch_execute(crate::repair::SCHEMA_SQL).await?;
    client.batch_execute(crate::onetrip::FUNCTION_SQL).await?;
    Ok(())
}

/// Inserts the seeded accounts, all with balance 0 points: [`SYS_ISSUER`] (with
/// `allow_negative = true`), [`SYS_REDEEM`] and `acct-0001` … `acct-0010`
/// ([`test_account`], [`TEST_ACCOUNT_COUNT`]). One INSERT statement.
///
/// Errors: [`LedgerError::Db`] (e.g. SQLSTATE 23505 if an account already exists).
pub async fn seed(client: &Client) -> Result<(), LedgerError> {
    let mut ids = vec![SYS_ISSUER.to_owned(), SYS_REDEEM.to_owned()];
    let mut allow_negative = vec![true, false];
    for n in 1..=TEST_ACCOUNT_COUNT {
        ids.push(test_account(n));
        allow_negative.push(false);
    }
    client
        .execute_typed(
            "INSERT INTO account (account_id, allow_negative, balance) \
             SELECT id, neg, 0 FROM unnest($1::text[], $2::boolean[]) AS s(id, neg)",
            &[
                (&ids, Type::TEXT_ARRAY),
                (&allow_negative, Type::BOOL_ARRAY),
            ],
        )
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_account_names() {
        assert_eq!(test_account(1), "acct-0001");
        assert_eq!(test_account(10), "acct-0010");
    }
}
