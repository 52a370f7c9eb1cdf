//! A small HTTP/1.1 TCP proxy between a case's client and a service, on loopback, that
//! misbehaves the way real network paths do (SPEC §6 L17):
//!
//! - **cut**: after the service has answered in full, the proxy closes the client's
//!   connection without passing the answer on ([`Proxy::cut_next_responses`]): the work
//!   is done, the client sees a dropped connection and cannot know it;
//! - **retry on its own**: when the upstream connection drops before a complete answer,
//!   or the answer is 502, the proxy sends the same request bytes again on a new upstream
//!   connection, up to [`ProxyOptions::upstream_retries`] times, as load balancers and
//!   proxies do for requests they consider safe to repeat; the client never learns of it;
//! - **hold**: the next N requests read in full are kept at the proxy, not sent upstream,
//!   until [`Proxy::release_held`] lets them all go at once ([`Proxy::hold_next_requests`],
//!   [`Proxy::held`] counts those waiting): a race a black box can force (`./run.sh
//!   conformance`, docs/conformance.md).
//!
//! One request per client connection (the proxy answers with `Connection: close`
//! semantics: it closes after the answer). Bodies are read by `Content-Length`, or to the
//! end of the connection when an answer has none; chunked bodies are not supported (the
//! services behind it do not send them). Request heads are parsed with `httparse`.
//! The proxy runs as a task of the case's runtime and stops when dropped.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context as _, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use case_kit::AbortOnDrop;

/// Longest time the proxy waits for a client's request or an upstream's answer,
/// milliseconds; then it gives up on that connection.
pub const PROXY_IO_TIMEOUT_MS: u64 = 10_000;
/// Longest time a request is held at the proxy ([`Proxy::hold_next_requests`]) before it
/// goes upstream without a release, milliseconds.
pub const PROXY_HOLD_MAX_MS: u64 = 30_000;
/// Largest request or answer the proxy buffers, bytes.
pub const PROXY_MAX_MESSAGE_BYTES: usize = 1 << 20;
/// Most header lines parsed in one message.
const MAX_HEADERS: usize = 64;

/// How the proxy behaves.
#[derive(Debug, Clone, Copy)]
pub struct ProxyOptions {
    /// Where requests go (the service's public listener).
    pub upstream: SocketAddr,
    /// Extra attempts after an upstream connection dropped without a complete answer or
    /// answered 502 (0: never retry, pass the failure on as 502).
    pub upstream_retries: u32,
}

/// What the proxy counted so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProxyStats {
    /// Client requests read in full.
    pub requests: u64,
    /// Requests sent upstream (first attempts and retries).
    pub upstream_attempts: u64,
    /// Upstream attempts that were retries of the proxy's own accord.
    pub retries: u64,
    /// Complete upstream answers withheld from the client (connection cut).
    pub cut_responses: u64,
    /// Requests written in full to an upstream connection (the service has them).
    pub forwarded: u64,
}

#[derive(Default)]
struct Shared {
    cut_pending: AtomicU32,
    hold_pending: AtomicU32,
    held: AtomicU64,
    /// Bumped by [`Proxy::release_held`]; held requests wait for it to change.
    release: tokio::sync::Notify,
    requests: AtomicU64,
    upstream_attempts: AtomicU64,
    retries: AtomicU64,
    cut_responses: AtomicU64,
    forwarded: AtomicU64,
}

/// A running proxy.
pub struct Proxy {
    address: SocketAddr,
    shared: Arc<Shared>,
    _accept: AbortOnDrop<()>,
}

