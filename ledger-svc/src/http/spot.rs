//! The frozen balances of SPEC §8 over HTTP, on the service's own listeners, pool,
//! problem bodies, key grammar, task tracker (graceful shutdown) and fault hooks.
//!
//! Every route takes the tenant in `X-Tenant-Id` (the grammar of `X-Client-Id`); with
//! `--auth-tokens` the tenant is the authenticated caller and the header may only repeat
//! it (`super::auth::tenant_id`). Every event takes its business id in `Idempotency-Key`
//! (the ledger's key grammar), scoped by the tenant, and is answered within the request's
//! bound (`super::bound`). Bodies are `application/json` objects whose amounts, quantities and
//! prices are decimal **strings** (`"0.4000"`), never JSON numbers, so no float ever
//! touches an amount; order ids are JSON integers.
//!
//! Public listener:
//! - `POST /spot/accounts/{account}/orders`, body
//!   `{"market": "BTC-USDT", "side": "BUY"|"SELL", "quantity": "1.0000", "price": "5000.00"}`
//!   → 201 OK with `order_id` and the freeze; 409 `INSUFFICIENT` (recorded, replayed).
//! - `POST /spot/accounts/{account}/orders/{order_id}/cancel`, no body → 201 OK with the
//!   released remainder; 409 `ORDER_CLOSED` (recorded, replayed); 404 `NO_ORDER`.
//! - `GET /spot/accounts/{account}/balances` → 200 with each asset's available and frozen;
//!   403 for a system account (the tenant's books, not a trader's).
//!
//! Admin listener:
//! - `POST /spot/accounts/{account}/deposits`, body `{"asset": "USDT", "amount": "10000"}`.
//! - `POST /spot/fills`, body `{"buy_order_id": 1, "sell_order_id": 2, "quantity": "0.4000",
//!   "price": "4900.00"}`, the fill id in `Idempotency-Key` → 201 OK; 409 `ORDER_CLOSED`;
//!   404 `NO_ORDER`; 422 `FILL_REJECTED` (the fill does not fit its orders; not recorded).
//!
//! Every malformed input is 400 `BAD_REQUEST` (415 for another media type, 413 for a
//! body over the limit) before the database is touched; the same business id with
//! another payload is 422 `KEY_REUSED`. A replay carries `Idempotent-Replayed: true` and
//! the first response's body byte for byte.

use std::sync::Arc;

use frozen_balances::amount::{
    AmountError, format_units, parse_amount, parse_price, parse_quantity,
};
use frozen_balances::schema::is_system_account;
use frozen_balances::{
    Asset, CancelRequest, CancelResult, DepositRequest, DepositResult, EventRequest, FillRequest,
    FillResult, FrozenError, Hooks, Market, Outcome, PlaceRequest, PlaceResult, Side,
};
use futures_util::future::BoxFuture;
use hyper::body::Incoming;
use hyper::header::CONTENT_TYPE;
use hyper::{Method, Request, StatusCode};
use serde_json::{Map, Value, json};

use super::CloseConnection;
use super::auth;
use super::bound::{self, Replayed};
use super::grammar::{self, BodyType};
use super::listener::Listener;
use super::problem::{ApiOutcome, HttpResponse, Problem, json_response, mark_replayed};
use super::state::{AppState, Call, Handled, only, read_body};

/// SQLSTATE numeric_value_out_of_range.
const NUMERIC_VALUE_OUT_OF_RANGE: &str = "22003";

