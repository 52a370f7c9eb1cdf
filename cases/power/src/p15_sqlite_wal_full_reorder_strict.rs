//! P15 — SQLite WAL with `synchronous=FULL` under `reorder` and strict names: a seeded
//! set of cuts, none loses an acknowledged change or damages the file.
//! Claim: on each cut's fresh disk a crash-worker applies 10 acknowledged changes and
//! holds its connection (no checkpoint); with the disk's syncs held a second worker
//! starts an 11th change, seen held between its WAL write and its sync; the power goes
//! there. In every cut the 10 acknowledged changes are in the file, `integrity_check`
//! says ok and the units agree (SQLite docs, "PRAGMA synchronous": FULL syncs the WAL
//! at every commit; the WAL's directory is synced when it is created).
//! Fails if: a cut held no sync, an acknowledged change is lost, or the file is damaged,
//! in any cut (its seed noted).
//!
//! ```text
//! per cut   fresh disk (reorder+strict, seed_i); 10 changes acknowledged, held open
//! cut       hold syncs; 11th change's sync seen held → freeze, SIGKILL both, cut
//! checks    every cut: held ≥ 1, lost 0, integrity_check ok, reconcile clean
//! ```
//!
//! Rust, not a file: a seeded set of cuts (`models.rs`).

use futures_util::FutureExt;

use case_kit::{Case, Ctx};
use forgetful_fs::{Model, Names};

use crate::models::{self, System};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "P15",
        "SQLite WAL synchronous=FULL under reorder with strict names: no cut loses an acknowledged change",
        |ctx| run(ctx).boxed(),
    )
    .not_clean()
}

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let system = System::Sqlite {
        journal_mode: "wal",
        synchronous: "full",
    };
    let outcomes = models::run_cuts(ctx, system, Model::Reorder, Names::Strict).await?;
    models::durable_claims(ctx, &outcomes, "change");
    Ok(())
}
