//! R2 — failover with a synchronous standby that stopped acknowledging: every acknowledged
//! debit survives, no commit the standby lacks is acknowledged, unknown ones resolve once.
//!
//! Claim: `ledger-svc` (the run's transfer mode, a multi-host URL with
//! `target_session_attrs=read-write`) in front of a primary whose synchronous standby's
//! WAL receiver is stopped (SIGSTOP) answers a debit 201 only once the standby has it:
//!
//! - debits whose request bound runs out while their COMMIT waits for the standby are
//!   answered 503 `UNKNOWN`, although the bound's cancel let them commit on the primary
//!   (the server's `WARNING: canceling wait for synchronous replication`); the same for
//!   a batch (the batch mode, whatever the run's mode) and for waits a DBA cancels
//!   (`pg_cancel_backend`);
//! - a same-key retry of those while the standby is still stopped finds their records
//!   and is not answered 201 (its replay's cover waits for the standby too);
//! - debits whose COMMIT is seen waiting (`pg_stat_activity.wait_event = 'SyncRep'`) when
//!   the primary is killed are answered 503 `UNKNOWN`, none 201;
//! - after the standby's promotion each of those resolves exactly once on its same-key
//!   retry (executed anew: the standby never had it), every debit ever acknowledged is
//!   on the new primary with the transaction id it was acknowledged with, no transaction
//!   id is acknowledged to two keys, balances are their start less the acknowledged
//!   debits, and the ledger reconciles;
//! - the batch mode's own unknowns: a batch-wide database error (`lock_timeout` behind a
//!   holder's row lock) answers every debit of the batch 503 `UNKNOWN` and executes none;
//!   a service killed (SIGKILL) after its batch's COMMIT and before its answers answered
//!   none, and every retry replays;
//! - negative controls ([`crate::lost_acknowledged`]): the service's earlier rule
//!   (COMMIT's success trusted after the warning) and an asynchronous standby each lose
//!   every debit of the group they acknowledged, named.
//!
//! Nothing depends on timing: the standby never acknowledges while its receiver is
//! stopped, so every wait lasts until the bound, the cancel or the kill ends it; each
//! wait is seen in `pg_stat_activity` before the cancel or kill; the standby is killed
//! with the primary and restarted before its promotion, so it holds exactly what its
//! receiver wrote to disk before the stop.
//!
//! Fails if: any answer differs from the counts above (a 201 while the standby is
//! stopped above all), a debit answered 503 did not commit on the primary where its wait
//! was cancelled (then the case did not force what it claims), an acknowledged debit is
//! missing, doubled or carries another transaction id on the new primary, a transaction
//! id is acknowledged to two keys, a balance or the reconciliation is off, or a control
//! loses fewer than all its acknowledged debits.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use futures_util::FutureExt;
use launch::service::{Service, ServiceOptions};
use points_ledger::striping::redeem_account_for;
use points_ledger::{HookPoint, TransferMode, grant_in, reconcile, test_account};
use scratch_pg::{Cluster, Replication};

use crate::debit_groups::{self, Answer, CLIENT, GROUP_SIZE, keys, tally};
use crate::lost_acknowledged::{self, Fault};
use crate::pair::{self, LEDGER_DATABASE};
use crate::syncrep;
use case_kit::{Case, Ctx};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "R2",
        "synchronous failover with the standby stopped: no debit acknowledged before the standby has it",
        |ctx| run(ctx).boxed(),
    )
}

/// Pooled connections of each service: one debit of a group each.
const POOL_SIZE: usize = GROUP_SIZE;
/// Redemption stripes of every service: the group's eight accounts credit eight
/// different stripes (checked at launch), so no debit's COMMIT waits on a row lock
/// another COMMIT holds while it waits for the standby, and all eight wait in `SyncRep`
/// at once. Every service stripes alike, so a retry through another one carries the
/// same fingerprint. (In the batch mode one drainer takes every lane: the group is one
/// batch.)
const REDEEM_STRIPES: u32 = 64;
const START_BALANCE: i64 = 1_000;