/// Routes `/spot/{rest}`.
pub async fn route(
    state: &Arc<AppState>,
    listener: Listener,
    request: Request<Incoming>,
    call: Call<'_>,
    rest: &[&str],
    path: &str,
) -> Handled {
    let method = request.method().clone();
    let tenant_id = match auth::tenant_id(call.caller, request.headers()) {
        Ok(tenant_id) => tenant_id,
        Err(refused) => return Ok(*refused),
    };
    let scope = Scope { tenant_id };
    match (listener, rest) {
        (Listener::Public, ["accounts", account, "orders"]) => {
            let account = account.to_string();
            only(&method, Method::POST, "POST", || {
                serve(state, place_request(request, scope, account))
            })
            .await
        }
        (Listener::Public, ["accounts", account, "orders", order, "cancel"]) => {
            let (account, order) = (account.to_string(), order.to_string());
            only(&method, Method::POST, "POST", || {
                serve(state, cancel_request(request, scope, account, order))
            })
            .await
        }
        (Listener::Public, ["accounts", account, "balances"]) => {
            let account = account.to_string();
            only(&method, Method::GET, "GET", || {
                balances_route(state, scope, account)
            })
            .await
        }
        (Listener::Admin, ["accounts", account, "deposits"]) => {
            let account = account.to_string();
            only(&method, Method::POST, "POST", || {
                serve(state, deposit_request(request, scope, account))
            })
            .await
        }
        (Listener::Admin, ["fills"]) => {
            only(&method, Method::POST, "POST", || {
                serve(state, fill_request(request, scope))
            })
            .await
        }
        _ => Ok(Problem::no_route(path).into_response()),
    }
}

fn bad(text: impl Into<String>) -> Problem {
    Problem::bad_request(text)
}

/// The tenant a request acts for ([`auth::tenant_id`]).
struct Scope {
    tenant_id: String,
}

/// The business id (`Idempotency-Key`).
fn business_id(request: &Request<Incoming>) -> Result<String, Problem> {
    grammar::parse_idempotency_key(
        request
            .headers()
            .get_all("idempotency-key")
            .iter()
            .map(|v| v.as_bytes()),
    )
    .map_err(|m| bad(m.0))
}

/// A trader's account in the path: the ledger's account grammar, not a system account.
fn trader(account: &str) -> Result<String, Problem> {
    let account = grammar::parse_account_id(account).map_err(|m| bad(m.0))?;
    if is_system_account(&account) {
        return Err(Problem::new(
            StatusCode::FORBIDDEN,
            "system-account",
            "System account",
            format!("{account} is a system account; spot routes only address trader accounts"),
            ApiOutcome::BadRequest,
        ));
    }
    Ok(account)
}

/// What an event on a trader's account takes from its request: the trader (the path's
/// `account`), the business id, and the JSON body with exactly `members`.
///
/// Errors: the 400 (or 403, 413, 415) problem.
async fn trader_event(
    request: Request<Incoming>,
    account: &str,
    members: &[&str],
) -> Result<(String, String, Map<String, Value>), Problem> {
    let account = trader(account)?;
    let business_id = business_id(&request)?;
    let object = json_object(request, members).await?;
    Ok((account, business_id, object))
}

/// An order id in a path: a decimal positive integer that fits `i64`, no leading zero.
fn order_id_segment(text: &str) -> Result<i64, Problem> {
    let well_formed =
        !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) && !text.starts_with('0');
    well_formed
        .then(|| text.parse::<i64>().ok())
        .flatten()
        .ok_or_else(|| bad("order id must be a positive decimal integer that fits 64 bits"))
}

/// The JSON object of an event body: exactly `members` (all required), nothing else.
async fn json_object(
    request: Request<Incoming>,
    members: &[&str],
) -> Result<Map<String, Value>, Problem> {
    let mut content_types = request.headers().get_all(CONTENT_TYPE).iter();
    let body_type = match (content_types.next(), content_types.next()) {
        (Some(value), None) => grammar::body_type(value.as_bytes()),
        _ => None,
    };
    if body_type != Some(BodyType::Json) {
        return Err(Problem::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported-media-type",
            "Unsupported media type",
            "Content-Type must be application/json on the spot routes",
            ApiOutcome::BadRequest,
        ));
    }
    let body = read_body(request).await?;
    let text = std::str::from_utf8(&body).map_err(|_| bad("the request body is not UTF-8"))?;
    let expected = || {
        bad(format!(
            "body must be a JSON object with exactly the members {}",
            members.join(", ")
        ))
    };
    // serde_json keeps the last of repeated members; a repeated member is refused by
    // counting the top-level keys with a strict map type instead.
    let object: Map<String, Value> = match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(object)) => object,
        _ => return Err(expected()),
    };
    let unique: Result<StrictObject, _> = serde_json::from_str(text);
    if unique.is_err() || object.len() != members.len() {
        return Err(expected());
    }
    if !members.iter().all(|m| object.contains_key(*m)) {
        return Err(expected());
    }
    Ok(object)
}

