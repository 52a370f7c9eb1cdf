//! One bound per request (`--request-timeout-ms`): every debit, grant, transfer and spot
//! event is answered within it, however many waits it queues behind.
//!
//! PostgreSQL's `lock_timeout` bounds each lock acquisition separately (PostgreSQL docs,
//! 20.11.2 "Statement Behavior": "the time limit applies separately to each lock
//! acquisition attempt"). A request queued behind another waiter on one row first waits
//! for the tuple lock that waiter holds, then, once it has it, for the holder's
//! transaction: it paid the bound twice (seen: 10.04–10.08 s against a 5 s bound). A
//! request may also wait for a pooled connection first. So the service bounds the whole
//! request itself, from its arrival:
//!
//! 1. the wait for a pooled connection is bounded by what is left of the request's time;
//! 2. the transaction runs in a task of its own; when the time runs out while it is still
//!    running, the service asks the server to cancel the running statement (the
//!    protocol's CancelRequest, PostgreSQL docs 55.2.8 "Canceling Requests in
//!    Progress"), again after [`CANCEL_INTERVAL_MS`], doubling up to
//!    [`CANCEL_INTERVAL_MAX_MS`], until the transaction has ended (a cancel that reaches
//!    the session between two statements is ignored by the server);
//! 3. the answer is what really happened: a statement cancelled before `COMMIT` rolls
//!    the transaction back (the server reports SQLSTATE 57014 `query_canceled`), and
//!    the client gets 503 `UNKNOWN` naming the bound, with nothing recorded; a
//!    transaction that committed before the cancel arrived is answered as committed; a
//!    cancel that reaches a COMMIT waiting for the synchronous standby ends that wait
//!    without rolling back, and the server's warning ends the session
//!    (`crate::session`), so the transaction ends with its connection closed and no
//!    SQLSTATE: 503 `UNKNOWN` (it committed on the primary and may be lost by a
//!    failover; a retry with the same key learns which);
//! 4. a transaction that has not ended [`CANCEL_GRACE_MS`] after the bound (its session
//!    does not answer: a stopped server process, a half-open connection) is answered 503
//!    `UNKNOWN` without its outcome, and goes on in its task until it ends on its own; a
//!    retry with the same key learns what happened.
//!
//! The bound counts from when the request has arrived whole (its head and body have
//! bounds of their own: a slow body is 408).
//!
//! A connection that was sent a cancel is closed, never handed back to the pool, so a
//! late cancel cannot reach another request's statement.
//!
//! Behind a transaction pooler (`--behind-transaction-pooler`) no cancel is sent: the
//! request is answered 503 `UNKNOWN` at its bound and its transaction goes on in its task
//! until it ends on its own, within the database's own `lock_timeout` and
//! `statement_timeout` (which that flag requires). The cancel would go through the
//! pooler's cancel forwarding, and PgBouncer 1.18 exits (`FATAL … disconnect_client():
//! bad client state: 0`, pgbouncer/pgbouncer#801, fixed by #846) when a cancel client
//! closes its socket before the forwarded cancel is done, which tokio-postgres's cancel
//! does (seen in R1 with four cancelled waits for the synchronous standby).
//!
//! A replay is answered only once the record it read is on the synchronous standby
//! ([`cover`]): the record may be one whose COMMIT's wait for the standby was cancelled,
//! visible on the primary and lost by a failover.
//!
//! Time held at an armed fault point (`delay`, `pause`, `close`; `super::faults`) is a
//! stall injected on purpose and does not count against the bound: the deadline moves by
//! the hold. Everything else does: the pool, every lock wait, every statement.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_postgres::{Object, Pool, PoolError, Timeouts};
use futures_util::future::BoxFuture;
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

