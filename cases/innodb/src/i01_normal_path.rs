//! I1 — the normal path on InnoDB (F1's claim on the seed's own engine).
//! Claim: a deposit, a BUY and a SELL placement, two fills and their replay give the
//! same figures as on PostgreSQL: the freeze with its fee reserve, the settlement of
//! each fill (shared arithmetic), both orders FILLED holding nothing, fees in `sys-fee`.
//! Setup: alice deposits 10 000 USDT, bob 1 BTC; alice BUY 1.0 @ 5000, bob SELL 1.0 @
//! 4900; fills 0.4 and 0.6 @ 4900.
//! Checks: alice frozen 5005 after placing; the first fill's figures; after both fills
//! alice 5095.1 USDT available (4900 and a fee of 4.9 paid) and 1 BTC; the first fill
//! sent again replays the same result; the invariant and a clean reconciliation.
//! Fails if: any figure differs, an order holds a remainder, or a replay executes again.

use case_kit::{Case, Ctx};
use frozen_balances::Asset;
use futures_util::FutureExt;

use crate::fixtures::{Db, two_orders, fill, fill_request, invariant, line};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "I1",
        "normal path on InnoDB: freeze, two fills, replay; the same figures as on PostgreSQL",
        |ctx| run(ctx).boxed(),
    )
}

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let db = Db::open(ctx).await?;
    let mut conn = db.connect().await?;
    let (buy_id, sell_id) = two_orders(&mut conn, "i1", "1.0").await?;
    ctx.check_eq(
        "alice USDT after placing: 5005 frozen (5000 + fee reserve 5)",
        "available=4995.000000 frozen=5005.000000".to_string(),
        line(&mut conn, "alice", Asset::Usdt).await?,
    );
    let first = fill_request("fill-i101", buy_id, sell_id, "0.4", "4900")?;
    let result = fill(&mut conn, &first).await?;
    ctx.check_eq(
        "first fill: notional, buyer fee, frozen taken, returned, seller received (minor units)",
        "1960000000 1960000 2002000000 40040000 1958040000".to_string(),
        format!(
            "{} {} {} {} {}",
            result.notional,
            result.buyer_fee,
            result.buyer_frozen_taken,
            result.buyer_returned,
            result.seller_received
        ),
    );
    let second = fill_request("fill-i102", buy_id, sell_id, "0.6", "4900")?;
    let last = fill(&mut conn, &second).await?;
    ctx.check_eq(
        "both orders FILLED",
        "Some(Filled) Some(Filled)".to_string(),
        format!("{:?} {:?}", last.buy_status, last.sell_status),
    );
    note_balances(ctx, &mut conn).await?;
    ctx.check_eq(
        "alice USDT: 10000 − 4900 − fee 4.9",
        "available=5095.100000 frozen=0.000000".to_string(),
        line(&mut conn, "alice", Asset::Usdt).await?,
    );
    let again = fill(&mut conn, &first).await?;
    ctx.check(
        "the first fill sent again replays the same result",
        again.replayed
            && again.notional == result.notional
            && again.buyer_returned == result.buyer_returned,
        format!("replayed={}", again.replayed),
    );
    invariant(ctx, &mut conn).await?;
    Ok(())
}

/// Notes the balances the fills moved.
async fn note_balances(ctx: &mut Ctx, conn: &mut mysql_async::Conn) -> anyhow::Result<()> {
    let figures = [
        ("alice", Asset::Usdt),
        ("alice", Asset::Btc),
        ("bob", Asset::Usdt),
        ("bob", Asset::Btc),
        ("sys-fee", Asset::Usdt),
    ];
    for (account, asset) in figures {
        let text = line(conn, account, asset).await?;
        ctx.note(format!("{account} {asset}: {text}"));
    }
    Ok(())
}
