//! L18 — one stuck transaction does not stop the service.
//! Claim: while another session holds the redemption row's lock (a transaction stuck
//! before its COMMIT), every debit that needs that row waits at most the service's lock
//! bound (`--lock-timeout-ms`), is rolled back and answered 503 `UNKNOWN` with
//! `Retry-After`, and records nothing; `/healthz` keeps answering 200 within 500 ms (half the lock bound); once
//! the holder commits, a retry with each same key executes exactly once (and a second
//! retry replays it). With `--redeem-stripes 8`, only the debits whose stripe is held
//! wait; the others answer 201 promptly.
//! Setup: balance 100 on acct-0001 … acct-0010; ledger-svc with a lock bound and a
//! statement bound of 1000 ms each (see [`LOCK_BOUND_MS`]) and a pool of 16; a session of the case takes `SELECT … FOR UPDATE` on the row and
//! keeps its transaction open for 3000 ms (the 20 s shortened: three times the
//! bound already shows the holder outlasting every debit, and CI time is shared).
//! Then 10 debits of 10, one per account, at once (fewer than the pool).
//! Negative control: a service whose bounds are longer than the client waits (60 s, the
//! old unbounded design): the debit behind the same stuck transaction gets no answer
//! within bound + 1000 ms; after the holder commits it executes once, late.
//! Fails if: a debit is not answered within bound + 1000 ms, a 503 lacks `Retry-After`
//! or recorded anything, a `/healthz` probe is slow or not 200, a retry executes twice or
//! not at all, the service logged no line for a debit, or reconciliation has findings.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use futures_util::future::join_all;
use ledger_svc::striping::redeem_account_for;
use ledger_svc::{SYS_REDEEM, test_account};
use reqwest::header::CONTENT_TYPE;

use super::queries;
use case_kit::service::{Service, ServiceOptions};
use case_kit::{Case, Ctx};

use super::http::{LedgerCalls, LedgerReply};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "L18",
        "one stuck transaction: debits answer 503 within the lock bound, healthz stays up, retries execute once",
        |ctx| run_with(ctx, ControlPlan::FORCED).boxed(),
    )
    .connections(20)
}

/// Whether the negative control's session really holds the row: [`ControlPlan::FORCED`]
/// in the case; a test runs `hold: false`, where no debit can be stuck, and sees the
/// control's `negative control exposes` check FAIL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ControlPlan {
    /// Take the row lock before the control's debit.
    pub hold: bool,
}

impl ControlPlan {
    /// The case's plan: the lock is held.
    pub const FORCED: ControlPlan = ControlPlan { hold: true };
}

/// The negative control's service bound, milliseconds: longer than the client waits, so
/// as good as none here (the service's old behaviour: no bound at all).
const UNBOUNDED_MS: u64 = 60_000;
/// The anomaly the negative control exposes (the name of its `exposes` check).
pub fn anomaly() -> String {
    format!(
        "without a lock bound, a debit behind the stuck transaction gets no answer within {} ms",
        LOCK_BOUND_MS + ANSWER_SLACK_MS
    )
}

/// The negative control's key and account.
const CONTROL_KEY: &str = "k-18-c";
const CONTROL_ACCOUNT: &str = "acct-0001";

/// The service's lock bound in this case, milliseconds (`--lock-timeout-ms`), and its
/// statement bound (`--statement-timeout-ms`). Both: `lock_timeout` applies to each lock
/// acquisition attempt separately (PostgreSQL docs, 20.11.2), and an UPDATE queued behind
/// other waiters on one row makes two (the tuple lock, then the holder's transaction), so
/// alone it would let a debit wait twice the bound; the statement bound caps the sum.
const LOCK_BOUND_MS: u64 = 1_000;
/// Slack on top of the bound for the answer to reach the client, milliseconds.
const ANSWER_SLACK_MS: u64 = 1_000;
/// How long the holder keeps the row locked, milliseconds.
const HOLD_MS: u64 = 3_000;
/// `/healthz` must answer within this, milliseconds: half the lock bound, so a probe
/// that waited on the held row (at least [`LOCK_BOUND_MS`]) cannot pass, while a busy
/// machine's scheduling delay (one run saw 111 ms against an earlier 100 ms bound) does
/// not fail a liveness route that never touches the database.
const HEALTH_BOUND_MS: u64 = LOCK_BOUND_MS / 2;
/// Pause between two `/healthz` probes, milliseconds.
const HEALTH_PROBE_INTERVAL_MS: u64 = 20;
/// A debit that takes no held lock answers within this, milliseconds ("promptly": less
/// than the lock bound, so it cannot have waited it out).
const PROMPT_MS: u64 = LOCK_BOUND_MS;
/// Longest wait for the service to close the connection its gone client left half-open,
/// milliseconds (the negative control commits the holder only then).
const CLIENT_GONE_LIMIT_MS: u64 = 10_000;
/// How often `/proc/net/tcp` is read while waiting for that, milliseconds.
const CLIENT_GONE_POLL_MS: u64 = 5;
const POOL_SIZE: usize = 16;
const STRIPES: u32 = 8;
const ACCOUNTS: u32 = 10;
const START_BALANCE: i64 = 100;
const DEBIT: i64 = 10;
const CLIENT: &str = "app-l18";

