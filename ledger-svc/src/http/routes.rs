//! The two listeners' routes.
//!
//! Both listeners:
//! - `GET /healthz` (liveness) → 200 `{"status":"ok"}` whenever the process serves HTTP;
//!   it never touches the database or waits on the pool.
//! - `GET /readyz` (readiness) → 200 `{"status":"ready"}` when a pooled connection
//!   answers a round trip within [`READY_TIMEOUT_MS`], else 503 problem `not-ready`
//!   (outcome `UNKNOWN`, `Retry-After`).
//!
//! Public listener (SPEC §4):
//! - `GET /accounts/{id}` → 200 `{"account_id","balance"}`, or 404 `NO_ACCOUNT`.
//! - `POST /accounts/{id}/debits` → the SPEC §4 table; the body may also name the
//!   redemption order the debit pays (`order_id`, [`grammar::parse_body`]), which is part
//!   of the fingerprint (the same key with another order is 422 `KEY_REUSED`) and stored
//!   in `ledger_txn.order_id`; plus: 422 `KEY_EXPIRED` (with
//!   `txn_id`) for a key whose record expired or was removed; 503 `UNKNOWN` with
//!   `Retry-After` when a bounded wait ran out or the database failed in a way that may
//!   pass ([`TRANSIENT_SQLSTATES`]); 500 `UNKNOWN` for any other database error (a
//!   trigger's SQLSTATE 22003 included). Nothing is recorded on any of these.
//!
//! Admin listener (never reachable from the public one):
//! - `GET /healthz`, and `POST /accounts/{id}/grants` (same headers, body and table as a
//!   debit, without `order_id`, which is 400 there; a grant to a missing account is 404
//!   `NO_ACCOUNT`, not recorded).
//! - `POST /transfers`: between two user accounts (`super::transfers`).
//! - With `--enable-fault-injection` only (otherwise these paths are 404):
//!   `GET /faults`, `DELETE /faults`, `PUT /faults/{point}` (body [`FaultSpec`]),
//!   `DELETE /faults/{point}`, `POST /faults/{point}/release`, where `{point}` is a
//!   ledger hook point or a spot one (`spot-registered`, …; see [`FaultPoint`]).
//!
//! Both listeners: `/spot/...`, the frozen balances of SPEC §8 (see `super::spot`).
//!
//! Anything else: 404 problem; a known path with another method: 405 with `Allow`.
//!
//! With `--auth-tokens`, every route but `/healthz` and `/readyz` first authenticates
//! the caller (`super::auth`): 401/403 before anything else, and the caller's id, not a
//! declared `X-Client-Id`, scopes the keys of debits, grants and transfers, and is the
//! tenant of the spot routes.
//!
//! Debits, grants, transfers and spot events are answered within one bound per request
//! (`--request-timeout-ms`, `super::bound`), counted from the request's arrival.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use deadpool_postgres::Pool;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::header::{CONTENT_LENGTH, CONTENT_TYPE};
use hyper::{Method, Request, StatusCode};
use ledger_svc::route_table::{self, Lookup};
use points_ledger::schema::is_system_account;
use points_ledger::striping::striped_debit;
use points_ledger::{
    HookPoint, Kind, LedgerError, Outcome, TransferMode, TransferRequest, TransferResult,
    transfer_in,
};
use serde_json::json;
use tokio_postgres::types::Type;
use tokio_util::task::TaskTracker;