/// Deserializes an object and fails on a repeated key.
struct StrictObject;

impl<'de> serde::Deserialize<'de> for StrictObject {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = StrictObject;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object without repeated members")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<StrictObject, A::Error> {
                let mut seen = std::collections::HashSet::new();
                while let Some(key) = map.next_key::<String>()? {
                    if !seen.insert(key.clone()) {
                        return Err(serde::de::Error::custom(format!("repeated member {key}")));
                    }
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
                Ok(StrictObject)
            }
        }
        deserializer.deserialize_map(Visitor)
    }
}

/// A member that must be a JSON string.
fn string_member<'a>(object: &'a Map<String, Value>, name: &str) -> Result<&'a str, Problem> {
    object[name].as_str().ok_or_else(|| {
        bad(format!(
            "{name} must be a JSON string (amounts, quantities and prices are decimal strings)"
        ))
    })
}

/// A member that must be a positive JSON integer (an order id).
fn id_member(object: &Map<String, Value>, name: &str) -> Result<i64, Problem> {
    match &object[name] {
        Value::Number(n) if n.is_i64() && n.as_i64().is_some_and(|v| v > 0) => {
            Ok(n.as_i64().unwrap_or_default())
        }
        _ => Err(bad(format!("{name} must be a positive JSON integer"))),
    }
}

fn amount_problem(error: AmountError) -> Problem {
    bad(error.to_string())
}

fn parse_market(text: &str) -> Result<Market, Problem> {
    text.parse()
        .map_err(|_| bad("market must be \"BTC-USDT\" or \"ETH-USDT\""))
}

fn parse_side(text: &str) -> Result<Side, Problem> {
    text.parse()
        .map_err(|_| bad("side must be \"BUY\" or \"SELL\""))
}

fn parse_asset(text: &str) -> Result<Asset, Problem> {
    text.parse()
        .map_err(|_| bad("asset must be \"USDT\", \"BTC\" or \"ETH\""))
}

/// One frozen-balance event a spot route runs: its request (kind, tenant, business id),
/// the event on PostgreSQL and the answer to its result.
trait SpotEvent: EventRequest + Clone + Send + Sync + 'static {
    /// What the event returns (`PlaceResult` …).
    type Result: Replayed + Send + 'static;

    /// Runs the event (`frozen_balances::place` …) on `client` with `hooks`.
    fn run<'c>(
        &'c self,
        client: &'c mut tokio_postgres::Client,
        hooks: &'c dyn Hooks,
    ) -> BoxFuture<'c, Result<Self::Result, FrozenError>>;

    /// The answer to `result` (the replay header aside).
    fn respond(&self, result: &Self::Result) -> HttpResponse;
}

/// `SpotEvent` for each request: its event function, its result, its response function.
macro_rules! spot_events {
    ($($request:ty => $event:path, $result:ty, $respond:ident;)*) => {$(
        impl SpotEvent for $request {
            type Result = $result;

            fn run<'c>(
                &'c self,
                client: &'c mut tokio_postgres::Client,
                hooks: &'c dyn Hooks,
            ) -> BoxFuture<'c, Result<$result, FrozenError>> {
                Box::pin($event(client, self, hooks))
            }

            fn respond(&self, result: &$result) -> HttpResponse {
                $respond(self, result)
            }
        }
    )*};
}

