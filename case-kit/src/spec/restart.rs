//! A database crash in a spec (our format): `restart immediate: REASON` stops the
//! scratch cluster in immediate mode (no checkpoint: a crash) once every permutation
//! has run, and starts it again (WAL recovery); `after restart: SQL` and
//! `after restart call: OP …` then run, in order, on a new connection, their results
//! printed, before the expectations. The case declares it restarts the server
//! ([`crate::Case::restarts_server`] with REASON), so it runs alone, and a run on an
//! existing server lists it as not run with that reason.
//!
//! The runner checks the crash itself: a connection opened before the restart must be
//! closed after it (`connections from before the crash are closed`). What a case needs
//! from before the crash (an xid, an LSN, the postmaster's start time) it keeps in a
//! table of its own database, which survives the crash as any committed row does.

use std::time::Duration;

use super::engine::{Opening, SpecEngine};
use super::model::Spec;
use super::play::act;
use crate::ctx::Ctx;

/// Longest time spent connecting after the restart (recovery may still run); it only
/// stops a hang.
pub const RECONNECT_LIMIT_MS: u64 = 30_000;

/// Pause between connection attempts after the restart.
const RECONNECT_PAUSE_MS: u64 = 100;

/// Restarts the cluster in immediate mode, checks that an old connection is gone, then
/// runs the spec's `after restart` actions (see the module documentation).
///
/// Errors: the restart fails, or no connection is accepted within
/// [`RECONNECT_LIMIT_MS`].
pub async fn run(ctx: &mut Ctx, spec: &Spec, engine: &dyn SpecEngine) -> anyhow::Result<()> {
    let old = ctx.connect().await?;
    ctx.restart_cluster_immediate().await?;
    ctx.note("immediate stop and start: WAL recovery");
    let gone = old.simple_query("SELECT 1").await.is_err();
    ctx.check(
        "connections from before the crash are closed",
        gone,
        if gone { "closed" } else { "still open" },
    );
    if spec.after_restart.is_empty() {
        return Ok(());
    }
    // Accepted again once recovery is over; the actions run on the engine's own
    // connection.
    drop(reconnect(ctx).await?);
    let mut db = engine.connect(ctx, Opening::plain(1, spec.layout)).await?;
    for action in &spec.after_restart {
        let outcome = act(db.as_mut(), action).await;
        ctx.note(format!("after restart: {}", action.display()));
        for line in outcome {
            ctx.note(format!("  {line}"));
        }
    }
    Ok(())
}

/// A new connection to the case's database after a crash, retried every
/// `RECONNECT_PAUSE_MS` while recovery may still refuse it.
///
/// Errors: no connection accepted within [`RECONNECT_LIMIT_MS`] (a hang bound only).
pub async fn reconnect(ctx: &Ctx) -> anyhow::Result<tokio_postgres::Client> {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(RECONNECT_LIMIT_MS);
    loop {
        match ctx.connect().await {
            Ok(client) => return Ok(client),
            Err(error) if tokio::time::Instant::now() >= deadline => {
                return Err(error.context("no connection after the restart"));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(RECONNECT_PAUSE_MS)).await,
        }
    }
}
