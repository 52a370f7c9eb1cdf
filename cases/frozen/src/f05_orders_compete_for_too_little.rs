//! F5 — orders compete for too little (the seed's table, row 2).
//! Claim: the conditional freeze (`... WHERE available >= amount`, re-evaluated on the
//! newest row version under READ COMMITTED) lets exactly one of 32 simultaneous orders
//! through when the balance covers one: no negative available, no double freeze.
//! Setup: alice has 6000 USDT. 32 threads on 32 connections, released by one barrier,
//! each place a different BUY 1.0 @ 5000 (5005 with the fee reserve).
//! Schedule: the race is forced, not read off a clock. A holder session takes alice's
//! USDT row (`SELECT … FOR UPDATE` in an open transaction) before the barrier; the case
//! waits until all 32 placements are seen waiting on a lock at one moment
//! (`pg_stat_activity`, `wait_event_type = 'Lock'`), then the holder rolls back and the
//! 32 proceed one after another on the row.
//! Checks: all 32 queued on the held row; exactly 1 OK and 31 INSUFFICIENT (each
//! recorded); alice 995 available, 5005 frozen; reconciliation clean.
//! Fails if: not all 32 are seen queued (within a bound that only stops a hang), any
//! other split, a database error, or figures that disagree.

use std::time::Duration;

use case_kit::locks::release_once_queued;
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
    // The racers, the case's own connection and the holder.
    .connections(THREADS as u32 + 2)
}

const THREADS: usize = 32;
/// Longest wait for the 32 placements to queue behind the held row, milliseconds: it
/// only stops a hang (a loaded machine gets them there later, never not).
const QUEUE_WAIT_MS: u64 = 60_000;
/// The holder's lock on the contested row.
const HOLD_ROW_SQL: &str = "\
SELECT 1 FROM balance WHERE tenant_id = $1 AND account_id = 'alice' AND asset = 'USDT'
FOR UPDATE";

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

    // The holder takes alice's USDT row first; every placement then queues behind it.
    let mut holder = ctx.connect().await?;
    let hold = holder.transaction().await?;
    hold.execute(HOLD_ROW_SQL, &[&t]).await?;
    ctx.note("holder: SELECT … FOR UPDATE on alice's USDT row, kept until the placements queue behind it");

    let racing = ctx.race(THREADS, move |mut racer| async move {
        let req = PlaceRequest {
            tenant_id: DEFAULT_TENANT.into(),
            business_id: format!("place-05-{:02}", racer.index),
            account_id: "alice".into(),
            market: Market::BtcUsdt,
            side: Side::Buy,
            quantity,
            limit_price,
        };
        frozen_balances::place(&mut racer.client, &req, &NoHooks)
            .await
            .map(|r| r.outcome)
            .map_err(|e| e.to_string())
    });
    // Let go of the row once all are seen queued on it (or the bound stopped a hang).
    let limit = Duration::from_millis(QUEUE_WAIT_MS);
    let release = release_once_queued(&db, hold, THREADS as i64, limit);
    let (outcomes, waiting) = tokio::join!(racing, release);
    let outcomes: Vec<Result<Outcome, String>> = outcomes?;
    let waiting = waiting?;
    // Evidence that they raced: all 32 waited on the held row at one moment (a
    // serialized run could show at most 1); then the holder rolled back.
    ctx.check_eq(
        "all 32 placements waited on the held row at one moment (pg_stat_activity, wait_event_type=Lock)",
        THREADS as i64,
        waiting,
    );
    check_outcomes(ctx, &mut db, &outcomes).await
}

/// Checks the 32 outcomes (one OK, the rest INSUFFICIENT, no database errors), alice's
/// USDT, the refusals recorded for replay, and a clean reconciliation.
///
/// Errors: database errors.
async fn check_outcomes(
    ctx: &mut Ctx,
    db: &mut tokio_postgres::Client,
    outcomes: &[Result<Outcome, String>],
) -> anyhow::Result<()> {
    let t = DEFAULT_TENANT;
    let ok = outcomes
        .iter()
        .filter(|o| matches!(o, Ok(Outcome::Ok)))
        .count();
    let insufficient = outcomes
        .iter()
        .filter(|o| matches!(o, Ok(Outcome::Insufficient)))
        .count();
    let errors: Vec<&String> = outcomes.iter().filter_map(|o| o.as_ref().err()).collect();
    ctx.note(format!(
        "ok={ok} insufficient={insufficient} errors={}",
        errors.len()
    ));
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
        balance_line(db, t, "alice", Asset::Usdt).await?,
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
    let findings = frozen_balances::reconcile(db).await?;
    ctx.check(
        "reconciliation clean",
        findings.is_clean(),
        findings.summary(),
    );
    Ok(())
}