impl Proxy {
    /// Listens on a free loopback port and serves until dropped.
    ///
    /// Errors: the listener cannot be bound.
    pub async fn start(options: ProxyOptions) -> anyhow::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the proxy")?;
        let address = listener.local_addr()?;
        let shared = Arc::new(Shared::default());
        let accept_shared = shared.clone();
        let accept = AbortOnDrop::spawn(async move {
            // Connection tasks are tied to the accept task: dropping the proxy ends all.
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                let shared = accept_shared.clone();
                connections.spawn(async move {
                    let _ = serve(client, options, &shared).await;
                });
                while connections.try_join_next().is_some() {}
            }
        });
        Ok(Proxy {
            address,
            shared,
            _accept: accept,
        })
    }

    /// `http://<proxy address><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.address)
    }

    /// The next `count` complete upstream answers are withheld: the client's connection
    /// is closed instead.
    pub fn cut_next_responses(&self, count: u32) {
        self.shared.cut_pending.store(count, Ordering::SeqCst);
    }

    /// The next `count` requests read in full are held at the proxy (not sent upstream)
    /// until [`Proxy::release_held`]; a request held longer than [`PROXY_HOLD_MAX_MS`]
    /// goes on by itself.
    pub fn hold_next_requests(&self, count: u32) {
        self.shared.hold_pending.store(count, Ordering::SeqCst);
    }

    /// How many requests are held at the proxy now.
    pub fn held(&self) -> u64 {
        self.shared.held.load(Ordering::SeqCst)
    }

    /// Lets every held request go upstream at once; returns how many were held. Holding
    /// of requests not yet read ends too.
    pub fn release_held(&self) -> u64 {
        self.shared.hold_pending.store(0, Ordering::SeqCst);
        let held = self.held();
        self.shared.release.notify_waiters();
        held
    }

    /// The counters so far.
    pub fn stats(&self) -> ProxyStats {
        ProxyStats {
            requests: self.shared.requests.load(Ordering::SeqCst),
            upstream_attempts: self.shared.upstream_attempts.load(Ordering::SeqCst),
            retries: self.shared.retries.load(Ordering::SeqCst),
            cut_responses: self.shared.cut_responses.load(Ordering::SeqCst),
            forwarded: self.shared.forwarded.load(Ordering::SeqCst),
        }
    }
}