/// A service's bounds (`--request-timeout-ms`, `--statement-timeout-ms`,
/// `--lock-timeout-ms`), milliseconds.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    request_ms: u64,
    statement_ms: u64,
    lock_ms: u64,
}

impl Bounds {
    /// Hang bounds only, far above anything the case waits for but a stopped standby.
    pub const LONG: Bounds = Bounds {
        request_ms: 60_000,
        statement_ms: 60_000,
        lock_ms: 60_000,
    };
    /// A request bound the stopped standby outlasts, and a `statement_timeout` below it
    /// (it passes first, and does not end a COMMIT's wait: PostgreSQL disables the
    /// statement timer before the commit, src/backend/tcop/postgres.c). A group's debits
    /// reach `SyncRep` within milliseconds of their arrival; the bound is seconds so that
    /// a loaded machine still sees all of them waiting before it runs out (it decides no
    /// claim: a wait cut earlier would still be answered 503).
    const SHORT: Bounds = Bounds {
        request_ms: 4_000,
        statement_ms: 1_000,
        lock_ms: 60_000,
    };
    /// [`Bounds::SHORT`] with a `lock_timeout` that a holder's row lock outlasts: the
    /// batch-wide database error.
    const SHORT_LOCK: Bounds = Bounds {
        lock_ms: 500,
        ..Bounds::SHORT
    };
}

/// `ledger-svc` on `url` in `mode` with [`POOL_SIZE`] connections, fault injection (the
/// batch mode's queue hold, the `after-commit` pause), `bounds`, and with `planted` the
/// planted bug `trust-cancelled-commit`; its log is `<case>-<name>.log`.
///
/// Errors: it did not start.
pub async fn launch_service(
    ctx: &Ctx,
    url: &str,
    name: &str,
    mode: TransferMode,
    bounds: Bounds,
    planted: bool,
) -> anyhow::Result<Service> {
    let mut options = ServiceOptions::default().with_clients(&[CLIENT]);
    options.pool_size = POOL_SIZE;
    options.fault_injection = true;
    let mut args = vec!["--transfer-mode".to_owned(), mode.as_str().to_owned()];
    for (flag, ms) in [
        ("--request-timeout-ms", bounds.request_ms),
        ("--statement-timeout-ms", bounds.statement_ms),
        ("--lock-timeout-ms", bounds.lock_ms),
    ] {
        args.extend([flag.to_owned(), ms.to_string()]);
    }
    if planted {
        args.extend(["--planted-bug".to_owned(), "trust-cancelled-commit".to_owned()]);
    }
    let stripes: std::collections::BTreeSet<String> = (0..GROUP_SIZE)
        .map(|n| redeem_account_for(&debit_groups::account_of(n), REDEEM_STRIPES))
        .collect();
    anyhow::ensure!(stripes.len() == GROUP_SIZE, "the group's accounts share stripes: {stripes:?}");
    args.extend(["--redeem-stripes".to_owned(), REDEEM_STRIPES.to_string()]);
    if mode == TransferMode::Batch {
        args.extend(["--batch-drainers".to_owned(), "1".to_owned()]);
    }
    options.extra_args = args;
    Service::launch(url, ctx.log_file(name)?, options).await
}

/// Grants every account of a group its start balance on the primary.
///
/// Errors: SQL errors.
pub async fn grant_all(mode: TransferMode, primary: &Cluster) -> anyhow::Result<()> {
    let mut primary = primary.connect(LEDGER_DATABASE).await?;
    for n in 1..=GROUP_SIZE {
        let key = format!("g-r2-{n}");
        let account = test_account(n as u32);
        grant_in(mode, &mut primary, "ops", &key, &account, START_BALANCE).await?;
    }
    Ok(())
}

/// The services R2 sends through, all on the pair's multi-host URL.
struct Services {
    /// The run's mode, [`Bounds::LONG`]: the waits seen, cancelled and killed; retries.
    long: Arc<Service>,
    /// The run's mode, [`Bounds::SHORT`]: the bound runs out during the waits.
    short: Arc<Service>,
    /// The batch mode, [`Bounds::SHORT_LOCK`].
    batch: Arc<Service>,
}

