//! R8 — a planned switchover by Patroni (`patronictl switchover`).
//! Claim: on a Patroni cluster in `synchronous_mode`, the service on the nodes'
//! multi-host URL (`target_session_attrs=read-write`, as it runs today), with 16 debits
//! in flight when the switchover starts (8 held before their COMMIT, 8 committed and
//! held before their answer, each seen held) and a client sending one debit after
//! another throughout, `patronictl switchover` makes n2 the leader and n1 its
//! synchronous standby; every answer during it is 201 or 503 `UNKNOWN` (no 500, no
//! other), the 8 held before their COMMIT 503 `UNKNOWN`, the 8 committed ones 201;
//! each unknown debit resolves once on its same-key retry, every acknowledged debit is
//! on the new leader under its id, no id is acknowledged to two keys, balances and the
//! reconciliation are clean: 0 acknowledged debits lost.
//!
//! Fails if: the switchover fails or leaves another leader, an answer during it is
//! neither 201 nor 503 `UNKNOWN`, the prober got no answer at all, or an acknowledged
//! debit is missing, doubled, under another id or shared on the new leader.
//!
//! Rust, not a file: see [`crate::managed`]. Statements mode only: the debits held
//! before their COMMIT need an open transaction at `before-commit`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use cases_ledger::http::LedgerCalls as _;
use cases_ledger::modes::StatementsOnly as _;
use futures_util::FutureExt;
use launch::service::Service;

use crate::debit_groups::Answer;
use crate::managed::{self, GROUP_SIZE, Managed, OBSERVE_LIMIT_MS, account_of, held, hold};
use case_kit::{Case, Ctx};

/// The case's registration; set aside where the Patroni cluster cannot be had.
pub fn case() -> Case {
    Case::new(
        "R8",
        "Patroni: a planned switchover answers 201 or 503 UNKNOWN only and loses no acknowledged debit",
        |ctx| run(ctx).boxed(),
    )
    .not_clean()
    .requires(managed::unavailable)
    .statements_only()
}

/// One debit after another (keys `k-r8-probe-<n>`, accounts in turn) until `stop`;
/// each key with its answer.
fn probe(service: Arc<Service>, client: String, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<Vec<(String, Answer)>> {
    tokio::spawn(async move {
        let mut answers = Vec::new();
        let timeout = Duration::from_millis(OBSERVE_LIMIT_MS);
        while !stop.load(Ordering::SeqCst) {
            let key = format!("k-r8-probe-{}", answers.len());
            let account = account_of(answers.len());
            let answer = Answer::of(service.debit(&client, &key, &account, 1, timeout).await);
            answers.push((key, answer));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        answers
    })
}

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let mut m = Managed::start(ctx, true, None).await?;
    let url = m.multi_host_url();
    let service = m.service(ctx, &url, "multi-host", 60_000).await?;
    let before = m.send(&service, "before");
    ctx.check_eq("before the switchover: answered", "201 OK=8".to_string(), m.answers(before).await?);
    hold(&service, "after-commit").await?;
    let committed = m.send(&service, "committed");
    ctx.check_eq("committed and held before their answer", GROUP_SIZE as u64, held(&service, "after-commit").await?);
    hold(&service, "before-commit").await?;
    let open = m.send(&service, "open");
    ctx.check_eq("held before their COMMIT", GROUP_SIZE as u64, held(&service, "before-commit").await?);
    let stop = Arc::new(AtomicBool::new(false));
    let prober = probe(service.clone(), m.client_id(), stop.clone());
    let said = m.blocking(|cluster| Ok(cluster.switchover(0, 1)?)).await?;
    ctx.note(format!("patronictl switchover: {}", said.lines().find(|l| l.contains("witched")).unwrap_or("").trim()));
    service.release_fault("before-commit").await?;
    service.release_fault("after-commit").await?;
    let (open_keys, committed_keys) = (open.keys.clone(), committed.keys.clone());
    ctx.check_eq("held before their COMMIT: answered", "503 UNKNOWN=8".to_string(), m.answers(open).await?);
    ctx.check_eq("committed before it: answered", "201 OK=8".to_string(), m.answers(committed).await?);
    let (leader, _) = m.blocking(|cluster| Ok(cluster.wait_leader(Some(0), OBSERVE_LIMIT_MS)?)).await?;
    m.blocking(|cluster| Ok(cluster.wait_streaming(0, true, OBSERVE_LIMIT_MS)?)).await?;
    ctx.check_eq(
        "n2 leads, n1 is its synchronous standby",
        "replica primary".to_string(),
        format!("{} {}", m.cluster().role(0).unwrap_or_default(), m.cluster().role(1).unwrap_or_default()),
    );
    stop.store(true, Ordering::SeqCst);
    let probed = prober.await?;
    let others: Vec<String> = (probed.iter())
        .filter(|(_, a)| !a.acknowledged() && a.said != "503 UNKNOWN")
        .map(|(key, a)| format!("{key}: {}", a.said))
        .collect();
    let unknown = probed.iter().filter(|(_, a)| a.said == "503 UNKNOWN").count();
    ctx.note(format!("the prober: probes_n={} unknown_n={unknown}", probed.len()));
    ctx.check("the prober was answered", !probed.is_empty(), format!("probes_n={}", probed.len()));
    ctx.check("every answer during the switchover is 201 or 503 UNKNOWN", others.is_empty(), others.join(", "));
    let probe_keys: Vec<String> = probed.iter().map(|(key, _)| key.clone()).collect();
    m.enter_probes(&probed);
    ctx.check_eq("every unknown debit resolves on its same-key retry", "201 OK=8".to_string(), m.retry(&service, &open_keys).await?.finals);
    ctx.check_eq("the committed debits' retries replay", "201 OK replayed=8".to_string(), m.retry(&service, &committed_keys).await?.finals);
    let probes = m.retry(&service, &probe_keys).await?;
    ctx.check("every probe is acknowledged once retried",
        probes.acknowledged == probe_keys.len(),
        format!("acknowledged_n={} of probes_n={}", probes.acknowledged, probe_keys.len()));
    let after = m.send(&service, "after");
    ctx.check_eq("after the switchover: answered", "201 OK=8".to_string(), m.answers(after).await?);
    m.verify(ctx, leader, "on the new leader").await
}