spot_events! {
    PlaceRequest => frozen_balances::place, PlaceResult, place_response;
    CancelRequest => frozen_balances::cancel, CancelResult, cancel_response;
    DepositRequest => frozen_balances::deposit, DepositResult, deposit_response;
    FillRequest => frozen_balances::fill, FillResult, fill_response;
}

/// The tail of every event route: a refused request is answered with its problem; else
/// the event runs ([`run_event`]) and its result (`Idempotent-Replayed: true` on a
/// replay) or its failure is answered.
async fn serve<E: SpotEvent>(
    state: &Arc<AppState>,
    parsed: impl Future<Output = Result<E, Problem>>,
) -> Handled {
    let req = match parsed.await {
        Ok(req) => req,
        Err(problem) => return Ok(problem.into_response()),
    };
    match run_event(state, req.clone()).await {
        Ok(result) => Ok(replayed(req.respond(&result), result.replayed())),
        Err(failure) => failure_response(state, failure),
    }
}

/// Runs `req`'s event on a pooled connection in a tracked task (a client that goes away
/// cannot cancel the transaction half-way; shutdown waits for it), with the fault hooks,
/// within the request's bound (`super::bound`).
async fn run_event<E: SpotEvent>(state: &Arc<AppState>, req: E) -> Result<E::Result, Failure> {
    let label = format!("{} {}/{}", E::KIND, req.tenant_id(), req.business_id());
    let faults = state.faults.clone();
    let task = state.run_bounded(move |client| {
        Box::pin(async move {
            let hooks = super::faults::spot_hooks(faults.as_deref());
            let result = req.run(client, hooks).await;
            if let Err(FrozenError::HookAborted(point)) = &result {
                eprintln!(
                    "ledger-svc: fault at spot-{point} aborted {label}: {}; closing the \
                     connection without a response",
                    if *point == frozen_balances::HookPoint::AfterCommit {
                        "the event is committed"
                    } else {
                        "the event was rolled back"
                    }
                );
            }
            result
        })
    });
    match task.await {
        Ok(result) => result,
        Err(join_error) => {
            eprintln!("ledger-svc: spot task failed: {join_error}");
            Err(Failure::NoConnection(format!(
                "spot task failed: {join_error}"
            )))
        }
    }
}

type Failure = bound::Failure<FrozenError>;

/// The answer to a failed event.
fn failure_response(state: &AppState, failure: Failure) -> Handled {
    let error = match failure {
        Failure::NoConnection(error) => {
            eprintln!("ledger-svc: no database connection: {error}");
            return Ok(Problem::unavailable().into_response());
        }
        Failure::Unknown => return Ok(Problem::unavailable().into_response()),
        Failure::RanOut => {
            return Ok(Problem::bound_ran_out(state.request_timeout_ms).into_response());
        }
        Failure::Failed(error) => error,
    };
    error_response(error)
}

/// The answer to an event that failed with `error` (a problem body; 5xx only for the
/// database's failures, after which the request may or may not have executed).
fn error_response(error: FrozenError) -> Handled {
    match error {
        FrozenError::HookAborted(_) => Err(CloseConnection),
        FrozenError::PayloadMismatch { .. } => Ok(Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "key-reused",
            "Idempotency key reused",
            "this Idempotency-Key (business id) was first used with a different request; \
             reuse it only to retry the same request",
            ApiOutcome::KeyReused,
        )
        .into_response()),
        FrozenError::Invalid(text) => Ok(bad(text).into_response()),
        FrozenError::Amount(error) => Ok(amount_problem(error).into_response()),
        FrozenError::NoOrder(order_id) => Ok(Problem::new(
            StatusCode::NOT_FOUND,
            "no-order",
            "No such order",
            format!("order {order_id} does not exist for this tenant and account"),
            ApiOutcome::NoOrder,
        )
        .with("order_id", order_id)
        .into_response()),
        error @ (FrozenError::NoBalance { .. } | FrozenError::Held { .. }) => {
            Ok(balance_refusal(error).into_response())
        }
        FrozenError::FillRejected(text) => Ok(Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "fill-rejected",
            "Fill does not fit its orders",
            text,
            ApiOutcome::FillRejected,
        )
        .into_response()),
        error @ FrozenError::Db { .. } if error.sqlstate() == Some(NUMERIC_VALUE_OUT_OF_RANGE) => {
            eprintln!("ledger-svc: spot event refused: {error}");
            Ok(bad(
                "the request would take a balance outside the 64-bit range; nothing was recorded",
            )
            .into_response())
        }
        error @ (FrozenError::Db { .. } | FrozenError::DeadlockRetriesExhausted { .. }) => {
            eprintln!("ledger-svc: spot event failed: {error}");
            Ok(Problem::unavailable().into_response())
        }
        error => {
            eprintln!("ledger-svc: spot event failed: {error}");
            Ok(Problem::internal().into_response())
        }
    }
}

