//! I8 — the server killed inside a placement (F12's claim, with InnoDB's crash recovery).
//! Claim: when `mariadbd` is killed with SIGKILL while a placement's transaction has
//! frozen the funds but not committed, InnoDB's crash recovery on restart rolls the
//! transaction back from its undo log and keeps everything committed before (redo log,
//! `innodb_flush_log_at_trx_commit=1`): no half-written placement, and the client's
//! retry with the same business id freezes once.
//! Setup: alice deposits 20 000 USDT (committed). A hook holds the placement (BUY 1.0 @
//! 5000) at `balances-updated`; the case kills the server (SIGKILL, a new process starts
//! on the same data and port), then lets the placement go on its dead connection.
//! Checks: the held placement fails; after recovery the records equal those after the
//! deposit (the deposit kept, nothing of the placement); the retry executes and freezes
//! 5005 once; the invariant. Runs alone (it restarts the family's server).
//! Fails if: a trace of the placement survives, the deposit is lost, or the retry
//! replays or freezes twice.

use std::sync::Arc;

use case_kit::{Case, Ctx, Schedule};
use frozen_balances::{Asset, EventKind, HookPoint, NoHooks};
use frozen_balances_innodb::{Tally, query};
use futures_util::FutureExt;

use crate::fixtures::{alice_buy, Db, Gate, deposit, invariant, line};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "I8",
        "server killed (SIGKILL) inside a placement: crash recovery keeps the deposit, drops the placement",
        |ctx| run(ctx).boxed(),
    )
    .schedule(Schedule::Exclusive)
}

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let db = Db::open(ctx).await?;
    let mut conn = db.connect().await?;
    deposit(&mut conn, "dep-i801", "alice", Asset::Usdt, 20_000).await?;
    let before = query::recorded(&mut conn).await?;
    let req = alice_buy("place-i801")?;
    let gate = Arc::new(Gate::new(EventKind::Place, HookPoint::BalancesUpdated));
    let mut held_conn = db.connect().await?;
    let (held, held_req) = (gate.clone(), req.clone());
    let placing = tokio::spawn(async move {
        frozen_balances_innodb::place(&mut held_conn, &held_req, held.as_ref(), &Tally::default())
            .await
    });
    gate.reached().await;
    let (old, new) = tokio::task::spawn_blocking(crate::server::kill_and_restart).await??;
    ctx.check(
        "mariadbd killed with SIGKILL and started again (another process)",
        old != new && !std::path::Path::new(&format!("/proc/{old}")).exists(),
        "",
    );
    gate.release();
    let placed = placing.await?;
    ctx.check(
        "the held placement fails (its connection died with the server)",
        placed.is_err(),
        placed
            .as_ref()
            .map_or("error".into(), |r| r.outcome.as_str().to_string()),
    );
    let mut conn = db.connect().await?;
    ctx.check(
        "after crash recovery: the deposit kept, nothing of the placement",
        query::recorded(&mut conn).await? == before,
        query::counts(&mut conn).await?,
    );
    let retry = frozen_balances_innodb::place(&mut conn, &req, &NoHooks, &Tally::default()).await?;
    ctx.check_eq(
        "the retry with the same id executes and freezes once",
        "OK replayed=false available=14995.000000 frozen=5005.000000".to_string(),
        format!(
            "{} replayed={} {}",
            retry.outcome.as_str(),
            retry.replayed,
            line(&mut conn, "alice", Asset::Usdt).await?
        ),
    );
    invariant(ctx, &mut conn).await?;
    Ok(())
}
