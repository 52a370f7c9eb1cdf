//! F14 — lost answer and a crash: a timeout does not mean the transfer did not go out.
//! Claim: the network accepts w-1401's broadcast but drops its answer; the executor
//! records `UNKNOWN` and is SIGKILLed right there (hook point `after-unknown`); a new
//! executor finds `UNKNOWN`, queries the network by the withdrawal id before anything
//! else, sees the transfer confirmed and settles: exactly one transfer in the network's
//! own log, one consumption of the frozen amount, states `REQUESTED UNKNOWN CONFIRMED`;
//! a second settlement replays and moves nothing.
//! Setup: bob deposits 2 BTC and withdraws 1 BTC.
//! Negative control: carol's withdrawal meets the same lost answer, and a naive
//! executor retries the broadcast under a new id → two transfers out for one
//! withdrawal, while the ledger consumed once and still reconciles: the loss is outside
//! the database, so no reconciliation of ours can see it.
//! Fails if: the kill is not a SIGKILL, the new executor broadcasts before querying, the
//! network shows more or fewer than one transfer, or the naive retry does not send two.

use case_kit::{Case, Ctx};
use external_net::wire::{Action, ControlRequest};
use frozen_balances::withdraw::{self, SYS_WITHDRAWAL, Status};
use frozen_balances::{Asset, DEFAULT_TENANT, NoHooks};
use futures_util::FutureExt;

use super::network::{
    StandIn, check_reconciles, deposit, launch_executor, run_executor_checked, states,
    withdraw as request,
};
use super::spot::balance_line;

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "F14",
        "lost answer and a SIGKILLed executor: the new one queries by id, one transfer out; a retry under a new id sends two",
        |ctx| run(ctx).boxed(),
    )
    .connections(3)
}

/// The negative control's anomaly.
pub const ANOMALY: &str = "a retry under a new id sends a second transfer for one withdrawal";

/// 1 BTC in minor units.
const BTC: i64 = 100_000_000;

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let net = StandIn::start(ctx).await?;
    let mut db = ctx.connect().await?;
    let t = DEFAULT_TENANT;
    deposit(&mut db, t, "dep-1401", "bob", Asset::Btc, 2 * BTC).await?;
    request(
        &mut db,
        t,
        "w-1401",
        "bob",
        Asset::Btc,
        BTC,
        "addr-bob-1401",
    )
    .await?;
    drop_next_answer(&net).await?;

    crash_after_unknown(ctx, &net, &db).await?;
    recover_by_query(ctx, &net, &mut db).await?;

    run_control(ctx, &net, true).await?;

    check_network_log(ctx, &net, &mut db).await
}

/// The first executor meets the lost answer of w-1401 and stops at `after-unknown`:
/// checks `UNKNOWN` is recorded while the network did accept the transfer, then
/// SIGKILLs the executor and checks it died by signal 9.
///
/// Errors: the executor did not stop there; the stand-in or the database failed.
async fn crash_after_unknown(
    ctx: &mut Ctx,
    net: &StandIn,
    db: &tokio_postgres::Client,
) -> anyhow::Result<()> {
    let mut first = launch_executor(ctx, net, &["--stop-at", "after-unknown"])?;
    let paused = first.wait_paused().await?;
    ctx.note(format!("first executor stopped: {}", paused.line));
    let status = withdraw::get(db, DEFAULT_TENANT, "w-1401")
        .await?
        .map(|w| w.status);
    ctx.check_eq(
        "w-1401 recorded UNKNOWN after the lost answer",
        format!("{:?}", Some(Status::Unknown)),
        format!("{status:?}"),
    );
    let out = net.net().transfers().await?;
    ctx.check_eq(
        "the network accepted w-1401 although the executor never heard it",
        "w-1401:CONFIRMED".to_string(),
        out.iter()
            .map(|t| format!("{}:{}", t.id, t.status))
            .collect::<Vec<_>>()
            .join(" "),
    );
    let end = first.kill().await?;
    ctx.note(format!("first executor {end}"));
    ctx.check_eq(
        "first executor killed by signal 9",
        9,
        end.signal().unwrap_or(0),
    );
    Ok(())
}

