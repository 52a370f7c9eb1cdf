//! The naive keyless debit endpoint that L17's negative control puts behind the proxy.
//!
//! **Never use this for anything but a negative control.** It is the HTTP design the
//! ledger's service refuses (its routes answer 400 without an `Idempotency-Key`):
//! `POST /accounts/{id}/debits` with body `amount=N` and no key. Each request is a new
//! debit: the endpoint makes up a fresh key of its own (`naive-<n>`) and records the
//! transfer the ledger's way (conditional debit, then `record_transfer`), so every debit
//! balances and reconciliation finds nothing wrong — a repeated request is simply a
//! second purchase. It is served by the case, on loopback, never by `ledger-svc`.
//!
//! Its one fault mirrors the service's `after-commit` `close`:
//! [`KeylessEndpoint::drop_next_answers`] makes the next answers vanish after the commit
//! (the connection is closed without a response).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use case_kit::AbortOnDrop;
use launch::proxy::read_request;
use points_ledger::{TransferRequest, record_transfer};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Mutex;
use tokio_postgres::{Client, IsolationLevel};

/// The client id the endpoint records its made-up keys under.
pub const KEYLESS_CLIENT: &str = "naive-keyless";

struct Shared {
    client: Mutex<Client>,
    next_key: AtomicU64,
    drop_pending: AtomicU32,
}

/// A running keyless endpoint.
pub struct KeylessEndpoint {
    address: SocketAddr,
    shared: Arc<Shared>,
    _accept: AbortOnDrop<()>,
}

impl KeylessEndpoint {
    /// Serves on a free loopback port, debiting through `client` (the case's database),
    /// one request at a time, until dropped.
    ///
    /// Errors: the listener cannot be bound.
    pub async fn start(client: Client) -> anyhow::Result<KeylessEndpoint> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let shared = Arc::new(Shared {
            client: Mutex::new(client),
            next_key: AtomicU64::new(1),
            drop_pending: AtomicU32::new(0),
        });
        let accept_shared = shared.clone();
        let accept = AbortOnDrop::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                let shared = accept_shared.clone();
                connections.spawn(async move {
                    let _ = serve(stream, &shared).await;
                });
                while connections.try_join_next().is_some() {}
            }
        });
        Ok(KeylessEndpoint {
            address,
            shared,
            _accept: accept,
        })
    }

    /// The listening address.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// The next `count` debits commit, then their connection is closed without an answer.
    pub fn drop_next_answers(&self, count: u32) {
        self.shared.drop_pending.store(count, Ordering::SeqCst);
    }
}

async fn serve(mut stream: TcpStream, shared: &Shared) -> anyhow::Result<()> {
    let request = read_request(&mut stream).await?;
    let account = request
        .path
        .strip_prefix("/accounts/")
        .and_then(|rest| rest.strip_suffix("/debits"))
        .map(str::to_owned);
    let amount = std::str::from_utf8(&request.body)
        .ok()
        .and_then(|body| body.strip_prefix("amount="))
        .and_then(|amount| amount.parse::<i64>().ok());
    let (Some(account), Some(amount), "POST") = (account, amount, request.method.as_str()) else {
        return answer(
            &mut stream,
            "400 Bad Request",
            "{\"outcome\":\"BAD_REQUEST\"}",
        )
        .await;
    };
    let key = format!("naive-{}", shared.next_key.fetch_add(1, Ordering::SeqCst));
    let req = TransferRequest::debit(KEYLESS_CLIENT, key, account, amount);
    let mut client = shared.client.lock().await;
    let balance = debit(&mut client, &req).await;
    drop(client);
    let dropped = shared
        .drop_pending
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok();
    if dropped {
        // Committed; the answer is lost.
        return Ok(());
    }
    match balance {
        Ok(Some(balance)) => {
            let body = format!("{{\"outcome\":\"OK\",\"balance\":{balance}}}");
            answer(&mut stream, "201 Created", &body).await
        }
        Ok(None) => {
            answer(
                &mut stream,
                "409 Conflict",
                "{\"outcome\":\"INSUFFICIENT\"}",
            )
            .await
        }
        Err(_) => {
            answer(
                &mut stream,
                "503 Service Unavailable",
                "{\"outcome\":\"UNAVAILABLE\"}",
            )
            .await
        }
    }
}

/// The conditional debit and its record in one transaction; `None` when refused.
async fn debit(client: &mut Client, req: &TransferRequest) -> anyhow::Result<Option<i64>> {
    let tx = client
        .build_transaction()
        .isolation_level(IsolationLevel::ReadCommitted)
        .start()
        .await?;
    let row = tx
        .query_opt(
            "UPDATE account SET balance = balance - $2 \
             WHERE account_id = $1 AND balance >= $2 RETURNING balance",
            &[&req.from, &req.amount],
        )
        .await?;
    let Some(row) = row else {
        tx.rollback().await?;
        return Ok(None);
    };
    let balance: i64 = row.get(0);
    record_transfer(&tx, req, balance).await?;
    tx.commit().await?;
    Ok(Some(balance))
}

async fn answer(stream: &mut TcpStream, status: &str, body: &str) -> anyhow::Result<()> {
    let reply = format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(reply.as_bytes()).await?;
    stream.shutdown().await?;
    Ok(())
}
