//! L18 — one stuck transaction does not stop the service.
//! Claim: while another session holds the redemption row's lock (a transaction stuck
//! before its COMMIT), every debit that needs that row is answered within the service's
//! one bound per request (`--request-timeout-ms`), also when it queues behind the other
//! waiters (PostgreSQL's `lock_timeout` counts each lock wait on its own, so a debit
//! queued behind another waiter used to pay it twice); it is rolled back and answered
//! 503 `UNKNOWN` (`request-timeout`) with `Retry-After`, and records nothing;
//! `/healthz` and `/readyz` answer 200 while the row is held and the debits wait; once
//! the holder commits, a retry with each same key executes exactly once (and a second
//! retry replays it). With `--redeem-stripes 8`, only the debits whose stripe is held
//! wait; the others answer 201 while the stripe is still held.
//! Setup: balance 100 on acct-0001 … acct-0010; ledger-svc with a request bound of
//! [`REQUEST_BOUND_MS`] (its lock and statement bounds left at their longer defaults, so
//! the request bound is the one that runs out) and a pool of 16; a session of the case
//! takes `SELECT … FOR UPDATE` on the row and keeps its transaction open until every
//! debit has been answered. Then 10 debits of 10, one per account, at once (fewer than
//! the pool); the case waits until every debit that needs the row is seen waiting for a
//! lock in `pg_stat_activity` at one moment (they queue behind each other), then probes.
//! Every time is the service's own (`duration_ms` of its request log), so a loaded
//! machine that delays the client cannot fail a check.
//! Negative control: a service whose bounds are longer than the client waits (60 s, the
//! old unbounded design): the debit behind the same stuck transaction gets no answer
//! within bound + slack (it cannot: the holder commits only after the client gave up);
//! after the holder commits it executes once, late.
//! Fails if: a 503 took less than the bound or more than bound + [`ANSWER_SLACK_MS`] on
//! the service's clock (the slack is less than the bound, so a second wait cannot pass),
//! a 503 is not the request bound's or lacks `Retry-After` or recorded anything, the
//! waiters are not seen queued, a probe is not 200, a debit on a stripe not held is not
//! 201, a retry executes twice or not at all, the service logged no line for a debit, or
//! reconciliation has findings.
//!
//! Rust, not a file: the holder keeps the row until every debit has been *answered*
//! (a file's steps end a hold when its waiters are seen waiting), the verdicts are the
//! service's own request-log durations per 503, health probes run while the row is
//! held, and the control's closed connection is watched in `/proc/net/tcp`: none of
//! these is a verb.

use super::modes::StatementsOnly;
use std::path::Path;
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use futures_util::future::join_all;
use points_ledger::striping::redeem_account_for;
use points_ledger::{SYS_REDEEM, test_account};
use reqwest::header::CONTENT_TYPE;

use super::queries;
use case_kit::{Case, Ctx};
use launch::service::{Service, ServiceOptions};

use super::http::{LedgerCalls, LedgerReply};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "L18",
        "one stuck transaction: debits answer 503 within the request bound, healthz stays up, retries execute once",
        |ctx| run_with(ctx, ControlPlan::FORCED).boxed(),
    )
    .connections(20)
    // Its claim is each debit's own lock wait; in the batch mode a batch waits as a whole
    // (LIMITS.md, "The batch transfer"), so it keeps the statement mode.
    .statements_only()
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
        "without a request bound, a debit behind the stuck transaction gets no answer within \
         {CONTROL_CLIENT_WAIT_MS} ms"
    )
}

/// The negative control's key and account.
const CONTROL_KEY: &str = "k-18-c";
const CONTROL_ACCOUNT: &str = "acct-0001";