/// The problem of a freeze refused for the account's balance row of an asset: none
/// (404 `NO_BALANCE`, F23) or on hold (409 `ON_HOLD`, F25). Neither is recorded.
fn balance_refusal(error: FrozenError) -> Problem {
    match error {
        FrozenError::NoBalance { account_id, asset } => Problem::new(
            StatusCode::NOT_FOUND,
            "no-balance",
            "No balance of that asset",
            format!(
                "account {account_id} holds no {asset} balance; nothing was recorded",
                asset = asset.as_str()
            ),
            ApiOutcome::NoBalance,
        )
        .with("account_id", account_id)
        .with("asset", asset.as_str()),
        FrozenError::Held {
            account_id,
            asset,
            shortfall,
        } => Problem::new(
            StatusCode::CONFLICT,
            "on-hold",
            "Account on hold for that asset",
            format!(
                "account {account_id} owes {shortfall} units of {asset} from a reversed deposit; \
                 nothing was recorded",
                asset = asset.as_str()
            ),
            ApiOutcome::OnHold,
        )
        .with("account_id", account_id)
        .with("asset", asset.as_str()),
        other => {
            eprintln!("ledger-svc: spot event failed: {other}");
            Problem::internal()
        }
    }
}

fn replayed(mut response: HttpResponse, replayed: bool) -> HttpResponse {
    if replayed {
        mark_replayed(&mut response);
    }
    response
}

/// The placement a `POST /spot/accounts/{account}/orders` asks for, checked before the
/// database (a freeze past the 64-bit range or the asset's maximum is 400 here).
///
/// Errors: the 400 (or 403, 413, 415) problem.
async fn place_request(
    request: Request<Incoming>,
    scope: Scope,
    account: String,
) -> Result<PlaceRequest, Problem> {
    let (account, business_id, object) =
        trader_event(request, &account, &["market", "side", "quantity", "price"]).await?;
    let market = parse_market(string_member(&object, "market")?)?;
    let side = parse_side(string_member(&object, "side")?)?;
    let quantity =
        parse_quantity(market, string_member(&object, "quantity")?).map_err(amount_problem)?;
    let limit_price =
        parse_price(market, string_member(&object, "price")?).map_err(amount_problem)?;
    let req = PlaceRequest {
        tenant_id: scope.tenant_id,
        business_id,
        account_id: account,
        market,
        side,
        quantity,
        limit_price,
    };
    // Notional past the bigint range or the asset's maximum: 400 before the database.
    req.freeze().map_err(|error| match error {
        FrozenError::Amount(error) => amount_problem(error),
        other => bad(other.to_string()),
    })?;
    Ok(req)
}

