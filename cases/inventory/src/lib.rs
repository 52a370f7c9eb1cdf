//! Family S: an idempotent inventory on an SQLite file (SPEC §9).
//!
//! Each case gets its own database file in the run's folder (`Engine::SqliteFile`; no
//! PostgreSQL is started for this family). S1–S5 and S7–S10 are case files in
//! `cases/inventory/specs/` (`sNN_<what>.spec` is the case `SNN`), run by the spec runner
//! on an SQLite file as its engine ([`spec_engine`]): their SQL runs on the file, their
//! calls are the store's operations, a crash-worker in SQLite mode and its SIGKILL. S6
//! (32 connections in 4 processes released by a start file, and a control that counts
//! SQLite's busy-handler calls) stays Rust.
//!
//! Adding a case: a file `cases/inventory/specs/sNN_<what>.spec` (found at start-up, no
//! registration, no rebuild; `docs/specs.md`, "An engine other than PostgreSQL"), then
//! `./run.sh --accept SNN` writes its snapshot `evidence/snapshots/S/SNN.snap` for review;
//! commit both. A case that changes stock behind the store's back (other than on
//! purpose, then `clean: no`) would make S10 report its file.

use std::path::Path;

use case_kit::{Ctx, Engine, Family};
use inventory_store::{ChangeError, ChangeOutcome, Store};

pub mod spec_engine;

// The Rust case: S6's forced control is public so that a test can run it with B committing
// first and see it fail.
case_kit::register_cases! {
    pub s06_many_writers,
}

/// The item every case works on (SPEC §9: "item 1 starts at 100 units").
pub const ITEM: i64 = 1;
/// Units of [`ITEM`] when a case starts.
pub const START_UNITS: i64 = 100;

/// The family: S1–S10 on one SQLite file each (S6 in Rust, the others case files).
pub fn family() -> Family {
    Family {
        prefix: "S",
        title: "idempotent inventory on an SQLite file (SPEC §9)",
        engine: Engine::SqliteFile,
        // The hand-written cases, then the case files of `specs/` (`spec_engine`).
        cases: cases().into_iter().chain(spec_engine::cases()).collect(),
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
