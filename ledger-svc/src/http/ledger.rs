//! The points ledger's routes (SPEC §4), called by the router (`super::routes`):
//!
//! - `GET /accounts/{id}` → 200 `{"account_id","balance"}`, or 404 `NO_ACCOUNT`.
//! - `POST /accounts/{id}/debits` → the SPEC §4 table; the body may also name the
//!   redemption order the debit pays (`order_id`, [`grammar::parse_body`]), which is part
//!   of the fingerprint (the same key with another order is 422 `KEY_REUSED`) and stored
//!   in `ledger_txn.order_id`; plus: 422 `KEY_EXPIRED` (with `txn_id`) for a key whose
//!   record expired or was removed; 503 `UNKNOWN` with `Retry-After` when a bounded wait
//!   ran out or the database failed in a way that may pass
//!   ([`super::state::transient`]); 500 `UNKNOWN` for any other database error (a
//!   trigger's SQLSTATE 22003 included). Nothing is recorded on any of these, but for a
//!   503 whose connection closed under a COMMIT (a cancelled wait for the synchronous
//!   standby among them, `crate::session`): that one may have committed, and a retry
//!   with the same key learns it. A replay is answered only once its record is on the
//!   synchronous standby (`super::bound::cover`).
//! - `POST /accounts/{id}/grants` on the admin listener: same headers, body and table as
//!   a debit, without `order_id`, which is 400 there; a grant to a missing account is 404
//!   `NO_ACCOUNT`, not recorded.
//! - `POST /transfers` between two user accounts is in `super::transfers`.

use std::sync::Arc;

use hyper::body::Incoming;
use hyper::header::CONTENT_TYPE;
use hyper::{Request, StatusCode};
use points_ledger::schema::is_system_account;
use points_ledger::striping::striped_debit;
use points_ledger::{
    HookPoint, Kind, LedgerError, Outcome, TransferRequest, TransferResult, transfer_in,
};
use serde_json::json;
use tokio_postgres::types::Type;

use super::CloseConnection;
use super::auth::{self, Caller};
use super::bound;
use super::grammar::{self};
use super::log::{RequestLog, Summary};
use super::problem::{ApiOutcome, HttpResponse, Problem, json_response, mark_replayed, with_facts};
use super::state::{AppState, Call, Handled, read_body, transient};

pub(super) async fn read_account(state: &AppState, account: String) -> Handled {
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
    let (client_id, key) = caller_and_key(caller, headers)?;
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

pub(super) async fn transfer_route(
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
    let account = head.account.clone();
    let Some(transfer_request) = transfer_request(state, head, kind, amount, order_id) else {
        // Transfers between two accounts have their own route (`http::transfers`).
        return Ok(Problem::no_route("/transfers").into_response());
    };
    answer_in_task(state, transfer_request, kind, account, amount, log).await
}

/// The ledger's request for a debit (striped over the redemption stripes, with its order
/// id if named) or a grant; `None` for a transfer between two accounts.
fn transfer_request(
    state: &AppState,
    head: TransferHead,
    kind: Kind,
    amount: i64,
    order_id: Option<String>,
) -> Option<TransferRequest> {
    let TransferHead {
        account,
        client_id,
        key,
        ..
    } = head;
    match kind {
        Kind::Debit => {
            let debit = striped_debit(client_id, key, &account, amount, state.redeem_stripes);
            Some(match order_id {
                Some(order_id) => debit.with_order(order_id),
                None => debit,
            })
        }
        Kind::Grant => Some(TransferRequest::grant(client_id, key, &account, amount)),
        Kind::Transfer => None,
    }
}

/// Runs `transfer_request` and its answer in a task of its own: if the client goes away
/// (hyper then drops this future), the transaction still ends by commit or rollback,
/// never half-way, and the task still writes the request's log line.
async fn answer_in_task(
    state: &Arc<AppState>,
    transfer_request: TransferRequest,
    kind: Kind,
    account: String,
    amount: i64,
    log: &mut Option<RequestLog>,
) -> Handled {
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
/// request's bound (`super::bound`); in the batch mode, in the next batch
/// (`super::batch::run`).
async fn run_transfer(
    state: &AppState,
    transfer_request: TransferRequest,
) -> Result<TransferResult, Failure> {
    if let Some(batcher) = &state.batcher {
        return super::batch::run(state, batcher, transfer_request).await;
    }
    let (mode, planted_bug, faults) =
        (state.transfer_mode, state.planted_bug, state.faults.clone());
    let ran = bound::run(state.runner(), state.request_timeout(), move |client| {
        Box::pin(async move {
            let hooks = super::faults::ledger_hooks(faults.as_deref());
            let mut result = transfer_in(mode, client, &transfer_request, hooks).await;
            if planted_bug == Some(super::planted::PlantedBug::ReexecuteKnownKeys) {
                result =
                    super::planted::reexecute_known_keys(client, &transfer_request, hooks, result)
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
    })
    .await;
    bound::settle(ran)
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

/// The answer to a transfer's outcome (SPEC §4 table, plus the failures).
// Long: one arm per answer of the SPEC §4 table and of each failure; split, the table
// would be read in pieces.
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
        // A wait ran out (lock_timeout, statement_timeout, idle bound), a deadlock: rolled
        // back, nothing recorded. The connection failed (no SQLSTATE; among others the
        // session ended at a warning, `crate::session`): a COMMIT under way may have
        // committed. Either way the outcome is unknown to the client: retry with the key.
        Err(Failure::Failed(error @ LedgerError::Db { .. })) if transient(&error) => {
            eprintln!("ledger-svc: transfer failed: {error}");
            Ok(Problem::unavailable().into_response())
        }
        // The request's batch failed as a whole (a lost connection, a deadlock, a failed
        // COMMIT, a trigger's error): nothing of it was acknowledged; retry with the key.
        Err(Failure::Failed(error @ LedgerError::BatchFailed { .. })) => {
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

/// The caller's id that scopes the key (`super::auth::client_id`: the authenticated
/// caller, or a declared `X-Client-Id` without tokens) and the request's one
/// `Idempotency-Key`, for a debit, a grant or a transfer.
///
/// Errors: the caller's 401/403, or 400 for a missing, repeated or malformed key.
pub(super) fn caller_and_key(
    caller: Option<&Caller>,
    headers: &hyper::HeaderMap,
) -> Result<(String, String), Box<HttpResponse>> {
    let client_id = auth::client_id(caller, headers)?;
    let key = grammar::parse_idempotency_key(
        headers
            .get_all("idempotency-key")
            .iter()
            .map(|value| value.as_bytes()),
    )
    .map_err(|bad| Box::new(Problem::bad_request(bad.0).into_response()))?;
    Ok((client_id, key))
}
