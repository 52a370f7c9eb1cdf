//! F10 — per-asset reconciliation and a cross-asset tamper.
//! Claim: every clean database of the family reconciles with no findings (each balance
//! row = the sum of its movements; per tenant and asset, available + frozen over all
//! accounts is 0; frozen = the remainders of open orders + pending withdrawals; no closed order holds a
//! remainder; no movement without an operation). Different assets are never added:
//! taking 1 unit of bob's BTC and adding 1 unit to his USDT behind the product's back
//! leaves a cross-asset total of 0, yet the per-asset checks name both rows.
//! A second tamper marks a pending withdrawal settled without its settlement: the frozen
//! amount it held is named (frozen counts open orders and pending withdrawals).
//! Runs last; its own database ends tampered on purpose.
//! Fails if: a clean database has findings, or the tamper is missed or misnamed.

use case_kit::{Case, Ctx, Schedule};
use frozen_balances::amount::{parse_price, parse_quantity};
use frozen_balances::{Asset, CancelRequest, DEFAULT_TENANT, FillRequest, Market, NoHooks, Side};
use futures_util::FutureExt;

use super::fixtures::{deposit, order};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "F10",
        "per-asset reconciliation: clean databases have no findings; a cross-asset tamper is named per asset",
        |ctx| run(ctx).boxed(),
    )
    .schedule(Schedule::Last)
    .not_clean()
    .connections(3)
}

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    check_other_databases(ctx).await?;

    let mut db = ctx.connect().await?;
    own_history(&mut db).await?;
    let own = frozen_balances::reconcile(&mut db).await?;
    ctx.check("own database: no findings", own.is_clean(), own.summary());
    ctx.note(format!(
        "own per-asset sums: {}",
        own.totals_text(DEFAULT_TENANT)
    ));

    // Tamper: 1 unit less BTC, 1 unit more USDT for bob, no movement for either.
    cross_asset_tamper(ctx, &mut db).await?;

    // Tamper 2: bob's pending withdrawal w-1001 marked CONFIRMED behind the product's
    // back (no settlement): the 0.25 BTC it froze is held by nothing any more.
    withdrawal_tamper(ctx, &mut db).await
}

/// Reconciles every other clean database of the family (none when F10 runs alone),
/// records what each showed, and checks none has findings. As in L11, the transcript
/// names only databases with findings, so a new F case never changes this snapshot;
/// the run record lists every database covered and what it showed.
///
/// Errors: database errors.
async fn check_other_databases(ctx: &mut Ctx) -> anyhow::Result<()> {
    let databases = ctx.clean_databases();
    let mut covered = serde_json::Map::new();
    let mut with_findings = Vec::new();
    for database in &databases {
        let mut client = ctx.connect_to(database).await?;
        let findings = frozen_balances::reconcile(&mut client).await?;
        covered.insert(database.clone(), findings.summary().into());
        if !findings.is_clean() {
            with_findings.push(format!("{database}: {}", findings.lines().join("; ")));
        }
    }
    ctx.record("reconciled_databases", serde_json::Value::Object(covered));
    ctx.check(
        "every other clean database of the family: no findings",
        with_findings.is_empty(),
        with_findings.join(" | "),
    );
    Ok(())
}

/// Takes 1 unit of bob's BTC and adds 1 unit to his USDT, no movement for either:
/// checks a cross-asset total still sums to 0 while the reconciliation names both rows
/// and both assets, and nothing else.
///
/// Errors: database errors.
async fn cross_asset_tamper(ctx: &mut Ctx, db: &mut tokio_postgres::Client) -> anyhow::Result<()> {
    db.batch_execute(
        "UPDATE balance SET available = available - 1
           WHERE tenant_id = 'default' AND account_id = 'bob' AND asset = 'BTC';
         UPDATE balance SET available = available + 1
           WHERE tenant_id = 'default' AND account_id = 'bob' AND asset = 'USDT';",
    )
    .await?;
    let cross: i64 = db
        .query_one(
            "SELECT SUM(available::numeric + frozen::numeric)::bigint FROM balance",
            &[],
        )
        .await?
        .get(0);
    ctx.check_eq(
        "a cross-asset total (the wrong check) still sums to 0",
        0,
        cross,
    );
    let found = frozen_balances::reconcile(db).await?;
    ctx.note(format!("after tampering: {}", found.summary()));
    for line in found.lines() {
        ctx.note(line);
    }
    let rows: Vec<String> = found
        .row_mismatches
        .iter()
        .map(|m| {
            format!(
                "{} {} {:+}",
                m.account_id,
                m.asset,
                m.available - m.movements_available
            )
        })
        .collect();
    ctx.check_eq(
        "rows that disagree with their movements (units off)",
        "bob BTC -1, bob USDT +1".to_string(),
        rows.join(", "),
    );
    let assets: Vec<String> = found
        .unbalanced_assets()
        .iter()
        .map(|t| format!("{} {:+}", t.asset, t.total))
        .collect();
    ctx.check_eq(
        "assets whose sum is not 0 (units)",
        "BTC -1, USDT +1".to_string(),
        assets.join(", "),
    );
    ctx.check(
        "no other kind of finding",
        found.frozen_mismatches.is_empty()
            && found.closed_with_remainder.is_empty()
            && found.movements_without_operation.is_empty()
            && found.operations_without_movement.is_empty()
            && found.pending_operations.is_empty(),
        found.summary(),
    );
    Ok(())
}

