//! The F cases' steps with the external network of F13–F16: running the
//! `withdrawal-executor` to its end, withdrawals and deposits through the library, and
//! the figures a case prints from both — the network's own log of transfers by id is part
//! of every transcript. The processes are launched by `launch::network`.

use std::time::{Duration, Instant};

use case_kit::Ctx;
use frozen_balances::amount::format_units;
use frozen_balances::{Asset, NoHooks};
use launch::worker::{CrashWorker, WorkerEnd};

pub use launch::network::{
    EXECUTOR_BIN_ENV, STANDIN_BIN_ENV, StandIn, executor_binary, launch_executor,
};

/// Longest run of one executor process that is not meant to stop, milliseconds.
pub const EXECUTOR_RUN_LIMIT_MS: u64 = 20_000;
/// Reads every stdout line of `worker` until it closes, then its end and stderr.
///
/// Errors: it ran past [`EXECUTOR_RUN_LIMIT_MS`] (then it is killed).
pub async fn collect(worker: &mut CrashWorker) -> anyhow::Result<(Vec<String>, WorkerEnd, String)> {
    let deadline = Instant::now() + Duration::from_millis(EXECUTOR_RUN_LIMIT_MS);
    let mut lines = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match worker.next_line(left).await {
            Ok(Some(line)) => lines.push(line),
            Ok(None) => break,
            Err(error) => {
                let _ = worker.kill().await;
                return Err(error.context("the executor ran too long"));
            }
        }
    }
    let end = worker
        .wait(Duration::from_millis(EXECUTOR_RUN_LIMIT_MS))
        .await?;
    Ok((lines, end, worker.stderr()))
}

/// Notes each executor line as `executor: <line>`.
pub fn note_lines(ctx: &mut Ctx, label: &str, lines: &[String]) {
    for line in lines {
        ctx.note(format!("{label}: {line}"));
    }
}

/// The withdrawal's statuses in order, `REQUESTED BROADCAST CONFIRMED`.
///
/// Errors: database errors.
pub async fn states(
    db: &tokio_postgres::Client,
    tenant: &str,
    withdrawal: &str,
) -> anyhow::Result<String> {
    let history = frozen_balances::withdraw::history(db, tenant, withdrawal).await?;
    Ok(history
        .iter()
        .map(|(status, _)| status.as_str())
        .collect::<Vec<_>>()
        .join(" "))
}

/// Requests a withdrawal through the library.
///
/// Errors: the library's.
pub async fn withdraw(
    db: &mut tokio_postgres::Client,
    tenant: &str,
    withdrawal: &str,
    account: &str,
    asset: Asset,
    amount: i64,
    destination: &str,
) -> anyhow::Result<frozen_balances::withdraw::WithdrawResult> {
    let request = frozen_balances::withdraw::WithdrawRequest {
        tenant_id: tenant.to_owned(),
        withdrawal_id: withdrawal.to_owned(),
        account_id: account.to_owned(),
        asset,
        amount,
        destination: destination.to_owned(),
    };
    Ok(frozen_balances::withdraw::request(db, &request, &NoHooks).await?)
}

/// Deposits through the library.
///
/// Errors: the library's.
pub async fn deposit(
    db: &mut tokio_postgres::Client,
    tenant: &str,
    business_id: &str,
    account: &str,
    asset: Asset,
    amount: i64,
) -> anyhow::Result<()> {
    frozen_balances::deposit(
        db,
        &frozen_balances::DepositRequest {
            tenant_id: tenant.to_owned(),
            business_id: business_id.to_owned(),
            account_id: account.to_owned(),
            asset,
            amount,
        },
        &NoHooks,
    )
    .await?;
    Ok(())
}

/// Runs the reconciliation and records the check `<label>: no findings`.
///
/// Errors: database errors.
pub async fn check_reconciles(
    ctx: &mut Ctx,
    db: &mut tokio_postgres::Client,
    label: &str,
) -> anyhow::Result<bool> {
    let findings = frozen_balances::reconcile(db).await?;
    let clean = findings.is_clean();
    let seen = if clean {
        findings.summary()
    } else {
        findings.lines().join("; ")
    };
    Ok(ctx.check(format!("{label}: no findings"), clean, seen))
}

/// Notes the network's own log: one line per transfer, then one per status query.
/// Returns the transfers.
///
/// Errors: the stand-in did not answer.
pub async fn note_log(
    net: &StandIn,
    ctx: &mut Ctx,
) -> anyhow::Result<Vec<external_net::wire::TransferRecord>> {
    let transfers = net.net().transfers().await?;
    ctx.note(format!("network log: {} transfer(s)", transfers.len()));
    for t in &transfers {
        let amount = t
            .asset
            .parse::<Asset>()
            .map(|asset| format_units(asset, t.amount))
            .unwrap_or_else(|_| t.amount.to_string());
        ctx.note(format!(
            "network transfer #{} id={} to={} {} {} status={} broadcasts_received={}",
            t.seq, t.id, t.destination, amount, t.asset, t.status, t.broadcasts
        ));
    }
    for q in net.net().queries().await? {
        ctx.note(format!(
            "network status query #{} id={} answered={}",
            q.seq, q.id, q.status
        ));
    }
    Ok(transfers)
}