/// One client connection: read one request, forward it (retrying as configured), then
/// pass the answer on or cut the connection.
async fn serve(
    mut client: TcpStream,
    options: ProxyOptions,
    shared: &Shared,
) -> anyhow::Result<()> {
    let request = with_timeout(read_message(&mut client, Kind::Request)).await?;
    shared.requests.fetch_add(1, Ordering::SeqCst);
    hold(shared).await;
    let mut attempt = 0;
    let answer = loop {
        shared.upstream_attempts.fetch_add(1, Ordering::SeqCst);
        if attempt > 0 {
            shared.retries.fetch_add(1, Ordering::SeqCst);
        }
        let answer = with_timeout(exchange(options.upstream, &request, shared)).await;
        let failed = match &answer {
            Ok(bytes) => status_of(bytes) == Some(502),
            Err(_) => true,
        };
        if !failed || attempt >= options.upstream_retries {
            break answer;
        }
        attempt += 1;
    };
    let cut = shared
        .cut_pending
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok();
    match answer {
        Ok(_) if cut => {
            shared.cut_responses.fetch_add(1, Ordering::SeqCst);
            // Dropping the stream closes it: the answer never reaches the client.
            Ok(())
        }
        Ok(bytes) => {
            client.write_all(&bytes).await?;
            client.shutdown().await?;
            Ok(())
        }
        Err(_) => {
            let body = "{\"outcome\":\"BAD_GATEWAY\"}";
            let reply = format!(
                "HTTP/1.1 502 Bad Gateway\r\ncontent-type: application/json\r\n\
                 content-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            client.write_all(reply.as_bytes()).await?;
            client.shutdown().await?;
            Ok(())
        }
    }
}

/// Waits for [`Proxy::release_held`] (at most [`PROXY_HOLD_MAX_MS`]) when a hold is
/// pending; returns at once otherwise.
async fn hold(shared: &Shared) {
    let holding = shared
        .hold_pending
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok();
    if !holding {
        return;
    }
    // Registered before it is counted: a release that sees the count wakes this waiter.
    let released = shared.release.notified();
    tokio::pin!(released);
    released.as_mut().enable();
    shared.held.fetch_add(1, Ordering::SeqCst);
    let _ = tokio::time::timeout(Duration::from_millis(PROXY_HOLD_MAX_MS), released).await;
    shared.held.fetch_sub(1, Ordering::SeqCst);
}

/// Sends `request` on a new upstream connection and reads one complete answer.
///
/// Errors: connection refused or dropped before a complete answer; a malformed answer.
async fn exchange(
    upstream: SocketAddr,
    request: &[u8],
    shared: &Shared,
) -> anyhow::Result<Vec<u8>> {
    let mut stream = TcpStream::connect(upstream).await?;
    stream.write_all(request).await?;
    shared.forwarded.fetch_add(1, Ordering::SeqCst);
    read_message(&mut stream, Kind::Response).await
}

async fn with_timeout<T>(future: impl Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    tokio::time::timeout(Duration::from_millis(PROXY_IO_TIMEOUT_MS), future)
        .await
        .map_err(|_| anyhow::anyhow!("no complete message within {PROXY_IO_TIMEOUT_MS} ms"))?
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Request,
    Response,
}

/// Reads one HTTP/1.1 message (head and body) from `stream`, returning its bytes as
/// read. The body is `Content-Length` bytes; an answer without one runs to the end of
/// the connection, a request without one has no body.
///
/// Errors: the connection ended before the message was complete; a malformed head; a
/// chunked body; more than [`PROXY_MAX_MESSAGE_BYTES`].
async fn read_message(stream: &mut TcpStream, kind: Kind) -> anyhow::Result<Vec<u8>> {
    let mut buffer = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    let (head_length, body_length) = loop {
        let read = stream.read(&mut chunk).await?;
        if read == 0 {
            bail!("connection closed before a complete head");
        }
        buffer.extend_from_slice(&chunk[..read]);
        if buffer.len() > PROXY_MAX_MESSAGE_BYTES {
            bail!("message over {PROXY_MAX_MESSAGE_BYTES} bytes");
        }
        if let Some(parsed) = parse_head(&buffer, kind)? {
            break parsed;
        }
    };
    match body_length {
        Some(length) => {
            let total = head_length + length;
            if total > PROXY_MAX_MESSAGE_BYTES {
                bail!("message over {PROXY_MAX_MESSAGE_BYTES} bytes");
            }
            while buffer.len() < total {
                let read = stream.read(&mut chunk).await?;
                if read == 0 {
                    bail!("connection closed inside the body");
                }
                buffer.extend_from_slice(&chunk[..read]);
            }
            buffer.truncate(total);
        }
        None if kind == Kind::Response => loop {
            let read = stream.read(&mut chunk).await?;
            if read == 0 {
                break;
            }
            buffer.extend_from_slice(&chunk[..read]);
            if buffer.len() > PROXY_MAX_MESSAGE_BYTES {
                bail!("message over {PROXY_MAX_MESSAGE_BYTES} bytes");
            }
        },
        None => buffer.truncate(head_length),
    }
    Ok(buffer)
}

/// One HTTP/1.1 request as a small server of a case sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpRequest {
    /// `POST`, `GET`, ...
    pub method: String,
    /// The request target, e.g. `/accounts/acct-0001/debits`.
    pub path: String,
    /// The body (`Content-Length` bytes).
    pub body: Vec<u8>,
}

/// Reads one request from `stream` the way the proxy does (head parsed with `httparse`,
/// body by `Content-Length`), within [`PROXY_IO_TIMEOUT_MS`].
///
/// Errors: as the proxy's reader; a timeout.
pub async fn read_request(stream: &mut TcpStream) -> anyhow::Result<HttpRequest> {
    let bytes = with_timeout(read_message(stream, Kind::Request)).await?;
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    let httparse::Status::Complete(head_length) = request.parse(&bytes)? else {
        bail!("incomplete request head");
    };
    Ok(HttpRequest {
        method: request.method.unwrap_or_default().to_owned(),
        path: request.path.unwrap_or_default().to_owned(),
        body: bytes[head_length..].to_vec(),
    })
}

