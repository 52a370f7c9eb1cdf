//! P1's body: a ledger under load, a power cut, and what recovery kept (P2's file runs
//! the same load and cut through `spec_ledger.rs`, on the code of [`crate::ledger`]).

use case_kit::Ctx;

use crate::ledger::{self, Load, RunningLoad};

/// The account whose row P1 holds before the cut, so that its debits are in flight.
const HELD_ACCOUNT: u32 = 1;

/// P1's body: the load on a cluster with `fsync=on`; once enough debits were answered,
/// one account's row is held until debits are seen waiting on it and the disk is seen
/// holding unsynced bytes, and the power is cut there; then P1's claims: debits were in
/// flight and bytes unsynced at the cut (both ≥ 1), recovery succeeds, nothing
/// acknowledged lost, none twice, each unknown debit resolved once by a same-key
/// retry, the ledger reconciled, amcheck clean.
///
/// Errors: the cluster, the service or SQL fail outside the checked steps.
pub async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let mut power = ledger::ledger_cluster(ctx, &[("fsync", "on")], &[]).await?;
    let held = points_ledger::test_account(HELD_ACCOUNT);
    ctx.note(format!(
        "cluster on the forgetful disk: fsync=on synchronous_commit=on; {} clients debit through ledger-svc; once {} debits were answered 201, {held}'s row is held until its debits are seen waiting and the disk holds unsynced bytes; the power is cut there",
        ledger::CLIENTS,
        ledger::ACKNOWLEDGED_BEFORE_CUT
    ));
    let service = ledger::service(ctx, &power, "ledger-svc").await?;
    let running = RunningLoad::start(&service, ledger::CLIENTS);
    running
        .wait_acknowledged(ledger::ACKNOWLEDGED_BEFORE_CUT)
        .await;
    let holder = ledger::hold_account(&power, &held).await?;
    let waiting = ledger::debits_seen_waiting(&power, 1).await?;
    let unsynced = ledger::unsynced_seen(&power).await;
    ctx.note(format!(
        "before the cut: debits seen waiting on {held}'s row waiting_n={waiting}, unsynced bytes seen unsynced_n={unsynced}"
    ));
    let (load, cut) = ledger::cut_under_load(&mut power, service, running, None).await?;
    drop(holder);
    ctx.note(cut.line());
    ctx.record("power_cut", cut.record());
    ctx.note(format!(
        "before the cut: acknowledged_n={} unknown_n={} refused={}",
        load.acknowledged.len(),
        load.unknown.len(),
        load.refused.len()
    ));
    ctx.check(
        "debits were in flight at the cut: seen waiting on the held row (≥ 1), left unanswered (≥ 1)",
        waiting >= 1 && !load.unknown.is_empty(),
        format!("waiting_n={waiting} unknown_n={}", load.unknown.len()),
    );
    ctx.check(
        "the cut dropped unsynced bytes (≥ 1)",
        cut.dropped.bytes >= 1,
        format!("bytes_n={}", cut.dropped.bytes),
    );
    if let Err(error) = &cut.recovery {
        ctx.record("recovery_error", serde_json::Value::from(error.clone()));
        ctx.check("crash recovery succeeds", false, error);
        return Ok(());
    }
    ctx.check("crash recovery succeeds", true, "");
    after_recovery(ctx, &power, &load).await
}

async fn after_recovery(
    ctx: &mut Ctx,
    power: &launch::power::PowerCluster,
    load: &Load,
) -> anyhow::Result<()> {
    let mut client = power.cluster.connect(ledger::DATABASE).await?;
    let lost = ledger::lost_keys(&client, load).await?;
    ctx.record("lost_keys", serde_json::json!(lost));
    let doubled: i64 = client
        .query_one(
            "SELECT count(*) FROM (SELECT 1 FROM ledger_txn WHERE client_id = $1 \
             GROUP BY idem_key HAVING count(*) > 1) AS d",
            &[&ledger::CLIENT_ID],
        )
        .await?
        .get(0);
    let findings = points_ledger::reconcile(&mut client).await?;
    let (indexes, failures) = ledger::amcheck(&client).await?;
    ctx.record("amcheck_indexes", serde_json::Value::from(indexes));
    ctx.check_eq("acknowledged debits lost", 0, lost.len());
    ctx.check_eq("keys with two transactions", 0, doubled);
    ctx.check(
        "the ledger reconciles clean",
        findings.is_clean(),
        findings.summary(),
    );
    ctx.check(
        "amcheck: bt_index_check finds nothing in any B-tree index",
        failures.is_empty(),
        failures.join("; "),
    );
    let service = ledger::service(ctx, power, "ledger-svc-after").await?;
    let wrong = ledger::resolve_unknown(&service, &client, load).await?;
    ctx.check(
        "each unanswered debit resolves exactly once on a same-key retry",
        wrong.is_empty(),
        wrong.join("; "),
    );
    let findings = points_ledger::reconcile(&mut client).await?;
    ctx.check(
        "the ledger reconciles clean after the retries",
        findings.is_clean(),
        findings.summary(),
    );
    service.kill()?;
    Ok(())
}
