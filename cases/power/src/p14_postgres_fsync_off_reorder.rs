//! P14 — negative control: PostgreSQL with `fsync=off` under `reorder` and strict
//! names loses or damages what it acknowledged.
//! Claim: P13's cuts with `fsync=off` (PostgreSQL docs 20.5.1: with fsync off "an
//! operating system crash or power failure … can result in unrecoverable data
//! corruption"). Nothing is ever synced, so at each cut the WAL of the acknowledged
//! debits, the pages and `pg_control` the `CHECKPOINT` under the load wrote are all
//! unsynced, each block kept or lost on its own: over the cuts acknowledged debits are
//! lost or the cluster is damaged (recovery fails, amcheck or the reconciliation finds
//! something) — counted per cut, each cut's seed in the run record. Under `drop` the
//! same cut keeps a consistent old state (P2: recovery ok, reconciliation clean).
//! Fails if: no cut loses or damages anything (the control proved nothing; a test runs
//! it with `fsync=on` and sees it fail).
//!
//! ```text
//! per cut   as P13 with fsync=off (nothing synced; no sync to hold)
//! checks    cuts losing or damaged ≥ 1 (counted)
//! ```
//!
//! Rust, not a file: P13's loop (`models.rs`).

use futures_util::FutureExt;

use case_kit::{Case, Ctx};
use forgetful_fs::{Model, Names};

use crate::models::{self, System};

/// What the control exposes (its `negative control exposes:` check).
pub const ANOMALY: &str = "acknowledged debits lost or the cluster damaged by a power cut under reorder";

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "P14",
        "negative control: fsync=off under reorder loses or damages acknowledged debits",
        |ctx| run(ctx, false).boxed(),
    )
    .not_clean()
    .schedule(case_kit::Schedule::Exclusive)
}

/// P14's body with `fsync` as given (`false` as the case runs; the control test runs
/// it with `true`, where its fault cannot happen, and sees the exposes check fail).
///
/// Errors: as `models::run_cuts`.
pub async fn run(ctx: &mut Ctx, fsync: bool) -> anyhow::Result<()> {
    let system = System::Postgres { fsync };
    let outcomes = models::run_cuts(ctx, system, Model::Reorder, Names::Strict).await?;
    models::control_claims(ctx, &outcomes, ANOMALY);
    Ok(())
}
