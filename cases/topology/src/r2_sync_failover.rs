//! R2 — failover with a synchronous standby: no acknowledged debit is lost.
//! Claim: 32 clients debit through `ledger-svc`, which connects with a multi-host URL
//! (`target_session_attrs=read-write`). Each client's first debit is acknowledged; then
//! the clients wait at a barrier while a holder session on the primary locks every
//! debited account (`SELECT … FOR UPDATE`), are released, and the case waits until all
//! of the service's [`POOL_SIZE`] sessions are seen waiting on a lock
//! (`pg_stat_activity.wait_event_type = 'Lock'`): those debits are in flight, certainly
//! not committed. Then the primary is killed (kill -9 of every process of it), so the
//! in-flight debits die with their sessions and the service answers 503 `UNKNOWN`
//! while no node takes writes (one such answer is observed before the standby is
//! promoted). After the promotion it carries on against the new primary. Every
//! acknowledged debit is on the new primary, every debit answered `UNKNOWN` resolves
//! exactly once on its same-key retry, and the new primary reconciles clean. Nothing
//! here depends on timing: the kill lands while the debits wait on a lock. The time from
//! the kill to the first success is a note (`kill_to_first_success_ms`, redacted in the
//! snapshot).
//!
//! Fails if: an acknowledged debit is missing or doubled on the new primary, an answer
//! during the switch is anything but 503 `UNKNOWN`, no debit was answered 503 `UNKNOWN`,
//! a balance differs from its start less the acknowledged debits, or the ledger does
//! not reconcile.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use cases_ledger::http::LedgerCalls;
use futures_util::FutureExt;
use launch::service::{Service, ServiceOptions};
use points_ledger::{grant_in, reconcile, test_account};
use scratch_pg::Replication;
use tokio::sync::{Barrier, Notify};

use crate::pair::{self, LEDGER_DATABASE};
use case_kit::{Case, Ctx};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "R2",
        "failover with a synchronous standby: every acknowledged debit survives, unknown ones resolve once",
        |ctx| run(ctx).boxed(),
    )
}

/// Concurrent clients of the service.
pub const CLIENTS: usize = 32;
/// Debits each client makes, one key each; the first before the kill.
pub const DEBITS_PER_CLIENT: usize = 3;
/// Pause before a client retries a debit answered `UNKNOWN`, milliseconds (pacing only).
const RETRY_PAUSE_MS: u64 = 20;
/// Longest a client keeps retrying one key, and longest the case waits for a state it
/// observes, milliseconds (a hang bound).
const RETRY_LIMIT_MS: u64 = 120_000;
/// Pause between two looks at `pg_stat_activity`, milliseconds (pacing only).
const POLL_MS: u64 = 10;
/// The service's pooled connections: the debits in flight at the kill.
const POOL_SIZE: usize = 8;
/// The service's request, lock and statement bounds, milliseconds: hang bounds only, far
/// above the time the debits wait on the holder's lock.
const SERVICE_BOUND_MS: u64 = 60_000;
const CLIENT: &str = "app-r2";
/// Accounts debited: client `c` debits account `c % ACCOUNTS + 1`.
const ACCOUNTS: usize = 8;
const START_BALANCE: i64 = 1_000;
const DEBIT: i64 = 1;

/// What the clients and the case share while the load runs.
struct Load {
    acknowledged: AtomicUsize,
    killed: AtomicBool,
    /// Every client and the case: the clients' first debits are acknowledged.
    first_done: Barrier,
    /// Every client and the case: the holder's lock is taken.
    go: Barrier,
    unknown_after_kill: Notify,
    first_success_after_kill: std::sync::Mutex<Option<Instant>>,
}