/// `Some((head length, Content-Length))` once `buffer` holds a complete head.
fn parse_head(buffer: &[u8], kind: Kind) -> anyhow::Result<Option<(usize, Option<usize>)>> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let status = match kind {
        Kind::Request => httparse::Request::new(&mut headers).parse(buffer)?,
        Kind::Response => httparse::Response::new(&mut headers).parse(buffer)?,
    };
    let httparse::Status::Complete(head_length) = status else {
        return Ok(None);
    };
    let mut content_length = None;
    for header in headers.iter().take_while(|h| !h.name.is_empty()) {
        if header.name.eq_ignore_ascii_case("transfer-encoding") {
            bail!("chunked bodies are not supported by the proxy");
        }
        if header.name.eq_ignore_ascii_case("content-length") {
            let value = std::str::from_utf8(header.value)?.trim().parse::<usize>()?;
            content_length = Some(value);
        }
    }
    Ok(Some((head_length, content_length)))
}

/// The status code of a complete answer.
fn status_of(answer: &[u8]) -> Option<u16> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut headers);
    response.parse(answer).ok()?;
    response.code
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_and_lengths() {
        let request = b"POST /a HTTP/1.1\r\nhost: x\r\ncontent-length: 8\r\n\r\namount=7";
        assert_eq!(
            parse_head(request, Kind::Request).unwrap(),
            Some((request.len() - 8, Some(8)))
        );
        assert_eq!(
            parse_head(b"POST /a HTTP/1.1\r\nho", Kind::Request).unwrap(),
            None
        );
        let answer = b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\n\r\n";
        assert_eq!(status_of(answer), Some(502));
        assert!(
            parse_head(
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n",
                Kind::Response
            )
            .is_err()
        );
    }

    /// Held requests reach nobody until released, then all go; the counters say so.
    #[tokio::test]
    async fn held_requests_go_together_when_released() {
        let upstream = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream_address = upstream.local_addr().unwrap();
        let seen = Arc::new(AtomicU64::new(0));
        let seen_by_server = seen.clone();
        let _server = AbortOnDrop::spawn(async move {
            while let Ok((mut stream, _)) = upstream.accept().await {
                let seen = seen_by_server.clone();
                tokio::spawn(async move {
                    let _ = read_message(&mut stream, Kind::Request).await;
                    seen.fetch_add(1, Ordering::SeqCst);
                    let _ = stream
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                        .await;
                });
            }
        });
        let proxy = Proxy::start(ProxyOptions {
            upstream: upstream_address,
            upstream_retries: 0,
        })
        .await
        .unwrap();
        proxy.hold_next_requests(3);
        let clients: Vec<_> = (0..3)
            .map(|_| {
                let address = proxy.address;
                tokio::spawn(async move {
                    let mut stream = TcpStream::connect(address).await.unwrap();
                    stream
                        .write_all(b"GET /a HTTP/1.1\r\nhost: x\r\n\r\n")
                        .await
                        .unwrap();
                    read_message(&mut stream, Kind::Response).await.unwrap()
                })
            })
            .collect();
        for _ in 0..2_000 {
            if proxy.held() == 3 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(proxy.held(), 3);
        assert_eq!(proxy.stats().forwarded, 0);
        assert_eq!(seen.load(Ordering::SeqCst), 0);
        assert_eq!(proxy.release_held(), 3);
        for client in clients {
            let answer = client.await.unwrap();
            assert_eq!(status_of(&answer), Some(200));
        }
        assert_eq!(proxy.stats().forwarded, 3);
        assert_eq!(seen.load(Ordering::SeqCst), 3);
        assert_eq!(proxy.held(), 0);
    }
}