/// What the clients were told, per key: every transaction id a 201 named for it (one,
/// unless an acknowledged debit was lost and its retry executed again), and the groups
/// answered without an outcome, to retry after the failover.
#[derive(Default)]
struct Book {
    acknowledged: BTreeMap<String, BTreeSet<Option<i64>>>,
    unknown: Vec<Vec<String>>,
}

impl Book {
    fn acknowledge(&mut self, keys: &[String], answers: &[Answer]) {
        for (key, answer) in keys.iter().zip(answers) {
            if answer.acknowledged() {
                self.acknowledged
                    .entry(key.clone())
                    .or_default()
                    .insert(answer.txn_id);
            }
        }
    }
}

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    schedule(ctx, false).await?;
    let mode = cases_ledger::modes::mode(ctx);
    lost_acknowledged::run(ctx, Fault::TrustedCancelledCommit, true, mode).await?;
    lost_acknowledged::run(ctx, Fault::AsynchronousStandby, true, mode).await
}

/// R2's schedule and checks, without the controls; with `earlier_rule` every service runs
/// with the planted bug `trust-cancelled-commit` (the controls test: the claims fail).
///
/// Errors: a node or service did not start; SQL errors; a state not seen in time.
pub async fn schedule(ctx: &mut Ctx, earlier_rule: bool) -> anyhow::Result<()> {
    let mode = cases_ledger::modes::mode(ctx);
    let pair = pair::start_pair(ctx, Replication::Synchronous).await?;
    grant_all(mode, &pair.primary).await?;
    let url = pair::multi_host_url(&[&pair.primary, &pair.standby]);
    let services = Services {
        long: Arc::new(launch_service(ctx, &url, "ledger-svc", mode, Bounds::LONG, earlier_rule).await?),
        short: Arc::new(launch_service(ctx, &url, "ledger-svc-short", mode, Bounds::SHORT, earlier_rule).await?),
        batch: Arc::new(
            launch_service(ctx, &url, "ledger-svc-batch", TransferMode::Batch, Bounds::SHORT_LOCK, earlier_rule)
                .await?,
        ),
    };
    let mut book = Book::default();
    let warm = keys("before");
    let answers = debit_groups::send(&services.long, mode, &warm).await?.await?;
    ctx.check_eq("before the stop: answers", "201 OK=8".to_owned(), tally(&answers));
    book.acknowledge(&warm, &answers);
    batch_wide_error(ctx, &pair.primary, &services.batch, &mut book).await?;
    killed_after_commit(ctx, &pair.primary, &url, &services.long, earlier_rule, &mut book).await?;
    syncrep::stop_receiver(&pair.standby).await?;
    ctx.note("the standby's WAL receiver stopped (SIGSTOP)");
    bound_runs_out(ctx, &pair.primary, &services.short, mode, "bound", &mut book).await?;
    bound_runs_out(ctx, &pair.primary, &services.batch, TransferMode::Batch, "batch-bound", &mut book)
        .await?;
    cancelled_by_dba(ctx, &pair.primary, &services.long, mode, &mut book).await?;
    let retried = debit_groups::send(&services.short, mode, &keys("bound")).await?.await?;
    book.acknowledge(&keys("bound"), &retried);
    ctx.check_eq(
        "same-key retries of the bound group while the standby is stopped: answers",
        "503 UNKNOWN=8".to_owned(),
        tally(&retried),
    );
    let promoted = killed_while_waiting(ctx, pair, &services.long, mode, &mut book).await?;
    after_failover(ctx, &promoted, &services.long, &mut book).await?;
    check_new_primary(ctx, &promoted, &book).await
}

/// Waits until a group's COMMITs are all seen waiting for the standby (`SyncRep`): one
/// session per debit, or in the batch mode the one session of the group's batch (the
/// group was queued whole before its release: one batch). Returns the debits whose
/// COMMIT was seen waiting: the sessions seen, times the debits each one commits.
///
/// Errors: SQL errors; not seen within the hang bound.
async fn debits_waiting(primary: &Cluster, mode: TransferMode) -> anyhow::Result<usize> {
    let per_session = if mode == TransferMode::Batch { GROUP_SIZE } else { 1 };
    let sessions = syncrep::waiting_on_standby(primary, GROUP_SIZE / per_session).await?;
    Ok(sessions * per_session)
}

