//! The batch transfer mode of the service (`--transfer-mode batch`): every debit and
//! grant is handed to one [`Batcher`] (`points_ledger::batcher`), whose few drainers
//! (`--batch-drainers`) take what is queued, up to `--batch-max-requests`, and execute it
//! in one transaction over pooled connections. A request's answer waits for its batch's
//! COMMIT; a batch that fails answers each of its requests 503 `UNKNOWN`.
//!
//! Admin routes:
//! - `GET /batch` → 200 `{"transfer_mode", "queued", "held", "max_requests", "drainers",
//!   "batches", "requests", "sizes"}` (`sizes[n]`: batches of `n` requests since the
//!   start; the bench reads the sizes seen from here). Outside the batch mode every
//!   count is 0 and the limits `null`.
//! - `PUT /batch/hold`, `DELETE /batch/hold` (only with `--enable-fault-injection`):
//!   hold the queue (no drainer takes a new batch) or release it; 200 with the state
//!   above, 409 outside the batch mode. A case queues a known set of requests, sees it
//!   queued here, and releases it as one batch.

use std::sync::Arc;

use deadpool_postgres::{Object, Pool};
use futures_util::future::BoxFuture;
use hyper::{Method, StatusCode};
use points_ledger::batch::{BATCH_CALL_SQL, BATCH_CALL_TYPES, PreparedBatchCall};
use points_ledger::batcher::{BatchConnection, BatchLimits, Batcher, ConnectionSource, Lease};
use points_ledger::{Hooks, LedgerError, NoHooks, TransferRequest, TransferResult};
use serde_json::{Value, json};

use super::bound::Failure;
use super::faults::FaultHooks;
use super::problem::{ApiOutcome, Problem, json_response};
use super::state::{AppState, Handled};

/// Pooled connections for the drainers: each batch takes one from the service's pool.
struct PoolConnections {
    pool: Pool,
    /// Whether the batch call is prepared once per pooled connection (in the pool's
    /// statement cache); not behind a transaction pooler (`pooler`), where it stays
    /// unnamed.
    prepare: bool,
}

/// A pooled connection lent to one batch, and whether to prepare the call on it.
struct Pooled(Object, bool);

impl BatchConnection for Pooled {
    fn prepared_call(&mut self) -> BoxFuture<'_, Option<PreparedBatchCall>> {
        Box::pin(async move {
            if !self.1 {
                return None;
            }
            let statement = self
                .0
                .prepare_typed_cached(BATCH_CALL_SQL, &BATCH_CALL_TYPES)
                .await
                .ok()?;
            Some(PreparedBatchCall::from_statement(statement))
        })
    }
}

impl std::ops::Deref for Pooled {
    type Target = tokio_postgres::Client;
    fn deref(&self) -> &tokio_postgres::Client {
        &self.0
    }
}

impl std::ops::DerefMut for Pooled {
    fn deref_mut(&mut self) -> &mut tokio_postgres::Client {
        &mut self.0
    }
}

impl ConnectionSource for PoolConnections {
    fn connection(&self) -> BoxFuture<'_, Result<Lease, LedgerError>> {
        Box::pin(async move {
            match self.pool.get().await {
                Ok(client) => Ok(Box::new(Pooled(client, self.prepare)) as Lease),
                Err(error) => Err(LedgerError::BatchFailed {
                    code: None,
                    message: format!("no database connection: {error}"),
                }),
            }
        })
    }
}

/// The batcher of a service in the batch mode: drainers over `pool`, the armed faults as
/// hooks (`before-commit` per request in the batch's open transaction, `after-commit` in
/// the request's task); the batch call prepared once per pooled connection when
/// `prepare` (not behind a transaction pooler).
pub fn start(
    pool: Pool,
    faults: Option<Arc<FaultHooks>>,
    limits: BatchLimits,
    prepare: bool,
) -> Arc<Batcher> {
    let hooks: Arc<dyn Hooks> = match faults {
        Some(faults) => faults,
        None => Arc::new(NoHooks),
    };
    Arc::new(Batcher::start(
        Box::new(PoolConnections { pool, prepare }),
        hooks,
        limits,
    ))
}

/// Runs `request` in the next batch, within the request's bound: past it the answer is
/// [`Failure::Unknown`] (503 `UNKNOWN`; the batch may still commit, a retry with the same
/// key tells). A replay is [covered](super::bound::cover) on a pooled connection within
/// what is left of the bound before it is answered: the batch read its record and wrote
/// nothing for it.
pub async fn run(
    state: &AppState,
    batcher: &Batcher,
    request: TransferRequest,
) -> Result<TransferResult, Failure<LedgerError>> {
    let deadline = tokio::time::Instant::now() + state.request_timeout();
    match tokio::time::timeout_at(deadline, batcher.submit(request)).await {
        Ok(Ok(result)) if result.replayed => {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let ran = super::bound::run(state.runner(), left, move |_client| {
                Box::pin(std::future::ready(Ok::<_, LedgerError>(result)))
            })
            .await;
            super::bound::settle(ran)
        }
        Ok(Ok(result)) => Ok(result),
        Ok(Err(error)) => Err(Failure::Failed(error)),
        Err(_) => {
            eprintln!(
                "ledger-svc: request bound ran out while its batch was queued or running; \
                 answering without its outcome"
            );
            Err(Failure::Unknown)
        }
    }
}

/// `GET /batch`, `PUT /batch/hold`, `DELETE /batch/hold` (the module's documentation).
pub async fn route(state: &AppState, method: &Method, rest: &[&str], path: &str) -> Handled {
    match (rest, method) {
        ([], &Method::GET) => Ok(json_response(StatusCode::OK, &shown(state))),
        (["hold"], &Method::PUT | &Method::DELETE) if state.faults.is_some() => {
            let Some(batcher) = &state.batcher else {
                return Ok(Problem::new(
                    StatusCode::CONFLICT,
                    "not-batch-mode",
                    "Not in the batch mode",
                    format!(
                        "the queue exists only with --transfer-mode batch (this service: {})",
                        state.transfer_mode
                    ),
                    ApiOutcome::BadRequest,
                )
                .into_response());
            };
            batcher.hold(*method == Method::PUT);
            Ok(json_response(StatusCode::OK, &shown(state)))
        }
        _ => Ok(Problem::no_route(path).into_response()),
    }
}

/// The state `GET /batch` shows.
fn shown(state: &AppState) -> Value {
    match &state.batcher {
        Some(batcher) => {
            let sizes = batcher.sizes();
            let limits = batcher.limits();
            json!({
                "transfer_mode": state.transfer_mode,
                "queued": batcher.queued(),
                "held": batcher.is_held(),
                "max_requests": limits.max_requests,
                "drainers": limits.drainers,
                "batches": sizes.batches(),
                "requests": sizes.requests(),
                "sizes": sizes.counts,
            })
        }
        None => json!({
            "transfer_mode": state.transfer_mode,
            "queued": 0,
            "held": false,
            "max_requests": null,
            "drainers": null,
            "batches": 0,
            "requests": 0,
            "sizes": [],
        }),
    }
}
