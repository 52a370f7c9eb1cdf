//! F11 — amounts at the edge.
//! Claim: amounts are decimal strings with at most the asset's scale, refused — never
//! truncated or rounded — when they are not; derived amounts past the 64-bit range or an
//! asset's maximum are refused as the client's error (400), not a 5xx and not a wrap;
//! nothing of a refused request is recorded, so the same business id then succeeds. And
//! the rounding rule holds at the smallest scale: a BUY's fee reserve, rounded up at
//! placement, covers each fill's fee, rounded down, even when the fee is a fraction of a
//! unit.
//! Setup: alice deposits 10 000 USDT, bob 2 BTC. Placements under id `place-1101`:
//! `0.000100001` BTC (9 places; truncating would give a valid 0.0001), `1e-8`, `+1`,
//! `1.`, `.5`, `0`, `-1`, over the maximum, a price off the tick, a quantity off the lot,
//! `21000000 BTC @ 10000000.00` (notional past the bigint range of USDT units); deposits
//! past each asset's maximum. Then the valid order with the same id: BUY 0.0002 @
//! 5000.05, freezing 1.000010 + a reserve of 0.001001 USDT; bob SELL 0.0002 @ 5000.05;
//! fills 0.0001 and 0.0001 @ 5000.05.
//! Checks: each refused input → 400 and nothing recorded; the valid order → 201; each
//! fill's fee 0.000500 (500.005 units rounded down); both settle; the final fill releases
//! the rest; alice frozen 0; per-asset sums 0.
//! Fails if: any input is accepted or recorded, or a figure differs.

use case_kit::{Case, Ctx};
use frozen_balances::{Asset, DEFAULT_TENANT};
use futures_util::FutureExt;
use launch::service::{Reply, Service, ServiceOptions};
use reqwest::header::CONTENT_TYPE;
use serde_json::json;

use super::spot::{
    ForTenant, SpotCalls, SpotReply, asset_sums, balance_line, place, recorded, spot_service,
};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "F11",
        "amounts at the edge: refused, never truncated; sub-unit fees covered by the reserve",
        |ctx| run(ctx).boxed(),
    )
    .connections(POOL_SIZE as u32 + 2)
}

const POOL_SIZE: usize = 2;
const BUSINESS_ID: &str = "place-1101";

/// (what, quantity, price) of each refused placement.
const REFUSED_ORDERS: [(&str, &str, &str); 12] = [
    ("9 places of BTC", "0.000100001", "5000.05"),
    ("exponent", "1e-8", "5000.05"),
    ("plus sign", "+1", "5000.05"),
    ("trailing point", "1.", "5000.05"),
    ("leading point", ".5", "5000.05"),
    ("zero", "0", "5000.05"),
    ("negative", "-1", "5000.05"),
    ("quantity over the BTC maximum", "21000000.0001", "5000.05"),
    ("price over the maximum", "0.0002", "10000000.01"),
    ("price off the tick", "0.0002", "5000.051"),
    ("quantity off the lot", "0.00025", "5000.05"),
    ("notional past the bigint range", "21000000", "10000000.00"),
];

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
        .deposit(t, "dep-1101", "alice", "USDT", "10000")
        .await?;
    service.deposit(t, "dep-1102", "bob", "BTC", "2").await?;
    refuse_bad_amounts(ctx, &service, &db).await?;

    // The valid order under the same id: the sub-unit fee story.
    sub_unit_fees(ctx, &service, &db).await?;
    let mut client = ctx.connect().await?;
    ctx.check_eq(
        "per-asset sums",
        "BTC=0.00000000 USDT=0.000000".to_string(),
        asset_sums(&mut client).await?,
    );
    service.stop_checked(ctx).await?;
    Ok(())
}

