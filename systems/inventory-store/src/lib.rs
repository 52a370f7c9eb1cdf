//! An idempotent inventory in one SQLite file (SPEC §9): stock changes keyed by an event
//! id, applied at most once, with the policy that **a failed change does not occupy its
//! key** (nothing of it is stored, so the same id may succeed later).
//!
//! - [`Store::open`] opens (and if needed creates) a database file in WAL mode with
//!   `synchronous=FULL` and a busy timeout of [`BUSY_TIMEOUT_MS`].
//! - [`Store::apply_change`] takes `(event_id, item, delta)` and answers
//!   [`ChangeOutcome::Applied`] or [`ChangeOutcome::Replayed`], or one of the errors of
//!   [`ChangeError`]. [`Store::apply_json`] is the same through a JSON object
//!   `{"event_id": …, "item": …, "delta": …}`, as a queue consumer would receive it.
//! - [`reconcile`] recomputes every item's units from its opening units and its applied
//!   deltas and names what disagrees.
//! - [`naive`] holds the designs the negative controls run on purpose.
//!
//! Event ids are compared exactly, byte for byte (`TEXT PRIMARY KEY` with SQLite's default
//! `BINARY` collation): `SHIP-1` after `ship-1` is a new event, and ` ship-1` (leading
//! space) is not `ship-1`. Nothing is trimmed or case-folded.

use std::fmt;
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior, ffi, params};

pub mod naive;
mod reconcile;
pub mod recorded_refusals;

pub use reconcile::{Finding, reconcile};
pub use rusqlite;

/// How long a connection waits for another connection's write lock before it gives up
/// with `SQLITE_BUSY`, in milliseconds (`PRAGMA busy_timeout`; SQLite docs,
/// `sqlite3_busy_timeout`). Long enough for 32 writers queueing behind one another with an
/// fsync per commit; a wait that reaches it is an error, never a business outcome.
pub const BUSY_TIMEOUT_MS: u64 = 10_000;
/// The largest absolute delta of one change (SPEC §9: outside ±1000 is invalid).
pub const DELTA_LIMIT: i64 = 1000;

/// The SQLite library this crate runs on (compiled in by rusqlite's `bundled` feature, so
/// it is the same on every machine for one rusqlite version), e.g. `"3.50.2"`.
pub fn sqlite_version() -> &'static str {
    rusqlite::version()
}

/// Which schema a file gets. Only [`Schema::Checked`] is the store; the other exists for
/// the S9 negative control.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schema {
    /// `stock.units` CHECKed to be an integer (`typeof`) and `>= 0`.
    Checked,
    /// `stock.units` CHECKed only to be `>= 0`: an integer that overflows 64 bits is
    /// silently stored as a REAL. **Only for the S9 negative control.**
    WithoutTypeCheck,
}

/// The tables. `stock_opening` records the units an item started with, so that
/// reconciliation can recompute `units = opening + sum(applied deltas)`.
const SCHEMA_CHECKED: &str = "
    CREATE TABLE IF NOT EXISTS stock (
        item_id INTEGER PRIMARY KEY,
        units   INTEGER NOT NULL CHECK (typeof(units) = 'integer' AND units >= 0)
    );";
const SCHEMA_WITHOUT_TYPE_CHECK: &str = "
    CREATE TABLE IF NOT EXISTS stock (
        item_id INTEGER PRIMARY KEY,
        units   INTEGER NOT NULL CHECK (units >= 0)
    );";
const SCHEMA_COMMON: &str = "
    CREATE TABLE IF NOT EXISTS stock_opening (
        item_id INTEGER PRIMARY KEY,
        units   INTEGER NOT NULL CHECK (typeof(units) = 'integer' AND units >= 0)
    );
    CREATE TABLE IF NOT EXISTS applied_change (
        event_id TEXT PRIMARY KEY NOT NULL CHECK (typeof(event_id) = 'text'),
        item_id  INTEGER NOT NULL,
        delta    INTEGER NOT NULL CHECK (
            typeof(delta) = 'integer' AND delta <> 0 AND delta BETWEEN -1000 AND 1000
        )
    );";

/// Why a file could not be opened as a store.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// SQLite refused.
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// A setting read back is not the one asked for.
    #[error("{0}")]
    Setting(String),
}

/// One connection to an inventory file.
pub struct Store {
    connection: Connection,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("path", &self.connection.path())
            .finish()
    }
}