/// Default bound of one request, milliseconds (`--request-timeout-ms`).
pub const DEFAULT_REQUEST_TIMEOUT_MS: u64 = 5_000;
/// First interval between two cancel requests for a request past its bound,
/// milliseconds; each next one doubles, up to [`CANCEL_INTERVAL_MAX_MS`].
pub const CANCEL_INTERVAL_MS: u64 = 20;
/// Longest interval between two cancel requests, milliseconds.
pub const CANCEL_INTERVAL_MAX_MS: u64 = 320;
/// How long past its bound a request waits for its cancelled transaction to end,
/// milliseconds; then it is answered 503 `UNKNOWN` without knowing the outcome (a
/// database session that does not answer at all), and the transaction ends on its own.
pub const CANCEL_GRACE_MS: u64 = 1_000;

tokio::task_local! {
    /// Fault holds of the request whose transaction runs in this task.
    static HELD: Arc<Holds>;
}

/// Fault holds of one request: their finished total and the start of one under way.
#[derive(Default)]
struct Holds {
    state: Mutex<(Duration, Option<Instant>)>,
}

impl Holds {
    /// How far the request's deadline has moved at `now`, and whether a hold is under way.
    fn extension(&self, now: Instant) -> (Duration, bool) {
        let (total, since) = *self.state.lock().unwrap_or_else(|p| p.into_inner());
        let running = since.map(|since| now.duration_since(since));
        (total + running.unwrap_or_default(), running.is_some())
    }
}

/// A fault hold under way; dropped when it ends, which adds its length to the request's
/// holds. Outside a bounded request (a library call, a test) it does nothing.
pub struct HoldGuard {
    holds: Option<(Arc<Holds>, Instant)>,
}

/// Marks the start of a fault hold of the request running in this task.
pub fn hold_started() -> HoldGuard {
    let now = Instant::now();
    let holds = HELD.try_with(Arc::clone).ok();
    if let Some(holds) = &holds {
        holds.state.lock().unwrap_or_else(|p| p.into_inner()).1 = Some(now);
    }
    HoldGuard {
        holds: holds.map(|holds| (holds, now)),
    }
}

impl Drop for HoldGuard {
    fn drop(&mut self) {
        if let Some((holds, started)) = &self.holds {
            let mut state = holds.state.lock().unwrap_or_else(|p| p.into_inner());
            *state = (state.0 + started.elapsed(), None);
        }
    }
}

/// Why a bounded request did not run, or was not answered by its transaction.
#[derive(Debug)]
pub enum NotRun {
    /// No pooled connection within the bound: nothing ran.
    NoConnectionInTime,
    /// The pool could not make a connection (the database is down): nothing ran.
    NoConnection(String),
    /// The bound ran out, and the cancelled transaction had not ended
    /// [`CANCEL_GRACE_MS`] later (its session does not answer): the outcome is unknown.
    Unanswered,
}

/// What a bounded request's work returned, and whether the bound ran out while it ran
/// (then at least one cancel was sent: an error the server reported means it was rolled
/// back, a closed connection that its outcome is unknown; [`settle`]).
#[derive(Debug)]
pub struct Ran<T> {
    /// The work's own result.
    pub output: T,
    /// The bound ran out while the work ran.
    pub bound_ran_out: bool,
}

/// Where a bounded transaction is: the waiter and the task that runs it agree on it under
/// a lock, so a cancel is only ever sent to a connection that will not be pooled again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Running,
    Cancelling,
    Done,
}

/// Where a bounded request runs: the service's pool and task tracker, and whether a
/// request past its bound has its statement cancelled (not behind a transaction pooler;
/// see the module docs).
#[derive(Clone, Copy)]
pub struct Runner<'a> {
    /// The database pool.
    pub pool: &'a Pool,
    /// The tracker the transaction's task joins (shutdown waits for it).
    pub tasks: &'a TaskTracker,
    /// Send CancelRequest once the bound ran out.
    pub cancels_at_bound: bool,
    /// [Cover](cover) every replay (off only with the planted bug
    /// `trust-cancelled-commit`, `super::planted`).
    pub covers_replays: bool,
}

/// A result that may have been read back from what an earlier request recorded (a
/// replay, `Idempotent-Replayed: true`) instead of executed now.
pub trait Replayed {
    /// Whether this result is a replay.
    fn replayed(&self) -> bool;
}