/// The case under `plan` (which only the negative control reads).
///
/// Errors: the service, the database or a transport failed.
pub async fn run_with(ctx: &mut Ctx, plan: ControlPlan) -> anyhow::Result<()> {
    let db = ctx.connect().await?;
    let accounts: Vec<String> = (1..=ACCOUNTS).map(test_account).collect();
    ctx.note(format!(
        "lock and statement bound {LOCK_BOUND_MS} ms (--lock-timeout-ms, --statement-timeout-ms), answer bound {} ms, hold {HOLD_MS} ms, \
         healthz bound {HEALTH_BOUND_MS} ms, pool {POOL_SIZE}",
        LOCK_BOUND_MS + ANSWER_SLACK_MS
    ));

    // Default mode: every debit credits the one sys-redeem row.
    let service = start(ctx, 0).await?;
    for account in &accounts {
        service
            .grant("ops", &format!("g-18-{account}"), account, START_BALANCE)
            .await?;
    }
    let held = SYS_REDEEM.to_owned();
    let blocked: Vec<String> = accounts.clone();
    phase(
        ctx, &db, &service, "default", "a", &held, &accounts, &blocked,
    )
    .await?;
    service.stop_checked(ctx).await?;

    // Striped mode: the holder locks the stripe of acct-0001 only.
    let service = start(ctx, STRIPES).await?;
    let held = redeem_account_for(&accounts[0], STRIPES);
    let blocked: Vec<String> = accounts
        .iter()
        .filter(|account| redeem_account_for(account, STRIPES) == held)
        .cloned()
        .collect();
    phase(
        ctx, &db, &service, "striped", "b", &held, &accounts, &blocked,
    )
    .await?;
    // Both services append to the case's one ledger-svc log.
    let log_path = service.log_path().to_owned();
    service.stop_checked(ctx).await?;

    unbounded_control(ctx, &db, plan).await?;

    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    let logged_503 = log
        .lines()
        .filter(|line| {
            line.contains("route=/accounts/{id}/debits")
                && line.contains("status=503")
                && line.contains("outcome=UNKNOWN")
        })
        .count();
    ctx.check_eq(
        "service log: one request line per 503 debit (both modes)",
        ACCOUNTS as usize + blocked.len(),
        logged_503,
    );

    let gone = log
        .lines()
        .filter(|line| {
            line.contains(&format!("key={CONTROL_KEY} "))
                && line.contains("status=201")
                && line.contains("replayed=false")
                && line.contains("client_gone=true")
        })
        .count();
    ctx.check_eq(
        "service log: the control's debit, committed after its client gave up, logged with client_gone=true",
        usize::from(plan.hold),
        gone,
    );

    let mut client = ctx.connect().await?;
    let findings = ledger_svc::reconcile(&mut client).await?;
    ctx.check(
        "reconciliation: no findings",
        findings.is_clean(),
        findings.summary(),
    );
    Ok(())
}

