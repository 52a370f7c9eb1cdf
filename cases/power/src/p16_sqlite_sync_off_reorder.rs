//! P16 — negative control: SQLite with a rollback journal and `synchronous=OFF` under
//! `reorder` and strict names loses acknowledged changes or corrupts the file.
//! Claim: P15's cuts with `journal_mode=DELETE` and `synchronous=OFF` (SQLite docs,
//! "PRAGMA synchronous": with OFF "the database might become corrupted if the operating
//! system crashes or the computer loses power"); nothing is synced, so the database's
//! pages, the journal and its unlink reach the disk block by block in any order: over
//! the cuts acknowledged changes are lost or `integrity_check` fails — counted, each
//! cut's seed in the run record. Under `drop` (P7) the file only loses changes.
//! Fails if: no cut loses or damages anything (a test runs it with `synchronous=EXTRA`
//! and sees it fail).
//!
//! ```text
//! per cut   as P15 with journal_mode=delete synchronous=off (11 changes acknowledged)
//! checks    cuts losing or damaged ≥ 1 (counted)
//! ```
//!
//! Rust, not a file: P15's loop (`models.rs`).

use futures_util::FutureExt;

use case_kit::{Case, Ctx};
use forgetful_fs::{Model, Names};

use crate::models::{self, System};

/// What the control exposes (its `negative control exposes:` check).
pub const ANOMALY: &str = "acknowledged changes lost or the file corrupted by a power cut under reorder";

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "P16",
        "negative control: SQLite rollback journal synchronous=OFF under reorder loses or corrupts",
        |ctx| run(ctx, "off").boxed(),
    )
    .not_clean()
}

/// P16's body with `synchronous` as given (`off` as the case runs; the control test
/// runs it with `extra`, where its fault cannot happen).
///
/// Errors: as `models::run_cuts`.
pub async fn run(ctx: &mut Ctx, synchronous: &'static str) -> anyhow::Result<()> {
    let system = System::Sqlite {
        journal_mode: "delete",
        synchronous,
    };
    let outcomes = models::run_cuts(ctx, system, Model::Reorder, Names::Strict).await?;
    models::control_claims(ctx, &outcomes, ANOMALY);
    Ok(())
}
