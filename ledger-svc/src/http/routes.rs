//! The two listeners' routes.
//!
//! Both listeners:
//! - `GET /healthz` (liveness) → 200 `{"status":"ok"}` whenever the process serves HTTP;
//!   it never touches the database or waits on the pool.
//! - `GET /readyz` (readiness) → 200 `{"status":"ready"}` when a pooled connection
//!   answers a round trip within [`super::state::READY_TIMEOUT_MS`], else 503 problem `not-ready`
//!   (outcome `UNKNOWN`, `Retry-After`).
//!
//! This module is the router: it looks each request up in `ledger_svc::route_table`,
//! authenticates it, and hands it to the routes of one system (`super::ledger`,
//! `super::transfers`, `super::spot`) or answers it itself (health, readiness, faults).
//!
//! Public listener (SPEC §4):
//! - `GET /accounts/{id}` → 200 `{"account_id","balance"}`, or 404 `NO_ACCOUNT`.
//! - `POST /accounts/{id}/debits` → the SPEC §4 table; the body may also name the
//!   redemption order the debit pays (`order_id`, `grammar::parse_body`), which is part
//!   of the fingerprint (the same key with another order is 422 `KEY_REUSED`) and stored
//!   in `ledger_txn.order_id`; plus: 422 `KEY_EXPIRED` (with
//!   `txn_id`) for a key whose record expired or was removed; 503 `UNKNOWN` with
//!   `Retry-After` when a bounded wait ran out or the database failed in a way that may
//!   pass ([`super::state::transient`]); 500 `UNKNOWN` for any other database error (a
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

use hyper::body::Bytes;
use hyper::body::Incoming;
use hyper::header::CONTENT_TYPE;
use hyper::{Method, Request, StatusCode};
use ledger_svc::route_table::{self, Lookup};
use points_ledger::{HookPoint, Kind, LedgerError, TransferMode};
use serde_json::json;

use super::auth::{self};
use super::faults::{FaultHooks, FaultPoint, FaultSpec};
use super::ledger::{read_account, transfer_route};
use super::listener::Listener;
use super::log::RequestLog;
use super::problem::{ApiOutcome, Problem, json_response};
use super::state::{AppState, Call, Handled, READY_TIMEOUT_MS, only, read_body};

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

// Long: one match arm per route of the route table, in its order; split, the dispatch
// would no longer read as the table.
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
        (Listener::Admin, ["batch", rest @ ..]) => {
            super::batch::route(state, &method, rest, &path).await
        }
        (Listener::Admin, ["faults", rest @ ..]) => match &state.faults {
            Some(faults) => fault_route(faults, state.transfer_mode, request, rest, &path).await,
            None => Ok(Problem::no_route(&path).into_response()),
        },
        _ => Ok(Problem::no_route(&path).into_response()),
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

// Long: one match arm per fault route (list, clear, arm, disarm, release), each a few
// lines; split, the arms would lose their common checks.
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