/// Negative control: the same stuck transaction in front of a service whose bounds are
/// longer than its client waits (the design before bounded waits). The debit gets no
/// answer within bound + 1000 ms; once the holder commits it executes (its client gone),
/// and the same-key retry replays it: late, but once.
async fn unbounded_control(
    ctx: &mut Ctx,
    db: &tokio_postgres::Client,
    plan: ControlPlan,
) -> anyhow::Result<()> {
    let service = start_bounded(ctx, 0, UNBOUNDED_MS).await?;
    ctx.note(format!(
        "control: a service with lock and statement bounds of {UNBOUNDED_MS} ms; holder locks {SYS_REDEEM}: {}",
        plan.hold
    ));
    let holder = ctx.connect().await?;
    holder.batch_execute("BEGIN").await?;
    if plan.hold {
        holder
            .query(
                "SELECT balance FROM account WHERE account_id = $1 FOR UPDATE",
                &[&SYS_REDEEM],
            )
            .await?;
    }
    let wait = Duration::from_millis(LOCK_BOUND_MS + ANSWER_SLACK_MS);
    let attempt = service
        .debit(CLIENT, CONTROL_KEY, CONTROL_ACCOUNT, DEBIT, wait)
        .await;
    let unanswered = matches!(&attempt, Err(error) if error.is_timeout());
    ctx.exposes(
        anomaly(),
        unanswered,
        match &attempt {
            Ok(reply) => format!("answered {}", reply.summary()),
            Err(error) if error.is_timeout() => "client timed out".to_string(),
            Err(_) => "another transport error".to_string(),
        },
    );
    if unanswered {
        // The client gave up. Commit the holder only once the service has closed the
        // connection the client left (hyper drops the request then, and the transfer,
        // which goes on in its own task, finds its client gone), so the log line below
        // does not depend on how fast the debit finishes after the commit (one statement
        // in the one-trip mode, several in the statement mode).
        let closed = connections_closed(service.public_addr().port()).await?;
        ctx.check(
            "control: the service closed the connection its gone client left",
            closed,
            format!("within {CLIENT_GONE_LIMIT_MS} ms: {closed}"),
        );
    }
    holder.batch_execute("COMMIT").await?;
    let retry = service
        .debit_once(CLIENT, CONTROL_KEY, CONTROL_ACCOUNT, DEBIT)
        .await?;
    ctx.note(format!(
        "control: same-key retry after the commit: {}",
        retry.summary()
    ));
    ctx.check_eq(
        "control: the stuck debit executed once, after the holder committed",
        1,
        queries::txns_for_key(db, CLIENT, CONTROL_KEY).await?,
    );
    service.stop_checked(ctx).await?;
    Ok(())
}

/// Waits (at most [`CLIENT_GONE_LIMIT_MS`]) until no TCP connection on the loopback
/// `port` is open on the server's side (`/proc/net/tcp`: local port `port`, state
/// ESTABLISHED `01` or CLOSE_WAIT `08`, the latter a connection whose client sent FIN
/// that the server has not closed yet). Returns whether that happened.
///
/// Errors: `/proc/net/tcp` cannot be read.
async fn connections_closed(port: u16) -> anyhow::Result<bool> {
    let local = format!(":{port:04X}");
    let deadline = Instant::now() + Duration::from_millis(CLIENT_GONE_LIMIT_MS);
    loop {
        let table = std::fs::read_to_string("/proc/net/tcp")?;
        let open = table.lines().skip(1).any(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            fields.len() > 3
                && fields[1].ends_with(&local)
                && (fields[3] == "01" || fields[3] == "08")
        });
        if !open {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(CLIENT_GONE_POLL_MS)).await;
    }
}

async fn start(ctx: &Ctx, stripes: u32) -> anyhow::Result<Service> {
    start_bounded(ctx, stripes, LOCK_BOUND_MS).await
}

async fn start_bounded(ctx: &Ctx, stripes: u32, bound_ms: u64) -> anyhow::Result<Service> {
    let mut extra_args = vec![
        "--lock-timeout-ms".to_string(),
        bound_ms.to_string(),
        "--statement-timeout-ms".to_string(),
        bound_ms.to_string(),
    ];
    if stripes > 1 {
        extra_args.extend(["--redeem-stripes".to_string(), stripes.to_string()]);
    }
    Service::start(
        ctx,
        ServiceOptions {
            pool_size: POOL_SIZE,
            extra_args,
            clients: vec![CLIENT.into()],
            ..ServiceOptions::default()
        },
    )
    .await
}

/// One debit's answer as the client saw it.
struct Answer {
    account: String,
    key: String,
    status: u16,
    outcome: String,
    retry_after: Option<String>,
    took: Duration,
}