macro_rules! replayed_field {
    ($($result:ty),*) => {$(
        impl Replayed for $result {
            fn replayed(&self) -> bool {
                self.replayed
            }
        }
    )*};
}

replayed_field!(
    points_ledger::TransferResult,
    frozen_balances::PlaceResult,
    frozen_balances::CancelResult,
    frozen_balances::FillResult,
    frozen_balances::DepositResult
);

/// The statement of a replay's cover ([`cover`]): its own implicit transaction, whose one
/// write is a transactional logical-decoding message (`pg_logical_emit_message`,
/// PostgreSQL docs, "Replication Management Functions"; any role may call it, and
/// it needs no `wal_level = logical`).
pub const COVER_SQL: &str = "SELECT pg_logical_emit_message(true, 'ledger-svc', 'replay cover')";

/// Covers a replay: commits a transaction that writes WAL, after the replay read its
/// record. PostgreSQL waits for the synchronous standby only at the COMMIT of a
/// transaction that has a transaction id and wrote WAL (`RecordTransactionCommit`,
/// src/backend/access/transam/xact.c), so the replay's own read, which writes nothing,
/// waits for nothing; the cover's transactional message takes an id and writes one
/// record, so its COMMIT waits until the standby has WAL up to the cover's commit record,
/// which lies after the commit of every transaction the replay saw committed, the record
/// included. Under `synchronous_commit = off` or without a synchronous standby it waits
/// for nothing, as every commit then does. A cancel of its wait ends the session
/// (`crate::session`): the replay is answered 503 `UNKNOWN`. One round trip (the simple
/// query protocol: unnamed, through a transaction pooler too).
///
/// Errors: the statement's, or a closed connection.
pub async fn cover(client: &tokio_postgres::Client) -> Result<(), tokio_postgres::Error> {
    client.batch_execute(COVER_SQL).await
}

/// Runs `work` on a pooled connection of `pool` in a task of `tasks`, answered within
/// `bound` from now (plus the time held at fault points): see the module docs. A replay
/// (`R::replayed`) is [covered](cover) on the same connection before it is answered;
/// a cover that failed turns it into the cover's error.
///
/// Errors: [`NotRun`] when no connection could be had in time (then `work` never ran), or
/// when the cancelled transaction did not end within [`CANCEL_GRACE_MS`] (then it goes on
/// in its task and ends on its own).
pub async fn run<R, E, W>(
    runner: Runner<'_>,
    bound: Duration,
    work: W,
) -> Result<Ran<Result<R, E>>, NotRun>
where
    R: Replayed + Send + 'static,
    E: From<tokio_postgres::Error> + Send + 'static,
    W: for<'c> FnOnce(&'c mut tokio_postgres::Client) -> BoxFuture<'c, Result<R, E>>
        + Send
        + 'static,
{
    let deadline = Instant::now() + bound;
    let client = connection(runner.pool, deadline).await?;
    let cancel = runner.cancels_at_bound.then(|| client.cancel_token());
    let holds = Arc::new(Holds::default());
    let phase = Arc::new(Mutex::new(Phase::Running));
    let answered = spawn_work(runner, client, holds.clone(), phase.clone(), work);
    watch(answered, &holds, &phase, cancel.as_ref(), deadline).await
}

