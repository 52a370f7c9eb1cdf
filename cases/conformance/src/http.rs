//! The suite's HTTP client: one request per connection, each bounded by
//! [`crate::REQUEST_TIMEOUT_MS`]; a failure is a reason (text), never an error of the
//! suite.

use std::time::Duration;

use serde_json::Value;

/// One answer as the cases see it.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// HTTP status.
    pub status: u16,
    /// `Idempotent-Replayed: true` was present.
    pub replayed: bool,
    /// The `Content-Type` (empty when absent).
    pub content_type: String,
    /// The body as text (lossy UTF-8).
    pub body: String,
}

impl Answer {
    /// The body parsed as JSON (`Null` when it is not JSON).
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }

    /// An integer member of the JSON body.
    pub fn integer(&self, name: &str) -> Option<i64> {
        self.json().get(name).and_then(Value::as_i64)
    }

    /// `201 txn_id=… replayed=…`, `409 INSUFFICIENT`: what a transcript shows of it.
    pub fn short(&self) -> String {
        let outcome = self.json()["outcome"].as_str().unwrap_or("?").to_owned();
        format!("{} {outcome}", self.status)
    }

    /// Whether the body is RFC 9457 problem details: `application/problem+json` (or
    /// JSON) with a `status` member equal to the HTTP status.
    pub fn is_problem(&self) -> bool {
        let media = self.content_type.to_ascii_lowercase();
        let json = self.json();
        (media.starts_with("application/problem+json") || media.starts_with("application/json"))
            && json["status"].as_u64() == Some(u64::from(self.status))
    }
}

/// A request's outcome: an answer, or why there is none.
pub type Reply = Result<Answer, String>;

/// The client every case uses: no connection reuse (each request its own connection, as
/// the proxy wants), no system proxy, the request bound.
///
/// Errors: the TLS-less builder cannot fail in practice; its error is passed on.
pub fn client() -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_millis(crate::REQUEST_TIMEOUT_MS))
        .build()?)
}

/// A debit request's parts; `None` leaves a header out (C7's malformed requests).
#[derive(Debug, Clone)]
pub struct Debit<'a> {
    /// The account in the path.
    pub account: &'a str,
    /// `X-Client-Id`.
    pub client: Option<&'a str>,
    /// `Idempotency-Key`.
    pub key: Option<&'a str>,
    /// `Content-Type`.
    pub content_type: Option<&'a str>,
    /// The body as sent.
    pub body: String,
}

impl<'a> Debit<'a> {
    /// A well-formed debit of `amount` (`amount=N`, form-encoded) as [`crate::CLIENT_ID`].
    pub fn new(account: &'a str, key: &'a str, amount: i64) -> Debit<'a> {
        Debit {
            account,
            client: Some(crate::CLIENT_ID),
            key: Some(key),
            content_type: Some("application/x-www-form-urlencoded"),
            body: format!("amount={amount}"),
        }
    }
}

/// `POST {base}/accounts/{account}/debits`.
pub async fn debit(http: &reqwest::Client, base: &str, debit: &Debit<'_>) -> Reply {
    let mut request = http
        .post(format!("{base}/accounts/{}/debits", debit.account))
        .body(debit.body.clone());
    if let Some(client) = debit.client {
        request = request.header("X-Client-Id", client);
    }
    if let Some(key) = debit.key {
        request = request.header("Idempotency-Key", key);
    }
    if let Some(content_type) = debit.content_type {
        request = request.header("Content-Type", content_type);
    }
    read(request).await
}

/// `GET {base}/accounts/{account}`: the balance, or why there is none.
pub async fn balance(http: &reqwest::Client, base: &str, account: &str) -> Result<i64, String> {
    let answer = read(http.get(format!("{base}/accounts/{account}"))).await?;
    match (answer.status, answer.integer("balance")) {
        (200, Some(balance)) => Ok(balance),
        (404, _) => Err(format!("{account} does not exist (404)")),
        _ => Err(format!(
            "balance read of {account} answered {} {}",
            answer.status,
            clip(&answer.body)
        )),
    }
}

/// Sends `request` and reads the whole answer.
pub async fn read(request: reqwest::RequestBuilder) -> Reply {
    let response = request.send().await.map_err(reason)?;
    let status = response.status().as_u16();
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    let replayed = header("idempotent-replayed").eq_ignore_ascii_case("true");
    let content_type = header("content-type");
    let bytes = response.bytes().await.map_err(reason)?;
    Ok(Answer {
        status,
        replayed,
        content_type,
        body: String::from_utf8_lossy(&bytes).into_owned(),
    })
}

/// A reqwest error as a reason a reader understands (timeout, refused, closed, garbage).
fn reason(error: reqwest::Error) -> String {
    let mut text = if error.is_timeout() {
        format!("no answer within {} ms", crate::REQUEST_TIMEOUT_MS)
    } else if error.is_connect() {
        "connection refused or failed".to_owned()
    } else {
        "no valid HTTP answer".to_owned()
    };
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

/// At most 120 characters of `text`, on one line.
pub fn clip(text: &str) -> String {
    let line: String = text.chars().filter(|c| !c.is_control()).take(120).collect();
    if text.chars().count() > 120 {
        format!("{line}…")
    } else {
        line
    }
}