fn place_response(req: &PlaceRequest, result: &PlaceResult) -> HttpResponse {
    let asset = result.frozen_asset;
    let market = req.market;
    match result.outcome {
        Outcome::Ok => json_response(
            StatusCode::CREATED,
            &json!({
                "outcome": ApiOutcome::Ok.as_str(),
                "tenant_id": req.tenant_id,
                "account_id": req.account_id,
                "order_id": result.order_id,
                "market": market.as_str(),
                "side": req.side.as_str(),
                "quantity": format_units(market.base(), req.quantity),
                "price": format_units(market.quote(), req.limit_price),
                "frozen_asset": asset.as_str(),
                "frozen": format_units(asset, result.frozen_amount),
                "fee_reserve": format_units(asset, result.fee_reserve),
                "available": format_units(asset, result.available),
            }),
        ),
        _ => Problem::new(
            StatusCode::CONFLICT,
            "insufficient",
            "Insufficient balance",
            format!(
                "account {} had {} {asset} available, less than the {} the order must freeze",
                req.account_id,
                format_units(asset, result.available),
                format_units(asset, result.frozen_amount)
            ),
            ApiOutcome::Insufficient,
        )
        .with("account_id", req.account_id.as_str())
        .with("asset", asset.as_str())
        .with("required", format_units(asset, result.frozen_amount))
        .with("available", format_units(asset, result.available))
        .into_response(),
    }
}

/// The cancel a `POST /spot/accounts/{account}/orders/{order}/cancel` asks for (no
/// body).
///
/// Errors: the 400 (or 403) problem.
async fn cancel_request(
    request: Request<Incoming>,
    scope: Scope,
    account: String,
    order: String,
) -> Result<CancelRequest, Problem> {
    let account = trader(&account)?;
    let order_id = order_id_segment(&order)?;
    let business_id = business_id(&request)?;
    let body = read_body(request).await?;
    if !body.is_empty() {
        return Err(bad("a cancel has no body"));
    }
    Ok(CancelRequest {
        tenant_id: scope.tenant_id,
        business_id,
        account_id: account,
        order_id,
    })
}

fn cancel_response(_req: &CancelRequest, result: &CancelResult) -> HttpResponse {
    let asset = result.asset;
    match result.outcome {
        Outcome::Ok => json_response(
            StatusCode::CREATED,
            &json!({
                "outcome": ApiOutcome::Ok.as_str(),
                "order_id": result.order_id,
                "asset": asset.as_str(),
                "released": format_units(asset, result.released),
                "status": result.order_status.as_str(),
            }),
        ),
        _ => order_closed(result.order_id, result.order_status),
    }
}

fn order_closed(order_id: i64, status: frozen_balances::OrderStatus) -> HttpResponse {
    Problem::new(
        StatusCode::CONFLICT,
        "order-closed",
        "Order closed",
        format!("order {order_id} is {}; nothing moved", status.as_str()),
        ApiOutcome::OrderClosed,
    )
    .with("order_id", order_id)
    .with("status", status.as_str())
    .into_response()
}

async fn balances_route(state: &Arc<AppState>, scope: Scope, account: String) -> Handled {
    // A system account's balances (`sys-deposit`: a tenant's total deposits) are the
    // exchange's books, not a trader's: not served here.
    let account = match trader(&account) {
        Ok(account) => account,
        Err(problem) => return Ok(problem.into_response()),
    };
    let Scope { tenant_id } = scope;
    let client = match state.pool.get().await {
        Ok(client) => client,
        Err(error) => {
            eprintln!("ledger-svc: no database connection: {error}");
            return Ok(Problem::unavailable().into_response());
        }
    };
    match frozen_balances::query::balances(&client, &tenant_id, &account).await {
        Ok(rows) if rows.is_empty() => Ok(Problem::new(
            StatusCode::NOT_FOUND,
            "no-account",
            "No such account",
            format!("account {account} has no balances in this tenant"),
            ApiOutcome::NoAccount,
        )
        .with("account_id", account.as_str())
        .into_response()),
        Ok(rows) => {
            let balances: Vec<Value> = rows
                .iter()
                .map(|b| {
                    json!({
                        "asset": b.asset.as_str(),
                        "available": format_units(b.asset, b.available),
                        "frozen": format_units(b.asset, b.frozen),
                    })
                })
                .collect();
            Ok(json_response(
                StatusCode::OK,
                &json!({"tenant_id": tenant_id, "account_id": account, "balances": balances}),
            ))
        }
        Err(error) => {
            eprintln!("ledger-svc: reading spot balances of {account}: {error}");
            Ok(Problem::unavailable().into_response())
        }
    }
}