/// Marks bob's pending withdrawal w-1001 CONFIRMED without its settlement: checks the
/// frozen row it held is named.
///
/// Errors: database errors.
async fn withdrawal_tamper(ctx: &mut Ctx, db: &mut tokio_postgres::Client) -> anyhow::Result<()> {
    db.batch_execute(
        "UPDATE withdrawal SET status = 'CONFIRMED'
           WHERE tenant_id = 'default' AND withdrawal_id = 'w-1001'",
    )
    .await?;
    let found = frozen_balances::reconcile(db).await?;
    let frozen: Vec<String> = found
        .frozen_mismatches
        .iter()
        .map(|m| {
            format!(
                "{} {} frozen={} orders={} withdrawals={}",
                m.account_id, m.asset, m.frozen, m.open_remainders, m.pending_withdrawals
            )
        })
        .collect();
    ctx.check_eq(
        "a withdrawal settled behind the product's back: the frozen row is named (units)",
        "bob BTC frozen=25000000 orders=0 withdrawals=0".to_string(),
        frozen.join(", "),
    );
    Ok(())
}

/// Deposits, a partial fill with price improvement, a cancel, a replay and a pending
/// withdrawal, through the library.
async fn own_history(db: &mut tokio_postgres::Client) -> anyhow::Result<()> {
    let t = DEFAULT_TENANT;
    let market = Market::BtcUsdt;
    deposit(db, "dep-1001", "alice", Asset::Usdt, 10_000).await?;
    deposit(db, "dep-1002", "bob", Asset::Btc, 2).await?;
    let buy = frozen_balances::place(
        db,
        &order("place-1001", "alice", market, Side::Buy, "1.0", "5000")?,
        &NoHooks,
    )
    .await?;
    let sell = frozen_balances::place(
        db,
        &order("place-1002", "bob", market, Side::Sell, "0.5", "4900")?,
        &NoHooks,
    )
    .await?;
    let (Some(b), Some(s)) = (buy.order_id, sell.order_id) else {
        anyhow::bail!("a placement was refused");
    };
    let fill = FillRequest {
        tenant_id: t.into(),
        fill_id: "fill-1001".into(),
        buy_order_id: b,
        sell_order_id: s,
        quantity: parse_quantity(market, "0.5")?,
        price: parse_price(market, "4900")?,
    };
    frozen_balances::fill(db, &fill, &NoHooks).await?;
    frozen_balances::fill(db, &fill, &NoHooks).await?; // replay
    let cancel = CancelRequest {
        tenant_id: t.into(),
        business_id: "cancel-1001".into(),
        account_id: "alice".into(),
        order_id: b,
    };
    frozen_balances::cancel(db, &cancel, &NoHooks).await?;
    // A withdrawal still pending (no executor runs here): its amount stays frozen.
    let withdrawal = frozen_balances::withdraw::WithdrawRequest {
        tenant_id: t.into(),
        withdrawal_id: "w-1001".into(),
        account_id: "bob".into(),
        asset: Asset::Btc,
        amount: Asset::Btc.units_per_coin() / 4,
        destination: "addr-bob-1001".into(),
    };
    frozen_balances::withdraw::request(db, &withdrawal, &NoHooks).await?;
    Ok(())
}