/// Sends each of [`REFUSED_ORDERS`] under [`BUSINESS_ID`] and three deposits past an
/// asset's maximum or scale, checking each is refused, then that nothing of them was
/// recorded.
///
/// Errors: transport or database errors.
async fn refuse_bad_amounts(
    ctx: &mut Ctx,
    service: &Service,
    db: &tokio_postgres::Client,
) -> anyhow::Result<()> {
    let t = DEFAULT_TENANT;
    let before = recorded(db).await?;

    for (what, quantity, price) in REFUSED_ORDERS {
        let reply = place(service, BUSINESS_ID, "alice", "BUY", quantity, price).await?;
        refused(ctx, &format!("{what}: BUY {quantity} @ {price}"), &reply);
    }
    for (what, asset, amount) in [
        ("deposit over the BTC maximum", "BTC", "21000000.00000001"),
        (
            "deposit over the USDT maximum",
            "USDT",
            "1000000000000.000001",
        ),
        ("deposit of 7 places of USDT", "USDT", "0.0000001"),
    ] {
        let reply = service
            .send(
                service
                    .http()
                    .post(service.admin_url("/spot/accounts/alice/deposits"))
                    .for_tenant(t)
                    .header("idempotency-key", "dep-1103")
                    .header(CONTENT_TYPE, "application/json")
                    .body(json!({"asset": asset, "amount": amount}).to_string()),
            )
            .await?;
        refused(ctx, &format!("{what}: {amount} {asset}"), &reply);
    }
    ctx.check(
        "nothing of the refused requests was recorded",
        recorded(db).await? == before,
        "",
    );
    Ok(())
}

/// alice BUY 0.0002 @ 5000.05 under [`BUSINESS_ID`] and bob's SELL, filled in two fills
/// of 0.0001: checks the freeze and its reserve, each fill's fee rounded down, alice's
/// frozen ending at 0 and the fees sys-fee got.
///
/// Errors: transport or database errors; a placement without an order id.
async fn sub_unit_fees(
    ctx: &mut Ctx,
    service: &Service,
    db: &tokio_postgres::Client,
) -> anyhow::Result<()> {
    let t = DEFAULT_TENANT;
    let buy = place(service, BUSINESS_ID, "alice", "BUY", "0.0002", "5000.05").await?;
    ctx.note(format!(
        "BUY 0.0002 @ 5000.05 under the same id: {} frozen={} fee_reserve={}",
        buy.summary(),
        buy.text("frozen"),
        buy.text("fee_reserve")
    ));
    ctx.check_eq(
        "the same id then succeeds",
        "201 OK replayed=false".to_string(),
        buy.summary(),
    );
    ctx.check_eq(
        "freeze = 1.000010 notional + 0.001001 reserve (rounded up)",
        "1.001011 / 0.001001".to_string(),
        format!("{} / {}", buy.text("frozen"), buy.text("fee_reserve")),
    );
    let sell = place(service, "place-1102", "bob", "SELL", "0.0002", "5000.05").await?;
    let (Some(b), Some(s)) = (buy.order_id(), sell.order_id()) else {
        anyhow::bail!("a placement returned no order id");
    };
    for (fill_id, status) in [("fill-1101", "OPEN"), ("fill-1102", "FILLED")] {
        let filled = service.fill(fill_id, b, s, "0.0001", "5000.05").await?;
        ctx.note(format!(
            "fill 0.0001 @ 5000.05: {} notional={} buyer_fee={} seller_fee={} \
             buyer_frozen_taken={} buyer_returned={} buy_status={}",
            filled.summary(),
            filled.text("notional"),
            filled.text("buyer_fee"),
            filled.text("seller_fee"),
            filled.text("buyer_frozen_taken"),
            filled.text("buyer_returned"),
            filled.text("buy_status")
        ));
        ctx.check_eq(
            format!("{fill_id}: settles, fee 0.000500 (500.005 units rounded down)"),
            format!("201 OK 0.000500 {status}"),
            format!(
                "{} {} {}",
                filled.status_outcome(),
                filled.text("buyer_fee"),
                filled.text("buy_status")
            ),
        );
    }
    ctx.check_eq(
        "alice USDT: frozen ends at 0",
        "available=9998.998990 frozen=0.000000".to_string(),
        balance_line(db, t, "alice", Asset::Usdt).await?,
    );
    ctx.check_eq(
        "sys-fee USDT: 4 fees of 0.000500",
        "available=0.002000 frozen=0.000000".to_string(),
        balance_line(db, t, frozen_balances::SYS_FEE, Asset::Usdt).await?,
    );
    Ok(())
}

/// Checks a refused input: 400, a problem naming why.
fn refused(ctx: &mut Ctx, what: &str, reply: &Reply) {
    ctx.note(format!(
        "{what} -> {} {}",
        reply.status_outcome(),
        reply.body["detail"].as_str().unwrap_or("")
    ));
    ctx.check_eq(
        format!("{what}: refused"),
        "400 BAD_REQUEST".to_string(),
        reply.status_outcome(),
    );
}
