//! F17 — one account, two markets.
//! Claim: ordering the requests of one market (one matcher per market, each placing its
//! orders one after another) does not protect an account whose quote balance serves
//! both markets; the conditional freeze on the balance row does. 32 BUYs of 5005 USDT on
//! 6000 USDT, 16 on BTC-USDT and 16 on ETH-USDT, give exactly one freeze.
//! Setup: alice deposits 6000 USDT. Two matchers on two connections, released by one
//! barrier: one places 16 BUY 1.0 BTC @ 5000, the other 16 BUY 1.0 ETH @ 5000 (ETH scale
//! 8, lot 0.0001, tick 0.01 USDT), each sequentially.
//! Checks: exactly 1 OK and 31 INSUFFICIENT over both markets (which market wins varies
//! and is not printed); alice USDT 995 available, 5005 frozen; an ETH row exists at 0;
//! the invariant and the reconciliation, with per-asset sums BTC, ETH and USDT at 0.
//! Fails if: any other split, an error, or a figure that differs.

use case_kit::{Case, Ctx};
use frozen_balances::{Asset, Market, NoHooks, Outcome, Side};
use futures_util::FutureExt;

use super::fixtures::{T, deposit, invariant, order};
use super::spot::{asset_sums, balance_line};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "F17",
        "one account, two markets: 32 BUYs of 5005 on 6000 over BTC-USDT and ETH-USDT, one freezes",
        |ctx| run(ctx).boxed(),
    )
    .connections(4)
}

/// Orders each matcher places, one after another.
pub const ORDERS_PER_MARKET: usize = 16;

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let mut db = ctx.connect().await?;
    deposit(&mut db, "dep-1701", "alice", Asset::Usdt, 6_000).await?;
    let outcomes = place_on_both_markets(ctx).await?;
    let ok = outcomes.iter().filter(|o| **o == Outcome::Ok).count();
    let insufficient = outcomes
        .iter()
        .filter(|o| **o == Outcome::Insufficient)
        .count();
    ctx.note(format!(
        "orders={} ok={ok} insufficient={insufficient}",
        outcomes.len()
    ));
    ctx.check_eq("exactly one order freezes over both markets", 1, ok);
    ctx.check_eq(
        "the other 31 are INSUFFICIENT",
        2 * ORDERS_PER_MARKET - 1,
        insufficient,
    );
    ctx.check_eq(
        "alice USDT",
        "available=995.000000 frozen=5005.000000".to_string(),
        balance_line(&db, T, "alice", Asset::Usdt).await?,
    );
    ctx.check_eq(
        "alice ETH (the row the ETH-USDT orders created)",
        "available=0.00000000 frozen=0.00000000".to_string(),
        balance_line(&db, T, "alice", Asset::Eth).await?,
    );
    let markets: i64 = db
        .query_one(
            "SELECT count(DISTINCT market) FROM balance_operation o \
             JOIN LATERAL (SELECT split_part(o.payload, '|', 3) AS market) m ON true \
             WHERE o.kind = 'PLACE'",
            &[],
        )
        .await?
        .get(0);
    ctx.check_eq("placements recorded on both markets", 2, markets);
    ctx.check_eq(
        "per-asset sums",
        "BTC=0.00000000 ETH=0.00000000 USDT=0.000000".to_string(),
        asset_sums(&mut db).await?,
    );
    invariant(ctx, &mut db).await?;
    Ok(())
}

/// The two matchers, released together: each places [`ORDERS_PER_MARKET`] BUY 1.0 @ 5000
/// for alice on its market (BTC-USDT, ETH-USDT), one after another. Returns every
/// outcome, BTC-USDT's first.
///
/// Errors: the race could not run; a matcher failed.
async fn place_on_both_markets(ctx: &mut Ctx) -> anyhow::Result<Vec<Outcome>> {
    let per_market = ctx
        .race(2, |racer| async move {
            let market = [Market::BtcUsdt, Market::EthUsdt][racer.index];
            let mut client = racer.client;
            let mut outcomes = Vec::new();
            for i in 0..ORDERS_PER_MARKET {
                let req = order(
                    &format!("place-17-{market}-{i:02}"),
                    "alice",
                    market,
                    Side::Buy,
                    "1.0",
                    "5000",
                )
                .map_err(|e| e.to_string())?;
                let result = frozen_balances::place(&mut client, &req, &NoHooks)
                    .await
                    .map_err(|e| e.to_string())?;
                outcomes.push(result.outcome);
            }
            Ok::<_, String>(outcomes)
        })
        .await?;
    let mut outcomes = Vec::new();
    for matcher in per_market {
        outcomes.extend(matcher.map_err(|e| anyhow::anyhow!("a matcher failed: {e}"))?);
    }
    Ok(outcomes)
}
