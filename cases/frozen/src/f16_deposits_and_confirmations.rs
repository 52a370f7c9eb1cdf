//! F16 — deposits and confirmations.
//! Claim: the network reports an incoming transfer at 1, 2, … confirmations; the account
//! is credited exactly once, when the confirmations reach the required number
//! (3), never on an earlier or a duplicate report; a transfer the network drops (a
//! reorganisation) before then is never credited, whatever is reported after.
//! Setup: tx-1601 brings alice 0.3 BTC (reported at 1, 2, 3, 3 again, 4); tx-1602
//! brings her 0.2 BTC (reported at 1, 2, then dropped, then again). The reports are
//! read from the network stand-in by `withdrawal-executor scan-deposits`, one process
//! per scan.
//! Fails if: a credit comes early, twice, or for the dropped transfer.

use case_kit::{Case, Ctx};
use external_net::wire::DepositState;
use frozen_balances::{Asset, DEFAULT_TENANT};
use futures_util::FutureExt;

use super::network::{StandIn, check_reconciles, run_executor_checked};
use super::spot::balance_line;

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "F16",
        "deposits and confirmations: credited once at N, never on a duplicate report, never when dropped before N",
        |ctx| run(ctx).boxed(),
    )
    .connections(3)
}

/// Confirmations at which a deposit is credited.
pub const REQUIRED_CONFIRMATIONS: u32 = 3;
/// 0.1 BTC in minor units.
const TENTH_BTC: i64 = 10_000_000;
/// alice's BTC before any credit.
const NOTHING: &str = "available=0.00000000 frozen=0.00000000";
/// alice's BTC once tx-1601 is credited.
const CREDITED: &str = "available=0.30000000 frozen=0.00000000";

fn deposit(tx_id: &str, amount: i64, confirmations: u32, dropped: bool) -> DepositState {
    DepositState {
        tx_id: tx_id.into(),
        tenant_id: DEFAULT_TENANT.into(),
        account_id: "alice".into(),
        asset: "BTC".into(),
        amount,
        confirmations,
        dropped,
    }
}

/// One scan; notes its lines and returns them.
async fn scan(ctx: &mut Ctx, net: &StandIn) -> anyhow::Result<Vec<String>> {
    let required = REQUIRED_CONFIRMATIONS.to_string();
    run_executor_checked(
        ctx,
        net,
        "scan",
        "scan-deposits",
        &["--required-confirmations", &required],
    )
    .await
}

async fn alice(db: &tokio_postgres::Client) -> anyhow::Result<String> {
    balance_line(db, DEFAULT_TENANT, "alice", Asset::Btc).await
}

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let net = StandIn::start(ctx).await?;
    let mut db = ctx.connect().await?;
    ctx.note(format!("required confirmations: {REQUIRED_CONFIRMATIONS}"));
    credited_once_at_n(ctx, &net, &db).await?;
    // The second story: dropped before N.
    dropped_before_n(ctx, &net, &db).await?;
    check_end(ctx, &net, &mut db).await
}

/// Reports `tx_id` (alice, `amount` BTC minor units) at `confirmations` to the stand-in,
/// `dropped` or not.
///
/// Errors: the stand-in did not answer.
async fn report(
    net: &StandIn,
    tx_id: &str,
    amount: i64,
    confirmations: u32,
    dropped: bool,
) -> anyhow::Result<()> {
    net.net()
        .set_deposit(&deposit(tx_id, amount, confirmations, dropped))
        .await?;
    Ok(())
}

