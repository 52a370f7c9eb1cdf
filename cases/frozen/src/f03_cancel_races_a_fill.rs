//! F3 — a cancel races a fill (SPEC §8, the seed's table).
//! Claim: a cancel and a fill of the same order serialise on the order's row lock, so
//! exactly one of two histories happens, and in each the order ends holding nothing:
//! fill first (the fill settles 0.4, the cancel releases the remaining 3003) or cancel
//! first (the cancel releases all 5005, the fill is refused ORDER_CLOSED). Never both
//! the release of the whole freeze and a fill, never a remainder left behind.
//! Setup: per round a fresh buyer (10 000 USDT) and seller (1 BTC); BUY 1.0 @ 5000
//! (5005 frozen) and SELL 1.0 @ 5000; then a fill of 0.4 @ 5000 and a cancel of the BUY
//! at once, on two connections.
//! - two forced rounds: the fill held at `before-commit` (a hook, holding both order
//!   locks) until the cancel is seen blocked on a lock (`pg_stat_activity`), then let go;
//!   and the reverse.
//! - the same two forced rounds through the service (`ledger-svc` with fault injection):
//!   the fault `spot-before-commit` paused for one kind of event only (`"event": "FILL"`,
//!   then `"CANCEL"`), the fill posted on the admin route, the cancel on the public one.
//! - 50 free rounds: both released together, nothing held.
//!
//! Checks: the forced rounds give their history and figures; every free round is one of
//! the two histories with its figures (the count of each is printed redacted); the
//! invariant and the reconciliation.
//! Fails if: any round is neither history, or any figure differs.

use std::time::Duration;

use case_kit::{Case, Ctx};
use frozen_balances::amount::format_units;
use frozen_balances::{
    Asset, CancelResult, EventKind, FillResult, FrozenError, HookPoint, Hooks, Market, NoHooks,
    Outcome, Side,
};
use futures_util::FutureExt;
use launch::service::{Reply, Service, ServiceOptions};
use serde_json::json;

use super::fixtures::{
    Gate, T, cancel, deposit, fill, fill_request, invariant, order, placed, wait_for_lock_waiters,
};
use super::spot::{SpotCalls, SpotReply, balance_line, spot_service};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "F3",
        "cancel races a fill: one history or the other, never a remainder left",
        |ctx| run(ctx).boxed(),
    )
    .connections(4 + POOL_SIZE as u32)
}

/// Connections of the service's pool.
const POOL_SIZE: usize = 2;
/// Longest pause of a held event in the service, milliseconds (released long before).
pub const HOLD_LIMIT_MS: u64 = 10_000;
/// The fault point the service rounds use.
const POINT: &str = "spot-before-commit";

/// Free rounds after the two forced ones.
pub const FREE_ROUNDS: usize = 50;

/// Which event went first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum History {
    FillFirst,
    CancelFirst,
}

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let mut db = ctx.connect().await?;
    let mut a = ctx.connect().await?;
    let mut b = ctx.connect().await?;

    let held = Gate::new(EventKind::Fill, HookPoint::BeforeCommit);
    let seen = round(&mut db, &mut a, &mut b, "r00", &held, Some(&held)).await?;
    ctx.note(format!(
        "forced, the fill held at before-commit: {}",
        seen.1
    ));
    ctx.check_eq(
        "fill held: the fill settles, the cancel releases the remaining 3003",
        History::FillFirst.to_string(),
        seen.0.map_or_else(|e| e, |h| h.to_string()),
    );
    let held = Gate::new(EventKind::Cancel, HookPoint::BeforeCommit);
    let seen = round(&mut db, &mut a, &mut b, "r01", &held, Some(&held)).await?;
    ctx.note(format!(
        "forced, the cancel held at before-commit: {}",
        seen.1
    ));
    ctx.check_eq(
        "cancel held: the cancel releases 5005, the fill is refused ORDER_CLOSED",
        History::CancelFirst.to_string(),
        seen.0.map_or_else(|e| e, |h| h.to_string()),
    );

    service_rounds(ctx, &mut db).await?;
    free_rounds(ctx, &mut db, &mut a, &mut b).await?;
    invariant(ctx, &mut db).await?;
    Ok(())
}

/// The two forced rounds through the service (`s00` with the FILL held, `s01` with the
/// CANCEL held), each checked against its history's figures; starts the service with
/// fault injection and stops it after.
///
/// Errors: the service could not start or stop; a round failed to run.
async fn service_rounds(ctx: &mut Ctx, db: &mut tokio_postgres::Client) -> anyhow::Result<()> {
    let service = Service::start(
        ctx,
        spot_service(ServiceOptions {
            fault_injection: true,
            pool_size: POOL_SIZE,
            ..ServiceOptions::default()
        }),
    )
    .await?;
    for (tag, held, expected) in [
        ("s00", "FILL", "fill=OK cancel=OK released=3003.000000"),
        (
            "s01",
            "CANCEL",
            "fill=ORDER_CLOSED cancel=OK released=5005.000000",
        ),
    ] {
        let seen = service_round(db, &service, tag, held).await?;
        ctx.check_eq(
            format!("through the service, the {held} held at {POINT} (\"event\": \"{held}\")"),
            expected.to_string(),
            seen,
        );
    }
    service.stop_checked(ctx).await?;
    Ok(())
}