/// Holds `held` in a transaction of the case's own, sends one debit per account, checks
/// the answers (503 within the bound for `blocked`, 201 promptly for the others), the
/// `/healthz` probes, that nothing was recorded for the 503s, then commits the holder and
/// retries every 503 with its key.
#[allow(clippy::too_many_arguments)]
async fn phase(
    ctx: &mut Ctx,
    db: &tokio_postgres::Client,
    service: &Service,
    mode: &str,
    tag: &str,
    held: &str,
    accounts: &[String],
    blocked: &[String],
) -> anyhow::Result<()> {
    ctx.note(format!(
        "{mode}: holder locks {held}; {} of {} debits need it",
        blocked.len(),
        accounts.len()
    ));
    let balances_before = balances(db, accounts).await?;

    let holder = ctx.connect().await?;
    holder.batch_execute("BEGIN").await?;
    holder
        .query(
            "SELECT balance FROM account WHERE account_id = $1 FOR UPDATE",
            &[&held],
        )
        .await?;
    let hold_started = Instant::now();

    let stop = Arc::new(AtomicBool::new(false));
    let prober = tokio::spawn(probe_health(
        service.http().clone(),
        service.public_url("/healthz"),
        stop.clone(),
    ));

    let answers = join_all(accounts.iter().map(|account| {
        let key = format!("k-18-{tag}-{account}");
        timed_debit(service, account.clone(), key)
    }))
    .await;
    let answers: Vec<Answer> = answers.into_iter().collect::<anyhow::Result<_>>()?;
    let all_answered_ms = hold_started.elapsed().as_millis() as u64;
    let ready = service
        .send(service.http().get(service.public_url("/readyz")))
        .await?;

    // Hold on to the end: the holder outlasts every debit.
    let rest = Duration::from_millis(HOLD_MS).saturating_sub(hold_started.elapsed());
    tokio::time::sleep(rest).await;
    stop.store(true, Ordering::SeqCst);
    let probes = prober.await?;
    holder.batch_execute("COMMIT").await?;

    let (waited, prompt): (Vec<&Answer>, Vec<&Answer>) = answers
        .iter()
        .partition(|answer| blocked.contains(&answer.account));
    let slowest_ms = waited.iter().map(|a| a.took.as_millis()).max().unwrap_or(0);
    ctx.note(format!(
        "{mode}: answers: {} (slowest_wait_ms={slowest_ms} all_answered_ms={all_answered_ms})",
        tally(&answers)
    ));
    ctx.check_eq(
        format!("{mode}: debits needing {held} answered 503 UNKNOWN"),
        waited.len(),
        waited
            .iter()
            .filter(|a| a.status == 503 && a.outcome == "UNKNOWN")
            .count(),
    );
    ctx.check_eq(
        format!("{mode}: each 503 carries Retry-After: 1"),
        waited.len(),
        waited
            .iter()
            .filter(|a| a.retry_after.as_deref() == Some("1"))
            .count(),
    );
    let bound = Duration::from_millis(LOCK_BOUND_MS + ANSWER_SLACK_MS);
    ctx.check_eq(
        format!(
            "{mode}: each 503 answered within bound + 1000 ms ({} ms)",
            LOCK_BOUND_MS + ANSWER_SLACK_MS
        ),
        waited.len(),
        waited.iter().filter(|a| a.took <= bound).count(),
    );
    ctx.check(
        format!("{mode}: every debit was answered while the holder still held the lock"),
        all_answered_ms < HOLD_MS,
        if all_answered_ms < HOLD_MS {
            "yes"
        } else {
            "no"
        },
    );
    if !prompt.is_empty() {
        ctx.check_eq(
            format!("{mode}: debits whose stripe is not held answered 201 within {PROMPT_MS} ms"),
            prompt.len(),
            prompt
                .iter()
                .filter(|a| a.status == 201 && a.took < Duration::from_millis(PROMPT_MS))
                .count(),
        );
    }
    let slow = probes
        .iter()
        .filter(|(status, took)| *status != 200 || *took >= Duration::from_millis(HEALTH_BOUND_MS))
        .count();
    let slowest_probe_ms = probes.iter().map(|(_, t)| t.as_millis()).max().unwrap_or(0);
    ctx.note(format!(
        "{mode}: healthz during the hold: slowest_probe_ms={slowest_probe_ms}"
    ));
    ctx.check(
        format!(
            "{mode}: every healthz probe during the hold answered 200 within {HEALTH_BOUND_MS} ms"
        ),
        slow == 0 && probes.len() >= 2,
        if slow == 0 && probes.len() >= 2 {
            "all".to_string()
        } else {
            format!("slow or failed={slow}")
        },
    );
    ctx.check_eq(
        format!("{mode}: readyz during the hold (pool connections free)"),
        200,
        ready.status,
    );

    let mut recorded = 0;
    for answer in &waited {
        recorded += queries::txns_for_key(db, CLIENT, &answer.key).await?;
        recorded += db
            .query_one(
                "SELECT count(*) FROM idem_request WHERE client_id = $1 AND idem_key = $2",
                &[&CLIENT, &answer.key],
            )
            .await?
            .get::<_, i64>(0);
    }
    ctx.check_eq(
        format!("{mode}: rows recorded for the 503 debits"),
        0,
        recorded,
    );
    let after_hold = balances(db, accounts).await?;
    let expected: Vec<i64> = accounts
        .iter()
        .zip(&balances_before)
        .map(|(account, before)| {
            if blocked.contains(account) {
                *before
            } else {
                before - DEBIT
            }
        })
        .collect();
    ctx.check(
        format!("{mode}: balances after the hold: only the 201 debits were taken"),
        after_hold == expected,
        format!("{after_hold:?}"),
    );

    // The holder committed: each 503 retried with its same key executes once; a second
    // retry replays it; the 201s replay.
    let mut executed = 0;
    let mut replayed = 0;
    for answer in &waited {
        let retry = service
            .debit_once(CLIENT, &answer.key, &answer.account, DEBIT)
            .await?;
        if retry.status == 201 && !retry.replayed {
            executed += 1;
        }
        let again = service
            .debit_once(CLIENT, &answer.key, &answer.account, DEBIT)
            .await?;
        if again.status == 201 && again.replayed && again.txn_id() == retry.txn_id() {
            replayed += 1;
        }
    }
    for answer in &prompt {
        let again = service
            .debit_once(CLIENT, &answer.key, &answer.account, DEBIT)
            .await?;
        if again.status == 201 && again.replayed {
            replayed += 1;
        }
    }
    ctx.check_eq(
        format!("{mode}: retries of the 503s executed (201, not replayed)"),
        waited.len(),
        executed,
    );
    ctx.check_eq(
        format!("{mode}: further retries replayed"),
        accounts.len(),
        replayed,
    );
    let mut once = 0;
    for answer in &answers {
        if queries::txns_for_key(db, CLIENT, &answer.key).await? == 1 {
            once += 1;
        }
    }
    ctx.check_eq(
        format!("{mode}: keys with exactly one transaction"),
        accounts.len(),
        once,
    );
    let after = balances(db, accounts).await?;
    ctx.check(
        format!("{mode}: every account debited exactly once (balance - 10)"),
        after
            .iter()
            .zip(&balances_before)
            .all(|(now, before)| *now == before - DEBIT),
        format!("{after:?}"),
    );
    Ok(())
}