/// Runs `work` on `client` in a task of `runner`'s tracker with `holds` as its fault-hold
/// record, then covers a replay (when `runner` says so); a
/// connection whose transaction was being cancelled ([`Phase::Cancelling`]) when the work
/// ended is never pooled again. The receiver gets the work's output.
fn spawn_work<R, E, W>(
    runner: Runner<'_>,
    client: Object,
    holds: Arc<Holds>,
    phase: Arc<Mutex<Phase>>,
    work: W,
) -> tokio::sync::oneshot::Receiver<Result<R, E>>
where
    R: Replayed + Send + 'static,
    E: From<tokio_postgres::Error> + Send + 'static,
    W: for<'c> FnOnce(&'c mut tokio_postgres::Client) -> BoxFuture<'c, Result<R, E>>
        + Send
        + 'static,
{
    let (answer, answered) = tokio::sync::oneshot::channel();
    let covers_replays = runner.covers_replays;
    runner.tasks.spawn(HELD.scope(holds, async move {
        let mut client = client;
        let mut output = work(&mut client).await;
        if output.as_ref().is_ok_and(Replayed::replayed)
            && covers_replays
            && let Err(error) = cover(&client).await
        {
            eprintln!("ledger-svc: a replay's cover failed, answering without it: {error}");
            output = Err(E::from(error));
        }
        let cancelled = {
            let mut phase = phase.lock().unwrap_or_else(|p| p.into_inner());
            std::mem::replace(&mut *phase, Phase::Done) == Phase::Cancelling
        };
        if cancelled {
            // A cancel may still be on its way to this session: never pool it again.
            drop(Object::take(client));
        }
        let _ = answer.send(output);
    }));
    answered
}

/// Waits for the work's answer until `deadline` (moved on by the time held at fault
/// points), then cancels its statement with back-off (every [`CANCEL_INTERVAL_MS`],
/// doubling to [`CANCEL_INTERVAL_MAX_MS`]) and gives up [`CANCEL_GRACE_MS`] past the
/// deadline ([`NotRun::Unanswered`]). Without a `cancel` token (behind a transaction
/// pooler) it gives up at the deadline itself and cancels nothing.
async fn watch<T>(
    mut answered: tokio::sync::oneshot::Receiver<T>,
    holds: &Holds,
    phase: &Mutex<Phase>,
    cancel: Option<&tokio_postgres::CancelToken>,
    deadline: Instant,
) -> Result<Ran<T>, NotRun> {
    let mut wake = deadline;
    let mut interval = Duration::from_millis(CANCEL_INTERVAL_MS);
    let mut cancels = 0_u32;
    loop {
        tokio::select! {
            biased;
            output = &mut answered => {
                let Ok(output) = output else {
                    return Err(NotRun::NoConnection("the transaction's task ended".into()));
                };
                return Ok(Ran { output, bound_ran_out: cancels > 0 });
            }
            () = tokio::time::sleep_until(wake) => {
                let now = Instant::now();
                let (moved, holding) = holds.extension(now);
                let due = deadline + moved;
                if holding || now < due {
                    wake = if holding { now + interval } else { due };
                    continue;
                }
                let Some(cancel) = cancel else {
                    eprintln!(
                        "ledger-svc: request bound ran out behind a transaction pooler (no \
                         cancel is sent); answering without its outcome"
                    );
                    return Err(NotRun::Unanswered);
                };
                if now >= due + Duration::from_millis(CANCEL_GRACE_MS) {
                    eprintln!(
                        "ledger-svc: request bound ran out and its transaction did not end \
                         after {cancels} cancel request(s); answering without its outcome"
                    );
                    return Err(NotRun::Unanswered);
                }
                {
                    let mut phase = phase.lock().unwrap_or_else(|p| p.into_inner());
                    if *phase == Phase::Done {
                        wake = now + interval;
                        continue;
                    }
                    *phase = Phase::Cancelling;
                }
                cancels += 1;
                if let Err(error) = cancel.cancel_query(tokio_postgres::NoTls).await {
                    eprintln!("ledger-svc: cancel request failed: {error}");
                }
                wake = Instant::now() + interval;
                interval = (interval * 2).min(Duration::from_millis(CANCEL_INTERVAL_MAX_MS));
            }
        }
    }
}

