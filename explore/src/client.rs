//! The clients: each runs its seeded schedule ([`crate::plan::ClientPlan`]) in a closed
//! loop, one operation at a time, retrying an unknown outcome with the same key after a
//! pause, at most the operation's planned number of attempts, and recording every
//! attempt in the history. All HTTP to the service goes through [`Gateway`].

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use launch::service::{Reply, Service};
use reqwest::header::CONTENT_TYPE;

use crate::history::{Completion, Event, HistoryWriter};
use crate::plan::{ClientPlan, Kind, PlannedOp};

/// Per-attempt timeout of the clients, milliseconds: after it the outcome is unknown.
pub const CLIENT_TIMEOUT_MS: u64 = 1_000;
/// Interval between two looks for a running service while none is up, milliseconds.
const ENDPOINT_POLL_MS: u64 = 10;

/// Where the service is right now: its HTTP client (`launch::service`'s, so whatever the kit adds
/// to every request reaches ours) and its two listeners.
pub struct Endpoint {
    http: reqwest::Client,
    public: String,
    admin: String,
    /// Client id → bearer token, when the service authenticates (empty otherwise).
    tokens: BTreeMap<String, String>,
}

/// The one place the explorer's requests to the service are built and sent. The nemesis
/// swaps the endpoint when it restarts the service (new ports); while the service is
/// down there is none, and clients wait.
#[derive(Default)]
pub struct Gateway {
    current: RwLock<Option<Arc<Endpoint>>>,
}

impl Gateway {
    /// Points the gateway at `service`, or at nothing while it is down.
    pub fn set(&self, service: Option<&Service>) {
        let endpoint = service.map(|service| {
            Arc::new(Endpoint {
                http: service.http().clone(),
                public: service.public_url(""),
                admin: service.admin_url(""),
                tokens: service
                    .tokens()
                    .map(|(client, token)| (client.to_owned(), token.to_owned()))
                    .collect(),
            })
        });
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = endpoint;
    }

    /// The current endpoint, if the service is up.
    pub fn current(&self) -> Option<Arc<Endpoint>> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Sends `op` once to `endpoint`: a debit on the public listener or a grant on the
    /// admin one, `{"amount": N}` as JSON, with its client id and key (and the client's
    /// bearer token when the service authenticates), bounded by [`CLIENT_TIMEOUT_MS`].
    ///
    /// Errors: the transport's (`is_timeout`, `is_connect`, or a closed connection).
    pub async fn send(&self, endpoint: &Endpoint, op: &PlannedOp) -> Result<Reply, reqwest::Error> {
        let url = match op.payload.kind {
            Kind::Debit => format!("{}/accounts/{}/debits", endpoint.public, op.payload.account),
            Kind::Grant => format!("{}/accounts/{}/grants", endpoint.admin, op.payload.account),
        };
        let mut request = endpoint
            .http
            .post(url)
            .timeout(Duration::from_millis(CLIENT_TIMEOUT_MS))
            .header("x-client-id", &op.client_id)
            .header("idempotency-key", &op.key)
            .header(CONTENT_TYPE, "application/json")
            .body(format!("{{\"amount\": {}}}", op.payload.amount));
        if let Some(token) = endpoint.tokens.get(&op.client_id) {
            request = request.bearer_auth(token);
        }
        launch::service::read_reply(request).await
    }
}

/// Running counts for the status lines and the summary.
#[derive(Default)]
pub struct Counters {
    /// Operations invoked (first attempts).
    pub ops: AtomicU64,
    /// Attempts sent.
    pub attempts: AtomicU64,
    /// Attempts that ended `ok`.
    pub ok: AtomicU64,
    /// Attempts that ended `fail`.
    pub fail: AtomicU64,
    /// Attempts that ended `info`.
    pub info: AtomicU64,
}

/// What one attempt's answer means for the history.
enum Verdict {
    Ok,
    Fail,
    Info,
    /// The connection could not be made, so nothing was sent: recorded as `fail`, and
    /// retried like an unknown outcome (the service may be restarting).
    Unsent,
}

/// The history's reading of a reply: 201 `ok`; 409, 404, 422 and 408 `fail` (recorded
/// refusal, key conflict, body too slow: nothing executed by this attempt); 5xx `info`;
/// any other status `fail` (the checker flags it as unexpected).
fn classify_status(status: u16) -> Verdict {
    match status {
        201 => Verdict::Ok,
        500..=599 => Verdict::Info,
        _ => Verdict::Fail,
    }
}

/// The history's reading of a transport error, and its class: a connection that could
/// not be made sent nothing (`connect`); a timeout (`timeout`) or a connection that ended
/// without an answer (`closed`) leaves the outcome unknown.
fn classify_error(error: &reqwest::Error) -> (Verdict, &'static str) {
    if error.is_connect() {
        (Verdict::Unsent, "connect")
    } else if error.is_timeout() {
        (Verdict::Info, "timeout")
    } else {
        (Verdict::Info, "closed")
    }
}

