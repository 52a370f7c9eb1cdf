//! R1's part on a COMMIT through the pooler that waits for a synchronous standby that
//! never acknowledges (`synchronous_standby_names` names one that does not exist): the
//! COMMITs are seen waiting, a DBA cancels the waits (`pg_cancel_backend`), PgBouncer
//! forwards the server's `WARNING` to the service, which answers 503 `UNKNOWN` although
//! the debits committed on the primary; their same-key retries (replays, whose cover
//! waits for the standby too) are cancelled the same way and answered 503; once the
//! standby is no longer waited for, the retries replay. SPEC §4, "Acknowledged means
//! durable"; R2 shows the same with a real standby and a failover.
//!
//! The waits are cut by the DBA, not by the service's bound: the service's own cancel
//! goes through PgBouncer's cancel forwarding, and PgBouncer 1.18 exits (`FATAL …
//! disconnect_client(): bad client state: 0`, pgbouncer#801, fixed in 1.19) when a cancel
//! client closes its socket before the forwarded cancel is done, as tokio-postgres's
//! cancel does: seen here with four cut waits (LIMITS.md).

use std::sync::Arc;
use std::time::Duration;

use launch::service::Service;
use points_ledger::test_account;
use scratch_pg::Cluster;
use scratch_pg::bouncer::Bouncer;

use crate::debit_groups::{self, Answer};
use crate::pair::LEDGER_DATABASE;
use crate::pooled::{self, CLIENT, POOLER_POOL_SIZE};
use crate::syncrep::{self, Wait};
use case_kit::Ctx;

/// Redemption stripes: the part's accounts credit different ones (as in R2), so every
/// debit's COMMIT reaches `SyncRep` at once.
const REDEEM_STRIPES: &str = "64";
/// A standby name no standby has.
const NO_STANDBY: &str = "r1_no_such_standby";

/// The part: one debit per pooled server session, each seen waiting for the standby,
/// then cancelled; the answers, the commits; the retries, cancelled alike; the retries
/// once the standby is not waited for.
///
/// Errors: the service did not start; SQL errors; states not seen in time.
pub async fn through_syncrep(
    ctx: &mut Ctx,
    primary: &Cluster,
    bouncer: &Bouncer,
) -> anyhow::Result<()> {
    let options = pooled::service_options(false, &["--redeem-stripes", REDEEM_STRIPES]);
    let service = pooled::launch(ctx, bouncer, options, "ledger-svc-syncrep").await?;
    let accounts: Vec<String> = (1..=POOLER_POOL_SIZE).map(test_account).collect();
    pooled::fund(&service, "syncrep", &accounts).await?;
    let keys: Vec<String> = (0..accounts.len())
        .map(|n| format!("k-r1-syncrep-{n}"))
        .collect();
    standby_names(primary, Some(NO_STANDBY)).await?;
    let (waiting, first) = cancelled(primary, send(&service, &keys, &accounts)).await?;
    let committed = syncrep::committed_within(primary, CLIENT, &keys).await?;
    let (retries_waiting, retried) = cancelled(primary, send(&service, &keys, &accounts)).await?;
    standby_names(primary, None).await?;
    let replayed = answers(send(&service, &keys, &accounts)).await?;
    ctx.check_eq(
        "through the pooler, a standby that never acknowledges: COMMITs seen waiting (SyncRep), then cancelled by a DBA",
        keys.len(),
        waiting,
    );
    ctx.check_eq("… answers", "503 UNKNOWN=4".to_owned(), first);
    ctx.check_eq(
        "… committed on the primary all the same",
        keys.len(),
        committed,
    );
    ctx.check_eq(
        "… same-key retries: their covers seen waiting, then cancelled",
        keys.len(),
        retries_waiting,
    );
    ctx.check_eq("… their answers", "503 UNKNOWN=4".to_owned(), retried);
    ctx.check_eq(
        "… same-key retries once the standby is not waited for",
        "201 OK replayed=4".to_owned(),
        replayed,
    );
    pooled::stop(ctx, service).await
}

/// Waits until every request of `pending` is seen waiting for the standby, cancels the
/// waits (`pg_cancel_backend`), and returns the count seen and the answers.
///
/// Errors: SQL errors; not seen within the hang bound.
async fn cancelled(
    primary: &Cluster,
    pending: Vec<pooled::Pending>,
) -> anyhow::Result<(usize, String)> {
    let want = pending.len();
    let waiting =
        syncrep::sessions_waiting(primary, Wait::Standby, want, pooled::SERVICE_BOUND_MS).await?;
    syncrep::cancel_waiting(primary).await?;
    Ok((waiting, answers(pending).await?))
}

/// One debit of 1 per key and account, all at once.
fn send(service: &Arc<Service>, keys: &[String], accounts: &[String]) -> Vec<pooled::Pending> {
    keys.iter()
        .zip(accounts)
        .map(|(key, account)| pooled::debit(service, key.clone(), account, 1))
        .collect()
}

/// The answers as counts, `503 UNKNOWN=4` ([`debit_groups::tally`]).
async fn answers(pending: Vec<pooled::Pending>) -> anyhow::Result<String> {
    let mut answers = Vec::new();
    for reply in pending {
        answers.push(Answer::of(reply.await?));
    }
    Ok(debit_groups::tally(&answers))
}

/// `ALTER SYSTEM SET synchronous_standby_names` (or RESET) and a reload, waited for until
/// a new session of the ledger database sees it.
///
/// Errors: SQL errors; not seen within the hang bound.
async fn standby_names(primary: &Cluster, value: Option<&str>) -> anyhow::Result<()> {
    let client = primary.connect(LEDGER_DATABASE).await?;
    let statement = match value {
        Some(value) => format!("ALTER SYSTEM SET synchronous_standby_names = '{value}'"),
        None => "ALTER SYSTEM RESET synchronous_standby_names".to_owned(),
    };
    client.batch_execute(&statement).await?;
    client.batch_execute("SELECT pg_reload_conf()").await?;
    let deadline = std::time::Instant::now() + Duration::from_millis(pooled::SERVICE_BOUND_MS);
    loop {
        let fresh = primary.connect(LEDGER_DATABASE).await?;
        let now: String = fresh
            .query_one("SHOW synchronous_standby_names", &[])
            .await?
            .get(0);
        if now == value.unwrap_or("") {
            return Ok(());
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "synchronous_standby_names still {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(pooled::POLL_MS)).await;
    }
}