/// A pooled connection before `deadline`: the pool's wait, a new connection and the
/// pool's check of an idle one (`verify_idle` in `main.rs`, which deadpool runs outside
/// its own recycle timeout) all within the time left; none once the deadline has passed.
async fn connection(pool: &Pool, deadline: Instant) -> Result<Object, NotRun> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(NotRun::NoConnectionInTime);
    }
    let configured = pool.timeouts();
    let within = |bound: Option<Duration>| Some(bound.map_or(left, |bound| bound.min(left)));
    let timeouts = Timeouts {
        wait: Some(left),
        create: within(configured.create),
        recycle: within(configured.recycle),
    };
    let got = tokio::time::timeout_at(deadline, pool.timeout_get(&timeouts)).await;
    match got {
        Ok(Ok(client)) if Instant::now() < deadline => Ok(client),
        Ok(Ok(_)) | Ok(Err(PoolError::Timeout(_))) | Err(_) => Err(NotRun::NoConnectionInTime),
        Ok(Err(error)) => Err(NotRun::NoConnection(error.to_string())),
    }
}

/// Why a bounded request failed: its work's own error, the bound, or no connection.
#[derive(Debug)]
pub enum Failure<E> {
    /// The work ran and failed (rolled back unless the error says otherwise: an error
    /// without an SQLSTATE is a lost connection, and a COMMIT it cut short may have
    /// committed).
    Failed(E),
    /// The bound ran out: no connection in time, or the server reported the running
    /// statement failed (the cancel's SQLSTATE 57014 or another), so the transaction was
    /// rolled back. Nothing was recorded.
    RanOut,
    /// No connection could be made: nothing ran.
    NoConnection(String),
    /// The outcome is unknown: the bound ran out and the transaction did not end after
    /// its cancel, or it ended with its connection closed (a COMMIT whose wait for the
    /// synchronous standby was cancelled: `crate::session`). It may or may not take
    /// effect; a retry with the same key learns which.
    Unknown,
}

/// What [`settle`] must know of a work's error.
pub trait WorkError: std::fmt::Display {
    /// The error stands on its own even once the bound ran out (a fault that closed the
    /// connection on purpose).
    fn stands_alone(&self) -> bool;
    /// The SQLSTATE the server reported, `None` when the error did not come from the
    /// server (a closed connection: then a COMMIT under way may have committed).
    fn server_sqlstate(&self) -> Option<&str>;
}

impl WorkError for points_ledger::LedgerError {
    fn stands_alone(&self) -> bool {
        matches!(self, points_ledger::LedgerError::HookAborted(_))
    }
    fn server_sqlstate(&self) -> Option<&str> {
        self.sqlstate()
    }
}

impl WorkError for frozen_balances::FrozenError {
    fn stands_alone(&self) -> bool {
        matches!(self, frozen_balances::FrozenError::HookAborted(_))
    }
    fn server_sqlstate(&self) -> Option<&str> {
        self.sqlstate()
    }
}

/// The result of a bounded transaction: its own result; once the bound ran out, an error
/// the server reported (the cancel's 57014, or whatever the cancelled statement
/// reported: the transaction was rolled back) is [`Failure::RanOut`], and any other
/// error is [`Failure::Unknown`] (the connection closed: the cancel may have reached a
/// COMMIT waiting for the synchronous standby, which then committed locally and warned,
/// `crate::session`), unless the error stands on its own ([`WorkError::stands_alone`]);
/// and the pool's failures.
pub fn settle<T, E: WorkError>(ran: Result<Ran<Result<T, E>>, NotRun>) -> Result<T, Failure<E>> {
    match ran {
        Ok(Ran {
            output: Err(error),
            bound_ran_out: true,
        }) if !error.stands_alone() => {
            if error.server_sqlstate().is_some() {
                eprintln!("ledger-svc: rolled back when the request bound ran out: {error}");
                Err(Failure::RanOut)
            } else {
                eprintln!(
                    "ledger-svc: the request bound ran out and the transaction ended without \
                     its outcome: {error}"
                );
                Err(Failure::Unknown)
            }
        }
        Ok(Ran { output, .. }) => output.map_err(Failure::Failed),
        Err(NotRun::NoConnectionInTime) => Err(Failure::RanOut),
        Err(NotRun::NoConnection(error)) => Err(Failure::NoConnection(error)),
        Err(NotRun::Unanswered) => Err(Failure::Unknown),
    }
}