use super::CloseConnection;
use super::auth::{self, Caller, TokenTable};
use super::bound;
use super::faults::{FaultHooks, FaultPoint, FaultSpec};
use super::grammar::{self, MAX_BODY_BYTES};
use super::log::{RequestLog, Summary};
use super::problem::{ApiOutcome, HttpResponse, Problem, json_response, mark_replayed, with_facts};

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
/// `lock_timeout`) and idle_in_transaction_session_timeout (25P03). PostgreSQL docs,
/// Appendix A. Every other SQLSTATE (a trigger's error, a violated constraint) is 500.
const TRANSIENT_SQLSTATES: [&str; 6] = ["08", "40", "53", "57", "55P03", "25P03"];

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
    /// statements, or one statement ([`points_ledger::transfer_onetrip`]).
    pub transfer_mode: TransferMode,
    /// `--planted-bug`: a deliberate bug for `./run.sh explore` (`super::planted`);
    /// `None` in normal operation.
    pub planted_bug: Option<super::planted::PlantedBug>,
    /// The callers of `--auth-tokens`; `None` without the flag (then `X-Client-Id` is
    /// trusted as declared and the admin listener as reachable).
    pub auth: Option<Arc<TokenTable>>,
    /// The bound of one request, milliseconds (`--request-timeout-ms`, `super::bound`).
    pub request_timeout_ms: u64,
}

impl AppState {
    /// The bound of one request (`--request-timeout-ms`, `super::bound`).
    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms)
    }
}

/// Which listener a request came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    /// The public listener.
    Public,
    /// The admin listener.
    Admin,
}

pub(super) type Handled = Result<HttpResponse, CloseConnection>;

/// Routes one request and writes its log line (see [`super::log`]).
/// `Err(CloseConnection)` closes the connection without a response.
pub async fn handle(
    state: Arc<AppState>,
    listener: Listener,
    request: Request<Incoming>,
) -> Handled {
    let mut log = Some(RequestLog::new(
        listener,
        request.method(),
        request.uri().path(),
    ));
    let result = route(&state, listener, request, &mut log).await;
    // A transfer that reached its task took the log line along; it logs on its own.
    if let Some(log) = log.take() {
        log.finish(result.as_ref().ok(), false);
    }
    result
}

async fn route(
    state: &Arc<AppState>,
    listener: Listener,
    request: Request<Incoming>,
    log: &mut Option<RequestLog>,
) -> Handled {
    let path = request.uri().path().to_owned();
    let segments: Vec<&str> = path.split('/').skip(1).collect();
    let method = request.method().clone();
    let name = |log: &mut Option<RequestLog>, template: &str| {
        if let Some(log) = log.as_mut() {
            log.route(template);
        }
    };
    // The route table is the list of what is served: anything it does not list is 404 or
    // 405 here, before any handler (so the OpenAPI document covers every reachable route).
    let admin = listener == Listener::Admin;
    let route = match route_table::lookup(admin, state.faults.is_some(), method.as_str(), &path) {
        Lookup::Found(route) => route,
        Lookup::WrongMethod(listed) => {
            return Ok(Problem::wrong_method(&method, listed.allow).into_response());
        }
        Lookup::NotFound => return Ok(Problem::no_route(&path).into_response()),
    };
    let caller = match (&state.auth, segments.as_slice()) {
        (_, ["healthz" | "readyz" | "openapi.json"]) | (None, _) => None,
        (Some(table), _) => match auth::authenticate(table, listener, request.headers()) {
            Ok(caller) => {
                if let Some(log) = log.as_mut() {
                    log.caller(&caller.client_id);
                }
                Some(caller)
            }
            Err(refused) => {
                // Refused before any handler named the route: log its template.
                name(log, route.template);
                return Ok(*refused);
            }
        },
    };
    let caller = caller.as_ref();
    match (listener, segments.as_slice()) {
        (_, ["openapi.json"]) => {
            name(log, route_table::OPENAPI_ROUTE);
            only(&method, Method::GET, "GET", openapi).await
        }
        (_, ["healthz"]) => {
            name(log, "/healthz");
            only(&method, Method::GET, "GET", healthz).await
        }
        (_, ["readyz"]) => {
            name(log, "/readyz");
            only(&method, Method::GET, "GET", || readyz(state)).await
        }
        (Listener::Public, ["accounts", account]) => {
            name(log, "/accounts/{id}");
            let account = account.to_string();
            only(&method, Method::GET, "GET", || read_account(state, account)).await
        }
        (Listener::Public, ["accounts", account, "debits"]) => {
            name(log, "/accounts/{id}/debits");
            let account = account.to_string();
            only(&method, Method::POST, "POST", || {
                let call = Call { caller };
                transfer_route(state, request, call, Kind::Debit, account, log)
            })
            .await
        }
        (Listener::Admin, ["accounts", account, "grants"]) => {
            name(log, "/accounts/{id}/grants");
            let account = account.to_string();
            only(&method, Method::POST, "POST", || {
                let call = Call { caller };
                transfer_route(state, request, call, Kind::Grant, account, log)
            })
            .await
        }
        (Listener::Admin, ["transfers"]) => {
            only(&method, Method::POST, "POST", || async {
                Ok(super::transfers::transfers_route(state, request, caller).await)
            })
            .await
        }
        (_, ["spot", rest @ ..]) => {
            let call = Call { caller };
            super::spot::route(state, listener, request, call, rest, &path).await
        }
        (Listener::Admin, ["faults", rest @ ..]) => match &state.faults {
            Some(faults) => fault_route(faults, state.transfer_mode, request, rest, &path).await,
            None => Ok(Problem::no_route(&path).into_response()),
        },
        _ => Ok(Problem::no_route(&path).into_response()),
    }
}

