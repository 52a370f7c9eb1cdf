//! F13 — a withdrawal's normal path, through the outbox, the executor and the network.
//! Claim: a withdrawal request freezes its amount and, in the same transaction, writes
//! the `REQUESTED` record and an outbox event, with no call to the network; the
//! executor (its own process) broadcasts under the withdrawal id, the network confirms,
//! and the frozen amount is consumed — available unchanged, the books per asset still
//! 0, the states `REQUESTED BROADCAST CONFIRMED` in order, and the network's own log
//! shows one transfer under that id. A same-id repeat of the request replays; a request
//! above available is INSUFFICIENT and moves nothing; a broadcast the network refuses
//! ends `FAILED` with the amount released.
//! Setup: bob deposits 2 BTC; w-1301 withdraws 0.5 BTC, w-1302 0.25 BTC (refused).
//! Fails if: any balance, state, network log line or reconciliation differs.

use case_kit::{Case, Ctx};
use external_net::wire::{Action, ControlRequest};
use frozen_balances::withdraw::{SYS_WITHDRAWAL, WithdrawResult};
use frozen_balances::{Asset, DEFAULT_TENANT, Outcome};
use futures_util::FutureExt;

use super::network::{StandIn, check_reconciles, deposit, run_executor_checked, states, withdraw};
use super::spot::balance_line;

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "F13",
        "withdrawal normal path: freeze + record + outbox in one transaction, broadcast by id, confirmed, consumed",
        |ctx| run(ctx).boxed(),
    )
    .connections(3)
}

/// 1 BTC in minor units.
const BTC: i64 = 100_000_000;

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let net = StandIn::start(ctx).await?;
    let mut db = ctx.connect().await?;
    deposit(
        &mut db,
        DEFAULT_TENANT,
        "dep-1301",
        "bob",
        Asset::Btc,
        2 * BTC,
    )
    .await?;
    request_w1301(ctx, &net, &mut db).await?;
    execute_w1301(ctx, &net, &db).await?;
    // A broadcast the network refuses: FAILED, released.
    refused_w1302(ctx, &net, &mut db).await?;
    check_network_and_books(ctx, &net, &mut db).await
}

/// bob withdraws `amount` BTC minor units to `destination` under `withdrawal`.
///
/// Errors: the library's.
async fn bob_withdraws(
    db: &mut tokio_postgres::Client,
    withdrawal: &str,
    amount: i64,
    destination: &str,
) -> anyhow::Result<WithdrawResult> {
    withdraw(
        db,
        DEFAULT_TENANT,
        withdrawal,
        "bob",
        Asset::Btc,
        amount,
        destination,
    )
    .await
}

/// Requests w-1301 (0.5 BTC) and checks what the request alone did: the amount frozen,
/// one outbox event, nothing sent; then a same-id repeat replays, w-1303 above available
/// is INSUFFICIENT, neither moves anything, and the books reconcile.
///
/// Errors: database errors; the stand-in did not answer.
async fn request_w1301(
    ctx: &mut Ctx,
    net: &StandIn,
    db: &mut tokio_postgres::Client,
) -> anyhow::Result<()> {
    let t = DEFAULT_TENANT;
    let first = bob_withdraws(db, "w-1301", BTC / 2, "addr-bob-1").await?;
    ctx.check_eq(
        "w-1301 requested: OK",
        Outcome::Ok.as_str(),
        first.outcome.as_str(),
    );
    ctx.check_eq(
        "bob BTC after the request: 0.5 frozen",
        "available=1.50000000 frozen=0.50000000".to_string(),
        balance_line(db, t, "bob", Asset::Btc).await?,
    );
    let outbox: i64 = db
        .query_one(
            "SELECT count(*) FROM withdrawal_outbox WHERE withdrawal_id = 'w-1301' AND processed_at IS NULL",
            &[],
        )
        .await?
        .get(0);
    ctx.check_eq("one outbox event written with the request", 1, outbox);
    ctx.check_eq(
        "the network has seen nothing yet",
        0,
        net.net().transfers().await?.len(),
    );
    let repeat = bob_withdraws(db, "w-1301", BTC / 2, "addr-bob-1").await?;
    ctx.check_eq("the same request again: replayed", true, repeat.replayed);
    let too_much = bob_withdraws(db, "w-1303", 5 * BTC, "addr-bob-1").await?;
    ctx.check_eq(
        "w-1303 above available: INSUFFICIENT",
        Outcome::Insufficient.as_str(),
        too_much.outcome.as_str(),
    );
    ctx.check_eq(
        "bob BTC unchanged by the replay and the refusal",
        "available=1.50000000 frozen=0.50000000".to_string(),
        balance_line(db, t, "bob", Asset::Btc).await?,
    );
    check_reconciles(ctx, db, "reconciliation while w-1301 is pending").await?;
    Ok(())
}

