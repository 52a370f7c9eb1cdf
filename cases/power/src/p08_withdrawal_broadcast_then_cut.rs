//! P8 — frozen balances: a kill between a withdrawal's broadcast and its record (with a
//! power cut that drops nothing the case depends on); the network's same-id
//! deduplication keeps one transfer.
//! What it is: at the hook point the executor has written nothing since the
//! request was committed and synced, so the cut here is a process kill in effect; what
//! makes the second broadcast safe is the network's deduplication by withdrawal id, not
//! anything the database kept. It stays in P under its id (renumbering would break the
//! evidence and the catalogue, and F14 already owns the executor's crash after an
//! unknown answer); no claim of the power-cut table rests on it.
//! Claim: bob deposits 2 BTC and asks to withdraw 1 BTC (acknowledged: `REQUESTED`, the
//! amount frozen) on a cluster whose data directory is on the forgetful disk; the
//! `withdrawal-executor` broadcasts w-801 to the network stand-in, hears it accepted,
//! and stops at its hook point `after-broadcast`, before recording `BROADCAST`. There
//! the power is cut: SIGKILL of the executor and of every postgres process, the
//! unsynced data dropped, crash recovery. The network is another machine: the stand-in
//! keeps running and keeps its log. After the restart w-801 is still `REQUESTED` (the
//! record never happened), a new executor broadcasts it again under the same id, the
//! network counts the second broadcast but keeps one transfer, and the executor
//! settles: one transfer out, bob's frozen bitcoin consumed once, the ledger
//! reconciles.
//! Fails if: the executor does not stop after the broadcast, the request is lost by the
//! cut, recovery fails, the network holds a second transfer for w-801, the states or
//! balances differ, or reconciliation finds something.
//!
//! ```text
//! setup     deposit 2 BTC; withdraw w-801 1 BTC (REQUESTED)
//! executor  BROADCAST id=w-801 → accepted → stop at after-broadcast
//! cut       SIGKILL executor, postgres; drop unsynced; restart (the stand-in runs on)
//! executor  REQUESTED → BROADCAST id=w-801 again (same id) → settle
//! checks    one transfer in the network's log; consumed once; reconcile
//! ```
//!
//! Rust, not a file: the withdrawal executor runs on the case's own cluster on the
//! forgetful disk, is stopped at a hook point, and is cut with the cluster while the
//! network stand-in keeps running; no verb of the cluster engine starts the executor or
//! the stand-in.

use futures_util::FutureExt;

use case_kit::{Case, Ctx};
use frozen_balances::amount::format_units;
use frozen_balances::withdraw::{self, SYS_WITHDRAWAL};
use frozen_balances::{Asset, DEFAULT_TENANT, NoHooks};
use launch::network::{StandIn, executor_binary};
use launch::power::PowerCluster;
use launch::worker::CrashWorker;

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "P8",
        "withdrawal: a kill between the broadcast and its record sends no second transfer (the network's same-id deduplication)",
        |ctx| run(ctx).boxed(),
    )
    .not_clean()
    // Not exclusive: no load of its own (one client, its own mount and cluster), and
    // every step is forced, so other cases beside it only slow it down.
}

/// The database P8 creates on its cluster.
const DATABASE: &str = "frozen";
/// 1 BTC in minor units.
const BTC: i64 = 100_000_000;
/// Longest run of the executor after the cut, milliseconds (a hang bound).
const EXECUTOR_RUN_LIMIT_MS: u64 = 20_000;

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let mut power = PowerCluster::start(&ctx.work_dir()?, &[], &[]).await?;
    power.cluster.create_database(DATABASE, None).await?;
    let mut db = power.cluster.connect(DATABASE).await?;
    frozen_balances::schema::install_and_seed(&db).await?;
    db.batch_execute("CHECKPOINT").await?;
    power.disk.sync_all()?;
    let net = StandIn::start(ctx).await?;
    let t = DEFAULT_TENANT;
    frozen_balances::deposit(
        &mut db,
        &frozen_balances::DepositRequest {
            tenant_id: t.into(),
            business_id: "dep-801".into(),
            account_id: "bob".into(),
            asset: Asset::Btc,
            amount: 2 * BTC,
        },
        &NoHooks,
    )
    .await?;
    let request = withdraw::WithdrawRequest {
        tenant_id: t.into(),
        withdrawal_id: "w-801".into(),
        account_id: "bob".into(),
        asset: Asset::Btc,
        amount: BTC,
        destination: "addr-bob-801".into(),
    };
    withdraw::request(&mut db, &request, &NoHooks).await?;
    ctx.note("cluster on the forgetful disk (fsync=on, synchronous_commit=on); bob deposits 2 BTC, asks to withdraw w-801 1 BTC (acknowledged); the network stand-in runs outside the cut");
    drop(db);
    if !broadcast_then_cut(ctx, &mut power, &net).await? {
        return Ok(());
    }
    after_restart(ctx, &power, &net).await
}

