//! I9 — per-asset reconciliation with tamper on InnoDB (F10's claim).
//! Claim: the reconciliation, run in one consistent snapshot, is clean after a normal
//! day, and names each tampered balance row and each unbalanced asset separately: a BTC
//! surplus does not hide a USDT shortfall.
//! Setup: alice deposits 10 000 USDT, bob 1 BTC; alice BUY 1.0 @ 5000, bob SELL 0.5 @
//! 4900, a fill of 0.5. Then, outside the product, bob's BTC available gains 1 satoshi
//! and alice's USDT available loses 1 micro-USDT (a cross-asset sum would still be 0).
//! Checks: clean before; after: row mismatches bob BTC and alice USDT, unbalanced BTC
//! +1 and USDT −1, nothing else.
//! Fails if: the clean day has findings, or a tampered row or asset is not named.

use case_kit::{Case, Ctx};
use futures_util::FutureExt;
use mysql_async::prelude::Queryable;

use crate::fixtures::{Db, two_orders, fill, fill_request};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "I9",
        "per-asset reconciliation on InnoDB: clean, then each tampered row and asset named",
        |ctx| run(ctx).boxed(),
    )
    .not_clean()
}

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let db = Db::open(ctx).await?;
    let mut conn = db.connect().await?;
    let (b, s) = two_orders(&mut conn, "i9", "0.5").await?;
    fill(&mut conn, &fill_request("fill-i901", b, s, "0.5", "4900")?).await?;
    let clean = frozen_balances_innodb::reconcile(&mut conn).await?;
    ctx.check(
        "clean after a normal day",
        clean.is_clean(),
        clean.summary(),
    );
    conn.query_drop(
        "UPDATE balance SET available = available + 1 WHERE account_id = 'bob' AND asset = 'BTC'",
    )
    .await?;
    conn.query_drop(
        "UPDATE balance SET available = available - 1 WHERE account_id = 'alice' AND asset = 'USDT'",
    )
    .await?;
    let findings = frozen_balances_innodb::reconcile(&mut conn).await?;
    for line in findings.lines() {
        ctx.note(line);
    }
    let rows: Vec<String> = findings
        .row_mismatches
        .iter()
        .map(|m| format!("{} {}", m.account_id, m.asset))
        .collect();
    ctx.check_eq(
        "row mismatches: alice USDT and bob BTC",
        "alice USDT, bob BTC".to_string(),
        rows.join(", "),
    );
    let totals: Vec<String> = findings
        .unbalanced_assets()
        .iter()
        .map(|t| format!("{} {:+}", t.asset, t.total))
        .collect();
    ctx.check_eq(
        "unbalanced assets, each on its own: BTC +1, USDT −1 (minor units)",
        "BTC +1, USDT -1".to_string(),
        totals.join(", "),
    );
    ctx.check_eq("nothing else found", 4, findings.count());
    Ok(())
}
