//! `ledger-svc` as spec steps, so a case that talks to the service over HTTP is one
//! file. The service is a resource of the case: started by a step, used by the steps
//! after it on any session, stopped by a step or, at the latest, killed when the case
//! ends (the handle's drop).
//!
//! - `call NAME: service [clients=C1,C2] [fault-injection=yes] [args=--flag,value]`
//!   starts `ledger-svc` on the case's database, in the case's transfer mode, with those
//!   `X-Client-Id`s given tokens under `./run.sh --auth`, and returns once `/readyz`
//!   answers (`launch::service::Service::launch`); prints `ready`. `auth=on|off`
//!   starts it with or without `--auth-tokens` whatever the run says; `pool=N` sets its
//!   pool size (default `launch::service::DEFAULT_POOL_SIZE`).
//! - `call NAME: post-debit account=ID amount=N key=K client=C` sends
//!   `POST /accounts/ID/debits` and prints the answer: `status=409
//!   outcome=INSUFFICIENT balance=0 replayed=false`, or for a problem (RFC 9457)
//!   `status=400 type=<problem type>`; a transport error is an error.
//!   With `give-up-when-held=POINT` the client gives up on it the moment the service is
//!   seen holding it at POINT (a lost response; `launch::lost`), printing
//!   `gave up: holding=1 fired=1`.
//!   With `order=ORD` the body carries the redemption order id (`order_id`, part of the
//!   request's fingerprint); with `token=C` it is sent exactly as built, with client
//!   `C`'s bearer token (none when the service has no tokens), `token=none` with none, `token=unknown` with one the service
//!   does not know (a `WWW-Authenticate` answer is printed as `challenge=…`); with
//!   `show=txn` the answer's transaction is named by the (client id, key) it was
//!   recorded under, `txn=app-a/k-1` (or `txn=none`), so a reply carrying another
//!   caller's transaction says so without printing an id that varies.
//! - `call NAME: post-grant account=ID amount=N key=K [client=ops]`: the admin
//!   listener's grant, printed the same way.
//! - `call NAME: arm-fault point=HOOK action=A [count=N] [hold_ms=N]`
//!   (`PUT /faults/HOOK`; needs `fault-injection=yes`; `hold_ms` bounds a pause, a hang
//!   bound only), `call NAME: release-fault point=HOOK` (prints `released=N`; with
//!   `when-waiting=N` it first waits until N backends of the service are seen waiting
//!   for a lock at one moment, and prints `waiting=N released=1`: in a `race
//!   alongside:` it releases a request held at a hook point once the others queue
//!   behind it, L8). A
//!   request held at a hook point, or whose service backend waits for a lock, is
//!   reported waiting ([`Services::waiting`]), so it shows as `<waiting ...>` until a
//!   step releases it.
//! - `call NAME: stop-service` sends SIGTERM and prints `exit=0` (or the status);
//!   `call NAME: kill-service` sends SIGKILL and prints `signal=9`.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use case_kit::spec::Call;
use launch::lock_waits::LockMonitor;
use launch::service::{Auth, CLIENT_TIMEOUT_MS, Reply, Service, ServiceOptions, ServiceSlot};
use points_ledger::TransferMode;

use reqwest::header::{CONTENT_TYPE, WWW_AUTHENTICATE};

use super::http::LedgerCalls as _;

/// Longest wait for the service to hold a request a client is to give up on; it only
/// stops a hang (the client then gives up and the state printed says `holding=0`).
const HELD_WAIT_MS: u64 = 10_000;

/// Longest wait for `release-fault … when-waiting=N` to see N backends of the service
/// wait for a lock; it only stops a hang.
const WAITERS_WAIT_MS: u64 = 60_000;
/// How often `when-waiting` looks at the service's backends.
const POLL_MS: u64 = 10;

/// A well-formed bearer token that is in no token file (`token=unknown`).
const UNKNOWN_TOKEN: &str = "not-a-listed-token-0000000000000000";

/// The service of one spec case, and what starting it needs.
pub struct Services {
    database_url: String,
    log_path: PathBuf,
    mode: TransferMode,
    service: ServiceSlot,
    /// A connection of its own to the case's database, to see the service's backends
    /// wait for a lock ([`Services::waiting`]) and name transactions.
    monitor: LockMonitor,
    /// HTTP requests sent by steps and not yet answered.
    in_flight: AtomicUsize,
}

