//! One structured log line per request, through `tracing` (target `ledger_svc::request`,
//! level INFO; `RUST_LOG` filters it, e.g. `RUST_LOG=ledger_svc::request=off`).
//!
//! Fields: `listener`, `method`, `route` (the route's template, e.g.
//! `/accounts/{id}/debits`, or the raw path when no route matched), `caller` (the client
//! id a bearer token authenticated, with `--auth-tokens`; `-` otherwise: never the token
//! or its hash), `client_id` and `key`
//! (`-` when the request had none or did not get that far), `status` (`none` when no
//! response was written: a fault closed the connection, or the client went away first),
//! `outcome` (the body's `outcome` member, `-` for bodies without one), `replayed`,
//! `txn_id` (`-` when none), `duration_ms`, and `client_gone` (true when the client had
//! gone away before the response could be handed to it).
//!
//! A transfer runs in a task of its own that outlives a departed client, and logs the
//! line itself when it ends, so a debit committed after its client hung up is logged with
//! its real status and `client_gone=true`. A request dropped before it reached the
//! database (the client left while its body was being read) is logged when it is dropped,
//! with `status=none client_gone=true`.

use std::time::Instant;

use super::listener::Listener;
use super::problem::{HttpResponse, REPLAYED_HEADER, facts};

/// The tracing target of the request lines.
pub const REQUEST_TARGET: &str = "ledger_svc::request";

/// The pending log line of one request; written by [`RequestLog::finish`], or on drop as
/// a request whose client went away.
pub struct RequestLog {
    listener: Listener,
    method: String,
    route: String,
    caller: Option<String>,
    client_id: Option<String>,
    key: Option<String>,
    started: Instant,
    written: bool,
}

impl RequestLog {
    /// Starts the clock for a request on `listener`.
    pub fn new(listener: Listener, method: &hyper::Method, path: &str) -> RequestLog {
        RequestLog {
            listener,
            method: method.to_string(),
            route: path.to_owned(),
            caller: None,
            client_id: None,
            key: None,
            started: Instant::now(),
            written: false,
        }
    }

    /// Names the route by its template (`/accounts/{id}/debits`).
    pub fn route(&mut self, template: &str) {
        self.route = template.to_owned();
    }

    /// Records the client id the request's bearer token authenticated.
    pub fn caller(&mut self, client_id: &str) {
        self.caller = Some(client_id.to_owned());
    }

    /// Records the request's client id and idempotency key.
    pub fn identify(&mut self, client_id: &str, key: &str) {
        self.client_id = Some(client_id.to_owned());
        self.key = Some(key.to_owned());
    }

    /// Writes the line for `response` (`None`: the connection was closed without one);
    /// `client_gone` when the client had left before it could be handed over.
    pub fn finish(mut self, response: Option<&HttpResponse>, client_gone: bool) {
        self.write(response.map(Summary::of), client_gone);
    }

    /// [`RequestLog::finish`] from a [`Summary`] taken before the response was handed on.
    pub fn finish_summary(mut self, summary: Option<Summary>, client_gone: bool) {
        self.write(summary, client_gone);
    }

    fn write(&mut self, summary: Option<Summary>, client_gone: bool) {
        self.written = true;
        let status = summary.map_or_else(|| "none".to_owned(), |s| s.status.to_string());
        let txn_id = summary
            .and_then(|s| s.facts.txn_id)
            .map_or_else(|| "-".to_owned(), |id| id.to_string());
        tracing::info!(
            target: REQUEST_TARGET,
            listener = ?self.listener,
            method = %self.method,
            route = %self.route,
            caller = %self.caller.as_deref().unwrap_or("-"),
            client_id = %self.client_id.as_deref().unwrap_or("-"),
            key = %self.key.as_deref().unwrap_or("-"),
            status = %status,
            outcome = %summary.map_or("-", |s| s.facts.outcome),
            replayed = summary.is_some_and(|s| s.replayed),
            txn_id = %txn_id,
            duration_ms = self.started.elapsed().as_millis() as u64,
            client_gone,
            "request"
        );
    }
}

/// What the log line says about a response.
#[derive(Debug, Clone, Copy)]
pub struct Summary {
    status: u16,
    facts: super::problem::Facts,
    replayed: bool,
}

impl Summary {
    /// The status, facts and replay mark of `response`.
    pub fn of(response: &HttpResponse) -> Summary {
        Summary {
            status: response.status().as_u16(),
            facts: facts(response),
            replayed: response.headers().contains_key(REPLAYED_HEADER),
        }
    }
}

impl Drop for RequestLog {
    fn drop(&mut self) {
        if !self.written {
            self.write(None, true);
        }
    }
}

/// Installs the `tracing` subscriber: plain text lines on stderr (no colours), filtered
/// by `RUST_LOG` (default `info`).
pub fn init() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
}
