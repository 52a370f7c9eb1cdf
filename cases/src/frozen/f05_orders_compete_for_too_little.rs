//! F5 — orders compete for too little (the seed's table, row 2).
//! Claim: the conditional freeze (`... WHERE available >= amount`, re-evaluated on the
//! newest row version under READ COMMITTED) lets exactly one of 32 simultaneous orders
//! through when the balance covers one: no negative available, no double freeze.
//! Setup: alice has 6000 USDT. 32 threads on 32 connections, released by one barrier,
//! each place a different BUY 1.0 @ 5000 (5005 with the fee reserve).
//! Checks: exactly 1 OK and 31 INSUFFICIENT (each recorded); alice 995 available, 5005
//! frozen; the placements overlapped; reconciliation clean.
//! Fails if: any other split, a database error, or figures that disagree.

use std::time::Instant;

use case_kit::{Case, Ctx};
use frozen_balances::amount::{parse_price, parse_quantity};
use frozen_balances::{
    Asset, DEFAULT_TENANT, DepositRequest, Market, NoHooks, Outcome, PlaceRequest, Side,
};
use futures_util::FutureExt;

use super::spot::balance_line;

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "F5",
        "orders compete for too little: 32 orders of 5005 on 6000",
        |ctx| run(ctx).boxed(),
    )
    .connections(THREADS as u32 + 2)
}

const THREADS: usize = 32;

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let mut db = ctx.connect().await?;
    let t = DEFAULT_TENANT;
    let deposit = DepositRequest {
        tenant_id: t.into(),
        business_id: "dep-0501".into(),
        account_id: "alice".into(),
        asset: Asset::Usdt,
        amount: 6_000 * Asset::Usdt.units_per_coin(),
    };
    frozen_balances::deposit(&mut db, &deposit, &NoHooks).await?;
    let quantity = parse_quantity(Market::BtcUsdt, "1.0")?;
    let limit_price = parse_price(Market::BtcUsdt, "5000")?;

    let timed = ctx
        .race(THREADS, move |mut racer| async move {
            let req = PlaceRequest {
                tenant_id: DEFAULT_TENANT.into(),
                business_id: format!("place-05-{:02}", racer.index),
                account_id: "alice".into(),
                market: Market::BtcUsdt,
                side: Side::Buy,
                quantity,
                limit_price,
            };
            let began = Instant::now();
            let outcome = frozen_balances::place(&mut racer.client, &req, &NoHooks)
                .await
                .map(|r| r.outcome)
                .map_err(|e| e.to_string());
            (outcome, began, Instant::now())
        })
        .await?;
    let in_flight = max_in_flight(timed.iter().map(|(_, b, e)| (*b, *e)));
    let ok = timed
        .iter()
        .filter(|(o, _, _)| matches!(o, Ok(Outcome::Ok)))
        .count();
    let insufficient = timed
        .iter()
        .filter(|(o, _, _)| matches!(o, Ok(Outcome::Insufficient)))
        .count();
    let errors: Vec<&String> = timed
        .iter()
        .filter_map(|(o, _, _)| o.as_ref().err())
        .collect();
    ctx.note(format!(
        "ok={ok} insufficient={insufficient} errors={}",
        errors.len()
    ));
    ctx.check(
        "the placements overlapped: at least 16 of 32 in flight at one moment",
        in_flight >= THREADS / 2,
        format!("overlapped={}", in_flight >= THREADS / 2),
    );
    ctx.check_eq("exactly one order freezes", 1, ok);
    ctx.check_eq("the others are INSUFFICIENT", THREADS - 1, insufficient);
    ctx.check(
        "no database errors",
        errors.is_empty(),
        errors.first().map_or(String::new(), |e| e.to_string()),
    );
    ctx.check_eq(
        "alice USDT",
        "available=995.000000 frozen=5005.000000".to_string(),
        balance_line(&db, t, "alice", Asset::Usdt).await?,
    );
    let recorded: i64 = db
        .query_one(
            "SELECT count(*) FROM balance_operation WHERE kind = 'PLACE' AND outcome = 'INSUFFICIENT'",
            &[],
        )
        .await?
        .get(0);
    ctx.check_eq(
        "refusals recorded for replay",
        (THREADS - 1) as i64,
        recorded,
    );
    let findings = frozen_balances::reconcile(&mut db).await?;
    ctx.check(
        "reconciliation clean",
        findings.is_clean(),
        findings.summary(),
    );
    Ok(())
}

/// The most intervals that overlap at one instant.
fn max_in_flight(intervals: impl Iterator<Item = (Instant, Instant)>) -> usize {
    let mut events: Vec<(Instant, i32)> = Vec::new();
    for (began, ended) in intervals {
        events.push((began, 1));
        events.push((ended, -1));
    }
    // Ends before begins at the same instant: touching intervals do not overlap.
    events.sort();
    let (mut now, mut most) = (0_i32, 0_i32);
    for (_, delta) in events {
        now += delta;
        most = most.max(now);
    }
    most as usize
}