fn executor(power: &PowerCluster, net: &StandIn, extra: &[&str]) -> anyhow::Result<CrashWorker> {
    let mut args = vec![
        "run".to_owned(),
        "--database-url".into(),
        power.cluster.url(DATABASE),
        "--network-url".into(),
        net.url().to_owned(),
    ];
    args.extend(extra.iter().map(|arg| arg.to_string()));
    CrashWorker::launch_binary(&executor_binary()?, args)
}

/// The executor broadcasts and stops before the record; the power is cut there.
/// Returns whether recovery succeeded.
async fn broadcast_then_cut(
    ctx: &mut Ctx,
    power: &mut PowerCluster,
    net: &StandIn,
) -> anyhow::Result<bool> {
    let mut first = executor(power, net, &["--stop-at", "after-broadcast"])?;
    let paused = first.wait_paused().await?;
    ctx.note(format!("executor stopped: {}", paused.line));
    let db = power.cluster.connect(DATABASE).await?;
    let status = withdraw::get(&db, DEFAULT_TENANT, "w-801")
        .await?
        .map(|w| w.status.as_str().to_owned());
    ctx.check_eq(
        "before the cut: w-801 still recorded REQUESTED, the network has it",
        "REQUESTED w-801x1".to_string(),
        format!("{} {}", status.unwrap_or_default(), transfers(net).await?),
    );
    drop(db);
    let end = first.kill().await?;
    let cut = power.power_cut(None).await?;
    ctx.note(format!("executor {end}"));
    ctx.note(cut.line());
    ctx.record("power_cut", cut.record());
    Ok(ctx.check(
        "crash recovery succeeds",
        cut.recovery.is_ok(),
        cut.recovery.as_ref().err().map_or("", String::as_str),
    ))
}

/// The transfers to bob's address in the network's log, `<id>x<broadcasts received>`.
async fn transfers(net: &StandIn) -> anyhow::Result<String> {
    Ok(net
        .net()
        .transfers()
        .await?
        .iter()
        .filter(|t| t.destination == "addr-bob-801")
        .map(|t| format!("{}x{}", t.id, t.broadcasts))
        .collect::<Vec<_>>()
        .join(" "))
}

async fn after_restart(ctx: &mut Ctx, power: &PowerCluster, net: &StandIn) -> anyhow::Result<()> {
    let mut db = power.cluster.connect(DATABASE).await?;
    let status = withdraw::get(&db, DEFAULT_TENANT, "w-801")
        .await?
        .map(|w| w.status.as_str().to_owned());
    ctx.check_eq(
        "after the cut: the acknowledged request survives, REQUESTED (its broadcast was never recorded)",
        "REQUESTED".to_string(),
        status.unwrap_or_default(),
    );
    let mut second = executor(power, net, &[])?;
    let mut lines = Vec::new();
    let limit = std::time::Duration::from_millis(EXECUTOR_RUN_LIMIT_MS);
    while let Some(line) = second.next_line(limit).await? {
        ctx.note(format!("new executor: {line}"));
        lines.push(line);
    }
    let end = second.wait(limit).await?;
    ctx.check_eq(
        "new executor exited with status 0",
        "exited with status 0".to_string(),
        end.to_string(),
    );
    ctx.check_eq(
        "network log: one transfer for w-801, its broadcast received twice (the same id)",
        "w-801x2".to_string(),
        transfers(net).await?,
    );
    let history = withdraw::history(&db, DEFAULT_TENANT, "w-801").await?;
    ctx.check_eq(
        "w-801 states in order",
        "REQUESTED BROADCAST CONFIRMED".to_string(),
        history
            .iter()
            .map(|(s, _)| s.as_str())
            .collect::<Vec<_>>()
            .join(" "),
    );
    for (account, expected) in [
        ("bob", "available=1.00000000 frozen=0.00000000"),
        (SYS_WITHDRAWAL, "available=1.00000000 frozen=0.00000000"),
    ] {
        let b = frozen_balances::query::balance(&db, DEFAULT_TENANT, account, Asset::Btc).await?;
        ctx.check_eq(
            format!("{account} BTC: 1 BTC out, once"),
            expected.to_string(),
            format!(
                "available={} frozen={}",
                format_units(Asset::Btc, b.available),
                format_units(Asset::Btc, b.frozen)
            ),
        );
    }
    let findings = frozen_balances::reconcile(&mut db).await?;
    ctx.check(
        "the ledger reconciles clean",
        findings.is_clean(),
        findings.lines().join("; "),
    );
    Ok(())
}