/// Runs client `client` until `deadline`: operations from its schedule, attempts and
/// retries, each recorded. No new attempt starts after the deadline (an unknown outcome
/// then stays `info`: the client gives up).
pub async fn run_client(
    seed: u64,
    client: u32,
    deadline: Instant,
    gateway: Arc<Gateway>,
    history: Arc<HistoryWriter>,
    counters: Arc<Counters>,
    invoked: Arc<std::sync::Mutex<Vec<PlannedOp>>>,
) {
    let run = ClientRun {
        client,
        deadline,
        gateway,
        history,
        counters,
        invoked,
    };
    let mut plan = ClientPlan::new(seed, client);
    while Instant::now() < deadline {
        let op = plan.next().expect("the schedule is endless");
        if run.operation(&op).await.is_break() {
            break;
        }
    }
}

/// One client's run: its number, its deadline, and what it shares with the others.
struct ClientRun {
    client: u32,
    deadline: Instant,
    gateway: Arc<Gateway>,
    history: Arc<HistoryWriter>,
    counters: Arc<Counters>,
    invoked: Arc<std::sync::Mutex<Vec<PlannedOp>>>,
}

impl ClientRun {
    /// Runs `op`: attempts under its key, after a pause between two, until one is
    /// acknowledged or refused, its planned attempts are used up, or the deadline has
    /// passed. `Break` when the deadline passed while the service was down (the
    /// client stops).
    async fn operation(&self, op: &PlannedOp) -> ControlFlow<()> {
        let mut sent_any = false;
        for attempt in 1..=op.max_attempts {
            if attempt > 1 {
                tokio::time::sleep(Duration::from_millis(op.backoff_ms)).await;
            }
            let Some(endpoint) = wait_for_endpoint(&self.gateway, self.deadline).await else {
                return ControlFlow::Break(());
            };
            if !sent_any {
                sent_any = true;
                self.counters.ops.fetch_add(1, Ordering::Relaxed);
                self.invoked
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(op.clone());
            }
            self.counters.attempts.fetch_add(1, Ordering::Relaxed);
            let retry = match self.attempt(&endpoint, op, attempt).await {
                Verdict::Ok => {
                    self.counters.ok.fetch_add(1, Ordering::Relaxed);
                    false
                }
                Verdict::Fail => {
                    self.counters.fail.fetch_add(1, Ordering::Relaxed);
                    false
                }
                Verdict::Unsent => {
                    self.counters.fail.fetch_add(1, Ordering::Relaxed);
                    true
                }
                Verdict::Info => {
                    self.counters.info.fetch_add(1, Ordering::Relaxed);
                    true
                }
            };
            if !retry || Instant::now() >= self.deadline {
                break;
            }
        }
        ControlFlow::Continue(())
    }

    /// Sends attempt `attempt` of `op` to `endpoint` and records it: its `invoke`, then
    /// its `ok`, `fail` or `info` with the reply or the transport's error class
    /// (`connect`, `timeout`, `closed`). Returns how it ended.
    async fn attempt(&self, endpoint: &Endpoint, op: &PlannedOp, attempt: u32) -> Verdict {
        let client = self.client;
        self.history.record(|t_us| Event::Invoke {
            t_us,
            client,
            op: op.index,
            attempt,
            client_id: op.client_id.clone(),
            key: op.key.clone(),
            payload: op.payload.clone(),
            reuse_of: op.reuse_of,
        });
        let (verdict, status, replayed, body, error) = match self.gateway.send(endpoint, op).await {
            Ok(reply) => (
                classify_status(reply.status),
                Some(reply.status),
                reply.replayed,
                reply.body,
                None,
            ),
            Err(error) => {
                let (verdict, class) = classify_error(&error);
                (verdict, None, false, serde_json::Value::Null, Some(class))
            }
        };
        let completion = Completion {
            t_us: 0,
            client,
            op: op.index,
            attempt,
            status,
            replayed,
            body,
            error: error.map(str::to_owned),
        };
        self.history.record(|t_us| {
            let c = Completion { t_us, ..completion };
            match verdict {
                Verdict::Ok => Event::Ok(c),
                Verdict::Fail | Verdict::Unsent => Event::Fail(c),
                Verdict::Info => Event::Info(c),
            }
        });
        verdict
    }
}

/// The current endpoint, waiting while the service is down; `None` once `deadline`
/// has passed.
async fn wait_for_endpoint(gateway: &Gateway, deadline: Instant) -> Option<Arc<Endpoint>> {
    loop {
        if Instant::now() >= deadline {
            return None;
        }
        if let Some(endpoint) = gateway.current() {
            return Some(endpoint);
        }
        tokio::time::sleep(Duration::from_millis(ENDPOINT_POLL_MS)).await;
    }
}
