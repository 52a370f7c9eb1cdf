//! `ledger-svc`'s spot routes as spec steps, for a case whose claim is about the routes
//! (F11: what a client sends and what status it gets back) or about requests the service
//! holds (F3) or receives together (F4):
//!
//! - `spot-service [pool=N]` starts `ledger-svc` on the case's database
//!   (`launch::service::Service::launch`, the spot clients of [`super::spot::spot_service`],
//!   a pool of N, default [`POOL_SIZE`]): `ready`; killed when the case ends if no step
//!   stopped it;
//! - `post-place account=A side=BUY qty=… price=… key=K [tenant=T]` (public listener),
//!   `post-deposit account=A asset=USDT amount=… key=K [tenant=T]` (admin listener),
//!   `post-fill buy=ORDER sell=ORDER qty=… price=… key=K` (admin) and
//!   `post-cancel account=A order=ORDER key=K` (public) send the request as
//!   typed, the text not parsed here, and print the answer: `status=201 outcome=OK
//!   replayed=false` and the body's figures (`order_id`, `frozen`, `fee_reserve`,
//!   `notional`, `buyer_fee`, …, `released`), or `status=400 outcome=BAD_REQUEST
//!   detail=…`; an order is named by its number (`#3`) or the business id it was placed
//!   under;
//! - such a request in flight counts as waiting ([`Spot::waiting`], the spec runner's
//!   `Calls::waiting`) while every request the steps have in flight is held at a fault
//!   point or has a backend of the service waiting for a lock: so a fill held at
//!   `spot-before-commit` and a cancel blocked behind its order lock both show
//!   `<waiting ...>` until a step releases the fill (F3);
//! - `post-place … give-up-when-held=POINT`: the client gives up on the placement the
//!   moment the service is seen holding it at POINT (armed with a `pause`;
//!   `launch::lost::give_up_once_held`), as a timeout would but decided by that event:
//!   `gave up: holding=1 fired=1` (F7's lost response);
//! - `post-place … together=N`: N identical placements sent at once, released together
//!   by a barrier (F4): `created=16 executed=1 replayed=15 distinct_bodies=1 | ` and the
//!   first fresh answer;
//! - `post-place … market=M`: the body's market is M, sent as typed (default
//!   `BTC-USDT`; F23's placement on ETH-USDT);
//! - `spot-service fault-injection=yes` enables the fault routes: `arm-fault
//!   point=spot-after-commit action=pause [count=N] [hold_ms=N] [event=FILL]` (`armed at
//!   POINT`) and `release-fault point=POINT` (`released=N`, returned once nothing is held
//!   there any more);
//! - `stop-service` sends SIGTERM: `exit=0` when it ended with status 0.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use case_kit::spec::Call;
use frozen_balances::DEFAULT_TENANT;
use launch::lock_waits::LockMonitor;
use launch::service::{CLIENT_TIMEOUT_MS, Reply, Service, ServiceOptions, ServiceSlot};
use reqwest::header::CONTENT_TYPE;
use serde_json::json;
use tokio_postgres::Client;

use super::spot::{ForTenant, SpotCalls, spot_service};

/// The pool of the case's service when `spot-service` names none.
pub const POOL_SIZE: usize = 2;

/// The body members printed after the status, in this order, when present.
const SHOWN: [&str; 12] = [
    "order_id",
    "frozen",
    "fee_reserve",
    "notional",
    "buyer_fee",
    "seller_fee",
    "buyer_frozen_taken",
    "buyer_returned",
    "buy_status",
    "sell_status",
    "released",
    "detail",
];

/// Longest wait for the service to be seen holding a request at a fault point, ms (a
/// hang bound: `give-up-when-held` then reports `holding=0`), and for a released point
/// to hold nothing any more (`release-fault` then fails).
pub const HELD_WAIT_MS: u64 = 10_000;
/// How often `release-fault` looks whether the point still holds a request, ms.
const POLL_MS: u64 = 5;

/// An answer as one line: status, outcome, replayed, then the members of [`SHOWN`].
fn shown(reply: &Reply) -> String {
    let mut text = format!(
        "status={} outcome={} replayed={}",
        reply.status,
        reply.outcome(),
        reply.replayed
    );
    for name in SHOWN {
        match &reply.body[name] {
            serde_json::Value::Null => {}
            serde_json::Value::String(s) => text.push_str(&format!(" {name}={s}")),
            other => text.push_str(&format!(" {name}={other}")),
        }
    }
    text
}