/// Who sent a request.
#[derive(Debug, Clone, Copy)]
pub struct Call<'a> {
    /// The authenticated caller (`--auth-tokens`), `None` without authentication.
    pub caller: Option<&'a Caller>,
}

/// Runs `handler` if `method` is `allowed`, else answers 405.
pub(super) async fn only<F, Fut>(
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

/// The OpenAPI 3.1 document of both listeners (`ledger_svc::route_table::OPENAPI_JSON`).
async fn openapi() -> Handled {
    let mut response = hyper::Response::new(http_body_util::Full::new(Bytes::from_static(
        route_table::OPENAPI_JSON.as_bytes(),
    )));
    response.headers_mut().insert(
        CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    Ok(response)
}

/// Liveness: the process serves requests. No database call, no wait on the pool.
async fn healthz() -> Handled {
    Ok(json_response(StatusCode::OK, &json!({"status": "ok"})))
}

/// Readiness: a pooled connection is free (or can be made) and answers a round trip
/// (the pool's Verified recycling check, or a new connection), within [`READY_TIMEOUT_MS`].
async fn readyz(state: &AppState) -> Handled {
    let bound = Duration::from_millis(READY_TIMEOUT_MS);
    let timeouts = deadpool_postgres::Timeouts {
        wait: Some(bound),
        create: Some(bound),
        recycle: Some(bound),
    };
    let checked = tokio::time::timeout(bound, async {
        let client = state
            .pool
            .timeout_get(&timeouts)
            .await
            .map_err(|error| error.to_string())?;
        client
            .simple_query("")
            .await
            .map(|_| ())
            .map_err(|error| LedgerError::from(error).to_string())
    })
    .await;
    let reason = match checked {
        Ok(Ok(())) => return Ok(json_response(StatusCode::OK, &json!({"status": "ready"}))),
        Ok(Err(error)) => error,
        Err(_) => format!("no answer within {READY_TIMEOUT_MS} ms"),
    };
    eprintln!("ledger-svc: readyz: not ready: {reason}");
    Ok(Problem::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "not-ready",
        "Not ready",
        format!(
            "no database connection answered within {READY_TIMEOUT_MS} ms; the process is \
             alive (see /healthz)"
        ),
        ApiOutcome::Unknown,
    )
    .into_response())
}

async fn read_account(state: &AppState, account: String) -> Handled {
    let account = match grammar::parse_account_id(&account) {
        Ok(account) => account,
        Err(bad) => return Ok(Problem::bad_request(bad.0).into_response()),
    };
    let client = match state.pool.get().await {
        Ok(client) => client,
        Err(error) => {
            eprintln!("ledger-svc: no database connection: {error}");
            return Ok(Problem::unavailable().into_response());
        }
    };
    let row = client
        .query_typed_opt(
            "SELECT balance FROM account WHERE account_id = $1",
            &[(&account, Type::TEXT)],
        )
        .await;
    match row {
        Ok(Some(row)) => {
            let balance: i64 = row.get(0);
            Ok(json_response(
                StatusCode::OK,
                &json!({"account_id": account, "balance": balance}),
            ))
        }
        Ok(None) => Ok(no_account(&account, None).into_response()),
        Err(error) => {
            eprintln!(
                "ledger-svc: reading {account}: {}",
                LedgerError::from(error)
            );
            Ok(Problem::unavailable().into_response())
        }
    }
}

fn no_account(account: &str, amount: Option<i64>) -> Problem {
    let mut problem = Problem::new(
        StatusCode::NOT_FOUND,
        "no-account",
        "No such account",
        format!("account {account} does not exist"),
        ApiOutcome::NoAccount,
    )
    .with("account_id", account);
    if let Some(amount) = amount {
        problem = problem.with("amount", amount).with("balance", 0);
    }
    problem
}

/// Reads a request body of at most [`MAX_BODY_BYTES`].
pub(super) async fn read_body(request: Request<Incoming>) -> Result<Bytes, Problem> {
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

/// Everything about a transfer request that is checked before the body is read.
struct TransferHead {
    /// The user account in the path (never a `sys-` account).
    account: String,
    /// `X-Client-Id`.
    client_id: String,
    /// `Idempotency-Key`.
    key: String,
    /// How the body is encoded, from `Content-Type`.
    body_type: grammar::BodyType,
}

/// Checks the path account and the headers of a transfer request, before the database
/// is touched.
fn parse_transfer(
    request: &Request<Incoming>,
    caller: Option<&Caller>,
    kind: Kind,
    account: &str,
) -> Result<TransferHead, Box<HttpResponse>> {
    let account = grammar::parse_account_id(account)
        .map_err(|bad| Box::new(Problem::bad_request(bad.0).into_response()))?;
    if is_system_account(&account) {
        return Err(Problem::new(
            StatusCode::FORBIDDEN,
            "system-account",
            "System account",
            format!(
                "{account} is a system account; {} only address user accounts",
                match kind {
                    Kind::Debit => "debits",
                    Kind::Grant => "grants",
                    Kind::Transfer => "transfers",
                }
            ),
            ApiOutcome::BadRequest,
        )
        .into_response()
        .into());
    }
    let headers = request.headers();
    let client_id = auth::client_id(caller, headers)?;
    let key = grammar::parse_idempotency_key(
        headers
            .get_all("idempotency-key")
            .iter()
            .map(|value| value.as_bytes()),
    )
    .map_err(|bad| Box::new(Problem::bad_request(bad.0).into_response()))?;
    let mut content_types = headers.get_all(CONTENT_TYPE).iter();
    let body_type = match (content_types.next(), content_types.next()) {
        (Some(value), None) => grammar::body_type(value.as_bytes()),
        _ => None,
    }
    .ok_or_else(|| Box::new(Problem::unsupported_media_type().into_response()))?;
    Ok(TransferHead {
        account,
        client_id,
        key,
        body_type,
    })
}

async fn transfer_route(
    state: &Arc<AppState>,
    request: Request<Incoming>,
    call: Call<'_>,
    kind: Kind,
    account: String,
    log: &mut Option<RequestLog>,
) -> Handled {
    let head = match parse_transfer(&request, call.caller, kind, &account) {
        Ok(head) => head,
        Err(refused) => return Ok(*refused),
    };
    if let Some(log) = log.as_mut() {
        log.identify(&head.client_id, &head.key);
    }
    let body = match read_body(request).await {
        Ok(body) => body,
        Err(problem) => return Ok(problem.into_response()),
    };
    let grammar::TransferBody { amount, order_id } =
        match grammar::parse_body(head.body_type, &body) {
            Ok(body) => body,
            Err(bad) => return Ok(Problem::bad_request(bad.0).into_response()),
        };
    // The business reference belongs to a redemption: a grant naming one is malformed.
    if kind == Kind::Grant && order_id.is_some() {
        return Ok(
            Problem::bad_request("order_id is accepted on debits only, not on grants")
                .into_response(),
        );
    }
    let TransferHead {
        account,
        client_id,
        key,
        ..
    } = head;
    let transfer_request = match kind {
        Kind::Debit => {
            let debit = striped_debit(client_id, key, &account, amount, state.redeem_stripes);
            match order_id {
                Some(order_id) => debit.with_order(order_id),
                None => debit,
            }
        }
        Kind::Grant => TransferRequest::grant(client_id, key, &account, amount),
        // Transfers between two accounts have their own route (`http::transfers`).
        Kind::Transfer => return Ok(Problem::no_route("/transfers").into_response()),
    };

    // The transfer runs in its own task: if the client goes away (hyper then drops this
    // future), the transaction still ends by commit or rollback, never half-way, and the
    // task still writes the request's log line.
    let task_state = state.clone();
    let task_log = log.take();
    let (answer, answered) = tokio::sync::oneshot::channel::<Handled>();
    state.tasks.spawn(async move {
        let outcome = run_transfer(&task_state, transfer_request).await;
        let handled = transfer_response(&task_state, kind, &account, amount, outcome);
        let logged = match &handled {
            Ok(response) => Some(Summary::of(response)),
            Err(CloseConnection) => None,
        };
        let client_gone = answer.send(handled).is_err();
        if let Some(log) = task_log {
            log.finish_summary(logged, client_gone);
        }
    });
    match answered.await {
        Ok(handled) => handled,
        Err(_) => {
            eprintln!("ledger-svc: transfer task ended without an answer");
            Ok(Problem::internal().into_response())
        }
    }
}

/// Runs the transfer on a pooled connection with the armed faults (if any), within the
/// request's bound (`super::bound`).
async fn run_transfer(
    state: &AppState,
    transfer_request: TransferRequest,
) -> Result<TransferResult, Failure> {
    let (mode, planted_bug, faults) =
        (state.transfer_mode, state.planted_bug, state.faults.clone());
    let ran = bound::run(
        &state.pool,
        &state.tasks,
        state.request_timeout(),
        move |client| {
            Box::pin(async move {
                let hooks = super::faults::ledger_hooks(faults.as_deref());
                let mut result = transfer_in(mode, client, &transfer_request, hooks).await;
                if planted_bug == Some(super::planted::PlantedBug::ReexecuteKnownKeys) {
                    result = super::planted::reexecute_known_keys(
                        client,
                        &transfer_request,
                        hooks,
                        result,
                    )
                    .await;
                }
                if let Err(LedgerError::HookAborted(point)) = &result {
                    eprintln!(
                        "ledger-svc: fault at {point} aborted {} {}: {}; closing the connection \
                     without a response",
                        transfer_request.kind.as_str(),
                        transfer_request.idem_key,
                        if *point == HookPoint::AfterCommit {
                            "the transfer is committed"
                        } else {
                            "the transfer was rolled back"
                        }
                    );
                }
                result
            })
        },
    )
    .await;
    bound::settle(ran, |error| matches!(error, LedgerError::HookAborted(_)))
}

/// 422 `KEY_EXPIRED`: the key's record expired or was removed; nothing executed again, and
/// `txn_id` names what the key once executed (`None`: nothing). Logs which of the two.
pub(super) fn key_expired(txn_id: Option<i64>, tombstone: bool) -> Problem {
    eprintln!(
        "ledger-svc: key expired (txn_id={txn_id:?}, {}); nothing executed",
        if tombstone {
            "tombstone"
        } else {
            "record missing, transaction present"
        }
    );
    Problem::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "key-expired",
        "Idempotency key expired",
        "this Idempotency-Key is no longer remembered with its response; the request \
         was not executed again (txn_id names what the key executed, if anything); \
         a new operation needs a new key",
        ApiOutcome::KeyExpired,
    )
    .with("txn_id", txn_id)
}

/// Whether a database error may pass by itself (see [`TRANSIENT_SQLSTATES`]); no
/// SQLSTATE at all means the connection failed.
pub(super) fn transient(error: &LedgerError) -> bool {
    match error.sqlstate() {
        None => true,
        Some(code) => TRANSIENT_SQLSTATES.iter().any(|transient| {
            code == *transient || (transient.len() == 2 && code.starts_with(transient))
        }),
    }
}

/// The answer to a transfer's outcome (SPEC §4 table, plus the failures).
fn transfer_response(
    state: &AppState,
    kind: Kind,
    account: &str,
    amount: i64,
    outcome: Result<TransferResult, Failure>,
) -> Handled {
    match outcome {
        Ok(result) => Ok(result_response(kind, account, amount, &result)),
        Err(Failure::Failed(LedgerError::HookAborted(_))) => Err(CloseConnection),
        Err(Failure::Failed(LedgerError::KeyReused { .. })) => Ok(Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "key-reused",
            "Idempotency key reused",
            "this Idempotency-Key was first used with a different request; \
             a key must be reused only to retry the same request",
            ApiOutcome::KeyReused,
        )
        .into_response()),
        // The key's record expired or was removed: never executed again, and the answer
        // names the transaction the key once executed (null: it executed none).
        Err(Failure::Failed(LedgerError::KeyExpired { txn_id, tombstone })) => {
            Ok(key_expired(txn_id, tombstone).into_response())
        }
        Err(Failure::Failed(LedgerError::CreditAccountMissing(missing))) if kind == Kind::Grant => {
            Ok(no_account(&missing, Some(amount)).into_response())
        }
        Err(Failure::Failed(LedgerError::AccountFrozen(frozen))) => Ok(Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "account-frozen",
            "Account frozen for repair",
            format!("account {frozen} is frozen while a repair runs; nothing was recorded, retry later with the same key"),
            ApiOutcome::Unknown,
        )
        .with("account_id", frozen)
        .into_response()),
        Err(Failure::Failed(LedgerError::InvalidAmount(_))) => {
            Ok(Problem::bad_request("amount must be a positive integer").into_response())
        }
        // Our own balance arithmetic overflowed bigint (decided in the library by where the
        // SQLSTATE 22003 came from): the amount cannot be done; nothing was recorded.
        Err(Failure::Failed(error @ LedgerError::OutOfRange { .. })) => {
            eprintln!("ledger-svc: transfer refused: {error}");
            Ok(Problem::bad_request(
                "amount would take a balance outside the 64-bit range of points; nothing was recorded",
            )
            .into_response())
        }
        // A wait ran out (lock_timeout, statement_timeout, idle bound), the connection
        // failed, a deadlock: rolled back, nothing recorded; the same key may be retried.
        Err(Failure::Failed(error @ LedgerError::Db { .. })) if transient(&error) => {
            eprintln!("ledger-svc: transfer failed: {error}");
            Ok(Problem::unavailable().into_response())
        }
        // Any other database error (a trigger's 22003, a violated constraint) is the
        // server's fault, not the client's amount; rolled back, nothing recorded.
        Err(Failure::Failed(error)) => {
            eprintln!("ledger-svc: transfer failed: {error}");
            Ok(Problem::internal().into_response())
        }
        Err(Failure::Unknown) => Ok(Problem::unavailable().into_response()),
        Err(Failure::RanOut) => {
            Ok(Problem::bound_ran_out(state.request_timeout_ms).into_response())
        }
        Err(Failure::NoConnection(error)) => {
            eprintln!("ledger-svc: no database connection: {error}");
            Ok(Problem::unavailable().into_response())
        }
    }
}