/// [`FREE_ROUNDS`] rounds with nothing held (`r02`, `r03`, …): notes and records how
/// many went each way and checks every one is one of the two histories.
///
/// Errors: a round failed to run.
async fn free_rounds(
    ctx: &mut Ctx,
    db: &mut tokio_postgres::Client,
    a: &mut tokio_postgres::Client,
    b: &mut tokio_postgres::Client,
) -> anyhow::Result<()> {
    let (mut fill_first, mut cancel_first, mut other) = (0, 0, Vec::new());
    for i in 0..FREE_ROUNDS {
        let (history, seen) = round(db, a, b, &format!("r{:02}", i + 2), &NoHooks, None).await?;
        match history {
            Ok(History::FillFirst) => fill_first += 1,
            Ok(History::CancelFirst) => cancel_first += 1,
            Err(e) => other.push(format!("{e}: {seen}")),
        }
    }
    ctx.note(format!(
        "free rounds: {FREE_ROUNDS}; fill_first_n={fill_first} cancel_first_n={cancel_first}"
    ));
    ctx.record("fill_first", fill_first.into());
    ctx.record("cancel_first", cancel_first.into());
    ctx.check(
        "every free round is one of the two histories, with its figures",
        other.is_empty(),
        other.first().cloned().unwrap_or_default(),
    );
    Ok(())
}

impl std::fmt::Display for History {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            History::FillFirst => "fill first",
            History::CancelFirst => "cancel first",
        })
    }
}

/// One round on fresh accounts `b3-<tag>` and `s3-<tag>`: the fill on `a` with `hooks`,
/// the cancel on `b` with `hooks`; with `gate`, the cancel starts once the gate holds its
/// event, and the gate lets go once the other event is blocked on a lock. Returns the
/// history (or what was wrong) and a line of what was seen.
async fn round(
    db: &mut tokio_postgres::Client,
    a: &mut tokio_postgres::Client,
    b: &mut tokio_postgres::Client,
    tag: &str,
    hooks: &dyn Hooks,
    gate: Option<&Gate>,
) -> anyhow::Result<(Result<History, String>, String)> {
    let (buyer, buy, sell) = fresh_pair(db, tag).await?;
    let req = fill_request(&format!("fill-{tag}"), buy, sell, "0.4", "5000")?;
    let cancel_id = format!("cancel-{tag}");
    let (filled, cancelled) = match gate {
        None => {
            tokio::join!(
                fill(a, &req, hooks),
                cancel(b, &cancel_id, &buyer, buy, hooks)
            )
        }
        Some(gate) => {
            let watcher: &tokio_postgres::Client = db;
            // The held event starts at once; the other once the gate holds it; the gate
            // lets go once the other is blocked behind the held one's locks.
            let let_go = async {
                let blocked = wait_for_lock_waiters(watcher, 1).await;
                gate.release();
                blocked
            };
            if gate.kind() == EventKind::Fill {
                let (filled, (cancelled, released)) = tokio::join!(fill(a, &req, hooks), async {
                    gate.reached().await;
                    tokio::join!(cancel(b, &cancel_id, &buyer, buy, hooks), let_go)
                });
                released?;
                (filled, cancelled)
            } else {
                let (cancelled, (filled, released)) =
                    tokio::join!(cancel(b, &cancel_id, &buyer, buy, hooks), async {
                        gate.reached().await;
                        tokio::join!(fill(a, &req, hooks), let_go)
                    });
                released?;
                (filled, cancelled)
            }
        }
    };
    let usdt = balance_line(db, T, &buyer, Asset::Usdt).await?;
    Ok(judge(&filled, &cancelled, &usdt))
}

