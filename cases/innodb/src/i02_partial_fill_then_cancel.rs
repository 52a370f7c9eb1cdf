//! I2 — partial fill then cancel on InnoDB (F2's claim).
//! Claim: after a partial fill, a cancel releases exactly the order's remainder (its
//! freeze minus what the fill consumed and returned); the cancelled order holds nothing;
//! the cancel sent again replays; a new cancel of the closed order records ORDER_CLOSED
//! and moves nothing.
//! Setup: alice deposits 10 000 USDT, bob 1 BTC; alice BUY 1.0 @ 5000, bob SELL 0.4 @
//! 4900; fill 0.4 @ 4900; alice cancels.
//! Checks: released 3003 USDT (5005 − 2002 taken by the fill); alice 8038.04 available
//! (10 000 − 1960 − fee 1.96) and 0 frozen; the replay; ORDER_CLOSED; the invariant.
//! Fails if: the release differs from the remainder, the closed order holds anything, or
//! a second cancel moves funds.

use case_kit::{Case, Ctx};
use frozen_balances::{Asset, Outcome};
use futures_util::FutureExt;

use crate::fixtures::{Db, two_orders, cancel, fill, fill_request, invariant, line};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "I2",
        "partial fill then cancel on InnoDB: the remainder released once, the closed order holds nothing",
        |ctx| run(ctx).boxed(),
    )
}

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let db = Db::open(ctx).await?;
    let mut conn = db.connect().await?;
    let (buy_id, sell_id) = two_orders(&mut conn, "i2", "0.4").await?;
    fill(
        &mut conn,
        &fill_request("fill-i201", buy_id, sell_id, "0.4", "4900")?,
    )
    .await?;
    ctx.note(format!(
        "after the fill: alice USDT {}",
        line(&mut conn, "alice", Asset::Usdt).await?
    ));
    let cancelled = cancel(&mut conn, "cancel-i201", "alice", buy_id).await?;
    ctx.check_eq(
        "the cancel releases the remainder: 5005 − 2002 taken by the fill = 3003 USDT",
        3_003_000_000,
        cancelled.released,
    );
    ctx.check_eq(
        "alice USDT after the cancel: 10000 − 1960 − fee 1.96",
        "available=8038.040000 frozen=0.000000".to_string(),
        line(&mut conn, "alice", Asset::Usdt).await?,
    );
    let again = cancel(&mut conn, "cancel-i201", "alice", buy_id).await?;
    ctx.check(
        "the cancel sent again replays",
        again.replayed && again.released == cancelled.released,
        format!("replayed={} released={}", again.replayed, again.released),
    );
    let late = cancel(&mut conn, "cancel-i202", "alice", buy_id).await?;
    ctx.check_eq(
        "a new cancel of the closed order: ORDER_CLOSED, nothing released",
        "ORDER_CLOSED 0".to_string(),
        format!("{} {}", late.outcome.as_str(), late.released),
    );
    ctx.check(
        "the first cancel's outcome was OK",
        cancelled.outcome == Outcome::Ok,
        cancelled.outcome.as_str(),
    );
    invariant(ctx, &mut conn).await?;
    Ok(())
}
