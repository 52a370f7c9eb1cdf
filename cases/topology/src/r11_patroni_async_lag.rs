//! R11 — Patroni with asynchronous replication and `maximum_lag_on_failover`: what the
//! manager's promotion loses, and what it refuses to promote.
//! Claim, on two asynchronous clusters at once (the service through HAProxy), each with
//! its standby's WAL receiver stopped and debits acknowledged by the leader after the
//! stop (the standby's lag in Patroni's `GET /cluster` seen above 0):
//! - within the bound (`maximum_lag_on_failover` 1 MiB, Patroni's default): both nodes
//!   killed and n2's Patroni started again (it holds exactly what its receiver wrote
//!   before the stop), Patroni promotes n2 and every debit acknowledged after the stop is
//!   lost, counted and named: a negative control, the loss asynchronous replication
//!   allows;
//! - beyond the bound (1 KiB, the lag seen above it): the leader killed, n2's Patroni
//!   refuses the leader race (its log: `My wal position exceeds maximum replication lag`)
//!   and n2 stays a replica; n1's Patroni started again takes the lease back, n2's
//!   receiver continues, and every acknowledged debit is on n1 under its id: none lost.
//!
//! Fails if: the lag is not seen, Patroni promotes n2 beyond the bound or does not
//! within it, the control loses fewer than all the debits acknowledged after the stop,
//! or beyond the bound an acknowledged debit is missing on n1.
//!
//! Rust, not a file: see [`crate::managed`].

use futures_util::FutureExt;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::managed::{self, Managed, OBSERVE_LIMIT_MS};
use crate::pair::LEDGER_DATABASE;
use case_kit::{Case, Ctx};

/// `maximum_lag_on_failover` of the control, bytes (Patroni's default, stated).
const WITHIN_BYTES: u64 = 1_048_576;
/// `maximum_lag_on_failover` of the refusal, bytes.
const BEYOND_BYTES: u64 = 1_024;
/// Groups of 8 debits sent at most until the lag passes [`BEYOND_BYTES`].
const MAX_GROUPS: usize = 8;
/// The anomaly named by the control's `negative control exposes:` check.
pub const ANOMALY: &str = "debits acknowledged after the standby stopped, lost by Patroni's asynchronous promotion";
/// What n2's Patroni logs when it refuses the leader race for its lag (`ha.py`).
const REFUSED: &str = "My wal position exceeds maximum replication lag";

/// The case's registration; set aside where the Patroni cluster cannot be had.
pub fn case() -> Case {
    Case::new(
        "R11",
        "Patroni, asynchronous with maximum_lag_on_failover: a promotion within the bound loses the acknowledged tail (negative control); beyond it Patroni refuses and nothing is lost",
        |ctx| run(ctx).boxed(),
    )
    .not_clean()
    .requires(managed::unavailable)
}

/// What one cluster saw: checks (name, passed, seen) and notes, made afterwards.
#[derive(Default)]
struct Seen {
    facts: Vec<(String, bool, String)>,
    notes: Vec<String>,
}

impl Seen {
    fn fact(&mut self, name: &str, passed: bool, seen: impl std::fmt::Display) {
        self.facts.push((name.to_owned(), passed, seen.to_string()));
    }

    fn report(&self, ctx: &mut Ctx) {
        for note in &self.notes {
            ctx.note(note.clone());
        }
        for (name, passed, seen) in &self.facts {
            ctx.check(name.clone(), *passed, seen);
        }
    }
}

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let (within, beyond) = tokio::join!(
        lagging(ctx, WITHIN_BYTES, true),
        lagging(ctx, BEYOND_BYTES, true)
    );
    let (mut within, mut beyond) = (within?, beyond?);
    let (lost, acknowledged) = promoted_within(&mut within.0).await?;
    within.1.report(ctx);
    expose(ctx, &lost, acknowledged);
    let refused = refused_beyond(&mut beyond.0).await?;
    beyond.1.report(ctx);
    refused.report(ctx);
    beyond.0.m.verify(ctx, 0, "beyond the bound: on n1").await
}

