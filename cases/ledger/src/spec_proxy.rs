//! A retrying proxy and the naive keyless endpoint as spec steps (L17), so a network
//! fault between a client and the service is one file. Each is a resource of the case,
//! like the service ([`super::spec_service`]): started by a step, used by the steps after
//! it, dropped (its tasks aborted, its listener closed) when the case ends.
//!
//! - `call NAME: proxy to=service|keyless [upstream-retries=N]` starts a TCP proxy
//!   (`launch::proxy`, HTTP/1.1) in front of the running `ledger-svc`'s public listener,
//!   or in front of the keyless endpoint (started then, on a connection of its own to the
//!   case's database); the proxy sends a request again, on its own, up to N more times
//!   (default 1) when the upstream connection drops without an answer or answers 502.
//!   Prints `proxy to service: upstream_retries=1`.
//! - `call NAME: cut-answers to=service|keyless [count=N]`: that proxy withholds its
//!   next N complete answers (closes the client's connection instead): `cut next 1`.
//! - `call NAME: keyless-drop [count=N]`: the keyless endpoint's next N debits commit,
//!   then their connection closes without an answer (what the service's `after-commit`
//!   `close` fault does): `drop next 1`.
//! - `call NAME: proxy-debit to=service|keyless account=ID amount=N client=C [key=K]
//!   [retry=on-no-answer]` sends `POST /accounts/ID/debits` through that proxy, with an
//!   `Idempotency-Key` when `key` is given, and prints the answer as `post-debit` does
//!   (`status=201 outcome=OK balance=70 replayed=true`) and the proxy's own retries for
//!   it (`proxy_retries=1`), or `no answer: connection closed` (`no answer: timeout`).
//!   With `retry=on-no-answer` the client sends the same request once more if, and only
//!   if, the first got no answer: `first: …`, then `retry: …` on the next line.

use std::collections::HashMap;
use std::sync::Arc;

use case_kit::spec::Call;
use launch::proxy::{Proxy, ProxyOptions};
use launch::service::{Reply, Service};
use reqwest::header::CONTENT_TYPE;

use super::naive_keyless::KeylessEndpoint;
use super::spec_service::{Services, shown};

/// The proxies and the keyless endpoint of one spec case.
pub struct Proxies {
    database_url: String,
    keyless: tokio::sync::Mutex<Option<KeylessEndpoint>>,
    /// By upstream: `service` or `keyless`.
    proxies: tokio::sync::Mutex<HashMap<String, Arc<Proxy>>>,
}

impl std::fmt::Debug for Proxies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxies")
            .field("database_url", &self.database_url)
            .finish_non_exhaustive()
    }
}

/// A count argument, 1 when absent.
fn count(call: &Call, name: &str) -> Result<u32, String> {
    call.arg(name)
        .map_or(Ok(1), str::parse)
        .map_err(|_| format!("{name}=N"))
}

impl Proxies {
    /// None yet, for the case's database.
    pub fn new(database_url: String) -> Proxies {
        Proxies {
            database_url,
            keyless: tokio::sync::Mutex::new(None),
            proxies: tokio::sync::Mutex::new(HashMap::new()),
        }
    }

    /// Drops the proxies and the keyless endpoint when the case ends or is cancelled.
    pub fn end(&self) {
        case_kit::drop_if_free(&self.proxies);
        case_kit::drop_if_free(&self.keyless);
    }

    /// Runs an operation of this module (see the module documentation); `services` is
    /// the case's service, whose HTTP client (and tokens, under `--auth`) the requests use.
    ///
    /// Errors: no service running, the proxy or endpoint cannot start, an argument.
    pub async fn run(&self, services: &Services, call: &Call) -> Result<String, String> {
        let service = services
            .current()
            .await
            .ok_or("no service running (call: service)")?;
        let to = call.arg("to").unwrap_or_default();
        match call.op.as_str() {
            "proxy" => self.start(&service, to, call).await,
            "keyless-drop" => {
                let keyless = self.keyless.lock().await;
                let keyless = keyless
                    .as_ref()
                    .ok_or("no keyless endpoint (proxy to=keyless)")?;
                let n = count(call, "count")?;
                keyless.drop_next_answers(n);
                Ok(format!("drop next {n}"))
            }
            "cut-answers" => {
                let n = count(call, "count")?;
                self.proxy(to).await?.cut_next_responses(n);
                Ok(format!("cut next {n}"))
            }
            "proxy-debit" => {
                let proxy = self.proxy(to).await?;
                let first = debit_via(&service, &proxy, call).await?;
                match (call.arg("retry"), first.starts_with("no answer")) {
                    (Some(_), true) => {
                        let retry = debit_via(&service, &proxy, call).await?;
                        Ok(format!("first: {first}\nretry: {retry}"))
                    }
                    (Some(_), false) => Ok(format!("first: {first}")),
                    (None, _) => Ok(first),
                }
            }
            other => Err(format!("no operation {other:?}")),
        }
    }

    async fn proxy(&self, to: &str) -> Result<Arc<Proxy>, String> {
        let proxies = self.proxies.lock().await;
        let proxy = proxies.get(to).cloned();
        proxy.ok_or_else(|| format!("no proxy to {to} (call: proxy to={to})"))
    }

    /// `proxy to=…`: the proxy, and the keyless endpoint first when it fronts that.
    async fn start(&self, service: &Service, to: &str, call: &Call) -> Result<String, String> {
        let text = |e: anyhow::Error| format!("{e:#}");
        let retries = count(call, "upstream-retries")?;
        let upstream = if to == "service" {
            service.public_addr()
        } else {
            let mut keyless = self.keyless.lock().await;
            if keyless.is_none() {
                let (client, connection) =
                    tokio_postgres::connect(&self.database_url, tokio_postgres::NoTls)
                        .await
                        .map_err(|e| e.to_string())?;
                tokio::spawn(connection);
                *keyless = Some(KeylessEndpoint::start(client).await.map_err(text)?);
            }
            keyless.as_ref().expect("started").address()
        };
        let proxy = Proxy::start(ProxyOptions {
            upstream,
            upstream_retries: retries,
        })
        .await
        .map_err(text)?;
        let mut proxies = self.proxies.lock().await;
        if proxies.insert(to.to_owned(), Arc::new(proxy)).is_some() {
            return Err(format!("a proxy to {to} is already running"));
        }
        Ok(format!("proxy to {to}: upstream_retries={retries}"))
    }
}

/// One `POST /accounts/ID/debits` through `proxy` (body `amount=N`, the key when given),
/// printed with the proxy's retries for it; a transport error is `no answer: …`.
///
/// Errors: the amount is not a number.
async fn debit_via(service: &Service, proxy: &Proxy, call: &Call) -> Result<String, String> {
    let arg = |name: &str| call.arg(name).unwrap_or_default();
    let amount: i64 = arg("amount").parse().map_err(|_| "amount=N".to_string())?;
    let path = format!("/accounts/{}/debits", arg("account"));
    let mut request = service
        .http()
        .post(proxy.url(&path))
        .header("x-client-id", arg("client"))
        .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(format!("amount={amount}"));
    if let Some(key) = call.arg("key") {
        request = request.header("idempotency-key", key);
    }
    let before = proxy.stats().retries;
    let reply: Result<Reply, reqwest::Error> = service.send(request).await;
    let retries = proxy.stats().retries - before;
    Ok(match reply {
        Ok(reply) => format!("{} proxy_retries={retries}", shown(&reply)),
        Err(error) if error.is_timeout() => "no answer: timeout".into(),
        Err(_) => "no answer: connection closed".into(),
    })
}