impl Store {
    /// Opens `path` with the checked schema (creating the file and its tables if absent).
    ///
    /// Errors: the file cannot be opened, WAL mode cannot be set, or the schema fails.
    pub fn open(path: &Path) -> Result<Store, OpenError> {
        Store::open_with(path, Schema::Checked)
    }

    /// Opens `path`, which must exist already (a checker must not create an empty file
    /// where it expected data).
    ///
    /// Errors: the file does not exist; otherwise as [`Store::open`].
    pub fn open_existing(path: &Path) -> Result<Store, OpenError> {
        if !path.is_file() {
            return Err(OpenError::Setting(format!(
                "{} does not exist",
                path.display()
            )));
        }
        Store::open(path)
    }

    /// Opens `path`; a new file gets `schema`. An existing file keeps the tables it has
    /// (`CREATE TABLE IF NOT EXISTS`).
    ///
    /// Errors: as [`Store::open`].
    pub fn open_with(path: &Path, schema: Schema) -> Result<Store, OpenError> {
        let connection = Connection::open(path)?;
        // The busy timeout first, so that the statements below wait for a concurrent
        // opener's lock instead of failing at once.
        connection.busy_timeout(Duration::from_millis(BUSY_TIMEOUT_MS))?;
        // WAL: readers do not block the writer and the writer does not block readers; a
        // commit is durable once its WAL frames are synced (SQLite docs, "Write-Ahead
        // Logging"). The pragma answers the mode in force, which is checked.
        let mode: String =
            connection.query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(OpenError::Setting(format!(
                "journal_mode is {mode:?}, not wal"
            )));
        }
        // FULL: in WAL mode the WAL is synced at every commit, so a commit survives an
        // operating-system crash or power loss (NORMAL would only survive a process crash).
        connection.pragma_update(None, "synchronous", "FULL")?;
        let synchronous: i64 = connection.query_row("PRAGMA synchronous", [], |row| row.get(0))?;
        if synchronous != 2 {
            return Err(OpenError::Setting(format!(
                "synchronous is {synchronous}, not 2 (FULL)"
            )));
        }
        let stock = match schema {
            Schema::Checked => SCHEMA_CHECKED,
            Schema::WithoutTypeCheck => SCHEMA_WITHOUT_TYPE_CHECK,
        };
        // Only a file without the tables takes the write lock to create them, so opening
        // never waits behind another connection's open write transaction.
        let tables: i64 = connection.query_row(
            "SELECT count(*) FROM sqlite_schema WHERE type = 'table'
             AND name IN ('stock', 'stock_opening', 'applied_change')",
            [],
            |row| row.get(0),
        )?;
        if tables < 3 {
            let transaction =
                Transaction::new_unchecked(&connection, TransactionBehavior::Immediate)?;
            transaction.execute_batch(stock)?;
            transaction.execute_batch(SCHEMA_COMMON)?;
            transaction.commit()?;
        }
        Ok(Store { connection })
    }

    /// The underlying connection, for reads, for a caller's own transaction, and for the
    /// cases that tamper with the file behind the store's back.
    pub fn connection(&self) -> &Connection {
        &self.connection
    }

    /// Replaces this connection's busy handler (its busy timeout) by one that counts its
    /// calls and never waits, and returns the counter. SQLite calls a busy handler only
    /// where waiting could help (SQLite docs, `sqlite3_busy_handler`; LIMITS.md, "Why the
    /// busy handler is not called for S6's forced control"), so a failed write during
    /// which the count stayed 0 failed without waiting, whatever the handler and however
    /// loaded the machine: an event, not a duration. [`Store::restore_busy_timeout`]
    /// puts the busy timeout back.
    ///
    /// Errors: SQLite refused the handler.
    pub fn count_busy_handler_calls(&mut self) -> rusqlite::Result<Arc<AtomicU32>> {
        let calls = Arc::new(AtomicU32::new(0));
        let counter = calls.clone();
        self.connection.busy_handler(Some(move |_retries: i32| {
            counter.fetch_add(1, Ordering::SeqCst);
            false
        }))?;
        Ok(calls)
    }

    /// Gives the connection its busy timeout ([`BUSY_TIMEOUT_MS`]) back.
    ///
    /// Errors: SQLite refused it.
    pub fn restore_busy_timeout(&self) -> rusqlite::Result<()> {
        self.connection
            .busy_timeout(Duration::from_millis(BUSY_TIMEOUT_MS))
    }

    /// Adds `item` with `units` in stock, recording `units` as its opening figure for
    /// [`reconcile`]. One transaction for both rows.
    ///
    /// Errors: the item exists, `units` is negative, or a database error.
    pub fn add_item(&self, item: i64, units: i64) -> rusqlite::Result<()> {
        let transaction =
            Transaction::new_unchecked(&self.connection, TransactionBehavior::Immediate)?;
        transaction.execute(
            "INSERT INTO stock (item_id, units) VALUES (?1, ?2)",
            params![item, units],
        )?;
        transaction.execute(
            "INSERT INTO stock_opening (item_id, units) VALUES (?1, ?2)",
            params![item, units],
        )?;
        transaction.commit()
    }

    /// The units of `item`; `None` when there is no such item.
    ///
    /// Errors: a database error, or the stored value is not an integer (only possible in
    /// a [`Schema::WithoutTypeCheck`] file).
    pub fn units(&self, item: i64) -> rusqlite::Result<Option<i64>> {
        self.connection
            .query_row(
                "SELECT units FROM stock WHERE item_id = ?1",
                [item],
                |row| row.get(0),
            )
            .optional()
    }

    /// The stored type and text of `item`'s units (`("integer", "120")`, or
    /// `("real", "9.22337203685478e+18")` in a file without the type check).
    ///
    /// Errors: a database error.
    pub fn units_as_stored(&self, item: i64) -> rusqlite::Result<Option<(String, String)>> {
        self.connection
            .query_row(
                "SELECT typeof(units), CAST(units AS TEXT) FROM stock WHERE item_id = ?1",
                [item],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .optional()
    }

    /// The stored change for `event_id` (exact comparison): `(item, delta)`.
    ///
    /// Errors: a database error.
    pub fn recorded_change(&self, event_id: &str) -> rusqlite::Result<Option<(i64, i64)>> {
        self.connection
            .query_row(
                "SELECT item_id, delta FROM applied_change WHERE event_id = ?1",
                [event_id],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .optional()
    }

    /// Number of rows in `applied_change`.
    ///
    /// Errors: a database error.
    pub fn change_count(&self) -> rusqlite::Result<i64> {
        self.connection
            .query_row("SELECT count(*) FROM applied_change", [], |row| row.get(0))
    }

    /// `PRAGMA integrity_check`: `"ok"` when the file is sound, else its first message.
    ///
    /// Errors: a database error.
    pub fn integrity_check(&self) -> rusqlite::Result<String> {
        self.connection
            .query_row("PRAGMA integrity_check", [], |row| row.get(0))
    }

    /// Applies one change (see [`Store::apply_change_with_hooks`]), without hooks.
    ///
    /// Errors: see [`ChangeError`].
    pub fn apply_change(
        &self,
        event_id: &str,
        item: i64,
        delta: i64,
    ) -> Result<ChangeOutcome, ChangeError> {
        self.apply_change_with_hooks(event_id, item, delta, &NoHooks)
    }

    /// Applies the change given as a JSON object `{"event_id": <string>, "item": <integer>,
    /// "delta": <integer>}` (see [`parse_change`]).
    ///
    /// Errors: [`ChangeError::Invalid`] for anything else; then as
    /// [`Store::apply_change`].
    pub fn apply_json(&self, change: &serde_json::Value) -> Result<ChangeOutcome, ChangeError> {
        self.apply_json_with_hooks(change, &NoHooks)
    }

    /// [`Store::apply_json`] with hooks.
    ///
    /// Errors: as [`Store::apply_json`].
    pub fn apply_json_with_hooks(
        &self,
        change: &serde_json::Value,
        hooks: &dyn ChangeHooks,
    ) -> Result<ChangeOutcome, ChangeError> {
        let change = parse_change(change).map_err(ChangeError::Invalid)?;
        self.apply_change_with_hooks(&change.event_id, change.item, change.delta, hooks)
    }

    /// Applies `delta` to `item` once for `event_id`, in one `BEGIN IMMEDIATE`
    /// transaction: register the event (`INSERT … ON CONFLICT(event_id) DO NOTHING`),
    /// then the conditional `UPDATE … WHERE units + delta >= 0`. Either both rows commit
    /// or neither does, so a refused change leaves its id free.
    ///
    /// A repeated id with the same item and delta is [`ChangeOutcome::Replayed`] without
    /// looking at the stock again (the change happened once already). `hooks` is called at
    /// each [`ChangePoint`] reached, in order.
    ///
    /// Errors: see [`ChangeError`]; on every error nothing of this change is stored,
    /// except [`ChangeError::HookAborted`] at [`ChangePoint::AfterCommit`] (committed).
    pub fn apply_change_with_hooks(
        &self,
        event_id: &str,
        item: i64,
        delta: i64,
        hooks: &dyn ChangeHooks,
    ) -> Result<ChangeOutcome, ChangeError> {
        validate(event_id, item, delta).map_err(ChangeError::Invalid)?;
        // Our COMMIT or ROLLBACK would end the caller's transaction too: refuse, touching
        // nothing.
        if !self.connection.is_autocommit() {
            return Err(ChangeError::InTransaction);
        }
        // IMMEDIATE takes the write lock at BEGIN (waiting up to the busy timeout), so
        // the transaction never has to upgrade a read snapshot that another writer made
        // stale (which fails at once with SQLITE_BUSY_SNAPSHOT; see `naive`).
        let transaction =
            Transaction::new_unchecked(&self.connection, TransactionBehavior::Immediate)?;
        if let Some((stored_item, stored_delta)) = register(&transaction, event_id, item, delta)? {
            // Read-only so far; dropping the transaction rolls it back.
            drop(transaction);
            return if (stored_item, stored_delta) == (item, delta) {
                Ok(ChangeOutcome::Replayed)
            } else {
                Err(ChangeError::Mismatch {
                    stored_item,
                    stored_delta,
                })
            };
        }
        hook(hooks, ChangePoint::EventWritten)?;
        if !take_units(&transaction, item, delta)? {
            let refused = refusal(&transaction, item)?;
            // Dropping the transaction rolls back the event row: the id stays free.
            drop(transaction);
            return Err(refused);
        }
        hook(hooks, ChangePoint::StockUpdated)?;
        hook(hooks, ChangePoint::BeforeCommit)?;
        transaction.commit()?;
        hook(hooks, ChangePoint::AfterCommit)?;
        Ok(ChangeOutcome::Applied)
    }
}

/// Registers `event_id` inside `transaction` (`INSERT … ON CONFLICT(event_id) DO
/// NOTHING`): `None` when it was new, else the stored `(item, delta)` of the id.
///
/// Errors: a database error.
fn register(
    transaction: &Transaction<'_>,
    event_id: &str,
    item: i64,
    delta: i64,
) -> rusqlite::Result<Option<(i64, i64)>> {
    let registered = transaction.execute(
        "INSERT INTO applied_change (event_id, item_id, delta) VALUES (?1, ?2, ?3)
             ON CONFLICT (event_id) DO NOTHING",
        params![event_id, item, delta],
    )?;
    if registered != 0 {
        return Ok(None);
    }
    transaction
        .query_row(
            "SELECT item_id, delta FROM applied_change WHERE event_id = ?1",
            [event_id],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .map(Some)
}

/// The conditional update inside `transaction`: adds `delta` to `item`'s units when the
/// result stays ≥ 0 (the UPDATE's own condition, evaluated on the row under the write
/// lock: no read-then-write in the application). Whether a row changed.
///
/// Errors: [`ChangeError::CheckViolation`] when the table's CHECK refuses the result;
/// [`ChangeError::Database`].
fn take_units(transaction: &Transaction<'_>, item: i64, delta: i64) -> Result<bool, ChangeError> {
    let updated = transaction
        .execute(
            "UPDATE stock SET units = units + ?2 WHERE item_id = ?1 AND units + ?2 >= 0",
            params![item, delta],
        )
        .map_err(|error| match constraint_check(&error) {
            true => ChangeError::CheckViolation {
                message: error.to_string(),
            },
            false => ChangeError::Database(error),
        })?;
    Ok(updated != 0)
}

/// Why the conditional update changed nothing, read inside `transaction`:
/// [`ChangeError::Insufficient`] with the item's units, or [`ChangeError::UnknownItem`].
///
/// Errors: a database error (as [`ChangeError::Database`]).
fn refusal(transaction: &Transaction<'_>, item: i64) -> Result<ChangeError, ChangeError> {
    let units: Option<i64> = transaction
        .query_row(
            "SELECT units FROM stock WHERE item_id = ?1",
            [item],
            |row| row.get(0),
        )
        .optional()?;
    Ok(match units {
        Some(units) => ChangeError::Insufficient { units },
        None => ChangeError::UnknownItem,
    })
}

fn hook(hooks: &dyn ChangeHooks, point: ChangePoint) -> Result<(), ChangeError> {
    hooks.at(point).map_err(|abort| ChangeError::HookAborted {
        point,
        reason: abort.reason,
    })
}

/// Whether `error` is SQLite's `SQLITE_CONSTRAINT_CHECK`.
fn constraint_check(error: &rusqlite::Error) -> bool {
    extended_code(error) == Some(ffi::SQLITE_CONSTRAINT_CHECK)
}

/// SQLite's extended result code of `error`, when it came from SQLite.
pub fn extended_code(error: &rusqlite::Error) -> Option<i32> {
    match error {
        rusqlite::Error::SqliteFailure(failure, _) => Some(failure.extended_code),
        _ => None,
    }
}

/// The symbolic name of `error`'s SQLite result code, e.g. `"SQLITE_BUSY_SNAPSHOT"`,
/// decided by the code, never by message text; `"(not from SQLite)"` otherwise.
pub fn code_name(error: &rusqlite::Error) -> String {
    let Some(code) = extended_code(error) else {
        return "(not from SQLite)".into();
    };
    let name = match code {
        ffi::SQLITE_BUSY => "SQLITE_BUSY",
        ffi::SQLITE_BUSY_SNAPSHOT => "SQLITE_BUSY_SNAPSHOT",
        ffi::SQLITE_BUSY_RECOVERY => "SQLITE_BUSY_RECOVERY",
        ffi::SQLITE_BUSY_TIMEOUT => "SQLITE_BUSY_TIMEOUT",
        ffi::SQLITE_LOCKED => "SQLITE_LOCKED",
        ffi::SQLITE_CONSTRAINT => "SQLITE_CONSTRAINT",
        ffi::SQLITE_CONSTRAINT_CHECK => "SQLITE_CONSTRAINT_CHECK",
        ffi::SQLITE_CONSTRAINT_PRIMARYKEY => "SQLITE_CONSTRAINT_PRIMARYKEY",
        ffi::SQLITE_CONSTRAINT_NOTNULL => "SQLITE_CONSTRAINT_NOTNULL",
        _ => return format!("SQLITE_{code}"),
    };
    name.into()
}

/// Whether `error` is one of SQLite's busy codes (primary code `SQLITE_BUSY`).
pub fn is_busy(error: &rusqlite::Error) -> bool {
    extended_code(error).is_some_and(|code| code & 0xff == ffi::SQLITE_BUSY)
}

/// What a successful call did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeOutcome {
    /// First time for this id: the event row and the stock update committed together.
    Applied,
    /// The id was already applied with the same item and delta: nothing changed.
    Replayed,
}

impl ChangeOutcome {
    /// `"applied"` or `"replayed"`.
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeOutcome::Applied => "applied",
            ChangeOutcome::Replayed => "replayed",
        }
    }
}