/// A reply as a step prints it: status, outcome, balance and replay flag; a problem's
/// type instead of an outcome.
pub fn shown(reply: &Reply) -> String {
    let mut text = format!("status={}", reply.status);
    if let Some(problem) = reply.body["type"].as_str() {
        text.push_str(&format!(" type={problem}"));
    }
    if !reply.outcome().is_empty() {
        text.push_str(&format!(" outcome={}", reply.outcome()));
    }
    if let Some(balance) = reply.integer("balance") {
        text.push_str(&format!(" balance={balance}"));
    }
    text.push_str(&format!(" replayed={}", reply.replayed));
    text
}

/// One request counted in [`Services::in_flight`] while it lives.
struct InFlight<'a>(&'a AtomicUsize);

impl<'a> InFlight<'a> {
    fn count(counter: &'a AtomicUsize) -> InFlight<'a> {
        counter.fetch_add(1, Ordering::SeqCst);
        InFlight(counter)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl std::fmt::Debug for Services {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Services")
            .field("database_url", &self.database_url)
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

fn amount(call: &Call) -> Result<i64, String> {
    let text = call.arg("amount").unwrap_or_default();
    text.parse()
        .map_err(|_| format!("amount={text}: an integer number of points"))
}

/// The `POST /accounts/ID/debits` of a `post-debit` call (with its `order_id` when it
/// has `order=`), as built, before any token; bounded by `CLIENT_TIMEOUT_MS`.
///
/// Errors: `amount=` is not an integer.
fn debit_request(service: &Service, call: &Call) -> Result<reqwest::RequestBuilder, String> {
    let arg = |name: &str| call.arg(name).unwrap_or_default();
    let mut body = format!("amount={}", amount(call)?);
    if let Some(order) = call.arg("order") {
        body.push_str(&format!("&order_id={order}"));
    }
    let path = format!("/accounts/{}/debits", arg("account"));
    Ok(service
        .http()
        .post(service.public_url(&path))
        .header("x-client-id", arg("client"))
        .header("idempotency-key", arg("key"))
        .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(body)
        .timeout(std::time::Duration::from_millis(CLIENT_TIMEOUT_MS)))
}

impl Services {
    /// No service yet, for the case's database; its log goes to `log_path`.
    pub fn new(database_url: String, log_path: PathBuf, mode: TransferMode) -> Services {
        Services {
            monitor: LockMonitor::new(database_url.clone()),
            database_url,
            log_path,
            mode,
            service: ServiceSlot::default(),
            in_flight: AtomicUsize::new(0),
        }
    }

    /// The running service, if a step started one (the proxies of
    /// [`super::spec_proxy`] put themselves in front of it and send through its client).
    pub async fn current(&self) -> Option<Arc<Service>> {
        self.service.current().await
    }

    /// Lets go of the service when the case ends or is cancelled: it is killed once no
    /// step task holds it any more (the handle's drop).
    pub fn end(&self) {
        self.service.end();
    }

    /// Whether a `post-debit` or `post-grant` in flight waits: every request the steps
    /// have in flight is accounted for by one paused at a hook point of the service
    /// (`GET /faults`: the points' `holding`) or by a backend of the service
    /// (`application_name` `ledger-svc`) waiting for a lock, as the lock manager says
    /// (`pg_blocking_pids`: a `wait_event` may still read `Lock` after the lock was
    /// granted, until the waiter runs again). So a second request is reported
    /// waiting only once it is itself seen waiting, not because the first is held. Any
    /// other call: no.
    pub async fn waiting(&self, call: &Call) -> bool {
        if !["post-debit", "post-grant"].contains(&call.op.as_str()) {
            return false;
        }
        let Some(service) = self.service.current().await else {
            return false;
        };
        let in_flight = self.in_flight.load(Ordering::SeqCst) as u64;
        self.monitor.all_waiting(&service, in_flight).await
    }

    /// `release-fault point=P when-waiting=N`: waits until N backends of the service wait
    /// for a lock ([`Services::until_waiting`]), then releases P: `waiting=N released=1`.
    ///
    /// Errors: N is not a number; the monitor's query or the release fails.
    async fn release_when_waiting(&self, service: &Service, call: &Call) -> Result<String, String> {
        let arg = |name: &str| call.arg(name).unwrap_or_default();
        let wanted: u64 = arg("when-waiting")
            .parse()
            .map_err(|_| "when-waiting=N".to_string())?;
        let waiting = self
            .until_waiting(wanted)
            .await
            .map_err(|e| e.to_string())?;
        let released = service.release_fault(arg("point")).await;
        let released = released.map_err(|e| format!("{e:#}"))?;
        Ok(format!("waiting={waiting} released={released}"))
    }

    /// Polls until `wanted` backends of the service wait for a lock at one moment, or
    /// [`WAITERS_WAIT_MS`] passed (a hang bound only: the count then printed is short of
    /// `wanted`, and the transcript says so). Returns the last count seen.
    ///
    /// Errors: the monitor's query fails.
    async fn until_waiting(&self, wanted: u64) -> Result<u64, tokio_postgres::Error> {
        let deadline =
            std::time::Instant::now() + std::time::Duration::from_millis(WAITERS_WAIT_MS);
        loop {
            let waiting = self.monitor.service_lock_waits().await?;
            if waiting >= wanted || std::time::Instant::now() >= deadline {
                return Ok(waiting);
            }
            tokio::time::sleep(std::time::Duration::from_millis(POLL_MS)).await;
        }
    }

    /// Runs a service operation (see the module documentation).
    ///
    /// Errors: the service cannot start, is not running, or a request fails in transport.
    pub async fn run(&self, call: &Call) -> Result<String, String> {
        let text = |e: anyhow::Error| format!("{e:#}");
        if call.op == "service" {
            let mut slot = self.service.lock().await;
            if slot.is_some() {
                return Err("the service is already running".into());
            }
            *slot = Some(Arc::new(self.start(call).await.map_err(text)?));
            return Ok("ready".into());
        }
        // Out of the slot, so a request held at a hook point does not keep `waiting`
        // (or a release on another session) from it.
        let service = self.service.current().await;
        let service = service.ok_or("no service running (call: service)")?;
        if ["stop-service", "kill-service"].contains(&call.op.as_str()) {
            return self.stop_or_kill(call, service).await;
        }
        let arg = |name: &str| call.arg(name).unwrap_or_default();
        match call.op.as_str() {
            "post-debit" if call.arg("give-up-when-held").is_some() => {
                self.give_up_when_held(&service, call).await
            }
            "post-debit"
                if ["order", "token", "show"]
                    .iter()
                    .any(|a| call.arg(a).is_some()) =>
            {
                let _sent = InFlight::count(&self.in_flight);
                self.debit_as_written(&service, call).await
            }
            "post-debit" => {
                let _sent = InFlight::count(&self.in_flight);
                let reply = service
                    .debit_once(arg("client"), arg("key"), arg("account"), amount(call)?)
                    .await
                    .map_err(|e| format!("transport: {e}"))?;
                Ok(shown(&reply))
            }
            "post-grant" => {
                let _sent = InFlight::count(&self.in_flight);
                let client = call.arg("client").unwrap_or("ops");
                let reply = service
                    .grant(client, arg("key"), arg("account"), amount(call)?)
                    .await
                    .map_err(text)?;
                Ok(shown(&reply))
            }
            "arm-fault" => {
                let fault = case_kit::spec::verbs::fault_body(&call.args)?;
                service.arm_fault(arg("point"), fault).await.map_err(text)?;
                Ok(format!("armed at {}", arg("point")))
            }
            "release-fault" if call.arg("when-waiting").is_some() => {
                self.release_when_waiting(&service, call).await
            }
            "release-fault" => {
                let released = service.release_fault(arg("point")).await.map_err(text)?;
                Ok(format!("released={released}"))
            }
            other => Err(format!("no operation {other:?}")),
        }
    }

    /// `post-debit … give-up-when-held=POINT`: the debit is sent and the client gives up
    /// on it the moment the service is seen holding a request at POINT (armed with a
    /// `pause`; `launch::lost::give_up_once_held`), as a client timeout would, but
    /// decided by that event, not a timer. Prints `gave up: holding=1 fired=1` (the
    /// fault's state then), or the answer when it came first.
    ///
    /// Errors: the fault state cannot be read; a transport error of an answer.
    async fn give_up_when_held(&self, service: &Service, call: &Call) -> Result<String, String> {
        let arg = |name: &str| call.arg(name).unwrap_or_default();
        let attempt = service.send(debit_request(service, call)?);
        let limit = std::time::Duration::from_millis(HELD_WAIT_MS);
        let point = arg("give-up-when-held");
        let gave_up = launch::lost::give_up_once_held(service, point, attempt, limit)
            .await
            .map_err(|e| format!("{e:#}"))?;
        match gave_up.answered {
            Some(reply) => reply
                .map(|reply| format!("answered: {}", shown(&reply)))
                .map_err(|e| format!("transport: {e}")),
            None => Ok(format!(
                "gave up: holding={} fired={}",
                gave_up.state.holding, gave_up.state.fired
            )),
        }
    }

    /// A `post-debit` with `order=`, `token=` or `show=` (see the module documentation):
    /// the request built here, sent as written when `token=` is given, its answer
    /// printed with its `challenge=` and, asked for, its `txn=`.
    ///
    /// Errors: a client named by `token=` has no token; the transport's error; the
    /// transaction cannot be looked up.
    async fn debit_as_written(&self, service: &Service, call: &Call) -> Result<String, String> {
        let request = debit_request(service, call)?;
        let request = match call.arg("token") {
            None => service.authorize(request),
            Some("none") => request,
            Some("unknown") => request.bearer_auth(UNKNOWN_TOKEN),
            Some(client) => match service.token(client) {
                Some(token) => request.bearer_auth(token),
                None if !service.authenticated() => request,
                None => return Err(format!("no token for {client}: list it in clients=")),
            },
        };
        let response = request
            .send()
            .await
            .map_err(|e| format!("transport: {e}"))?;
        let challenge = response
            .headers()
            .get(WWW_AUTHENTICATE)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned);
        let status = response.status().as_u16();
        let replayed = response
            .headers()
            .get("idempotent-replayed")
            .is_some_and(|value| value == "true");
        let bytes = response
            .bytes()
            .await
            .map_err(|e| format!("transport: {e}"))?;
        let body = serde_json::from_slice(&bytes).unwrap_or_default();
        let reply = Reply {
            status,
            replayed,
            body,
        };
        let mut text = shown(&reply);
        if let Some(challenge) = challenge {
            text.push_str(&format!(" challenge={challenge}"));
        }
        if call.arg("show") == Some("txn") {
            let named = self.txn_named(reply.integer("txn_id")).await;
            text.push_str(&format!(" txn={}", named.map_err(|e| e.to_string())?));
        }
        Ok(text)
    }

    /// The (client id, key) the transaction `txn_id` was recorded under, as
    /// `client/key`; `none` for no transaction.
    ///
    /// Errors: the lookup fails.
    async fn txn_named(&self, txn_id: Option<i64>) -> Result<String, tokio_postgres::Error> {
        let Some(txn_id) = txn_id else {
            return Ok("none".into());
        };
        let rows = self
            .monitor
            .connection()
            .await?
            .query(
                "SELECT client_id || '/' || idem_key FROM ledger_txn WHERE txn_id = $1",
                &[&txn_id],
            )
            .await?;
        Ok(rows
            .first()
            .map_or("unrecorded".into(), |row| row.get::<_, String>(0)))
    }

    /// `stop-service` (SIGTERM, `exit=0`) or `kill-service` (SIGKILL, `signal=9`).
    ///
    /// Errors: a request of another session still holds the service.
    async fn stop_or_kill(&self, call: &Call, service: Arc<Service>) -> Result<String, String> {
        let service = self.service.take(service, &call.op).await?;
        let text = |e: anyhow::Error| format!("{e:#}");
        if call.op == "stop-service" {
            let status = service.stop().await.map_err(text)?;
            return Ok(status
                .code()
                .map_or(status.to_string(), |c| format!("exit={c}")));
        }
        use std::os::unix::process::ExitStatusExt as _;
        let status = service.kill().map_err(text)?;
        let signal = status.signal().map_or("none".into(), |s| s.to_string());
        Ok(format!("signal={signal}"))
    }

    async fn start(&self, call: &Call) -> anyhow::Result<Service> {
        let list = |name: &str| -> Vec<String> {
            call.arg(name)
                .map(|v| v.split(',').map(String::from).collect())
                .unwrap_or_default()
        };
        let mut options = ServiceOptions {
            fault_injection: call.arg("fault-injection") == Some("yes"),
            extra_args: list("args"),
            ..ServiceOptions::default()
        };
        options.auth = match call.arg("auth") {
            None => Auth::FromRun,
            Some("on") => Auth::On,
            Some("off") => Auth::Off,
            Some(other) => anyhow::bail!("auth=on|off, not {other:?}"),
        };
        if let Some(pool) = call.arg("pool") {
            options.pool_size = pool.parse().map_err(|_| anyhow::anyhow!("pool=N"))?;
        }
        options.clients = list("clients");
        if self.mode != TransferMode::Statements
            && !options.extra_args.iter().any(|a| a == "--transfer-mode")
        {
            let mode = ["--transfer-mode".to_owned(), self.mode.as_str().to_owned()];
            options.extra_args.extend(mode);
        }
        Service::launch(&self.database_url, self.log_path.clone(), options).await
    }
}
