//! F9 — deadlocks between opposite trades (the seed's advice: a fixed lock order and a
//! bounded retry).
//! Claim: two settlements that lock the same rows in request order (the buyer's row,
//! then the seller's) deadlock when alice buys from bob while bob buys from alice; a
//! fixed order (sorted by account and asset) cannot form the cycle; the product's fill
//! locks in the fixed order and retries a 40P01 with the same business id at most
//! `MAX_DEADLOCK_ATTEMPTS` times, so every fill settles exactly once.
//! Setup: alice and bob deposit 10 000 USDT and 1 BTC each. Four pairs of opposite
//! trades, each pair settling at once.
//! - request order: each settlement locks its buyer's USDT row, meets the other at a
//!   barrier (both hold their first lock), then locks its seller's row: a cycle, forced.
//!   `deadlock_timeout` is 10 ms in these transactions so the detector runs at once.
//! - fixed order: the same settlements, both rows locked in sorted order, released
//!   together by a barrier before the first lock.
//! - the product: per pair alice BUY 0.1 @ 5000 against bob's SELL, bob BUY 0.1 @ 5000
//!   against alice's SELL; both fills meet at a barrier hook (`registered`), then settle.
//!
//! The first two rows lock rows and bump `version` only; no amount moves.
//! Checks: request order → at least one 40P01 (one per pair in practice; the count is
//! printed redacted); fixed order → none, every settlement committed; the product →
//! 8 fills OK, each recorded once, retries within the bound (printed redacted); alice
//! and bob each paid 1 USDT of fees per pair; the invariant.
//! Fails if: a row's figures differ.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::Mutex;

use case_kit::{Case, Ctx};
use frozen_balances::events::{DEADLOCK_DETECTED, MAX_DEADLOCK_ATTEMPTS};
use frozen_balances::{
    Asset, EventKind, FillResult, FrozenError, HookAbort, HookContext, HookPoint, Hooks, Market,
    Outcome, SYS_FEE, Side,
};
use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use tokio::sync::Barrier;

use super::fixtures::{
    CountAttempts, Plan, T, deposit, fill, fill_request, invariant, order, placed,
};
use super::spot::balance_line;

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "F9",
        "deadlocks between opposite trades: request order deadlocks, fixed order and bounded retry settle once",
        |ctx| run(ctx, Plan::Forced).boxed(),
    )
    .connections(5)
}

/// Pairs of opposite trades per row.
pub const PAIRS: usize = 4;
/// `deadlock_timeout` of the naive settlements, milliseconds (PostgreSQL docs §19.12).
pub const DEADLOCK_TIMEOUT_MS: u64 = 10;

/// The case body; under [`Plan::Harmless`] the naive settlements of a pair run one
/// after the other, so request order cannot deadlock and the control must fail.
///
/// Errors: database errors, a placement refused.
pub async fn run(ctx: &mut Ctx, plan: Plan) -> anyhow::Result<()> {
    let mut db = ctx.connect().await?;
    for (i, account) in ["alice", "bob"].into_iter().enumerate() {
        deposit(
            &mut db,
            &format!("dep-090{i}-u"),
            account,
            Asset::Usdt,
            10_000,
        )
        .await?;
        deposit(&mut db, &format!("dep-090{i}-b"), account, Asset::Btc, 1).await?;
    }

    let (deadlocks, committed) = naive_pairs(ctx, false, plan).await?;
    ctx.note(format!(
        "request order: pairs={PAIRS} deadlocks_n={deadlocks} committed_n={committed}"
    ));
    ctx.record("request_order_deadlocks", deadlocks.into());
    ctx.exposes(
        "request order: at least one settlement fails with 40P01",
        deadlocks >= 1,
        format!("deadlocks>=1: {}", deadlocks >= 1),
    );
    ctx.check_eq(
        "request order: each settlement either committed or was the victim",
        2 * PAIRS,
        deadlocks + committed,
    );

    let (deadlocks, committed) = naive_pairs(ctx, true, plan).await?;
    ctx.note(format!(
        "fixed order: pairs={PAIRS} deadlocks={deadlocks} committed={committed}"
    ));
    ctx.check_eq("fixed order: no 40P01", 0, deadlocks);
    ctx.check_eq(
        "fixed order: every settlement committed",
        2 * PAIRS,
        committed,
    );

    // The product.
    let attempts = MeetOnce::default();
    let outcomes = product_pairs(ctx, &mut db, &attempts).await?;
    check_product(ctx, &db, &outcomes, &attempts).await?;
    invariant(ctx, &mut db).await?;
    Ok(())
}

