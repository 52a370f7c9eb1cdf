//! F2 — partial fill, then cancel.
//! Claim: a cancel releases exactly the order's remainder, computed from its freeze
//! record (original − consumed − released), and a repeated cancel replays without moving
//! anything.
//! Setup: alice deposits 10 000 USDT, bob 2 BTC. alice BUY 1.0 @ 5000 (frozen 5005), bob
//! SELL 0.4 @ 5000; fill 0.4 @ 5000; alice cancels her order; the same cancel again.
//! Checks: frozen 3003 after the fill; the cancel releases 3003 → frozen 0, available
//! 7998, BTC 0.4; the repeated cancel is replayed with the same body and nothing moves.
//! Fails if: any figure differs, the second cancel is not a replay, or anything moves.

use case_kit::{Case, Ctx};
use frozen_balances::{Asset, DEFAULT_TENANT};
use futures_util::FutureExt;
use launch::service::{Reply, Service, ServiceOptions};

use super::spot::{SpotCalls, SpotReply, asset_sums, balance_line, place, recorded, spot_service};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "F2",
        "partial fill, then cancel: the remainder is released once",
        |ctx| run(ctx).boxed(),
    )
    .connections(POOL_SIZE as u32 + 2)
}

const POOL_SIZE: usize = 2;

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let service = Service::start(
        ctx,
        spot_service(ServiceOptions {
            pool_size: POOL_SIZE,
            ..ServiceOptions::default()
        }),
    )
    .await?;
    let db = ctx.connect().await?;
    let t = DEFAULT_TENANT;
    service
        .deposit(t, "dep-0201", "alice", "USDT", "10000")
        .await?;
    service.deposit(t, "dep-0202", "bob", "BTC", "2").await?;
    let b = place_and_fill(ctx, &service, &db).await?;
    let cancelled = cancel_releases_remainder(ctx, &service, &db, b).await?;
    repeated_cancel_replays(ctx, &service, &db, b, &cancelled).await?;
    let mut client = ctx.connect().await?;
    ctx.check_eq(
        "per-asset sums",
        "BTC=0.00000000 USDT=0.000000".to_string(),
        asset_sums(&mut client).await?,
    );
    service.stop_checked(ctx).await?;
    Ok(())
}

/// alice BUY 1.0 @ 5000, bob SELL 0.4 @ 5000, one fill of 0.4: checks alice's USDT
/// after the placement and after the fill. Returns alice's order id.
///
/// Errors: transport or database errors; a placement without an order id.
async fn place_and_fill(
    ctx: &mut Ctx,
    service: &Service,
    db: &tokio_postgres::Client,
) -> anyhow::Result<i64> {
    let t = DEFAULT_TENANT;
    let buy = place(service, "place-0201", "alice", "BUY", "1.0", "5000").await?;
    let sell = place(service, "place-0202", "bob", "SELL", "0.4", "5000").await?;
    let (Some(b), Some(s)) = (buy.order_id(), sell.order_id()) else {
        anyhow::bail!("a placement returned no order id");
    };
    ctx.check_eq(
        "alice USDT after the placement",
        "available=4995.000000 frozen=5005.000000".to_string(),
        balance_line(db, t, "alice", Asset::Usdt).await?,
    );
    let filled = service.fill("fill-0201", b, s, "0.4", "5000").await?;
    ctx.note(format!(
        "fill 0.4 @ 5000: {} buyer_frozen_taken={} buy_status={}",
        filled.summary(),
        filled.text("buyer_frozen_taken"),
        filled.text("buy_status")
    ));
    ctx.check_eq(
        "alice USDT after the fill",
        "available=4995.000000 frozen=3003.000000".to_string(),
        balance_line(db, t, "alice", Asset::Usdt).await?,
    );
    Ok(b)
}

/// alice cancels order `b`: checks the cancel, that it released the remainder of the
/// freeze record, and alice's balances after it. Returns the cancel's reply.
///
/// Errors: transport or database errors.
async fn cancel_releases_remainder(
    ctx: &mut Ctx,
    service: &Service,
    db: &tokio_postgres::Client,
    b: i64,
) -> anyhow::Result<Reply> {
    let t = DEFAULT_TENANT;
    let cancelled = service.cancel(t, "cancel-0201", "alice", b).await?;
    ctx.note(format!(
        "cancel: {} released={} status={}",
        cancelled.summary(),
        cancelled.text("released"),
        cancelled.text("status")
    ));
    ctx.check_eq("cancel", "201 OK".to_string(), cancelled.status_outcome());
    ctx.check_eq(
        "released: the remainder of the freeze record",
        "3003.000000".to_string(),
        cancelled.text("released"),
    );
    ctx.check_eq(
        "alice USDT after the cancel",
        "available=7998.000000 frozen=0.000000".to_string(),
        balance_line(db, t, "alice", Asset::Usdt).await?,
    );
    ctx.check_eq(
        "alice BTC",
        "available=0.40000000 frozen=0.00000000".to_string(),
        balance_line(db, t, "alice", Asset::Btc).await?,
    );
    Ok(cancelled)
}

/// The same cancel of order `b` again: checks it is replayed with the body of
/// `cancelled` and that nothing moved.
///
/// Errors: transport or database errors.
async fn repeated_cancel_replays(
    ctx: &mut Ctx,
    service: &Service,
    db: &tokio_postgres::Client,
    b: i64,
    cancelled: &Reply,
) -> anyhow::Result<()> {
    let t = DEFAULT_TENANT;
    let before = recorded(db).await?;
    let again = service.cancel(t, "cancel-0201", "alice", b).await?;
    ctx.note(format!("the same cancel again: {}", again.summary()));
    ctx.check_eq("repeated cancel is replayed", true, again.replayed);
    ctx.check(
        "the replay carries the first body",
        cancelled.body == again.body,
        if cancelled.body == again.body {
            "same"
        } else {
            "different"
        },
    );
    ctx.check(
        "nothing moved: operations, movements, orders and balances unchanged",
        recorded(db).await? == before,
        "",
    );
    ctx.check_eq(
        "alice USDT after the replay",
        "available=7998.000000 frozen=0.000000".to_string(),
        balance_line(db, t, "alice", Asset::Usdt).await?,
    );
    Ok(())
}