/// The order an argument names: `#N`, or the business id it was placed under.
async fn order(client: &Client, name: &str) -> Result<i64, String> {
    if let Some(number) = name.strip_prefix('#') {
        return number
            .parse()
            .map_err(|_| format!("bad order number {name:?}"));
    }
    let row = client
        .query_opt(
            "SELECT order_id FROM spot_order WHERE tenant_id = $1 AND place_business_id = $2",
            &[&DEFAULT_TENANT, &name],
        )
        .await
        .map_err(|e| e.to_string())?;
    row.map(|r| r.get(0))
        .ok_or_else(|| format!("no order placed under business id {name:?}"))
}

/// The business ids (`key=`) of the requests the steps sent and have not had answered
/// ([`Spot::waiting`]).
#[derive(Debug, Default)]
struct InFlight(Mutex<Vec<String>>);

/// One request listed in [`InFlight`] while it lives.
struct Sent<'a>(&'a InFlight, String);

impl InFlight {
    fn keys(&self) -> std::sync::MutexGuard<'_, Vec<String>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn count(&self, key: &str) -> Sent<'_> {
        self.keys().push(key.to_string());
        Sent(self, key.to_string())
    }
}

impl Drop for Sent<'_> {
    fn drop(&mut self) {
        let mut keys = self.0.keys();
        if let Some(at) = keys.iter().position(|key| key == &self.1) {
            keys.remove(at);
        }
    }
}

/// The case's service, once `spot-service` started it.
pub struct Spot {
    database_url: String,
    log: PathBuf,
    service: ServiceSlot,
    /// Sees the service's backends wait for a lock ([`Spot::waiting`]).
    monitor: LockMonitor,
    in_flight: InFlight,
}

impl Spot {
    /// No service yet; `log` is its log once started.
    pub fn new(database_url: String, log: PathBuf) -> Spot {
        Spot {
            monitor: LockMonitor::new(database_url.clone()),
            database_url,
            log,
            service: ServiceSlot::default(),
            in_flight: InFlight::default(),
        }
    }

    /// Lets go of the service when the case ends or is cancelled: it is killed once no
    /// step task holds it any more (the handle's drop).
    pub fn end(&self) {
        self.service.end();
    }

    /// The pool `spot-service` asks for: `pool=N`, or [`POOL_SIZE`].
    ///
    /// Errors: N is not a number.
    pub fn pool(call: &Call) -> Result<usize, String> {
        call.arg("pool")
            .map_or(Ok(POOL_SIZE), str::parse)
            .map_err(|_| "pool=N".to_string())
    }

    /// Whether a `post-place`, `post-deposit`, `post-fill` or `post-cancel` in flight
    /// waits: its request has been sent (its business id is listed in flight), and every
    /// request the steps have in flight is accounted for by one paused at a fault point
    /// of the service (`GET /faults`: the points' `holding`) or by a backend of the
    /// service (`application_name` `ledger-svc`) waiting for a lock
    /// (`pg_blocking_pids`). So a second request is reported waiting only once it is
    /// itself seen waiting, not because the first is held (as the ledger's service steps
    /// do, L23). Any other call: no.
    pub async fn waiting(&self, call: &Call) -> bool {
        let requests = ["post-place", "post-deposit", "post-fill", "post-cancel"];
        if !requests.contains(&call.op.as_str()) {
            return false;
        }
        let Some(service) = self.service.current().await else {
            return false;
        };
        let in_flight = {
            let keys = self.in_flight.keys();
            let sent = keys.iter().any(|key| Some(key.as_str()) == call.arg("key"));
            if !sent {
                return false;
            }
            keys.len() as u64
        };
        self.monitor.all_waiting(&service, in_flight).await
    }

