//! R9 — Patroni, a paused leader: SIGSTOP of its postmaster and its Patroni past the
//! lease, resumed after the standby was promoted.
//! Claim: the service on the nodes' multi-host URL holds 8 pooled sessions on the leader
//! n1 (seen: 8 debits held at once at `after-commit`); n1's Patroni and postmaster are
//! stopped (its sessions' backends go on), Patroni promotes n2 once n1's lease expires
//! (n2 seen out of recovery); 8 debits then sent go to n1's sessions, and in
//! `synchronous_mode` their COMMITs wait for a standby that no longer follows and they
//! are answered 503 `UNKNOWN` at the 4 s request bound: none is acknowledged. n1
//! resumed, Patroni demotes it to n2's standby (through `pg_rewind`); every debit
//! resolves once on its same-key retry, every acknowledged debit is on n2 under its id.
//! Negative control (`synchronous_mode: false`): the same 8 debits are answered 201 by
//! the old leader, and the cluster loses every one of them (named: their keys on n2
//! have none of the acknowledged ids).
//!
//! Fails if: n2 is not promoted, a debit to the paused leader is acknowledged in
//! `synchronous_mode`, n1 is not demoted to a streaming standby, an acknowledged debit
//! is missing, doubled, under another id or shared, or the control loses nothing (a
//! test runs it in `synchronous_mode` and sees its `exposes:` fail).
//!
//! Rust, not a file: see [`crate::managed`].

use futures_util::FutureExt;

use crate::managed::{self, GROUP_SIZE, Managed, OBSERVE_LIMIT_MS, held, hold};
use crate::pair::LEDGER_DATABASE;
use case_kit::{Case, Ctx};

/// The service's request bound, milliseconds.
const REQUEST_BOUND_MS: u64 = 4_000;
/// The anomaly named by the control's `negative control exposes:` check.
pub const ANOMALY: &str =
    "debits acknowledged by a paused leader after the standby's promotion, lost by the cluster";

/// The case's registration; set aside where the Patroni cluster cannot be had.
pub fn case() -> Case {
    Case::new(
        "R9",
        "Patroni: a paused leader past its lease acknowledges nothing the cluster then loses; without synchronous_mode it does (negative control)",
        |ctx| run(ctx).boxed(),
    )
    .not_clean()
    .requires(managed::unavailable)
}

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    // The control and the claim each on a cluster of their own, at once: each waits
    // out a lease of 20 s and a demotion.
    let (control, claim) = tokio::join!(paused(ctx, false), paused(ctx, true));
    expose(ctx, control?).await?;
    let claim = claim?;
    claim.report(ctx);
    ctx.check_eq(
        "synchronous_mode: debits sent to the paused leader acknowledged",
        0,
        claim.acknowledged.len(),
    );
    claim.m.verify(ctx, 1, "synchronous_mode: on n2").await
}

/// The negative control with `synchronous_mode` as given (`false` in a run; its test
/// runs it `true` and sees the `exposes:` fail).
///
/// Errors: the cluster did not start or fail over; SQL errors; transport errors.
pub async fn control(ctx: &mut Ctx, synchronous_mode: bool) -> anyhow::Result<()> {
    let run = paused(ctx, synchronous_mode).await?;
    expose(ctx, run).await
}

/// The control's checks and its `exposes:`: every debit the paused leader acknowledged
/// is missing on n2 under the id it was acknowledged with.
async fn expose(ctx: &mut Ctx, run: Paused) -> anyhow::Result<()> {
    run.report(ctx);
    let on_n2 = run.m.connect(1, LEDGER_DATABASE).await?;
    let mut lost = Vec::new();
    for (key, txn_id) in &run.acknowledged {
        let sql = "SELECT count(*) FROM ledger_txn WHERE client_id = $1 AND idem_key = $2 AND txn_id = $3";
        let client_id = run.m.client_id();
        let there: i64 = on_n2.query_one(sql, &[&client_id, key, txn_id]).await?.get(0);
        if there == 0 {
            lost.push(key.clone());
        }
    }
    ctx.exposes(
        ANOMALY,
        !lost.is_empty() && lost.len() == run.acknowledged.len(),
        format!("acknowledged={} lost={} [{}]", run.acknowledged.len(), lost.len(), lost.join(" ")),
    );
    Ok(())
}

