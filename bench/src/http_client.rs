//! The service variant's HTTP client: one HTTP/1.1 keep-alive connection per bench
//! client, on hyper's connection-level client (`hyper::client::conn::http1`), so the
//! figure carries the cost of HTTP itself and as little client machinery as hyper allows
//! (no pool, no URL parsing, no timer per request).

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// One bench client's connection to the service's public listener; reconnects after a
/// transport error.
pub struct DebitClient {
    addr: SocketAddr,
    /// `Host` header value (`127.0.0.1:port`).
    host: String,
    /// `Authorization: Bearer …` when the service authenticates.
    authorization: Option<String>,
    client_id: String,
    timeout: Duration,
    sender: Option<SendRequest<Full<Bytes>>>,
}

impl DebitClient {
    /// A client of the service at `addr` sending as `client_id` (with `token` as its bearer
    /// token when given); each debit fails after `timeout`. Connects on first use.
    pub fn new(
        addr: SocketAddr,
        client_id: &str,
        token: Option<&str>,
        timeout: Duration,
    ) -> DebitClient {
        DebitClient {
            addr,
            host: addr.to_string(),
            authorization: token.map(|token| format!("Bearer {token}")),
            client_id: client_id.to_owned(),
            timeout,
            sender: None,
        }
    }

    /// `POST /accounts/{account}/debits` with `Idempotency-Key: key` and body
    /// `{"amount": amount}`; the response's status (the body is read and dropped).
    ///
    /// Errors: connect or transport errors, a timeout after the constructor's `timeout`;
    /// the connection is dropped then and the next debit opens a new one.
    pub async fn debit(&mut self, account: &str, key: &str, amount: i64) -> anyhow::Result<u16> {
        // `send` puts the connection back only after a complete exchange, so an error or
        // the timeout (which drops `send` midway) leaves none behind.
        tokio::time::timeout(self.timeout, self.send(account, key, amount))
            .await
            .map_err(|_| anyhow::anyhow!("no answer within {} ms", self.timeout.as_millis()))?
    }

    async fn send(&mut self, account: &str, key: &str, amount: i64) -> anyhow::Result<u16> {
        let mut sender = match self.sender.take() {
            Some(sender) if !sender.is_closed() => sender,
            _ => self.connect().await?,
        };
        sender.ready().await.context("connection not ready")?;
        let mut request = Request::builder()
            .method(Method::POST)
            .uri(format!("/accounts/{account}/debits"))
            .header("host", &self.host)
            .header("x-client-id", &self.client_id)
            .header("idempotency-key", key)
            .header("content-type", "application/json");
        if let Some(authorization) = &self.authorization {
            request = request.header("authorization", authorization);
        }
        let request = request.body(Full::new(Bytes::from(format!("{{\"amount\": {amount}}}"))))?;
        let response = sender.send_request(request).await?;
        let status = response.status().as_u16();
        response.into_body().collect().await?;
        self.sender = Some(sender);
        Ok(status)
    }

    async fn connect(&self) -> anyhow::Result<SendRequest<Full<Bytes>>> {
        let stream = TcpStream::connect(self.addr)
            .await
            .with_context(|| format!("connecting to {}", self.addr))?;
        stream.set_nodelay(true)?;
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .context("HTTP/1.1 handshake")?;
        // Ends when the connection closes (or this client, holding the sender, is dropped).
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(sender)
    }
}
