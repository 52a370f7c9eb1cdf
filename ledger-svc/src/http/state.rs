//! What every route of the service shares, whatever system it serves: the state of the
//! process ([`AppState`]: pool, tokens, faults, request log, bounds), the two listeners,
//! reading a bounded body, the bounded waits, and which database errors may pass.

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use futures_util::future::BoxFuture;
use http_body_util::{BodyExt, Limited};
use hyper::body::Bytes;
use hyper::body::Incoming;
use hyper::header::CONTENT_LENGTH;
use hyper::{Method, Request, StatusCode};
use points_ledger::{LedgerError, TransferMode};
use tokio::task::JoinError;
use tokio_util::task::TaskTracker;

use super::CloseConnection;
use super::auth::{Caller, TokenTable};
use super::bound;
use super::faults::FaultHooks;
use super::grammar::MAX_BODY_BYTES;
use super::problem::{ApiOutcome, HttpResponse, Problem};

/// Longest wait for a pooled database connection, milliseconds; then 503.
pub const POOL_WAIT_TIMEOUT_MS: u64 = 5_000;

/// A request body must arrive within this after its head, milliseconds; a slower one
/// gets 408 and nothing is recorded (the head has its own `HEADER_READ_TIMEOUT_MS`).
pub const BODY_READ_TIMEOUT_MS: u64 = 5_000;

/// Longest wait of `GET /readyz` for a pooled connection and its round trip,
/// milliseconds; then 503.
pub const READY_TIMEOUT_MS: u64 = 1_000;

/// SQLSTATEs (and classes: two characters) of a database failure that may pass, so the
/// answer is 503 with `Retry-After`: connection exceptions (08), transaction rollback
/// (40: serialization failure, deadlock), insufficient resources (53), operator
/// intervention (57: `statement_timeout`, server shutdown), lock_not_available (55P03:
/// `lock_timeout`), idle_in_transaction_session_timeout (25P03) and
/// read_only_sql_transaction (25006: a router that follows a failover manager, HAProxy
/// on Patroni's `/primary`, sends a session to the new leader while its promotion is
/// still under way, docs/failover.md; the write is refused, nothing recorded).
/// PostgreSQL docs, Appendix A. Every other SQLSTATE (a trigger's error, a violated
/// constraint) is 500.
const TRANSIENT_SQLSTATES: [&str; 7] = ["08", "40", "53", "57", "55P03", "25P03", "25006"];

/// What every handler shares.
pub struct AppState {
    /// The database pool (a connection seen closed is replaced; one idle for a second or
    /// more is verified with a round trip first; see `build_pool` in `main.rs`).
    pub pool: Pool,
    /// Armed faults, `Some` only with `--enable-fault-injection`.
    pub faults: Option<Arc<FaultHooks>>,
    /// Transfers run as tasks tracked here, so that a client going away does not cancel
    /// a transaction half-way and shutdown can wait for them.
    pub tasks: TaskTracker,
    /// Redemption stripes for debits (`--redeem-stripes`): 0 or 1 credits the one
    /// `sys-redeem` row (SPEC §3); K > 1 credits `sys-redeem-NN` chosen from the account
    /// (`points_ledger::striping`), which removes the hot row.
    pub redeem_stripes: u32,
    /// How debits and grants reach the database (`--transfer-mode`): SPEC §3's separate
    /// statements, one statement ([`points_ledger::transfer_onetrip`]), or batches.
    pub transfer_mode: TransferMode,
    /// The collector of the batch mode (`super::batch`), `Some` exactly when
    /// `transfer_mode` is [`TransferMode::Batch`].
    pub batcher: Option<Arc<points_ledger::batcher::Batcher>>,
    /// `--planted-bug`: a deliberate bug for `./run.sh explore` (`super::planted`);
    /// `None` in normal operation.
    pub planted_bug: Option<super::planted::PlantedBug>,
    /// The callers of `--auth-tokens`; `None` without the flag (then `X-Client-Id` is
    /// trusted as declared and the admin listener as reachable).
    pub auth: Option<Arc<TokenTable>>,
    /// The bound of one request, milliseconds (`--request-timeout-ms`, `super::bound`).
    pub request_timeout_ms: u64,
    /// Whether a request past its bound has its statement cancelled (CancelRequest):
    /// not behind a transaction pooler, whose cancel forwarding PgBouncer 1.18 can die of
    /// (`super::bound`).
    pub cancels_at_bound: bool,
}

