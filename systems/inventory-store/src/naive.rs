//! The designs the S-family negative controls run on purpose (SPEC §9, S6, S8, S9).
//!
//! **Never use these for anything but a negative control.** Each is a plausible shortcut
//! that the real [`Store::apply_change`](crate::Store::apply_change) exists to avoid:
//!
//! - [`apply_change_with_replace`] registers the event with `INSERT OR REPLACE`: a
//!   repeated id with another delta deletes the first record, inserts its own and applies
//!   again (S8).
//! - [`Schema::WithoutTypeCheck`](crate::Schema::WithoutTypeCheck) (in the crate root)
//!   leaves out the `typeof` CHECK, so an integer overflow is stored as a REAL (S9).
//! - [`DeferredReadThenWrite`] reads the units in a deferred transaction, decides in the
//!   application, then writes the absolute value: in WAL mode its write fails at once
//!   with `SQLITE_BUSY_SNAPSHOT` when another connection committed after its read (S6).

use rusqlite::{Transaction, TransactionBehavior, params};

use crate::{ChangeError, ChangeOutcome, Store, validate};

/// Like [`Store::apply_change`], but registers the event with `INSERT OR REPLACE` and takes
/// "one row changed" to mean "new event". `REPLACE` deletes a conflicting row and inserts
/// the new one, and SQLite counts that as one change (SQLite docs, "The ON CONFLICT
/// Clause", REPLACE), so a repeated id always looks new: the same id with another delta
/// overwrites the record and moves the stock again; the same id with the same delta moves
/// it twice.
///
/// Errors: [`ChangeError::Invalid`], [`ChangeError::Insufficient`],
/// [`ChangeError::UnknownItem`], database errors.
pub fn apply_change_with_replace(
    store: &Store,
    event_id: &str,
    item: i64,
    delta: i64,
) -> Result<ChangeOutcome, ChangeError> {
    validate(event_id, item, delta).map_err(ChangeError::Invalid)?;
    let transaction =
        Transaction::new_unchecked(store.connection(), TransactionBehavior::Immediate)?;
    let registered = transaction.execute(
        "INSERT OR REPLACE INTO applied_change (event_id, item_id, delta) VALUES (?1, ?2, ?3)",
        params![event_id, item, delta],
    )?;
    if registered == 0 {
        return Ok(ChangeOutcome::Replayed);
    }
    let updated = transaction.execute(
        "UPDATE stock SET units = units + ?2 WHERE item_id = ?1 AND units + ?2 >= 0",
        params![item, delta],
    )?;
    if updated == 0 {
        return Err(ChangeError::Insufficient {
            units: store.units(item)?.unwrap_or(0),
        });
    }
    transaction.commit()?;
    Ok(ChangeOutcome::Applied)
}

/// A read-then-write change in a **deferred** transaction: `BEGIN` (no lock yet), read the
/// units (the connection now holds a read snapshot), decide in the application, then
/// [`DeferredReadThenWrite::write`] the absolute new value. Between the two steps another
/// connection may commit; the write must then upgrade a stale snapshot, which WAL mode
/// refuses with `SQLITE_BUSY_SNAPSHOT`, without calling the busy handler.
pub struct DeferredReadThenWrite<'a> {
    transaction: Transaction<'a>,
    item: i64,
    units_read: i64,
}

impl<'a> DeferredReadThenWrite<'a> {
    /// Step 1: `BEGIN DEFERRED` and read `item`'s units on `store`'s connection.
    ///
    /// Errors: a database error, or no such item.
    pub fn begin(store: &'a Store, item: i64) -> rusqlite::Result<DeferredReadThenWrite<'a>> {
        let transaction =
            Transaction::new_unchecked(store.connection(), TransactionBehavior::Deferred)?;
        let units_read = transaction.query_row(
            "SELECT units FROM stock WHERE item_id = ?1",
            [item],
            |row| row.get(0),
        )?;
        Ok(DeferredReadThenWrite {
            transaction,
            item,
            units_read,
        })
    }

    /// The units step 1 read.
    pub fn units_read(&self) -> i64 {
        self.units_read
    }

    /// Step 2: checks `units_read + delta >= 0` in the application, writes
    /// `units = units_read + delta` and commits. `Ok(false)` when the application check
    /// refused (nothing written).
    ///
    /// Errors: the write or the commit failed (rolled back): `SQLITE_BUSY_SNAPSHOT` when
    /// another connection committed after step 1, `SQLITE_BUSY` when one holds the write
    /// lock.
    pub fn write(self, delta: i64) -> rusqlite::Result<bool> {
        let new_units = self.units_read + delta;
        if new_units < 0 {
            return Ok(false);
        }
        self.transaction.execute(
            "UPDATE stock SET units = ?2 WHERE item_id = ?1",
            params![self.item, new_units],
        )?;
        self.transaction.commit()?;
        Ok(true)
    }
}