impl fmt::Display for ChangeOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a change was not applied. Except for [`ChangeError::HookAborted`] at
/// [`ChangePoint::AfterCommit`], nothing of the change is stored.
#[derive(Debug, thiserror::Error)]
pub enum ChangeError {
    /// The id was applied before with another item or delta (a caller reused an id for a
    /// different change); the first record stands.
    #[error("event id already applied with item {stored_item} and delta {stored_delta}")]
    Mismatch {
        /// Item of the recorded change.
        stored_item: i64,
        /// Delta of the recorded change.
        stored_delta: i64,
    },
    /// The change would take the item's units below 0.
    #[error("insufficient stock: {units} units")]
    Insufficient {
        /// Units in stock when the change was refused.
        units: i64,
    },
    /// No stock row for the item.
    #[error("no such item")]
    UnknownItem,
    /// The input breaks a rule of SPEC §9.
    #[error("invalid change: {0}")]
    Invalid(InvalidInput),
    /// The connection already has an open transaction; it was left untouched.
    #[error("the connection already has an open transaction")]
    InTransaction,
    /// The stock table's CHECK refused the new units (e.g. an integer overflow that SQLite
    /// would store as a REAL): an exception, not a business outcome.
    #[error("stock CHECK refused the update: {message}")]
    CheckViolation {
        /// SQLite's message.
        message: String,
    },
    /// A hook asked to stop at `point`; rolled back unless `point` is `after-commit`.
    #[error("stopped at {point}: {reason}")]
    HookAborted {
        /// Where.
        point: ChangePoint,
        /// Why.
        reason: String,
    },
    /// Any other SQLite error (e.g. `SQLITE_BUSY` after the busy timeout); rolled back.
    #[error("sqlite: {0}")]
    Database(#[from] rusqlite::Error),
}

impl ChangeError {
    /// A short name for transcripts: `mismatch`, `insufficient`, `unknown-item`,
    /// `invalid`, `in-transaction`, `check-violation`, `hook-aborted`, `busy` or
    /// `database-error`.
    pub fn kind(&self) -> &'static str {
        match self {
            ChangeError::Mismatch { .. } => "mismatch",
            ChangeError::Insufficient { .. } => "insufficient",
            ChangeError::UnknownItem => "unknown-item",
            ChangeError::Invalid(_) => "invalid",
            ChangeError::InTransaction => "in-transaction",
            ChangeError::CheckViolation { .. } => "check-violation",
            ChangeError::HookAborted { .. } => "hook-aborted",
            ChangeError::Database(error) if is_busy(error) => "busy",
            ChangeError::Database(_) => "database-error",
        }
    }
}