/// A debit with its answer time and `Retry-After` header.
async fn timed_debit(service: &Service, account: String, key: String) -> anyhow::Result<Answer> {
    let request = service
        .http()
        .post(service.public_url(&format!("/accounts/{account}/debits")))
        .header("x-client-id", CLIENT)
        .header("idempotency-key", &key)
        .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(format!("amount={DEBIT}"));
    let started = Instant::now();
    let response = service.authorize(request).send().await?;
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let bytes = response.bytes().await?;
    let body: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
    Ok(Answer {
        account,
        key,
        status,
        outcome: body["outcome"].as_str().unwrap_or("").to_owned(),
        retry_after,
        took: started.elapsed(),
    })
}

/// Probes `url` every [`HEALTH_PROBE_INTERVAL_MS`] until `stop`; each probe's status
/// (0 for a transport error) and time.
async fn probe_health(
    http: reqwest::Client,
    url: String,
    stop: Arc<AtomicBool>,
) -> Vec<(u16, Duration)> {
    let mut probes = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        let started = Instant::now();
        let status = match http.get(&url).send().await {
            Ok(response) => response.status().as_u16(),
            Err(_) => 0,
        };
        probes.push((status, started.elapsed()));
        tokio::time::sleep(Duration::from_millis(HEALTH_PROBE_INTERVAL_MS)).await;
    }
    probes
}

async fn balances(db: &tokio_postgres::Client, accounts: &[String]) -> anyhow::Result<Vec<i64>> {
    let mut balances = Vec::new();
    for account in accounts {
        balances.push(queries::existing_balance(db, account).await?);
    }
    Ok(balances)
}

/// `503 UNKNOWN x10` style counts of the answers, in a stable order.
fn tally(answers: &[Answer]) -> String {
    let mut counts = std::collections::BTreeMap::new();
    for answer in answers {
        *counts
            .entry(format!("{} {}", answer.status, answer.outcome))
            .or_insert(0) += 1;
    }
    counts
        .iter()
        .map(|(what, n)| format!("{what} x{n}"))
        .collect::<Vec<_>>()
        .join(", ")
}
