//! R10 — Patroni, the former leader rejoins through `pg_rewind` (`use_pg_rewind`) and
//! holds only the new leader's history.
//! Claim: on a Patroni cluster in `synchronous_mode` (the service through HAProxy, a
//! request bound of 4 s), with the synchronous standby's WAL receiver stopped, 8 debits
//! commit on the leader n1 only (seen waiting in `SyncRep`, answered 503 `UNKNOWN`,
//! seen committed on n1: n1's own divergent history); both nodes are killed and n2's
//! Patroni started again, so n2 holds exactly what its receiver wrote before the stop,
//! and Patroni promotes it; the 8 resolve on their same-key retries, executed on n2;
//! n1's Patroni started again rewinds it (its log names `pg_rewind`) and it streams from
//! n2: every debit it holds is on n2 under the same id, none of its 8 divergent ones
//! (their ids on n1 before the kill) is left on it, and the ledger on n2 is clean.
//!
//! Fails if: the divergent debits are not seen committed on n1 (then the case did not
//! force what it claims), Patroni does not promote n2 or does not rewind n1, n1 holds a
//! debit n2 does not or one of its divergent ones, or an acknowledged debit is missing,
//! doubled, under another id or shared on n2.
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
/// The client's (key, transaction id) pairs on a node, one per line, sorted.
const PAIRS_SQL: &str = "SELECT idem_key || ' ' || txn_id FROM ledger_txn WHERE client_id = $1 ORDER BY 1";

/// The case's registration; set aside where the Patroni cluster cannot be had.
pub fn case() -> Case {
    Case::new(
        "R10",
        "Patroni: the former leader rejoins through pg_rewind and holds only the new leader's history",
        |ctx| run(ctx).boxed(),
    )
    .not_clean()
    .requires(managed::unavailable)
    .statements_only()
}

async fn pairs(m: &Managed, index: usize) -> anyhow::Result<Vec<String>> {
    let client = m.connect(index, LEDGER_DATABASE).await?;
    let rows = client.query(PAIRS_SQL, &[&m.client_id()]).await?;
    Ok(rows.iter().map(|row| row.get(0)).collect())
}

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let mut m = Managed::start(ctx, true, None).await?;
    let url = m.haproxy_url();
    let service = m.service(ctx, &url, "haproxy", REQUEST_BOUND_MS).await?;
    let before = m.send(&service, "before");
    ctx.check_eq("before the stop: answered", "201 OK=8".to_string(), m.answers(before).await?);
    let receiver = m.wal_receiver_pid(1).await?;
    kill(Pid::from_raw(receiver), Signal::SIGSTOP)?;
    let diverged = m.send(&service, "diverged");
    let keys = diverged.keys.clone();
    let on_n1 = m.connect(0, LEDGER_DATABASE).await?;
    ctx.check_eq("n2's receiver stopped: their COMMITs wait (SyncRep)", GROUP_SIZE, syncrep_waits(&on_n1, GROUP_SIZE).await?);
    ctx.check_eq("answered when the bound ran out", "503 UNKNOWN=8".to_string(), m.answers(diverged).await?);
    ctx.check_eq("committed on n1 only: its divergent history", GROUP_SIZE, m.committed(0, &keys).await?);
    drop(on_n1);
    let divergent: Vec<String> = (pairs(&m, 0).await?.into_iter())
        .filter(|pair| keys.iter().any(|key| pair.starts_with(&format!("{key} "))))
        .collect();
    m.blocking(|cluster| {
        cluster.kill_node(0);
        cluster.kill_node(1);
        Ok(cluster.start_node(1)?)
    })
    .await?;
    ctx.note("killed n1 and n2 (kill -9), started n2's Patroni again");
    let (leader, _) = m.blocking(|cluster| Ok(cluster.wait_leader(Some(0), OBSERVE_LIMIT_MS)?)).await?;
    ctx.check_eq("Patroni promoted n2", 1, leader);
    let retried = m.retry(&service, &keys).await?;
    ctx.check_eq("the 8 resolve on their retries, executed on n2", "201 OK=8".to_string(), retried.finals);
    m.blocking(|cluster| {
        cluster.start_node(0)?;
        Ok(cluster.wait_streaming(0, true, OBSERVE_LIMIT_MS)?)
    })
    .await?;
    let rewound = m.cluster().log_of(0).lines().any(|line| line.contains("pg_rewind"));
    ctx.check("n1 started again: Patroni rewound it (its log names pg_rewind) and it streams from n2", rewound, "");
    let after = m.send(&service, "after");
    let after_keys = after.keys.clone();
    ctx.check_eq("after the rejoin: answered", "201 OK=8".to_string(), m.answers(after).await?);
    ctx.check_eq("n1 replayed n2's latest debits", GROUP_SIZE, m.committed(0, &after_keys).await?);
    let (on1, on2) = (pairs(&m, 0).await?, pairs(&m, 1).await?);
    let foreign: Vec<&String> = on1.iter().filter(|pair| !on2.contains(pair)).collect();
    ctx.check(
        "every debit n1 holds is on n2 under the same id",
        foreign.is_empty(),
        format!("on n1 only: {foreign:?}"),
    );
    let kept: Vec<&String> = divergent.iter().filter(|pair| on1.contains(pair)).collect();
    ctx.check(
        "none of n1's divergent debits is left on it",
        kept.is_empty() && divergent.len() == GROUP_SIZE,
        format!("divergent={} kept={kept:?}", divergent.len()),
    );
    m.verify(ctx, 1, "on n2").await
}