/// What is wrong with an input (SPEC §9's `Invalid`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidInput {
    /// `event_id` is the empty string.
    #[error("event_id is empty")]
    EmptyEventId,
    /// `event_id` has only whitespace.
    #[error("event_id is blank")]
    BlankEventId,
    /// `delta` is 0 (a change that changes nothing).
    #[error("delta is 0")]
    ZeroDelta,
    /// `|delta| > DELTA_LIMIT`.
    #[error("delta {0} is outside -1000..=1000")]
    DeltaOutOfRange(String),
    /// `item` is not a positive integer.
    #[error("item {0} is not a positive integer")]
    ItemOutOfRange(String),
    /// A field has the wrong JSON type (`"delta": "5"`, `1.5`, `true`, `null`).
    #[error("{field} must be {expected}, got {got}")]
    WrongType {
        /// The field.
        field: &'static str,
        /// What it must be.
        expected: &'static str,
        /// What it was, as JSON text.
        got: String,
    },
    /// A field is absent.
    #[error("{0} is missing")]
    MissingField(&'static str),
    /// A field that is not part of a change (refused rather than ignored, since a caller
    /// who sends it means something by it).
    #[error("unknown field {0:?}")]
    UnknownField(String),
    /// The input is not a JSON object.
    #[error("a change must be a JSON object, got {0}")]
    NotAnObject(String),
}