/// Runs the executor once and checks w-1301 went `REQUESTED BROADCAST CONFIRMED`, its
/// frozen amount consumed and paid to sys-withdrawal.
///
/// Errors: the executor could not run; database errors.
async fn execute_w1301(
    ctx: &mut Ctx,
    net: &StandIn,
    db: &tokio_postgres::Client,
) -> anyhow::Result<()> {
    let t = DEFAULT_TENANT;
    run_executor_checked(ctx, net, "executor", "run", &[]).await?;
    ctx.check_eq(
        "w-1301 states in order",
        "REQUESTED BROADCAST CONFIRMED".to_string(),
        states(db, t, "w-1301").await?,
    );
    ctx.check_eq(
        "bob BTC: frozen consumed, available unchanged",
        "available=1.50000000 frozen=0.00000000".to_string(),
        balance_line(db, t, "bob", Asset::Btc).await?,
    );
    ctx.check_eq(
        "sys-withdrawal BTC: what went out",
        "available=0.50000000 frozen=0.00000000".to_string(),
        balance_line(db, t, SYS_WITHDRAWAL, Asset::Btc).await?,
    );
    Ok(())
}

/// Requests w-1302 (0.25 BTC), has the network refuse the next broadcast, runs the
/// executor and checks w-1302 went `REQUESTED FAILED` with its amount released.
///
/// Errors: the stand-in or the executor failed; database errors.
async fn refused_w1302(
    ctx: &mut Ctx,
    net: &StandIn,
    db: &mut tokio_postgres::Client,
) -> anyhow::Result<()> {
    let t = DEFAULT_TENANT;
    bob_withdraws(db, "w-1302", BTC / 4, "addr-bob-2").await?;
    net.net()
        .control(&ControlRequest {
            action: Action::Refuse,
            delay_ms: 0,
            count: 1,
        })
        .await?;
    run_executor_checked(ctx, net, "executor", "run", &[]).await?;
    ctx.check_eq(
        "w-1302 states in order",
        "REQUESTED FAILED".to_string(),
        states(db, t, "w-1302").await?,
    );
    ctx.check_eq(
        "bob BTC: the refused amount released",
        "available=1.50000000 frozen=0.00000000".to_string(),
        balance_line(db, t, "bob", Asset::Btc).await?,
    );
    Ok(())
}

/// Notes the network's log and checks it (w-1301 out once, w-1302 refused), then the
/// reconciliation, noting the per-asset sums when it is clean.
///
/// Errors: the stand-in did not answer; database errors.
async fn check_network_and_books(
    ctx: &mut Ctx,
    net: &StandIn,
    db: &mut tokio_postgres::Client,
) -> anyhow::Result<()> {
    let transfers = super::network::note_log(net, ctx).await?;
    let summary: Vec<String> = transfers
        .iter()
        .map(|t| format!("{}:{}x{}", t.id, t.status, t.broadcasts))
        .collect();
    ctx.check_eq(
        "the network's log: w-1301 went out once, w-1302 was refused",
        "w-1301:CONFIRMEDx1 w-1302:REJECTEDx1".to_string(),
        summary.join(" "),
    );
    if check_reconciles(ctx, db, "reconciliation at the end").await? {
        let findings = frozen_balances::reconcile(db).await?;
        ctx.note(format!(
            "per-asset sums: {}",
            findings.totals_text(DEFAULT_TENANT)
        ));
    }
    Ok(())
}
