//! Family S: an idempotent inventory on an SQLite file (SPEC §9).
//!
//! Each case gets its own database file in the run's folder (`Engine::SqliteFile`; no
//! PostgreSQL is started for this family). Every case is a case file in
//! `cases/inventory/specs/` (`sNN_<what>.spec` is the case `SNN`), run by the spec runner
//! on an SQLite file as its engine ([`spec_engine`]): their SQL runs on the file, their
//! calls are the store's operations, a crash-worker in SQLite mode and its SIGKILL, and
//! S6's writers in 4 processes ([`writers`]).
//!
//! Adding a case: a file `cases/inventory/specs/sNN_<what>.spec` (found at start-up, no
//! registration, no rebuild; `docs/specs.md`, "An engine other than PostgreSQL"), then
//! `./run.sh --accept SNN` writes its snapshot `evidence/snapshots/S/SNN.snap` for review;
//! commit both. A case that changes stock behind the store's back (other than on
//! purpose, then `clean: no`) would make S10 report its file.

use case_kit::{Engine, Family};
use inventory_store::{ChangeError, ChangeOutcome};

pub mod spec_engine;
pub mod verbs;
pub mod writers;

/// The family: S1–S10, each a case file on an SQLite file of its own.
pub fn family() -> Family {
    Family {
        prefix: "S",
        title: "idempotent inventory on an SQLite file (SPEC §9)",
        engine: Engine::SqliteFile,
        // The case files of `specs/`, read now (`spec_engine`).
        cases: spec_engine::cases(),
        extras: Vec::new(),
        verbs: verbs::ALL.to_vec(),
    }
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