/// One key's story as its client saw it.
#[derive(Debug, Clone, Default)]
struct KeyStory {
    unknown_answers: usize,
    other_answers: Vec<String>,
    final_status: u16,
    replayed: bool,
}

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let mode = cases_ledger::modes::mode(ctx);
    let pair = pair::start_pair(ctx, Replication::Synchronous).await?;
    grant_all(mode, &pair.primary).await?;
    let url = pair::multi_host_url(&[&pair.primary, &pair.standby]);
    let service = Arc::new(launch_service(ctx, &url, mode).await?);
    let load = Arc::new(Load {
        acknowledged: AtomicUsize::new(0),
        killed: AtomicBool::new(false),
        first_done: Barrier::new(CLIENTS + 1),
        go: Barrier::new(CLIENTS + 1),
        unknown_after_kill: Notify::new(),
        first_success_after_kill: std::sync::Mutex::new(None),
    });
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| tokio::spawn(client(service.clone(), load.clone(), c)))
        .collect();
    bounded(load.first_done.wait(), "the clients' first debits").await?;
    let acknowledged_before = load.acknowledged.load(Ordering::SeqCst);
    let mut holder = pair.primary.connect(LEDGER_DATABASE).await?;
    let lock = holder.transaction().await?;
    lock.execute(
        "SELECT 1 FROM account WHERE account_id = ANY($1) FOR UPDATE",
        &[&accounts()],
    )
    .await?;
    bounded(load.go.wait(), "the clients at the barrier").await?;
    let waiting = waiting_on_lock(&pair.primary, POOL_SIZE).await?;
    let _old_primary = pair::kill_node(pair.primary).await?;
    let killed_at = Instant::now();
    load.killed.store(true, Ordering::SeqCst);
    drop(lock);
    bounded(
        load.unknown_after_kill.notified(),
        "a 503 UNKNOWN after the kill",
    )
    .await?;
    pair.standby.promote().await?;
    let mut stories = BTreeMap::new();
    for (c, handle) in clients.into_iter().enumerate() {
        for (d, story) in handle.await??.into_iter().enumerate() {
            stories.insert(key(c, d), story);
        }
    }
    ctx.check_eq(
        "debits acknowledged before the kill (each client's first)",
        CLIENTS,
        acknowledged_before,
    );
    ctx.check_eq(
        "service sessions waiting on the holder's lock at the kill (debits in flight)",
        POOL_SIZE,
        waiting,
    );
    let first_success = *load.first_success_after_kill.lock().unwrap();
    ctx.note(format!(
        "kill_to_first_success_ms={}",
        first_success.map_or(0, |at| at.duration_since(killed_at).as_millis())
    ));
    check(ctx, &pair.standby, &stories).await
}

/// `ledger-svc` on `url` in `mode`, with [`POOL_SIZE`] connections and its bounds at
/// [`SERVICE_BOUND_MS`].
async fn launch_service(
    ctx: &Ctx,
    url: &str,
    mode: points_ledger::TransferMode,
) -> anyhow::Result<Service> {
    let mut options = ServiceOptions::default().with_clients(&[CLIENT]);
    options.pool_size = POOL_SIZE;
    options.extra_args = vec!["--transfer-mode".into(), mode.as_str().into()];
    for bound in [
        "--request-timeout-ms",
        "--lock-timeout-ms",
        "--statement-timeout-ms",
    ] {
        options
            .extra_args
            .extend([bound.into(), SERVICE_BOUND_MS.to_string()]);
    }
    Service::launch(url, ctx.log_file("ledger-svc")?, options).await
}

/// Grants every debited account its start balance on the primary.
async fn grant_all(
    mode: points_ledger::TransferMode,
    primary: &scratch_pg::Cluster,
) -> anyhow::Result<()> {
    let mut primary = primary.connect(LEDGER_DATABASE).await?;
    for n in 1..=ACCOUNTS {
        let key = format!("g-r2-{n}");
        let account = test_account(n as u32);
        grant_in(mode, &mut primary, "ops", &key, &account, START_BALANCE).await?;
    }
    Ok(())
}

fn accounts() -> Vec<String> {
    (1..=ACCOUNTS).map(|n| test_account(n as u32)).collect()
}

/// Awaits `what` within the hang bound.
async fn bounded<T>(future: impl Future<Output = T>, what: &str) -> anyhow::Result<T> {
    tokio::time::timeout(Duration::from_millis(RETRY_LIMIT_MS), future)
        .await
        .map_err(|_| anyhow::anyhow!("{what}: not seen within {RETRY_LIMIT_MS} ms"))
}

/// Waits until `want` sessions of the ledger database wait on a lock
/// (`pg_stat_activity.wait_event_type = 'Lock'`), and returns the count seen.
///
/// Errors: SQL errors; not seen within the hang bound.
async fn waiting_on_lock(node: &scratch_pg::Cluster, want: usize) -> anyhow::Result<usize> {
    let observer = node.connect(LEDGER_DATABASE).await?;
    let deadline = Instant::now() + Duration::from_millis(RETRY_LIMIT_MS);
    loop {
        let row = observer
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE datname = $1 AND wait_event_type = 'Lock'",
                &[&LEDGER_DATABASE],
            )
            .await?;
        let seen = row.get::<_, i64>(0) as usize;
        if seen >= want {
            return Ok(seen);
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "only {seen} of {want} sessions seen waiting on a lock"
        );
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    }
}

fn key(c: usize, d: usize) -> String {
    format!("k-r2-{c:02}-{d}")
}