/// A new executor finds w-1401 `UNKNOWN`: checks its first step is the query by id,
/// that it broadcast nothing, the states, one consumption, and that a second
/// settlement replays.
///
/// Errors: the executor could not run; database errors.
async fn recover_by_query(
    ctx: &mut Ctx,
    net: &StandIn,
    db: &mut tokio_postgres::Client,
) -> anyhow::Result<()> {
    let t = DEFAULT_TENANT;
    let lines = run_executor_checked(ctx, net, "new executor", "run", &[]).await?;
    ctx.check_eq(
        "the new executor's first step: the query by id",
        "QUERY id=w-1401 answer=CONFIRMED".to_string(),
        lines.first().cloned().unwrap_or_default(),
    );
    ctx.check_eq(
        "the new executor broadcast nothing",
        0,
        lines.iter().filter(|l| l.starts_with("BROADCAST")).count(),
    );
    ctx.check_eq(
        "w-1401 states in order",
        "REQUESTED UNKNOWN CONFIRMED".to_string(),
        states(db, t, "w-1401").await?,
    );
    ctx.check_eq(
        "bob BTC: consumed once",
        "available=1.00000000 frozen=0.00000000".to_string(),
        balance_line(db, t, "bob", Asset::Btc).await?,
    );
    let again = withdraw::settle(db, t, "w-1401", Status::Confirmed, "again", &NoHooks).await?;
    ctx.check_eq("a second settlement replays", true, again.replayed);
    ctx.check_eq(
        "sys-withdrawal BTC: 1 BTC out, once",
        "available=1.00000000 frozen=0.00000000".to_string(),
        balance_line(db, t, SYS_WITHDRAWAL, Asset::Btc).await?,
    );
    Ok(())
}

/// Notes the network's log and checks w-1401 went out once and was queried once, then
/// the reconciliation.
///
/// Errors: the stand-in did not answer; database errors.
async fn check_network_log(
    ctx: &mut Ctx,
    net: &StandIn,
    db: &mut tokio_postgres::Client,
) -> anyhow::Result<()> {
    let transfers = super::network::note_log(net, ctx).await?;
    let to_bob = transfers
        .iter()
        .filter(|t| t.destination == "addr-bob-1401")
        .map(|t| format!("{}x{}", t.id, t.broadcasts))
        .collect::<Vec<_>>();
    ctx.check_eq(
        "network log: exactly one transfer for w-1401, broadcast once",
        "w-1401x1".to_string(),
        to_bob.join(" "),
    );
    let queried = net
        .net()
        .queries()
        .await?
        .iter()
        .filter(|q| q.id == "w-1401")
        .count();
    ctx.check_eq("network log: w-1401 queried by id once", 1, queried);
    check_reconciles(ctx, db, "reconciliation at the end").await?;
    Ok(())
}

async fn drop_next_answer(net: &StandIn) -> anyhow::Result<()> {
    net.net()
        .control(&ControlRequest {
            action: Action::Drop,
            delay_ms: 0,
            count: 1,
        })
        .await
}

/// The negative control on carol's withdrawal w-1451: the naive executor
/// (`--retry-under-new-id`), with the network dropping the first answer when
/// `drop_answer` (without it, the fault cannot happen and the control must FAIL).
///
/// Errors: the stand-in, the executor or the database failed.
pub async fn run_control(ctx: &mut Ctx, net: &StandIn, drop_answer: bool) -> anyhow::Result<()> {
    let mut db = ctx.connect().await?;
    let t = DEFAULT_TENANT;
    deposit(&mut db, t, "dep-1451", "carol", Asset::Btc, 2 * BTC).await?;
    request(
        &mut db,
        t,
        "w-1451",
        "carol",
        Asset::Btc,
        BTC,
        "addr-carol-1451",
    )
    .await?;
    if drop_answer {
        drop_next_answer(net).await?;
    }
    run_executor_checked(ctx, net, "naive executor", "run", &["--retry-under-new-id"]).await?;
    let out: Vec<String> = net
        .net()
        .transfers()
        .await?
        .iter()
        .filter(|t| t.destination == "addr-carol-1451")
        .map(|t| t.id.clone())
        .collect();
    ctx.exposes(
        ANOMALY,
        out.len() == 2,
        format!(
            "{} transfer(s) to addr-carol-1451: {}",
            out.len(),
            out.join(" ")
        ),
    );
    ctx.check_eq(
        "carol BTC: the ledger consumed once",
        "available=1.00000000 frozen=0.00000000".to_string(),
        balance_line(&db, t, "carol", Asset::Btc).await?,
    );
    check_reconciles(
        ctx,
        &mut db,
        "the ledger still reconciles after the naive retry",
    )
    .await?;
    Ok(())
}