    /// Runs a spot-route operation (see the module documentation).
    ///
    /// Errors: no service yet, or it cannot start; transport errors; an unknown order.
    pub async fn run(&self, client: &Client, call: &Call) -> Result<String, String> {
        let text = |e: anyhow::Error| format!("{e:#}");
        if call.op == "spot-service" {
            let options = spot_service(ServiceOptions {
                pool_size: Spot::pool(call)?,
                fault_injection: call.arg("fault-injection") == Some("yes"),
                ..ServiceOptions::default()
            });
            let started = Service::launch(&self.database_url, self.log.clone(), options).await;
            *self.service.lock().await = Some(Arc::new(started.map_err(text)?));
            return Ok("ready".into());
        }
        // Out of the slot, so a request held at a fault point does not keep `waiting`
        // (or a release on another session) from it.
        let service = self.service.current().await;
        let service = service.ok_or("no service yet (a `spot-service` step first)")?;
        if call.op == "stop-service" {
            let service = self.service.take(service, &call.op).await?;
            let status = service.stop().await.map_err(text)?;
            return Ok(match status.code() {
                Some(code) => format!("exit={code}"),
                None => format!("{status}"),
            });
        }
        match call.op.as_str() {
            "post-place" if call.arg("give-up-when-held").is_some() => {
                give_up_when_held(&service, call).await
            }
            "post-place" if call.arg("together").is_some() => together(&service, call).await,
            "arm-fault" | "release-fault" => fault(&service, call).await,
            _ => {
                let _sent = self.in_flight.count(call.arg("key").unwrap_or_default());
                send(&service, client, call).await
            }
        }
    }
}

/// Sends a `post-*` request to `service` and prints its answer (see the module
/// documentation).
///
/// Errors: transport errors; an unknown order.
async fn send(service: &Service, client: &Client, call: &Call) -> Result<String, String> {
    let arg = |name: &str| call.arg(name).unwrap_or_default();
    let tenant = call.arg("tenant").unwrap_or(DEFAULT_TENANT);
    let timeout = Duration::from_millis(CLIENT_TIMEOUT_MS);
    let reply = match call.op.as_str() {
        "post-place" if call.arg("market").is_some() => {
            let body = json!({"market": arg("market"), "side": arg("side"),
                              "quantity": arg("qty"), "price": arg("price")});
            let path = format!("/spot/accounts/{}/orders", arg("account"));
            let request = service
                .http()
                .post(service.public_url(&path))
                .for_tenant(tenant)
                .header("idempotency-key", arg("key"))
                .header(CONTENT_TYPE, "application/json")
                .body(body.to_string())
                .timeout(timeout);
            service.send(request).await
        }
        "post-place" => {
            let (account, side, key) = (arg("account"), arg("side"), arg("key"));
            let (qty, price) = (arg("qty"), arg("price"));
            service
                .place(tenant, key, account, side, qty, price, timeout)
                .await
        }
        "post-deposit" => {
            let body = json!({"asset": arg("asset"), "amount": arg("amount")});
            let path = format!("/spot/accounts/{}/deposits", arg("account"));
            let request = service
                .http()
                .post(service.admin_url(&path))
                .for_tenant(tenant)
                .header("idempotency-key", arg("key"))
                .header(CONTENT_TYPE, "application/json")
                .body(body.to_string());
            service.send(request).await
        }
        "post-cancel" => {
            let order = order(client, arg("order")).await?;
            service
                .cancel(DEFAULT_TENANT, arg("key"), arg("account"), order)
                .await
        }
        _ => {
            let buy = order(client, arg("buy")).await?;
            let sell = order(client, arg("sell")).await?;
            service
                .fill(arg("key"), buy, sell, arg("qty"), arg("price"))
                .await
        }
    };
    Ok(shown(&reply.map_err(|e| format!("transport: {e}"))?))
}

/// `post-place … together=N` (F4): N identical placements, each built beforehand and
/// sent from a task of its own, released together by a barrier; prints how many were
/// created (201), executed (201, not replayed) and replayed, how many distinct bodies
/// they carried, then the first fresh answer.
///
/// Errors: N is not a number; a transport error.
async fn together(service: &Service, call: &Call) -> Result<String, String> {
    let arg = |name: &str| call.arg(name).unwrap_or_default();
    let n: usize = arg("together").parse().map_err(|_| "together=N")?;
    let tenant = call.arg("tenant").unwrap_or(DEFAULT_TENANT);
    let body = json!({"market": "BTC-USDT", "side": arg("side"), "quantity": arg("qty"),
                      "price": arg("price")})
    .to_string();
    let path = format!("/spot/accounts/{}/orders", arg("account"));
    let barrier = Arc::new(tokio::sync::Barrier::new(n));
    let mut tasks = Vec::new();
    for _ in 0..n {
        let request = service.authorize(
            service
                .http()
                .post(service.public_url(&path))
                .for_tenant(tenant)
                .header("idempotency-key", arg("key"))
                .header(CONTENT_TYPE, "application/json")
                .body(body.clone())
                .timeout(Duration::from_millis(CLIENT_TIMEOUT_MS)),
        );
        let request = request.build().map_err(|e| format!("{e}"))?;
        let (http, barrier) = (service.http().clone(), barrier.clone());
        tasks.push(case_kit::AbortOnDrop::spawn(async move {
            barrier.wait().await;
            let response = http.execute(request).await?;
            let (status, replayed) = (response.status().as_u16(), replayed(&response));
            Ok::<_, reqwest::Error>((status, replayed, response.text().await?))
        }));
    }
    let mut replies = Vec::new();
    for task in tasks {
        let reply = task.await.map_err(|e| e.to_string())?;
        replies.push(reply.map_err(|e| format!("transport: {e}"))?);
    }
    Ok(tally(&replies))
}