/// One client: its debits in order, each retried with the same key until it is
/// answered 201 (or the hang bound runs out); after the first it waits at the case's
/// two barriers.
async fn client(service: Arc<Service>, load: Arc<Load>, c: usize) -> anyhow::Result<Vec<KeyStory>> {
    let account = test_account((c % ACCOUNTS + 1) as u32);
    let mut stories = Vec::new();
    for d in 0..DEBITS_PER_CLIENT {
        if d == 1 {
            load.first_done.wait().await;
            load.go.wait().await;
        }
        stories.push(debit_until_answered(&service, &load, &key(c, d), &account).await?);
    }
    Ok(stories)
}

/// One key, retried with the same key until it is answered 201.
async fn debit_until_answered(
    service: &Service,
    load: &Load,
    key: &str,
    account: &str,
) -> anyhow::Result<KeyStory> {
    let mut story = KeyStory::default();
    let deadline = Instant::now() + Duration::from_millis(RETRY_LIMIT_MS);
    loop {
        anyhow::ensure!(
            Instant::now() < deadline,
            "{key}: no answer but 503 for {RETRY_LIMIT_MS} ms"
        );
        match service.debit_once(CLIENT, key, account, DEBIT).await {
            Ok(reply) if reply.status == 201 => {
                story.final_status = 201;
                story.replayed = reply.replayed;
                if load.killed.load(Ordering::SeqCst) {
                    let mut first = load.first_success_after_kill.lock().unwrap();
                    first.get_or_insert_with(Instant::now);
                }
                load.acknowledged.fetch_add(1, Ordering::SeqCst);
                return Ok(story);
            }
            Ok(reply) if reply.status_outcome() == "503 UNKNOWN" => {
                story.unknown_answers += 1;
                if load.killed.load(Ordering::SeqCst) {
                    load.unknown_after_kill.notify_one();
                }
            }
            Ok(reply) => story.other_answers.push(reply.status_outcome()),
            Err(error) => story.other_answers.push(format!("transport: {error}")),
        }
        tokio::time::sleep(Duration::from_millis(RETRY_PAUSE_MS)).await;
    }
}

/// The checks on the new primary.
// Long: the case's checks one after another, in the order its transcript shows them.
async fn check(
    ctx: &mut Ctx,
    promoted: &scratch_pg::Cluster,
    stories: &BTreeMap<String, KeyStory>,
) -> anyhow::Result<()> {
    let mut db = promoted.connect(LEDGER_DATABASE).await?;
    let rows = db
        .query(
            "SELECT idem_key, count(*) FROM ledger_txn WHERE client_id = $1 GROUP BY idem_key",
            &[&CLIENT],
        )
        .await?;
    let on_new: BTreeMap<String, i64> = rows.iter().map(|row| (row.get(0), row.get(1))).collect();
    let acknowledged: Vec<&String> = stories
        .iter()
        .filter(|(_, s)| s.final_status == 201)
        .map(|(k, _)| k)
        .collect();
    ctx.check_eq(
        "debits acknowledged (each key answered 201 in the end)",
        CLIENTS * DEBITS_PER_CLIENT,
        acknowledged.len(),
    );
    let not_once: Vec<String> = acknowledged
        .iter()
        .filter(|key| on_new.get(key.as_str()) != Some(&1))
        .map(|key| format!("{key}×{}", on_new.get(key.as_str()).unwrap_or(&0)))
        .collect();
    ctx.check(
        "every acknowledged debit is on the new primary exactly once",
        not_once.is_empty(),
        format!("missing or doubled: {}", not_once.join(" ")),
    );
    let others: Vec<String> = stories
        .iter()
        .flat_map(|(key, s)| {
            s.other_answers
                .iter()
                .map(move |answer| format!("{key}: {answer}"))
        })
        .collect();
    ctx.check(
        "every answer but 201 was 503 UNKNOWN",
        others.is_empty(),
        others.join("; "),
    );
    let unknown: Vec<&KeyStory> = stories.values().filter(|s| s.unknown_answers > 0).collect();
    ctx.check(
        "some debits were answered 503 UNKNOWN during the switch",
        !unknown.is_empty(),
        "",
    );
    ctx.note(format!(
        "unknown_keys_n={} unknown_replayed_n={}",
        unknown.len(),
        unknown.iter().filter(|s| s.replayed).count()
    ));
    let balances = db
        .query(
            "SELECT count(*) FROM account WHERE account_id = ANY($1) AND balance <> $2",
            &[
                &accounts(),
                &(START_BALANCE - (CLIENTS / ACCOUNTS * DEBITS_PER_CLIENT) as i64 * DEBIT),
            ],
        )
        .await?;
    let wrong: i64 = balances[0].get(0);
    ctx.check_eq(
        "accounts whose balance is not its start less its acknowledged debits",
        0,
        wrong,
    );
    let findings = reconcile(&mut db).await?;
    ctx.check(
        "new primary reconciles clean",
        findings.is_clean(),
        findings.summary(),
    );
    Ok(())
}