/// A change as the store takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// The event id, compared exactly.
    pub event_id: String,
    /// The item.
    pub item: i64,
    /// Units added (positive) or removed (negative).
    pub delta: i64,
}

impl Change {
    /// The change as the JSON object [`Store::apply_json`] takes.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({"event_id": self.event_id, "item": self.item, "delta": self.delta})
    }
}

/// The rules of SPEC §9 on `(event_id, item, delta)`.
///
/// Errors: the first rule broken.
pub fn validate(event_id: &str, item: i64, delta: i64) -> Result<(), InvalidInput> {
    if event_id.is_empty() {
        return Err(InvalidInput::EmptyEventId);
    }
    if event_id.trim().is_empty() {
        return Err(InvalidInput::BlankEventId);
    }
    if item < 1 {
        return Err(InvalidInput::ItemOutOfRange(item.to_string()));
    }
    if delta == 0 {
        return Err(InvalidInput::ZeroDelta);
    }
    if !(-DELTA_LIMIT..=DELTA_LIMIT).contains(&delta) {
        return Err(InvalidInput::DeltaOutOfRange(delta.to_string()));
    }
    Ok(())
}

/// Reads a change from a JSON object with exactly the fields `event_id` (a string),
/// `item` and `delta` (JSON integers: `5`, not `5.0`, `"5"`, `true` or `null`), and
/// validates it.
///
/// Errors: the first thing wrong.
pub fn parse_change(value: &serde_json::Value) -> Result<Change, InvalidInput> {
    let serde_json::Value::Object(fields) = value else {
        return Err(InvalidInput::NotAnObject(value.to_string()));
    };
    if let Some(unknown) = fields
        .keys()
        .find(|key| !matches!(key.as_str(), "event_id" | "item" | "delta"))
    {
        return Err(InvalidInput::UnknownField(unknown.clone()));
    }
    let event_id = match fields.get("event_id") {
        None => return Err(InvalidInput::MissingField("event_id")),
        Some(serde_json::Value::String(text)) => text.clone(),
        Some(other) => {
            return Err(InvalidInput::WrongType {
                field: "event_id",
                expected: "a string",
                got: other.to_string(),
            });
        }
    };
    let item = json_integer(fields.get("item"), "item")?;
    let delta = json_integer(fields.get("delta"), "delta")?;
    let item = i64::try_from(item).map_err(|_| InvalidInput::ItemOutOfRange(item.to_string()))?;
    let delta =
        i64::try_from(delta).map_err(|_| InvalidInput::DeltaOutOfRange(delta.to_string()))?;
    validate(&event_id, item, delta)?;
    Ok(Change {
        event_id,
        item,
        delta,
    })
}

