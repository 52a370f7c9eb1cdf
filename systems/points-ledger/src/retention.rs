//! Key retention: how long a key's stored response is kept.
//!
//! Off by default: every `idem_request` row is kept forever and a retry, however late,
//! replays. With a window W (ledger-svc `--key-retention-ms`), [`sweep`] turns each
//! record created more than W ago into a **tombstone**: outcome `EXPIRED`,
//! `balance_after` NULL (the stored response is gone), `expired_at` = creation + W, while
//! the client id, key, fingerprint (`request_hash`) and `txn_id` stay. The key stays
//! registered, so:
//!
//! - a request with that key is never executed again: [`crate::transfer()`] answers
//!   [`crate::LedgerError::KeyExpired`] naming the original `txn_id` (or
//!   `KeyReused` for another payload, as before expiry);
//! - reconciliation still pairs every `ledger_txn` with a request record
//!   ([`crate::reconcile()`] checks that a tombstone's `txn_id` names a transaction).
//!
//! What it does not give back is the space of the rows: a tombstone is a row like any
//! other. Dropping tombstones too would free the key, and a retry after that would debit
//! again; the transfer refuses that as long as the transaction row exists (its own
//! `UNIQUE (client_id, idem_key)`), so a record removed by hand gets the same answer.

use tokio_postgres::Client;
use tokio_postgres::types::Type;

use crate::error::LedgerError;

/// The stored outcome of a tombstone (`idem_request.outcome`).
pub const EXPIRED: &str = "EXPIRED";

/// Most records one sweep statement turns into tombstones; [`sweep`] repeats until fewer
/// were due, so each statement stays short (well inside the service's statement bound).
pub const SWEEP_BATCH_ROWS: i64 = 1_000;

// Rows being written by a running transfer (PENDING, or locked) are skipped, never
// waited for; a committed record is due when created_at + window has passed.
const SWEEP_SQL: &str = "\
WITH due AS (
    SELECT client_id, idem_key FROM idem_request
    WHERE outcome IN ('OK', 'INSUFFICIENT', 'NO_ACCOUNT')
      AND created_at + $1 * interval '1 millisecond' <= now()
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
UPDATE idem_request r
SET outcome = 'EXPIRED', balance_after = NULL,
    expired_at = r.created_at + $1 * interval '1 millisecond'
FROM due
WHERE r.client_id = due.client_id AND r.idem_key = due.idem_key";

/// Turns every committed record older than `window_ms` milliseconds into a tombstone
/// (see the module documentation), in batches of [`SWEEP_BATCH_ROWS`], each its own
/// statement (autocommit). Returns how many records expired.
///
/// Each statement scans `idem_request` (there is no index on `created_at`).
///
/// Errors: [`LedgerError::Db`].
pub async fn sweep(client: &Client, window_ms: u64) -> Result<u64, LedgerError> {
    let window = i64::try_from(window_ms).unwrap_or(i64::MAX) as f64;
    let mut total = 0;
    loop {
        let swept = client
            .execute_typed(
                SWEEP_SQL,
                &[(&window, Type::FLOAT8), (&SWEEP_BATCH_ROWS, Type::INT8)],
            )
            .await?;
        total += swept;
        if swept < SWEEP_BATCH_ROWS as u64 {
            return Ok(total);
        }
    }
}