/// The batch mode's batch-wide database error: a holder locks the first account's row,
/// a group goes as one batch, the batch waits on the lock until `lock_timeout` (SQLSTATE
/// 55P03) fails it whole. Every debit is answered 503 `UNKNOWN`, none executed.
///
/// Errors: SQL errors; the group was not seen queued.
async fn batch_wide_error(
    ctx: &mut Ctx,
    primary: &Cluster,
    batch: &Arc<Service>,
    book: &mut Book,
) -> anyhow::Result<()> {
    let mut holder = primary.connect(LEDGER_DATABASE).await?;
    let lock = holder.transaction().await?;
    lock.execute(
        "SELECT 1 FROM account WHERE account_id = $1 FOR UPDATE",
        &[&debit_groups::account_of(0)],
    )
    .await?;
    let group = keys("batch-error");
    let answers = debit_groups::send(batch, TransferMode::Batch, &group).await?.await?;
    lock.rollback().await?;
    ctx.check_eq(
        "batch-wide error (lock_timeout behind a holder): answers",
        "503 UNKNOWN=8".to_owned(),
        tally(&answers),
    );
    let executed = syncrep::committed_on(primary, CLIENT, &group).await?;
    ctx.check_eq("batch-wide error: debits executed", 0, executed);
    book.acknowledge(&group, &answers);
    book.unknown.push(group);
    Ok(())
}

/// The batch mode's service killed after its batch's COMMIT and before its answers: a
/// `pause` armed at `after-commit` for every debit of a group sent as one batch, the
/// SIGKILL once the whole group is on the primary and its answers are held. Nothing was
/// answered; every same-key retry (through `retry`) replays.
///
/// Errors: the service did not start or die; SQL errors; states not seen in time.
async fn killed_after_commit(
    ctx: &mut Ctx,
    primary: &Cluster,
    url: &str,
    retry: &Service,
    earlier_rule: bool,
    book: &mut Book,
) -> anyhow::Result<()> {
    let name = "ledger-svc-killed";
    let doomed = launch_service(ctx, url, name, TransferMode::Batch, Bounds::LONG, earlier_rule);
    let doomed = Arc::new(doomed.await?);
    let pause = serde_json::json!({"action": "pause", "hold_ms": syncrep::OBSERVE_LIMIT_MS, "count": GROUP_SIZE});
    doomed.arm_fault(HookPoint::AfterCommit, pause).await?;
    let group = keys("killed-after-commit");
    let sending = debit_groups::send(&doomed, TransferMode::Batch, &group).await?;
    let (watched, group_ref) = (&doomed, &group);
    let look = move || async move {
        let committed = syncrep::committed_on(primary, CLIENT, group_ref).await?;
        Ok((committed, watched.fault_state(HookPoint::AfterCommit).await?.holding))
    };
    let all_held = |&(committed, held): &(usize, u32)| committed == GROUP_SIZE && held == GROUP_SIZE as u32;
    let ((committed, held), _) = syncrep::seen_within(syncrep::OBSERVE_LIMIT_MS, look, all_held).await?;
    doomed.sigkill_now()?;
    let answers = sending.await?;
    if let Some(doomed) = Arc::into_inner(doomed) {
        doomed.kill()?;
    }
    ctx.check_eq(
        "killed after its batch's COMMIT: debits committed, answers held at after-commit",
        format!("{GROUP_SIZE} {GROUP_SIZE}"),
        format!("{committed} {held}"),
    );
    ctx.check_eq("killed after its batch's COMMIT: answers", "transport=8".to_owned(), tally(&answers));
    let retried = debit_groups::retry_until_acknowledged(retry, &group).await?;
    ctx.check_eq("killed after its batch's COMMIT: same-key retries", "201 OK replayed=8".to_owned(), tally(&retried));
    book.acknowledge(&group, &retried);
    Ok(())
}