/// A JSON integer (any size serde_json can hold exactly), widened to i128.
fn json_integer(
    value: Option<&serde_json::Value>,
    field: &'static str,
) -> Result<i128, InvalidInput> {
    let value = value.ok_or(InvalidInput::MissingField(field))?;
    let integer = match value {
        serde_json::Value::Number(number) => number
            .as_i64()
            .map(i128::from)
            .or_else(|| number.as_u64().map(i128::from)),
        _ => None,
    };
    integer.ok_or_else(|| InvalidInput::WrongType {
        field,
        expected: "an integer",
        got: value.to_string(),
    })
}

/// A named point inside [`Store::apply_change_with_hooks`], in the order a successful
/// change passes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ChangePoint {
    /// The `applied_change` row is inserted (uncommitted); stock not touched yet.
    EventWritten,
    /// The stock row is updated too (uncommitted).
    StockUpdated,
    /// Immediately before `COMMIT`.
    BeforeCommit,
    /// `COMMIT` returned; the change is durable; the caller has not been told yet.
    AfterCommit,
}

impl ChangePoint {
    /// All points, in order.
    pub const ALL: [ChangePoint; 4] = [
        ChangePoint::EventWritten,
        ChangePoint::StockUpdated,
        ChangePoint::BeforeCommit,
        ChangePoint::AfterCommit,
    ];

