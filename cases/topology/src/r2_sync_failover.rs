//! R2 — failover with a synchronous standby: no acknowledged debit is lost.
//! Claim: 32 clients debit through `ledger-svc`, which connects with a multi-host URL
//! (`target_session_attrs=read-write`); once [`KILL_AFTER_ACKNOWLEDGED`] debits are
//! acknowledged the primary is killed (kill -9 of every process of it); the service
//! answers 503 `UNKNOWN` while no node takes writes (one such answer is observed before
//! the standby is promoted: forced, not timed); after the promotion it carries on
//! against the new primary. Every acknowledged debit is on the new primary, every
//! debit answered `UNKNOWN` resolves exactly once on its same-key retry, and the new
//! primary reconciles clean. The time from the kill to the first success is a note
//! (`kill_to_first_success_ms`, redacted in the snapshot).
//!
//! Fails if: an acknowledged debit is missing or doubled on the new primary, an answer
//! during the switch is anything but 503 `UNKNOWN`, a balance differs from its start
//! less the acknowledged debits, or the ledger does not reconcile.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use cases_ledger::http::LedgerCalls;
use futures_util::FutureExt;
use launch::service::{Service, ServiceOptions};
use points_ledger::{grant_in, reconcile, test_account};
use scratch_pg::Replication;
use tokio::sync::Notify;

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
/// Debits each client makes, one key each.
pub const DEBITS_PER_CLIENT: usize = 4;
/// The primary is killed once this many debits are acknowledged.
pub const KILL_AFTER_ACKNOWLEDGED: usize = 32;
/// Pause before a client retries a debit answered `UNKNOWN`, milliseconds (pacing only).
const RETRY_PAUSE_MS: u64 = 20;
/// Longest a client keeps retrying one key, milliseconds (a hang bound).
const RETRY_LIMIT_MS: u64 = 120_000;
/// The service's pooled connections.
const POOL_SIZE: usize = 8;
const CLIENT: &str = "app-r2";
/// Accounts debited: client `c` debits account `c % ACCOUNTS + 1`.
const ACCOUNTS: usize = 8;
const START_BALANCE: i64 = 1_000;
const DEBIT: i64 = 1;

/// What the clients and the case share while the load runs.
#[derive(Default)]
struct Load {
    acknowledged: AtomicUsize,
    killed: AtomicBool,
    kill_now: Notify,
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
    {
        let mut primary = pair.primary.connect(LEDGER_DATABASE).await?;
        for n in 1..=ACCOUNTS {
            let key = format!("g-r2-{n}");
            grant_in(
                mode,
                &mut primary,
                "ops",
                &key,
                &test_account(n as u32),
                START_BALANCE,
            )
            .await?;
        }
    }
    let url = pair::multi_host_url(&[&pair.primary, &pair.standby]);
    let mut options = ServiceOptions::default().with_clients(&[CLIENT]);
    options.pool_size = POOL_SIZE;
    options.extra_args = vec!["--transfer-mode".into(), mode.as_str().into()];
    let service = Arc::new(Service::launch(&url, ctx.log_file("ledger-svc")?, options).await?);
    let load = Arc::new(Load::default());
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| tokio::spawn(client(service.clone(), load.clone(), c)))
        .collect();
    tokio::time::timeout(
        Duration::from_millis(RETRY_LIMIT_MS),
        load.kill_now.notified(),
    )
    .await
    .map_err(|_| anyhow::anyhow!("{KILL_AFTER_ACKNOWLEDGED} debits were not acknowledged"))?;
    let acknowledged_before = load.acknowledged.load(Ordering::SeqCst);
    let _old_primary = pair::kill_node(pair.primary).await?;
    let killed_at = Instant::now();
    load.killed.store(true, Ordering::SeqCst);
    tokio::time::timeout(
        Duration::from_millis(RETRY_LIMIT_MS),
        load.unknown_after_kill.notified(),
    )
    .await
    .map_err(|_| anyhow::anyhow!("no 503 UNKNOWN observed after the kill"))?;
    pair.standby.promote().await?;
    let mut stories = BTreeMap::new();
    for (c, handle) in clients.into_iter().enumerate() {
        for (d, story) in handle.await??.into_iter().enumerate() {
            stories.insert(key(c, d), story);
        }
    }
    let first_success = *load.first_success_after_kill.lock().unwrap();
    ctx.note(format!(
        "acknowledged_before_kill_n={acknowledged_before} kill_to_first_success_ms={}",
        first_success.map_or(0, |at| at.duration_since(killed_at).as_millis())
    ));
    check(ctx, &pair.standby, &stories).await
}

fn key(c: usize, d: usize) -> String {
    format!("k-r2-{c:02}-{d}")
}

/// One client: its debits in order, each retried with the same key until it is
/// answered 201 (or the hang bound runs out).
async fn client(service: Arc<Service>, load: Arc<Load>, c: usize) -> anyhow::Result<Vec<KeyStory>> {
    let account = test_account((c % ACCOUNTS + 1) as u32);
    let mut stories = Vec::new();
    for d in 0..DEBITS_PER_CLIENT {
        let key = key(c, d);
        let mut story = KeyStory::default();
        let deadline = Instant::now() + Duration::from_millis(RETRY_LIMIT_MS);
        loop {
            anyhow::ensure!(
                Instant::now() < deadline,
                "{key}: no answer but 503 for {RETRY_LIMIT_MS} ms"
            );
            let answer = service.debit_once(CLIENT, &key, &account, DEBIT).await;
            match answer {
                Ok(reply) if reply.status == 201 => {
                    story.final_status = 201;
                    story.replayed = reply.replayed;
                    if load.killed.load(Ordering::SeqCst) {
                        let mut first = load.first_success_after_kill.lock().unwrap();
                        first.get_or_insert_with(Instant::now);
                    }
                    if load.acknowledged.fetch_add(1, Ordering::SeqCst) + 1
                        == KILL_AFTER_ACKNOWLEDGED
                    {
                        load.kill_now.notify_one();
                    }
                    break;
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
        stories.push(story);
    }
    Ok(stories)
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
                &(1..=ACCOUNTS)
                    .map(|n| test_account(n as u32))
                    .collect::<Vec<_>>(),
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
