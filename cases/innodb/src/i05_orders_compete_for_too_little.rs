//! I5 — orders competing for too little on InnoDB (F5's claim).
//! Claim: the conditional freeze (`UPDATE … WHERE available >= amount`, one row matched
//! or none) decides "enough?" on the latest committed row, whatever the REPEATABLE READ
//! snapshot says: of four placements that each need 5005 USDT of alice's 10 000, the
//! one that holds the row lock freezes and the three that waited for it are refused
//! INSUFFICIENT; available never goes below 0.
//! Setup: alice deposits 10 000 USDT. A hook holds the first placement (BUY 1.0 @ 5000)
//! at `balances-updated`, alice's USDT row locked; three more placements of the same
//! order under their own ids start; the case waits until InnoDB shows the three waiting
//! (`INNODB_TRX`), then lets the first commit.
//! Checks: three waiters observed; outcomes OK + 3 × INSUFFICIENT, each refusal reporting
//! 4995 available; alice 4995 available, 5005 frozen; one order; the invariant.
//! Fails if: a second freeze succeeds, a refusal reports a stale available, or the
//! waiters are not observed.

use std::sync::Arc;

use case_kit::{Case, Ctx};
use frozen_balances::{Asset, EventKind, HookPoint, NoHooks};
use frozen_balances_innodb::Tally;
use futures_util::FutureExt;

use crate::fixtures::{alice_buy, Db, Gate, deposit, invariant, line};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "I5",
        "orders competing for too little on InnoDB: one freeze, the waiters refused on the latest row",
        |ctx| run(ctx).boxed(),
    )
    .connections(6)
}

const LATER: usize = 3;

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let db = Db::open(ctx).await?;
    let mut conn = db.connect().await?;
    deposit(&mut conn, "dep-i501", "alice", Asset::Usdt, 10_000).await?;
    let gate = Arc::new(Gate::new(EventKind::Place, HookPoint::BalancesUpdated));
    let first_req = alice_buy("place-i501")?;
    let mut first_conn = db.connect().await?;
    let held = gate.clone();
    let first = tokio::spawn(async move {
        frozen_balances_innodb::place(
            &mut first_conn,
            &first_req,
            held.as_ref(),
            &Tally::default(),
        )
        .await
    });
    gate.reached().await;
    let mut later = Vec::new();
    for i in 0..LATER {
        let req = alice_buy(&format!("place-i50{}", i + 2))?;
        let mut c = db.connect().await?;
        later.push(tokio::spawn(async move {
            frozen_balances_innodb::place(&mut c, &req, &NoHooks, &Tally::default()).await
        }));
    }
    let waited = db.wait_for_lock_waiters(&mut conn, LATER as i64).await;
    ctx.check(
        "the three later placements wait for alice's USDT row (INNODB_TRX: LOCK WAIT)",
        waited.is_ok(),
        waited.map_or_else(|e| e.to_string(), |()| "3 sessions waiting".into()),
    );
    gate.release();
    let mut outcomes = vec![first.await??];
    for task in later {
        outcomes.push(task.await??);
    }
    let text: Vec<String> = outcomes
        .iter()
        .map(|r| format!("{}@{}", r.outcome.as_str(), r.available))
        .collect();
    ctx.check_eq(
        "outcomes with the available each reports: OK, then three INSUFFICIENT at 4995",
        "OK@4995000000 INSUFFICIENT@4995000000 INSUFFICIENT@4995000000 INSUFFICIENT@4995000000"
            .to_string(),
        text.join(" "),
    );
    ctx.check_eq(
        "alice USDT: one freeze",
        "available=4995.000000 frozen=5005.000000".to_string(),
        line(&mut conn, "alice", Asset::Usdt).await?,
    );
    invariant(ctx, &mut conn).await?;
    Ok(())
}