/// [`PAIRS`] pairs of [`naive_pair`], one after another. Returns the sums of
/// (settlements that failed with 40P01, settlements that committed).
///
/// Errors: as [`naive_pair`].
async fn naive_pairs(ctx: &Ctx, sorted: bool, plan: Plan) -> anyhow::Result<(usize, usize)> {
    let (mut deadlocks, mut committed) = (0, 0);
    for _ in 0..PAIRS {
        let (d, c) = naive_pair(ctx, sorted, plan).await?;
        deadlocks += d;
        committed += c;
    }
    Ok((deadlocks, committed))
}

/// The product's pairs: per pair alice BUY 0.1 @ 5000 filled against bob's SELL on `db`
/// and bob BUY 0.1 @ 5000 against alice's SELL on a second connection, both at once
/// with `attempts` as the hook. Returns every fill's result, pair by pair.
///
/// Errors: database errors, a placement refused.
async fn product_pairs(
    ctx: &Ctx,
    db: &mut tokio_postgres::Client,
    attempts: &MeetOnce,
) -> anyhow::Result<Vec<Result<FillResult, FrozenError>>> {
    let mut other = ctx.connect().await?;
    let mut outcomes = Vec::new();
    for p in 0..PAIRS {
        let (m, buy, sell) = (Market::BtcUsdt, Side::Buy, Side::Sell);
        let ab = placed(
            db,
            &order(&format!("p09-{p}-ab"), "alice", m, buy, "0.1", "5000")?,
        )
        .await?;
        let bs = placed(
            db,
            &order(&format!("p09-{p}-bs"), "bob", m, sell, "0.1", "5000")?,
        )
        .await?;
        let bb = placed(
            db,
            &order(&format!("p09-{p}-bb"), "bob", m, buy, "0.1", "5000")?,
        )
        .await?;
        let as_ = placed(
            db,
            &order(&format!("p09-{p}-as"), "alice", m, sell, "0.1", "5000")?,
        )
        .await?;
        let one = fill_request(&format!("fill-09-{p}-a"), ab, bs, "0.1", "5000")?;
        let two = fill_request(&format!("fill-09-{p}-b"), bb, as_, "0.1", "5000")?;
        let (x, y) = tokio::join!(fill(db, &one, attempts), fill(&mut other, &two, attempts));
        outcomes.push(x);
        outcomes.push(y);
    }
    Ok(outcomes)
}

/// Checks the product's fills: every one OK, no 40P01 returned, attempts within the
/// bound (counted by `attempts`), each recorded once, and the fees paid.
///
/// Errors: database errors.
async fn check_product(
    ctx: &mut Ctx,
    db: &tokio_postgres::Client,
    outcomes: &[Result<FillResult, FrozenError>],
    attempts: &MeetOnce,
) -> anyhow::Result<()> {
    let ok = outcomes
        .iter()
        .filter(|o| matches!(o, Ok(r) if r.outcome == Outcome::Ok && !r.replayed))
        .count();
    let deadlocked = outcomes
        .iter()
        .filter(|o| matches!(o, Err(e) if e.sqlstate() == Some(DEADLOCK_DETECTED)))
        .count();
    let counts = attempts.counter.attempts();
    let retries: u32 = counts.values().map(|a| a - 1).sum();
    let most = counts.values().copied().max().unwrap_or(0);
    ctx.note(format!(
        "the product: fills={} ok={ok} 40P01_returned={deadlocked} retries_n={retries} \
         max_attempts={MAX_DEADLOCK_ATTEMPTS}",
        outcomes.len()
    ));
    ctx.record("product_retries", retries.into());
    ctx.check_eq("the product: every fill OK", 2 * PAIRS, ok);
    ctx.check_eq("the product: no 40P01 reaches the caller", 0, deadlocked);
    ctx.check(
        "the product: attempts per fill within the bound",
        (1..=MAX_DEADLOCK_ATTEMPTS).contains(&most),
        format!("within_bound={}", most <= MAX_DEADLOCK_ATTEMPTS),
    );
    let recorded: i64 = db
        .query_one(
            "SELECT count(*) FROM balance_operation WHERE kind = 'FILL' AND outcome = 'OK'",
            &[],
        )
        .await?
        .get(0);
    ctx.check_eq("each fill recorded once", (2 * PAIRS) as i64, recorded);
    for account in ["alice", "bob"] {
        ctx.check_eq(
            format!("{account} USDT: 1 USDT of fees per pair"),
            "available=9996.000000 frozen=0.000000".to_string(),
            balance_line(db, T, account, Asset::Usdt).await?,
        );
    }
    ctx.check_eq(
        "sys-fee USDT",
        "available=8.000000 frozen=0.000000".to_string(),
        balance_line(db, T, SYS_FEE, Asset::Usdt).await?,
    );
    Ok(())
}

