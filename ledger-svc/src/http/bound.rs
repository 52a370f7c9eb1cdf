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
//! 2. when the time runs out while the transaction is still running, the service asks the
//!    server to cancel the running statement (the protocol's CancelRequest, PostgreSQL
//!    docs 55.2.8 "Canceling Requests in Progress"), again every
//!    [`CANCEL_INTERVAL_MS`] until the transaction has ended (a cancel that reaches the
//!    session between two statements is ignored by the server);
//! 3. the answer is what really happened: a statement cancelled before `COMMIT` took
//!    effect rolls the transaction back (SQLSTATE 57014 `query_canceled`), and the
//!    client gets 503 `UNKNOWN` naming the bound, with nothing recorded; a transaction
//!    that committed before the cancel arrived is answered as committed.
//!
//! A connection that was sent a cancel is closed, never handed back to the pool, so a
//! late cancel cannot reach another request's statement.
//!
//! Time held at an armed fault point (`delay`, `pause`, `close`; `super::faults`) is a
//! stall injected on purpose and does not count against the bound: the deadline moves by
//! the hold. Everything else does: the pool, every lock wait, every statement.

use std::cell::Cell;
use std::time::Duration;

use deadpool_postgres::{Object, Pool, PoolError, Timeouts};
use futures_util::future::BoxFuture;
use tokio::time::Instant;

/// Default bound of one request, milliseconds (`--request-timeout-ms`).
pub const DEFAULT_REQUEST_TIMEOUT_MS: u64 = 5_000;
/// Interval between two cancel requests for one request past its bound, milliseconds.
pub const CANCEL_INTERVAL_MS: u64 = 20;

tokio::task_local! {
    /// Fault holds of the request running in this task.
    static HELD: Holds;
}

/// Fault holds of one request: their finished total and the start of one under way.
struct Holds {
    total: Cell<Duration>,
    since: Cell<Option<Instant>>,
}

impl Holds {
    /// How far the request's deadline has moved at `now`, and whether a hold is under way.
    fn extension(&self, now: Instant) -> (Duration, bool) {
        let running = self.since.get().map(|since| now.duration_since(since));
        (
            self.total.get() + running.unwrap_or_default(),
            running.is_some(),
        )
    }
}

/// A fault hold under way; dropped when it ends, which adds its length to the request's
/// holds. Outside a bounded request (a library call, a test) it does nothing.
pub struct HoldGuard {
    started: Option<Instant>,
}

/// Marks the start of a fault hold of the request running in this task.
pub fn hold_started() -> HoldGuard {
    let now = Instant::now();
    let started = HELD.try_with(|holds| holds.since.set(Some(now))).ok();
    HoldGuard {
        started: started.map(|()| now),
    }
}

impl Drop for HoldGuard {
    fn drop(&mut self) {
        if let Some(started) = self.started {
            let _ = HELD.try_with(|holds| {
                holds.total.set(holds.total.get() + started.elapsed());
                holds.since.set(None);
            });
        }
    }
}

/// Why a bounded request did not run.
#[derive(Debug)]
pub enum NotRun {
    /// No pooled connection within the time left: nothing ran.
    NoConnectionInTime,
    /// The pool could not make a connection (the database is down): nothing ran.
    NoConnection(String),
}

/// What a bounded request's work returned, and whether the bound ran out while it ran
/// (then at least one cancel was sent: an error of the work means it was rolled back).
#[derive(Debug)]
pub struct Ran<T> {
    /// The work's own result.
    pub output: T,
    /// The bound ran out while the work ran.
    pub bound_ran_out: bool,
}

/// Runs `work` on a pooled connection of `pool`, answered by `deadline` (plus the time
/// held at fault points): see the module docs.
///
/// Errors: [`NotRun`] when no connection could be had in time; then `work` never ran.
pub async fn run<T, W>(pool: &Pool, deadline: Instant, work: W) -> Result<Ran<T>, NotRun>
where
    W: for<'c> FnOnce(&'c mut tokio_postgres::Client) -> BoxFuture<'c, T>,
{
    let holds = Holds {
        total: Cell::new(Duration::ZERO),
        since: Cell::new(None),
    };
    HELD.scope(holds, run_within(pool, deadline, work)).await
}

async fn run_within<T, W>(pool: &Pool, deadline: Instant, work: W) -> Result<Ran<T>, NotRun>
where
    W: for<'c> FnOnce(&'c mut tokio_postgres::Client) -> BoxFuture<'c, T>,
{
    let mut client = connection(pool, deadline).await?;
    let cancel = client.cancel_token();
    let mut cancels = 0_u32;
    let output = {
        let mut work = std::pin::pin!(work(&mut client));
        let mut wake = deadline;
        loop {
            tokio::select! {
                biased;
                output = &mut work => break output,
                () = tokio::time::sleep_until(wake) => {
                    let now = Instant::now();
                    let (moved, holding) = HELD.with(|holds| holds.extension(now));
                    let interval = Duration::from_millis(CANCEL_INTERVAL_MS);
                    if holding {
                        wake = now + interval;
                    } else if now < deadline + moved {
                        wake = deadline + moved;
                    } else {
                        cancels += 1;
                        if let Err(error) = cancel.cancel_query(tokio_postgres::NoTls).await {
                            eprintln!("ledger-svc: cancel request failed: {error}");
                        }
                        wake = Instant::now() + interval;
                    }
                }
            }
        }
    };
    if cancels > 0 {
        eprintln!(
            "ledger-svc: request bound ran out; {cancels} cancel request(s) sent, connection \
             closed"
        );
        drop(Object::take(client));
    }
    Ok(Ran {
        output,
        bound_ran_out: cancels > 0,
    })
}

/// A pooled connection within the time left before `deadline`.
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
    match pool.timeout_get(&timeouts).await {
        Ok(client) => Ok(client),
        Err(PoolError::Timeout(_)) => Err(NotRun::NoConnectionInTime),
        Err(error) => Err(NotRun::NoConnection(error.to_string())),
    }
}

/// Why a bounded request failed: its work's own error, the bound, or no connection.
#[derive(Debug)]
pub enum Failure<E> {
    /// The work ran and failed (rolled back unless the error says otherwise).
    Failed(E),
    /// The bound ran out: no connection in time, or the running transaction was
    /// cancelled and rolled back. Nothing was recorded.
    RanOut,
    /// No connection could be made: nothing ran.
    NoConnection(String),
}

/// The result of a bounded transaction: its own result; [`Failure::RanOut`] for any error
/// once the bound ran out (the cancel's 57014, or whatever the cancelled statement
/// reported) unless `as_is` says the error stands on its own (a fault that closed the
/// connection); and the pool's failures.
pub fn settle<T, E: std::fmt::Display>(
    ran: Result<Ran<Result<T, E>>, NotRun>,
    as_is: impl Fn(&E) -> bool,
) -> Result<T, Failure<E>> {
    match ran {
        Ok(Ran {
            output: Err(error),
            bound_ran_out: true,
        }) if !as_is(&error) => {
            eprintln!("ledger-svc: rolled back when the request bound ran out: {error}");
            Err(Failure::RanOut)
        }
        Ok(Ran { output, .. }) => output.map_err(Failure::Failed),
        Err(NotRun::NoConnectionInTime) => Err(Failure::RanOut),
        Err(NotRun::NoConnection(error)) => Err(Failure::NoConnection(error)),
    }
}
