//! The body P1 and P2 share: a ledger under load, a power cut, and what recovery kept.

use case_kit::Ctx;

use crate::ledger::{self, Load};

/// What the run checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Config {
    /// P1's claims: nothing acknowledged lost, the cluster sound.
    FsyncOn,
    /// P2's negative control: something acknowledged lost or the cluster damaged.
    FsyncOff,
}

/// P1's and P2's body: P1 runs [`Config::FsyncOn`] with `fsync=on`, P2 runs
/// [`Config::FsyncOff`] with `fsync=off`.
///
/// Errors: as [`run_with`].
pub async fn run(ctx: &mut Ctx, config: Config) -> anyhow::Result<()> {
    let fsync = match config {
        Config::FsyncOn => "on",
        Config::FsyncOff => "off",
    };
    run_with(ctx, config, fsync).await
}

/// Runs the load and the cut on a cluster with `fsync`, then the checks of `config`:
/// P1's claims for [`Config::FsyncOn`], P2's exposure for [`Config::FsyncOff`] (a test
/// runs P2's checks with `fsync=on` to see the control fail).
///
/// Errors: the cluster, the service or SQL fail outside the checked steps.
pub async fn run_with(ctx: &mut Ctx, config: Config, fsync: &str) -> anyhow::Result<()> {
    let mut power = ledger::ledger_cluster(ctx, &[("fsync", fsync)], &[]).await?;
    ctx.note(format!(
        "cluster on the forgetful disk: fsync={fsync} synchronous_commit=on; {} clients debit through ledger-svc; the power is cut once {} debits were answered 201",
        ledger::CLIENTS,
        ledger::ACKNOWLEDGED_BEFORE_CUT
    ));
    let service = ledger::service(ctx, &power, "ledger-svc").await?;
    let (load, cut) = ledger::load_then_cut(&mut power, service, None).await?;
    ctx.note(cut.line());
    ctx.record("power_cut", cut.record());
    ctx.note(format!(
        "before the cut: acknowledged_n={} unknown_n={} refused={}",
        load.acknowledged.len(),
        load.unknown.len(),
        load.refused.len()
    ));
    if let Err(error) = &cut.recovery {
        ctx.record("recovery_error", serde_json::Value::from(error.clone()));
        return match config {
            Config::FsyncOn => {
                ctx.check("crash recovery succeeds", false, error);
                Ok(())
            }
            Config::FsyncOff => {
                ctx.exposes(
                    ANOMALY,
                    true,
                    "crash recovery failed (the run record has the log)",
                );
                Ok(())
            }
        };
    }
    if config == Config::FsyncOn {
        ctx.check("crash recovery succeeds", true, "");
    }
    after_recovery(ctx, &power, &load, config).await
}

/// What P2 shows.
pub const ANOMALY: &str = "acknowledged debits lost or the cluster damaged";

async fn after_recovery(
    ctx: &mut Ctx,
    power: &launch::power::PowerCluster,
    load: &Load,
    config: Config,
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
    match config {
        Config::FsyncOn => {
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
        }
        Config::FsyncOff => {
            ctx.note(format!(
                "after recovery: lost_n={} (acknowledged, no transaction; keys in the run record) reconciliation: {} amcheck failures: {}",
                lost.len(),
                if findings.is_clean() { "clean" } else { "NOT clean" },
                failures.len()
            ));
            let damaged = !findings.is_clean() || !failures.is_empty() || doubled > 0;
            ctx.exposes(
                ANOMALY,
                !lost.is_empty() || damaged,
                format!("lost_n={} damaged={damaged}", lost.len()),
            );
        }
    }
    Ok(())
}