/// The control alone, within the bound, with n2's receiver stopped or not (`false`: its
/// test; n2 caught up before the kill, nothing is lost and the `exposes:` fails).
///
/// Errors: the cluster did not start or fail over; SQL errors; transport errors.
pub async fn control(ctx: &mut Ctx, receiver_stopped: bool) -> anyhow::Result<()> {
    let (mut within, seen) = lagging(ctx, WITHIN_BYTES, receiver_stopped).await?;
    let (lost, acknowledged) = promoted_within(&mut within).await?;
    seen.report(ctx);
    expose(ctx, &lost, acknowledged);
    Ok(())
}

fn expose(ctx: &mut Ctx, lost: &[String], acknowledged: usize) {
    ctx.exposes(
        ANOMALY,
        acknowledged >= 1 && lost.len() == acknowledged,
        format!("acknowledged={acknowledged} lost={} [{}]", lost.len(), lost.join(" ")),
    );
}

/// An asynchronous cluster with `maximum_lag_on_failover` = `bound`, its standby's
/// receiver stopped and groups of debits acknowledged after the stop until Patroni's
/// `GET /cluster` shows the standby's lag above 0 (above `bound` when that is below
/// [`WITHIN_BYTES`]).
async fn lagging(ctx: &Ctx, bound: u64, stop: bool) -> anyhow::Result<(Lagging, Seen)> {
    let label = if bound == WITHIN_BYTES { "within the bound" } else { "beyond the bound" };
    let m = Managed::start(ctx, false, Some(bound)).await?;
    let url = m.haproxy_url();
    let service = m.service(ctx, &url, &format!("haproxy-{}", bound), 60_000).await?;
    let mut run = Lagging { m, service, receiver: 0, keys: Vec::new() };
    let mut seen = Seen::default();
    run.m.caught_up(0, 1).await?;
    run.receiver = run.m.wal_receiver_pid(1).await?;
    if !stop {
        // The control's test: one group, and n2 caught up before the kill.
        let sent = run.m.send(&run.service, "after-stop-0");
        run.keys.extend(sent.keys.clone());
        let answered = run.m.answers(sent).await?;
        seen.fact(&format!("{label}: group 0, receiver running: answered"), answered == "201 OK=8", answered);
        run.m.caught_up(0, 1).await?;
        return Ok((run, seen));
    }
    kill(Pid::from_raw(run.receiver), Signal::SIGSTOP)?;
    let want = if bound == WITHIN_BYTES { 1 } else { bound + 1 };
    let mut lag = 0;
    for group in 0..MAX_GROUPS {
        let sent = run.m.send(&run.service, &format!("after-stop-{group}"));
        run.keys.extend(sent.keys.clone());
        let answered = run.m.answers(sent).await?;
        seen.fact(&format!("{label}: group {group} after the stop: answered"), answered == "201 OK=8", answered);
        lag = lag_seen(&run.m, want).await?;
        if lag >= want {
            break;
        }
    }
    seen.fact(&format!("{label}: n2's lag in Patroni's view passed what is needed"), lag >= want, format!("lag_n={lag} bytes, {want} needed"));
    Ok((run, seen))
}

/// One cluster of the case.
struct Lagging {
    m: Managed,
    service: std::sync::Arc<launch::service::Service>,
    /// n2's stopped WAL receiver.
    receiver: i32,
    /// The keys sent after the stop (all acknowledged).
    keys: Vec<String>,
}

