//! R1's part on a COMMIT through the pooler that waits for a synchronous standby that
//! never acknowledges (`synchronous_standby_names` names one that does not exist): the
//! service behind PgBouncer answers 503 `UNKNOWN` at its request bound and, behind a
//! pooler, sends no cancel (PgBouncer 1.18 can exit on a forwarded cancel: LIMITS.md), so
//! the COMMITs are still seen waiting after their answers; a DBA cancels them
//! (`pg_cancel_backend`), and they commit on the primary all the same (the server's
//! `WARNING`, forwarded by PgBouncer, ends the service's sessions); the same-key retries
//! find the records and are answered 503 too, their covers waiting for the standby; once
//! the standby is no longer waited for, the retries replay. SPEC §4, "Acknowledged means
//! durable"; R2 shows the same with a real standby and a failover.

use std::sync::Arc;

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

/// The service's request bound in this part, milliseconds: the stalled COMMITs outlast
/// it (it decides no claim: every answer the standby's silence allows is 503).
const BOUND_MS: u64 = 2_000;

/// The part: one debit per pooled server session, answered at the bound while its
/// COMMIT waits; the waits seen and cancelled; the retries likewise; the retries once the
/// standby is not waited for.
///
/// Errors: the service did not start; SQL errors; states not seen in time.
pub async fn through_syncrep(
    ctx: &mut Ctx,
    primary: &Cluster,
    bouncer: &Bouncer,
) -> anyhow::Result<()> {
    let mut options = pooled::service_options(false, &["--redeem-stripes", REDEEM_STRIPES]);
    if let Some(at) = options
        .extra_args
        .iter()
        .position(|arg| arg == "--request-timeout-ms")
    {
        options.extra_args[at + 1] = BOUND_MS.to_string();
    }
    let service = pooled::launch(ctx, bouncer, options, "ledger-svc-syncrep").await?;
    let accounts: Vec<String> = (1..=POOLER_POOL_SIZE).map(test_account).collect();
    pooled::fund(&service, "syncrep", &accounts).await?;
    let keys: Vec<String> = (0..accounts.len())
        .map(|n| format!("k-r1-syncrep-{n}"))
        .collect();
    standby_names(primary, Some(NO_STANDBY)).await?;
    let first = answers(send(&service, &keys, &accounts)).await?;
    let waiting = still_waiting(primary, keys.len()).await?;
    syncrep::cancel_waiting(primary).await?;
    let committed = syncrep::committed_within(primary, CLIENT, &keys).await?;
    let retried = answers(send(&service, &keys, &accounts)).await?;
    let covers_waiting = still_waiting(primary, keys.len()).await?;
    standby_names(primary, None).await?;
    let replayed = answers(send(&service, &keys, &accounts)).await?;
    let n = keys.len();
    ctx.check_eq(
        "through the pooler, a standby that never acknowledges: answers at the bound",
        "503 UNKNOWN=4".to_owned(),
        first,
    );
    ctx.check_eq(
        "… COMMITs still waiting (SyncRep) after their answers: no cancel through the pooler",
        n,
        waiting,
    );
    ctx.check_eq(
        "… committed on the primary all the same once a DBA cancels the waits",
        n,
        committed,
    );
    ctx.check_eq(
        "… same-key retries while the standby is waited for",
        "503 UNKNOWN=4".to_owned(),
        retried,
    );
    ctx.check_eq("… their covers still waiting (SyncRep)", n, covers_waiting);
    ctx.check_eq(
        "… same-key retries once it is not",
        "201 OK replayed=4".to_owned(),
        replayed,
    );
    pooled::stop(ctx, service).await
}

/// Sessions seen waiting for the standby (at least `want`, within the hang bound).
///
/// Errors: SQL errors; fewer seen within the hang bound.
async fn still_waiting(primary: &Cluster, want: usize) -> anyhow::Result<usize> {
    syncrep::sessions_waiting(primary, Wait::Standby, want, pooled::SERVICE_BOUND_MS).await
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
    let want = value.unwrap_or("");
    let look = move || async move {
        let fresh = primary.connect(LEDGER_DATABASE).await?;
        let now: String = fresh
            .query_one("SHOW synchronous_standby_names", &[])
            .await?
            .get(0);
        Ok(now)
    };
    let (now, seen) =
        syncrep::seen_within(pooled::SERVICE_BOUND_MS, look, |now| now == want).await?;
    anyhow::ensure!(seen, "synchronous_standby_names still {now:?}");
    Ok(())
}