/// A group through `service` (short bounds) while the standby is stopped: each debit's
/// COMMIT waits until the request bound runs out, and is answered 503 `UNKNOWN`. Then
/// every wait still on (the batch mode's, which the bound does not cancel) is cancelled,
/// and the whole group is seen committed on the primary all the same: the answer, not
/// the database, kept it from being acknowledged.
///
/// Errors: SQL errors; states not seen in time.
async fn bound_runs_out(
    ctx: &mut Ctx,
    primary: &Cluster,
    service: &Arc<Service>,
    mode: TransferMode,
    name: &str,
    book: &mut Book,
) -> anyhow::Result<()> {
    let group = keys(name);
    let sending = debit_groups::send(service, mode, &group).await?;
    let waiting = debits_waiting(primary, mode).await?;
    let answers = sending.await?;
    syncrep::cancel_waiting(primary).await?;
    ctx.check_eq(
        format!("{name}: debits whose COMMIT is seen waiting for the standby (SyncRep)"),
        GROUP_SIZE,
        waiting,
    );
    ctx.check_eq(format!("{name}: answers"), "503 UNKNOWN=8".to_owned(), tally(&answers));
    let committed = syncrep::committed_within(primary, CLIENT, &group).await?;
    ctx.check_eq(format!("{name}: committed on the primary all the same"), GROUP_SIZE, committed);
    book.acknowledge(&group, &answers);
    book.unknown.push(group);
    Ok(())
}

/// A group through the service with long bounds while the standby is stopped: its
/// COMMITs are seen waiting, a DBA cancels every wait (`pg_cancel_backend`), each COMMIT
/// then commits on the primary with the server's warning, and every debit is answered
/// 503 `UNKNOWN`.
///
/// Errors: SQL errors; states not seen in time.
async fn cancelled_by_dba(
    ctx: &mut Ctx,
    primary: &Cluster,
    service: &Arc<Service>,
    mode: TransferMode,
    book: &mut Book,
) -> anyhow::Result<()> {
    let group = keys("cancelled");
    let sending = debit_groups::send(service, mode, &group).await?;
    let waiting = debits_waiting(primary, mode).await?;
    let cancelled = syncrep::cancel_waiting(primary).await?;
    let answers = sending.await?;
    ctx.check_eq(
        "cancelled: debits whose COMMIT is seen waiting for the standby (SyncRep)",
        GROUP_SIZE,
        waiting,
    );
    ctx.check("cancelled: pg_cancel_backend signalled the waiting sessions", cancelled > 0, "");
    ctx.check_eq("cancelled: answers", "503 UNKNOWN=8".to_owned(), tally(&answers));
    let committed = syncrep::committed_within(primary, CLIENT, &group).await?;
    ctx.check_eq("cancelled: committed on the primary all the same", GROUP_SIZE, committed);
    book.acknowledge(&group, &answers);
    book.unknown.push(group);
    Ok(())
}

/// A group whose COMMITs are seen waiting for the stopped standby when the primary is
/// killed; then the failover ([`syncrep::fail_over`]). Every debit is answered 503
/// `UNKNOWN` (the session died under it). Returns the promoted node.
///
/// Errors: a node did not stop, start or promote; states not seen in time.
async fn killed_while_waiting(
    ctx: &mut Ctx,
    pair: pair::Pair,
    service: &Arc<Service>,
    mode: TransferMode,
    book: &mut Book,
) -> anyhow::Result<Cluster> {
    let group = keys("in-flight");
    let sending = debit_groups::send(service, mode, &group).await?;
    let waiting = debits_waiting(&pair.primary, mode).await?;
    let promoted = syncrep::fail_over(pair).await?;
    let answers = sending.await?;
    ctx.check_eq(
        "in flight at the kill: debits whose COMMIT is seen waiting for the standby (SyncRep)",
        GROUP_SIZE,
        waiting,
    );
    ctx.note("primary killed (kill -9), standby killed and started again, standby promoted");
    ctx.check_eq("in flight at the kill: answers", "503 UNKNOWN=8".to_owned(), tally(&answers));
    book.acknowledge(&group, &answers);
    book.unknown.push(group);
    Ok(promoted)
}

