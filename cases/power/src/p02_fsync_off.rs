//! P2 — negative control: the same power cut with `fsync=off` loses acknowledged debits.
//! Claim: as P1 but the server runs with `fsync=off` (PostgreSQL docs 20.5.1: "can
//! result in unrecoverable data corruption … in the event of a power failure"): the WAL
//! of the acknowledged debits never reached the disk, so after the cut acknowledged
//! debits are gone (counted; their keys are in the run record) or the cluster is damaged
//! (recovery fails, reconciliation or amcheck finds it).
//! Fails if: nothing acknowledged is lost and the cluster is sound (the control proved
//! nothing). A test runs the same body with `fsync=on` and sees this check fail.

use futures_util::FutureExt;

use case_kit::{Case, Ctx};

use crate::durability;

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "P2",
        "negative control: fsync=off loses acknowledged debits in a power cut",
        |ctx| run(ctx).boxed(),
    )
    .not_clean()
    // Alone: a cluster on a single-threaded FUSE daemon and 32 clients are slow enough
    // without another case's load beside them.
    .schedule(case_kit::Schedule::Exclusive)
}

/// The body: P2's checks on a cluster with `fsync=off`.
///
/// Errors: as [`durability::run_with`].
pub async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    run_with(ctx, "off").await
}

/// P2's checks on a cluster with `fsync` (a test passes `on`: the control must fail).
///
/// Errors: as [`durability::run_with`].
pub async fn run_with(ctx: &mut Ctx, fsync: &str) -> anyhow::Result<()> {
    durability::run_with(ctx, durability::Config::FsyncOff, fsync).await
}
