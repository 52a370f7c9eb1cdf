//! Response bodies: JSON for results, RFC 9457 problem details for everything else.
//!
//! Every problem carries an `outcome` member (SPEC §4) so that a client can tell
//! "insufficient" from any other 409 without parsing text. A problem's `detail` is
//! written here, from the request and the outcome; a driver's error text never goes
//! into a response (it is logged to stderr instead).

use http_body_util::Full;
use hyper::Response;
use hyper::StatusCode;
use hyper::body::Bytes;
use hyper::header::{ALLOW, CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use serde_json::{Map, Value, json};

/// The response type of every handler.
pub type HttpResponse = Response<Full<Bytes>>;

/// Name of the header that marks a replayed result (our own header; the IETF draft
/// defines none).
pub const REPLAYED_HEADER: &str = "idempotent-replayed";

/// `Retry-After` of every 503, seconds (RFC 9110 §10.2.3): the request may be retried
/// with the same key after this.
pub const RETRY_AFTER_S: u64 = 1;

/// What the request log reports about a response, kept in the response's extensions
/// (never sent): its `outcome` member and, for an executed or replayed transfer, the txn id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Facts {
    /// The `outcome` member, e.g. `"OK"`; `"-"` for a body without one (health, faults).
    pub outcome: &'static str,
    /// The `txn_id` member, when there is one.
    pub txn_id: Option<i64>,
}

/// The facts of `response`, as set by [`Problem::into_response`] or [`with_facts`].
pub fn facts(response: &HttpResponse) -> Facts {
    response
        .extensions()
        .get::<Facts>()
        .copied()
        .unwrap_or(Facts {
            outcome: "-",
            txn_id: None,
        })
}

/// Attaches the request log's facts to `response`.
pub fn with_facts(
    mut response: HttpResponse,
    outcome: ApiOutcome,
    txn_id: Option<i64>,
) -> HttpResponse {
    response.extensions_mut().insert(Facts {
        outcome: outcome.as_str(),
        txn_id,
    });
    response
}

/// The `outcome` member of a body (SPEC §4), plus `UNKNOWN` for server-side failures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiOutcome {
    /// The transfer executed (or a replay of one that did).
    Ok,
    /// Refused: balance too low (409).
    Insufficient,
    /// Refused: no such account (404).
    NoAccount,
    /// The key was first used for a different payload (422); nothing recorded.
    KeyReused,
    /// The key's record expired (retention) or was removed; it is never executed again
    /// (422, naming the original `txn_id`); nothing recorded.
    KeyExpired,
    /// Any client error (400, 404 route, 405, 413, 415); nothing recorded.
    BadRequest,
    /// The service failed (5xx): the request may or may not have executed; a retry with
    /// the same key settles it.
    Unknown,
    /// Spot (SPEC §8): the order named by a fill or cancel is no longer open (409,
    /// recorded and replayed).
    OrderClosed,
    /// Spot: no such order for this tenant and account (404, not recorded).
    NoOrder,
    /// Spot: a fill that does not fit its orders (422, not recorded).
    FillRejected,
    /// Spot: the account holds no balance row of the asset a placement would freeze
    /// (404, not recorded, no row created).
    NoBalance,
    /// Spot: the account is on hold for the asset (a reversed network deposit's shortfall
    /// outstanding; 409, not recorded).
    OnHold,
    /// No known bearer token (401, `--auth-tokens` only); nothing recorded.
    Unauthenticated,
    /// The token's caller may not do this: another client's `X-Client-Id`, or the admin
    /// listener without an admin token (403, `--auth-tokens` only); nothing recorded.
    Forbidden,
}

impl ApiOutcome {
    /// The spelling in a body, e.g. `"KEY_REUSED"`.
    pub fn as_str(self) -> &'static str {
        match self {
            ApiOutcome::Ok => "OK",
            ApiOutcome::Insufficient => "INSUFFICIENT",
            ApiOutcome::NoAccount => "NO_ACCOUNT",
            ApiOutcome::KeyReused => "KEY_REUSED",
            ApiOutcome::KeyExpired => "KEY_EXPIRED",
            ApiOutcome::BadRequest => "BAD_REQUEST",
            ApiOutcome::Unknown => "UNKNOWN",
            ApiOutcome::OrderClosed => "ORDER_CLOSED",
            ApiOutcome::NoOrder => "NO_ORDER",
            ApiOutcome::FillRejected => "FILL_REJECTED",
            ApiOutcome::NoBalance => "NO_BALANCE",
            ApiOutcome::OnHold => "ON_HOLD",
            ApiOutcome::Unauthenticated => "UNAUTHENTICATED",
            ApiOutcome::Forbidden => "FORBIDDEN",
        }
    }
}

/// An RFC 9457 problem: `type`, `title`, `status`, `detail`, plus `outcome` and any
/// extension members (`account_id`, `amount`, `balance`).
#[derive(Debug, Clone)]
pub struct Problem {
    status: StatusCode,
    kind: &'static str,
    title: &'static str,
    detail: String,
    outcome: ApiOutcome,
    extensions: Map<String, Value>,
    allow: Option<&'static str>,
}