/// The service's bound of one request in this case, milliseconds
/// (`--request-timeout-ms`). Its lock and statement bounds stay at the service's defaults
/// (5 s and 10 s), longer than this, so that the request bound is the one that runs out.
const REQUEST_BOUND_MS: u64 = 3_000;
/// Slack on top of the bound for the cancel, the rollback and the answer, milliseconds,
/// on the service's clock: less than the bound, so a debit that waited twice cannot pass.
const ANSWER_SLACK_MS: u64 = 2_000;
/// The negative control's client waits this long for an answer, milliseconds.
const CONTROL_CLIENT_WAIT_MS: u64 = REQUEST_BOUND_MS + ANSWER_SLACK_MS;
/// Longest wait for the debits to be seen queued on the held row, milliseconds (only
/// stops a hang; the debits' own bound ends their waits first if they never queue).
const QUEUE_LIMIT_MS: u64 = 60_000;
/// `/healthz` probes sent while the row is held and the debits wait.
const HEALTH_PROBES: usize = 3;
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
        "request bound {REQUEST_BOUND_MS} ms (--request-timeout-ms; lock and statement bounds \
         at their defaults), answer bound on the service's clock {} ms, pool {POOL_SIZE}",
        REQUEST_BOUND_MS + ANSWER_SLACK_MS
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

    check_service_log(ctx, &log_path, blocked.len(), plan);

    let mut client = ctx.connect().await?;
    let findings = points_ledger::reconcile(&mut client).await?;
    ctx.check(
        "reconciliation: no findings",
        findings.is_clean(),
        findings.summary(),
    );
    Ok(())
}