/// Whether a response says it is a replay (`Idempotent-Replayed: true`).
fn replayed(response: &reqwest::Response) -> bool {
    response
        .headers()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true")
}

/// `created=… executed=… replayed=… distinct_bodies=… | <first fresh answer>` of
/// `(status, replayed, body)` replies.
fn tally(replies: &[(u16, bool, String)]) -> String {
    let created = replies.iter().filter(|r| r.0 == 201).count();
    let fresh = replies.iter().filter(|r| r.0 == 201 && !r.1).count();
    let again = replies.iter().filter(|r| r.0 == 201 && r.1).count();
    let bodies: BTreeSet<&str> = replies.iter().map(|r| r.2.as_str()).collect();
    let mut text = format!(
        "created={created} executed={fresh} replayed={again} distinct_bodies={}",
        bodies.len()
    );
    if let Some((status, replayed, body)) = replies.iter().find(|r| !r.1) {
        let reply = Reply {
            status: *status,
            replayed: *replayed,
            body: serde_json::from_str(body).unwrap_or_default(),
        };
        text.push_str(&format!(" | {}", shown(&reply)));
    }
    text
}

/// `post-place … give-up-when-held=POINT` (see the module documentation).
async fn give_up_when_held(service: &Service, call: &Call) -> Result<String, String> {
    let arg = |name: &str| call.arg(name).unwrap_or_default();
    let timeout = Duration::from_millis(CLIENT_TIMEOUT_MS);
    let (account, side, key) = (arg("account"), arg("side"), arg("key"));
    let (qty, price) = (arg("qty"), arg("price"));
    let attempt = service.place(DEFAULT_TENANT, key, account, side, qty, price, timeout);
    let limit = Duration::from_millis(HELD_WAIT_MS);
    let point = arg("give-up-when-held");
    let gave_up = launch::lost::give_up_once_held(service, point, attempt, limit)
        .await
        .map_err(|e| format!("{e:#}"))?;
    let state = gave_up.state;
    match gave_up.answered {
        Some(reply) => Ok(format!(
            "answered: {}",
            shown(&reply.map_err(|e| e.to_string())?)
        )),
        None => Ok(format!(
            "gave up: holding={} fired={}",
            state.holding, state.fired
        )),
    }
}

/// `arm-fault` and `release-fault` (see the module documentation). A release returns
/// once the point holds nothing (looked at every [`POLL_MS`]), so a request it let go is
/// no longer counted as held ([`Spot::waiting`]).
///
/// Errors: transport; the point still holds a request [`HELD_WAIT_MS`] after the release
/// (a hang bound: the step fails rather than go on as if released).
async fn fault(service: &Service, call: &Call) -> Result<String, String> {
    let point = call.arg("point").unwrap_or_default();
    if call.op == "release-fault" {
        let released = service.release_fault(point).await;
        let released = released.map_err(|e| format!("{e:#}"))?;
        let until = Instant::now() + Duration::from_millis(HELD_WAIT_MS);
        let holding = |point| service.holding(Some(point));
        let text = |e: reqwest::Error| format!("transport: {e}");
        while holding(point).await.map_err(text)? > 0 {
            if Instant::now() >= until {
                return Err(format!(
                    "{point} still holds a request {HELD_WAIT_MS} ms after its release"
                ));
            }
            tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
        }
        return Ok(format!("released={released}"));
    }
    let fault = case_kit::spec::verbs::fault_body(&call.args)?;
    let armed = service.arm_fault(point, fault).await;
    armed.map_err(|e| format!("{e:#}"))?;
    Ok(format!("armed at {point}"))
}