/// The first story: tx-1601 (0.3 BTC) reported below N credits nothing, at N credits,
/// and a duplicate report at N and a later one change nothing.
///
/// Errors: the stand-in or a scan failed; database errors.
async fn credited_once_at_n(
    ctx: &mut Ctx,
    net: &StandIn,
    db: &tokio_postgres::Client,
) -> anyhow::Result<()> {
    for confirmations in 1..REQUIRED_CONFIRMATIONS {
        report(net, "tx-1601", 3 * TENTH_BTC, confirmations, false).await?;
        scan(ctx, net).await?;
        ctx.check_eq(
            format!("alice BTC at {confirmations} confirmation(s): nothing credited"),
            NOTHING.to_string(),
            alice(db).await?,
        );
    }
    report(net, "tx-1601", 3 * TENTH_BTC, REQUIRED_CONFIRMATIONS, false).await?;
    let lines = scan(ctx, net).await?;
    ctx.check(
        "the report at 3 confirmations credits",
        lines
            .iter()
            .any(|l| l.contains("tx=tx-1601") && l.ends_with("effect=CREDITED")),
        lines.join("; "),
    );
    ctx.check_eq(
        "alice BTC at 3 confirmations: credited",
        CREDITED.to_string(),
        alice(db).await?,
    );
    let lines = scan(ctx, net).await?;
    ctx.check(
        "the duplicate report at 3 changes nothing",
        lines
            .iter()
            .any(|l| l.contains("tx=tx-1601") && l.ends_with("effect=ALREADY_CREDITED")),
        lines.join("; "),
    );
    report(
        net,
        "tx-1601",
        3 * TENTH_BTC,
        REQUIRED_CONFIRMATIONS + 1,
        false,
    )
    .await?;
    scan(ctx, net).await?;
    ctx.check_eq(
        "alice BTC after the duplicate and a later report: credited once",
        CREDITED.to_string(),
        alice(db).await?,
    );
    Ok(())
}

/// The second story: tx-1602 (0.2 BTC) reported below N, then dropped; the drop is
/// recorded and nothing is credited, also on the scan after it.
///
/// Errors: the stand-in or a scan failed; database errors.
async fn dropped_before_n(
    ctx: &mut Ctx,
    net: &StandIn,
    db: &tokio_postgres::Client,
) -> anyhow::Result<()> {
    for confirmations in 1..REQUIRED_CONFIRMATIONS {
        report(net, "tx-1602", 2 * TENTH_BTC, confirmations, false).await?;
        scan(ctx, net).await?;
    }
    report(
        net,
        "tx-1602",
        2 * TENTH_BTC,
        REQUIRED_CONFIRMATIONS - 1,
        true,
    )
    .await?;
    let lines = scan(ctx, net).await?;
    ctx.check(
        "the drop before 3 confirmations is recorded",
        lines
            .iter()
            .any(|l| l.contains("tx=tx-1602") && l.ends_with("effect=DROPPED")),
        lines.join("; "),
    );
    scan(ctx, net).await?;
    ctx.check_eq(
        "alice BTC: the dropped transfer never credited",
        CREDITED.to_string(),
        alice(db).await?,
    );
    Ok(())
}

/// Checks one operation for network deposits (tx-1601's), notes the network's deposits
/// and log, and checks the reconciliation.
///
/// Errors: the stand-in did not answer; database errors.
async fn check_end(
    ctx: &mut Ctx,
    net: &StandIn,
    db: &mut tokio_postgres::Client,
) -> anyhow::Result<()> {
    let credits: Vec<String> = db
        .query(
            "SELECT business_id FROM balance_operation WHERE business_id LIKE 'chain:%' ORDER BY business_id",
            &[],
        )
        .await?
        .iter()
        .map(|row| row.get(0))
        .collect();
    ctx.check_eq(
        "operations for network deposits: one, for tx-1601",
        "chain:tx-1601".to_string(),
        credits.join(" "),
    );
    for d in net.net().deposits().await? {
        ctx.note(format!(
            "network deposit {} to {} {} units {} confirmations={} dropped={}",
            d.tx_id, d.account_id, d.amount, d.asset, d.confirmations, d.dropped
        ));
    }
    super::network::note_log(net, ctx).await?;
    check_reconciles(ctx, db, "reconciliation at the end").await?;
    Ok(())
}