/// Reads the case's ledger-svc log (both modes' services and the control's append to it)
/// and checks one 503 request line per debit that waited (10 in the default mode,
/// `striped_blocked` in the striped one) and, when `plan` held the row, the control's
/// debit logged with `client_gone=true`. An unreadable log reads as empty.
fn check_service_log(ctx: &mut Ctx, log_path: &Path, striped_blocked: usize, plan: ControlPlan) {
    let log = std::fs::read_to_string(log_path).unwrap_or_default();
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
        ACCOUNTS as usize + striped_blocked,
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
    let service = start_unbounded(ctx).await?;
    ctx.note(format!(
        "control: a service with request, lock and statement bounds of {UNBOUNDED_MS} ms; \
         holder locks {SYS_REDEEM}: {}",
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
    let wait = Duration::from_millis(CONTROL_CLIENT_WAIT_MS);
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
    start_with(ctx, stripes, &[("--request-timeout-ms", REQUEST_BOUND_MS)]).await
}

/// The negative control's service: every bound longer than its client waits.
async fn start_unbounded(ctx: &Ctx) -> anyhow::Result<Service> {
    let bounds = [
        ("--request-timeout-ms", UNBOUNDED_MS),
        ("--lock-timeout-ms", UNBOUNDED_MS),
        ("--statement-timeout-ms", UNBOUNDED_MS),
    ];
    start_with(ctx, 0, &bounds).await
}

async fn start_with(ctx: &Ctx, stripes: u32, bounds: &[(&str, u64)]) -> anyhow::Result<Service> {
    let mut extra_args: Vec<String> = bounds
        .iter()
        .flat_map(|(flag, ms)| [flag.to_string(), ms.to_string()])
        .collect();
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
    /// The problem type's last part (`request-timeout`), empty for a 201.
    problem: String,
    retry_after: Option<String>,
}

/// What happened while the holder held the row.
struct Hold {
    answers: Vec<Answer>,
    /// Sessions seen waiting for a lock at one moment: at least the debits that need the
    /// row, or the most seen when they never all queued.
    queued: i64,
    /// Statuses of the `/healthz` probes, then of `/readyz`, sent once the debits queued.
    probes: Vec<u16>,
    ready: u16,
    /// The holder's transaction was still open once every debit had been answered.
    still_held: bool,
}

/// Holds `held` in a transaction of the case's own, sends one debit per account, waits
/// until the `waiters` debits that need the row are seen queued on a lock, probes
/// `/healthz` and `/readyz`, waits for every answer, and only then commits the holder.
async fn hold_and_debit(
    ctx: &Ctx,
    db: &tokio_postgres::Client,
    service: &Service,
    held: &str,
    keys: &[(String, String)],
    waiters: usize,
) -> anyhow::Result<Hold> {
    let holder = ctx.connect().await?;
    holder.batch_execute("BEGIN").await?;
    holder
        .query(
            "SELECT balance FROM account WHERE account_id = $1 FOR UPDATE",
            &[&held],
        )
        .await?;
    let debits = join_all(
        keys.iter()
            .map(|(account, key)| debit(service, account.clone(), key.clone())),
    );
    let observe = async {
        let limit = Duration::from_millis(QUEUE_LIMIT_MS);
        let queued = case_kit::locks::wait_for_lock_waiters(db, waiters as i64, limit).await?;
        let mut probes = Vec::new();
        for _ in 0..HEALTH_PROBES {
            let probe = service.send(service.http().get(service.public_url("/healthz")));
            probes.push(probe.await?.status);
        }
        let ready = service
            .send(service.http().get(service.public_url("/readyz")))
            .await?
            .status;
        Ok::<_, anyhow::Error>((queued, probes, ready))
    };
    let (answers, observed) = futures_util::join!(debits, observe);
    let answers: Vec<Answer> = answers.into_iter().collect::<anyhow::Result<_>>()?;
    let (queued, probes, ready) = observed?;
    let still_held: bool = holder
        .query_one("SELECT pg_current_xact_id_if_assigned() IS NOT NULL", &[])
        .await?
        .get(0);
    holder.batch_execute("COMMIT").await?;
    Ok(Hold {
        answers,
        queued,
        probes,
        ready,
        still_held,
    })
}

/// Holds `held` while one debit per account is sent (see [`hold_and_debit`]), checks
/// the answers, the probes, and that nothing was recorded for the 503s, then retries
/// every 503 with its key.
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
    let keys: Vec<(String, String)> = accounts
        .iter()
        .map(|account| (account.clone(), format!("k-18-{tag}-{account}")))
        .collect();
    let hold = hold_and_debit(ctx, db, service, held, &keys, blocked.len()).await?;
    let answers = &hold.answers;
    let (waited, prompt): (Vec<&Answer>, Vec<&Answer>) = answers
        .iter()
        .partition(|answer| blocked.contains(&answer.account));
    ctx.note(format!("{mode}: answers: {}", tally(answers)));
    check_hold(ctx, mode, held, &hold, &waited, &prompt);
    let waited_keys: Vec<&str> = waited.iter().map(|a| a.key.as_str()).collect();
    let durations = logged_durations(service.log_path(), &waited_keys).await?;
    check_service_clock(ctx, mode, &durations, waited.len());
    check_nothing_recorded(ctx, db, mode, &waited, accounts, blocked, &balances_before).await?;

    // The holder committed: each 503 retried with its same key executes once; a second
    // retry replays it; the 201s replay.
    let (executed, replayed) = retry_each(service, &waited, &prompt).await?;
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
    check_once_each(ctx, db, mode, answers, accounts, &balances_before).await
}

/// Checks that nothing was recorded for the 503 debits (`waited`: no transaction, no
/// request record) and that only the 201 debits were taken from the balances
/// (`balances_before`, one per account; the `blocked` accounts unchanged).
async fn check_nothing_recorded(
    ctx: &mut Ctx,
    db: &tokio_postgres::Client,
    mode: &str,
    waited: &[&Answer],
    accounts: &[String],
    blocked: &[String],
    balances_before: &[i64],
) -> anyhow::Result<()> {
    let mut recorded = 0;
    for answer in waited {
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
        .zip(balances_before)
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
    Ok(())
}

/// Retries each 503 (`waited`) twice with its key and each 201 (`prompt`) once. Returns
/// how many first retries of a 503 executed (201, not replayed) and how many further
/// retries replayed (the 503's retry's transaction, or the 201's).
async fn retry_each(
    service: &Service,
    waited: &[&Answer],
    prompt: &[&Answer],
) -> anyhow::Result<(usize, usize)> {
    let mut executed = 0;
    let mut replayed = 0;
    for answer in waited {
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
    for answer in prompt {
        let again = service
            .debit_once(CLIENT, &answer.key, &answer.account, DEBIT)
            .await?;
        if again.status == 201 && again.replayed {
            replayed += 1;
        }
    }
    Ok((executed, replayed))
}

/// Checks that each key of `answers` has exactly one transaction and every account was
/// debited exactly once since `balances_before`.
async fn check_once_each(
    ctx: &mut Ctx,
    db: &tokio_postgres::Client,
    mode: &str,
    answers: &[Answer],
    accounts: &[String],
    balances_before: &[i64],
) -> anyhow::Result<()> {
    let mut once = 0;
    for answer in answers {
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
            .zip(balances_before)
            .all(|(now, before)| *now == before - DEBIT),
        format!("{after:?}"),
    );
    Ok(())
}

/// A debit as the case's client sends it, with its answer's `Retry-After` header.
async fn debit(service: &Service, account: String, key: String) -> anyhow::Result<Answer> {
    let request = service
        .http()
        .post(service.public_url(&format!("/accounts/{account}/debits")))
        .header("x-client-id", CLIENT)
        .header("idempotency-key", &key)
        .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(format!("amount={DEBIT}"));
    let response = service.authorize(request).send().await?;
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let bytes = response.bytes().await?;
    let body: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
    let problem = body["type"].as_str().unwrap_or("");
    Ok(Answer {
        account,
        key,
        status,
        outcome: body["outcome"].as_str().unwrap_or("").to_owned(),
        problem: problem.rsplit(':').next().unwrap_or("").to_owned(),
        retry_after,
    })
}

/// The checks of what happened while the row was held: the answers of the debits that
/// needed it and of the others, the queue, the probes.
fn check_hold(
    ctx: &mut Ctx,
    mode: &str,
    held: &str,
    hold: &Hold,
    waited: &[&Answer],
    prompt: &[&Answer],
) {
    ctx.check(
        format!(
            "{mode}: the {} debits needing {held} were seen queued on a lock at one moment",
            waited.len()
        ),
        hold.queued >= waited.len() as i64,
        if hold.queued >= waited.len() as i64 {
            "all".to_string()
        } else {
            format!("at most {} of {}", hold.queued, waited.len())
        },
    );
    let count = |pass: &dyn Fn(&Answer) -> bool| waited.iter().filter(|a| pass(a)).count();
    ctx.check_eq(
        format!("{mode}: debits needing {held} answered 503 UNKNOWN request-timeout"),
        waited.len(),
        count(&|a| a.status == 503 && a.outcome == "UNKNOWN" && a.problem == "request-timeout"),
    );
    ctx.check_eq(
        format!("{mode}: each 503 carries Retry-After: 1"),
        waited.len(),
        count(&|a| a.retry_after.as_deref() == Some("1")),
    );
    ctx.check(
        format!("{mode}: the holder's transaction was still open once every debit was answered"),
        hold.still_held,
        hold.still_held,
    );
    if !prompt.is_empty() {
        ctx.check_eq(
            format!("{mode}: debits whose stripe is not held answered 201 while it was held"),
            prompt.len(),
            prompt.iter().filter(|a| a.status == 201).count(),
        );
    }
    ctx.check_eq(
        format!("{mode}: healthz probes while the row was held answered 200"),
        HEALTH_PROBES,
        hold.probes.iter().filter(|status| **status == 200).count(),
    );
    ctx.check_eq(
        format!("{mode}: readyz while the row was held (pool connections free)"),
        200,
        hold.ready,
    );
}

/// Checks, on the service's clock, that each 503 waited out the bound and was answered
/// within bound + slack (a second wait would take at least twice the bound).
fn check_service_clock(ctx: &mut Ctx, mode: &str, durations: &[u64], waited: usize) {
    let (lowest, highest) = (REQUEST_BOUND_MS, REQUEST_BOUND_MS + ANSWER_SLACK_MS);
    ctx.note(format!(
        "{mode}: service clock of the 503s: fastest_ms={} slowest_ms={}",
        durations.iter().min().copied().unwrap_or(0),
        durations.iter().max().copied().unwrap_or(0)
    ));
    ctx.check_eq(
        format!("{mode}: a request log line for each 503"),
        waited,
        durations.len(),
    );
    ctx.check_eq(
        format!(
            "{mode}: each 503 took from the bound ({lowest} ms) to bound + slack ({highest} ms) \
             on the service's clock"
        ),
        waited,
        durations
            .iter()
            .filter(|ms| (lowest..=highest).contains(*ms))
            .count(),
    );
}

/// `duration_ms` of the first request line of each of `keys` in the service's log. A
/// line is written as its response is handed over, so the log is read again until every
/// key has one; [`QUEUE_LIMIT_MS`] only stops a hang (then the keys found).
///
/// Errors: the log cannot be read.
async fn logged_durations(log: &Path, keys: &[&str]) -> anyhow::Result<Vec<u64>> {
    let mut found = Vec::new();
    let read = async {
        loop {
            let text = std::fs::read_to_string(log)?;
            found = keys
                .iter()
                .filter_map(|key| {
                    let line = text.lines().find(|line| {
                        line.contains("route=/accounts/{id}/debits")
                            && line.contains(&format!(" key={key} "))
                    })?;
                    line.split_whitespace()
                        .find_map(|field| field.strip_prefix("duration_ms="))
                        .and_then(|ms| ms.parse().ok())
                })
                .collect();
            if found.len() == keys.len() {
                return anyhow::Ok(());
            }
            tokio::time::sleep(Duration::from_millis(case_kit::locks::LOCK_POLL_MS)).await;
        }
    };
    // The limit only stops a hang; the check counts the lines found.
    if let Ok(read) = tokio::time::timeout(Duration::from_millis(QUEUE_LIMIT_MS), read).await {
        read?;
    }
    Ok(found)
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
