//! `POST /transfers` on the admin listener: a transfer between two user accounts
//! (`points_ledger::transfer_between`, rows locked in sorted order), like a grant an
//! internal operation, never reachable from the public listener.
//!
//! Headers `X-Client-Id` and `Idempotency-Key` as for a debit; body JSON
//! `{"from": "acct-0001", "to": "acct-0002", "amount": 10}`. Answers: 201 with
//! `{"outcome": "OK", "kind": "TRANSFER", "from", "to", "amount", "txn_id", "balance"}`
//! (`balance`: `from`'s balance after), 409 `INSUFFICIENT`, 404 `NO_ACCOUNT` (either
//! account missing), each replayed with `Idempotent-Replayed: true`; 422 `KEY_REUSED`;
//! 400 for a malformed body, the same account twice or a system account; 503 while an
//! account is frozen for repair (nothing recorded) or the database is unavailable.

use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Request, StatusCode};
use points_ledger::schema::is_system_account;
use points_ledger::{
    LedgerError, Outcome, TransferRequest, TransferResult, between, transfer_between,
};
use serde::Deserialize;
use serde_json::json;

use super::auth::Caller;
use super::bound::Failure;
use super::grammar;
use super::problem::{ApiOutcome, HttpResponse, Problem, json_response, mark_replayed};
use super::state::{AppState, read_body, transient};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TransferBody {
    from: String,
    to: String,
    amount: i64,
}

/// One parsed `POST /transfers`: who asks, under which key, for what.
struct Parsed {
    client_id: String,
    key: String,
    from: String,
    to: String,
    amount: i64,
}

/// Handles one `POST /transfers`.
/// `caller`: the authenticated caller with `--auth-tokens` (its id scopes the key;
/// `super::auth::client_id`), `None` without. Answered within the request's bound
/// (`super::bound`).
pub async fn transfers_route(
    state: &Arc<AppState>,
    request: Request<Incoming>,
    caller: Option<&Caller>,
) -> HttpResponse {
    let parsed = match parse(request, caller).await {
        Ok(parsed) => parsed,
        Err(refused) => return *refused,
    };
    let req = between(
        parsed.client_id.clone(),
        parsed.key.clone(),
        parsed.from.clone(),
        parsed.to.clone(),
        parsed.amount,
    );
    match run(state, req).await {
        Ok(result) => answer(&parsed, result),
        Err(refused) => *refused,
    }
}

/// Reads the caller, the key and the body of a transfer: 400 (or the caller's 401/403)
/// for anything malformed, before anything runs.
async fn parse(
    request: Request<Incoming>,
    caller: Option<&Caller>,
) -> Result<Parsed, Box<HttpResponse>> {
    let bad = |detail: &str| Box::new(Problem::bad_request(detail).into_response());
    let headers = request.headers();
    let (client_id, key) = super::ledger::caller_and_key(caller, headers)?;
    let body = read_body(request)
        .await
        .map_err(|problem| Box::new(problem.into_response()))?;
    let Ok(body) = serde_json::from_slice::<TransferBody>(&body) else {
        return Err(bad(
            "body must be {\"from\": account, \"to\": account, \"amount\": positive integer}",
        ));
    };
    let (from, to) = match (
        grammar::parse_account_id(&body.from),
        grammar::parse_account_id(&body.to),
    ) {
        (Ok(from), Ok(to)) => (from, to),
        (Err(wrong), _) | (_, Err(wrong)) => return Err(bad(&wrong.0)),
    };
    if body.amount <= 0 {
        return Err(bad("amount must be a positive integer"));
    }
    if from == to || is_system_account(&from) || is_system_account(&to) {
        return Err(bad(
            "a transfer moves points between two different user accounts",
        ));
    }
    Ok(Parsed {
        client_id,
        key,
        from,
        to,
        amount: body.amount,
    })
}

