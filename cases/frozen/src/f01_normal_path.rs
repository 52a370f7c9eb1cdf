//! F1 — normal path with price improvement.
//! Claim: a BUY 1.0000 @ 5000.00 freezes 5005 USDT (notional + the fee reserve rounded
//! up); two fills at 4900 settle it; the buyer gets the price improvement and the unused
//! reserve back, each side pays 10 bps, and every asset still sums to 0.
//! Setup: alice deposits 10 000 USDT, bob 2 BTC (admin). alice BUY 1.0000 @ 5000.00, bob
//! SELL 1.0000 @ 4900.00 (public). Fills 0.4 and 0.6 @ 4900 (admin, the matching engine).
//! Checks: alice 4995 available / 5005 frozen after the placement; first fill pays
//! 1960 + 1.96 and returns 40.04; the final one pays 2940 + 2.94 and returns 60.06; end:
//! alice 5095.10 USDT + 1.0 BTC, bob 4895.10 USDT + 1.0 BTC, sys-fee 9.80, frozen 0,
//! per-asset sums 0.
//! Fails if: any figure differs or any asset does not sum to 0.

use case_kit::{Case, Ctx};
use frozen_balances::{Asset, DEFAULT_TENANT, SYS_FEE};
use futures_util::FutureExt;
use launch::service::{Service, ServiceOptions};

use super::spot::{SpotCalls, SpotReply, asset_sums, balance_line, place, spot_service};

/// The case's registration.
pub fn case() -> Case {
    Case::new("F1", "normal path with price improvement", |ctx| {
        run(ctx).boxed()
    })
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
        .deposit(t, "dep-0101", "alice", "USDT", "10000")
        .await?;
    service.deposit(t, "dep-0102", "bob", "BTC", "2").await?;

    let (b, s) = place_both(ctx, &service, &db).await?;
    settle_in_two_fills(ctx, &service, b, s).await?;
    check_end(ctx, &service, &db).await?;
    service.stop_checked(ctx).await?;
    Ok(())
}

/// Places alice's BUY 1.0000 @ 5000.00 and bob's SELL 1.0000 @ 4900.00, checking each
/// placement and the frozen amount after it. Returns `(buy order id, sell order id)`.
///
/// Errors: transport or database errors; a placement without an order id.
async fn place_both(
    ctx: &mut Ctx,
    service: &Service,
    db: &tokio_postgres::Client,
) -> anyhow::Result<(i64, i64)> {
    let t = DEFAULT_TENANT;
    let buy = place(service, "place-0101", "alice", "BUY", "1.0000", "5000.00").await?;
    ctx.note(format!(
        "alice BUY 1.0000 @ 5000.00: {} frozen={} fee_reserve={}",
        buy.summary(),
        buy.text("frozen"),
        buy.text("fee_reserve")
    ));
    ctx.check_eq("placement", "201 OK".to_string(), buy.status_outcome());
    ctx.check_eq(
        "alice USDT after the placement",
        "available=4995.000000 frozen=5005.000000".to_string(),
        balance_line(db, t, "alice", Asset::Usdt).await?,
    );
    let sell = place(service, "place-0102", "bob", "SELL", "1.0000", "4900.00").await?;
    ctx.check_eq(
        "bob's placement",
        "201 OK".to_string(),
        sell.status_outcome(),
    );
    ctx.check_eq(
        "bob BTC after the placement",
        "available=1.00000000 frozen=1.00000000".to_string(),
        balance_line(db, t, "bob", Asset::Btc).await?,
    );
    let (Some(b), Some(s)) = (buy.order_id(), sell.order_id()) else {
        anyhow::bail!("a placement returned no order id");
    };
    Ok((b, s))
}

/// Fills buy order `b` against sell order `s` in two fills (0.4 and 0.6 @ 4900.00),
/// noting each and checking what alice pays and gets back and what bob receives.
///
/// Errors: transport errors.
async fn settle_in_two_fills(
    ctx: &mut Ctx,
    service: &Service,
    b: i64,
    s: i64,
) -> anyhow::Result<()> {
    for (fill_id, quantity, paid, fee, returned, received) in [
        (
            "fill-0101",
            "0.4000",
            "1960.000000",
            "1.960000",
            "40.040000",
            "1958.040000",
        ),
        (
            "fill-0102",
            "0.6000",
            "2940.000000",
            "2.940000",
            "60.060000",
            "2937.060000",
        ),
    ] {
        let filled = service.fill(fill_id, b, s, quantity, "4900.00").await?;
        ctx.note(format!(
            "fill {quantity} @ 4900.00: {} notional={} buyer_fee={} buyer_returned={} \
             seller_received={} buy_status={}",
            filled.summary(),
            filled.text("notional"),
            filled.text("buyer_fee"),
            filled.text("buyer_returned"),
            filled.text("seller_received"),
            filled.text("buy_status")
        ));
        ctx.check_eq(
            format!("fill {quantity}: alice pays notional + fee, gets the rest back"),
            format!("{paid} + {fee}, back {returned}"),
            format!(
                "{} + {}, back {}",
                filled.text("notional"),
                filled.text("buyer_fee"),
                filled.text("buyer_returned")
            ),
        );
        ctx.check_eq(
            format!("fill {quantity}: bob receives notional - fee"),
            received.to_string(),
            filled.text("seller_received"),
        );
    }
    Ok(())
}

/// The end state: each side's USDT and BTC as the service reports them, sys-fee's
/// USDT, and the per-asset sums of available + frozen.
///
/// Errors: transport or database errors.
async fn check_end(
    ctx: &mut Ctx,
    service: &Service,
    db: &tokio_postgres::Client,
) -> anyhow::Result<()> {
    let t = DEFAULT_TENANT;
    let alice = service.balances(t, "alice").await?;
    let bob = service.balances(t, "bob").await?;
    for (who, reply, asset, expected) in [
        (
            "alice",
            &alice,
            Asset::Usdt,
            "available=5095.100000 frozen=0.000000",
        ),
        (
            "alice",
            &alice,
            Asset::Btc,
            "available=1.00000000 frozen=0.00000000",
        ),
        (
            "bob",
            &bob,
            Asset::Usdt,
            "available=4895.100000 frozen=0.000000",
        ),
        (
            "bob",
            &bob,
            Asset::Btc,
            "available=1.00000000 frozen=0.00000000",
        ),
    ] {
        ctx.check_eq(
            format!("end: {who} {asset}"),
            expected.to_string(),
            reply.asset_line(asset),
        );
    }
    ctx.check_eq(
        "end: sys-fee USDT (both sides' fees)",
        "available=9.800000 frozen=0.000000".to_string(),
        balance_line(db, t, SYS_FEE, Asset::Usdt).await?,
    );
    let mut client = ctx.connect().await?;
    ctx.check_eq(
        "per-asset sums of available + frozen",
        "BTC=0.00000000 USDT=0.000000".to_string(),
        asset_sums(&mut client).await?,
    );
    Ok(())
}
