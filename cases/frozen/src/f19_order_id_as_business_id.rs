//! F19 — the order id as the business id (negative control).
//! Claim: each event needs its own business id. A matching engine that settles its fills
//! under the order's id makes the second fill of an order look like a retry of the
//! first: it is replayed, nothing moves, and the order keeps part of its freeze while
//! the engine believes it filled. One id per fill settles it: F1's figures.
//! Setup: alice deposits 10 000 USDT, bob 2 BTC; alice BUY 1.0 @ 5000, bob SELL 1.0 @
//! 4900; fills 0.4 and 0.6 @ 4900 under their own ids. Control: carol 10 000 USDT, dave
//! 1 BTC, the same orders; two fills of 0.5 @ 4900, both under `order-<carol's order>`
//! (equal halves, so even the payload fingerprint matches and the second is a replay).
//! Checks: F1's end figures for alice and bob; the invariant. Control: the second fill is
//! replayed, carol keeps 2502.5 USDT frozen on an OPEN order and got 0.5 BTC of 1.0.
//! Fails if: a figure differs, or the control's second fill is not swallowed.

use case_kit::{Case, Ctx};
use frozen_balances::{Asset, Market, NoHooks, OrderStatus, Side};
use futures_util::FutureExt;

use super::fixtures::{Plan, T, deposit, fill, fill_request, invariant, order, placed};
use super::spot::balance_line;

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "F19",
        "the order id as the business id swallows the second fill (negative control)",
        |ctx| run(ctx, Plan::Forced).boxed(),
    )
}

/// The case body; under [`Plan::Harmless`] the control's order is filled by a single
/// fill of 1.0, so there is no second fill to swallow.
///
/// Errors: database errors, a placement refused.
pub async fn run(ctx: &mut Ctx, plan: Plan) -> anyhow::Result<()> {
    let mut db = ctx.connect().await?;
    one_id_per_fill(ctx, &mut db).await?;

    // The control: the engine names each fill after the BUY order.
    order_id_control(ctx, &mut db, plan).await
}

/// alice's BUY and bob's SELL filled 0.4 and 0.6 @ 4900 under their own ids: checks
/// F1's end figures, then the invariant.
///
/// Errors: database errors, a placement refused.
async fn one_id_per_fill(ctx: &mut Ctx, db: &mut tokio_postgres::Client) -> anyhow::Result<()> {
    deposit(db, "dep-1901", "alice", Asset::Usdt, 10_000).await?;
    deposit(db, "dep-1902", "bob", Asset::Btc, 2).await?;
    let (m, buy, sell) = (Market::BtcUsdt, Side::Buy, Side::Sell);
    let a = placed(db, &order("place-1901", "alice", m, buy, "1.0", "5000")?).await?;
    let b = placed(db, &order("place-1902", "bob", m, sell, "1.0", "4900")?).await?;
    for (id, quantity) in [("fill-1901", "0.4"), ("fill-1902", "0.6")] {
        let r = fill(db, &fill_request(id, a, b, quantity, "4900")?, &NoHooks).await?;
        ctx.note(format!(
            "{id} {quantity} @ 4900: {} replayed={}",
            r.outcome.as_str(),
            r.replayed
        ));
    }
    ctx.check_eq(
        "one id per fill: alice USDT (F1's figures)",
        "available=5095.100000 frozen=0.000000".to_string(),
        balance_line(db, T, "alice", Asset::Usdt).await?,
    );
    ctx.check_eq(
        "one id per fill: alice BTC",
        "available=1.00000000 frozen=0.00000000".to_string(),
        balance_line(db, T, "alice", Asset::Btc).await?,
    );
    ctx.check_eq(
        "one id per fill: bob USDT",
        "available=4895.100000 frozen=0.000000".to_string(),
        balance_line(db, T, "bob", Asset::Usdt).await?,
    );
    invariant(ctx, db).await?;
    Ok(())
}

/// The negative control: carol's BUY and dave's SELL, filled under `order-<carol's
/// order>` (two fills of 0.5 under [`Plan::Forced`], one of 1.0 under
/// [`Plan::Harmless`]): exposes whether the second fill was swallowed, and checks the
/// reconciliation cannot see it.
///
/// Errors: database errors, a placement refused.
async fn order_id_control(
    ctx: &mut Ctx,
    db: &mut tokio_postgres::Client,
    plan: Plan,
) -> anyhow::Result<()> {
    let (m, buy, sell) = (Market::BtcUsdt, Side::Buy, Side::Sell);
    deposit(db, "dep-1903", "carol", Asset::Usdt, 10_000).await?;
    deposit(db, "dep-1904", "dave", Asset::Btc, 1).await?;
    let c = placed(db, &order("place-1903", "carol", m, buy, "1.0", "5000")?).await?;
    let d = placed(db, &order("place-1904", "dave", m, sell, "1.0", "4900")?).await?;
    let fills: &[&str] = match plan {
        Plan::Forced => &["0.5", "0.5"],
        Plan::Harmless => &["1.0"],
    };
    let business_id = format!("order-{c}");
    let mut swallowed = 0;
    for quantity in fills {
        let req = fill_request(&business_id, c, d, quantity, "4900")?;
        let r = fill(db, &req, &NoHooks).await?;
        ctx.note(format!(
            "fill {quantity} @ 4900 under the order id: {} replayed={}",
            r.outcome.as_str(),
            r.replayed
        ));
        swallowed += usize::from(r.replayed);
    }
    let carol = balance_line(db, T, "carol", Asset::Usdt).await?;
    let carol_btc = balance_line(db, T, "carol", Asset::Btc).await?;
    let status = frozen_balances::query::order(db, T, c)
        .await?
        .map(|o| o.status);
    ctx.note(format!(
        "carol USDT {carol}; BTC {carol_btc}; order {}",
        status.map_or("none", |s| s.as_str())
    ));
    ctx.exposes(
        "the second fill is replayed, 2502.5 USDT stays frozen on an order the engine filled",
        swallowed == 1
            && carol == "available=5045.050000 frozen=2502.500000"
            && status == Some(OrderStatus::Open),
        format!(
            "swallowed={swallowed} frozen_left={}",
            !carol.ends_with("frozen=0.000000")
        ),
    );
    // The books still agree with themselves: only the engine's own record of fills
    // differs, which is why the id must come from the event, not from the order.
    let findings = frozen_balances::reconcile(db).await?;
    ctx.check(
        "reconciliation cannot see it (the frozen 2502.5 is what the OPEN order holds)",
        findings.is_clean(),
        findings.summary(),
    );
    Ok(())
}