/// Runs the transfer in its own task within the request's bound: the ledger's result,
/// or the answer when the bound ran out (503 `request-timeout`), the session did not
/// answer or no connection came (503 `UNKNOWN`), or the task failed (500).
async fn run(
    state: &Arc<AppState>,
    req: TransferRequest,
) -> Result<Result<TransferResult, LedgerError>, Box<HttpResponse>> {
    let faults = state.faults.clone();
    let task = state.run_bounded(move |client| {
        Box::pin(async move {
            let hooks = super::faults::ledger_hooks(faults.as_deref());
            transfer_between(client, &req, hooks).await
        })
    });
    let refused = |response: HttpResponse| Err(Box::new(response));
    match task.await {
        Ok(Ok(result)) => Ok(Ok(result)),
        Ok(Err(Failure::Failed(error))) => Ok(Err(error)),
        Ok(Err(Failure::RanOut)) => {
            refused(Problem::bound_ran_out(state.request_timeout_ms).into_response())
        }
        Ok(Err(Failure::Unknown)) => refused(Problem::unavailable().into_response()),
        Ok(Err(Failure::NoConnection(error))) => {
            eprintln!("ledger-svc: no database connection: {error}");
            refused(Problem::unavailable().into_response())
        }
        Err(error) => {
            eprintln!("ledger-svc: transfer task failed: {error}");
            refused(Problem::internal().into_response())
        }
    }
}

/// The answer to a transfer that ran: 201, 409 `insufficient`, 404 `no-account`, 422
/// `key-reused` or `KEY_EXPIRED`, 503 `account-frozen`, or 503/500 for a database error
/// that may pass or may not. A replayed result is marked so.
fn answer(parsed: &Parsed, result: Result<TransferResult, LedgerError>) -> HttpResponse {
    let Parsed {
        from, to, amount, ..
    } = parsed;
    match result {
        Ok(result) => {
            let mut response = match result.outcome {
                Outcome::Ok => json_response(
                    StatusCode::CREATED,
                    &json!({
                        "outcome": ApiOutcome::Ok.as_str(), "kind": "TRANSFER",
                        "from": from, "to": to, "amount": amount,
                        "txn_id": result.txn_id, "balance": result.balance,
                    }),
                ),
                Outcome::Insufficient => Problem::new(
                    StatusCode::CONFLICT,
                    "insufficient",
                    "Insufficient balance",
                    format!(
                        "account {from} had {} points, fewer than {amount}",
                        result.balance
                    ),
                    ApiOutcome::Insufficient,
                )
                .with("balance", result.balance)
                .into_response(),
                Outcome::NoAccount => no_account(from),
            };
            if result.replayed {
                mark_replayed(&mut response);
            }
            response
        }
        Err(error) => refusal(error),
    }
}

/// The answer to a transfer the ledger refused with `error`.
fn refusal(error: LedgerError) -> HttpResponse {
    match error {
        LedgerError::CreditAccountMissing(missing) => no_account(&missing),
        LedgerError::KeyReused { .. } => Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "key-reused",
            "Idempotency key reused",
            "this Idempotency-Key was first used with a different request",
            ApiOutcome::KeyReused,
        )
        .into_response(),
        LedgerError::AccountFrozen(frozen) => Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "account-frozen",
            "Account frozen for repair",
            format!("account {frozen} is frozen while a repair runs; nothing was recorded"),
            ApiOutcome::Unknown,
        )
        .into_response(),
        LedgerError::KeyExpired { txn_id, tombstone } => {
            super::ledger::key_expired(txn_id, tombstone).into_response()
        }
        // As for debits: a wait that ran out, a lost connection or a deadlock may pass
        // (503, retry); any other database error is the server's (500). Rolled back.
        error @ LedgerError::Db { .. } if transient(&error) => {
            eprintln!("ledger-svc: transfer failed: {error}");
            Problem::unavailable().into_response()
        }
        error => {
            eprintln!("ledger-svc: transfer failed: {error}");
            Problem::internal().into_response()
        }
    }
}

fn no_account(account: &str) -> HttpResponse {
    Problem::new(
        StatusCode::NOT_FOUND,
        "no-account",
        "No such account",
        format!("account {account} does not exist"),
        ApiOutcome::NoAccount,
    )
    .with("account_id", account)
    .into_response()
}