/// Which history a round's results show, with the buyer's USDT line `usdt`: the fill
/// first (fill OK, 3003 released, 7998 available) or the cancel first (fill
/// ORDER_CLOSED, 5005 released, 10 000 available), else `neither history`. Returns it
/// with a line of what was seen.
fn judge(
    filled: &Result<FillResult, FrozenError>,
    cancelled: &Result<CancelResult, FrozenError>,
    usdt: &str,
) -> (Result<History, String>, String) {
    let seen = format!(
        "fill {} cancel {} buyer USDT {usdt}",
        filled
            .as_ref()
            .map_or_else(|e| e.to_string(), |r| r.outcome.as_str().to_string()),
        cancelled.as_ref().map_or_else(
            |e| e.to_string(),
            |r| format!(
                "{} released={}",
                r.outcome.as_str(),
                format_units(Asset::Usdt, r.released)
            )
        ),
    );
    let history = match (filled, cancelled) {
        (Ok(f), Ok(c))
            if f.outcome == Outcome::Ok
                && c.outcome == Outcome::Ok
                && c.released == 3_003_000_000
                && usdt == "available=7998.000000 frozen=0.000000" =>
        {
            Ok(History::FillFirst)
        }
        (Ok(f), Ok(c))
            if f.outcome == Outcome::OrderClosed
                && c.outcome == Outcome::Ok
                && c.released == 5_005_000_000
                && usdt == "available=10000.000000 frozen=0.000000" =>
        {
            Ok(History::CancelFirst)
        }
        _ => Err("neither history".to_string()),
    };
    (history, seen)
}

/// One forced round through the service: the fault at [`POINT`] paused for `held` events
/// only; the held event is posted at once, the other once the service holds the first,
/// and the fault is released once the other is blocked on a lock. Returns
/// `fill=<outcome> cancel=<outcome> released=<amount>`.
async fn service_round(
    db: &mut tokio_postgres::Client,
    service: &Service,
    tag: &str,
    held: &str,
) -> anyhow::Result<String> {
    let (buyer, buy, sell) = fresh_pair(db, tag).await?;
    service
        .arm_fault(
            POINT,
            json!({"action": "pause", "hold_ms": HOLD_LIMIT_MS, "count": 1, "event": held}),
        )
        .await?;
    let (fill_id, cancel_id) = (format!("fill-{tag}"), format!("cancel-{tag}"));
    let fill = service.fill(&fill_id, buy, sell, "0.4", "5000");
    let cancel = service.cancel(T, &cancel_id, &buyer, buy);
    let watcher: &tokio_postgres::Client = db;
    let let_go = async {
        wait_for_lock_waiters(watcher, 1).await?;
        service.release_fault(POINT).await?;
        Ok::<(), anyhow::Error>(())
    };
    let holding = wait_until_held(service, held);
    let (filled, cancelled, released) = if held == "FILL" {
        let (filled, (cancelled, released)) = tokio::join!(fill, async {
            if let Err(e) = holding.await {
                return (None, Err(e));
            }
            let (cancelled, released) = tokio::join!(cancel, let_go);
            (Some(cancelled), released)
        });
        (Some(filled), cancelled, released)
    } else {
        let (cancelled, (filled, released)) = tokio::join!(cancel, async {
            if let Err(e) = holding.await {
                return (None, Err(e));
            }
            let (filled, released) = tokio::join!(fill, let_go);
            (Some(filled), released)
        });
        (filled, Some(cancelled), released)
    };
    released?;
    let missing = || anyhow::anyhow!("an event was not sent");
    let filled: Reply = filled.ok_or_else(missing)??;
    let cancelled: Reply = cancelled.ok_or_else(missing)??;
    Ok(format!(
        "fill={} cancel={} released={}",
        filled.outcome(),
        cancelled.outcome(),
        cancelled.text("released")
    ))
}

/// Waits until the service holds one event at [`POINT`], for at most
/// [`HOLD_LIMIT_MS`] (a bound against a hang, not a claim).
///
/// Errors: transport errors; the service never held the `held` event.
async fn wait_until_held(service: &Service, held: &str) -> anyhow::Result<()> {
    let state = service
        .held_within(POINT, Duration::from_millis(HOLD_LIMIT_MS))
        .await?;
    anyhow::ensure!(state.holding >= 1, "the service never held the {held}");
    Ok(())
}

/// Fresh accounts `b3-<tag>` (10 000 USDT) and `s3-<tag>` (1 BTC), with the buyer's
/// BUY 1.0 @ 5000 and the seller's SELL 1.0 @ 5000 placed. Returns `(buyer, buy order
/// id, sell order id)`.
///
/// Errors: the library's; a placement refused.
async fn fresh_pair(
    db: &mut tokio_postgres::Client,
    tag: &str,
) -> anyhow::Result<(String, i64, i64)> {
    let (buyer, seller) = (format!("b3-{tag}"), format!("s3-{tag}"));
    deposit(db, &format!("dep-{buyer}"), &buyer, Asset::Usdt, 10_000).await?;
    deposit(db, &format!("dep-{seller}"), &seller, Asset::Btc, 1).await?;
    let m = Market::BtcUsdt;
    let buy = placed(
        db,
        &order(&format!("p-{buyer}"), &buyer, m, Side::Buy, "1.0", "5000")?,
    )
    .await?;
    let sell = placed(
        db,
        &order(
            &format!("p-{seller}"),
            &seller,
            m,
            Side::Sell,
            "1.0",
            "5000",
        )?,
    )
    .await?;
    Ok((buyer, buy, sell))
}
