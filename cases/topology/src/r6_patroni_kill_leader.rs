//! R6 — Patroni decides the failover: kill -9 of the leader (its Patroni and its
//! postmaster) under load in `synchronous_mode`.
//! Claim: on a Patroni cluster (etcd, two nodes, `synchronous_mode: true`, the service
//! through HAProxy checking `/primary`), with 16 debits in flight when the leader dies
//! (8 held before their COMMIT, 8 committed and held before their answer, each seen
//! held), Patroni promotes the synchronous standby once the leader's lease expires;
//! the 8 held before their COMMIT are answered 503 `UNKNOWN`, the 8 committed ones 201
//! (the standby had them: synchronous commit), every unknown debit resolves exactly once
//! on its same-key retry through HAProxy, every acknowledged debit is on the new leader
//! under the id it was acknowledged with, no id is acknowledged to two keys, balances are
//! their start less the acknowledged debits and the ledger reconciles. The time from the
//! kill to the first 201 is a note.
//!
//! Fails if: Patroni promotes no node or the other one, a debit is answered otherwise,
//! an acknowledged debit is missing, doubled or under another id on the new leader, a
//! retry is not answered 201 within the hang bound, or a balance or the reconciliation
//! is off.
//!
//! Rust, not a file: see [`crate::managed`] (Patroni, not the case, manages the nodes).
//! Statements mode only: the debits held before their COMMIT need an open transaction
//! at `before-commit`.

use std::time::Instant;

use cases_ledger::modes::StatementsOnly as _;
use futures_util::FutureExt;

use crate::managed::{self, GROUP_SIZE, Managed, OBSERVE_LIMIT_MS, hold, held};
use case_kit::{Case, Ctx};

/// The case's registration; set aside where the Patroni cluster cannot be had.
pub fn case() -> Case {
    Case::new(
        "R6",
        "Patroni: kill -9 of the leader under load in synchronous_mode loses no acknowledged debit",
        |ctx| run(ctx).boxed(),
    )
    .not_clean()
    .requires(managed::unavailable)
    .statements_only()
}

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let mut m = Managed::start(ctx, true, None).await?;
    ctx.check_eq(
        "n1 leads, n2 is the synchronous standby",
        "primary replica".to_string(),
        format!(
            "{} {}",
            m.cluster().role(0).unwrap_or_default(),
            m.cluster().role(1).unwrap_or_default()
        ),
    );
    let service = m.service(ctx, &m.haproxy_url(), "haproxy", 60_000).await?;
    let before = m.send(&service, "before");
    ctx.check_eq("before the kill: answered", "201 OK=8".to_string(), m.answers(before).await?);
    hold(&service, "after-commit").await?;
    let committed = m.send(&service, "committed");
    let seen = held(&service, "after-commit").await?;
    ctx.check_eq("committed and held before their answer", GROUP_SIZE as u64, seen);
    hold(&service, "before-commit").await?;
    let open = m.send(&service, "open");
    let seen = held(&service, "before-commit").await?;
    ctx.check_eq("held before their COMMIT", GROUP_SIZE as u64, seen);
    let killed_at = Instant::now();
    m.blocking(|cluster| {
        cluster.kill_node(0);
        Ok(())
    })
    .await?;
    ctx.note("killed n1: its Patroni and its postmaster (kill -9)");
    service.release_fault("before-commit").await?;
    service.release_fault("after-commit").await?;
    let (open_keys, committed_keys) = (open.keys.clone(), committed.keys.clone());
    ctx.check_eq("held before their COMMIT: answered", "503 UNKNOWN=8".to_string(), m.answers(open).await?);
    ctx.check_eq(
        "committed before the kill: answered (the standby had them)",
        "201 OK=8".to_string(),
        m.answers(committed).await?,
    );
    let first = m.retry(&service, &open_keys[..1]).await?;
    let first_ms = killed_at.elapsed().as_millis();
    ctx.note(format!(
        "first 201 after the kill: first_success_ms={first_ms} ({} after unknown_n={})",
        first.finals, first.unknowns
    ));
    let (leader, _) = m.blocking(|cluster| Ok(cluster.wait_leader(Some(0), OBSERVE_LIMIT_MS)?)).await?;
    ctx.check_eq("Patroni promoted the synchronous standby", "n2".to_string(), m.cluster().nodes()[leader].name.clone());
    ctx.check_eq(
        "every unknown debit resolves on its same-key retry",
        "201 OK=7".to_string(),
        m.retry(&service, &open_keys[1..]).await?.finals,
    );
    ctx.check_eq(
        "the committed debits' retries replay",
        "201 OK replayed=8".to_string(),
        m.retry(&service, &committed_keys).await?.finals,
    );
    let after = m.send(&service, "after");
    ctx.check_eq("after the failover: answered", "201 OK=8".to_string(), m.answers(after).await?);
    ctx.check_eq("acknowledged keys", 32, m.acknowledged());
    m.verify(ctx, leader, "on the new leader").await
}
