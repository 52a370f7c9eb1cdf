//! `ledger-svc`'s spot routes as spec steps, for a case whose claim is about the routes
//! (F11: what a client sends and what status it gets back):
//!
//! - `spot-service` starts `ledger-svc` on the case's database
//!   (`launch::service::Service::launch`, the spot clients of [`super::spot::spot_service`],
//!   a pool of [`POOL_SIZE`]): `ready`; killed when the case ends if no step stopped it;
//! - `post-place account=A side=BUY qty=… price=… key=K` (public listener),
//!   `post-deposit account=A asset=USDT amount=… key=K` (admin listener) and
//!   `post-fill buy=ORDER sell=ORDER qty=… price=… key=K` (admin) send the request as
//!   typed, the text not parsed here, and print the answer: `status=201 outcome=OK
//!   replayed=false` and the body's figures (`order_id`, `frozen`, `fee_reserve`,
//!   `notional`, `buyer_fee`, …), or `status=400 outcome=BAD_REQUEST detail=…`;
//!   an order is named by its number (`#3`) or the business id it was placed under;
//! - `post-place … give-up-when-held=POINT`: the client gives up on the placement the
//!   moment the service is seen holding it at POINT (armed with a `pause`;
//!   `launch::lost::give_up_once_held`), as a timeout would but decided by that event:
//!   `gave up: holding=1 fired=1` (F7's lost response);
//! - `spot-service fault-injection=yes` enables the fault routes: `arm-fault
//!   point=spot-after-commit action=pause [count=N] [hold_ms=N]` (`armed at POINT`) and
//!   `release-fault point=POINT` (`released=N`);
//! - `stop-service` sends SIGTERM: `exit=0` when it ended with status 0.

use case_kit::spec::Call;
use frozen_balances::DEFAULT_TENANT;
use launch::service::{Reply, Service, ServiceOptions};
use reqwest::header::CONTENT_TYPE;
use serde_json::json;
use tokio_postgres::Client;

use super::spot::{ForTenant, SpotCalls, spot_service};

/// The pool of the case's service.
pub const POOL_SIZE: usize = 2;

/// The body members printed after the status, in this order, when present.
const SHOWN: [&str; 11] = [
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
    "detail",
];

/// Longest wait for the service to be seen holding a request at a fault point, ms (a
/// hang bound: `give-up-when-held` then reports `holding=0`).
pub const HELD_WAIT_MS: u64 = 10_000;

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

/// The case's service, once `spot-service` started it.
pub struct Spot {
    database_url: String,
    log: std::path::PathBuf,
    service: tokio::sync::Mutex<Option<Service>>,
}

impl Spot {
    /// No service yet; `log` is its log once started.
    pub fn new(database_url: String, log: std::path::PathBuf) -> Spot {
        Spot {
            database_url,
            log,
            service: tokio::sync::Mutex::new(None),
        }
    }

    /// Kills the service now (its handle's drop), when the case ends or is cancelled.
    pub fn end(&self) {
        if let Ok(mut service) = self.service.try_lock() {
            service.take();
        }
    }

    /// Runs a spot-route operation (see the module documentation).
    ///
    /// Errors: no service yet, or it cannot start; transport errors; an unknown order.
    pub async fn run(&self, client: &Client, call: &Call) -> Result<String, String> {
        let text = |e: anyhow::Error| format!("{e:#}");
        let mut slot = self.service.lock().await;
        if call.op == "spot-service" {
            let options = spot_service(ServiceOptions {
                pool_size: POOL_SIZE,
                fault_injection: call.arg("fault-injection") == Some("yes"),
                ..ServiceOptions::default()
            });
            let started = Service::launch(&self.database_url, self.log.clone(), options).await;
            *slot = Some(started.map_err(text)?);
            return Ok("ready".into());
        }
        let service = slot
            .take()
            .ok_or("no service yet (a `spot-service` step first)")?;
        if call.op == "stop-service" {
            let status = service.stop().await.map_err(text)?;
            return Ok(match status.code() {
                Some(code) => format!("exit={code}"),
                None => format!("{status}"),
            });
        }
        let result = self.send(&service, client, call).await;
        *slot = Some(service);
        result
    }

    /// Sends a request or a fault command to `service` (see the module documentation).
    async fn send(
        &self,
        service: &Service,
        client: &Client,
        call: &Call,
    ) -> Result<String, String> {
        let arg = |name: &str| call.arg(name).unwrap_or_default();
        let timeout = std::time::Duration::from_millis(launch::service::CLIENT_TIMEOUT_MS);
        let reply = match call.op.as_str() {
            "post-place" if call.arg("give-up-when-held").is_some() => {
                return give_up_when_held(service, call).await;
            }
            "arm-fault" | "release-fault" => return fault(service, call).await,
            "post-place" => {
                let (account, side, key) = (arg("account"), arg("side"), arg("key"));
                let (qty, price) = (arg("qty"), arg("price"));
                service
                    .place(DEFAULT_TENANT, key, account, side, qty, price, timeout)
                    .await
            }
            "post-deposit" => {
                let body = json!({"asset": arg("asset"), "amount": arg("amount")});
                let path = format!("/spot/accounts/{}/deposits", arg("account"));
                let request = service
                    .http()
                    .post(service.admin_url(&path))
                    .for_tenant(DEFAULT_TENANT)
                    .header("idempotency-key", arg("key"))
                    .header(CONTENT_TYPE, "application/json")
                    .body(body.to_string());
                service.send(request).await
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
}

/// `post-place … give-up-when-held=POINT` (see the module documentation).
async fn give_up_when_held(service: &Service, call: &Call) -> Result<String, String> {
    let arg = |name: &str| call.arg(name).unwrap_or_default();
    let timeout = std::time::Duration::from_millis(launch::service::CLIENT_TIMEOUT_MS);
    let (account, side, key) = (arg("account"), arg("side"), arg("key"));
    let (qty, price) = (arg("qty"), arg("price"));
    let attempt = service.place(DEFAULT_TENANT, key, account, side, qty, price, timeout);
    let limit = std::time::Duration::from_millis(HELD_WAIT_MS);
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

/// `arm-fault` and `release-fault` (see the module documentation).
async fn fault(service: &Service, call: &Call) -> Result<String, String> {
    let arg = |name: &str| call.arg(name).unwrap_or_default();
    if call.op == "release-fault" {
        let released = service.release_fault(arg("point")).await;
        return Ok(format!(
            "released={}",
            released.map_err(|e| format!("{e:#}"))?
        ));
    }
    let mut fault = json!({ "action": arg("action") });
    for name in ["count", "hold_ms"] {
        if let Some(value) = call.arg(name) {
            let value: u64 = value.parse().map_err(|_| format!("{name}=N"))?;
            fault[name] = value.into();
        }
    }
    let armed = service.arm_fault(arg("point"), fault).await;
    armed.map_err(|e| format!("{e:#}"))?;
    Ok(format!("armed at {}", arg("point")))
}
