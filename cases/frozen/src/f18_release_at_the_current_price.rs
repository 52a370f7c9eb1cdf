//! F18 — release at the current price (negative control).
//! Claim: a cancel must release what the order's freeze record still holds (original
//! freeze − consumed − released), never an amount recomputed from today's price. A
//! cancel that recomputes `remaining quantity × current price + fee reserve` at 4900
//! releases 4904.90 of the 5005 frozen at 5000: 100.10 USDT stays frozen on a CANCELLED
//! order, the "funds frozen but no open orders" complaint.
//! Setup: alice and carol deposit 10 000 USDT and each BUY 1.0 @ 5000 (5005 frozen). The
//! market now trades at 4900.
//! Checks: the product's cancel of alice's order releases 5005, frozen 0, the invariant.
//! Control: the naive cancel of carol's order (one transaction, operation and movement
//! recorded, only the amount wrong) leaves 100.10 frozen on a CANCELLED order, and the
//! reconciliation names both the account and the order.
//! Fails if: the product leaves anything frozen, or the naive cancel releases it all.

use case_kit::{Case, Ctx};
use frozen_balances::amount::{format_units, order_freeze, parse_price};
use frozen_balances::events::payload_hash;
use frozen_balances::{Asset, Market, NoHooks, Side};
use futures_util::FutureExt;

use super::fixtures::{Plan, T, cancel, deposit, invariant, order, placed};
use super::spot::balance_line;

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "F18",
        "a cancel that releases at the current price leaves funds frozen (negative control)",
        |ctx| run(ctx, Plan::Forced).boxed(),
    )
    .not_clean()
}

/// The case body; under [`Plan::Harmless`] the current price equals the limit (5000), so
/// the naive recomputation happens to give the freeze record's figure.
///
/// Errors: database errors, a placement refused.
pub async fn run(ctx: &mut Ctx, plan: Plan) -> anyhow::Result<()> {
    let mut db = ctx.connect().await?;
    let (m, buy) = (Market::BtcUsdt, Side::Buy);
    deposit(&mut db, "dep-1801", "alice", Asset::Usdt, 10_000).await?;
    let a = placed(
        &mut db,
        &order("place-1801", "alice", m, buy, "1.0", "5000")?,
    )
    .await?;
    let r = cancel(&mut db, "cancel-1801", "alice", a, &NoHooks).await?;
    ctx.check_eq(
        "the product releases the freeze record's remainder",
        "5005.000000".to_string(),
        format_units(Asset::Usdt, r.released),
    );
    ctx.check_eq(
        "alice USDT after the cancel",
        "available=10000.000000 frozen=0.000000".to_string(),
        balance_line(&db, T, "alice", Asset::Usdt).await?,
    );
    invariant(ctx, &mut db).await?;

    deposit(&mut db, "dep-1802", "carol", Asset::Usdt, 10_000).await?;
    let c = placed(
        &mut db,
        &order("place-1802", "carol", m, buy, "1.0", "5000")?,
    )
    .await?;
    let current = match plan {
        Plan::Forced => "4900",
        Plan::Harmless => "5000",
    };
    let released = naive_cancel(&mut db, "cancel-1802", c, current).await?;
    ctx.note(format!(
        "naive cancel at the current price {current}: released {}",
        format_units(Asset::Usdt, released)
    ));
    let carol = balance_line(&db, T, "carol", Asset::Usdt).await?;
    let status = frozen_balances::query::order(&db, T, c)
        .await?
        .map(|o| o.status.as_str());
    ctx.note(format!(
        "carol USDT {carol}; order {}",
        status.unwrap_or("none")
    ));
    ctx.exposes(
        "100.10 USDT stays frozen on a CANCELLED order",
        carol == "available=9899.900000 frozen=100.100000" && status == Some("CANCELLED"),
        format!("carol USDT {carol}"),
    );
    let findings = frozen_balances::reconcile(&mut db).await?;
    ctx.check_eq(
        "the reconciliation names it: carol's frozen ≠ her open orders, a closed order holds",
        "1 1".to_string(),
        format!(
            "{} {}",
            findings.frozen_mismatches.len(),
            findings.closed_with_remainder.len()
        ),
    );
    for line in findings.lines() {
        ctx.note(format!("finding: {line}"));
    }
    Ok(())
}

/// The naive cancel: one transaction, the order locked, the operation and the movement
/// recorded; but the release is `remaining quantity × current` plus its fee reserve,
/// recomputed, instead of the freeze record's remainder. Returns what it released.
async fn naive_cancel(
    db: &mut tokio_postgres::Client,
    business_id: &str,
    order_id: i64,
    current: &str,
) -> anyhow::Result<i64> {
    let market = Market::BtcUsdt;
    let tx = db.transaction().await?;
    let row = tx
        .query_one(
            "SELECT account_id, quantity - filled_quantity FROM spot_order \
             WHERE tenant_id = $1 AND order_id = $2 FOR UPDATE",
            &[&T, &order_id],
        )
        .await?;
    let (account, remaining): (String, i64) = (row.get(0), row.get(1));
    let release = order_freeze(market, Side::Buy, remaining, parse_price(market, current)?)?.amount;
    tx.execute(
        "UPDATE balance SET available = available + $3, frozen = frozen - $3, \
         version = version + 1 WHERE tenant_id = $1 AND account_id = $2 AND asset = 'USDT'",
        &[&T, &account, &release],
    )
    .await?;
    let payload = format!("CANCEL|{account}|{order_id}");
    tx.execute(
        "INSERT INTO balance_operation (tenant_id, business_id, kind, payload, payload_hash, \
         outcome, result) VALUES ($1, $2, 'CANCEL', $3, $4, 'OK', '{}')",
        &[&T, &business_id, &payload, &payload_hash(&payload)],
    )
    .await?;
    tx.execute(
        "INSERT INTO balance_movement (tenant_id, business_id, account_id, asset, \
         available_delta, frozen_delta) VALUES ($1, $2, $3, 'USDT', $4, $5)",
        &[&T, &business_id, &account, &release, &-release],
    )
    .await?;
    tx.execute(
        "UPDATE spot_order SET released = released + $2, status = 'CANCELLED' WHERE order_id = $1",
        &[&order_id, &release],
    )
    .await?;
    tx.commit().await?;
    Ok(release)
}