    /// `"event-written"`, `"stock-updated"`, `"before-commit"` or `"after-commit"`.
    pub fn as_str(self) -> &'static str {
        match self {
            ChangePoint::EventWritten => "event-written",
            ChangePoint::StockUpdated => "stock-updated",
            ChangePoint::BeforeCommit => "before-commit",
            ChangePoint::AfterCommit => "after-commit",
        }
    }

    /// Whether a change stopped here is committed.
    pub fn is_committed(self) -> bool {
        self == ChangePoint::AfterCommit
    }
}

impl fmt::Display for ChangePoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ChangePoint {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        ChangePoint::ALL
            .into_iter()
            .find(|point| point.as_str() == text)
            .ok_or_else(|| {
                format!(
                    "unknown hook point {text:?}; one of event-written, stock-updated, before-commit, after-commit"
                )
            })
    }
}

/// A hook's request to stop the change where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookAbort {
    /// Why, for the error message.
    pub reason: String,
}

impl HookAbort {
    /// A stop request with `reason`.
    pub fn new(reason: impl Into<String>) -> HookAbort {
        HookAbort {
            reason: reason.into(),
        }
    }
}

/// Called at each [`ChangePoint`] a change reaches (the crash-worker stops at one).
pub trait ChangeHooks {
    /// `Err` stops the change there (rolled back, unless after COMMIT).
    fn at(&self, point: ChangePoint) -> Result<(), HookAbort>;
}

/// Hooks that do nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoHooks;

impl ChangeHooks for NoHooks {
    fn at(&self, _point: ChangePoint) -> Result<(), HookAbort> {
        Ok(())
    }
}

impl<F: Fn(ChangePoint) -> Result<(), HookAbort>> ChangeHooks for F {
    fn at(&self, point: ChangePoint) -> Result<(), HookAbort> {
        self(point)
    }
}