impl AppState {
    /// The bound of one request (`--request-timeout-ms`, `super::bound`).
    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms)
    }

    /// Where a bounded request runs (`super::bound::run`).
    pub fn runner(&self) -> bound::Runner<'_> {
        bound::Runner {
            pool: &self.pool,
            tasks: &self.tasks,
            cancels_at_bound: self.cancels_at_bound,
            covers_replays: self.planted_bug
                != Some(super::planted::PlantedBug::TrustCancelledCommit),
        }
    }

    /// Runs `work` on a pooled connection within the request's bound, in a task of the
    /// tracker (a client that goes away cannot cancel the transaction half-way, and
    /// shutdown waits for it), and settles what it came to ([`bound::run`],
    /// [`bound::settle`]): the work's result, or why there is none ([`bound::Failure`]).
    ///
    /// Errors: the task's [`JoinError`] (it panicked or was cancelled).
    pub async fn run_bounded<R, E, W>(
        self: &Arc<Self>,
        work: W,
    ) -> Result<Result<R, bound::Failure<E>>, JoinError>
    where
        R: bound::Replayed + Send + 'static,
        E: From<tokio_postgres::Error> + bound::WorkError + Send + 'static,
        W: for<'c> FnOnce(&'c mut tokio_postgres::Client) -> BoxFuture<'c, Result<R, E>>
            + Send
            + 'static,
    {
        let state = self.clone();
        self.tasks
            .spawn(async move {
                let ran = bound::run(state.runner(), state.request_timeout(), work).await;
                bound::settle(ran)
            })
            .await
    }
}

pub type Handled = Result<HttpResponse, CloseConnection>;

/// Who sent a request.
#[derive(Debug, Clone, Copy)]
pub struct Call<'a> {
    /// The authenticated caller (`--auth-tokens`), `None` without authentication.
    pub caller: Option<&'a Caller>,
}

/// Runs `handler` if `method` is `allowed`, else answers 405.
pub async fn only<F, Fut>(
    method: &Method,
    allowed: Method,
    allow: &'static str,
    handler: F,
) -> Handled
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = Handled>,
{
    if *method == allowed {
        handler().await
    } else {
        Ok(Problem::wrong_method(method, allow).into_response())
    }
}

/// Reads a request body of at most [`MAX_BODY_BYTES`].
pub async fn read_body(request: Request<Incoming>) -> Result<Bytes, Problem> {
    let declared = request
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|length| length > MAX_BODY_BYTES as u64) {
        return Err(Problem::too_large(MAX_BODY_BYTES));
    }
    let collected = tokio::time::timeout(
        Duration::from_millis(BODY_READ_TIMEOUT_MS),
        Limited::new(request.into_body(), MAX_BODY_BYTES).collect(),
    )
    .await
    .map_err(|_| {
        Problem::new(
            StatusCode::REQUEST_TIMEOUT,
            "body-timeout",
            "Request body too slow",
            format!("the request body did not arrive within {BODY_READ_TIMEOUT_MS} ms"),
            ApiOutcome::BadRequest,
        )
    })?;
    match collected {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.is::<http_body_util::LengthLimitError>() => {
            Err(Problem::too_large(MAX_BODY_BYTES))
        }
        Err(_) => Err(Problem::bad_request("the request body could not be read")),
    }
}

/// Whether a database error may pass by itself (see [`TRANSIENT_SQLSTATES`]); no
/// SQLSTATE at all means the connection failed.
pub fn transient(error: &LedgerError) -> bool {
    match error.sqlstate() {
        None => true,
        Some(code) => TRANSIENT_SQLSTATES.iter().any(|transient| {
            code == *transient || (transient.len() == 2 && code.starts_with(transient))
        }),
    }
}

/// [`POOL_WAIT_TIMEOUT_MS`] as a duration.
pub fn pool_wait_timeout() -> Duration {
    Duration::from_millis(POOL_WAIT_TIMEOUT_MS)
}