type Failure = bound::Failure<LedgerError>;

/// The response of an executed or replayed transfer (SPEC §4 table): 201 JSON for OK,
/// 409 `INSUFFICIENT` and 404 `NO_ACCOUNT` problems, each with `Idempotent-Replayed:
/// true` when replayed. The body depends only on the request and the stored result, so a
/// replay is byte-for-byte the first response.
fn result_response(
    kind: Kind,
    account: &str,
    amount: i64,
    result: &TransferResult,
) -> HttpResponse {
    let mut response = match result.outcome {
        Outcome::Ok => json_response(
            StatusCode::CREATED,
            &json!({
                "outcome": ApiOutcome::Ok.as_str(),
                "kind": kind.as_str(),
                "account_id": account,
                "amount": amount,
                "txn_id": result.txn_id,
                "balance": result.balance,
            }),
        ),
        Outcome::Insufficient => Problem::new(
            StatusCode::CONFLICT,
            "insufficient",
            "Insufficient balance",
            format!(
                "account {account} had {} points, fewer than the {amount} requested",
                result.balance
            ),
            ApiOutcome::Insufficient,
        )
        .with("account_id", account)
        .with("amount", amount)
        .with("balance", result.balance)
        .into_response(),
        Outcome::NoAccount => no_account(account, Some(amount)).into_response(),
    };
    if result.replayed {
        mark_replayed(&mut response);
    }
    if result.outcome == Outcome::Ok {
        response = with_facts(response, ApiOutcome::Ok, result.txn_id);
    }
    response
}