/// The deposit a `POST /spot/accounts/{account}/deposits` (admin) asks for.
///
/// Errors: the 400 (or 403, 413, 415) problem.
async fn deposit_request(
    request: Request<Incoming>,
    scope: Scope,
    account: String,
) -> Result<DepositRequest, Problem> {
    let (account, business_id, object) =
        trader_event(request, &account, &["asset", "amount"]).await?;
    let asset = parse_asset(string_member(&object, "asset")?)?;
    let amount =
        parse_amount("amount", asset, string_member(&object, "amount")?).map_err(amount_problem)?;
    Ok(DepositRequest {
        tenant_id: scope.tenant_id,
        business_id,
        account_id: account,
        asset,
        amount,
    })
}

fn deposit_response(req: &DepositRequest, result: &DepositResult) -> HttpResponse {
    let asset = result.asset;
    json_response(
        StatusCode::CREATED,
        &json!({
            "outcome": ApiOutcome::Ok.as_str(),
            "tenant_id": req.tenant_id,
            "account_id": req.account_id,
            "asset": asset.as_str(),
            "amount": format_units(asset, result.amount),
            "available": format_units(asset, result.available),
        }),
    )
}

/// The fill a `POST /spot/fills` (admin) asks for, its fill id in `Idempotency-Key`.
///
/// Errors: the 400 (or 413, 415) problem.
async fn fill_request(request: Request<Incoming>, scope: Scope) -> Result<FillRequest, Problem> {
    let fill_id = business_id(&request)?;
    let object = json_object(
        request,
        &["buy_order_id", "sell_order_id", "quantity", "price"],
    )
    .await?;
    let buy_order_id = id_member(&object, "buy_order_id")?;
    let sell_order_id = id_member(&object, "sell_order_id")?;
    if buy_order_id == sell_order_id {
        return Err(bad("buy_order_id and sell_order_id must differ"));
    }
    let market = Market::BtcUsdt;
    let quantity =
        parse_quantity(market, string_member(&object, "quantity")?).map_err(amount_problem)?;
    let price = parse_price(market, string_member(&object, "price")?).map_err(amount_problem)?;
    Ok(FillRequest {
        tenant_id: scope.tenant_id,
        fill_id,
        buy_order_id,
        sell_order_id,
        quantity,
        price,
    })
}

fn fill_response(req: &FillRequest, result: &FillResult) -> HttpResponse {
    let (base, quote) = (Market::BtcUsdt.base(), Market::BtcUsdt.quote());
    match (result.outcome, result.closed_order) {
        (Outcome::OrderClosed, Some((order_id, status))) => order_closed(order_id, status),
        _ => json_response(
            StatusCode::CREATED,
            &json!({
                "outcome": ApiOutcome::Ok.as_str(),
                "fill_id": req.fill_id,
                "buy_order_id": req.buy_order_id,
                "sell_order_id": req.sell_order_id,
                "quantity": format_units(base, req.quantity),
                "price": format_units(quote, req.price),
                "notional": format_units(quote, result.notional),
                "buyer_fee": format_units(quote, result.buyer_fee),
                "seller_fee": format_units(quote, result.seller_fee),
                "buyer_frozen_taken": format_units(quote, result.buyer_frozen_taken),
                "buyer_returned": format_units(quote, result.buyer_returned),
                "seller_received": format_units(quote, result.seller_received),
                "buy_status": result.buy_status.map(|s| s.as_str()),
                "sell_status": result.sell_status.map(|s| s.as_str()),
            }),
        ),
    }
}
