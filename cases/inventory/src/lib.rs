//! Family S: an idempotent inventory on an SQLite file (SPEC §9), one file per case.
//!
//! Each case gets its own database file in the run's folder (`Engine::SqliteFile`; no
//! PostgreSQL is started for this family) and drives the store of the `inventory-store`
//! crate directly, or through the crash-worker's SQLite mode when a second process is the
//! point (S5 kills one, S6 races four, S7 replays from a new one).
//!
//! Adding a case: copy a short one (S1), give it its id, title, claim and checks, add its
//! module name as one line to `register_cases!` below, then `./run.sh --accept SNN` writes
//! its snapshot `evidence/snapshots/S/SNN.snap` for review; commit both. A case that
//! changes stock behind the store's back (other than on purpose, then `.not_clean()`)
//! would make S10 report its file.

use std::path::{Path, PathBuf};

use case_kit::{Ctx, Engine, Family};
use inventory_store::{ChangeError, ChangeOutcome, Store};

// One line per case, in id order. The negative controls S6, S8 and S9 are public so that
// a test can run them with the guard in the naive slot and see them fail.
case_kit::register_cases! {
    s01_three_kinds_of_input,
    s02_failure_leaves_key_free,
    s03_bad_input,
    s04_two_key_policies,
    s05_killed_mid_change,
    pub s06_many_writers,
    s07_replay_after_restart,
    pub s08_insert_or_replace,
    pub s09_integer_affinity,
    s10_reconciliation,
}

/// The item every case works on (SPEC §9: "item 1 starts at 100 units").
pub const ITEM: i64 = 1;
/// Units of [`ITEM`] when a case starts.
pub const START_UNITS: i64 = 100;

/// The family: S1–S10 on one SQLite file each.
pub fn family() -> Family {
    Family {
        prefix: "S",
        title: "idempotent inventory on an SQLite file (SPEC §9)",
        engine: Engine::SqliteFile,
        cases: cases(),
        extras: Vec::new(),
    }
}

/// Opens `path` (creating it with the store's schema) and adds `item` with `units`.
///
/// Errors: the file cannot be opened or the item exists.
pub fn open_with_item(path: &Path, item: i64, units: i64) -> anyhow::Result<Store> {
    let store = Store::open(path)?;
    store.add_item(item, units)?;
    Ok(store)
}

/// The case's own file, opened, with [`ITEM`] at [`START_UNITS`]; records the SQLite
/// version in the run record.
///
/// Errors: as [`open_with_item`].
pub fn seeded_store(ctx: &mut Ctx) -> anyhow::Result<Store> {
    ctx.record(
        "sqlite_version",
        serde_json::Value::from(inventory_store::sqlite_version()),
    );
    open_with_item(&ctx.sqlite_path(), ITEM, START_UNITS)
}

/// Another file next to the case's own, `<own file's stem>-<name>.db` (`S4-recorded.db`),
/// for a second story in the same case (removed with the run like the case's own; not
/// reconciled by S10).
pub fn sibling_file(ctx: &Ctx, name: &str) -> PathBuf {
    let own = ctx.sqlite_path();
    let stem = own.file_stem().map_or_else(
        || ctx.case_id().to_string(),
        |stem| stem.to_string_lossy().into_owned(),
    );
    own.with_file_name(format!("{stem}-{name}.db"))
}

/// Removes `path` and its `-wal`, `-shm` and `-journal` companions, if present.
///
/// Errors: a file exists but cannot be removed.
pub fn remove_database_files(path: &Path) -> anyhow::Result<()> {
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let mut file = path.as_os_str().to_owned();
        file.push(suffix);
        match std::fs::remove_file(&file) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => return Err(error.into()),
            _ => {}
        }
    }
    Ok(())
}

/// The outcome as the transcript shows it: `applied`, `replayed`, or the error's kind
/// with its reason (`invalid: delta is 0`).
pub fn outcome_text(result: &Result<ChangeOutcome, ChangeError>) -> String {
    match result {
        Ok(outcome) => outcome.to_string(),
        Err(ChangeError::Invalid(reason)) => format!("invalid: {reason}"),
        Err(ChangeError::Mismatch {
            stored_item,
            stored_delta,
        }) => format!("mismatch: recorded item={stored_item} delta={stored_delta}"),
        Err(ChangeError::Insufficient { units }) => format!("insufficient: units={units}"),
        Err(error @ ChangeError::Database(inner)) => {
            format!("{}: {}", error.kind(), inventory_store::code_name(inner))
        }
        Err(error) => error.kind().to_string(),
    }
}

/// The short outcome word only: `applied`, `replayed`, `insufficient`, `invalid`, ….
pub fn outcome_kind(result: &Result<ChangeOutcome, ChangeError>) -> String {
    match result {
        Ok(outcome) => outcome.to_string(),
        Err(error) => error.kind().to_string(),
    }
}

/// Units of `item`, or -1 when it has none (shown as a figure, so a missing row is seen).
///
/// Errors: a database error.
pub fn units_of(store: &Store, item: i64) -> anyhow::Result<i64> {
    Ok(store.units(item)?.unwrap_or(-1))
}

/// Rows of `applied_change` for `event_id` (0 or 1; exact comparison).
///
/// Errors: a database error.
pub fn rows_for(store: &Store, event_id: &str) -> anyhow::Result<i64> {
    Ok(store.connection().query_row(
        "SELECT count(*) FROM applied_change WHERE event_id = ?1",
        [event_id],
        |row| row.get(0),
    )?)
}