impl Problem {
    /// A problem with status, a type slug (becomes `urn:ledger:problem:<slug>`), a title
    /// (fixed per type), a detail for this occurrence, and its outcome.
    pub fn new(
        status: StatusCode,
        kind: &'static str,
        title: &'static str,
        detail: impl Into<String>,
        outcome: ApiOutcome,
    ) -> Problem {
        Problem {
            status,
            kind,
            title,
            detail: detail.into(),
            outcome,
            extensions: Map::new(),
            allow: None,
        }
    }

    /// 400, outcome `BAD_REQUEST`.
    pub fn bad_request(detail: impl Into<String>) -> Problem {
        Problem::new(
            StatusCode::BAD_REQUEST,
            "bad-request",
            "Malformed request",
            detail,
            ApiOutcome::BadRequest,
        )
    }

    /// 404 for a path that names no route, outcome `BAD_REQUEST`.
    pub fn no_route(path: &str) -> Problem {
        Problem::new(
            StatusCode::NOT_FOUND,
            "no-route",
            "No such route",
            format!("nothing is served at {path}"),
            ApiOutcome::BadRequest,
        )
    }

    /// 405 with an `Allow` header, outcome `BAD_REQUEST`.
    pub fn wrong_method(method: &hyper::Method, allow: &'static str) -> Problem {
        let mut problem = Problem::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method-not-allowed",
            "Method not allowed",
            format!("{method} is not allowed here; allowed: {allow}"),
            ApiOutcome::BadRequest,
        );
        problem.allow = Some(allow);
        problem
    }

    /// 413, outcome `BAD_REQUEST`.
    pub fn too_large(limit_bytes: usize) -> Problem {
        Problem::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body-too-large",
            "Request body too large",
            format!("the request body exceeds {limit_bytes} bytes"),
            ApiOutcome::BadRequest,
        )
    }

    /// 415, outcome `BAD_REQUEST`.
    pub fn unsupported_media_type() -> Problem {
        Problem::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported-media-type",
            "Unsupported media type",
            "Content-Type must be application/x-www-form-urlencoded or application/json",
            ApiOutcome::BadRequest,
        )
    }

    /// 503, outcome `UNKNOWN`, with `Retry-After: 1` ([`RETRY_AFTER_S`]): the database could
    /// not be reached, a wait ran out (lock, statement, pool) or the session was ended.
    pub fn unavailable() -> Problem {
        Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "Ledger unavailable",
            "the ledger could not complete the request; it may or may not have taken \
             effect: retry with the same Idempotency-Key to learn its result",
            ApiOutcome::Unknown,
        )
    }

    /// 503 `request-timeout`, outcome `UNKNOWN`, with `Retry-After`: the request's bound
    /// (`--request-timeout-ms`, `super::bound`) ran out before it could complete; what it
    /// had begun was rolled back, so nothing was recorded, and a retry with the same key
    /// executes it afresh. `bound_ms` is the bound, carried as `request_timeout_ms`.
    pub fn bound_ran_out(bound_ms: u64) -> Problem {
        Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "request-timeout",
            "Request bound ran out",
            format!(
                "the request could not complete within its bound of {bound_ms} ms (it waited \
                 for a connection or a lock); it was rolled back and nothing was recorded: \
                 retry with the same Idempotency-Key"
            ),
            ApiOutcome::Unknown,
        )
        .with("request_timeout_ms", bound_ms)
    }

    /// 500, outcome `UNKNOWN`: an internal error (details only in the service's log).
    pub fn internal() -> Problem {
        Problem::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "Internal error",
            "the ledger failed while handling the request; it may or may not have taken \
             effect: retry with the same Idempotency-Key to learn its result",
            ApiOutcome::Unknown,
        )
    }

    /// Adds an extension member.
    pub fn with(mut self, name: &str, value: impl Into<Value>) -> Problem {
        self.extensions.insert(name.to_owned(), value.into());
        self
    }

    /// The response: `application/problem+json` with the members above.
    pub fn into_response(self) -> HttpResponse {
        let mut body = Map::new();
        body.insert(
            "type".into(),
            json!(format!("urn:ledger:problem:{}", self.kind)),
        );
        body.insert("title".into(), json!(self.title));
        body.insert("status".into(), json!(self.status.as_u16()));
        body.insert("detail".into(), json!(self.detail));
        body.insert("outcome".into(), json!(self.outcome.as_str()));
        body.extend(self.extensions);
        let txn_id = body.get("txn_id").and_then(Value::as_i64);
        let mut response = with_facts(
            body_response(
                self.status,
                "application/problem+json",
                &Value::Object(body),
            ),
            self.outcome,
            txn_id,
        );
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            response
                .headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from(RETRY_AFTER_S));
        }
        if let Some(allow) = self.allow {
            response
                .headers_mut()
                .insert(ALLOW, HeaderValue::from_static(allow));
        }
        response
    }
}

/// A JSON response (`application/json`).
pub fn json_response(status: StatusCode, body: &Value) -> HttpResponse {
    body_response(status, "application/json", body)
}

fn body_response(status: StatusCode, content_type: &'static str, body: &Value) -> HttpResponse {
    let mut text = body.to_string();
    text.push('\n');
    let mut response = Response::new(Full::new(Bytes::from(text)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// Marks `response` as a replayed result (`Idempotent-Replayed: true`).
pub fn mark_replayed(response: &mut HttpResponse) {
    response
        .headers_mut()
        .insert(REPLAYED_HEADER, HeaderValue::from_static("true"));
}