/// One pair of opposite settlements in the naive form: alice's trade locks alice's USDT
/// row then bob's; bob's the reverse (`sorted`: both alice's first). Under
/// [`Plan::Forced`] both run at once (a barrier between the first and the second lock in
/// request order, before the first lock in sorted order); under [`Plan::Harmless`] one
/// after the other. Returns (settlements that failed with 40P01, settlements that
/// committed).
async fn naive_pair(ctx: &Ctx, sorted: bool, plan: Plan) -> anyhow::Result<(usize, usize)> {
    let results = match plan {
        Plan::Forced => {
            ctx.race(2, move |racer| async move {
                let mut client = racer.client;
                settle(
                    &mut client,
                    racer.index,
                    sorted,
                    Some(racer.barrier.as_ref()),
                )
                .await
            })
            .await?
        }
        Plan::Harmless => {
            let mut client = ctx.connect().await?;
            vec![
                settle(&mut client, 0, sorted, None).await,
                settle(&mut client, 1, sorted, None).await,
            ]
        }
    };
    let mut deadlocks = 0;
    let mut committed = 0;
    for result in results {
        match result {
            Ok(true) => committed += 1,
            Ok(false) => deadlocks += 1,
            Err(e) => anyhow::bail!("a naive settlement failed otherwise: {e}"),
        }
    }
    Ok((deadlocks, committed))
}

/// One naive settlement: trade 0 is alice buying from bob, trade 1 the reverse; locks
/// the buyer's then the seller's USDT row (`sorted`: in account order), meeting the
/// other settlement at `barrier` if given, then bumps both rows' `version`. Returns
/// whether it committed (`false`: it was the deadlock's victim).
async fn settle(
    client: &mut tokio_postgres::Client,
    trade: usize,
    sorted: bool,
    barrier: Option<&Barrier>,
) -> Result<bool, String> {
    let (buyer, seller) = if trade == 0 {
        ("alice", "bob")
    } else {
        ("bob", "alice")
    };
    let mut order = [buyer, seller];
    if sorted {
        order.sort();
    }
    let tx = client.transaction().await.map_err(|e| e.to_string())?;
    let settled = async {
        tx.batch_execute(&format!(
            "SET LOCAL deadlock_timeout = '{DEADLOCK_TIMEOUT_MS}ms'"
        ))
        .await?;
        if let (true, Some(barrier)) = (sorted, barrier) {
            barrier.wait().await;
        }
        for (i, account) in order.into_iter().enumerate() {
            tx.execute(
                "SELECT 1 FROM balance WHERE tenant_id = $1 AND account_id = $2 \
                 AND asset = 'USDT' FOR UPDATE",
                &[&T, &account],
            )
            .await?;
            if let (0, false, Some(barrier)) = (i, sorted, barrier) {
                // Both hold their first row now: the cycle is certain.
                barrier.wait().await;
            }
        }
        tx.execute(
            "UPDATE balance SET version = version + 1 WHERE tenant_id = $1 \
             AND account_id = ANY($2) AND asset = 'USDT'",
            &[&T, &vec![buyer, seller]],
        )
        .await?;
        Ok::<(), tokio_postgres::Error>(())
    }
    .await;
    match settled {
        Ok(()) => tx.commit().await.map(|()| true).map_err(|e| e.to_string()),
        Err(e) if e.code().map(|c| c.code()) == Some(DEADLOCK_DETECTED) => Ok(false),
        Err(e) => Err(e.to_string()),
    }
}

/// Counts attempts per fill, and holds the first attempt of each fill at `registered`
/// until a second fill gets there too (a barrier of two, once per fill: a retry passes).
#[derive(Default)]
struct MeetOnce {
    counter: CountAttempts,
    met: Mutex<BTreeSet<String>>,
    barrier: Mutex<Option<Arc<Barrier>>>,
}

impl MeetOnce {
    fn barrier(&self) -> Arc<Barrier> {
        let mut slot = self.barrier.lock().unwrap_or_else(|p| p.into_inner());
        match slot.take() {
            // The second of a pair takes the barrier the first left.
            Some(barrier) => barrier,
            None => {
                let barrier = Arc::new(Barrier::new(2));
                *slot = Some(barrier.clone());
                barrier
            }
        }
    }
}

impl Hooks for MeetOnce {
    fn at<'a>(&'a self, ctx: HookContext<'a>) -> BoxFuture<'a, Result<(), HookAbort>> {
        Box::pin(async move {
            self.counter.at(ctx).await?;
            if ctx.event == EventKind::Fill && ctx.point == HookPoint::Registered {
                let first = self
                    .met
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(ctx.business_id.to_owned());
                if first {
                    self.barrier().wait().await;
                }
            }
            Ok(())
        })
    }
}