/// One cluster's story and what it saw, for the checks made afterwards.
struct Paused {
    m: Managed,
    /// The group's keys acknowledged before the retries, with their ids.
    acknowledged: Vec<(String, i64)>,
    /// Checks seen on the way: name, passed, what was seen.
    facts: Vec<(String, bool, String)>,
    /// Notes on the way.
    notes: Vec<String>,
}

impl Paused {
    fn fact(&mut self, name: String, expected: impl std::fmt::Display, actual: impl std::fmt::Display) {
        let (expected, actual) = (expected.to_string(), actual.to_string());
        let seen = format!("expected={expected}, actual={actual}");
        self.facts.push((name, expected == actual, seen));
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

/// The story up to the retries: the cluster, the pooled sessions, the pause, the
/// promotion, the group sent to the paused leader (503 `UNKNOWN` only in
/// `synchronous_mode`), the resume, the demotion and the retries.
///
/// Errors: the cluster did not start or fail over; SQL errors; transport errors.
async fn paused(ctx: &Ctx, synchronous_mode: bool) -> anyhow::Result<Paused> {
    let label = if synchronous_mode { "synchronous_mode" } else { "control" };
    let m = Managed::start(ctx, synchronous_mode, None).await?;
    let mut run = Paused { m, acknowledged: Vec::new(), facts: Vec::new(), notes: Vec::new() };
    let m = &mut run.m;
    let url = m.multi_host_url();
    let service = m.service(ctx, &url, &format!("multi-host-{label}"), REQUEST_BOUND_MS).await?;
    hold(&service, "after-commit").await?;
    let before = m.send(&service, "before");
    let seen = held(&service, "after-commit").await?;
    service.release_fault("after-commit").await?;
    let before = m.answers(before).await?;
    m.blocking(|cluster| Ok(cluster.signal_node(0, true)?)).await?;
    let (leader, _) = m.blocking(|cluster| Ok(cluster.wait_leader(Some(0), OBSERVE_LIMIT_MS)?)).await?;
    let promoted = out_of_recovery(m, leader).await? && leader == 1;
    let during = m.send(&service, "paused");
    let keys = during.keys.clone();
    let answered = m.answers(during).await?;
    let acknowledged = m.acknowledged_ids(&keys);
    m.blocking(|cluster| Ok(cluster.signal_node(0, false)?)).await?;
    m.blocking(move |cluster| Ok(cluster.wait_streaming(0, synchronous_mode, OBSERVE_LIMIT_MS)?)).await?;
    let role = m.cluster().role(0).unwrap_or_default();
    let retried = m.retry(&service, &keys).await?;
    run.acknowledged = acknowledged;
    run.fact(format!("{label}: 8 pooled sessions on n1 (debits held at once)"), GROUP_SIZE, seen);
    run.fact(format!("{label}: before the pause: answered"), "201 OK=8", before);
    run.fact(format!("{label}: n1 paused past its lease, Patroni promoted n2"), true, promoted);
    if synchronous_mode {
        run.fact(format!("{label}: debits sent to the paused leader: answered"), "503 UNKNOWN=8", answered);
    } else {
        run.notes.push(format!("{label}: debits sent to the paused leader: answered {answered}"));
    }
    run.fact(format!("{label}: n1 resumed, Patroni demoted it to n2's standby"), "replica", role);
    run.fact(format!("{label}: every debit resolves on its same-key retry"), GROUP_SIZE, retried.acknowledged);
    Ok(run)
}

/// Whether node `index` is out of recovery, looked at until it is (a hang bound):
/// Patroni answers `/primary` once it holds the lease, a moment before its promotion
/// ends.
async fn out_of_recovery(m: &Managed, index: usize) -> anyhow::Result<bool> {
    let client = m.connect(index, "postgres").await?;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_millis(OBSERVE_LIMIT_MS);
    loop {
        let in_recovery: bool = client.query_one("SELECT pg_is_in_recovery()", &[]).await?.get(0);
        if !in_recovery || tokio::time::Instant::now() > deadline {
            return Ok(!in_recovery);
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}