async fn fault_route(
    faults: &FaultHooks,
    mode: TransferMode,
    request: Request<Incoming>,
    rest: &[&str],
    path: &str,
) -> Handled {
    let method = request.method().clone();
    let states = |faults: &FaultHooks| json!({ "faults": faults.states() });
    match rest {
        [] => match method {
            Method::GET => Ok(json_response(StatusCode::OK, &states(faults))),
            Method::DELETE => {
                for point in FaultPoint::ALL {
                    faults.clear(point);
                }
                Ok(json_response(StatusCode::OK, &states(faults)))
            }
            _ => Ok(Problem::wrong_method(&method, "GET, DELETE").into_response()),
        },
        [point] => {
            let Ok(point) = point.parse::<FaultPoint>() else {
                return Ok(Problem::no_route(path).into_response());
            };
            match method {
                Method::PUT => {
                    let body = match read_body(request).await {
                        Ok(body) => body,
                        Err(problem) => return Ok(problem.into_response()),
                    };
                    let spec: FaultSpec = match serde_json::from_slice(&body) {
                        Ok(spec) => spec,
                        Err(_) => {
                            return Ok(Problem::bad_request(
                                "fault body must be {\"action\": \"delay\"|\"pause\"|\"close\", \
                                 \"hold_ms\": N, \"count\": N}",
                            )
                            .into_response());
                        }
                    };
                    if let Err(text) = spec.validate(point) {
                        return Ok(Problem::bad_request(text).into_response());
                    }
                    if let FaultPoint::Ledger(ledger_point) = point
                        && !mode.has_hook_point(ledger_point)
                    {
                        return Ok(point_not_passed(ledger_point, mode).into_response());
                    }
                    let state = faults.arm(point, spec);
                    Ok(json_response(StatusCode::OK, &json!(state)))
                }
                Method::DELETE => Ok(json_response(StatusCode::OK, &json!(faults.clear(point)))),
                _ => Ok(Problem::wrong_method(&method, "PUT, DELETE").into_response()),
            }
        }
        [point, "release"] => {
            let Ok(point) = point.parse::<FaultPoint>() else {
                return Ok(Problem::no_route(path).into_response());
            };
            if method != Method::POST {
                return Ok(Problem::wrong_method(&method, "POST").into_response());
            }
            let released = faults.release(point);
            Ok(json_response(
                StatusCode::OK,
                &json!({"point": point, "released": released}),
            ))
        }
        _ => Ok(Problem::no_route(path).into_response()),
    }
}

/// 409: a fault at `point` would never fire, because transfers in `mode` do not pass it
/// (in `onetrip` the point lies inside the server's one statement; only `after-commit`
/// exists). Nothing is armed.
fn point_not_passed(point: HookPoint, mode: TransferMode) -> Problem {
    Problem::new(
        StatusCode::CONFLICT,
        "point-not-passed",
        "Hook point not passed in this transfer mode",
        format!(
            "debits and grants in --transfer-mode {mode} do not pass {point} (it lies inside \
             the one server-side statement); only after-commit can be armed"
        ),
        ApiOutcome::BadRequest,
    )
    .with("point", point.as_str())
}

/// [`POOL_WAIT_TIMEOUT_MS`] as a duration.
pub fn pool_wait_timeout() -> Duration {
    Duration::from_millis(POOL_WAIT_TIMEOUT_MS)
}