/// Every group answered without an outcome, retried with the same keys on the new
/// primary until acknowledged: each executes once, none replays (the standby never had
/// them).
///
/// Errors: a key not acknowledged in time, or answered other than 201/503.
async fn after_failover(
    ctx: &mut Ctx,
    promoted: &Cluster,
    service: &Service,
    book: &mut Book,
) -> anyhow::Result<()> {
    let mut answers = Vec::new();
    for group in std::mem::take(&mut book.unknown) {
        let retried = debit_groups::retry_until_acknowledged(service, &group).await?;
        book.acknowledge(&group, &retried);
        answers.extend(retried);
    }
    ctx.check_eq(
        "after the failover: same-key retries of every debit answered UNKNOWN",
        "201 OK=40".to_owned(),
        tally(&answers),
    );
    let _ = promoted;
    Ok(())
}

/// Debits acknowledged in all: 8 before the stop, 8 replayed after the kill after
/// COMMIT, the 40 answered `UNKNOWN` once retried after the failover.
const ACKNOWLEDGED: usize = 7 * GROUP_SIZE;

/// The checks on the new primary: every acknowledged debit there once, with the
/// transaction id it was acknowledged with; no transaction id acknowledged to two keys;
/// the balances; the reconciliation.
///
/// Errors: SQL errors.
async fn check_new_primary(ctx: &mut Ctx, promoted: &Cluster, book: &Book) -> anyhow::Result<()> {
    let mut db = promoted.connect(LEDGER_DATABASE).await?;
    let rows = db
        .query("SELECT idem_key, txn_id FROM ledger_txn WHERE client_id = $1", &[&CLIENT])
        .await?;
    let mut on_new: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for row in &rows {
        on_new.entry(row.get(0)).or_default().push(row.get(1));
    }
    ctx.check_eq("debits acknowledged in all", ACKNOWLEDGED, book.acknowledged.len());
    let astray: Vec<String> = book
        .acknowledged
        .iter()
        .filter(|(key, acknowledged)| {
            let on_new: BTreeSet<Option<i64>> =
                on_new.get(key.as_str()).into_iter().flatten().map(|id| Some(*id)).collect();
            on_new.len() != 1 || **acknowledged != on_new
        })
        .map(|(key, acknowledged)| {
            format!("{key} (acknowledged {acknowledged:?}, on the new primary {:?})", on_new.get(key.as_str()))
        })
        .collect();
    ctx.check(
        "acknowledged debits missing, doubled or under another transaction id on the new primary: none",
        astray.is_empty(),
        format!("n={} {}", astray.len(), astray.join("; ")),
    );
    let mut keys_of: BTreeMap<Option<i64>, BTreeSet<&String>> = BTreeMap::new();
    for (key, txn_ids) in &book.acknowledged {
        for txn_id in txn_ids {
            keys_of.entry(*txn_id).or_default().insert(key);
        }
    }
    let shared: Vec<String> = keys_of
        .iter()
        .filter(|(_, keys)| keys.len() > 1)
        .map(|(txn_id, keys)| format!("{txn_id:?}: {keys:?}"))
        .collect();
    ctx.check(
        "transaction ids acknowledged to two keys: none",
        shared.is_empty(),
        format!("n={} {}", shared.len(), shared.join("; ")),
    );
    let per_account = (ACKNOWLEDGED / GROUP_SIZE) as i64 * debit_groups::DEBIT;
    let accounts: Vec<String> = (0..GROUP_SIZE).map(debit_groups::account_of).collect();
    let wrong: i64 = db
        .query_one(
            "SELECT count(*) FROM account WHERE account_id = ANY($1) AND balance <> $2",
            &[&accounts, &(START_BALANCE - per_account)],
        )
        .await?
        .get(0);
    ctx.check_eq("accounts whose balance is not its start less its acknowledged debits", 0, wrong);
    let findings = reconcile(&mut db).await?;
    ctx.check("new primary reconciles clean", findings.is_clean(), findings.summary());
    Ok(())
}
