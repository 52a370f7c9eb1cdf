//! The other key policy, for comparison (S4): the points ledger's L2 rule applied to
//! stock. A refused change **is recorded** under its id, and a retry with that id replays
//! the refusal even after the stock has been refilled; only a new id can succeed.
//!
//! This is not a naive design: it is a legitimate contract (the caller must make a new id
//! for a new decision). It is here so that one case can tell the same story under both
//! policies and show what each one does to the caller.

use rusqlite::{OptionalExtension, Transaction, TransactionBehavior, params};

use crate::{ChangeError, Store, validate};

/// The extra table this policy needs: one row per refused id.
const SCHEMA: &str = "
    CREATE TABLE IF NOT EXISTS refused_change (
        event_id   TEXT PRIMARY KEY NOT NULL,
        item_id    INTEGER NOT NULL,
        delta      INTEGER NOT NULL,
        units_seen INTEGER NOT NULL
    );";

/// What a call did under the recording policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordedOutcome {
    /// Applied for the first time (as [`crate::ChangeOutcome::Applied`]).
    Applied,
    /// Applied before; nothing changed.
    Replayed,
    /// Refused for lack of stock, and the refusal is now recorded under the id.
    Refused,
    /// Refused before; the recorded refusal is answered again, whatever the stock is now.
    RefusalReplayed,
}

impl RecordedOutcome {
    /// `applied`, `replayed`, `insufficient` or `insufficient (replayed)`.
    pub fn as_str(self) -> &'static str {
        match self {
            RecordedOutcome::Applied => "applied",
            RecordedOutcome::Replayed => "replayed",
            RecordedOutcome::Refused => "insufficient",
            RecordedOutcome::RefusalReplayed => "insufficient (replayed)",
        }
    }
}

/// Adds the policy's table to `store`'s file.
///
/// Errors: a database error.
pub fn install(store: &Store) -> rusqlite::Result<()> {
    store.connection().execute_batch(SCHEMA)
}

/// Applies a change under the recording policy, in one `BEGIN IMMEDIATE` transaction
/// (the write lock is held from the start, so the look-ups below cannot go stale).
///
/// Errors: [`ChangeError::Invalid`], [`ChangeError::InTransaction`],
/// [`ChangeError::Mismatch`] (the id was recorded, applied or refused, with another
/// change), [`ChangeError::UnknownItem`], database errors.
pub fn apply_change(
    store: &Store,
    event_id: &str,
    item: i64,
    delta: i64,
) -> Result<RecordedOutcome, ChangeError> {
    validate(event_id, item, delta).map_err(ChangeError::Invalid)?;
    let connection = store.connection();
    if !connection.is_autocommit() {
        return Err(ChangeError::InTransaction);
    }
    let transaction = Transaction::new_unchecked(connection, TransactionBehavior::Immediate)?;
    let recorded = |table: &str| -> rusqlite::Result<Option<(i64, i64)>> {
        transaction
            .query_row(
                &format!("SELECT item_id, delta FROM {table} WHERE event_id = ?1"),
                [event_id],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .optional()
    };
    let answer = |stored: (i64, i64), outcome: RecordedOutcome| {
        if stored == (item, delta) {
            Ok(outcome)
        } else {
            Err(ChangeError::Mismatch {
                stored_item: stored.0,
                stored_delta: stored.1,
            })
        }
    };
    if let Some(stored) = recorded("refused_change")? {
        return answer(stored, RecordedOutcome::RefusalReplayed);
    }
    if let Some(stored) = recorded("applied_change")? {
        return answer(stored, RecordedOutcome::Replayed);
    }
    let updated = transaction.execute(
        "UPDATE stock SET units = units + ?2 WHERE item_id = ?1 AND units + ?2 >= 0",
        params![item, delta],
    )?;
    if updated == 1 {
        transaction.execute(
            "INSERT INTO applied_change (event_id, item_id, delta) VALUES (?1, ?2, ?3)",
            params![event_id, item, delta],
        )?;
        transaction.commit()?;
        return Ok(RecordedOutcome::Applied);
    }
    let units: Option<i64> = transaction
        .query_row(
            "SELECT units FROM stock WHERE item_id = ?1",
            [item],
            |row| row.get(0),
        )
        .optional()?;
    let Some(units) = units else {
        return Err(ChangeError::UnknownItem);
    };
    transaction.execute(
        "INSERT INTO refused_change (event_id, item_id, delta, units_seen) VALUES (?1, ?2, ?3, ?4)",
        params![event_id, item, delta, units],
    )?;
    transaction.commit()?;
    Ok(RecordedOutcome::Refused)
}