/// n2's lag as Patroni reports it (`GET /cluster` on n1: the leader's last reported
/// position less n2's), looked at until it reaches `want` or the hang bound.
async fn lag_seen(m: &Managed, want: u64) -> anyhow::Result<u64> {
    let port = m.cluster().nodes()[0].api_port;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_millis(OBSERVE_LIMIT_MS);
    loop {
        let lag = scratch_pg::patroni::rest_get(port, "/cluster")
            .and_then(|(_, body)| serde_json::from_str::<serde_json::Value>(&body).ok())
            .and_then(|value| {
                let members = value.get("members")?.as_array()?.clone();
                let n2 = members.iter().find(|member| member["name"] == "n2")?;
                n2.get("lag")?.as_u64()
            })
            .unwrap_or(0);
        if lag >= want || tokio::time::Instant::now() > deadline {
            return Ok(lag);
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// Within the bound: both nodes killed, n2's Patroni started again and waited for as
/// the leader; the keys acknowledged after the stop missing on n2, and how many were
/// acknowledged.
async fn promoted_within(run: &mut Lagging) -> anyhow::Result<(Vec<String>, usize)> {
    run.m
        .blocking(|cluster| {
            cluster.kill_node(0);
            cluster.kill_node(1);
            Ok(cluster.start_node(1)?)
        })
        .await?;
    run.m.blocking(|cluster| Ok(cluster.wait_leader(Some(0), OBSERVE_LIMIT_MS)?)).await?;
    let acknowledged = run.m.acknowledged_ids(&run.keys);
    let on_n2 = run.m.connect(1, LEDGER_DATABASE).await?;
    let mut lost = Vec::new();
    for (key, txn_id) in &acknowledged {
        let sql = "SELECT count(*) FROM ledger_txn WHERE client_id = $1 AND idem_key = $2 AND txn_id = $3";
        let there: i64 = on_n2.query_one(sql, &[&run.m.client_id(), key, txn_id]).await?.get(0);
        if there == 0 {
            lost.push(key.clone());
        }
    }
    Ok((lost, acknowledged.len()))
}

/// Beyond the bound: the leader killed; n2's refusal waited for in its log (a hang
/// bound) and n2 seen still a replica; n1's Patroni started again and waited for as
/// the leader, n2's receiver continued and n2 waited for streaming; every key retried.
async fn refused_beyond(run: &mut Lagging) -> anyhow::Result<Seen> {
    let label = "beyond the bound";
    let mut seen = Seen::default();
    run.m
        .blocking(|cluster| {
            cluster.kill_node(0);
            Ok(())
        })
        .await?;
    let refused = run
        .m
        .blocking(|cluster| {
            let deadline = std::time::Instant::now() + std::time::Duration::from_millis(OBSERVE_LIMIT_MS);
            while !cluster.log_of(1).contains(REFUSED) && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            Ok(cluster.log_of(1).contains(REFUSED))
        })
        .await?;
    seen.fact(&format!("{label}: n1 killed, n2's Patroni refuses the leader race (its log: {REFUSED})"), refused, refused);
    let role = run.m.cluster().role(1).unwrap_or_default();
    let primary = scratch_pg::patroni::rest_get(run.m.cluster().nodes()[1].api_port, "/primary").map(|(status, _)| status);
    seen.fact(&format!("{label}: n2 stays a replica"), role == "replica" && primary != Some(200), format!("role={role}"));
    let receiver = run.receiver;
    run.m
        .blocking(move |cluster| {
            cluster.start_node(0)?;
            let (leader, _) = cluster.wait_leader(None, OBSERVE_LIMIT_MS)?;
            anyhow::ensure!(leader == 0, "n{} leads, not n1", leader + 1);
            kill(Pid::from_raw(receiver), Signal::SIGCONT)?;
            Ok(cluster.wait_streaming(1, false, OBSERVE_LIMIT_MS)?)
        })
        .await?;
    seen.fact(&format!("{label}: n1 started again takes the lease back, n2 streams from it"), true, "");
    let keys = run.keys.clone();
    let retried = run.m.retry(&run.service, &keys).await?;
    seen.fact(&format!("{label}: every debit acknowledged after the stop replays on n1"), retried.acknowledged == keys.len() && !retried.finals.contains("201 OK="), retried.finals);
    Ok(seen)
}
