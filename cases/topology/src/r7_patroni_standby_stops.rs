//! R7 — Patroni, the synchronous standby stops acknowledging longer than the service's
//! request bound, then the leader is killed.
//! Claim: on a Patroni cluster in `synchronous_mode` (the service through HAProxy, a
//! request bound of 4 s), with the synchronous standby's WAL receiver stopped
//! (SIGSTOP: it writes, flushes and reports nothing more), 8 debits' COMMITs are seen
//! waiting for it (`SyncRep`) and are answered 503 `UNKNOWN` when the bound runs out,
//! though they committed on the leader; the leader is then killed (kill -9 of its
//! Patroni and postmaster), the receiver continued, and Patroni promotes the standby:
//! every unknown debit resolves once on its same-key retry, every acknowledged debit
//! is on the new leader under the id it was acknowledged with, no transaction id is
//! acknowledged to two keys, balances and the reconciliation are clean.
//!
//! Why the receiver is continued after the kill: a stopped receiver stops the flush
//! reports (the 8 waits show it), but it would also hold the promotion forever (the
//! startup process waits for the receiver to exit before it ends recovery,
//! PostgreSQL's `ShutdownWalRcv` in src/backend/replication/walreceiverfuncs.c); once
//! the leader is dead nothing it sends can be acknowledged to anyone.
//!
//! Fails if: a debit is answered 201 while the standby is stopped, the waits are not
//! seen, the unknown debits did not commit on the leader (then the case did not force
//! what it claims), Patroni promotes no node, or an acknowledged debit is missing,
//! doubled, under another id or shared with another key on the new leader.
//!
//! Rust, not a file: see [`crate::managed`]. Statements mode only: the 8 COMMITs are
//! seen waiting one session each (the batch mode commits a group in one).

use cases_ledger::modes::StatementsOnly as _;
use futures_util::FutureExt;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::managed::{self, GROUP_SIZE, Managed, OBSERVE_LIMIT_MS, syncrep_waits};
use crate::pair::LEDGER_DATABASE;
use case_kit::{Case, Ctx};

/// The service's request bound, milliseconds: the stopped standby outlasts it.
const REQUEST_BOUND_MS: u64 = 4_000;

/// The case's registration; set aside where the Patroni cluster cannot be had.
pub fn case() -> Case {
    Case::new(
        "R7",
        "Patroni: the synchronous standby stops acknowledging past the request bound, then the leader is killed: no acknowledged debit lost",
        |ctx| run(ctx).boxed(),
    )
    .not_clean()
    .requires(managed::unavailable)
    .statements_only()
}

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let mut m = Managed::start(ctx, true, None).await?;
    let url = m.haproxy_url();
    let service = m.service(ctx, &url, "haproxy", REQUEST_BOUND_MS).await?;
    let before = m.send(&service, "before");
    ctx.check_eq("before the stop: answered", "201 OK=8".to_string(), m.answers(before).await?);
    let receiver = m.wal_receiver_pid(1).await?;
    kill(Pid::from_raw(receiver), Signal::SIGSTOP)?;
    ctx.note("n2's WAL receiver stopped (SIGSTOP)");
    let stopped = m.send(&service, "stopped");
    let keys = stopped.keys.clone();
    let on_leader = m.connect(0, LEDGER_DATABASE).await?;
    ctx.check_eq(
        "their COMMITs are seen waiting for the standby (SyncRep)",
        GROUP_SIZE,
        syncrep_waits(&on_leader, GROUP_SIZE).await?,
    );
    ctx.check_eq(
        "answered when the bound ran out",
        "503 UNKNOWN=8".to_string(),
        m.answers(stopped).await?,
    );
    let committed = m.committed(0, &keys).await?;
    ctx.check_eq("they committed on the leader all the same", GROUP_SIZE, committed);
    drop(on_leader);
    m.blocking(|cluster| {
        cluster.kill_node(0);
        Ok(())
    })
    .await?;
    kill(Pid::from_raw(receiver), Signal::SIGCONT)?;
    ctx.note("killed n1 (kill -9 of its Patroni and postmaster), then n2's receiver continued");
    let (leader, _) = m
        .blocking(|cluster| Ok(cluster.wait_leader(Some(0), OBSERVE_LIMIT_MS)?))
        .await?;
    ctx.check_eq(
        "Patroni promoted the synchronous standby",
        "n2".to_string(),
        m.cluster().nodes()[leader].name.clone(),
    );
    let retried = m.retry(&service, &keys).await?;
    // Replayed or executed anew depends on whether the continued receiver still had
    // their WAL to flush: recorded, not checked; either way each resolves once.
    ctx.record("r7_retries", retried.finals.clone().into());
    ctx.note(format!("their retries after unknown_n={}", retried.unknowns));
    ctx.check_eq("every unknown debit resolves on its same-key retry", GROUP_SIZE, retried.acknowledged);
    let after = m.send(&service, "after");
    ctx.check_eq("after the failover: answered", "201 OK=8".to_string(), m.answers(after).await?);
    m.verify(ctx, leader, "on the new leader").await
}
