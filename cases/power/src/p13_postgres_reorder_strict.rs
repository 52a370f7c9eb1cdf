//! P13 — PostgreSQL with `fsync=on` under `reorder` and strict names: a seeded set of
//! cuts (5 by default, `--cuts N`), none loses an acknowledged debit.
//! Claim: on each cut's fresh disk (each unsynced 4 KiB block kept or lost from the
//! cut's seed; a name durable only once its directory is synced) 16 clients debit
//! through `ledger-svc`; a `CHECKPOINT` runs under the load; once 48 debits were
//! acknowledged the disk's syncs are held until a commit is seen held between its WAL
//! write and its sync, and the power goes there (freeze, SIGKILL, cut). In every cut
//! crash recovery succeeds, every acknowledged debit is present, no key has two
//! transactions, the ledger reconciles and `bt_index_check` finds nothing.
//! Fails if: a cut held no sync (it would test no commit in flight), recovery fails,
//! an acknowledged debit is lost, or a check finds damage, in any cut (its seed noted).
//!
//! ```text
//! per cut   fresh disk (reorder+strict, seed_i); ledger; 16 clients; CHECKPOINT at 24
//! cut       at 48 acknowledged: hold syncs → one held → freeze, SIGKILL, cut, recover
//! checks    every cut: held ≥ 1, recovery ok, lost 0, reconcile and amcheck clean
//! ```
//!
//! Rust, not a file: a seeded set of cuts, each on a fresh disk, is a loop no verb
//! has (`models.rs`).

use futures_util::FutureExt;

use case_kit::{Case, Ctx};
use forgetful_fs::{Model, Names};

use crate::models::{self, System};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "P13",
        "fsync=on under reorder with strict names: no cut of a seeded set loses an acknowledged debit",
        |ctx| run(ctx).boxed(),
    )
    .not_clean()
    .schedule(case_kit::Schedule::Exclusive)
}

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let system = System::Postgres { fsync: true };
    let outcomes = models::run_cuts(ctx, system, Model::Reorder, Names::Strict).await?;
    models::durable_claims(ctx, &outcomes, "debit");
    Ok(())
}
