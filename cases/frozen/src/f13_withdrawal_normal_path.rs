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
use frozen_balances::withdraw::SYS_WITHDRAWAL;
use frozen_balances::{Asset, DEFAULT_TENANT, Outcome};
use futures_util::FutureExt;

use super::network::{
    StandIn, check_reconciles, deposit, note_lines, run_executor_command, states, withdraw,
};
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
    let t = DEFAULT_TENANT;
    deposit(&mut db, t, "dep-1301", "bob", Asset::Btc, 2 * BTC).await?;

    let first = withdraw(
        &mut db,
        t,
        "w-1301",
        "bob",
        Asset::Btc,
        BTC / 2,
        "addr-bob-1",
    )
    .await?;
    ctx.check_eq(
        "w-1301 requested: OK",
        Outcome::Ok.as_str(),
        first.outcome.as_str(),
    );
    ctx.check_eq(
        "bob BTC after the request: 0.5 frozen",
        "available=1.50000000 frozen=0.50000000".to_string(),
        balance_line(&db, t, "bob", Asset::Btc).await?,
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
    let repeat = withdraw(
        &mut db,
        t,
        "w-1301",
        "bob",
        Asset::Btc,
        BTC / 2,
        "addr-bob-1",
    )
    .await?;
    ctx.check_eq("the same request again: replayed", true, repeat.replayed);
    let too_much = withdraw(
        &mut db,
        t,
        "w-1303",
        "bob",
        Asset::Btc,
        5 * BTC,
        "addr-bob-1",
    )
    .await?;
    ctx.check_eq(
        "w-1303 above available: INSUFFICIENT",
        Outcome::Insufficient.as_str(),
        too_much.outcome.as_str(),
    );
    ctx.check_eq(
        "bob BTC unchanged by the replay and the refusal",
        "available=1.50000000 frozen=0.50000000".to_string(),
        balance_line(&db, t, "bob", Asset::Btc).await?,
    );
    check_reconciles(ctx, &mut db, "reconciliation while w-1301 is pending").await?;

    let (lines, end, stderr) = run_executor_command(ctx, &net, "run", &[]).await?;
    note_lines(ctx, "executor", &lines);
    ctx.check_eq(
        "executor exited with status 0",
        "exited with status 0".to_string(),
        format!("{end}{stderr}"),
    );
    ctx.check_eq(
        "w-1301 states in order",
        "REQUESTED BROADCAST CONFIRMED".to_string(),
        states(&db, t, "w-1301").await?,
    );
    ctx.check_eq(
        "bob BTC: frozen consumed, available unchanged",
        "available=1.50000000 frozen=0.00000000".to_string(),
        balance_line(&db, t, "bob", Asset::Btc).await?,
    );
    ctx.check_eq(
        "sys-withdrawal BTC: what went out",
        "available=0.50000000 frozen=0.00000000".to_string(),
        balance_line(&db, t, SYS_WITHDRAWAL, Asset::Btc).await?,
    );

    // A broadcast the network refuses: FAILED, released.
    withdraw(
        &mut db,
        t,
        "w-1302",
        "bob",
        Asset::Btc,
        BTC / 4,
        "addr-bob-2",
    )
    .await?;
    net.net()
        .control(&ControlRequest {
            action: Action::Refuse,
            delay_ms: 0,
            count: 1,
        })
        .await?;
    let (lines, end, stderr) = run_executor_command(ctx, &net, "run", &[]).await?;
    note_lines(ctx, "executor", &lines);
    ctx.check_eq(
        "executor exited with status 0",
        "exited with status 0".to_string(),
        format!("{end}{stderr}"),
    );
    ctx.check_eq(
        "w-1302 states in order",
        "REQUESTED FAILED".to_string(),
        states(&db, t, "w-1302").await?,
    );
    ctx.check_eq(
        "bob BTC: the refused amount released",
        "available=1.50000000 frozen=0.00000000".to_string(),
        balance_line(&db, t, "bob", Asset::Btc).await?,
    );

    let transfers = net.note_log(ctx).await?;
    let summary: Vec<String> = transfers
        .iter()
        .map(|t| format!("{}:{}x{}", t.id, t.status, t.broadcasts))
        .collect();
    ctx.check_eq(
        "the network's log: w-1301 went out once, w-1302 was refused",
        "w-1301:CONFIRMEDx1 w-1302:REJECTEDx1".to_string(),
        summary.join(" "),
    );
    if check_reconciles(ctx, &mut db, "reconciliation at the end").await? {
        let findings = frozen_balances::reconcile(&mut db).await?;
        ctx.note(format!("per-asset sums: {}", findings.totals_text(t)));
    }
    Ok(())
}
